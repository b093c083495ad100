//! Limiters shared by handle: one rule (a bucket, a window, a warm-up curve) behind a short
//! mutex, and a FIFO queue of waiters of which only the head waits on a timer.
//!
//! Every operation takes `now` and decides under the lock in a few arithmetic steps; the async
//! layer (`Waiter`) only reads the clock and sleeps until the head's deadline. A request is
//! charged when it is granted, never before, so a waiter that gives up (a dropped future, a
//! dropped stream) has taken nothing and leaves nothing behind but its place in the queue.

#[cfg(all(test, pacer_loom))]
mod loom;
pub(crate) mod quota;
mod rate_limiter;
mod stagger;

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::core::{Bucket, Nanos, WarmingUp, Window};
use crate::sync::{Mutex, MutexGuard};
use crate::timer::{self, Timer};

pub use quota::Quota;
pub(crate) use rate_limiter::Limit;
pub use rate_limiter::RateLimiter;
pub use stagger::Stagger;

/// A shared pacing rule: when may the head of the queue go, and what does granting cost.
pub(crate) trait Rule: Clone {
    /// When a request of `cost` that has been at the head of the queue since `since` may go.
    fn earliest(&self, since: Nanos, cost: u64) -> Nanos;
    /// Charges a request of `cost` granted at `now`, which has headed the queue since `since`.
    fn commit(&mut self, now: Nanos, since: Nanos, cost: u64);
    /// Whether a request of `cost` can only ever be had by waiting, so that asking without
    /// waiting is pointless.
    fn needs_wait(&self, cost: u64) -> bool;
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

/// A request could not be granted without waiting; [`retry_after`](NotUntil::retry_after) says
/// how long until it could be, if nothing else were taken meanwhile.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use pacer::{Rate, RateLimiter};
///
/// let limiter = RateLimiter::new(Rate::per_second(10), 1);
/// assert!(limiter.try_acquire(1).is_ok());
/// let refused = limiter.try_acquire(1).unwrap_err();
/// assert!(refused.retry_after() <= Duration::from_millis(100));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NotUntil {
    retry_after: Duration,
}

impl NotUntil {
    fn new(wait: Nanos) -> NotUntil {
        NotUntil {
            retry_after: wait.to_duration(),
        }
    }

    #[cfg(feature = "redis")]
    pub(crate) fn after(retry_after: Duration) -> NotUntil {
        NotUntil { retry_after }
    }

    #[cfg(feature = "redis")]
    pub(crate) fn never() -> NotUntil {
        NotUntil {
            retry_after: Duration::MAX,
        }
    }

    /// How long until the request could be granted, counting the requests queued before it;
    /// `Duration::MAX` if it can never be granted without waiting (a cost above the burst).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use pacer::{Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(10), 5);
    /// let refused = limiter.try_acquire(6).unwrap_err();
    /// assert_eq!(refused.retry_after(), Duration::MAX);
    /// ```
    #[must_use]
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }
}

impl std::fmt::Display for NotUntil {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.retry_after == Duration::MAX {
            f.write_str(
                "not available: the request costs more than the burst and never is without waiting",
            )
        } else {
            write!(f, "not available for {:?}", self.retry_after)
        }
    }
}

impl std::error::Error for NotUntil {}

/// A snapshot of a shared limiter's counters.
///
/// # Examples
///
/// ```
/// use pacer::{Rate, RateLimiter};
///
/// let limiter = RateLimiter::new(Rate::per_second(1), 1);
/// limiter.try_acquire(1).unwrap();
/// limiter.try_acquire(1).unwrap_err();
/// let stats = limiter.stats();
/// assert_eq!((stats.granted, stats.rejected, stats.waiting), (1, 1, 0));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Requests granted, with or without waiting.
    pub granted: u64,
    /// Requests refused: `try_acquire` and `acquire_timeout` that could not be granted in time,
    /// and items handed back by an enforcing stream.
    pub rejected: u64,
    /// Requests waiting in the queue now.
    pub waiting: usize,
    /// The time granted requests spent waiting in the queue, summed.
    pub total_wait: Duration,
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

#[derive(Debug)]
pub(crate) struct State<R> {
    pub(crate) rule: R,
    queue: VecDeque<Entry>,
    next_ticket: u64,
    granted: u64,
    rejected: u64,
    waited: u128,
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

/// The state shared by every handle of one limiter.
#[derive(Debug)]
pub(crate) struct Shared<R> {
    origin: Instant,
    state: Mutex<State<R>>,
}

impl<R: Rule> Shared<R> {
    pub(crate) fn new(rule: R) -> Shared<R> {
        Shared {
            origin: Instant::now(),
            state: Mutex::new(State {
                rule,
                queue: VecDeque::new(),
                next_ticket: 0,
                granted: 0,
                rejected: 0,
                waited: 0,
            }),
        }
    }

    pub(crate) fn origin(&self) -> Instant {
        self.origin
    }

    pub(crate) fn now(&self) -> Nanos {
        timer::since(self.origin, Instant::now())
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State<R>> {
        // The state is consistent between any two statements that could panic, so a panic
        // elsewhere while it was held does not make it unusable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Grants `cost` now if that needs no waiting and nobody is queued.
    ///
    /// The clock is read under the lock, so that grants are recorded in the order they
    /// happen: a thread paused between reading the clock and taking the lock would otherwise
    /// record its grant earlier than one already made.
    pub(crate) fn try_acquire(&self, cost: u64) -> Result<(), NotUntil> {
        let st = self.lock();
        let now = self.now();
        self.try_acquire_locked(st, now, cost)
    }

    #[cfg(all(test, pacer_loom))]
    pub(crate) fn try_acquire_at(&self, now: Nanos, cost: u64) -> Result<(), NotUntil> {
        self.try_acquire_locked(self.lock(), now, cost)
    }

    fn try_acquire_locked(
        &self,
        mut st: MutexGuard<'_, State<R>>,
        now: Nanos,
        cost: u64,
    ) -> Result<(), NotUntil> {
        if cost == 0 {
            st.granted += 1;
            return Ok(());
        }
        let refused = if st.rule.needs_wait(cost) {
            Nanos::MAX
        } else if !st.queue.is_empty() {
            st.projected(now, cost).saturating_sub(now)
        } else {
            match st.rule.earliest(now, cost) {
                at if at <= now => {
                    st.rule.commit(now, now, cost);
                    st.granted += 1;
                    return Ok(());
                }
                at => at.saturating_sub(now),
            }
        };
        st.rejected += 1;
        drop(st);
        trace_rejected(cost, refused);
        Err(NotUntil::new(refused))
    }

    /// Advances the request behind `ticket` (`None`: not queued yet), reading the clock under
    /// the lock. A new request joins the queue unless it could not be granted within
    /// `timeout`, in which case it is refused with the time it would have taken.
    pub(crate) fn poll(
        &self,
        ticket: &mut Option<u64>,
        cost: u64,
        waker: &Waker,
        timeout: Option<Duration>,
    ) -> Result<Step, NotUntil> {
        let st = self.lock();
        let now = self.now();
        let limit = timeout.map(|t| now.saturating_add(Nanos::from_duration(t)));
        self.poll_locked(st, now, ticket, cost, waker, limit)
    }

    #[cfg(all(test, pacer_loom))]
    pub(crate) fn poll_at(
        &self,
        now: Nanos,
        ticket: &mut Option<u64>,
        cost: u64,
        waker: &Waker,
    ) -> Result<Step, NotUntil> {
        self.poll_locked(self.lock(), now, ticket, cost, waker, None)
    }

    fn poll_locked(
        &self,
        mut st: MutexGuard<'_, State<R>>,
        now: Nanos,
        ticket: &mut Option<u64>,
        cost: u64,
        waker: &Waker,
        limit: Option<Nanos>,
    ) -> Result<Step, NotUntil> {
        if let Some(mine) = *ticket {
            match st.queue.iter().position(|e| e.ticket == mine) {
                Some(0) => return Ok(self.advance_head(st, now, ticket, cost, waker)),
                Some(i) => {
                    set_waker(&mut st.queue[i].waker, waker);
                    return Ok(Step::Queued);
                }
                // Only a grant or a cancel removes an entry, and both clear the ticket.
                None => *ticket = None,
            }
        }
        self.arrive(st, now, ticket, cost, waker, limit)
    }

    fn advance_head(
        &self,
        mut st: MutexGuard<'_, State<R>>,
        now: Nanos,
        ticket: &mut Option<u64>,
        cost: u64,
        waker: &Waker,
    ) -> Step {
        let Some(head) = st.queue.front() else {
            return Step::Queued;
        };
        let at = st.rule.earliest(head.since, cost);
        if at > now {
            if let Some(head) = st.queue.front_mut() {
                set_waker(&mut head.waker, waker);
            }
            return Step::Wait(at);
        }
        let since = head.since;
        if let Some(entry) = st.queue.pop_front() {
            st.waited += u128::from(now.saturating_sub(entry.enqueued).0);
        }
        *ticket = None;
        st.rule.commit(now, since, cost);
        st.granted += 1;
        let next = st.promote(now);
        drop(st);
        wake(next);
        Step::Granted
    }

    fn arrive(
        &self,
        mut st: MutexGuard<'_, State<R>>,
        now: Nanos,
        ticket: &mut Option<u64>,
        cost: u64,
        waker: &Waker,
        limit: Option<Nanos>,
    ) -> Result<Step, NotUntil> {
        if cost == 0 {
            st.granted += 1;
            return Ok(Step::Granted);
        }
        let step = if st.queue.is_empty() {
            let at = st.rule.earliest(now, cost);
            if at <= now {
                st.rule.commit(now, now, cost);
                st.granted += 1;
                return Ok(Step::Granted);
            }
            Step::Wait(at)
        } else {
            Step::Queued
        };
        if let Some(limit) = limit {
            let at = match step {
                Step::Wait(at) => at,
                _ => st.projected(now, cost),
            };
            if at > limit {
                st.rejected += 1;
                drop(st);
                let wait = at.saturating_sub(now);
                trace_rejected(cost, wait);
                return Err(NotUntil::new(wait));
            }
        }
        let mine = st.next_ticket;
        st.next_ticket += 1;
        st.queue.push_back(Entry {
            ticket: mine,
            cost,
            since: now,
            enqueued: now,
            waker: Some(waker.clone()),
        });
        *ticket = Some(mine);
        let waiting = st.queue.len();
        drop(st);
        trace_delayed(cost, waiting);
        Ok(step)
    }

    /// Takes the request behind `ticket` out of the queue, giving its place to the next.
    pub(crate) fn cancel(&self, ticket: u64) {
        let mut st = self.lock();
        let now = self.now();
        let Some(i) = st.queue.iter().position(|e| e.ticket == ticket) else {
            return;
        };
        st.queue.remove(i);
        let next = if i == 0 { st.promote(now) } else { None };
        drop(st);
        wake(next);
    }

    /// Changes the rule at `now`; the head of the queue re-reads its deadline.
    pub(crate) fn update(&self, f: impl FnOnce(&mut R, Nanos)) {
        let mut st = self.lock();
        let now = self.now();
        f(&mut st.rule, now);
        let head = st.queue.front_mut().and_then(|head| head.waker.take());
        drop(st);
        wake(head);
    }

    pub(crate) fn stats(&self) -> Stats {
        let st = self.lock();
        Stats {
            granted: st.granted,
            rejected: st.rejected,
            waiting: st.queue.len(),
            total_wait: Nanos(u64::try_from(st.waited).unwrap_or(u64::MAX)).to_duration(),
        }
    }
}

impl<R: Rule> State<R> {
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

fn wake(waker: Option<Waker>) {
    if let Some(waker) = waker {
        waker.wake();
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

/// Something that leads to a limiter's shared state: a borrowed handle for a future, an owned
/// one for a stream.
pub(crate) trait Handle {
    type Rule: Rule;
    fn shared(&self) -> &Shared<Self::Rule>;
}

impl<R: Rule> Handle for &Shared<R> {
    type Rule = R;
    fn shared(&self) -> &Shared<R> {
        self
    }
}

impl<R: Rule> Handle for Arc<Shared<R>> {
    type Rule = R;
    fn shared(&self) -> &Shared<R> {
        self
    }
}

pin_project! {
    /// One request at a time on a shared limiter: queued, woken when it heads the queue,
    /// sleeping until its deadline, and out of the queue again if dropped.
    pub(crate) struct Waiter<H: Handle> {
        handle: H,
        ticket: Option<u64>,
        #[pin]
        timer: Timer,
    }

    impl<H: Handle> PinnedDrop for Waiter<H> {
        fn drop(this: Pin<&mut Self>) {
            let me = this.project();
            if let Some(ticket) = me.ticket.take() {
                me.handle.shared().cancel(ticket);
            }
        }
    }
}

impl<H: Handle> Waiter<H> {
    pub(crate) fn new(handle: H) -> Self {
        let origin = handle.shared().origin();
        Waiter {
            handle,
            ticket: None,
            timer: Timer::with_origin(origin),
        }
    }

    /// Waits until `cost` is granted. With a `timeout`, a request that could not be granted
    /// within it is refused at once instead, taking nothing.
    pub(crate) fn poll_acquire(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        cost: u64,
        timeout: Option<Duration>,
    ) -> Poll<Result<(), NotUntil>> {
        let mut me = self.project();
        let shared = me.handle.shared();
        loop {
            match shared.poll(me.ticket, cost, cx.waker(), timeout)? {
                Step::Granted => return Poll::Ready(Ok(())),
                Step::Queued => return Poll::Pending,
                Step::Wait(at) => {
                    ready!(me.timer.as_mut().poll_until(cx, at));
                }
            }
        }
    }
}

impl<H: Handle> std::fmt::Debug for Waiter<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter")
            .field("queued", &self.ticket.is_some())
            .finish_non_exhaustive()
    }
}
