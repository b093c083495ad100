//! The one waiter queue: a pacing rule and the FIFO queue of requests in front of it.
//!
//! A [`Lane`] decides in a few arithmetic steps, given `now`; it knows nothing of locks, clocks
//! or keys. A [`RateLimiter`](crate::RateLimiter) or a [`Stagger`](crate::Stagger) is one lane
//! behind a mutex; a [`KeyedRateLimiter`](crate::KeyedRateLimiter) is one lane per key behind
//! one mutex. A request is charged when it is granted, never before, so a waiter that gives up
//! has taken nothing and leaves nothing behind but its place in the queue.

use std::collections::VecDeque;
use std::task::Waker;

use crate::core::{Amount, Decision, Nanos, Pace};
use crate::error::NotUntil;
use crate::stats::Stats;
use crate::timer::Lateness;

/// The counters of one limiter, and the numbers its waiters are known by.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    next_ticket: u64,
    pub(crate) granted: u64,
    pub(crate) rejected: u64,
    /// Nanoseconds granted requests spent queued, summed.
    pub(crate) waited: u128,
}

#[derive(Debug)]
struct Entry<C> {
    ticket: u64,
    cost: C,
    /// When the entry became the head of the queue (its arrival, until then).
    since: Nanos,
    enqueued: Nanos,
    waker: Option<Waker>,
}

impl Tally {
    /// The counters as a user reads them, with `waiting` requests queued now.
    pub(crate) fn stats(&self, waiting: usize) -> Stats {
        Stats {
            granted: self.granted,
            rejected: self.rejected,
            waiting,
            total_wait: Nanos(u64::try_from(self.waited).unwrap_or(u64::MAX)).to_duration(),
        }
    }
}

/// What a waiter should do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The request is granted and charged, at this time.
    Granted(Nanos),
    /// The request heads the queue and may go at this time: sleep until then, on time unless
    /// the rule absorbs a late wake-up.
    Wait(Nanos, Lateness),
    /// Others are ahead: wait to be woken.
    Queued,
}

/// What a lane asks its caller to do once the lock is released: wake the waiter whose turn it
/// now is, and report a refusal or a delay (to `tracing`).
#[derive(Debug, Default)]
#[must_use]
pub(crate) struct After {
    pub(crate) wake: Option<Waker>,
    pub(crate) rejected: Option<(u64, Nanos)>,
    pub(crate) delayed: Option<(u64, usize)>,
    /// A request granted: its cost and the nanoseconds it spent queued (for `metrics`).
    #[cfg(feature = "metrics")]
    pub(crate) granted: Option<(u64, u64)>,
    /// A waiter left the queue before its grant (for `metrics`).
    #[cfg(feature = "metrics")]
    pub(crate) cancelled: bool,
    /// The change in the number of requests queued (for `metrics`).
    #[cfg(feature = "metrics")]
    pub(crate) queued: i64,
}

impl After {
    /// Notes a request of `cost` granted after `waited` in the queue.
    #[inline]
    #[allow(unused_variables, clippy::unused_self)]
    pub(crate) fn grant(&mut self, cost: u64, waited: Nanos) {
        #[cfg(feature = "metrics")]
        {
            self.granted = Some((cost, waited.0));
        }
    }

    /// Notes a change of `by` in the number of requests queued.
    #[inline]
    #[allow(unused_variables, clippy::unused_self)]
    fn queue(&mut self, by: i64) {
        #[cfg(feature = "metrics")]
        {
            self.queued = self.queued.wrapping_add(by);
        }
    }

    /// Notes a waiter that left the queue before its grant.
    #[inline]
    #[allow(clippy::unused_self)]
    fn cancel(&mut self) {
        #[cfg(feature = "metrics")]
        {
            self.cancelled = true;
        }
    }

    /// Records the events noted to the limiter's metrics, if it has a name; call it with the
    /// handles read under the lock the events were decided under (so that the waiters gauge
    /// set when the name was given is not moved by an event decided before).
    #[cfg(feature = "metrics")]
    #[inline]
    pub(crate) fn record(&self, metrics: Option<&crate::instrument::LimiterMetrics>) {
        let Some(m) = metrics else {
            return;
        };
        if let Some((cost, waited)) = self.granted {
            m.granted(cost, waited);
        }
        if self.rejected.is_some() {
            m.refusals.increment(1);
        }
        if self.cancelled {
            m.cancellations.increment(1);
        }
        if self.queued != 0 {
            #[allow(clippy::cast_precision_loss)]
            m.waiters.increment(self.queued as f64);
        }
    }

    /// Releases `guard`, the lock the events were decided under; records them to the handles
    /// in force under it (read before it goes), then runs the deferred work: a woken task
    /// should not find the lock still held, and tracing should not run under it.
    #[inline]
    pub(crate) fn unlock_then_run<G>(
        self,
        guard: G,
        #[cfg(feature = "metrics")] metrics: &crate::instrument::Named<
            crate::instrument::LimiterMetrics,
        >,
    ) {
        #[cfg(feature = "metrics")]
        let metrics = metrics.get();
        drop(guard);
        #[cfg(feature = "metrics")]
        {
            self.record(metrics.as_deref());
            drop(metrics);
        }
        self.run();
    }

    /// Runs the deferred work; call it after the lock is released.
    #[inline]
    pub(crate) fn run(self) {
        if let Some((cost, wait)) = self.rejected {
            trace_rejected(cost, wait);
        }
        if let Some((cost, waiting)) = self.delayed {
            trace_delayed(cost, waiting);
        }
        if let Some(waker) = self.wake {
            waker.wake();
        }
    }
}

/// A rule and the FIFO queue of requests waiting on it.
///
/// Tickets are handed out in increasing order and requests only ever join at the back, so the
/// queue is sorted by ticket: a waiter is found by binary search.
#[derive(Debug)]
pub(crate) struct Lane<R: Pace> {
    rule: R,
    queue: VecDeque<Entry<R::Cost>>,
    /// Where the queue leaves the rule if everyone in it goes as soon as they may, kept for
    /// [`Lane::projected`]; only while someone waits, and only once it was asked for.
    projection: Option<Box<Projection<R>>>,
}

/// A point of the walk down the queue that [`Lane::projected`] makes: when the last entry
/// walked past goes, and the rule once it has been charged.
#[derive(Clone, Debug)]
struct Point<R> {
    at: Nanos,
    rule: R,
}

impl<R: Pace> Point<R> {
    /// Walks past an entry of `cost` behind the head: it heads the queue from the moment the
    /// one before it goes, and goes as soon as it may from then.
    fn step(&mut self, cost: R::Cost) {
        let since = self.at;
        self.at = since.max(self.rule.earliest(since, cost));
        self.rule.commit(self.at, since, cost);
    }

    /// When a request of `cost` behind everyone walked past may go.
    fn answer(&self, cost: R::Cost) -> Nanos {
        self.at.max(self.rule.earliest(self.at, cost))
    }

    fn same(&self, other: &Point<R>) -> bool {
        self.at == other.at && self.rule.same(&other.rule)
    }
}

/// The walk down the queue, kept: walking on from `key` past every entry from the `done`-th
/// on (as entries behind the head) ends at `tail`.
///
/// - A request joining the queue extends the walk by one step.
/// - `key` is the state once the head goes (`done == 1`). While it is *fresh* (the head, its
///   `since` and the rule are those it was computed from), a query whose head would go at
///   `key.at` has its answer at `tail` at once: the walk depends on `now` only through when
///   the head goes.
/// - Otherwise (the head's turn moved with `now`, the rule changed, the head was granted) the
///   walk starts again from the head, in step with the kept one from `key`, until the two
///   meet: from there on they are the same, and so is `tail`. (When the head is granted, `key`
///   is where the kept walk stood before the new head: `done == 0`.)
/// - A cancellation makes it invalid: the next query walks the whole queue again.
#[derive(Debug)]
struct Projection<R> {
    valid: bool,
    fresh: bool,
    done: usize,
    key: Point<R>,
    tail: Point<R>,
}

impl<R: Pace> Lane<R> {
    pub(crate) const fn new(rule: R) -> Lane<R> {
        Lane {
            rule,
            queue: VecDeque::new(),
            projection: None,
        }
    }

    /// How many requests wait.
    pub(crate) fn waiting(&self) -> usize {
        self.queue.len()
    }

    /// The rule.
    pub(crate) fn rule(&self) -> &R {
        &self.rule
    }

    /// The rule, to change it.
    pub(crate) fn rule_mut(&mut self) -> &mut R {
        if let Some(p) = &mut self.projection {
            p.fresh = false;
        }
        &mut self.rule
    }

    /// Where the ticket `mine` stands in the queue.
    fn position(&self, mine: u64) -> Option<usize> {
        match self.queue.front() {
            // The head asks most often: its timer fires, or it is woken to go.
            Some(head) if head.ticket == mine => Some(0),
            _ => self.queue.binary_search_by_key(&mine, |e| e.ticket).ok(),
        }
    }

    /// Grants `cost` at `now` if that needs no waiting and nobody is queued.
    #[inline]
    pub(crate) fn try_acquire(
        &mut self,
        tally: &mut Tally,
        now: Nanos,
        cost: R::Cost,
        after: &mut After,
    ) -> Result<(), NotUntil> {
        if cost.is_zero() {
            tally.granted += 1;
            after.grant(0, Nanos::ZERO);
            return Ok(());
        }
        let refused = if self.queue.is_empty() {
            match self.rule.try_offer(now, cost) {
                Decision::Go => {
                    tally.granted += 1;
                    after.grant(cost.total(), Nanos::ZERO);
                    return Ok(());
                }
                Decision::NotUntil(at) => at.wait_from(now),
            }
        } else if self.rule.needs_wait(cost) {
            Nanos::MAX
        } else {
            self.projected(now, cost).wait_from(now)
        };
        tally.rejected += 1;
        after.rejected = Some((cost.total(), refused));
        Err(NotUntil::new(refused))
    }

    /// Advances the request behind `ticket` (`None`: not queued yet) at `now`. A new request
    /// joins the queue unless it could not be granted by `limit`, in which case it is refused
    /// with the time it would have taken.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn poll(
        &mut self,
        tally: &mut Tally,
        now: Nanos,
        ticket: &mut Option<u64>,
        cost: R::Cost,
        waker: &Waker,
        limit: Option<Nanos>,
        after: &mut After,
    ) -> Result<Step, NotUntil> {
        if let Some(mine) = *ticket {
            match self.position(mine) {
                Some(0) => return Ok(self.advance_head(tally, now, ticket, cost, waker, after)),
                Some(i) => {
                    set_waker(&mut self.queue[i].waker, waker);
                    return Ok(Step::Queued);
                }
                // Only a grant or a cancel removes an entry, and both clear the ticket.
                None => *ticket = None,
            }
        }
        self.arrive(tally, now, ticket, cost, waker, limit, after)
    }

    fn advance_head(
        &mut self,
        tally: &mut Tally,
        now: Nanos,
        ticket: &mut Option<u64>,
        cost: R::Cost,
        waker: &Waker,
        after: &mut After,
    ) -> Step {
        let Some(head) = self.queue.front_mut() else {
            return Step::Queued;
        };
        let since = head.since;
        let at = self.rule.earliest(since, cost);
        if at > now {
            set_waker(&mut head.waker, waker);
            return Step::Wait(at, Lateness::of(&self.rule, cost));
        }
        let enqueued = head.enqueued;
        self.pop_head();
        let waited = now.saturating_sub(enqueued);
        tally.waited += u128::from(waited.0);
        *ticket = None;
        self.rule.commit(now, since, cost);
        tally.granted += 1;
        after.grant(cost.total(), waited);
        after.queue(-1);
        after.wake = self.promote(now);
        Step::Granted(now)
    }

    #[allow(clippy::too_many_arguments)]
    fn arrive(
        &mut self,
        tally: &mut Tally,
        now: Nanos,
        ticket: &mut Option<u64>,
        cost: R::Cost,
        waker: &Waker,
        limit: Option<Nanos>,
        after: &mut After,
    ) -> Result<Step, NotUntil> {
        if cost.is_zero() {
            tally.granted += 1;
            after.grant(0, Nanos::ZERO);
            return Ok(Step::Granted(now));
        }
        let step = if self.queue.is_empty() {
            match self.rule.offer(now, cost) {
                Decision::Go => {
                    tally.granted += 1;
                    after.grant(cost.total(), Nanos::ZERO);
                    return Ok(Step::Granted(now));
                }
                Decision::NotUntil(at) => Step::Wait(at, Lateness::of(&self.rule, cost)),
            }
        } else {
            Step::Queued
        };
        if let Some(limit) = limit {
            let at = match step {
                Step::Wait(at, _) => at,
                _ => self.projected(now, cost),
            };
            if at > limit {
                tally.rejected += 1;
                let wait = at.wait_from(now);
                after.rejected = Some((cost.total(), wait));
                return Err(NotUntil::new(wait));
            }
        }
        let mine = tally.next_ticket;
        tally.next_ticket += 1;
        if self.queue.is_empty() {
            self.projection = None;
        } else if let Some(p) = self.projection.as_mut().filter(|p| p.valid) {
            p.tail.step(cost);
        }
        self.queue.push_back(Entry {
            ticket: mine,
            cost,
            since: now,
            enqueued: now,
            waker: Some(waker.clone()),
        });
        *ticket = Some(mine);
        after.delayed = Some((cost.total(), self.queue.len()));
        after.queue(1);
        Ok(step)
    }

    /// Takes the request behind `ticket` out of the queue, giving its place to the next.
    pub(crate) fn cancel(&mut self, now: Nanos, ticket: u64, after: &mut After) {
        let Some(i) = self.position(ticket) else {
            return;
        };
        self.queue.remove(i);
        after.cancel();
        after.queue(-1);
        if self.queue.is_empty() {
            self.projection = None;
        } else if let Some(p) = &mut self.projection {
            p.valid = false;
        }
        if i == 0 {
            after.wake = self.promote(now);
        }
    }

    /// Takes the head out of the queue: it is granted.
    fn pop_head(&mut self) {
        let Some(head) = self.queue.pop_front() else {
            return;
        };
        if self.queue.is_empty() {
            self.projection = None;
        } else if let Some(p) = &mut self.projection {
            // The kept walk goes on from where it passed the head (walking past it first, if
            // it stood before it).
            if p.valid && p.done == 0 {
                p.key.step(head.cost);
            }
            p.done = 0;
            p.fresh = false;
        }
    }

    /// The head's waker, so that it re-reads its deadline after the rule changed.
    pub(crate) fn head_waker(&mut self) -> Option<Waker> {
        self.queue.front_mut().and_then(|head| head.waker.take())
    }

    /// When a request of `cost` joining the queue at `now` would be granted, if everyone
    /// ahead were granted as soon as they may: [`projected_walk`]'s answer, from the kept
    /// walk (see [`Projection`]). Out of line: no grant needs it, and inlined it would weigh
    /// on the frame of `try_acquire`, which is inlined into the limiters' grants.
    #[inline(never)]
    fn projected(&mut self, now: Nanos, cost: R::Cost) -> Nanos {
        let Some(head) = self.queue.front() else {
            return now.max(self.rule.earliest(now, cost));
        };
        // When the head would go: the whole walk depends on `now` only through this.
        let at = now.max(self.rule.earliest(head.since, head.cost));
        match &self.projection {
            Some(p) if p.valid && p.fresh && p.key.at == at => p.tail.answer(cost),
            _ => self.project(at, cost),
        }
    }

    /// Walks the queue again, its head going at `at`, and keeps the walk (as soon as it meets
    /// the walk kept before, the rest is that walk's); answers for a request of `cost` behind
    /// the queue.
    fn project(&mut self, at: Nanos, cost: R::Cost) -> Nanos {
        let head = &self.queue[0];
        let mut key = Point {
            at,
            rule: self.rule.clone(),
        };
        key.rule.commit(at, head.since, head.cost);
        let mut walk = key.clone();
        let mut behind = self.queue.iter().skip(1);
        if let Some(p) = self.projection.as_deref_mut().filter(|p| p.valid) {
            let mut old = std::mem::replace(&mut p.key, key);
            if p.done == 0 {
                old.step(head.cost);
            }
            // Both walks now stand before the second entry.
            let met = loop {
                if walk.same(&old) {
                    break true;
                }
                let Some(entry) = behind.next() else {
                    break false;
                };
                walk.step(entry.cost);
                old.step(entry.cost);
            };
            if !met {
                p.tail = walk;
            }
            p.fresh = true;
            p.done = 1;
            return p.tail.answer(cost);
        }
        for entry in behind {
            walk.step(entry.cost);
        }
        let answer = walk.answer(cost);
        let new = Projection {
            valid: true,
            fresh: true,
            done: 1,
            key,
            tail: walk,
        };
        match &mut self.projection {
            Some(p) => **p = new,
            slot => *slot = Some(Box::new(new)),
        }
        answer
    }

    /// Makes the new head of the queue start its wait at `now`; returns its waker.
    fn promote(&mut self, now: Nanos) -> Option<Waker> {
        let head = self.queue.front_mut()?;
        head.since = now;
        head.waker.take()
    }
}

/// The walk [`Lane::projected`] keeps, made from scratch: when a request of `cost` joining
/// the queue at `now` would be granted, if everyone ahead were granted as soon as they may.
#[cfg(test)]
fn projected_walk<R: Pace>(lane: &Lane<R>, now: Nanos, cost: R::Cost) -> Nanos {
    let mut rule = lane.rule.clone();
    let mut t = now;
    for (i, entry) in lane.queue.iter().enumerate() {
        let since = if i == 0 { entry.since } else { t };
        t = t.max(rule.earliest(since, entry.cost));
        rule.commit(t, since, entry.cost);
    }
    t.max(rule.earliest(t, cost))
}

fn set_waker(slot: &mut Option<Waker>, waker: &Waker) {
    match slot {
        Some(current) if current.will_wake(waker) => {}
        _ => *slot = Some(waker.clone()),
    }
}

#[allow(unused_variables)]
fn trace_rejected(cost: u64, wait: Nanos) {
    #[cfg(feature = "tracing")]
    tracing::debug!(cost, retry_after = ?wait.to_duration(), "paced: request refused");
}

#[allow(unused_variables)]
fn trace_delayed(cost: u64, waiting: usize) {
    #[cfg(feature = "tracing")]
    tracing::debug!(cost, waiting, "paced: request delayed");
}

/// Replays random operations on a lane and checks [`Lane::projected`] against
/// [`projected_walk`] after every one (also used by the rules that live elsewhere).
#[cfg(test)]
pub(crate) mod testing {
    use std::task::Waker;

    use proptest::prelude::*;

    use super::{projected_walk, After, Lane, Pace, Step, Tally};
    use crate::core::Nanos;

    /// One thing that can happen to a lane.
    #[derive(Clone, Debug)]
    pub(crate) enum Op {
        /// A request of `cost` arrives, with a limit `limit` ahead of now if any.
        Arrive { cost: u64, limit: Option<u64> },
        /// The waiter at this place (modulo the queue's length) polls.
        Poll(usize),
        /// The head polls, and if it must wait, polls again `late` after its deadline.
        Grant { late: u64 },
        /// The waiter at this place (modulo the queue's length) gives up.
        Cancel(usize),
        /// Time passes.
        Advance(u64),
        /// A request of `cost` is asked for without waiting.
        TryAcquire(u64),
        /// The rule changes, as the seed says.
        Change(u64),
        /// The projection is asked for, `ahead` from now (or before it), for a request of
        /// `cost`.
        Ask { ahead: i64, cost: u64 },
    }

    /// Operations with costs up to `max_cost`, over spans of a few `span`s; each says whether
    /// to check the projection after it (not always, so that changes pile up between checks).
    pub(crate) fn ops(max_cost: u64, span: u64) -> impl Strategy<Value = Vec<(Op, bool)>> {
        let late = prop_oneof![Just(0), Just(1), 0..span];
        let op = prop_oneof![
            5 => (0..=max_cost, prop::option::weighted(0.3, 0..4 * span))
                .prop_map(|(cost, limit)| Op::Arrive { cost, limit }),
            1 => any::<usize>().prop_map(Op::Poll),
            3 => late.prop_map(|late| Op::Grant { late }),
            1 => any::<usize>().prop_map(Op::Cancel),
            2 => prop_oneof![Just(0), 0..span, 0..4 * span].prop_map(Op::Advance),
            2 => (1..=max_cost).prop_map(Op::TryAcquire),
            1 => any::<u64>().prop_map(Op::Change),
            2 => (-(span as i64)..4 * span as i64, 1..=max_cost)
                .prop_map(|(ahead, cost)| Op::Ask { ahead, cost }),
        ];
        prop::collection::vec((op, prop::bool::weighted(0.3)), 1..150)
    }

    /// Checks the projection at `now` for a few costs against the walk made from scratch.
    fn check<R: Pace<Cost = u64>>(
        lane: &mut Lane<R>,
        now: Nanos,
        costs: &[u64],
    ) -> Result<(), TestCaseError> {
        for &cost in costs {
            let expected = projected_walk(lane, now, cost);
            prop_assert_eq!(
                lane.projected(now, cost),
                expected,
                "cost {} at {:?}",
                cost,
                now
            );
        }
        Ok(())
    }

    /// Replays `ops` on a lane of `rule`, changing the rule with `change(rule, now, seed)`.
    pub(crate) fn replay<R: Pace<Cost = u64>>(
        rule: R,
        ops: &[(Op, bool)],
        max_cost: u64,
        mut change: impl FnMut(&mut R, Nanos, u64),
    ) -> Result<(), TestCaseError> {
        let mut lane = Lane::new(rule);
        let mut tally = Tally::default();
        let mut tickets: Vec<u64> = Vec::new();
        let mut now = Nanos(1_000);
        let waker = Waker::noop();
        for &(ref op, check_after) in ops {
            let mut after = After::default();
            match *op {
                Op::Arrive { cost, limit } => {
                    let mut ticket = None;
                    let limit = limit.map(|l| now.saturating_add(Nanos(l)));
                    let _ = lane.poll(&mut tally, now, &mut ticket, cost, waker, limit, &mut after);
                    tickets.extend(ticket);
                }
                Op::Poll(i) if !tickets.is_empty() => {
                    let i = i % tickets.len();
                    let cost = lane.queue[i].cost;
                    let mut ticket = Some(tickets[i]);
                    let step =
                        lane.poll(&mut tally, now, &mut ticket, cost, waker, None, &mut after);
                    if ticket.is_none() {
                        prop_assert_eq!(step, Ok(Step::Granted(now)));
                        prop_assert_eq!(i, 0);
                        tickets.remove(0);
                    }
                }
                Op::Grant { late } if !tickets.is_empty() => {
                    let cost = lane.queue[0].cost;
                    let mut ticket = Some(tickets[0]);
                    let mut step =
                        lane.poll(&mut tally, now, &mut ticket, cost, waker, None, &mut after);
                    if let Ok(Step::Wait(at, _)) = step {
                        if at < Nanos::MAX {
                            now = now.max(at).saturating_add(Nanos(late));
                            step = lane.poll(
                                &mut tally,
                                now,
                                &mut ticket,
                                cost,
                                waker,
                                None,
                                &mut after,
                            );
                        }
                    }
                    if ticket.is_none() {
                        prop_assert_eq!(step, Ok(Step::Granted(now)));
                        tickets.remove(0);
                    }
                }
                Op::Cancel(i) if !tickets.is_empty() => {
                    let ticket = tickets.remove(i % tickets.len());
                    lane.cancel(now, ticket, &mut after);
                }
                Op::Advance(span) => now = now.saturating_add(Nanos(span)),
                Op::TryAcquire(cost) => {
                    let _ = lane.try_acquire(&mut tally, now, cost, &mut after);
                }
                Op::Change(seed) => {
                    change(lane.rule_mut(), now, seed);
                    let _ = lane.head_waker();
                }
                Op::Ask { ahead, cost } => {
                    let at = Nanos(now.0.saturating_add_signed(ahead));
                    check(&mut lane, at, &[cost])?;
                }
                Op::Poll(_) | Op::Grant { .. } | Op::Cancel(_) => {}
            }
            let queued: Vec<u64> = lane.queue.iter().map(|e| e.ticket).collect();
            prop_assert_eq!(&queued, &tickets);
            if check_after {
                check(&mut lane, now, &[1, max_cost])?;
            }
        }
        check(&mut lane, now, &[1, max_cost])
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;
    use std::task::Waker;

    use proptest::prelude::*;

    use super::testing::{ops, replay};
    use super::*;
    use crate::core::{Bucket, WarmingUp, Window};

    /// A rule that counts how often it is asked or charged, clones included.
    #[derive(Clone, Debug)]
    struct Counting<R> {
        rule: R,
        calls: Rc<Cell<u64>>,
    }

    impl<R: Pace> Pace for Counting<R> {
        type Cost = R::Cost;
        fn earliest(&self, since: Nanos, cost: R::Cost) -> Nanos {
            self.calls.set(self.calls.get() + 1);
            self.rule.earliest(since, cost)
        }
        fn commit(&mut self, now: Nanos, since: Nanos, cost: R::Cost) {
            self.calls.set(self.calls.get() + 1);
            self.rule.commit(now, since, cost);
        }
        fn needs_wait(&self, cost: R::Cost) -> bool {
            self.rule.needs_wait(cost)
        }
        fn same(&self, other: &Self) -> bool {
            self.rule.same(&other.rule)
        }
        fn absorbs(&self, cost: R::Cost, late: Nanos) -> bool {
            self.rule.absorbs(cost, late)
        }
    }

    fn counting<R: Pace>(rule: R) -> (Lane<Counting<R>>, Rc<Cell<u64>>) {
        let calls = Rc::new(Cell::new(0));
        let rule = Counting {
            rule,
            calls: calls.clone(),
        };
        (Lane::new(rule), calls)
    }

    /// Queues `n` requests of cost 1 at `now`; returns their tickets.
    fn queue_up<R: Pace<Cost = u64>>(
        lane: &mut Lane<R>,
        tally: &mut Tally,
        now: Nanos,
        n: usize,
    ) -> Vec<u64> {
        (0..n)
            .map(|_| {
                let mut ticket = None;
                let mut after = After::default();
                let step = lane.poll(tally, now, &mut ticket, 1, Waker::noop(), None, &mut after);
                assert!(
                    matches!(step, Ok(Step::Wait(..) | Step::Queued)),
                    "{step:?}"
                );
                ticket.expect("queued")
            })
            .collect()
    }

    fn refused<R: Pace<Cost = u64>>(lane: &mut Lane<R>, tally: &mut Tally, now: Nanos) -> Nanos {
        let mut after = After::default();
        let wait = lane
            .try_acquire(tally, now, 1, &mut after)
            .expect_err("refused");
        Nanos::from_duration(wait.retry_after())
    }

    #[test]
    fn repeated_refusals_do_not_walk_the_queue() {
        // One token per 1_000 ns, none left, 1_000 waiters: the walk is 2_000 calls.
        let (mut lane, calls) = counting(Bucket::new(1, 1_000, 1));
        let mut tally = Tally::default();
        let mut after = After::default();
        assert!(lane
            .try_acquire(&mut tally, Nanos::ZERO, 1, &mut after)
            .is_ok());
        queue_up(&mut lane, &mut tally, Nanos::ZERO, 1_000);
        assert_eq!(
            refused(&mut lane, &mut tally, Nanos::ZERO),
            Nanos(1_001_000)
        );
        calls.set(0);
        // Time passes, but not up to the head's turn.
        for now in (0..999).step_by(10) {
            let wait = refused(&mut lane, &mut tally, Nanos(now));
            assert_eq!(wait, Nanos(1_001_000 - now));
        }
        assert!(
            calls.get() <= 4 * 100,
            "{} calls for 100 refusals",
            calls.get()
        );
        // A newcomer extends the walk by one step.
        queue_up(&mut lane, &mut tally, Nanos(999), 1);
        calls.set(0);
        assert_eq!(
            refused(&mut lane, &mut tally, Nanos(999)),
            Nanos(1_002_000 - 999)
        );
        assert!(calls.get() <= 4, "{} calls", calls.get());
    }

    #[test]
    fn grants_on_time_or_a_little_late_keep_the_walk() {
        // Four tokens, one per 1_000 ns, all taken at 0; 1_000 waiters of cost 1. Each head
        // is granted up to 500 ns late, which the bucket absorbs: the walk stays as it was.
        let (mut lane, calls) = counting(Bucket::new(1, 1_000, 4));
        let mut tally = Tally::default();
        let mut after = After::default();
        assert!(lane
            .try_acquire(&mut tally, Nanos::ZERO, 4, &mut after)
            .is_ok());
        let tickets = queue_up(&mut lane, &mut tally, Nanos::ZERO, 1_000);
        assert_eq!(
            refused(&mut lane, &mut tally, Nanos::ZERO),
            Nanos(1_001_000)
        );
        calls.set(0);
        for (i, ticket) in tickets.into_iter().take(100).enumerate() {
            let due = Nanos(1_000 * (i as u64 + 1));
            let now = due.saturating_add(Nanos(if i % 3 == 0 { 0 } else { 500 }));
            let mut ticket = Some(ticket);
            let step = lane.poll(
                &mut tally,
                now,
                &mut ticket,
                1,
                Waker::noop(),
                None,
                &mut after,
            );
            assert_eq!(step, Ok(Step::Granted(now)));
            // Asked after every other grant: right after it, and while the new head is
            // overdue.
            if i % 2 == 1 {
                assert_eq!(
                    refused(&mut lane, &mut tally, now),
                    Nanos(1_001_000 - now.0)
                );
                let overdue = Nanos(due.0 + 1_000 + 300);
                assert_eq!(
                    refused(&mut lane, &mut tally, overdue),
                    Nanos(1_001_000 - overdue.0)
                );
            }
        }
        assert!(
            calls.get() <= 100 * 20,
            "{} calls for 100 grants",
            calls.get()
        );
    }

    #[test]
    fn a_window_is_not_walked_again_either() {
        let (mut lane, calls) = counting(Window::new(2, Nanos(1_000)));
        let mut tally = Tally::default();
        let mut after = After::default();
        for _ in 0..2 {
            assert!(lane
                .try_acquire(&mut tally, Nanos::ZERO, 1, &mut after)
                .is_ok());
        }
        queue_up(&mut lane, &mut tally, Nanos::ZERO, 1_000);
        assert_eq!(refused(&mut lane, &mut tally, Nanos::ZERO), Nanos(501_000));
        calls.set(0);
        for now in 0..100 {
            assert_eq!(
                refused(&mut lane, &mut tally, Nanos(now)),
                Nanos(501_000 - now)
            );
        }
        assert!(
            calls.get() <= 4 * 100,
            "{} calls for 100 refusals",
            calls.get()
        );
    }

    #[test]
    fn waiters_are_found_anywhere_in_a_long_queue() {
        let mut lane = Lane::new(Bucket::new(1, 1_000, 1));
        let mut tally = Tally::default();
        let mut after = After::default();
        assert!(lane
            .try_acquire(&mut tally, Nanos::ZERO, 1, &mut after)
            .is_ok());
        let mut tickets = queue_up(&mut lane, &mut tally, Nanos::ZERO, 1_000);
        // Cancel every third, from the back; poll the rest.
        for i in (0..tickets.len()).rev().step_by(3) {
            lane.cancel(Nanos::ZERO, tickets.remove(i), &mut after);
        }
        for (i, &ticket) in tickets.iter().enumerate().skip(1) {
            let mut ticket = Some(ticket);
            let step = lane.poll(
                &mut tally,
                Nanos::ZERO,
                &mut ticket,
                1,
                Waker::noop(),
                None,
                &mut after,
            );
            assert_eq!(step, Ok(Step::Queued), "waiter {i}");
            assert!(ticket.is_some());
        }
        // A ticket no longer queued is taken as a new request.
        let mut gone = Some(tickets.last().copied().unwrap_or(0) + 1_000_000);
        let step = lane.poll(
            &mut tally,
            Nanos::ZERO,
            &mut gone,
            1,
            Waker::noop(),
            None,
            &mut after,
        );
        assert_eq!(step, Ok(Step::Queued));
        assert_eq!(lane.waiting(), tickets.len() + 1);
    }

    proptest! {
        #[test]
        fn projection_is_the_walk_for_a_bucket(
            tokens in 1u64..4,
            per in 1u128..5_000,
            burst in 1u64..5,
            ops in ops(6, 3_000),
        ) {
            replay(Bucket::new(tokens, per, burst), &ops, 6, |b, now, seed| {
                let tokens = 1 + seed % 3;
                let per = u128::from(1 + (seed >> 8) % 5_000);
                if seed & 1 << 20 == 0 {
                    b.set_rate(now, tokens, per);
                } else {
                    b.set_burst(now, 1 + (seed >> 24) % 5);
                }
            })?;
        }

        #[test]
        fn projection_is_the_walk_for_a_warm_up(
            tokens in 1u64..4,
            per in 100u128..10_000,
            warmup in 1u64..20_000,
            cold in 1.0f64..4.0,
            ops in ops(4, 5_000),
        ) {
            replay(WarmingUp::new(tokens, per, Nanos(warmup), cold), &ops, 4, |w, now, seed| {
                w.set_rate(now, 1 + seed % 3, u128::from(100 + (seed >> 8) % 10_000));
            })?;
        }

        #[test]
        fn projection_is_the_walk_for_a_window(
            k in 1usize..4,
            period in 0u64..3_000,
            ops in ops(2, 1_500),
        ) {
            replay(Window::new(k, Nanos(period)), &ops, 2, |w, _, seed| {
                w.set_limit(1 + (seed % 4) as usize, Nanos((seed >> 8) % 3_000));
            })?;
        }
    }
}
