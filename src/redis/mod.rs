//! One quota across processes and machines, kept in Redis (feature `redis`):
//! [`RedisRateLimiter`] (also at the crate root), its builder, its failure policy, its errors
//! and its counters; and [`RedisKeyedRateLimiter`] (also at the crate root), one such quota
//! per key.
//!
//! The bucket is paced's GCRA, evaluated by one Lua script on Redis's own clock, so the
//! clocks of the client machines do not matter and every decision is atomic. Streams draw on
//! it through [`throttle_with`](crate::PaceExt::throttle_with), as on a local limiter.
//!
//! ```no_run
//! use paced::redis::FailurePolicy;
//! use paced::{Rate, RedisRateLimiter};
//!
//! # async fn demo() -> Result<(), paced::redis::RedisQuotaError> {
//! let quota = RedisRateLimiter::builder("redis://127.0.0.1/", "partner-api", Rate::per_second(100), 10)
//!     .failure_policy(FailurePolicy::FailOpen { share: 0.25 })
//!     .build()?;
//! quota.acquire(1).await?;
//! # Ok(())
//! # }
//! ```

mod error;
mod keyed;
mod limiter;
mod policy;
mod script;
mod turns;

pub use error::{RedisQuotaError, TryAcquireError};
pub use keyed::{RedisKeyedRateLimiter, RedisKeyedRateLimiterBuilder, RedisKeyedStats};
pub use limiter::{RedisRateLimiter, RedisRateLimiterBuilder, RedisStats};
pub use policy::FailurePolicy;
