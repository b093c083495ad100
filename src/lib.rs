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
//! [`staggered_start_with`](PaceExt::staggered_start_with). A limit per destination is a
//! [`KeyedRateLimiter`] (one bucket per key, forgotten once full and idle), and
//! [`throttle_by_key`](PaceExt::throttle_by_key) paces one stream by it with no head-of-line
//! blocking between keys. With the `redis` feature,
//! `RedisRateLimiter` shares one quota across processes and machines.
//! An [`Adaptive`] finds a destination's real limit from its answers (`429 Too Many
//! Requests`, `Retry-After`) and keeps a `RateLimiter`'s rate there.
//!
//! The same pacing applies where items are written: [`PaceSinkExt`] gives every
//! [`Sink`](futures_sink::Sink) `throttle`, `throttle_with` and `min_interval`, holding an item
//! until it conforms and charging it when it is handed to the inner sink.
//!
//! With the `tower` feature, `pacer::tower::RateLimitLayer` puts the same shared quotas
//! in front of any tower `Service`: a client that waits its turn, or a server that answers
//! `429` with `Retry-After`, keyed by client if you like.
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
//!
//! # Cargo features
//!
//! None is on by default; the default build depends on tokio, futures-core, futures-sink and
//! pin-project-lite only.
//!
//! - `tracing`: debug-level events when a shared limiter delays or refuses a request.
//! - `redis`: `RedisRateLimiter`, one quota across processes and machines, kept in Redis.
//! - `tower`: `pacer::tower`, a tower layer over a shared quota (shaping or enforcing, a cost
//!   per request, keyed by client), and one that reports each response to an [`Adaptive`];
//!   adds `tower-service` and `tower-layer`.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unsafe_code)]

mod core;
mod ext;
mod rate;
#[cfg(feature = "redis")]
mod redis;
mod shared;
mod sink;
mod sink_ext;
mod stream;
mod sync;
mod timer;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;

pub use ext::PaceExt;
pub use rate::{ConfigError, Rate};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{
    FailurePolicy, RedisPermit, RedisQuotaError, RedisRateLimiter, RedisRateLimiterBuilder,
    RedisStats,
};
#[doc(hidden)]
pub use shared::AdaptiveLaw;
pub use shared::{Adaptive, AdaptiveStats};
pub use shared::{KeyedRateLimiter, NotUntil, Quota, RateLimiter, Stagger, Stats};
pub use sink::{SinkMinInterval, SinkThrottle, SinkThrottleWith};
pub use sink_ext::PaceSinkExt;
pub use stream::{
    BatchedInterval, Enforcing, MinInterval, RateExceeded, Shaping, StaggeredStart,
    StaggeredStartWith, Throttle, ThrottleByKey, ThrottleMode, ThrottleWith,
};

/// The README's code blocks, compiled as doctests so they cannot rot.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
