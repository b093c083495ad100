//! Pacing for async Rust, on tokio's timer: hold a stream, a Sink, many tasks or a whole fleet
//! to a rate limit.
//!
//! Time is [`tokio::time::Instant`], so paced works under paused time. Test your own code with
//! `#[tokio::test(start_paused = true)]`: the schedule is exact, and the test ends at once.
//!
//! ```
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
//! # Seven operators on every stream
//!
//! [`PaceExt`] adds them to every [`Stream`](futures_core::Stream):
//!
//! | operator | what it promises |
//! |---|---|
//! | [`throttle(rate, cost, burst, mode)`](PaceExt::throttle) | a token bucket: the cost let through in any window `[t, t+w]` is at most `burst + w × rate`. [`Shaping`] delays an item until its tokens are there; [`Enforcing`] hands it back at once |
//! | [`min_interval(d)`](PaceExt::min_interval) | items at least `d` apart |
//! | [`batched_interval(n, d)`](PaceExt::batched_interval) | batches of up to `n` items, at least `d` apart |
//! | [`staggered_start(k, period)`](PaceExt::staggered_start) | at most `k` items in any window of `period` |
//! | [`throttle_with(&limiter, cost, mode)`](PaceExt::throttle_with) | the limit of a [`Limiter`] shared with other streams and tasks |
//! | [`staggered_start_with(&stagger)`](PaceExt::staggered_start_with) | the window of a [`Stagger`] shared with other streams and tasks |
//! | [`throttle_by_key(&keyed, key, cost, capacity)`](PaceExt::throttle_by_key) | a limit per key, from a [`KeyedLimiter`]; no key waits for another |
//!
//! Every operator keeps the order of items, and loses or repeats none. An item waits no longer
//! than its limit requires, plus tokio's 1 ms timer tick. When the upstream ends, what is held
//! still comes out, on time, before `None`. Each operator that checks its arguments has a
//! `try_` form that returns a [`ConfigError`] instead of panicking.
//!
//! [`PaceSinkExt`] gives every Sink `throttle`, `throttle_with` and `min_interval`. The types
//! the operators return are in [`stream`] and [`sink`].
//!
//! # Limiters shared by handle
//!
//! Clone a limiter to share it: every clone draws on the same limit. Waiters are served first
//! come, first served, and a waiter that gives up takes nothing. The limiters share their verbs
//! (`acquire`, `try_acquire`, `acquire_timeout`, `stats`, ...): the [`guide`] opens with the
//! table of every limiter by every verb.
//!
//! | limiter | what it limits |
//! |---|---|
//! | [`RateLimiter`] | many tasks, with one token bucket (it can also warm up slowly, as Guava's does) |
//! | [`Stagger`] | many tasks, to at most `k` starts in any window |
//! | [`RateLimiter`] | several limits at once, such as requests and tokens per minute and per day. [`Permit::settle`] corrects the charge once the answer gives the real cost |
//! | [`KeyedRateLimiter`] | one bucket per key (a destination, a tenant). A key is forgotten once its bucket is full again |
//! | [`KeyedMultiRateLimiter`] | several limits per key; [`KeyedPermit::settle`] corrects a key's charge |
//! | [`Adaptive`] | a [`RateLimiter`] whose rate follows what the destination says: `429`s, `Retry-After`, an announced quota |
//! | [`AdaptiveMulti`] | the same for each limit of a [`RateLimiter`] |
//! | [`RedisRateLimiter`] (feature `redis`) | one limit for many processes and machines, kept in Redis |
//! | [`RedisKeyedRateLimiter`] (feature `redis`) | one limit per key, for the fleet |
//! | [`RedisRateLimiter`] (feature `redis`) | several limits at once, for the fleet |
//! | [`RedisKeyedRateLimiter`] (feature `redis`) | several limits per key, for the fleet |
//!
//! The tower layers (feature `tower`) put any of them in front of a `Service`: see [tower].
//!
//! # The other names at the root
//!
//! - [`Rate`]: a refill rate, `tokens` every `per`, kept as an exact fraction.
//! - [`Limit`]: one limit of a [`RateLimiter`]: a token bucket or a fixed window.
//! - [`Shaping`] and [`Enforcing`]: the two modes of `throttle` and `throttle_with`: wait, or
//!   refuse at once.
//! - [`NotUntil`]: the one refusal of every limiter, stream, Sink and layer. It says when to
//!   retry.
//! - [`RateExceeded`]: an item an [`Enforcing`] stream refused, handed back with its
//!   [`NotUntil`].
//! - [`ConfigError`]: a value that describes no usable limit, such as a burst of 0.
//! - [`Stats`] and [`AdaptiveStats`]: a limiter's counters, and an [`Adaptive`]'s.
//! - [`Permit`] and [`KeyedPermit`]: what a grant charged, to settle once the real cost is
//!   known.
//! - [`RateLimiterBuilder`], [`KeyedMultiRateLimiterBuilder`] and
//!   [`AdaptiveMultiBuilder`]: the builders of the limiters with several limits.
//! - [`Announced`]: one limit a response announced in its headers, for
//!   [`Adaptive::on_quota`].
//! - [`Limiter`] and [`KeyedLimiter`]: what `throttle_with`, `throttle_by_key` and the tower
//!   layers accept: any shared limiter, any keyed one.
//! - `AdaptiveLaw` (feature `unstable-laws`): the control laws an [`Adaptive`] can follow,
//!   outside semver.
//!
//! The [`guide`] explains each entry point at length, with its promises and its limits.
//!
//! # Cargo features
//!
//! None is on by default. The default build depends on tokio, futures-core, futures-sink,
//! pin-project-lite and hashbrown only.
//!
//! - `tracing`: a debug event when a shared limiter delays or refuses a request.
//! - `redis`: the four Redis limiters above, on one Redis server or a Redis Cluster, and the
//!   [redis] module (their builder, errors and failure policy). Adds the `redis` crate; needs
//!   Rust 1.88.
//! - `tower`: the [tower] module: `RateLimitLayer` paces the requests of a client, or refuses
//!   them at a server, on any shared limiter; `AdaptiveLayer` reports each response to an
//!   [`Adaptive`]. Adds `tower-service` and `tower-layer`.
//! - `http`: quota headers, both ways. A refusing layer can announce its quota on every response
//!   (`RateLimit-Policy` and `RateLimit`, or `X-RateLimit-*`). A client reads the limits a
//!   response announces (the IETF draft, GitHub's, OpenAI's and Anthropic's headers) and
//!   `429`/`503` with `Retry-After`. Implies `tower`; adds `http`, `httpdate` and `jiff`.
//! - `metrics`: counters, a histogram and gauges on the `metrics` facade, for every limiter
//!   given a name with `with_metrics`. The application installs the recorder. Adds `metrics`.
//! - `unstable-laws`: `AdaptiveLaw` and `Adaptive::try_with_law`, the control laws the adaptive
//!   benchmark compares. Outside semver: they may change or go in any release.
//!
#![cfg_attr(
    feature = "redis",
    doc = "[`RedisRateLimiter`]: crate::RedisRateLimiter\n\n\
           [`RedisKeyedRateLimiter`]: crate::RedisKeyedRateLimiter\n\n\
           [`RedisRateLimiter`]: crate::RedisRateLimiter\n\n\
           [`RedisKeyedRateLimiter`]: crate::RedisKeyedRateLimiter\n\n\
           [redis]: crate::redis"
)]
#![cfg_attr(
    not(feature = "redis"),
    doc = "[`RedisRateLimiter`]: https://docs.rs/paced/latest/paced/struct.RedisRateLimiter.html\n\n\
           [`RedisKeyedRateLimiter`]: https://docs.rs/paced/latest/paced/struct.RedisKeyedRateLimiter.html\n\n\
           [`RedisRateLimiter`]: https://docs.rs/paced/latest/paced/struct.RedisRateLimiter.html\n\n\
           [`RedisKeyedRateLimiter`]: https://docs.rs/paced/latest/paced/struct.RedisKeyedRateLimiter.html\n\n\
           [redis]: https://docs.rs/paced/latest/paced/redis/"
)]
#![cfg_attr(feature = "tower", doc = "[tower]: crate::tower")]
#![cfg_attr(
    not(feature = "tower"),
    doc = "[tower]: https://docs.rs/paced/latest/paced/tower/"
)]
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
    Adaptive, AdaptiveMulti, AdaptiveMultiBuilder, AdaptiveStats, Announced, Cost, KeyedLimiter,
    KeyedMultiRateLimiter, KeyedMultiRateLimiterBuilder, KeyedPermit, KeyedRateLimiter, Limit,
    Limiter, Permit, RateLimiter, RateLimiterBuilder, Stagger,
};
pub use mode::{Enforcing, Shaping};
pub use rate::Rate;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{RedisKeyedRateLimiter, RedisRateLimiter};
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
