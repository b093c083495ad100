//! Pacing for streams: [`PaceExt`], the operators as methods on every stream, and the
//! adapter types they return. Each adapter holds its stream's items back until they conform,
//! and on a shared limiter waits its turn in the same queue as tasks that call `acquire`.

use std::time::Duration;

use futures_core::Stream;

use crate::error::ConfigError;
use crate::limiter::{KeyedLimiter, Limiter, Stagger};
use crate::rate::Rate;

/// `get_ref`, `get_mut`, `get_pin_mut` and `into_inner` for an adapter whose underlying stream
/// is reached through its pinned field `$field` (a `Paced`, an `Upstream` or a `Source`).
/// `$make` is the expression that builds the adapter in the doctests.
macro_rules! accessors {
    ($adapter:ident [$($bound:tt)*] [$($param:tt)*], $field:ident, $make:literal) => {
        impl<$($bound)*> $adapter<$($param)*> {
            /// A reference to the underlying stream.
            ///
            /// # Examples
            ///
            /// ```
            /// use futures_util::Stream;
            /// use paced::{PaceExt, Rate, Shaping};
            /// use std::time::Duration;
            ///
            #[doc = concat!("let s = ", $make, ";")]
            /// assert_eq!(s.get_ref().size_hint(), (3, Some(3)));
            /// ```
            pub fn get_ref(&self) -> &S {
                accessors!(@ref self.$field)
            }

            /// A mutable reference to the underlying stream. Items taken from it directly are
            /// not paced.
            ///
            /// # Examples
            ///
            /// ```
            /// use futures_util::Stream;
            /// use paced::{PaceExt, Rate, Shaping};
            /// use std::time::Duration;
            ///
            #[doc = concat!("let mut s = ", $make, ";")]
            /// assert_eq!(s.get_mut().size_hint(), (3, Some(3)));
            /// ```
            pub fn get_mut(&mut self) -> &mut S {
                accessors!(@mut self.$field)
            }

            /// A pinned mutable reference to the underlying stream. Items taken from it
            /// directly are not paced.
            ///
            /// # Examples
            ///
            /// ```
            /// use futures_util::Stream;
            /// use paced::{PaceExt, Rate, Shaping};
            /// use std::time::Duration;
            ///
            #[doc = concat!("let mut s = std::pin::pin!(", $make, ");")]
            /// assert_eq!(s.as_mut().get_pin_mut().size_hint(), (3, Some(3)));
            /// ```
            pub fn get_pin_mut(self: std::pin::Pin<&mut Self>) -> std::pin::Pin<&mut S> {
                accessors!(@pin self.project().$field)
            }

            /// The underlying stream. Whatever the adapter holds is dropped with it.
            ///
            /// # Examples
            ///
            /// ```
            /// use futures_util::Stream;
            /// use paced::{PaceExt, Rate, Shaping};
            /// use std::time::Duration;
            ///
            #[doc = concat!("let s = ", $make, ";")]
            /// assert_eq!(s.into_inner().size_hint(), (3, Some(3)));
            /// ```
            pub fn into_inner(self) -> S {
                accessors!(@into self.$field)
            }
        }
    };
    (@ref $e:expr) => { $e.get_ref() };
    (@mut $e:expr) => { $e.get_mut() };
    (@pin $e:expr) => { $e.get_pin_mut() };
    (@into $e:expr) => { $e.into_inner() };
}

/// `Stream` and `FusedStream` for an adapter over a `Paced` or a `SharedPaced` in its pinned
/// field `inner`: `$poll` computes the next item from the projection `$me` and the context `$cx`;
/// the size hint and the end are `inner`'s.
macro_rules! forward_stream {
    (
        $adapter:ident [$($bound:tt)*] [$($param:tt)*],
        $item:ty,
        |$me:ident, $cx:ident| $poll:expr
    ) => {
        impl<$($bound)*> Stream for $adapter<$($param)*> {
            type Item = $item;

            fn poll_next(
                self: Pin<&mut Self>,
                $cx: &mut Context<'_>,
            ) -> Poll<Option<Self::Item>> {
                let $me = self.project();
                $poll
            }

            fn size_hint(&self) -> (usize, Option<usize>) {
                self.inner.size_hint()
            }
        }

        impl<$($bound)*> FusedStream for $adapter<$($param)*> {
            fn is_terminated(&self) -> bool {
                self.inner.is_terminated()
            }
        }
    };
}

/// `Debug` for an adapter, showing `$field`s: needs the stream and its items to be `Debug`,
/// and whatever `$extra` bounds add.
macro_rules! debug_adapter {
    ($adapter:ident [$($param:ident),+] [$($extra:tt)*], $($field:ident),+) => {
        impl<$($param),+> fmt::Debug for $adapter<$($param),+>
        where
            S: Stream + fmt::Debug,
            S::Item: fmt::Debug,
            $($extra)*
        {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($adapter))
                    $(.field(stringify!($field), &self.$field))+
                    .finish()
            }
        }
    };
}

/// What a one-item-at-a-time core (`Paced`, `SharedPaced`) forwards to its `Upstream` field
/// `upstream`: the accessors, the end and the size hint. Inside the core's `impl` block.
macro_rules! forward_upstream {
    () => {
        pub(crate) fn get_ref(&self) -> &S {
            self.upstream.get_ref()
        }

        pub(crate) fn get_mut(&mut self) -> &mut S {
            self.upstream.get_mut()
        }

        pub(crate) fn get_pin_mut(self: Pin<&mut Self>) -> Pin<&mut S> {
            self.project().upstream.get_pin_mut()
        }

        pub(crate) fn into_inner(self) -> S {
            self.upstream.into_inner()
        }

        pub(crate) fn is_terminated(&self) -> bool {
            self.upstream.is_terminated()
        }

        pub(crate) fn size_hint(&self) -> (usize, Option<usize>) {
            self.upstream.size_hint()
        }
    };
}

mod batched_interval;
mod min_interval;
mod paced;
mod shared_paced;
mod staggered_start;
mod staggered_start_with;
mod throttle;
mod throttle_by_key;
mod throttle_with;
mod upstream;

pub use crate::error::RateExceeded;
pub use crate::mode::ThrottleMode;
pub use batched_interval::BatchedInterval;
pub use min_interval::MinInterval;
pub use staggered_start::StaggeredStart;
pub use staggered_start_with::StaggeredStartWith;
pub use throttle::Throttle;
pub use throttle_by_key::ThrottleByKey;
pub use throttle_with::ThrottleWith;

/// Pacing operators for every [`Stream`], driven by tokio's timer.
///
/// Polling a paced stream needs a tokio runtime with time enabled; building one does not. Each
/// adapter holds at most one upstream item (`batched_interval`: one batch) and arms its timer
/// only while an item waits, so an idle adapter costs no wake-ups.
///
/// **Timer granularity.** tokio's timer fires on 1 ms ticks and rounds deadlines up, so a
/// `Sleep` wakes up to two ticks after its deadline. A wait whose rule absorbs that (a bucket
/// with spare tokens for 3 ms) sleeps on the tick and loses nothing. A wait whose lateness would
/// move every later item (burst 1, `min_interval`) ends on time instead: on Linux on the
/// process's timer thread (started on the first such wait), so burst 1 keeps its rate;
/// elsewhere it sleeps on the tick (see [`throttle`](PaceExt::throttle), "Exactness"). An item never leaves before its time; one that
/// need not wait leaves at once, without the timer.
///
/// **Name clash.** `tokio_stream::StreamExt` also has a `throttle` method (one item per
/// period, on the timer). With both traits in scope, name the trait:
///
/// ```
/// use std::time::Duration;
/// use paced::{PaceExt, Rate, Shaping};
/// use tokio_stream::StreamExt; // its own `throttle(Duration)` is in scope too
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let start = tokio::time::Instant::now();
/// let paced = PaceExt::throttle(tokio_stream::iter(1..=3), Rate::per_second(2), |_| 1, 1, Shaping);
/// let items: Vec<_> = paced.collect().await;
/// assert_eq!(items, [1, 2, 3]);
/// assert_eq!(start.elapsed(), Duration::from_secs(1));
/// # }
/// ```
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use futures_util::StreamExt;
/// use paced::{PaceExt, Rate, Shaping};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // Operators compose: at most 5 per second, and never two within 100 ms.
/// let start = tokio::time::Instant::now();
/// let times: Vec<_> = futures_util::stream::iter(0..6)
///     .throttle(Rate::per_second(5), |_| 1, 5, Shaping)
///     .min_interval(Duration::from_millis(100))
///     .map(|_| start.elapsed().as_millis())
///     .collect()
///     .await;
/// assert_eq!(times, [0, 100, 200, 300, 400, 500]);
/// # }
/// ```
pub trait PaceExt: Stream {
    /// Paces items through a token bucket, each item costing `cost(&item)` tokens.
    ///
    /// The bucket holds at most `burst` tokens, starts full and refills at `rate`. An item
    /// leaves when the bucket holds its cost, which is then taken out: tokens are charged when
    /// the item is emitted, not when it is pulled from upstream. `mode` says what happens to an
    /// item that does not conform:
    ///
    /// - [`Shaping`](crate::Shaping) delays it until it conforms; the stream yields `S::Item`.
    ///   An item dearer than the whole bucket waits until the bucket is full and the rest of
    ///   its cost has flowed in, then leaves the bucket empty: with a bucket of 5 and a rate
    ///   of 10/s, items costing 5, 10, 1 leave at 0 ms, 1000 ms and 1100 ms.
    /// - [`Enforcing`](crate::Enforcing) never delays; the stream yields
    ///   `Result<S::Item, RateExceeded<S::Item>>`, with a non-conforming item handed back at
    ///   once in a [`RateExceeded`] that says how long until it would have
    ///   conformed. A refused item takes no tokens. An item dearer than `burst` never conforms:
    ///   its `retry_after()` is `Duration::MAX`.
    ///
    /// **Bound.** When no cost exceeds `burst`, the total cost emitted in any window
    /// `[t, t + w]` is at most `burst + w * rate`. So `burst` is the most that may leave at
    /// one instant, and over a long run the rate is `rate`. `burst = 1` with unit costs is one
    /// item every `1 / rate`.
    ///
    /// **Exactness.** The rate is kept as an exact fraction and deadlines are computed in
    /// integer nanoseconds, rounded up. tokio's timer wakes up to two ticks late, and tokens
    /// that flow into a full bucket meanwhile are lost. A bucket with spare tokens for 3 ms
    /// absorbs that and sleeps on the tick; a smaller one (burst 1) ends its waits on time on
    /// Linux (on paced's timer thread, one per process), and keeps the rate asked
    /// with the burst asked (0.91 to 0.996 of 100 to 1,000/s on the test VM, most runs 0.98 and
    /// more; 0.44 to 0.90 on the tick). Where there is
    /// no such timer (other systems), give a `burst` of at least `rate * 2 ms + 1`, and
    /// more on a loaded machine, so that one wake-up can release everything that flowed in
    /// since the last; then the long-run rate is `rate` (within 1 % in the benchmarks, from
    /// 1,000 to 1,000,000 items/s).
    ///
    /// # Panics
    ///
    /// Panics if `burst` is 0: no item could ever pass (message `"PaceExt::throttle: {error}"`,
    /// the [`ConfigError`]). Use [`try_throttle`](PaceExt::try_throttle)
    /// for a burst from configuration.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use paced::{PaceExt, Rate, Shaping};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let start = Instant::now();
    /// let mut s = std::pin::pin!(futures_util::stream::iter(0..12)
    ///     .throttle(Rate::per_second(10), |_| 1, 5, Shaping));
    /// let mut times = Vec::new();
    /// while let Some(_) = s.next().await {
    ///     times.push(start.elapsed().as_millis());
    /// }
    /// // Five at once (the burst), then one every 100 ms.
    /// assert_eq!(times, [0, 0, 0, 0, 0, 100, 200, 300, 400, 500, 600, 700]);
    /// # }
    /// ```
    #[track_caller]
    fn throttle<F, M>(self, rate: Rate, cost: F, burst: u64, mode: M) -> Throttle<Self, F, M>
    where
        Self: Sized,
        F: FnMut(&Self::Item) -> u64,
        M: ThrottleMode,
    {
        ConfigError::or_panic(
            self.try_throttle(rate, cost, burst, mode),
            "PaceExt::throttle",
        )
    }

    /// [`throttle`](PaceExt::throttle), or a [`ConfigError`] for a burst that cannot be: for a
    /// burst that comes from configuration.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroBurst`] if `burst` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{ConfigError, PaceExt, Rate, Shaping};
    ///
    /// let burst_from_config = 0;
    /// let paced = futures_util::stream::iter([1, 2])
    ///     .try_throttle(Rate::per_second(5), |_| 1, burst_from_config, Shaping);
    /// assert_eq!(paced.err(), Some(ConfigError::ZeroBurst));
    /// ```
    fn try_throttle<F, M>(
        self,
        rate: Rate,
        cost: F,
        burst: u64,
        mode: M,
    ) -> Result<Throttle<Self, F, M>, ConfigError>
    where
        Self: Sized,
        F: FnMut(&Self::Item) -> u64,
        M: ThrottleMode,
    {
        Throttle::try_new(self, rate, cost, burst, mode)
    }

    /// Keeps consecutive items at least `interval` apart.
    ///
    /// The gap is counted from the previous item's *emission*, as read from the clock when it
    /// left, not from a timer tick: a late or skewed timer can only make gaps longer, never
    /// shorter. An item that arrives after the gap has passed leaves at once. An `interval` of
    /// zero passes everything through without reading the clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures_util::StreamExt;
    /// use paced::PaceExt;
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let start = Instant::now();
    /// let times: Vec<_> = futures_util::stream::iter(0..3)
    ///     .min_interval(Duration::from_millis(100))
    ///     .map(|_| start.elapsed().as_millis())
    ///     .collect()
    ///     .await;
    /// assert_eq!(times, [0, 100, 200]);
    /// # }
    /// ```
    fn min_interval(self, interval: Duration) -> MinInterval<Self>
    where
        Self: Sized,
    {
        MinInterval::new(self, interval)
    }

    /// Groups items into batches of at most `max_batch`, at most one batch per `interval`.
    ///
    /// A batch leaves at the first moment the interval allows and at least one item is there,
    /// holding every item that has arrived by then, up to `max_batch`; the rest wait for the
    /// next batch. Consecutive batches are at least `interval` apart, counted from the previous
    /// batch's emission. Never an empty batch; at most `max_batch` items are held, so a full
    /// batch stops pulling from upstream. One timer wake-up releases a whole batch, which is
    /// how to pace beyond the 1,000 wake-ups per second of tokio's 1 ms timer.
    ///
    /// # Panics
    ///
    /// Panics if `max_batch` is 0, with the message `"PaceExt::batched_interval: {error}"` (the
    /// [`ConfigError`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures_util::StreamExt;
    /// use paced::PaceExt;
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let start = Instant::now();
    /// let batches: Vec<_> = futures_util::stream::iter(0..10)
    ///     .batched_interval(3, Duration::from_millis(100))
    ///     .map(|batch| (batch, start.elapsed().as_millis()))
    ///     .collect()
    ///     .await;
    /// assert_eq!(batches, [
    ///     (vec![0, 1, 2], 0),
    ///     (vec![3, 4, 5], 100),
    ///     (vec![6, 7, 8], 200),
    ///     (vec![9], 300),
    /// ]);
    /// # }
    /// ```
    #[track_caller]
    fn batched_interval(self, max_batch: usize, interval: Duration) -> BatchedInterval<Self>
    where
        Self: Sized,
    {
        ConfigError::or_panic(
            self.try_batched_interval(max_batch, interval),
            "PaceExt::batched_interval",
        )
    }

    /// [`batched_interval`](PaceExt::batched_interval), or a [`ConfigError`] for a batch size
    /// that cannot be: for a size that comes from configuration.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroBatch`] if `max_batch` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{ConfigError, PaceExt};
    ///
    /// let batches = futures_util::stream::iter([1, 2]).try_batched_interval(0, Duration::from_secs(1));
    /// assert_eq!(batches.err(), Some(ConfigError::ZeroBatch));
    /// ```
    fn try_batched_interval(
        self,
        max_batch: usize,
        interval: Duration,
    ) -> Result<BatchedInterval<Self>, ConfigError>
    where
        Self: Sized,
    {
        BatchedInterval::try_new(self, max_batch, interval)
    }

    /// Lets at most `k` items through in any window of length `period`.
    ///
    /// Item `i` leaves no earlier than item `i - k` left plus `period`: a semaphore of `k`
    /// permits, each given back `period` after it was taken. Use it to start thousands of
    /// consumers a few at a time instead of all at once. A `period` of zero passes everything
    /// through.
    ///
    /// # Panics
    ///
    /// Panics if `k` is 0, with the message `"PaceExt::staggered_start: {error}"` (the
    /// [`ConfigError`]). Use
    /// [`try_staggered_start`](PaceExt::try_staggered_start) for a `k` from configuration.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures_util::StreamExt;
    /// use paced::PaceExt;
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let start = Instant::now();
    /// let times: Vec<_> = futures_util::stream::iter(0..5)
    ///     .staggered_start(2, Duration::from_secs(1))
    ///     .map(|_| start.elapsed().as_secs())
    ///     .collect()
    ///     .await;
    /// assert_eq!(times, [0, 0, 1, 1, 2]);
    /// # }
    /// ```
    #[track_caller]
    fn staggered_start(self, k: usize, period: Duration) -> StaggeredStart<Self>
    where
        Self: Sized,
    {
        ConfigError::or_panic(
            self.try_staggered_start(k, period),
            "PaceExt::staggered_start",
        )
    }

    /// [`staggered_start`](PaceExt::staggered_start), or a [`ConfigError`] for a `k` that
    /// cannot be: for a `k` that comes from configuration.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroStarts`] if `k` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{ConfigError, PaceExt};
    ///
    /// let starts = futures_util::stream::iter([1, 2]).try_staggered_start(0, Duration::from_secs(1));
    /// assert_eq!(starts.err(), Some(ConfigError::ZeroStarts));
    /// ```
    fn try_staggered_start(
        self,
        k: usize,
        period: Duration,
    ) -> Result<StaggeredStart<Self>, ConfigError>
    where
        Self: Sized,
    {
        StaggeredStart::try_new(self, k, period)
    }

    /// Like [`throttle`](PaceExt::throttle), drawing on a shared [`Limiter`]: a
    /// [`RateLimiter`](crate::RateLimiter), a [`RateLimiter`](crate::RateLimiter)
    /// (several limits at once), or with the `redis` feature a limiter across machines. Any
    /// number of streams and tasks share it.
    ///
    /// `cost(&item)` returns the limiter's cost type: a `u64`, or for a
    /// `RateLimiter<[u64; N]>` one amount per dimension, `[u64; N]` (e.g. `|req| [1,
    /// req.estimate()]` for requests and tokens). An item is emitted when every limit has room
    /// for its amounts, all charged at that one instant, so every limit's bound holds for the
    /// emitted items. An estimate cannot be corrected here (the item is handed on, and its
    /// answer comes later): to settle from the answer, call
    /// [`RateLimiter::acquire`](crate::RateLimiter#method.acquire-1) and
    /// [`Permit::settle`](crate::limiter::Permit::settle), or use the tower layer's `settle`
    /// (feature `tower`).
    ///
    /// The limiter's bound holds across all its users together. [`Shaping`](crate::Shaping)
    /// waits in the limiter's queue, in arrival order with every other user, and charges the
    /// item when it is granted, which is the moment it is emitted; dropping the stream gives
    /// its place in the queue back. [`Enforcing`](crate::Enforcing) hands an item back at once
    /// as `Err(RateExceeded)` when the tokens are not there or others are waiting.
    ///
    /// On a `RedisRateLimiter`, an outage follows its failure policy, and when Redis answers
    /// with an error (a key of another type) nothing is let through: `Shaping` holds the item
    /// and asks again at a backoff of up to 1 s, `Enforcing` hands it back with a `retry_after`
    /// of 1 s, each failure counted in its `stats().reply_errors` and logged at error level
    /// with the `tracing` feature (see its "Outages and reply errors").
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use paced::{PaceExt, Rate, RateLimiter, Shaping};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// // Three partitions share one SMS provider's 5 messages per second.
    /// let provider = RateLimiter::new(Rate::per_second(5), 5);
    /// let partitions: Vec<_> = (0..3)
    ///     .map(|p| futures_util::stream::iter(0..5).map(move |m| (p, m)))
    ///     .map(|messages| Box::pin(messages.throttle_with(&provider, |_| 1, Shaping)))
    ///     .collect();
    /// let start = tokio::time::Instant::now();
    /// let sent = futures_util::stream::select_all(partitions).count().await;
    /// assert_eq!(sent, 15);
    /// // 5 at once, then 10 more at 5 per second.
    /// assert_eq!(start.elapsed().as_secs(), 2);
    /// # }
    /// ```
    ///
    /// Requests to an LLM, each costing one request and its estimated tokens:
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures_util::StreamExt;
    /// use paced::{Limit, RateLimiter, PaceExt, Rate, Shaping};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let llm = RateLimiter::builder(["requests", "tokens"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(10), 10))
    ///     .limit("tokens", Limit::bucket(Rate::per_second(1_000), 1_000))
    ///     .build()
    ///     .unwrap();
    /// let prompts = futures_util::stream::iter([600_u64, 400, 500]); // estimated tokens
    /// let start = tokio::time::Instant::now();
    /// let sent: Vec<_> = prompts
    ///     .throttle_with(&llm, |tokens| [1, *tokens], Shaping)
    ///     .map(|_| start.elapsed())
    ///     .collect()
    ///     .await;
    /// // 1,000 tokens at once, then 500 more at 1,000 per second.
    /// assert_eq!(sent, [Duration::ZERO, Duration::ZERO, Duration::from_millis(500)]);
    /// # }
    /// ```
    fn throttle_with<F, M, Q>(self, limiter: &Q, cost: F, mode: M) -> ThrottleWith<Self, F, M, Q>
    where
        Self: Sized,
        F: FnMut(&Self::Item) -> Q::Cost,
        M: ThrottleMode,
        Q: Limiter,
    {
        ThrottleWith::new(self, limiter, cost, mode)
    }

    /// Like [`staggered_start`](PaceExt::staggered_start), drawing on a shared [`Stagger`]: at
    /// most `k` items in any window of `period` among all its users.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures_util::StreamExt;
    /// use paced::{PaceExt, Stagger};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let stagger = Stagger::new(3, Duration::from_secs(1));
    /// let start = tokio::time::Instant::now();
    /// let times: Vec<_> = futures_util::stream::iter(0..7)
    ///     .staggered_start_with(&stagger)
    ///     .map(|_| start.elapsed().as_secs())
    ///     .collect()
    ///     .await;
    /// assert_eq!(times, [0, 0, 0, 1, 1, 1, 2]);
    /// # }
    /// ```
    fn staggered_start_with(self, stagger: &Stagger) -> StaggeredStartWith<Self>
    where
        Self: Sized,
    {
        StaggeredStartWith::new(self, stagger)
    }

    /// Paces items per key: each item costs `cost(&item)` tokens of the bucket that `limiter`
    /// keeps for `key(&item)`, and no key holds up another. `limiter` is any [`KeyedLimiter`]: a
    /// [`KeyedRateLimiter`](crate::KeyedRateLimiter) or, with the `redis` feature, a
    /// `RedisKeyedRateLimiter` shared by a fleet; or a `KeyedRateLimiter<K, [u64; N]>`,
    /// several limits per key, whose
    /// cost is one amount per dimension (`|item| [1, item.tokens]`), each item leaving at the
    /// latest of its key's limits' waits.
    ///
    /// The adapter holds up to `capacity` items. An item whose key has nothing held and whose
    /// bucket holds its cost leaves at once, even while items of other keys wait; the others
    /// are held, in upstream order per key, and each leaves when its key allows (plus tokio's
    /// 1 ms tick), never later because of another key. With `capacity` items held the adapter
    /// pulls nothing more from upstream until one leaves, so memory is bounded by `capacity`.
    /// After upstream ends, what is held still leaves, each at its time, then `None`.
    ///
    /// **Promises**, key by key, as [`throttle`](PaceExt::throttle): when no cost exceeds the
    /// key's burst, the cost emitted for a key in any window `[t, t + w]` is at most
    /// `burst + w * rate` (counting every stream and task that uses the limiter), a key's items
    /// leave in their upstream order, and nothing is lost or duplicated. Tokens are charged
    /// when an item leaves.
    ///
    /// **Sharing.** The limiter's buckets are shared by every stream and task that uses it.
    /// The oldest held item of each key waits in the key's FIFO queue with the other users of
    /// the key; the items behind it wait in the adapter and join the queue when they become
    /// the oldest. One timer serves the whole adapter (the earliest deadline among the held
    /// items), and it is armed only while something is held.
    ///
    /// **Over Redis.** With a `RedisKeyedRateLimiter`, the oldest held item of each key waits
    /// by the Redis limiter's own `acquire` (a reservation charged in Redis, then a local
    /// sleep; leases, retries and the failure policy as for any caller), one request per key
    /// at a time: a key's items still leave in upstream order, and across processes a key's
    /// requests are served in the order they reach Redis. The stream never fails: while
    /// Redis is unreachable, `FailClosed` holds the items (nothing is lost) and `FailOpen`
    /// grants from the local fallback. A Redis reply error on a key (a key of another type)
    /// holds that key's items and asks again after 100 ms, then at a backoff doubling up to
    /// 1 s, each failure counted in the limiter's `stats().reply_errors` and logged at error
    /// level (feature `tracing`); the other keys go on, and the key's items leave once it is
    /// repaired. See [`KeyedLimiter`].
    ///
    /// The key type needs `Hash + Eq + Clone` (and `Display + Send + Sync + 'static` for
    /// Redis); the key function and the cost function run outside any lock, so a panic in
    /// either propagates and leaves the limiter usable.
    ///
    /// # Panics
    ///
    /// Panics if `capacity` is 0: no item could ever be held (message
    /// `"PaceExt::throttle_by_key: {error}"`, the [`ConfigError`]). Use
    /// [`try_throttle_by_key`](PaceExt::try_throttle_by_key) for a capacity from configuration.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use paced::{KeyedRateLimiter, PaceExt, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// // SMS providers: "a" takes 2 messages per second, "b" 5 per second, one at a time.
    /// let providers = KeyedRateLimiter::new(Rate::per_second(2), 1);
    /// providers.set_limit(&"b", Rate::per_second(5), 1);
    /// let messages = futures_util::stream::iter([("a", 1), ("a", 2), ("a", 3), ("b", 4), ("b", 5)]);
    /// let start = tokio::time::Instant::now();
    /// let sent: Vec<_> = messages
    ///     .throttle_by_key(&providers, |m| m.0, |_| 1, 64)
    ///     .map(|m| (m.1, start.elapsed().as_millis()))
    ///     .collect()
    ///     .await;
    /// // "b" is not held up by the backlog of "a".
    /// assert_eq!(sent, [(1, 0), (4, 0), (5, 200), (2, 500), (3, 1000)]);
    /// # }
    /// ```
    #[track_caller]
    fn throttle_by_key<Q, KF, F>(
        self,
        limiter: &Q,
        key: KF,
        cost: F,
        capacity: usize,
    ) -> ThrottleByKey<Self, Q::Key, KF, F, Q::Hasher, Q>
    where
        Self: Sized,
        Q: KeyedLimiter,
        KF: FnMut(&Self::Item) -> Q::Key,
        F: FnMut(&Self::Item) -> Q::Cost,
    {
        ConfigError::or_panic(
            self.try_throttle_by_key(limiter, key, cost, capacity),
            "PaceExt::throttle_by_key",
        )
    }

    /// [`throttle_by_key`](PaceExt::throttle_by_key), or a [`ConfigError`] for a capacity
    /// that cannot be: for a capacity that comes from configuration.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroCapacity`] if `capacity` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{ConfigError, KeyedRateLimiter, PaceExt, Rate};
    ///
    /// let limiter = KeyedRateLimiter::new(Rate::per_second(1), 1);
    /// let paced = futures_util::stream::iter([1, 2]).try_throttle_by_key(&limiter, |n| *n, |_| 1, 0);
    /// assert_eq!(paced.err(), Some(ConfigError::ZeroCapacity));
    /// ```
    // The adapter's type spells out the limiter's key and hasher, as `throttle_by_key`'s does.
    #[allow(clippy::type_complexity)]
    fn try_throttle_by_key<Q, KF, F>(
        self,
        limiter: &Q,
        key: KF,
        cost: F,
        capacity: usize,
    ) -> Result<ThrottleByKey<Self, Q::Key, KF, F, Q::Hasher, Q>, ConfigError>
    where
        Self: Sized,
        Q: KeyedLimiter,
        KF: FnMut(&Self::Item) -> Q::Key,
        F: FnMut(&Self::Item) -> Q::Cost,
    {
        ThrottleByKey::try_new(self, limiter, key, cost, capacity)
    }
}

impl<S: Stream + ?Sized> PaceExt for S {}
