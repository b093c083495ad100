//! [`Stats`]: the counters every shared limiter reports.

use std::time::Duration;

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
