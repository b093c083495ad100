//! Limits shared by many processes and machines, kept in Redis (feature `redis`).
//!
//! - [`RedisRateLimiter`]: one limit for the whole fleet. `RedisRateLimiter<[u64; N]>`, built
//!   by [`dimensions`](RedisRateLimiter::dimensions), holds several limits at once (requests
//!   and tokens, per minute and per day); each grant is settled once its real cost is known.
//! - [`RedisKeyedRateLimiter`]: the same, per key.
//!
//! Each decision is one atomic script call on Redis's clock, so the machines' clocks do not
//! matter. A process serves its waiters in the order Redis granted them, on every runtime.
//! Streams, sinks and tower layers draw on them as on a local limiter, one limit or several: a
//! `RedisRateLimiter` through [`throttle_with`](crate::PaceExt::throttle_with), a
//! `RedisKeyedRateLimiter` through [`throttle_by_key`](crate::PaceExt::throttle_by_key). Over
//! several limits, a tower layer's `settle` corrects each request's charge from its answer.
//!
//! This module holds what they share: the builder, the errors, the counters, and the
//! [`FailurePolicy`] that says what to do while Redis cannot be reached.
//!
//! ```no_run
//! use paced::redis::FailurePolicy;
//! use paced::{Rate, RedisRateLimiter};
//!
//! # async fn demo() -> Result<(), paced::redis::RedisLimiterError> {
//! let quota = RedisRateLimiter::builder("redis://127.0.0.1/", "partner-api", Rate::per_second(100), 10)
//!     .failure_policy(FailurePolicy::FailOpen { share: 0.25 })
//!     .build()?;
//! quota.acquire(1).await?;
//! # Ok(())
//! # }
//! ```

mod builder;
mod connect;
mod dimensions;
mod error;
mod fallback;
mod held;
mod key;
mod keyed;
mod keyed_multi;
mod limiter;
mod multi;
mod permit;
mod policy;
mod script;
mod settle;
mod several;
mod stats;
mod turns;
mod wait;

pub use builder::RedisLimiterBuilder;
pub use error::{RedisLimiterError, TryAcquireError};
pub use keyed::{RedisKeyedRateLimiter, RedisKeyedRateLimiterBuilder};
pub use limiter::{RedisRateLimiter, RedisRateLimiterBuilder};
pub use policy::FailurePolicy;
pub use settle::RedisPermit;
pub use stats::RedisStats;

/// The handles' states, one per shape of [`Cost`](crate::limiter::Cost) (see `sealed::Shape`): public
/// types in private modules.
pub(crate) mod state {
    pub(crate) use super::keyed::KeyedOne;
    pub(crate) use super::keyed_multi::KeyedSeveral;
    pub(crate) use super::limiter::One;
    pub(crate) use super::several::Several;
}
