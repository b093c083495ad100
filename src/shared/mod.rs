//! Limiters shared by handle: one rule (a bucket, a window, a warm-up curve) and a FIFO queue
//! of waiters of which only the head waits on a timer ([`lane`]), behind a short mutex
//! ([`single`] for one quota, [`keyed`] for one quota per key).
//!
//! Every operation takes `now` and decides under the lock in a few arithmetic steps; the async
//! layer ([`Waiter`]) only reads the clock and sleeps until the head's deadline. A request is
//! charged when it is granted, never before, so a waiter that gives up (a dropped future, a
//! dropped stream) has taken nothing and leaves nothing behind but its place in the queue.

mod adaptive;
pub(crate) mod keyed;
pub(crate) mod lane;
#[cfg(all(test, pacer_loom))]
mod loom;
pub(crate) mod quota;
mod rate_limiter;
pub(crate) mod single;
mod stagger;
mod striped;

use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::core::Nanos;
use crate::timer::Timer;

pub use adaptive::{Adaptive, AdaptiveLaw, AdaptiveStats};
pub use keyed::KeyedRateLimiter;
pub(crate) use lane::Step;
pub use quota::Quota;
pub(crate) use rate_limiter::Limit;
pub use rate_limiter::RateLimiter;
pub(crate) use single::Shared;
pub use stagger::Stagger;

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
    pub(crate) fn new(wait: Nanos) -> NotUntil {
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

impl Stats {
    pub(crate) fn new(tally: &lane::Tally, waiting: usize) -> Stats {
        Stats {
            granted: tally.granted,
            rejected: tally.rejected,
            waiting,
            total_wait: Nanos(u64::try_from(tally.waited).unwrap_or(u64::MAX)).to_duration(),
        }
    }
}

/// A request's way into a limiter's queue: a borrowed handle for a future, an owned one for a
/// stream; for a keyed limiter, the key too.
pub(crate) trait Handle {
    /// The instant the limiter's times count from.
    fn origin(&self) -> Instant;
    /// Advances the request behind `ticket` (`None`: not queued yet), reading the clock under
    /// the lock. A new request joins the queue unless it could not be granted within
    /// `timeout`, in which case it is refused with the time it would have taken.
    fn poll(
        &self,
        ticket: &mut Option<u64>,
        cost: u64,
        waker: &Waker,
        timeout: Option<Duration>,
    ) -> Result<Step, NotUntil>;
    /// Takes the request behind `ticket` out of the queue, giving its place to the next.
    fn cancel(&self, ticket: u64);
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
                me.handle.cancel(ticket);
            }
        }
    }
}

impl<H: Handle> Waiter<H> {
    pub(crate) fn new(handle: H) -> Self {
        let origin = handle.origin();
        Waiter {
            handle,
            ticket: None,
            timer: Timer::with_origin(origin),
        }
    }

    /// The way into the queue this waiter uses.
    #[cfg(feature = "tower")]
    pub(crate) fn handle(&self) -> &H {
        &self.handle
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
        loop {
            match me.handle.poll(me.ticket, cost, cx.waker(), timeout)? {
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
