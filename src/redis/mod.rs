//! One quota shared by many processes and machines, kept in Redis (feature `redis`).
//!
//! - [`RedisRateLimiter`]: one limit for the whole fleet. [`RedisKeyedRateLimiter`]: one
//!   such limit per key.
//! - [`RedisRateLimiter<[u64; N]>`](RedisRateLimiter): several limits at once (requests and tokens, per minute and
//!   per day), each grant corrected once its real cost is known.
//!   [`RedisKeyedRateLimiter<K, [u64; N]>`](RedisKeyedRateLimiter): one such quota per key.
//!
//! All of them share the failure policy, the errors and the counters in this module. Each
//! decision is one atomic script call, on Redis's clock.
//!
//! The bucket is paced's GCRA, evaluated by one Lua script on Redis's own clock, so the
//! clocks of the client machines do not matter and every decision is atomic. Streams draw on
//! it through [`throttle_with`](crate::PaceExt::throttle_with), as on a local limiter.
//!
//! `RedisRateLimiter` is a `RedisKeyedRateLimiter` with one key: both acquire, lease, fall
//! back, back off and take turns through one implementation. A reservation waits out the wait
//! Redis gave it on a tokio timer of its own, then for this process's grants of the key charged
//! for earlier Redis instants: a process releases its grants at the instants Redis charged
//! them, in Redis's order, on every runtime flavor. Redis waiters do not queue in the
//! in-process limiters' waiter engine.
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

mod acquire;
mod builder;
mod connect;
mod error;
mod fallback;
mod key;
mod keyed;
mod keyed_multi;
mod lease;
mod limiter;
mod local;
mod multi;
mod permit;
mod policy;
mod script;
mod stats;
mod turns;
mod wait;

pub use builder::RedisLimiterBuilder;
pub use error::{RedisLimiterError, TryAcquireError};
pub use keyed::{RedisKeyedRateLimiter, RedisKeyedRateLimiterBuilder};
pub use limiter::{RedisRateLimiter, RedisRateLimiterBuilder};
pub use multi::RedisPermit;
pub use policy::FailurePolicy;
pub use stats::RedisStats;

/// The handles' states, one per shape of [`Cost`](crate::limiter::Cost) (see `sealed::Shape`): public
/// types in private modules.
pub(crate) mod state {
    pub(crate) use super::keyed::KeyedOne;
    pub(crate) use super::keyed_multi::KeyedSeveral;
    pub(crate) use super::limiter::One;
    pub(crate) use super::multi::Several;
}
