//! [`RedisStats`]: the counters of a Redis limiter in this process.

use std::sync::atomic::{AtomicU64, Ordering};

use super::script::Counters;

/// Counters of a [`RedisRateLimiter`](crate::RedisRateLimiter) or a
/// [`RedisKeyedRateLimiter`](crate::RedisKeyedRateLimiter) in this process (over all its keys).
///
/// # Examples
///
/// ```
/// let stats = paced::redis::RedisStats::default();
/// assert_eq!((stats.round_trips, stats.keys), (0, 0));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Script calls sent to Redis (successful or not), limit changes and leases given back in
    /// the background included.
    pub round_trips: u64,
    /// Acquisitions granted, from Redis, from a lease, or from the fail-open fallback.
    pub granted: u64,
    /// Acquisitions served from a local lease, without a round trip.
    pub from_lease: u64,
    /// Acquisitions granted by the fail-open fallback while Redis was unreachable.
    pub fallback: u64,
    /// `try_acquire` calls refused, and `acquire_timeout` calls that timed out.
    pub rejected: u64,
    /// Round trips that failed for an outage (Redis unreachable, slow or restarting).
    pub errors: u64,
    /// Round trips that Redis answered with an error (a key of another type, a refused
    /// command): not outages, each also logged at error level with the `tracing` feature.
    pub reply_errors: u64,
    /// Keys this process holds local state for now: those with an acquisition in flight,
    /// and with leases those with a lease or granted within the lease age. A key leaves the
    /// count once nothing uses it and its lease, if any, has expired (and been given back).
    /// A `try_acquire` of a key this process holds nothing for is not counted, unless it
    /// leaves state (with leases, its grant; an outage's fallback). (A
    /// [`RedisRateLimiter`](crate::RedisRateLimiter) has one key: 0 or 1.)
    pub keys: usize,
}

impl RedisStats {
    /// The counters as they are now, with `keys` keys held.
    pub(super) fn read(c: &Counters, keys: usize) -> RedisStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RedisStats {
            round_trips: get(&c.round_trips),
            granted: get(&c.granted),
            from_lease: get(&c.from_lease),
            fallback: get(&c.fallback),
            rejected: get(&c.rejected),
            errors: get(&c.errors),
            reply_errors: get(&c.reply_errors),
            keys,
        }
    }
}
