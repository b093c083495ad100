//! Pacing operators for async streams, on tokio's timer.
//!
//! `paced` adds four operators to every [`Stream`](futures_core::Stream) through [`PaceExt`]:
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
//! # Entry points
//!
//! Every entry point is a thin layer over one token-bucket core and one waiter engine: the
//! same arithmetic and the same fair (FIFO) queue, wherever the items come from.
//!
//! | where the items are | use | |
//! |---|---|---|
//! | a stream | [`PaceExt`] | adapters in [`stream`] |
//! | a Sink | [`PaceSinkExt`] | adapters in [`sink`] |
//! | tasks sharing a limit | [`RateLimiter`] (optionally with Guava's warm-up), [`Stagger`] | streams draw on them with [`throttle_with`](PaceExt::throttle_with) |
//! | several limits at once (requests AND tokens, per minute AND per day) | [`MultiRateLimiter`] | a cost per dimension, token buckets and fixed windows, one FIFO queue; [`Permit::settle`] corrects an estimate |
//! | one limit per destination | [`KeyedRateLimiter`] | [`throttle_by_key`](PaceExt::throttle_by_key) |
//! | several limits per destination or tenant | [`KeyedMultiRateLimiter`] | [`throttle_by_key`](PaceExt::throttle_by_key); [`KeyedPermit::settle`] per key |
//! | a limit learned from `429`s | [`Adaptive`], [`AdaptiveMulti`] (each limit of a [`MultiRateLimiter`] on its own) | |
//! | a tower `Service` | `paced::tower` (feature `tower`) | shaping clients, enforcing servers |
//! | one limit across machines | `RedisRateLimiter` (feature `redis`) | details in `paced::redis` |
//! | several limits at once across machines | `RedisMultiRateLimiter`, `RedisKeyedMultiRateLimiter` (feature `redis`) | the fleet's [`MultiRateLimiter`] (per key): every limit checked and charged by one script call; `settle` corrects in Redis |
//! | one limit per key across machines | `RedisKeyedRateLimiter` (feature `redis`) | per-key limits for the whole fleet; [`throttle_by_key`](PaceExt::throttle_by_key) and the keyed tower layer take it ([`KeyedLimiter`]) |
//!
//! Every refusal is a [`NotUntil`]; every configuration value that cannot be is a
//! [`ConfigError`], and every setter that takes one has a `try_` form. The [`guide`] explains
//! each entry point at length, with its promises and its limits.
//!
//! ```
//! use std::time::Duration;
//! use futures_util::StreamExt;
//! use paced::{PaceExt, Rate, Shaping};
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
//! None is on by default; the default build depends on tokio, futures-core, futures-sink,
//! pin-project-lite and hashbrown only.
//!
//! - `tracing`: debug-level events when a shared limiter delays or refuses a request.
//! - `redis`: `RedisRateLimiter`, one limit across processes and machines, kept in Redis, and
//!   `RedisKeyedRateLimiter`, one such limit per key.
//! - `tower`: `paced::tower`, a tower layer over a shared limiter (shaping or enforcing, a cost
//!   per request, keyed by client), and one that reports each response to an [`Adaptive`];
//!   adds `tower-service` and `tower-layer`.
//! - `http`: `paced::tower::classify_http` and `AdaptiveLayer::http`: an [`Adaptive`] fed by
//!   `429`/`503`, `Retry-After` and the quota headers (`RateLimit`, `X-RateLimit-*`) of an
//!   `http::Response`; implies `tower`, adds `http` and `httpdate`.
//! - `hires-timer`: on Linux, [`precise()`](crate::stream::Throttle::precise) sleeps the part of
//!   a wait below tokio's 1 ms tick on a `timerfd` instead of yielding through it, so sub-
//!   millisecond pacing no longer keeps a core busy; adds `rustix` (Linux only) and tokio's
//!   `net`. Needs the runtime's IO driver. Elsewhere, and under paused time, it changes nothing.
//! - `unstable-laws`: `AdaptiveLaw` and `Adaptive::try_with_law`, the control laws the
//!   adaptive benchmark compares. Outside semver: they may change or go in any release.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![forbid(unsafe_code)]

mod core;
mod engine;
mod error;
pub mod guide;
#[cfg(feature = "metrics")]
mod instrument;
mod limiter;
mod mode;
mod rate;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
pub mod sink;
mod stats;
pub mod stream;
mod sync;
mod timer;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;

pub use error::{ConfigError, NotUntil, RateExceeded};
#[cfg(feature = "unstable-laws")]
#[cfg_attr(docsrs, doc(cfg(feature = "unstable-laws")))]
pub use limiter::AdaptiveLaw;
pub use limiter::{
    Adaptive, AdaptiveMulti, AdaptiveMultiBuilder, AdaptiveStats, Announced, KeyedLimiter,
    KeyedMultiRateLimiter, KeyedMultiRateLimiterBuilder, KeyedPermit, KeyedRateLimiter, Limit,
    Limiter, MultiRateLimiter, MultiRateLimiterBuilder, Permit, RateLimiter, Stagger,
};
#[allow(deprecated)]
pub use limiter::{KeyedQuota, Quota};
pub use mode::{Enforcing, Shaping};
pub use rate::Rate;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{
    RedisKeyedMultiRateLimiter, RedisKeyedRateLimiter, RedisMultiRateLimiter, RedisRateLimiter,
};
pub use sink::PaceSinkExt;
pub use stats::Stats;
pub use stream::PaceExt;

/// The README's code blocks, compiled as doctests so they cannot rot. They are whole programs,
/// as pasted (no hidden lines), and one needs the `redis` feature: they are tested by
/// `cargo test --all-features`. `.ci/readme-snippets` also builds and runs each with exactly
/// the README's dependencies.
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "redis"))]
pub struct ReadmeDoctests;
