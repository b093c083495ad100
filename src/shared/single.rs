//! One quota shared by handle: one [`Lane`] behind a mutex, with the clock's origin.

use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use tokio::time::Instant;

use super::lane::{After, Lane, Rule, Step, Tally};
use super::{Handle, NotUntil, Stats};
use crate::core::Nanos;
use crate::sync::{Mutex, MutexGuard};
use crate::timer;

/// What the mutex guards: the lane and the limiter's counters.
#[derive(Debug)]
pub(crate) struct Locked<R> {
    pub(crate) lane: Lane<R>,
    pub(crate) tally: Tally,
}

/// The state shared by every handle of one limiter.
#[derive(Debug)]
pub(crate) struct Shared<R> {
    origin: Instant,
    state: Mutex<Locked<R>>,
}

impl<R: Rule> Shared<R> {
    pub(crate) fn new(rule: R) -> Shared<R> {
        Shared {
            origin: Instant::now(),
            state: Mutex::new(Locked {
                lane: Lane::new(rule),
                tally: Tally::default(),
            }),
        }
    }

    pub(crate) fn now(&self) -> Nanos {
        timer::since(self.origin, Instant::now())
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Locked<R>> {
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
        mut st: MutexGuard<'_, Locked<R>>,
        now: Nanos,
        cost: u64,
    ) -> Result<(), NotUntil> {
        let mut after = After::default();
        let Locked { lane, tally } = &mut *st;
        let result = lane.try_acquire(tally, now, cost, &mut after);
        unlock_then(st, after);
        result
    }

    /// See [`Handle::poll`].
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
        mut st: MutexGuard<'_, Locked<R>>,
        now: Nanos,
        ticket: &mut Option<u64>,
        cost: u64,
        waker: &Waker,
        limit: Option<Nanos>,
    ) -> Result<Step, NotUntil> {
        let mut after = After::default();
        let Locked { lane, tally } = &mut *st;
        let step = lane.poll(tally, now, ticket, cost, waker, limit, &mut after);
        unlock_then(st, after);
        step
    }

    /// See [`Handle::cancel`].
    pub(crate) fn cancel(&self, ticket: u64) {
        let mut st = self.lock();
        let now = self.now();
        let mut after = After::default();
        st.lane.cancel(now, ticket, &mut after);
        unlock_then(st, after);
    }

    /// Changes the rule at `now`; the head of the queue re-reads its deadline.
    pub(crate) fn update<T>(&self, f: impl FnOnce(&mut R, Nanos) -> T) -> T {
        let mut st = self.lock();
        let now = self.now();
        let out = f(&mut st.lane.rule, now);
        let after = After {
            wake: st.lane.head_waker(),
            ..After::default()
        };
        unlock_then(st, after);
        out
    }

    /// Reads the rule at `now`.
    pub(crate) fn read<T>(&self, f: impl FnOnce(&R, Nanos) -> T) -> T {
        let st = self.lock();
        let now = self.now();
        f(&st.lane.rule, now)
    }

    pub(crate) fn stats(&self) -> Stats {
        let st = self.lock();
        Stats::new(&st.tally, st.lane.waiting())
    }
}

/// Releases the lock, then does what the lane deferred: a woken task should not find the
/// mutex still held, and tracing should not run under it.
pub(crate) fn unlock_then<T>(guard: MutexGuard<'_, T>, after: After) {
    drop(guard);
    after.run();
}

impl<R: Rule> Handle for &Shared<R> {
    fn origin(&self) -> Instant {
        self.origin
    }
    fn poll(
        &self,
        ticket: &mut Option<u64>,
        cost: u64,
        waker: &Waker,
        timeout: Option<Duration>,
    ) -> Result<Step, NotUntil> {
        Shared::poll(self, ticket, cost, waker, timeout)
    }
    fn cancel(&self, ticket: u64) {
        Shared::cancel(self, ticket);
    }
}

impl<R: Rule> Handle for Arc<Shared<R>> {
    fn origin(&self) -> Instant {
        self.origin
    }
    fn poll(
        &self,
        ticket: &mut Option<u64>,
        cost: u64,
        waker: &Waker,
        timeout: Option<Duration>,
    ) -> Result<Step, NotUntil> {
        Shared::poll(self, ticket, cost, waker, timeout)
    }
    fn cancel(&self, ticket: u64) {
        Shared::cancel(self, ticket);
    }
}
