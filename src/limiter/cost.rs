//! [`Cost`]: the shape of what one request costs, which picks a handle's limits.

use std::fmt;

/// What one request costs: `u64` for a limiter of one limit, `[u64; N]` for a limiter of
/// several limits over `N` dimensions (requests and tokens, say).
///
/// Every handle takes it as a type parameter that defaults to `u64`: a
/// [`RateLimiter`](crate::RateLimiter) is one token bucket and a
/// `RateLimiter<[u64; 2]>` counts two things at once. Adding a dimension changes the builder
/// and the cost, not the type's name or its methods, and a cost of the wrong shape does not
/// compile.
///
/// Sealed: only `u64` and `[u64; N]` are costs.
///
/// # Examples
///
/// ```
/// use paced::{Limit, Rate, RateLimiter};
///
/// let one = RateLimiter::new(Rate::per_second(10), 10); // a RateLimiter<u64>
/// assert!(one.try_acquire(1).is_ok());
///
/// let two: RateLimiter<[u64; 2]> = RateLimiter::builder(["requests", "tokens"])
///     .limit("requests", Limit::bucket(Rate::per_second(10), 10))
///     .limit("tokens", Limit::bucket(Rate::per_second(1_000), 1_000))
///     .build()
///     .unwrap();
/// assert!(two.try_acquire([1, 300]).is_ok());
/// ```
pub trait Cost: sealed::Shape + Copy + Send + Sync + fmt::Debug + PartialEq + 'static {}

impl Cost for u64 {}
impl<const N: usize> Cost for [u64; N] {}

pub(crate) mod sealed {
    /// Which state each handle keeps for a cost's shape: public in a private module, so that
    /// the handles can name it and users cannot.
    pub trait Shape {
        /// A [`RateLimiter`](crate::RateLimiter)'s.
        type Local: State;
        /// An [`Adaptive`](crate::Adaptive)'s.
        type Adaptive: AdaptiveState;
        /// A [`KeyedRateLimiter`](crate::KeyedRateLimiter)'s, keyed by `K` and hashed by `S`.
        type Keyed<K, S>: KeyedState<K, S>;
        /// A [`RedisRateLimiter`](crate::RedisRateLimiter)'s.
        #[cfg(feature = "redis")]
        type Redis: Clone + std::fmt::Debug;
        /// A [`RedisKeyedRateLimiter`](crate::RedisKeyedRateLimiter)'s, of keys `K`.
        #[cfg(feature = "redis")]
        type RedisKeyed<K>: Clone + std::fmt::Debug;
    }

    /// What a [`RateLimiter`](crate::RateLimiter)'s state does the same way for every shape.
    pub trait State: Clone + std::fmt::Debug {
        /// Grants nothing before `d` from now.
        fn pause_for(&self, d: std::time::Duration);
        /// The limiter's counters.
        fn stats(&self) -> crate::limiter::Stats;
        /// Records to the `metrics` facade under `name`.
        #[cfg(feature = "metrics")]
        fn set_metrics(&self, name: &str);
    }

    /// What a [`KeyedRateLimiter`](crate::KeyedRateLimiter)'s state does the same way for
    /// every shape.
    pub trait KeyedState<K, S>: Clone + std::fmt::Debug {
        /// How many keys hold state now.
        fn tracked_keys(&self) -> usize
        where
            K: std::hash::Hash,
            S: std::hash::BuildHasher;
        /// The counters over all keys.
        fn stats(&self) -> crate::limiter::Stats
        where
            S: std::hash::BuildHasher;
        /// Records to the `metrics` facade under `name`.
        #[cfg(feature = "metrics")]
        fn set_metrics(&self, name: &str)
        where
            S: std::hash::BuildHasher;
    }

    /// What an [`Adaptive`](crate::Adaptive)'s state does the same way for every shape.
    pub trait AdaptiveState: Clone + std::fmt::Debug {
        /// Reports a call that succeeded.
        fn on_success(&self);
        /// Reports a call refused for going too fast.
        fn on_throttled(&self, retry_after: Option<std::time::Duration>);
        /// Records to the `metrics` facade under `name`.
        #[cfg(feature = "metrics")]
        fn set_metrics(&self, name: &str);
    }
}
