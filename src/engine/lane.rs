//! The one waiter queue: a pacing rule and the FIFO queue of requests in front of it.
//!
//! A [`Lane`] decides in a few arithmetic steps, given `now`; it knows nothing of locks, clocks
//! or keys. A [`RateLimiter`](crate::RateLimiter) or a [`Stagger`](crate::Stagger) is one lane
//! behind a mutex; a [`KeyedRateLimiter`](crate::KeyedRateLimiter) is one lane per key behind
//! one mutex. A request is charged when it is granted, never before, so a waiter that gives up
//! has taken nothing and leaves nothing behind but its place in the queue.

use std::collections::VecDeque;
use std::task::Waker;

use crate::core::{Bucket, Nanos, WarmingUp, Window};
use crate::error::NotUntil;
use crate::stats::Stats;

/// A shared pacing rule: when may the head of the queue go, and what does granting cost.
pub(crate) trait Rule: Clone {
    /// When a request of `cost` that has been at the head of the queue since `since` may go.
    fn earliest(&self, since: Nanos, cost: u64) -> Nanos;
    /// Charges a request of `cost` granted at `now`, which has headed the queue since `since`.
    fn commit(&mut self, now: Nanos, since: Nanos, cost: u64);
    /// Whether a request of `cost` can only ever be had by waiting, so that asking without
    /// waiting is pointless.
    fn needs_wait(&self, cost: u64) -> bool;
    /// The rule's token bucket, if at `now` the rule is nothing but that bucket, so that a
    /// lock-free path may decide for it (see `single`).
    fn plain_bucket(&self, _now: Nanos) -> Option<&Bucket> {
        None
    }
    /// The rule's token bucket, to write back the state the lock-free path kept.
    fn bucket_mut(&mut self) -> Option<&mut Bucket> {
        None
    }
}

impl Rule for Bucket {
    fn earliest(&self, since: Nanos, cost: u64) -> Nanos {
        Bucket::earliest(self, since, cost)
    }
    fn commit(&mut self, now: Nanos, _: Nanos, cost: u64) {
        Bucket::commit(self, now, cost);
    }
    fn needs_wait(&self, cost: u64) -> bool {
        cost > self.burst()
    }
    fn plain_bucket(&self, _: Nanos) -> Option<&Bucket> {
        Some(self)
    }
    fn bucket_mut(&mut self) -> Option<&mut Bucket> {
        Some(self)
    }
}

impl Rule for WarmingUp {
    fn earliest(&self, _: Nanos, _: u64) -> Nanos {
        WarmingUp::earliest(self)
    }
    fn commit(&mut self, now: Nanos, since: Nanos, cost: u64) {
        // Guava reserves on arrival: a request that waited is charged as of the moment its
        // turn came, not as of the (up to a tick late) wake-up, so lateness does not add up.
        let due = since.max(WarmingUp::earliest(self)).min(now);
        WarmingUp::commit(self, due, cost);
    }
    fn needs_wait(&self, _: u64) -> bool {
        false
    }
}

impl Rule for Window {
    fn earliest(&self, since: Nanos, _: u64) -> Nanos {
        Window::earliest(self, since)
    }
    fn commit(&mut self, now: Nanos, _: Nanos, _: u64) {
        Window::commit(self, now);
    }
    fn needs_wait(&self, _: u64) -> bool {
        false
    }
}

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
struct Entry {
    ticket: u64,
    cost: u64,
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
    /// The request is granted and charged.
    Granted,
    /// The request heads the queue and may go at this time: sleep until then.
    Wait(Nanos),
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
}

impl After {
    /// Runs the deferred work; call it after the lock is released.
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
#[derive(Debug)]
pub(crate) struct Lane<R> {
    pub(crate) rule: R,
    queue: VecDeque<Entry>,
}

impl<R: Rule> Lane<R> {
    pub(crate) const fn new(rule: R) -> Lane<R> {
        Lane {
            rule,
            queue: VecDeque::new(),
        }
    }

    /// How many requests wait.
    pub(crate) fn waiting(&self) -> usize {
        self.queue.len()
    }

    /// Grants `cost` at `now` if that needs no waiting and nobody is queued.
    pub(crate) fn try_acquire(
        &mut self,
        tally: &mut Tally,
        now: Nanos,
        cost: u64,
        after: &mut After,
    ) -> Result<(), NotUntil> {
        if cost == 0 {
            tally.granted += 1;
            return Ok(());
        }
        let refused = if self.rule.needs_wait(cost) {
            Nanos::MAX
        } else if !self.queue.is_empty() {
            self.projected(now, cost).wait_from(now)
        } else {
            match self.rule.earliest(now, cost) {
                at if at <= now => {
                    self.rule.commit(now, now, cost);
                    tally.granted += 1;
                    return Ok(());
                }
                at => at.wait_from(now),
            }
        };
        tally.rejected += 1;
        after.rejected = Some((cost, refused));
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
        cost: u64,
        waker: &Waker,
        limit: Option<Nanos>,
        after: &mut After,
    ) -> Result<Step, NotUntil> {
        if let Some(mine) = *ticket {
            match self.queue.iter().position(|e| e.ticket == mine) {
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
        cost: u64,
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
            return Step::Wait(at);
        }
        let enqueued = head.enqueued;
        self.queue.pop_front();
        tally.waited += u128::from(now.saturating_sub(enqueued).0);
        *ticket = None;
        self.rule.commit(now, since, cost);
        tally.granted += 1;
        after.wake = self.promote(now);
        Step::Granted
    }

    #[allow(clippy::too_many_arguments)]
    fn arrive(
        &mut self,
        tally: &mut Tally,
        now: Nanos,
        ticket: &mut Option<u64>,
        cost: u64,
        waker: &Waker,
        limit: Option<Nanos>,
        after: &mut After,
    ) -> Result<Step, NotUntil> {
        if cost == 0 {
            tally.granted += 1;
            return Ok(Step::Granted);
        }
        let step = if self.queue.is_empty() {
            let at = self.rule.earliest(now, cost);
            if at <= now {
                self.rule.commit(now, now, cost);
                tally.granted += 1;
                return Ok(Step::Granted);
            }
            Step::Wait(at)
        } else {
            Step::Queued
        };
        if let Some(limit) = limit {
            let at = match step {
                Step::Wait(at) => at,
                _ => self.projected(now, cost),
            };
            if at > limit {
                tally.rejected += 1;
                let wait = at.wait_from(now);
                after.rejected = Some((cost, wait));
                return Err(NotUntil::new(wait));
            }
        }
        let mine = tally.next_ticket;
        tally.next_ticket += 1;
        self.queue.push_back(Entry {
            ticket: mine,
            cost,
            since: now,
            enqueued: now,
            waker: Some(waker.clone()),
        });
        *ticket = Some(mine);
        after.delayed = Some((cost, self.queue.len()));
        Ok(step)
    }

    /// Takes the request behind `ticket` out of the queue, giving its place to the next.
    pub(crate) fn cancel(&mut self, now: Nanos, ticket: u64, after: &mut After) {
        let Some(i) = self.queue.iter().position(|e| e.ticket == ticket) else {
            return;
        };
        self.queue.remove(i);
        if i == 0 {
            after.wake = self.promote(now);
        }
    }

    /// The head's waker, so that it re-reads its deadline after the rule changed.
    pub(crate) fn head_waker(&mut self) -> Option<Waker> {
        self.queue.front_mut().and_then(|head| head.waker.take())
    }

    /// When a request of `cost` joining the queue at `now` would be granted, if everyone
    /// ahead were granted as soon as they may.
    fn projected(&self, now: Nanos, cost: u64) -> Nanos {
        let mut rule = self.rule.clone();
        let mut t = now;
        for (i, entry) in self.queue.iter().enumerate() {
            let since = if i == 0 { entry.since } else { t };
            t = t.max(rule.earliest(since, entry.cost));
            rule.commit(t, since, entry.cost);
        }
        t.max(rule.earliest(t, cost))
    }

    /// Makes the new head of the queue start its wait at `now`; returns its waker.
    fn promote(&mut self, now: Nanos) -> Option<Waker> {
        let head = self.queue.front_mut()?;
        head.since = now;
        head.waker.take()
    }
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
    tracing::debug!(cost, retry_after = ?wait.to_duration(), "pacer: request refused");
}

#[allow(unused_variables)]
fn trace_delayed(cost: u64, waiting: usize) {
    #[cfg(feature = "tracing")]
    tracing::debug!(cost, waiting, "pacer: request delayed");
}
