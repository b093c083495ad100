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
//! | [`throttle_with(&limiter, cost, mode)`](PaceExt::throttle_with) | the limit of a [`Limiter`](limiter::Limiter) shared with other streams and tasks |
//! | [`staggered_start_with(&stagger)`](PaceExt::staggered_start_with) | the window of a [`Stagger`] shared with other streams and tasks |
//! | [`throttle_by_key(&keyed, key, cost, capacity)`](PaceExt::throttle_by_key) | a limit per key, from a [`KeyedLimiter`](limiter::KeyedLimiter); no key waits for another |
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
//! come, first served, and a waiter that gives up takes nothing. Every limiter has the same
//! verbs (`acquire`, `try_acquire`, `acquire_timeout`, `stats`, ...): the [`guide`] opens with
//! the table of every limiter by every verb.
//!
//! | limiter | what it limits |
//! |---|---|
//! | [`RateLimiter`] | many tasks, with one token bucket, or with several limits at once |
//! | [`Stagger`] | many tasks, to at most `k` starts in any window |
//! | [`KeyedRateLimiter`] | each key (a destination, a tenant) on its own; idle keys are forgotten |
//! | [`Adaptive`] | a [`RateLimiter`] whose rate follows what the destination says: `429`s, `Retry-After`, an announced quota |
//! | [`RedisRateLimiter`] (feature `redis`) | many processes and machines, with one quota kept in Redis |
//! | [`RedisKeyedRateLimiter`] (feature `redis`) | each key, for the whole fleet |
//!
//! **One limit or several.** Every limiter counts one thing by default: a cost is a `u64`.
//! Give it several limits (requests and tokens, per minute and per day) and a cost is one
//! amount per dimension, `[u64; N]`. The type keeps its name and its methods; only the builder
//! and the cost change. A grant of several limits returns a [`Permit`](limiter::Permit), and
//! `settle` corrects its charge once the answer gives the real cost.
//!
//! ```
//! use paced::{Limit, Rate, RateLimiter};
//!
//! let calls = RateLimiter::new(Rate::per_minute(500), 50); // a RateLimiter<u64>
//! calls.try_acquire(1).unwrap();
//!
//! let llm: RateLimiter<[u64; 2]> = RateLimiter::builder(["requests", "tokens"])
//!     .limit("requests", Limit::bucket(Rate::per_minute(500), 50))
//!     .limit("tokens", Limit::bucket(Rate::per_minute(200_000), 20_000))
//!     .build()
//!     .unwrap();
//! let permit = llm.try_acquire([1, 1_000]).unwrap(); // at most 1,000 tokens
//! permit.settle([1, 420]); // the answer used 420: 580 come back
//! ```
//!
//! A cost of the wrong shape does not compile:
//!
//! ```compile_fail,E0308
//! # use paced::{Limit, Rate, RateLimiter};
//! let llm: RateLimiter<[u64; 2]> = RateLimiter::builder(["requests", "tokens"]).build().unwrap();
//! llm.try_acquire(1); // a u64 where [u64; 2] is expected
//! ```
//!
//! The tower layers (feature `tower`) put any of them in front of a `Service`: see [tower].
//!
//! # Everything else
//!
//! At the root:
//!
//! - [`Rate`]: a refill rate, `tokens` every `per`, kept as an exact fraction.
//! - [`Limit`]: one limit of a limiter of several: a token bucket or a fixed window.
//! - [`Shaping`] and [`Enforcing`]: the two modes of `throttle` and `throttle_with`: wait, or
//!   refuse at once.
//! - [`NotUntil`]: the one refusal of every limiter, stream, Sink and layer. It says when to
//!   retry.
//! - [`ConfigError`]: a value that describes no usable limit, such as a burst of 0.
//!
//! In modules:
//!
//! - [`limiter`]: what the limiters hand out and take: permits, builders, counters, the
//!   [`Limiter`](limiter::Limiter) and [`KeyedLimiter`](limiter::KeyedLimiter) traits that
//!   streams and layers accept, and the sealed [`Cost`](limiter::Cost).
//! - [`stream`] and [`sink`]: the types the operators return, and
//!   [`RateExceeded`](stream::RateExceeded), an item an [`Enforcing`] stream handed back.
//! - [redis] (feature `redis`): the Redis builder, errors, counters and failure policy.
//! - [tower] (feature `tower`): the layers, and with `http` the quota headers.
//! - [`guide`]: each entry point at length, with its promises and its limits.
//!
//! # Cargo features
//!
//! None is on by default. The default build depends on tokio, futures-core, futures-sink,
//! pin-project-lite and hashbrown only.
//!
//! - `tracing`: a debug event when a shared limiter delays or refuses a request.
//! - `redis`: the two Redis limiters above, on one Redis server or a Redis Cluster, and the
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
           [redis]: crate::redis"
)]
#![cfg_attr(
    not(feature = "redis"),
    doc = "[`RedisRateLimiter`]: https://docs.rs/paced/latest/paced/struct.RedisRateLimiter.html\n\n\
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
pub mod limiter;
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

pub use error::{ConfigError, NotUntil};
pub use limiter::adaptive::Adaptive;
pub use limiter::keyed::KeyedRateLimiter;
pub use limiter::multi::Limit;
pub use limiter::rate_limiter::RateLimiter;
pub use limiter::stagger::Stagger;
pub use mode::{Enforcing, Shaping};
pub use rate::Rate;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[doc(inline)]
pub use redis::{RedisKeyedRateLimiter, RedisRateLimiter};
#[doc(inline)]
pub use sink::PaceSinkExt;
#[doc(inline)]
pub use stream::PaceExt;

/// The README's code blocks, compiled as doctests so they cannot rot. They are whole programs,
/// as pasted (no hidden lines), and one needs the `redis` feature: they are tested by
/// `cargo test --all-features`. `.ci/readme-snippets` also builds and runs each with exactly
/// the README's dependencies.
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "redis"))]
pub struct ReadmeDoctests;
