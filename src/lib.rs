//! Pacing operators for async streams, on tokio's timer.
//!
//! `pacer` adds four operators to every [`Stream`](futures_core::Stream) through [`PaceExt`]:
//!
//! | operator | promise |
//! |---|---|
//! | [`throttle(rate, cost, burst, mode)`](PaceExt::throttle) | token bucket: the cost emitted in any window `[t, t+w]` is at most `burst + w * rate`; [`Shaping`] delays, [`Enforcing`] hands back what does not conform |
//! | [`min_interval(d)`](PaceExt::min_interval) | consecutive items at least `d` apart, counted from the previous emission |
//! | [`batched_interval(n, d)`](PaceExt::batched_interval) | batches of `1..=n` items, consecutive batches at least `d` apart |
//! | [`staggered_start(k, period)`](PaceExt::staggered_start) | at most `k` items in any window of `period` |
//!
//! Every operator keeps order, loses and duplicates nothing, lets an item wait no longer than
//! its bound requires (plus tokio's 1 ms timer tick), and after upstream ends still delivers
//! what it holds, at its time, before `None`.
//!
//! Time is [`tokio::time::Instant`], so everything works under paused time: test your own
//! code with `#[tokio::test(start_paused = true)]` and the schedule is exact and instant.
//!
//! A quota shared by many tasks and streams is a [`RateLimiter`] (a token bucket, optionally
//! with Guava's warm-up) or a [`Stagger`] (the sliding window), cloned by handle, fair (FIFO) and
//! changeable at run time; streams draw on one with
//! [`throttle_with`](PaceExt::throttle_with) and
//! [`staggered_start_with`](PaceExt::staggered_start_with). With the `redis` feature,
//! `RedisRateLimiter` shares one quota across processes and machines. An [`Adaptive`] finds a
//! destination's real limit from its answers (`429 Too Many Requests`, `Retry-After`) and keeps
//! a `RateLimiter`'s rate there.
//!
//! ```
//! use std::time::Duration;
//! use futures_util::StreamExt;
//! use pacer::{PaceExt, Rate, Shaping};
//! use tokio::time::Instant;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let start = Instant::now();
//! let sent: Vec<_> = futures_util::stream::iter(["a", "b", "c"])
//!     .throttle(Rate::per_second(1), |_| 1, 1, Shaping)
//!     .map(|sms| (sms, start.elapsed().as_secs()))
//!     .collect()
//!     .await;
//! assert_eq!(sent, [("a", 0), ("b", 1), ("c", 2)]);
//! # }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unsafe_code)]

mod core;
mod ext;
mod rate;
#[cfg(feature = "redis")]
mod redis;
mod shared;
mod stream;
mod sync;
mod timer;

pub use ext::PaceExt;
pub use rate::{ConfigError, Rate};
#[cfg(feature = "redis")]
pub use redis::{
    FailurePolicy, RedisPermit, RedisQuotaError, RedisRateLimiter, RedisRateLimiterBuilder,
    RedisStats,
};
#[doc(hidden)]
pub use shared::AdaptiveLaw;
pub use shared::{Adaptive, AdaptiveStats};
pub use shared::{KeyedRateLimiter, NotUntil, Quota, RateLimiter, Stagger, Stats};
pub use stream::{
    BatchedInterval, Enforcing, MinInterval, RateExceeded, Shaping, StaggeredStart,
    StaggeredStartWith, Throttle, ThrottleByKey, ThrottleMode, ThrottleWith,
};

/// The README's code blocks, compiled as doctests so they cannot rot.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
