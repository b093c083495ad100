//! The guide: each entry point at length, with its promises and its limits.
//!
//! The [crate root](crate) lists the entry points; this page explains them. Every example
//! below is a doctest that runs, most of them under paused time, so the times they assert are
//! the schedule paced keeps.
//!
//! - [Every handle, every operation](#every-handle-every-operation)
//! - [Testing your code with paused time](#testing-your-code-with-paused-time)
//! - [The operators in depth](#the-operators-in-depth)
//! - [Sharing a limiter](#sharing-a-limiter)
//! - [Per-key limits](#per-key-limits)
//! - [Several limits at once](#several-limits-at-once)
//! - [Across machines (Redis)](#across-machines-redis)
//! - [Pacing a Kafka consumer](#pacing-a-kafka-consumer)
//! - [Pacing a Sink](#pacing-a-sink)
//! - [tower and HTTP](#tower-and-http)
//! - [Finding the limit (Adaptive)](#finding-the-limit-adaptive)
//! - [Metrics](#metrics)
//! - [Limits, honestly](#limits-honestly)
//! - [The design](#the-design)
//! - [Migrating from the git versions](#migrating-from-the-git-versions)
//! - [Reading quota headers](#reading-quota-headers)
//!
//! # Every handle, every operation
//!
//! The same operation has the same name and shape on every handle. A handle holds one limit or
//! several. With one, `cost` is a `u64` in the limiter's tokens. With several
//! ([below](#several-limits-at-once)), `cost` is a `[u64; N]`, one amount per dimension. A
//! grant then returns a permit to `settle`, `available` answers one amount per dimension, and
//! `set_limit(index, limit)` changes one limit. The type's name and the verbs stay the same.
//!
//! Keys are passed by reference (`&Q` where `K: Borrow<Q>`, so `&str` for `String` keys).
//! Every refusal is a [`NotUntil`](crate::NotUntil). The Redis handles answer through the
//! network, so their verbs are `async` and return a `Result`. Its error says what failed:
//! `paced::redis::RedisLimiterError`, or `TryAcquireError` for `try_acquire` and
//! `acquire_timeout`, which tells a refusal (with its `NotUntil`) from a failure.
//!
//! | operation | `RateLimiter` | `Stagger` | `KeyedRateLimiter` | `Adaptive` | `RedisRateLimiter` | `RedisKeyedRateLimiter` |
//! |---|---|---|---|---|---|---|
//! | wait for a grant | `acquire(cost)` | `acquire()` (a start counts one) | `acquire(&key, cost)` | `acquire(cost)` | `acquire(cost)` | `acquire(&key, cost)` |
//! | grant now, or say when | `try_acquire(cost)` | `try_acquire()` | `try_acquire(&key, cost)` | `try_acquire(cost)` | `try_acquire(cost)` | `try_acquire(&key, cost)` |
//! | wait at most `timeout` | `acquire_timeout(cost, timeout)` | `acquire_timeout(timeout)` | `acquire_timeout(&key, cost, timeout)` | `acquire_timeout(cost, timeout)` | `acquire_timeout(cost, timeout)` | `acquire_timeout(&key, cost, timeout)` |
//! | tokens free now | `available() -> u64` | `available() -> u64` | `available(&key) -> u64` | `available() -> u64` | — (a round trip) | — (a round trip) |
//! | change the limit | `set_limit(rate, burst)`, `try_set_limit`; `set_rate`, `set_burst` | `set_limit(k, period)`, `try_set_limit` | `set_limit(&key, rate, burst)`, `try_set_limit`, `clear_limit(&key)` | follows its reports (`on_throttled`, `on_success`, `on_quota`) | `set_limit(rate, burst)`, `clear_limit()` | `set_limit(&key, rate, burst)`, `clear_limit(&key)` |
//! | counters | `stats() -> Stats` | `stats() -> Stats` | `stats() -> Stats` | `stats() -> AdaptiveStats` | `stats() -> RedisStats` | `stats() -> RedisStats` |
//! | metrics | `with_metrics(name)` | `with_metrics(name)` | `with_metrics(name)` | `with_metrics(name)` | builder's `with_metrics(name)` | builder's `with_metrics(name)` |
//!
//! - **Changing a limit keeps the level.** The tokens in the bucket stay (capped at a lower
//!   burst), so a change never hands out a fresh burst. A `try_` form returns the
//!   [`ConfigError`](crate::ConfigError) that the plain form panics with. On Redis an invalid
//!   limit is the error's `Config` case.
//! - **Streams, sinks and tower layers** draw on every `RateLimiter`, `Stagger`,
//!   `KeyedRateLimiter` and Redis handle, with one limit or several. Use `throttle_with` and
//!   `RateLimitLayer::new` on a handle without keys, `throttle_by_key` and
//!   `RateLimitLayer::keyed` on a keyed one. Over several limits, the layer's `settle` corrects
//!   each request's charge from its answer.
//! - **Naming metrics twice.** The last name wins for every clone ([Metrics](#metrics)).
//! - **Panics** are for programmer errors only. Each is named in the method's `# Panics`, and
//!   its message starts with the method's path (`RateLimiter::new: ...`).
//! - **Counters.** `granted` and `rejected` count the limiter's own grants and refusals.
//!   `Adaptive`'s `successes` and `throttled` count the answers you reported. A server's
//!   refusal is *throttled*; the limiter's own is *rejected*.
//!
//! # Testing your code with paused time
//!
//! All timing uses [`tokio::time::Instant`] and [`tokio::time::Sleep`]. Under paused time a
//! test runs instantly and sees the exact schedule. Write your test as
//! `#[tokio::test(start_paused = true)] async fn ...`. The examples here use the same runtime
//! through `#[tokio::main(flavor = "current_thread", start_paused = true)]`:
//!
//! ```
//! use std::time::Duration;
//! use futures_util::StreamExt;
//! use paced::PaceExt;
//! use tokio::time::Instant;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // In your test: five consumers, started at most 2 per second.
//! let start = Instant::now();
//! let times: Vec<u64> = futures_util::stream::iter(0..5)
//!     .staggered_start(2, Duration::from_secs(1))
//!     .map(|_| start.elapsed().as_secs())
//!     .collect()
//!     .await;
//! assert_eq!(times, [0, 0, 1, 1, 2]);
//! # }
//! ```
//!
//! - Only a `current_thread` runtime can be paused (`#[tokio::test]` builds one by default).
//! - An adapter that waits arms exactly one timer; an idle adapter arms none. So auto-advance
//!   jumps straight to the next deadline. A stream that waits "forever" (a cost of
//!   `u64::MAX`, `min_interval(Duration::MAX)`) never hangs a test wrapped in
//!   [`tokio::time::timeout`].
//! - Whole-millisecond schedules come out exact. tokio's timer rounds a deadline up to its
//!   1 ms tick, so a fractional deadline (333.33 ms) shows up at the next millisecond
//!   (334 ms). `tokio::time::advance` moves the clock exactly, off the tick grid:
//!
//! ```
//! use std::time::Duration;
//! use paced::{Rate, RateLimiter};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let limiter = RateLimiter::new(Rate::per_second(3), 1);
//! limiter.try_acquire(1).unwrap();
//! // The next token is due at 333,333,333⅓ ns: not yet at 333 ms, there at 334 ms.
//! tokio::time::advance(Duration::from_millis(333)).await;
//! assert!(limiter.try_acquire(1).is_err());
//! tokio::time::advance(Duration::from_millis(1)).await;
//! assert!(limiter.try_acquire(1).is_ok());
//! # }
//! ```
//!
//! The shared limiters, the keyed limiter, the Sink adapters, the tower layer and [`Adaptive`]
//! read the same clock, so you can test all of them this way. [`RedisRateLimiter`] decides on
//! Redis's clock, which paused time does not move.
//!
//! # The operators in depth
//!
//! [`PaceExt`] adds the operators to every [`Stream`](futures_core::Stream). Each adapter holds
//! at most one upstream item (`batched_interval`: one batch). It pulls the next item only after
//! it emitted the last, and arms its timer only while an item waits. Building one needs no
//! runtime; polling it needs tokio's timer.
//!
//! Timelines (items ready at 0 ms unless shown):
//!
//! ```text
//! throttle(10/s, cost 1, burst 5, Shaping), 12 items
//!   0ms: ● ● ● ● ●   100: ●   200: ●   300: ●   400: ●   500: ●   600: ●   700: ●
//!
//! throttle(10/s, burst 5), costs 5, 10, 1: a cost above the burst pays its debt first
//!   0ms: ●(5)  ............ 1000: ●(10)  1100: ●(1)
//!
//! min_interval(100 ms), arrivals 0, 10, 20, 500, 510 ms
//!   arrive: 0 10 20 .................... 500 510
//!   leave:  0 ---- 100 ---- 200 ......... 500 ---- 600
//!
//! batched_interval(3, 100 ms), 10 items
//!   0ms: [0 1 2]   100: [3 4 5]   200: [6 7 8]   300: [9]
//!
//! staggered_start(2, 1 s), 5 items
//!   0s: ● ●   1s: ● ●   2s: ●
//! ```
//!
//! **`throttle(rate, cost, burst, mode)`** is a token bucket. It holds at most `burst` tokens,
//! starts full and refills at `rate`. An item costs `cost(&item)` tokens. The cost emitted in
//! any window `[t, t + w]` is at most `burst + w × rate`, so at most `burst` leaves at one
//! instant. Tokens are charged when an item is *emitted*, not when it is pulled from upstream.
//!
//! A [`Rate`] is an exact fraction: 3 per second is one token every 333,333,333⅓ ns, with no
//! drift. It is reduced to lowest terms and ordered by how fast it flows. Its constructors are
//! `const fn`s, so a rate in your code can be a `const`.
//!
//! - [`Shaping`] delays an item until its tokens are there. An item that costs more than the
//!   whole bucket waits until the bucket is full and the rest of its cost has flowed in. It
//!   then leaves the bucket empty (Akka Streams' rule), so it is never stuck.
//! - [`Enforcing`] never delays. The stream yields `Result<T, RateExceeded<T>>`. An item that
//!   does not conform comes back at once in a [`RateExceeded`], with the item
//!   ([`into_inner`](crate::stream::RateExceeded::into_inner)) and its [`NotUntil`]
//!   ([`not_until`](crate::stream::RateExceeded::not_until)). A refused item takes no tokens.
//!   An item dearer than `burst` never conforms: [`NotUntil::is_never`] is true.
//!
//! ```
//! use std::time::Duration;
//! use futures_util::StreamExt;
//! use paced::{Enforcing, PaceExt, Rate};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // 2 per second, 1 at once; item 100 costs more than the bucket holds.
//! let out: Vec<_> = futures_util::stream::iter([1, 2, 100])
//!     .throttle(Rate::per_second(2), |&n| if n == 100 { 5 } else { 1 }, 1, Enforcing)
//!     .collect()
//!     .await;
//! assert_eq!(out[0].as_ref().ok(), Some(&1));
//! let refused = out[1].as_ref().unwrap_err();
//! assert_eq!((refused.get_ref(), refused.retry_after()), (&2, Duration::from_millis(500)));
//! assert_eq!(refused.to_string(), "rate limited: retry after 500ms");
//! assert!(out[2].as_ref().unwrap_err().not_until().is_never());
//! # }
//! ```
//!
//! **`min_interval(d)`** keeps consecutive items at least `d` apart. The gap counts from the
//! previous item's emission as read from the clock, not from a timer tick, so a late timer can
//! only make gaps longer.
//!
//! **`batched_interval(n, d)`** emits batches of `1..=n` items at least `d` apart. A batch
//! leaves at the first allowed moment with everything that has arrived, and is never empty.
//! One wake-up releases a whole batch: use it to go beyond the 1,000 wake-ups per second of
//! tokio's timer.
//!
//! **`staggered_start(k, period)`** lets at most `k` items through in any window of `period`.
//! Item `i` leaves no earlier than item `i - k` plus `period`.
//!
//! Operators compose, and every adapter gives its stream back with `get_ref`, `get_mut`,
//! `get_pin_mut` and `into_inner`:
//!
//! ```
//! use std::time::Duration;
//! use futures_util::StreamExt;
//! use paced::{PaceExt, Rate, Shaping};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let start = tokio::time::Instant::now();
//! let batches: Vec<_> = futures_util::stream::iter(0..8)
//!     .throttle(Rate::per_second(20), |_| 1, 4, Shaping) // 4 at once, then one per 50 ms
//!     .batched_interval(3, Duration::from_millis(100)) // at most one batch per 100 ms
//!     .map(|batch| (batch, start.elapsed().as_millis()))
//!     .collect()
//!     .await;
//! assert_eq!(batches, [(vec![0, 1, 2], 0), (vec![3, 4, 5], 100), (vec![6, 7], 200)]);
//! # }
//! ```
//!
//! **Name clash.** `tokio_stream::StreamExt` has a `throttle` method too. With both traits in
//! scope, name the trait:
//!
//! ```
//! use paced::{PaceExt, Rate, Shaping};
//! use tokio_stream::StreamExt;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let stream = tokio_stream::iter(0..3);
//! let paced = PaceExt::throttle(stream, Rate::per_second(10), |_| 1, 5, Shaping);
//! assert_eq!(paced.collect::<Vec<_>>().await, [0, 1, 2]);
//! # }
//! ```
//!
//! **On time, by default.** tokio's `Sleep` wakes up to two ticks after its deadline. A bucket
//! with spare tokens for 3 ms absorbs that, and its waits sleep on the tick. Some waits would
//! lose rate to a late wake-up: burst 1, `min_interval`, the head of a shared limiter at burst
//! 1. On Linux these end on time, thanks to a timer thread ([The design](#the-design) says
//! how). So `throttle(Rate::per_second(500), |_| 1, 1, Shaping)` delivers about 500 a second:
//! 0.99 to 1.00 of it on the quiet test VM, against 0.65 on the tick (governor's timer
//! thread keeps 0.94). With four busy loops on the VM's two cores it keeps 0.91 to 0.94. It
//! costs about 1.1 times governor's CPU per item (figures in BENCHMARKS.md). An item never
//! leaves early. Under paused time nothing changes: every wait is a `Sleep` and the schedule is
//! exact. On other systems, or if the thread cannot be started, waits sleep on the tick, as
//! tokio-stream's do.
//!
//! **`precise()`.** `throttle(..)` with [`Shaping`] and `min_interval(d)` accept
//! [`.precise()`](crate::stream::Throttle::precise). Every wait then ends on time, whatever
//! the bucket absorbs. On Linux the timer thread wakes such a wait earlier (a longer lead), so
//! 10,000 items a second keep 0.99 of the rate for about a busy core (0.97 to 0.98 without it;
//! BENCHMARKS.md). Without a high-resolution timer, the task spends the last two ticks
//! yielding and reading the clock, so the item still leaves within microseconds of its time.
//! Meanwhile the task stays busy: at sub-millisecond rates that is most of a core. Under
//! paused time the schedule is exactly that of the plain operator.
//!
//! The adapter types are in [`paced::stream`](crate::stream), with the [`ThrottleMode`] trait
//! that [`Shaping`] and [`Enforcing`] implement.
//!
//! [`ThrottleMode`]: crate::stream::ThrottleMode
//!
//! # Sharing a limiter
//!
//! A real quota is rarely per stream. [`RateLimiter`] (a token bucket) and [`Stagger`] (a
//! sliding window) are shared by handle. Clone them into any number of tasks and streams, and
//! all draw on one limiter. Tasks call [`acquire`](crate::RateLimiter::acquire),
//! [`try_acquire`](crate::RateLimiter::try_acquire) or
//! [`acquire_timeout`](crate::RateLimiter::acquire_timeout). Streams use
//! [`throttle_with`](crate::PaceExt::throttle_with) and
//! [`staggered_start_with`](crate::PaceExt::staggered_start_with). The verbs are those of the
//! [table above](#every-handle-every-operation).
//!
//! Like a tokio `Semaphore`, a grant that needs no wait spends a unit of the task's
//! cooperative budget (`tokio::task::coop`). So a task looping on a limiter that never binds
//! still lets the other tasks of its thread run. `try_acquire` is synchronous and spends none.
//!
//! ```
//! use std::time::Duration;
//! use futures_util::StreamExt;
//! use paced::{PaceExt, Rate, RateLimiter, Shaping, Stagger};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // Kafka start-up: at most 500 consumers connect in any second.
//! let stagger = Stagger::new(500, Duration::from_secs(1));
//! let consumers: Vec<_> = (0..2000)
//!     .map(|_| {
//!         let stagger = stagger.clone();
//!         tokio::spawn(async move { stagger.acquire().await })
//!     })
//!     .collect();
//! let start = tokio::time::Instant::now();
//! for consumer in consumers {
//!     consumer.await.unwrap();
//! }
//! assert_eq!(start.elapsed(), Duration::from_secs(3));
//!
//! // One SMS provider account, 100 messages per second, shared by every partition.
//! let provider = RateLimiter::new(Rate::per_second(100), 5);
//! let partitions = (0..4).map(|p| {
//!     let messages = futures_util::stream::iter(0..50).map(move |m| (p, m));
//!     Box::pin(messages.throttle_with(&provider, |_| 1, Shaping))
//! });
//! let start = tokio::time::Instant::now();
//! assert_eq!(futures_util::stream::select_all(partitions).count().await, 200);
//! assert_eq!(start.elapsed().as_millis(), 1950); // 5 at once, then 195 at 100/s
//! # }
//! ```
//!
//! What the shared limiters promise:
//!
//! - **The bound across all users.** The tokens granted in any window `[t, t + w]` are at most
//!   `burst + w × rate`, whoever asked. A [`Stagger`] grants at most `k` in any window of
//!   `period`.
//! - **Fair.** Waiters are served in arrival order. Small requests do not overtake a large one,
//!   and `try_acquire` / `acquire_timeout` never jump the queue.
//! - **Cancellation gives back.** A request is charged when it is granted, never before. A
//!   dropped future or stream has taken nothing, and the next waiter moves up at once.
//! - **No thundering herd.** Only the head of the queue sleeps on a timer. A grant wakes
//!   exactly the next waiter.
//! - **Changeable at run time.** [`set_rate`](crate::RateLimiter::set_rate),
//!   [`set_burst`](crate::RateLimiter::set_burst) and [`Stagger::set_limit`] take effect at
//!   once, also for waiters. The level (stored tokens, or what a waiter lacks) is kept, and the
//!   new rate applies from that instant. Every constructor, and every setter that can be given
//!   an impossible value, has a `try_` form that returns a [`ConfigError`]
//!   ([`try_set_burst`](crate::RateLimiter::try_set_burst), [`Stagger::try_set_limit`]).
//! - **Guava's warm-up.**
//!   [`RateLimiter::warming_up(rate, warmup, cold_factor)`](crate::RateLimiter::warming_up)
//!   follows Guava's `SmoothWarmingUp`. After an idle spell, permits start `cold_factor` times
//!   slower and speed up to `rate` as stored permits are spent. With 2/s, 4 s and factor 3 the
//!   waits are 0, 1.375, 1.125, 0.875, 0.625, 0.5 s... As in Guava, a request waits for the
//!   previous one's price. A warming-up limiter has no burst:
//!   [`burst`](crate::RateLimiter::burst) is `None`, `set_burst` panics and `try_set_burst`
//!   returns [`ConfigError::NoBurst`].
//! - **A pause for everyone.** [`pause_for(d)`](crate::RateLimiter::pause_for) grants nothing
//!   to anyone before `d` from now (use it for a server's `Retry-After`). Waiters keep their
//!   order.
//! - **Observable.** [`stats()`](crate::RateLimiter::stats) gives granted, rejected, waiting
//!   now and total time waited. The `tracing` feature adds debug-level events when a request is
//!   delayed or refused. `Debug` shows only a limiter's identity (clones show the same). Read
//!   its state with [`rate`](crate::RateLimiter::rate), [`burst`](crate::RateLimiter::burst)
//!   and [`available`](crate::RateLimiter::available).
//!
//! ```
//! use std::time::Duration;
//! use paced::{ConfigError, Rate, RateLimiter};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let limiter = RateLimiter::new(Rate::per_second(1), 1);
//! limiter.acquire(1).await;
//! // One waiter lacks a whole token; 100 ms later the rate goes to 100/s.
//! let waiter = tokio::spawn({
//!     let limiter = limiter.clone();
//!     async move { limiter.acquire(1).await }
//! });
//! let start = tokio::time::Instant::now();
//! tokio::time::sleep(Duration::from_millis(100)).await;
//! limiter.set_rate(Rate::per_second(100));
//! waiter.await.unwrap();
//! // It lacked 0.9 tokens at the change: 9 ms at the new rate.
//! assert_eq!(start.elapsed().as_millis(), 109);
//! assert_eq!(limiter.try_set_burst(0), Err(ConfigError::ZeroBurst));
//! assert_eq!(limiter.burst(), Some(1));
//! # }
//! ```
//!
//! As with the stream operators, a cost above `burst` is allowed and pays its debt before it
//! passes. A cost of 0 passes at once. `try_acquire` of a cost above `burst` is refused with a
//! [`NotUntil`] that [`is_never`](crate::NotUntil::is_never).
//!
//! `throttle_with` takes any [`Limiter`]: a [`RateLimiter`], a [`Stagger`] (one per item,
//! whatever the cost) or a [`RedisRateLimiter`]. The trait is sealed, because the adapters rely
//! on the exact semantics of these quotas.
//!
//! # Several limits at once
//!
//! An LLM account allows R requests per minute AND T tokens per minute (on low tiers, per day
//! too). The provider refuses a call when *any* limit lacks room. The token cost is an
//! estimate when you send the call, and exact only in the answer's usage. A [`RateLimiter`] of
//! several limits, a `RateLimiter<[u64; N]>`, paces against all of them at once.
//!
//! **The model.**
//!
//! - **Dimensions** are named once, in the builder: `["requests", "tokens"]`. A **cost** is one
//!   amount per dimension, in that order: a `[u64; N]` such as `[1, estimate]`. The shape is
//!   the type (`RateLimiter<[u64; 2]>`). The names are checked when the limiter is built: a
//!   limit on an unknown name is a [`ConfigError`].
//! - **Limits.** Each dimension has any number of limits (per minute AND per day), or none.
//!   `.limit(name, limit)` adds one. Its index, for `set_limit`, is the number added before it.
//! - **One grant at one instant.** A request is granted when every limit has room for it, and
//!   every limit is charged at that instant. The head of the queue is granted at the latest of
//!   the limits' own ready times, never later (plus tokio's 1 ms tick in real time). A dropped
//!   waiter has taken nothing.
//! - **FIFO.** One queue serves all the limits: cheap prompts do not overtake a dear one.
//!   `try_acquire` / `acquire_timeout` never jump the queue.
//! - **Settling.** [`acquire`](crate::RateLimiter#method.acquire-1) returns a [`Permit`].
//!   [`settle`](crate::limiter::Permit::settle)`([1, usage])` corrects the charge once the
//!   answer says what the call used. A call the provider refused cost nothing there:
//!   `settle([0, 0])` gives the whole charge back. Dropping a permit keeps its charge.
//!
//! ```
//! use std::time::Duration;
//! use paced::{Limit, RateLimiter, Rate};
//! use tokio::time::Instant;
//!
//! /// Your API call. Here it answers at once; the model wrote 200 tokens, and the usage
//! /// counts the prompt's tokens too (one per word in this sketch).
//! async fn complete(prompt: &str, max_tokens: u64) -> u64 {
//!     prompt.split_whitespace().count() as u64 + max_tokens.min(200)
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let llm: RateLimiter<[u64; 2]> = RateLimiter::builder(["requests", "tokens"])
//!     .limit("requests", Limit::bucket(Rate::per_minute(60), 10))
//!     .limit("tokens", Limit::bucket(Rate::per_minute(6_000), 6_000))
//!     .limit("requests", Limit::window(10_000, Duration::from_secs(86_400))) // from 00:00 UTC
//!     .build()
//!     .unwrap();
//! let prompt = "word ".repeat(100);
//! let start = Instant::now();
//! for _ in 0..30 {
//!     let estimate = 100 + 500; // the prompt's tokens + max_tokens: never too low
//!     let permit = llm.acquire([1, estimate]).await;
//!     let usage = complete(&prompt, 500).await;
//!     permit.settle([1, usage]); // 300 of the 600 come back at once
//! }
//! // 10 calls at once, one a second while the tokens last, then one per 3 s of tokens
//! // (300 tokens at 100/s). Charged the estimates without settling: 120 s.
//! assert_eq!(start.elapsed(), Duration::from_secs(33));
//! # }
//! ```
//!
//! Overlapping the calls (`buffer_unordered(n)` over a stream of prompts, or tasks) changes
//! nothing: every clone of the limiter draws on the same limits in the same queue.
//! `cargo run -p paced-integration --example llm_pipeline` runs such a stage against a local
//! OpenAI-style server. The server enforces four limits exactly (requests and tokens, per
//! minute and per day) and refuses with 429. It refuses none.
//!
//! **Two kinds of limit**, for the two ways providers count:
//!
//! - [`Limit::bucket`](crate::Limit::bucket)`(rate, burst)` is a token bucket: at most `burst`
//!   at once, refilled continuously at `rate`. OpenAI's and Anthropic's per-minute limits work
//!   this way (requests, tokens, Anthropic's input and output tokens): capacity flows back over
//!   time instead of resetting on the minute. For a limit of `l` per minute, use
//!   `Limit::bucket(Rate::per_minute(l), l)`.
//! - [`Limit::window`](crate::Limit::window)`(quota, window)` is a fixed window: at most
//!   `quota` per window. Windows are aligned to the Unix epoch by default, so a day runs from
//!   midnight UTC and an hour starts on the hour. [`aligned_to`](crate::Limit::aligned_to) a
//!   `SystemTime` moves the origin. [`aligned_to_instant`](crate::Limit::aligned_to_instant)
//!   takes a tokio `Instant`, exact under paused time, for tests. Daily caps that reset at
//!   midnight UTC work this way. So does GitHub's hourly window. Its `X-RateLimit-Reset` is
//!   the epoch second the window ends, so use
//!   `aligned_to(UNIX_EPOCH + Duration::from_secs(reset))`.
//!
//! A daily cap is not a bucket of a day. A bucket of burst `q` and rate `q` per day is full at
//! midnight, so `q` may go at 00:00. By 23:59 nearly `q` has flowed back in, and that may go
//! too. That is up to `2q` in one calendar day, which a provider counting per calendar day
//! refuses. A fixed window of `q` per day lets `q` through in each calendar day, and no more:
//!
//! ```
//! use std::time::Duration;
//! use paced::{Limit, RateLimiter, Rate};
//! use tokio::time::Instant;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let day = Duration::from_secs(86_400);
//! let midnight = Instant::now();
//! let limiter = |limit| RateLimiter::builder(["requests"]).limit("requests", limit).build();
//! let bucket = limiter(Limit::bucket(Rate::new(100, day), 100)).unwrap();
//! let window = limiter(Limit::window(100, day).aligned_to_instant(midnight)).unwrap();
//! for limiter in [&bucket, &window] {
//!     limiter.try_acquire([100]).unwrap(); // 00:00
//! }
//! tokio::time::advance(day - Duration::from_secs(60)).await; // 23:59
//! assert_eq!(bucket.available(), [99]); // 199 in one calendar day
//! assert_eq!(window.available(), [0]); // 100, until midnight
//! # }
//! ```
//!
//! **The bound.** [`RateLimiter`] states it and its tests check it. Without upward
//! corrections:
//!
//! - for a bucket limit, the cost charged in any span `[t, t + w]` is at most
//!   `burst + w × rate`;
//! - for a fixed-window limit, the cost charged in any `k` consecutive windows is at most
//!   `k × quota`. That is at most `quota` in each window when no single cost exceeds the quota.
//!
//! With corrections, each counted at its instant, the bound grows by the debt still unpaid at
//! the end of the span. An upward correction is a cost already spent at the provider. It
//! cannot be refused, only paid back by making later grants wait. Downward corrections never
//! let more through than the bound.
//!
//! **What a correction does**, per dimension:
//!
//! - A smaller amount gives the difference back at once and wakes the waiters it now admits.
//!   It never gives back beyond a limit's room: a bucket's level caps at its burst, and a fixed
//!   window gives back only within the window the grant was charged in, never below nothing
//!   used.
//! - A larger amount is charged as debt, so later grants wait. A bucket's level goes below
//!   zero; a fixed window's use goes above its quota, and the excess is carried into the next
//!   windows.
//!
//! So estimate from above (the prompt's tokens plus `max_tokens`). Every correction is then
//! downward, and the plain bound holds.
//!
//! **Reading the limits from the headers.** With the `http` feature,
//! `paced::tower::limits_from_headers` reads every limit a response announces. Each comes with
//! its name, what it counts and where it stands. It counts `Dimension::Requests`, `Tokens`,
//! `InputTokens`, `OutputTokens`, or `Units` (a cost the destination does not name). Where it
//! stands is `remaining`, `reset`, and `limit` and `window` when announced. Each maps onto a
//! [`Limit`]:
//!
//! | dialect | what it announces | the limits to build |
//! |---|---|---|
//! | IETF draft, several policies | `RateLimit-Policy: "minute";q=500;w=60, "day";q=10000;w=86400` and `RateLimit: "minute";r=250;t=30, ...` | one limit per policy, `q` per `w` seconds, on the dimension its quota unit names (`qu`, requests by default). The draft does not say if a policy refills or resets. If it refills: `Limit::bucket(Rate::new(q, w), q)`. If it resets: `Limit::window(q, w)` aligned to the reset (`now + t`). Unsure: both on the same dimension (what keeps both keeps either) |
//! | OpenAI | `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets as Go durations (`6m0s`) | `"requests"`: `Limit::bucket(Rate::per_minute(limit), limit)`; `"tokens"`: the same with the tokens' limit. The headers name one limit per dimension. Add your tier's daily limit from its limits page as `Limit::window(q, 86_400 s)` |
//! | Anthropic | `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`, resets in RFC 3339 | a bucket per minute for each. Input and output tokens are separate limits, so use three dimensions: `RateLimiter<[u64; 3]>` over `["requests", "input-tokens", "output-tokens"]`, a cost of `[1, prompt_tokens, max_tokens]` settled to `[1, input, output]` |
//! | GitHub | `X-RateLimit-Limit`, `-Remaining`, `-Reset` (epoch seconds), `-Used`, `-Resource` | per resource (`core`, `search`; `graphql` counts points, `Units`): `Limit::window(limit, 3_600 s).aligned_to(UNIX_EPOCH + reset)` |
//!
//! The announced `remaining` says where the provider stands. A new limiter starts full. So
//! start it after the first answer, or charge what the provider says is used with one
//! `acquire` before the stage starts. An [`Adaptive`] of one limit paces a single rate
//! instead, and takes only the limits that count requests (`binding_request_limit`). An
//! `Adaptive<[u64; N]>` takes them all, with `on_limits` (see
//! [Finding the limit](#finding-the-limit-adaptive)).
//!
//! **Two single limiters are not one.** Users often first await one [`RateLimiter`] per
//! dimension, one after the other. That is not safe where both limits bind, and it cannot
//! settle. `integration/tests/llm_provider.rs` measures both orders against a simulated
//! provider and an exact oracle. The provider has requests and tokens per minute, and refuses
//! a call when either lacks room. The test sends 5,000 prompts from 64 workers under paused
//! time (`cargo test -p paced-integration --test llm_provider -- --nocapture table`):
//!
//! | scenario (provider's limits) | requests then tokens | tokens then requests | `RateLimiter<[u64; 2]>` |
//! |---|---|---|---|
//! | requests bind (30/min burst 10; 400,000 tokens/min) | 0 refused, 1.000 | 0, 1.000 | 0, 1.000 |
//! | tokens bind (500/min burst 50; 40,000 tokens/min), usage = estimate | 0, 1.000 | 0, 1.000 | 0, 1.000 |
//! | tokens bind, settles to 30–100 % of the estimate | 0, **1.542** | 0, **1.542** | 0, 1.000 |
//! | both bind (30/min burst 10; 40,000 tokens/min), usage = estimate | **242**, 1.007 | **1**, 1.001 | 0, 1.000 |
//! | both bind, settles to 30–100 % | **242**, **1.168** | 0, **1.160** | 0, 1.000 |
//!
//! (Refusals, then the makespan over the oracle's. 1.542 is 11,565.5 s where 7,501.2 s were
//! enough.)
//!
//! - **Requests then tokens is unsafe.** A call takes its request, then holds it while it
//!   waits for its tokens. Meanwhile the request limiter keeps granting to calls that queue
//!   behind it. When the tokens come, cheap prompts that took their requests long ago leave in
//!   a bunch. That is faster than the provider's request bucket refills, so it refuses them:
//!   242 of 5,000.
//! - **Tokens then requests can still lose refill.** A call holds its tokens while it waits
//!   for its request. The provider charges them only when the call arrives, so its token
//!   bucket, full until then, lost that refill. A later call then finds fewer tokens at the
//!   provider than the client counted. This is rare (1 of 5,000), but possible.
//! - **Neither can give back unused tokens.** A one-limit `RateLimiter` keeps the estimate.
//!   Where the provider settles to the usage, the composed clients pace to estimates and take
//!   1.16–1.54 times as long as needed.
//!
//! One `RateLimiter<[u64; 2]>` grants both amounts at one instant, so nothing is held while
//! waiting for the other. It settles to the usage. In every scenario: no refusal, and the
//! oracle's makespan.
//!
//! **In real time**, the provider counts a call a little after the limiter granted it, not
//! always in the same order. A call delayed longer than the next one makes the provider's
//! bucket lose refill the limiter counted on. Leave a margin of the jitter you expect times
//! the rate. The example's server counts to the token exactly, and tokens always bind there.
//! With buckets as large as the server's, it refused 46 to 88 calls in runs of 360 (a
//! millisecond of jitter is 40 tokens at its rate). With buckets 1 % smaller (10 ms of
//! refill), it refused none. The example keeps 5 %.
//!
//! **Per key** (each tenant's or API key's own requests and tokens per minute), use a
//! [`KeyedRateLimiter`]. Each key gets its own copy of the limits and its own FIFO queue. The
//! verbs take the key first. `acquire(&key, [1, estimate])` returns a permit that settles that
//! key only. `set_limit(&key, index, limit)` gives one key a bigger plan. A key is forgotten
//! once all its limits are as good as new (a bucket full, a window with nothing used), so
//! memory follows the keys in use. `throttle_by_key` and `RateLimitLayer::keyed` take it like
//! a keyed limiter of one limit. The keyed client layer settles each request on its key:
//! `RateLimitLayer::keyed(&tenants, |req| tenant(req)).cost(|req| [1, estimate(req)])
//! .settle(|response| [1, usage(response)])`.
//!
//! ```
//! use std::time::Duration;
//! use paced::{KeyedRateLimiter, Limit, Rate};
//! use tokio::time::Instant;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let tenants: KeyedRateLimiter<String, [u64; 2]> =
//!     KeyedRateLimiter::builder(["requests", "tokens"])
//!         .limit("requests", Limit::bucket(Rate::per_minute(60), 10))
//!         .limit("tokens", Limit::bucket(Rate::per_minute(6_000), 1_000))
//!         .build()
//!         .unwrap();
//! let start = Instant::now();
//! let permit = tenants.acquire("acme", [1, 1_000]).await;
//! permit.settle([1, 250]); // 750 tokens back to acme
//! tenants.acquire("acme", [1, 850]).await; // 100 short: 1 s
//! tenants.acquire("globex", [1, 1_000]).await; // its own limits: at once
//! assert_eq!(start.elapsed(), Duration::from_secs(1));
//! # }
//! ```
//!
//! # Per-key limits
//!
//! Real quotas are per destination. An SMS router sends each message through one of several
//! providers, each with its own messages-per-second limit. A Kafka consumer fans events out to
//! many tenants' APIs, each with its own quota. [`KeyedRateLimiter`] keeps one token bucket
//! and one FIFO queue per key, shared by handle like [`RateLimiter`].
//! [`throttle_by_key`](crate::PaceExt::throttle_by_key) paces one stream by it, and a slow key
//! does not hold up the others:
//!
//! ```
//! use futures_util::StreamExt;
//! use paced::{KeyedRateLimiter, PaceExt, Rate};
//!
//! struct Sms {
//!     provider: &'static str,
//!     text: &'static str,
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // Every provider: 2 messages per second, one at a time; "bulk" allows 50 per second, 5 at once.
//! let providers = KeyedRateLimiter::new(Rate::per_second(2), 1);
//! providers.set_limit(&"bulk", Rate::per_second(50), 5);
//! let messages = ["a", "a", "a", "bulk", "bulk"].map(|provider| Sms { provider, text: "hi" });
//! let start = tokio::time::Instant::now();
//! // Up to 64 messages held while they wait for their provider.
//! let sent: Vec<_> = futures_util::stream::iter(messages)
//!     .throttle_by_key(&providers, |m| m.provider, |_| 1, 64)
//!     .map(|sms| {
//!         println!("{} via {}", sms.text, sms.provider);
//!         (sms.provider, start.elapsed().as_millis())
//!     })
//!     .collect()
//!     .await;
//! assert_eq!(sent, [("a", 0), ("bulk", 0), ("bulk", 0), ("a", 500), ("a", 1000)]);
//! # }
//! ```
//!
//! `cargo run --example sms_router` runs providers A (2/s), B (5/s) and C (50/s, burst 5),
//! 8, 10 and 30 messages interleaved on one stream. Messages sent per 100 ms:
//!
//! ```text
//!   A |1....1....1....1....1....1....1....1| 8 sent, last at 3500 ms
//!   B |1.1.1.1.1.1.1.1.1.1.................| 10 sent, last at 1800 ms
//!   C |955551..............................| 30 sent, last at 500 ms
//! ```
//!
//! - **Per key, what `RateLimiter` promises.** In any window `[t, t + w]` a key is granted at
//!   most `burst + w × rate` of its own limit. Its requests are served in arrival order. A cost
//!   above the burst pays its debt, a cost of 0 passes, and a dropped waiter has taken nothing.
//!   [`set_limit`](crate::KeyedRateLimiter::set_limit) and
//!   [`clear_limit`](crate::KeyedRateLimiter::clear_limit) change one key's limit at once,
//!   also for its waiters, and keep its level.
//! - **No head-of-line blocking.** `throttle_by_key(limiter, key, cost, capacity)` holds up to
//!   `capacity` items. An item whose key has tokens leaves at once while other keys' items
//!   wait. Each key's items leave in their upstream order. A held item leaves when its key
//!   allows (plus tokio's 1 ms tick), never later because of another key. With `capacity`
//!   items held, it pulls nothing more from upstream: that is the backpressure and the memory
//!   bound. Each key's oldest held item waits its turn behind the key's other users.
//!   `capacity == 0` panics.
//! - **Shared.** Several streams and tasks on one `KeyedRateLimiter` share each key's quota
//!   (one provider account used by every partition), FIFO per key.
//! - **Borrowed keys.** Methods take any borrowed form of the key: ask a
//!   `KeyedRateLimiter<String>` with a `&str`. Finding a key does not allocate. Keys are hashed
//!   with std's `RandomState` unless you give another `BuildHasher` to
//!   [`with_hasher`](crate::KeyedRateLimiter::with_hasher).
//! - **Memory follows the keys in use.** A key whose bucket is full and that nobody waits for
//!   is the same as a key never seen. So it is forgotten without any call from you, and never
//!   before. [`tracked_keys()`](crate::KeyedRateLimiter::tracked_keys) counts exactly the keys
//!   that are not full or have waiters. A million keys touched once hold no memory one refill
//!   period later: the first operation after that forgets them all. Under a steady load the
//!   table does not grow and shrink back and forth. (governor's keyed limiter keeps every key
//!   until you call `retain_recent()`.) Per-key limits are configuration and are kept.
//! - **Small.** An idle key under the default limit takes 16 bytes for `u64` keys, as much
//!   heap per key as governor's. [The design](#the-design) says how the table is laid out and
//!   locked.
//!
//! ```
//! use paced::{KeyedRateLimiter, Rate};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let tenants: KeyedRateLimiter<String> = KeyedRateLimiter::new(Rate::per_second(10), 2);
//! tenants.set_limit("enterprise", Rate::per_second(1000), 100);
//! assert!(tenants.try_acquire("free-tier", 2).is_ok()); // asked with a &str
//! assert!(tenants.try_acquire("free-tier", 1).is_err());
//! assert_eq!(tenants.available("enterprise"), 100);
//! assert_eq!(tenants.tracked_keys(), 1); // "enterprise" is full: no state, only its limit
//! tokio::time::sleep(std::time::Duration::from_secs(1)).await;
//! tenants.try_acquire("enterprise", 1).unwrap();
//! assert_eq!(tenants.tracked_keys(), 1); // "free-tier" is full again: forgotten
//! # }
//! ```
//!
//! # Across machines (Redis)
//!
//! A Kafka consumer group runs on many machines. The partner API it calls allows N requests
//! per second for the whole account. With the `redis` feature, [`RedisRateLimiter`] keeps one
//! token bucket in Redis under a key you name. Every process that names the key shares it. Its
//! builder, [`FailurePolicy`], errors and counters are in [`paced::redis`][redis].
//!
//! ```no_run
//! # #[cfg(feature = "redis")]
//! async fn call_partner() -> Result<(), Box<dyn std::error::Error>> {
//!     use std::time::Duration;
//!     use futures_util::StreamExt;
//!     use paced::redis::{FailurePolicy, TryAcquireError};
//!     use paced::{PaceExt, Rate, RedisRateLimiter, Shaping};
//!
//!     let quota = RedisRateLimiter::builder("redis://redis.internal/", "partner-api", Rate::per_second(200), 20)
//!         .lease(10, Duration::from_millis(5)) // optional: fewer round trips
//!         .failure_policy(FailurePolicy::FailOpen { share: 0.25 }) // 4 consumers: a quarter each
//!         .build()?;
//!     let calls = futures_util::stream::iter(0..100).throttle_with(&quota, |_| 1, Shaping);
//!     println!("{} calls made", calls.count().await);
//!     match quota.try_acquire(1).await {
//!         Ok(()) => println!("one more"),
//!         Err(TryAcquireError::NotUntil(refused)) => println!("retry in {:?}", refused.retry_after()),
//!         Err(failed) => eprintln!("Redis could not decide: {failed}"),
//!     }
//!     Ok(())
//! }
//! ```
//!
//! - **Same bucket, Redis's clock.** The bucket works as in [`RateLimiter`]: rate, burst, a
//!   cost per acquisition, and a cost above the burst pays its debt. Redis decides atomically,
//!   on its own clock, so the clients' clocks do not matter. The key expires once the bucket is
//!   full, so idle quotas vanish.
//! - **The bound, to within a round trip.** Four processes share one key at 200/s, burst 20,
//!   for 3 s. They keep `burst + w × rate` in every window of their merged timeline, counting
//!   one round trip of slack, and use the quota to within 2 % (`tests/redis.rs`).
//! - **Waiting is a reservation** (as Go's `rate.Limiter.Wait`). A request that cannot go at
//!   once is charged in Redis at once and told how long to wait. So each acquisition is one
//!   round trip, waiters are served in the order their requests reached Redis, and small
//!   requests do not starve a large one. A waiter dropped before its turn gives its tokens back.
//!   They return with the key's next round trip or, once nothing uses the key, in the
//!   background, whichever comes first.
//! - **Released at the instant Redis charged.** On every runtime flavor and worker count, a
//!   process releases its grants at the instants Redis charged them, in Redis's order. A grant
//!   is never early, and late by at most a round trip and tokio's tick.
//! - **Tokens given back while grants wait** (a `settle` below the charge, an unused lease, a
//!   waiter that went away) could break the bound, since a waiting grant cannot move. So a
//!   bucket of `RedisRateLimiter<[u64; N]>` takes them back at the latest waiting grant's
//!   instant. It takes only as many as fit beside the waiting grants: a burst minus the most a
//!   waiting grant found in it. The rest is lost, as a full bucket loses its refill. The
//!   one-limit `RedisRateLimiter` takes back nothing while grants wait (its stored form keeps
//!   no room). On both, the latest grant's own tokens come back whole: no grant was charged
//!   after it. The quota then moves back from that grant's instant, as far as every bucket's
//!   level allows and never into a full fixed window (with one limit, all the way). In process, tokens given back reach the
//!   waiters at once.
//! - **One limit for the fleet, changed at run time.** `set_limit(rate, burst)` stores a new
//!   limit in Redis, and every process's next request obeys it. The level is kept, in tokens.
//!   `clear_limit()` restores the limit the quota was built with.
//!   `acquire_timeout(cost, timeout)` refuses, uncharged, a request that would wait too long.
//! - **Leases** (`.lease(m, max_age)`) take up to `m` tokens per round trip and spend them
//!   locally. Unspent tokens go back after `max_age` or when the limiter is dropped. Leases cut
//!   round trips per 1,000 grants more than tenfold. The price: the bound holds to within
//!   `max_age` of refill, and a process waits for a whole lease rather than one token. (With a
//!   fixed window among several limits, a waiter takes only the room its instant has: the
//!   rest of a lease could come back only in the next window.)
//! - **Faults** follow the policy you choose:
//!   - `FailClosed { max_backoff, deadline }` grants nothing without Redis. It retries with
//!     capped exponential backoff. `acquire` returns `RedisLimiterError::Unavailable` after the
//!     deadline. A shaping stream holds its item and waits, so nothing is lost. The quota is
//!     never exceeded; the price is a stall.
//!   - `FailOpen { share }` keeps going. Each process falls back to a local limiter at `share`
//!     of the rate and burst, and tries Redis again every second. Nothing stalls; the price is
//!     that `n` processes can reach `n × share` of the quota during the outage. A request
//!     waiting on the fallback keeps its place there, asks Redis again every second, and
//!     leaves once Redis answers. A cost dearer than a second of the fallback's refill is
//!     granted as debt, as in process. A fallback stays in charge for a second after the last failed round
//!     trip, and the connection is retried at a backoff of up to 500 ms. So it can stay in
//!     charge up to about 1.75 s after Redis is back.
//!
//!   The connection reconnects by itself, nothing panics, and no stream item is lost or
//!   duplicated. The tests kill Redis mid-run and restart it a second later under both
//!   policies. A stress test (`tests/redis_fleet_stress.rs`: 4 processes of 8 workers and 64
//!   tasks each on a two-limit quota, settling up and down) checks every bound on the merged
//!   timeline across a `kill -9`.
//! - **A Redis that loses its data** (no persistence, or a failover that loses the last
//!   writes) forgets the reservations it had scheduled. New grants then come on top of them.
//!   Across such a loss the fleet may exceed the bound by what was reserved and not yet due,
//!   plus a burst (the lost bucket comes back full). Where that matters, run Redis with an
//!   append-only file (`appendonly yes`, `appendfsync always` or `everysec`). The stress test
//!   keeps its bound across a `kill -9` with `appendfsync always`.
//! - The feature needs Rust 1.88 (the `redis` crate's minimum); the default build needs 1.85.
//!
//! A [`RedisRateLimiter`] is one quota under the name you give; a [`RedisKeyedRateLimiter`]
//! is one such quota per key. Both share one builder, the same options and the same
//! behaviour; each key of a keyed limiter finds an outage, and falls back, on its own.
//!
//! **Several limits across the fleet.** `RedisRateLimiter::dimensions(url, name, names)`
//! builds a `RedisRateLimiter<[u64; N]>`. It has the limits of a `RateLimiter<[u64; N]>`
//! (buckets and fixed windows), kept in one Redis key and charged all or nothing. A grant
//! returns a `RedisPermit` to `settle` once the real cost is known.
//! `RedisKeyedRateLimiter::dimensions` does the same per key.
//!
//! ## Across a fleet, per key
//!
//! When the limit is per tenant, user or partner, [`RedisKeyedRateLimiter`] keeps one such
//! bucket per key in Redis. It has the same reservations, failure policy and reply errors, and
//! [`KeyedRateLimiter`]'s per-key semantics (borrowed keys: `&str` for `String` keys).
//!
//! - A key `k` under prefix `p` lives in the Redis key `{p:k}`, a Cluster hash tag (`%`, `{`,
//!   `}` and `:` are percent-encoded). It expires once its bucket is full again, so idle keys
//!   cost nothing.
//! - `set_limit(key, rate, burst)` stores a key's own limit in the same Redis key, which then
//!   has no expiry. Every process's next request for the key obeys it, and the key's level is
//!   kept in tokens.
//! - `try_acquire` never writes on a refusal. `acquire_timeout` refuses, uncharged, a request
//!   that would wait too long.
//! - Three processes on two keys keep each key's `burst + w × rate` to within a round trip
//!   (`tests/redis_keyed.rs`). So do four processes with a thousand tasks each over 1,000 keys
//!   with limits of various sizes (`tests/redis_keyed_fleet.rs`). There each key stays FIFO
//!   within each process, and a limit lowered by one process is obeyed by the others' next
//!   requests.
//!
//! ```no_run
//! # #[cfg(feature = "redis")]
//! async fn per_tenant() -> Result<(), Box<dyn std::error::Error>> {
//!     use paced::{Rate, RedisKeyedRateLimiter};
//!
//!     let tenants: RedisKeyedRateLimiter<String> =
//!         RedisKeyedRateLimiter::builder("redis://redis.internal/", "tenants", Rate::per_second(20), 5)
//!             .build()?;
//!     tenants.set_limit("big-customer", Rate::per_second(200), 50).await?;
//!     tenants.acquire("big-customer", 1).await?;
//!     if let Err(refused) = tenants.try_acquire("small-customer", 1).await {
//!         println!("429: {refused}");
//!     }
//!     Ok(())
//! }
//! ```
//!
//! Streams and tower use it as they use a [`KeyedRateLimiter`]: `throttle_by_key` and
//! `RateLimitLayer::keyed` take any [`KeyedLimiter`]. Each key's items still leave in upstream
//! order, and no key holds up another. A reply error on one key holds that key's items while
//! the other keys go on. They are retried at a backoff up to 1 s, and each failure is counted
//! in `stats().reply_errors` and logged at error level. An enforcing layer refuses with the
//! Redis `try_acquire`'s `NotUntil` (a `429` with `Retry-After`).
//!
//! ```no_run
//! # #[cfg(feature = "redis")]
//! async fn webhooks(tenants: paced::RedisKeyedRateLimiter<String>) {
//!     use futures_util::StreamExt;
//!     use paced::PaceExt;
//!
//!     let events = futures_util::stream::iter([("acme", "e1"), ("globex", "e2")]);
//!     let mut paced = std::pin::pin!(events.throttle_by_key(&tenants, |e| e.0.to_string(), |_| 1, 256));
//!     while let Some((tenant, event)) = paced.next().await {
//!         println!("deliver {event} to {tenant}");
//!     }
//! }
//! ```
//!
//! ### Capacity on paper
//!
//! Redis runs scripts on one core per master. At `c` of Redis CPU per round trip, a master
//! serves `1 s / c` round trips per second. That is 67 k at 15 µs (10–19 µs measured per round
//! trip on one server, BENCHMARKS.md), or 33 k at the 30 µs measured per master on a local
//! cluster. Planned at half load, `u = 0.5`, that is 33 k (17 k). A lease of `m` tokens that
//! the process spends within its age makes each round trip `m` grants (`m × 33 k` grants/s per
//! master). A key the process does not ask again within the age takes no lease, and costs a
//! round trip per grant. For `N` tenants at `r` requests per second, masters =
//! `N × r × c / (u × m)`:
//!
//! - 1 M tenants at 10/s, no lease: `10⁶ × 10/s × 15 µs / 0.5 = 300` masters (600 at 30 µs).
//! - Kafka records keyed by tenant (each tenant's records go to one consumer) and
//!   `lease(10, 1 s)`: `10⁷ × 15 µs / (0.5 × 10) = 30` masters (60). The price: a tenant's
//!   bound loosens by `rate × age`, 10 more deliveries in any window. A waiting `acquire` of a
//!   tenant in use waits for a whole lease.
//! - Records spread over 40 consumers without a key: each sees a tenant at 0.25/s, so no lease
//!   is reused within 1 s. Leave leases off: they would cost nothing more, but bring nothing.
//!
//! ## Redis Cluster
//!
//! `RedisRateLimiter::cluster_builder(nodes, name, rate, burst)` and
//! `RedisKeyedRateLimiter::cluster_builder(nodes, name, rate, burst)` (and `cluster_dimensions`
//! for several limits) return the same builders, with the same options, on the `redis` crate's
//! async cluster client. `nodes` are the URLs of some of the cluster's nodes; one that answers
//! is enough.
//!
//! - Each decision is still atomic on one master: a quota is one Redis key (a keyed quota's
//!   `{p:k}` holds the key's own limit too). The keys of a keyed limiter spread over all the
//!   masters.
//! - The client follows redirections. When a master fails and its replica takes over, the
//!   client finds the new master by itself. Until then, round trips on that master's slots
//!   fail within the `response_timeout` (a `MOVED` left over from the failover included), and
//!   the failure policy applies. Keys on the other masters go on.
//! - Replication is asynchronous, so a failover may lose the failed master's last charges.
//! - `tests/redis_cluster.rs` starts a private cluster of three masters and three replicas and
//!   `kill -9`s a master mid-run. Nothing is granted beyond the bound under `FailClosed` (no
//!   acquire lost), `FailOpen` stays within its per-outage allowance, and every limiter
//!   recovers (about 2.5 s with `cluster-node-timeout 1000`).
//!
//! ```no_run
//! # #[cfg(feature = "redis")]
//! async fn on_a_cluster() -> Result<(), Box<dyn std::error::Error>> {
//!     use paced::{Rate, RedisKeyedRateLimiter};
//!
//!     let nodes = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"];
//!     let tenants: RedisKeyedRateLimiter<String> =
//!         RedisKeyedRateLimiter::cluster_builder(&nodes, "tenants", Rate::per_second(20), 5).build()?;
//!     tenants.acquire("big-customer", 1).await?;
//!     Ok(())
//! }
//! ```
//!
//! ## Upgrading a fleet
//!
//! During a rolling deploy, old and new processes share the same Redis keys. Each key's state
//! carries a format version, so a mixed fleet fails loudly rather than wrongly.
//!
//! - **What this version writes.** Format version `1`, on every write: a grant, a reservation,
//!   tokens given back, `set_limit`, `clear_limit`. A refusal writes nothing, and a full bucket
//!   under the default limit is no key at all. [The design](#the-design) gives the byte layout.
//! - **What it reads.** Version 1 only. Any other key is answered with an error that names
//!   both versions: `ERR paced: the key K holds format version 2, which this paced does not
//!   read (it reads version 1): …`. That covers a later paced's format, a string that is not a
//!   paced quota, and a version-1 state of the wrong length or with impossible numbers. The key
//!   is left as it is: not read as version 1, not reset, not overwritten, nothing granted.
//! - **It is a reply error, not an outage.** `acquire` returns `RedisLimiterError::Reply` and
//!   `try_acquire` returns `TryAcquireError::Reply`. `FailOpen` does not fall back. Each error
//!   is counted in `stats().reply_errors` and logged at error level (feature `tracing`). A
//!   waiting stream holds its items and asks again at a backoff up to 1 s. An enforcing one
//!   refuses them with a `retry_after` of 1 s.
//! - **Builds before 1.0** stored other forms (text, or doubles without a version), which 1.0
//!   does not read. Such a key answers the error until it is deleted or expires.
//! - **Several limits** (`RedisRateLimiter<[u64; N]>`) keep version 1 too. Earlier builds
//!   wrote 0 where a bucket keeps its room for tokens given back while grants wait, and never
//!   read it. The two share a key: such a build leaves the room as it finds it, and this one
//!   reads 0 as no room, which only holds tokens back.
//!
//! A process fails on every key in a version it does not read. So roll out a format 2 readers
//! first:
//!
//! 1. **Readers.** Deploy to every process that shares the quotas a paced that reads versions
//!    1 and 2 but still writes 1. While it rolls out beside 1.0, every key stays version 1,
//!    which both read.
//! 2. **Writers.** Once no process that reads only version 1 is left, switch the writers to 2
//!    (a later release, or an option of the same one, off by default). Writers of 1 and 2 can
//!    then run side by side: each reads both, and a key holds its last writer's version.
//! 3. **Dropping version 1**, if ever, only when no key can hold it. A key under the default
//!    limit is rewritten by its next grant and expires once its bucket is full. A key with its
//!    own limit has no expiry and keeps version 1 until a request writes it (a refusal does
//!    not). Rewrite those first.
//!
//! A rollback runs the same steps backwards. Move writers back to 1 first. Go back to a paced
//! that reads only 1 once no key holds version 2 (rewritten by writers of 1, or expired; keys
//! with their own limits do not expire).
//!
//! A writer of 2 deployed too early shows at once, on exactly the keys it wrote, in the
//! `reply_errors` and error log of every 1.0 process. Nothing is granted from a misread state.
//! A paced that brings format 2 must read both 1 and 2, write 1 until told otherwise, keep the
//! version in the first byte, and name in its error the versions it reads.
//! `tests/redis_format.rs` has worker processes read each other's states, and `redis-cli`
//! write a version 2 under them.
//!
//! # Pacing a Kafka consumer
//!
//! paced knows no Kafka client: its operators take any stream. The workspace member `kafka/`
//! (`paced-kafka`, unpublished) runs what follows with rdkafka against a real broker (tansu).
//! Its tests check each claim here: `cargo test -p paced-kafka`.
//!
//! **Offsets.** By default rdkafka stores a message's offset when it hands the message to the
//! application, and commits the stored offsets every few seconds. A pacing stage holds
//! messages, so after a crash the committed offset may be past messages it held: they are
//! never delivered. So set `enable.auto.offset.store=false`, and store each offset yourself
//! with `store_offset_from_message` once the sink accepted the message.
//! `enable.auto.commit=true` still commits what was stored. After a crash, the messages
//! delivered since the last commit are delivered again: at least once, none lost. In
//! `kafka/tests/kill.rs` a consumer is killed with SIGKILL after 201 of 600 messages, and the
//! next one in the group delivers the rest. The committed offsets were never past what the
//! sink had. The duplicates (3, with commits every 200 ms) were exactly the messages delivered
//! after the last commit.
//!
//! **A stream per partition.** One stream for the whole consumer lets one partition's backlog
//! hold up the others. rdkafka's `split_partition_queue` gives a stream per partition; pace
//! each on its own. Split the queues before the first poll, and keep a task polling the
//! consumer's main queue: the rebalances arrive there.
//!
//! **A limit per partition and one for the topic.** Do not chain two stages (`throttle_with`
//! on a global [`RateLimiter`], then `throttle_by_key` on a [`KeyedRateLimiter`]). Each stage
//! charges its limiter when it emits into the next, and the next can hold the item. Only the
//! stage nearest the sink keeps its bound exactly at the sink. The other's bound is exceeded
//! there by up to one held item per partition. Instead, charge both limits together when the
//! message is delivered. Use one [`RateLimiter`] with a dimension per partition and one for
//! the topic, and a cost of 1 on the message's partition and 1 on the topic. A request is
//! granted on all its dimensions at once, or not at all.
//!
//! Its queue serves requests in order, so it must not hold a partition whose own bucket is
//! empty: that would hold up every other partition. So a message whose partition has room
//! (`available`) waits in the queue with `acquire`. There it waits only for the topic's
//! bucket, since no other stream charges its partition. The partitions waiting there take the
//! topic's tokens in turn. A message whose partition is empty calls `try_acquire` and sleeps
//! for the time it returns, out of the queue.
//!
#![cfg_attr(not(doctest), doc = include_str!("guide/kafka_consumer.md"))]
//!
//! In `kafka/tests/per_partition.rs`, one partition has a backlog of 10,000 and three others
//! get 30 fresh messages each. Each partition is paced to 50/s (bucket 5), all to 80/s
//! (bucket 8). In five runs the fresh messages were all delivered within 1.1 to 1.5 s of
//! being produced. Behind the backlog they would have waited about two minutes. In every
//! window of arrivals at the sink, each partition kept its bound and so did the topic. There
//! was no slack beyond tokio's 1 ms tick: the tightest window had 40 to 120 µs to spare.
//!
//! **A consumer group across machines.** A rebalance moves a partition to another process.
//! With a limiter in each process, the new owner starts with a full bucket, so the
//! partition's rate is not held across the move. Keep the partition's bucket in Redis: use a
//! [`RedisKeyedRateLimiter`] keyed by partition (feature `redis`), named after the topic, as
//! the one stage. (A limit in the process could not be charged in the same step.) In
//! `kafka/tests/group.rs` three consumer processes share it, while one joins and another
//! leaves. On the merged timeline of arrivals each partition kept its bound, and no message
//! was lost. A message held by a process that lost its partition is still delivered, but its
//! offset can no longer be stored (rdkafka says `Erroneous state`). The new owner delivers it
//! again.
//!
//! **Pacing slowly: `max.poll.interval.ms`.** librdkafka takes a member out of its group when
//! the application has not polled the consumer for `max.poll.interval.ms` (default 5 minutes).
//! rdkafka's `StreamConsumer` wakes its main queue's streams at half that interval. But a
//! paced stream that holds a message does not poll its upstream until the message leaves. So
//! pacing `consumer.stream()` itself slower than the interval gets the member evicted.
//! `kafka/tests/slow.rs` sets the interval to 1 s and paces one message every 2.5 s: the
//! stream yields `PollExceeded` and the partition is revoked. Two ways out:
//!
//! - Split the partition queues, pace those, and keep a task polling the main queue, as above.
//!   The same test, paced the same way, kept its partition through all four messages (8.6 s).
//! - Or raise `max.poll.interval.ms` above the longest wait of the paced stage. It may not be
//!   below `session.timeout.ms` (librdkafka refuses to create the client).
//!
//! The example `kafka_pipeline` (`cargo run -p paced-kafka --example kafka_pipeline`) runs
//! all of this against its own broker. It prints each partition's delivered rate beside its
//! bound, and the topic's beside the global one.
//!
//! # Pacing a Sink
//!
//! Often the rate-limited thing is the *output*: a Kafka producer, a socket written through a
//! codec, a channel into a worker that calls a partner's API. [`PaceSinkExt`] puts the same
//! operators on every `futures::Sink`: `throttle(rate, cost, burst)`,
//! `throttle_with(&quota, cost)` (any [`Limiter`], shared with streams and tasks) and
//! `min_interval(d)`. The adapter types are in [`paced::sink`](crate::sink). The writer just
//! sends, and each item is handed to the inner sink when it conforms.
//!
//! ```
//! use futures_util::{Sink, SinkExt};
//! use paced::{PaceSinkExt, Rate, RateLimiter};
//! use tokio_util::sync::PollSender;
//!
//! /// Writes every record to `producer`, each costing its size in bytes of a bandwidth quota
//! /// shared by all writers.
//! async fn produce<S>(producer: S, bandwidth: &RateLimiter, records: Vec<Vec<u8>>) -> Result<(), S::Error>
//! where
//!     S: Sink<Vec<u8>>,
//! {
//!     let mut paced = std::pin::pin!(producer.throttle_with(bandwidth, |r| r.len() as u64));
//!     for record in records {
//!         paced.send(record).await?;
//!     }
//!     paced.close().await
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // 1 MB/s, 500 kB at once.
//! let bandwidth = RateLimiter::new(Rate::per_second(1_000_000), 500_000);
//! let (tx, mut rx) = tokio::sync::mpsc::channel(16);
//! let start = tokio::time::Instant::now();
//! produce(PollSender::new(tx), &bandwidth, vec![vec![0; 250_000]; 4]).await.unwrap();
//! // Two records at once (the burst), then one per 250 ms.
//! assert_eq!(start.elapsed().as_millis(), 500);
//! while let Some(record) = rx.recv().await {
//!     assert_eq!(record.len(), 250_000);
//! }
//! # }
//! ```
//!
//! - **One item held, the writer waits.** An item that does not conform is held. `poll_ready`
//!   says ready only once nothing is held and the inner sink is ready, so `send` waits exactly
//!   as long as pacing requires. `poll_flush` and `poll_close` hand the held item on first, at
//!   its time. The promises are those of the stream operators: bound, order, nothing lost, at
//!   most a 1 ms tick late, exact under paused time, one timer armed only while an item waits.
//! - **Charged when handed on.** The inner sink's readiness is checked *before* the tokens are
//!   taken, so a full channel or a slow socket never costs quota. With a shared limiter, the
//!   writer joins the queue only once its sink can take the item. If its sink stops being
//!   ready meanwhile, it leaves the queue and joins at the back later, so a stuck sink does not
//!   hold up the quota. An item never handed on (the sink dropped, or `take_held()`) is charged
//!   nothing and gives its place back. While an item waits, the inner sink is flushed, so a
//!   buffering sink puts each item on the wire at its time, also under `send_all`.
//! - **Errors.** The inner sink's error comes out of `poll_ready`, `poll_flush` or `poll_close`
//!   unchanged. The held item stays held and is tried again by the next call, or you take it
//!   back with `take_held()`.
//! - **A framed socket** is both a `Stream` and a `Sink`. With [`PaceExt`] in scope too, name
//!   the trait: `PaceSinkExt::throttle(framed, rate, cost, burst)`. The sink adapters pass the
//!   reading side through unpaced.
//!
//! # tower and HTTP
//!
//! The rate-limited thing is often an HTTP API called through a tower `Service` (hyper, tonic,
//! reqwest with tower, axum's own clients). With the `tower` feature, [`RateLimitLayer`] puts
//! a shared quota in front of any service. tower's own `RateLimit` keeps its window inside the
//! service. So every clone (every connection of an axum app, every task that builds the stack)
//! starts a fresh limit (axum #2634, tower #794). It is also a fixed window that cannot charge
//! a cost per request. Here every clone draws on the same [`RateLimiter`], [`Stagger`] or
//! [`RedisRateLimiter`]. For one bucket per client or destination, use a [`KeyedRateLimiter`]
//! or a [`RedisKeyedRateLimiter`] (`RateLimitLayer::keyed(&limiter, |req| key)`).
//!
//! **Clients: shaping** (the default). A request waits for its tokens, FIFO with every other
//! user of the quota, then goes to the inner service. `.cost(|req| ..)` charges per request
//! (default 1). A response future dropped while it waits gives its place back and is charged
//! nothing. Nothing is refused, so the error type is the inner service's.
//!
//! ```
//! # #[cfg(feature = "tower")]
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! use std::convert::Infallible;
//! use paced::tower::RateLimitLayer;
//! use paced::{Rate, RateLimiter};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! // The partner allows 200 requests per second, 10 at once, for all our clones together.
//! let quota = RateLimiter::new(Rate::per_second(200), 10);
//! let client = ServiceBuilder::new()
//!     .layer(RateLimitLayer::new(&quota))
//!     .service_fn(|path: &'static str| async move { Ok::<_, Infallible>(path.len()) });
//! // With hyper: `.service(Client::builder(TokioExecutor::new()).build_http())`.
//! let start = tokio::time::Instant::now();
//! let calls: Vec<_> = (0..20).map(|_| tokio::spawn(client.clone().oneshot("/orders"))).collect();
//! for call in calls {
//!     assert_eq!(call.await.unwrap().unwrap(), 7);
//! }
//! assert_eq!(start.elapsed().as_millis(), 50); // 10 at once, then 10 at 200/s
//! # }
//! # #[cfg(not(feature = "tower"))]
//! # fn main() {}
//! ```
//!
//! **Readiness.** `poll_ready` is the inner service's and takes no token: a request's cost
//! and key are only known in `call`. The inner service is called the moment the tokens are
//! granted, and never unready. So the limit holds where requests leave, even under
//! backpressure. The layer needs `S: Clone`, the usual tower pattern.
//!
//! **Servers: enforcing** (`.enforcing()`). A request that does not conform now is refused at
//! once with a [`NotUntil`] (also named [`RateLimited`] in the tower module). It is charged
//! nothing and never reaches the handler. Errors are boxed ([`BoxError`]), as tower's
//! `LoadShed` and `Timeout` do and axum's `HandleErrorLayer` expects. Other errors pass through
//! unchanged. A server answers `429 Too Many Requests` with `Retry-After:`
//! [`retry_after_secs()`](crate::NotUntil::retry_after_secs). It is rounded up, so a client
//! that waits that long conforms:
//!
#![cfg_attr(not(doctest), doc = include_str!("guide/axum_server.md"))]
//!
//! **Proved over real HTTP** on 127.0.0.1 (`integration/tests/tower_http.rs`):
//!
//! - 1,500 requests from 30 tasks through the layer, at an axum server's limit of 1,000/s, got
//!   zero 429s and used 93–97 % of the limit.
//! - 64 services built from tower's `RateLimitLayer` sent 192 requests in 0.15–0.3 s against a
//!   limit of 200/s. The same from paced's layer kept it (0.91 s, the least the limit allows).
//! - An axum app keyed by client IP answers 429 with a `Retry-After` that is enough.
//!
//! `cargo run -p paced-integration --features tower --example http_client` and
//! `--example http_server` show both sides.
//!
//! **Finding the limit over HTTP.** [`AdaptiveLayer`] reports every response to an
//! [`Adaptive`] (see [Finding the limit](#finding-the-limit-adaptive)). A classifier you write
//! reads the response as [`Outcome`]`::Success`, `Outcome::Throttled { retry_after }` or
//! `Outcome::Ignore`. paced does not depend on `http`, so you write the classifier for
//! `http::Response`. A [`RateLimitLayer`] over `adaptive.limiter()` below it paces the
//! requests at the rate found:
//!
#![cfg_attr(not(doctest), doc = include_str!("guide/hyper_client.md"))]
//!
//! - A response is reported when its future completes, and returned unchanged. A future
//!   dropped before that (a timeout, a cancelled task) reports nothing, nor does
//!   `Outcome::Ignore`.
//! - `Retry-After` is parsed in its delta-seconds form. The HTTP-date form reads as a refusal
//!   without a delay. The header has whole seconds only, so a server rounds a 20 ms wait up to
//!   1 s, and the client honours it, pausing for everyone. That costs goodput: 0.72–0.91 of the
//!   limit on the simulated provider, against 0.97–0.99 without `Retry-After` (figures in
//!   BENCHMARKS.md). If your partner tolerates it, classify with `retry_after: None`.
//!
//! ## Announcing the quota (feature `http`)
//!
//! An enforcing layer can tell its clients their quota on every response, allowed or
//! refused. A client can then pace to it instead of probing:
//! `RateLimitLayer::new(&quota).enforcing().headers(QuotaHeaders::Both)`. A token bucket maps
//! onto the fields as follows (see `paced::tower::QuotaHeaders`):
//!
//! | header | value |
//! |---|---|
//! | `RateLimit-Policy: "default";q=Q;w=W` | `Q` the burst; `W` the seconds to refill from empty (`burst / rate`), rounded up |
//! | `RateLimit: "default";r=R;t=T` | `R` the whole tokens left; `T` the seconds until full again, rounded up |
//! | `X-RateLimit-Limit`, `-Remaining`, `-Reset` | the burst, the tokens left, the seconds until full (a delay, not an epoch time) |
//!
//! The layer itself answers a refused request: `429 Too Many Requests`, `Retry-After` and the
//! same headers. `Retry-After` is in whole seconds, rounded up. There is none for a request
//! whose cost is above the burst, which never conforms. The values are read just after the
//! decision. Under concurrency they may already count a request decided a moment later:
//! `remaining` is never more than there is, and `reset` is never early.
//!
//! Which quotas announce:
//!
//! - Plain token buckets: a `RateLimiter` that is not warming up, a key of a
//!   `KeyedRateLimiter`.
//! - A [`RateLimiter`] of several limits. It sends one IETF policy per limit, named after its
//!   dimension and window:
//!   `"requests-minute";q=500;w=60, "tokens-minute";q=40000;w=60;qu="tokens"`.
//!   A repeated name takes `-2`, `-3`. Each limit
//!   has its `RateLimit` item; a fixed window's `t` is the time until its window ends. The
//!   `X-RateLimit-*` trio is that of the limit with the fewest tokens left. A keyed layer over
//!   a [`KeyedRateLimiter`] of several limits announces every limit of the request's key the
//!   same way. `paced::tower::limits_from_headers` reads them back, each on its dimension.
//! - Other quotas (a warming `RateLimiter`, the Redis limiters) send `Retry-After` alone.
//!
//! A server knows a request's cost from the request, so an announcing layer does not settle.
//! `headers()` and `settle()` do not combine (a compile error).
//!
//! # Finding the limit (Adaptive)
//!
//! **A partner API that answers 429.** The partner does not publish its limit. It lowers it
//! when busy, and shares it with its other clients. All you learn is a
//! `429 Too Many Requests`, sometimes with a `Retry-After`. A fixed rate either wastes capacity
//! or hammers the partner. An [`Adaptive`] sets a [`RateLimiter`]'s rate from the answers.
//! Report each outcome with [`on_success`](crate::Adaptive::on_success) or
//! [`on_throttled`](crate::Adaptive::on_throttled), and it finds the limit within `[min, max]`:
//!
//! ```
//! use std::time::Duration;
//! use futures_util::{Stream, StreamExt};
//! use paced::{Adaptive, PaceExt, Rate, RateLimiter, Shaping};
//!
//! enum Answer {
//!     Ok,
//!     TooManyRequests { retry_after: Option<Duration> },
//! }
//!
//! async fn call_partner(order: u64) -> Answer {
//!     // Your HTTP call here; this partner refuses every tenth order.
//!     if order % 10 == 9 {
//!         Answer::TooManyRequests { retry_after: None }
//!     } else {
//!         Answer::Ok
//!     }
//! }
//!
//! async fn sync_orders(partner: &Adaptive, orders: impl Stream<Item = u64>) {
//!     orders
//!         .throttle_with(partner.limiter(), |_| 1, Shaping)
//!         .map(|order| {
//!             let partner = partner.clone();
//!             async move {
//!                 match call_partner(order).await {
//!                     Answer::Ok => partner.on_success(),
//!                     // (Requeue the order; it goes back through the limiter.)
//!                     Answer::TooManyRequests { retry_after } => partner.on_throttled(retry_after),
//!                 }
//!             }
//!         })
//!         .buffer_unordered(16)
//!         .for_each(|()| async {})
//!         .await;
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let limiter = RateLimiter::new(Rate::per_second(100), 10);
//! let partner = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(1000));
//! sync_orders(&partner, futures_util::stream::iter(0..100)).await;
//! let stats = partner.stats();
//! assert_eq!((stats.successes, stats.throttled), (90, 10));
//! assert!(stats.decreases >= 1);
//! assert!(partner.rate() < Rate::per_second(100));
//! # }
//! ```
//!
//! After a refusal the rate drops to 80 % of the rate calls were really sent at, once per
//! overload: refusals of calls already in flight do not count again. A `Retry-After` pauses
//! the limiter for everyone ([`RateLimiter::pause_for`]). Then the rate probes up along a
//! cubic curve: quickly at first, flat near the rate where the limit was found, faster beyond
//! it in case the limit rose. The climb back takes 2 s, or the time of 33 calls if longer, so
//! the one refusal that ends each cycle is a small share of its calls. Time paused by a
//! `Retry-After` counts neither as probing nor as sending time.
//!
//! The controller sets only the rate. The limiter's burst stays yours: give it at least 2, and
//! at least `max × 1 ms`. Everything reads tokio's clock, so under paused time it is exact and
//! repeatable. `cargo run -p paced-integration --example adaptive_partner` plots the rate
//! finding a partner's 200/s and following it down to 100/s.
//!
//! On a simulated provider (a hidden token bucket of rate `L`, from 5/s to 5,000/s) the default
//! law kept 0.97–0.99 of `L`, with 0.01–2 % of the calls refused. It settled within 10 s after
//! `L` halved, and used a doubled `L` within 7–19 s. Not always that well: in one schedule of 3,000
//! drawn at random, `L` doubled from 222/s to 444/s while the provider's burst stayed 11 calls (18
//! calls in flight at 17 ms, two streams). Refusals came at rates from about 400/s, the rate cycled
//! between 300/s and 460/s, and it used 0.83 of the new `L` 20 to 30 s after it rose (0.85 is the
//! goal the tests hold it to). BENCHMARKS.md compares it with AWS's cubic constants and a plain
//! AIMD (`cargo bench -p paced-benches --features unstable-laws
//! --bench adaptive`; the laws it compares are outside semver).
//!
//! **Several limits.** Over a `RateLimiter<[u64; N]>`, an `Adaptive<[u64; N]>` (made by
//! [`Adaptive::builder`](crate::Adaptive::builder)) learns each limit you choose on its own.
//! A refusal that names its limit (`on_throttled_limit`, `on_throttled_dimension`) lowers
//! that limit only. One that names none lowers them all. `on_limits` (feature `http`) sets
//! each limit from the headers.
//!
//! # Metrics
//!
//! With the `metrics` feature, every limiter that has `stats()` can also record to the
//! [`metrics`](https://docs.rs/metrics) facade. Whatever recorder the application installs
//! (Prometheus, StatsD, OpenTelemetry...) then sees it. To turn it on, name the limiter with
//! `with_metrics(name)`. On `RateLimiter`, `Stagger`, `KeyedRateLimiter` and `Adaptive` it
//! consumes and returns the limiter; the Redis limiters have it on their builder. Every
//! metric carries the label `limiter = name`:
//!
//! | metric | kind | recorded by | what |
//! | --- | --- | --- | --- |
//! | `paced_grants_total` | counter | all | requests granted |
//! | `paced_tokens_granted_total` | counter | all | tokens (the cost) granted |
//! | `paced_refusals_total` | counter | all | requests refused: `try_acquire`, a timeout too short, an enforcing stream's item |
//! | `paced_cancellations_total` | counter | in process | waiters dropped before their grant |
//! | `paced_wait_seconds` | histogram | in process | time a granted request spent queued (0 if it did not queue) |
//! | `paced_waiters` | gauge | in process | requests queued now |
//! | `paced_adaptive_rate` | gauge | `Adaptive` | the rate the controller set, in tokens per second (moved by every report: `on_success`, `on_throttled`, `on_quota`) |
//! | `paced_adaptive_decreases_total` | counter | `Adaptive` | decreases of the rate |
//! | `paced_redis_round_trips_total` | counter | Redis | script calls sent |
//! | `paced_redis_errors_total` | counter | Redis | failed round trips, label `kind` = `outage` or `reply` |
//! | `paced_redis_fallbacks_total` | counter | Redis | grants by the fail-open fallback |
//!
//! A keyed limiter counts over all its keys: keys are unbounded, so a key is not a label. An
//! `Adaptive` names its limiter too, under the same name. The counters match `stats()` from
//! the moment of naming.
//!
//! - **Registered once.** The metrics are registered with the recorder in force when the
//!   limiter is named, so install the recorder first. Naming any clone names them all, clones
//!   made before included. Named twice, the last name wins. The earlier name stops recording
//!   (its `paced_waiters` gauge drops to 0), and the new name starts, with the waiters queued
//!   then.
//! - **Cheap.** Recording an event is one call, with no look-up in the recorder's registry.
//!   Without the feature nothing is compiled in. With it, an unnamed limiter pays one branch
//!   per event. A grant on the lock-free path records three events (a grant, its tokens, a
//!   wait of 0); BENCHMARKS.md has the figures. A limiter named a second time costs about
//!   10 ns more per event from then on (a read lock).
//!
#![cfg_attr(not(doctest), doc = include_str!("guide/metrics_recorder.md"))]
//!
//! `cargo run -p paced-integration --features metrics --example metrics_prometheus` runs a paced
//! workload under `metrics-exporter-prometheus` and prints the scrape.
//!
//! # Limits, honestly
//!
//! paced promises each operator's bound, order, nothing lost or duplicated, FIFO among the
//! users of a shared quota, tokens charged only when granted, and an exact schedule under
//! paused time. It does not promise to wake on time in real time. These are the costs and
//! edges:
//!
//! - **The 1 ms tick.** A `Sleep` wakes up to two ticks after its time (plus the scheduler's
//!   latency in real time), never before. On Linux the waits this would cost rate end on time
//!   (see [the operators](#the-operators-in-depth)). A wake-up later than its last 200 µs of
//!   yielding still costs rate at burst 1, as on any timer.
//! - **Without a high-resolution timer**, tokens that flow into a full bucket while the timer
//!   is late are lost.
//!   - For `throttle` at several hundred items/s and more, give `burst ≥ rate × 2 ms + 1`
//!     (more on a loaded machine), or use `batched_interval`.
//!   - At exactly 1,000/s, burst 2 (= rate × 2 ms) reaches only 0.94 of the rate. A wake-up
//!     about 0.1 ms after a tick empties the bucket. The next token is due 1 ms later, just
//!     past a tick, so the timer fires 2.1 ms later, when the bucket of 2 has been full for a
//!     while. Burst 3 reaches 0.99.
//!   - With `burst = 1`, a full bucket cannot store the refill lost to a late tick. Each gap
//!     counts from the actual emission (like `min_interval`), so the long-run rate falls to
//!     0.65 of `rate` at 500/s. A larger burst absorbs it, and so
//!     does `precise()`, at the price of a busy core.
//! - **The timer thread's cost.** Each wait that ends on it costs two thread wake-ups (the
//!   timer thread's, then the runtime's) and up to 200 µs of yielding. That is 1.1 times what
//!   governor's timer thread costs in the same runs (BENCHMARKS.md, "Burst 1"). It handles at
//!   most 1,024 such waits at once; more sleep on the tick. On a loaded machine its wake-ups
//!   come later and burst 1 loses more rate. A burst of `rate × 2 ms + 1` does not depend on
//!   them.
//! - **Clock reads.** An item that need not wait costs one clock read, since an exact schedule
//!   needs its emission time. One that waits costs two or three more around its timer.
//!   `min_interval(0)`, `staggered_start(_, 0)` and `batched_interval(_, 0)` read none, and
//!   `batched_interval` reads once per batch.
//! - **Extremes.** `staggered_start(k, period)` remembers up to `k` emission times younger than
//!   `period` (8 bytes each), so a huge `k` with a huge `period` grows with the stream.
//!   `batched_interval(n, _)` with a huge `n` over an always-ready source keeps pulling until
//!   it returns `Pending`, like futures' `ready_chunks`. Costs, rates and waits saturate
//!   rather than overflow. A wait beyond about 584 years is "never" ([`NotUntil::is_never`]),
//!   and a pause that long is a pause of centuries, never a panic.
//! - **Locks.** While nobody waits, a [`RateLimiter`] (token bucket) grants with one
//!   compare-and-swap. Otherwise requests take a short mutex (a clock read and a few
//!   arithmetic steps). That is always so for a warming-up `RateLimiter`, a [`Stagger`] and a
//!   [`KeyedRateLimiter`], whose keys are spread over a few shards, each with its own mutex.
//! - **Across machines** the bound holds to within one Redis round trip (and a lease's age).
//!   Under `FailOpen` an outage lets `n` processes reach `n × share` of the quota.
//! - **`Adaptive`** is measured, not proved. Its figures come from a simulated provider, and a
//!   real partner's limit may move faster than any controller follows.
//! - MSRV 1.85 (tokio's); the `redis` feature needs 1.88.
//!
//! # The design
//!
//! One bucket core, one waiter engine, the limiters over it, and thin entry points over the
//! limiters:
//!
//! ```text
//! entry points   PaceExt (stream)  PaceSinkExt (Sink)  tasks (acquire)  paced::tower   Redis
//!                        \               |                  |              /           |
//! limiters        RateLimiter · Stagger · KeyedRateLimiter · Adaptive      RedisRateLimiter
//!                                         |                                (same GCRA, in Lua)
//! engine          a Lane (a rule + its FIFO queue) · one lane behind a mutex, or one per key
//!                 · a Waiter: one request's async side, the only in-process code that sleeps
//!                                         |
//! core            clock-free arithmetic: the GCRA bucket, the sliding window, Guava's warm-up
//! ```
//!
//! - **The core** decides *when*, and never reads a clock. Every function takes `now` and
//!   answers with a time, in integer nanoseconds, with the rate as an exact fraction. There is
//!   no float but Guava's warm-up curve, no drift; deadlines are rounded up and everything
//!   saturates. It is unit- and property-tested with plain numbers. The stream and Sink
//!   operators that pace only themselves (`throttle`, `min_interval`, `batched_interval`,
//!   `staggered_start`) use it directly: one held item, one timer.
//! - **The engine** puts a rule in front of a FIFO queue (a lane). It decides every request
//!   under a short lock in a few arithmetic steps. A request is charged when it is granted,
//!   never before. Only the head of a queue sleeps, and a grant wakes exactly the next waiter.
//!   A `RateLimiter` adds a lock-free path (one compare-and-swap on a packed word) while its
//!   queue is empty.
//! - **The keyed table** keeps one lane per key and forgets it once it is full and idle.
//!   - An idle key under the default limit is one `u64` beside the key (16 bytes a slot for
//!     `u64` keys). A key that waits, or has its own limit, also has a queue.
//!   - Keys are spread over shards (four per core, 4 to 64), each behind a short mutex. A key
//!     is hashed once per call, before any mutex is taken.
//!   - The table keeps keys, not hashes, to save 8 bytes a key, and hashes them again only
//!     when it grows or shrinks. It forgets full keys before it would grow, and shrinks only
//!     below an eighth full.
//!   - The key's `Eq` runs under the mutex, in a look-up made before anything changes, so a
//!     panicking `Eq` leaves the table consistent.
//!   - In `throttle_by_key`, each key's oldest held item waits in the key's queue like any
//!     other waiter; the items behind it wait in the adapter.
//! - **The limiters** are handles (`Arc`s) over the engine: [`RateLimiter`] (a bucket or a
//!   warm-up curve, with a pause), [`Stagger`] (a window), [`KeyedRateLimiter`] (a bucket per
//!   key), [`Adaptive`] (a controller that sets a `RateLimiter`'s rate).
//! - **The entry points** are thin. A stream adapter, a Sink adapter, a tower layer or a task
//!   asks a limiter through the same waiter. So every one of them has the same promises and
//!   refuses with the same [`NotUntil`]. Every impossible configuration value is a
//!   [`ConfigError`]. The tower layer's `call` moves the inner service, just made ready, into
//!   the response future, which calls it the moment the tokens are granted. (A token reserved
//!   in `poll_ready` by a caller that never calls would be lost.)
//! - **The timer thread** (Linux) makes waits end on time. It wakes the task shortly before
//!   its time, and the task yields for the last stretch: at most 200 µs, and only while recent
//!   wake-ups were late. There is one thread per process, started on the first wait that needs
//!   it. An idle adapter holds nothing of it, and it sleeps while no wait needs it. It only
//!   wakes the task; a read of tokio's clock lets the item go. It counts real time, which a
//!   paused test does not move. It needs nothing of the runtime (no IO driver) and nothing but
//!   the standard library. Where there is no such timer, `precise()` sleeps until two ticks
//!   before the item's time. Under paused time the clock does not move across a yield, so a
//!   `precise()` wait falls back to the timer.
//! - **Redis.** Every Redis limiter, one limit or several, runs one Lua script on Redis
//!   (`quota.lua`), on Redis's `TIME`: the same bucket arithmetic, and the fixed windows. The
//!   script is sent as `EVALSHA`, loaded once and again after `NOSCRIPT`. A request is one
//!   `TIME`, one `GET` and at most one write. Every Redis handle acquires, leases, gives
//!   back, falls back, backs off and takes turns through one implementation: a quota of `N`
//!   dimensions (`several.rs`, `multi.rs`, `held.rs`; the turns and the waits in `turns.rs`
//!   and `wait.rs`). A keyed limiter is a map from keys to such quotas (`keyed_multi.rs`). A
//!   one-limit handle is the quota of one dimension: its bucket is stored in the script's
//!   shorter one-bucket form, a [`RedisRateLimiter`]'s under the name as given, and its lease
//!   of `m` counts the cost. A key's own limit is stored beside its state in the same Redis
//!   key, so the one read of every request sees it.
//! - **Redis waiters** do not go through the engine: Redis keeps the queue. Each grant carries
//!   the Redis instant it was charged for. A reservation sleeps out its wait on a tokio timer
//!   of its own. Then it lets this process's grants of the key for earlier instants go first.
//!   It also waits for the answers to requests sent before it, but no longer. On a
//!   multi-thread runtime, tasks reach the connection and read their replies in any order; the
//!   instant does not depend on that. A stream's oldest item of each key waits by the Redis
//!   limiter's own `acquire`, one request per key at a time.
//! - **Tokens given back in Redis** wait for the latest waiting grant's instant, because its
//!   process sleeps until then. `RedisRateLimiter<[u64; N]>` keeps the room for them in Redis.
//!   The one-limit format has no room for it. In process, tokens given back reach the waiters
//!   at once: there the waiters' instants are not fixed yet.
//! - **Redis's stored format** ([Upgrading a fleet](#upgrading-a-fleet) says how versions
//!   roll out). Numbers go to the script and rest in Redis as binary doubles (Lua's `struct`
//!   library): parsing and printing decimals was most of the script's own cost.
//!   - A one-limit key holds one byte, the format version `1`, then little-endian doubles: the
//!     bucket's level and Redis's time (17 bytes). A key with its own limit adds that limit's
//!     interval and burst (33 bytes).
//!   - Several limits keep version 1 too: one byte, the latest grant's instant, then two
//!     doubles per limit (9 + 16 × M bytes; with limits set by `set_limit`, four more doubles
//!     per limit). A bucket's second double is its room for tokens given back while grants
//!     wait.
//!   - One script reads and writes both forms: the one-limit handle asks for the first. Its
//!     common grant (no lease, nothing to give back, no debt) runs without Lua tables, which
//!     cost Redis more than the arithmetic.
//!   - A paced that brings a format 2 reads both versions in its one script, so each decision
//!     stays one atomic `EVALSHA`. Scripts are named by their SHA, so old and new ones coexist
//!     in Redis.
//!
//! The crate forbids `unsafe` code. Its one dependency beyond tokio and the futures traits is
//! `hashbrown` (without default features). The keyed table is looked up by a hash computed
//! before its lock is taken, which std's `HashMap` cannot do on stable Rust.
//!
//! # Migrating from the git versions
//!
//! paced 1.0.0 is the first release on crates.io. Earlier versions lived only in git, under
//! the name `pacer`. Rename the dependency and the paths: `pacer::` becomes `paced::`, and the
//! metric names `pacer_*` become `paced_*`.
//!
//! - The adapter types live in [`paced::stream`](crate::stream) and
//!   [`paced::sink`](crate::sink).
//! - Permits, builders, counters, `Cost` and the `Limiter` traits live in
//!   [`paced::limiter`](crate::limiter).
//! - The Redis types other than the two limiters live in `paced::redis`.
//! - [`NotUntil`] is the one refusal.
//! - A limiter of several limits is the one-limit type with a cost of `[u64; N]`.
//!   `MultiRateLimiter<N>` became `RateLimiter<[u64; N]>`, and so on for the keyed, adaptive
//!   and Redis limiters.
//! - The handles share one vocabulary ([the table above](#every-handle-every-operation)).
//!
//! The first release has no deprecated items: where a name changed, the old one is gone. The
//! [CHANGELOG](https://docs.rs/crate/paced/latest/source/CHANGELOG.md) lists every change,
//! with a migration table from each old name or signature to the new one.
//!
//! # Reading quota headers
//!
//! Many APIs say how much quota is left with every answer. They use the IETF draft's
//! `RateLimit-Policy: "default";q=600;w=60` and `RateLimit: "default";r=120;t=12`, or the de
//! facto `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` (GitHub,
//! Discord, and many others). Report them with
//! [`Adaptive::on_quota`](crate::Adaptive::on_quota) instead of `on_success`. The client then
//! paces to the quota from the first answer on, with no refusal to find it:
//!
//! - the calls left are spread over the time to reset;
//! - a token bucket is paced at its refill rate `q / w`;
//! - probing above the announced rate waits while the announcements keep coming. If they
//!   stop, it resumes from the last announced rate. A server that announces nothing is probed
//!   as before.
//!
//! With the `http` feature, `AdaptiveLayer::http(&adaptive)` reads the headers of every
//! `http::Response`, with `429` / `503` and their `Retry-After`:
//!
//! ```
//! # #[cfg(feature = "http")]
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! use paced::tower::{AdaptiveLayer, RateLimitLayer};
//! use paced::{Adaptive, Rate, RateLimiter};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! let limiter = RateLimiter::new(Rate::per_second(1), 5);
//! let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(500));
//! // Your HTTP client (a hyper-util `Client`, ...); here one that answers at once.
//! let client = tower::service_fn(|_: http::Request<()>| async {
//!     let response = http::Response::builder()
//!         .header("x-ratelimit-limit", "5000")
//!         .header("x-ratelimit-remaining", "4000")
//!         .header("x-ratelimit-reset", "1800")
//!         .body(())
//!         .unwrap();
//!     Ok::<_, std::convert::Infallible>(response)
//! });
//! let client = ServiceBuilder::new()
//!     .layer(AdaptiveLayer::http(&adaptive))
//!     .layer(RateLimitLayer::new(adaptive.limiter()))
//!     .service(client);
//! client.oneshot(http::Request::new(())).await.unwrap();
//! assert!(adaptive.rate() > Rate::per_second(2)); // 4,001 calls in 30 minutes: 2.2/s
//! # }
//! # #[cfg(not(feature = "http"))]
//! # fn main() {}
//! ```
//!
//! Start the limiter low when the server announces its quota: the calls sent before the first
//! answer cannot know it. Without `http`, read the headers yourself into an
//! [`Announced`](crate::limiter::Announced):
//!
//! ```
//! use std::time::Duration;
//! use paced::{Adaptive, Rate, RateLimiter};
//! use paced::limiter::Announced;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let limiter = RateLimiter::new(Rate::per_second(1), 5);
//! let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(500));
//! // X-RateLimit-Remaining: 4000, X-RateLimit-Reset: 1800 (seconds).
//! adaptive.on_quota(Announced::new(4000, Duration::from_secs(1800)));
//! assert!(adaptive.rate() > Rate::per_second(2) && adaptive.rate() < Rate::per_second(3));
//! # }
//! ```
//!
//! [`PaceExt`]: crate::PaceExt
//! [`PaceSinkExt`]: crate::PaceSinkExt
//! [`Rate`]: crate::Rate
//! [`Shaping`]: crate::Shaping
//! [`Enforcing`]: crate::Enforcing
//! [`RateExceeded`]: crate::stream::RateExceeded
//! [`NotUntil`]: crate::NotUntil
//! [`NotUntil::is_never`]: crate::NotUntil::is_never
//! [`ConfigError`]: crate::ConfigError
//! [`ConfigError::NoBurst`]: crate::ConfigError::NoBurst
//! [`RateLimiter`]: crate::RateLimiter
//! [`RateLimiter::burst`]: crate::RateLimiter::burst
//! [`RateLimiter::pause_for`]: crate::RateLimiter::pause_for
//! [`Stagger`]: crate::Stagger
//! [`Stagger::set_limit`]: crate::Stagger::set_limit
//! [`Stagger::try_set_limit`]: crate::Stagger::try_set_limit
//! [`KeyedRateLimiter`]: crate::KeyedRateLimiter
//! [`Adaptive`]: crate::Adaptive
//! [`RateLimiter`]: crate::RateLimiter
//! [`KeyedRateLimiter`]: crate::KeyedRateLimiter
//! [`Permit`]: crate::limiter::Permit
//! [`Limit`]: crate::Limit
//! [`Limiter`]: crate::limiter::Limiter
//! [`KeyedLimiter`]: crate::limiter::KeyedLimiter
#![cfg_attr(
    feature = "redis",
    doc = "[`RedisRateLimiter`]: crate::RedisRateLimiter\n\n\
           [`RedisKeyedRateLimiter`]: crate::RedisKeyedRateLimiter\n\n\
           [`FailurePolicy`]: crate::redis::FailurePolicy\n\n\
           [redis]: crate::redis"
)]
#![cfg_attr(
    not(feature = "redis"),
    doc = "[`RedisRateLimiter`]: https://docs.rs/paced/latest/paced/struct.RedisRateLimiter.html\n\n\
           [`RedisKeyedRateLimiter`]: https://docs.rs/paced/latest/paced/struct.RedisKeyedRateLimiter.html\n\n\
           [`FailurePolicy`]: https://docs.rs/paced/latest/paced/redis/enum.FailurePolicy.html\n\n\
           [redis]: https://docs.rs/paced/latest/paced/redis/"
)]
#![cfg_attr(
    feature = "tower",
    doc = "[`RateLimitLayer`]: crate::tower::RateLimitLayer\n\n\
           [`RateLimited`]: crate::tower::RateLimited\n\n\
           [`BoxError`]: crate::tower::BoxError\n\n\
           [`AdaptiveLayer`]: crate::tower::AdaptiveLayer\n\n\
           [`Outcome`]: crate::tower::Outcome"
)]
#![cfg_attr(
    not(feature = "tower"),
    doc = "[`RateLimitLayer`]: https://docs.rs/paced/latest/paced/tower/struct.RateLimitLayer.html\n\n\
           [`RateLimited`]: https://docs.rs/paced/latest/paced/tower/type.RateLimited.html\n\n\
           [`BoxError`]: https://docs.rs/paced/latest/paced/tower/type.BoxError.html\n\n\
           [`AdaptiveLayer`]: https://docs.rs/paced/latest/paced/tower/struct.AdaptiveLayer.html\n\n\
           [`Outcome`]: https://docs.rs/paced/latest/paced/tower/enum.Outcome.html"
)]
