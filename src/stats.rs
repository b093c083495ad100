//! [`Stats`]: the counters every shared limiter reports; with the `http` feature, the state a
//! quota announces in headers.

use std::time::Duration;

/// A snapshot of a shared limiter's counters.
///
/// # Examples
///
/// ```
/// use paced::{Rate, RateLimiter};
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

/// A token bucket as quota headers describe it, read at a decision.
///
/// - `limit`: the burst, the most that can be had at once;
/// - `window`: the time the bucket takes to refill from empty (`burst / rate`), so that
///   `limit` per `window` is the rate;
/// - `remaining`: the whole tokens left;
/// - `reset`: the time until the bucket is full again.
///
/// Public only to appear in the sealed limiter traits' signatures; not nameable outside the crate.
#[cfg(feature = "http")]
#[allow(unreachable_pub)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitState {
    pub(crate) limit: u64,
    pub(crate) window: std::time::Duration,
    pub(crate) remaining: u64,
    pub(crate) reset: std::time::Duration,
}

#[cfg(feature = "http")]
impl LimitState {
    /// The state of `bucket`, refilled at `rate`, at `now`.
    pub(crate) fn of(
        bucket: &crate::core::Bucket,
        rate: crate::rate::Rate,
        now: crate::core::Nanos,
    ) -> LimitState {
        let burst = bucket.burst();
        let window = rate
            .per_nanos()
            .saturating_mul(u128::from(burst))
            .div_ceil(u128::from(rate.tokens()));
        LimitState {
            limit: burst,
            window: crate::core::Nanos(u64::try_from(window).unwrap_or(u64::MAX)).to_duration(),
            remaining: bucket.available(now),
            reset: bucket.full_at().saturating_sub(now).to_duration(),
        }
    }
}
