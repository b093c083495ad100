//! Pacing for Sinks: [`PaceSinkExt`] gives every `futures::Sink` the operators `throttle`,
//! `throttle_with` and `min_interval`, and this module holds the types they return. They keep
//! the promises of the stream operators of the same names.

use std::time::Duration;

use futures_sink::Sink;

use crate::error::ConfigError;
use crate::limiter::Limiter;
use crate::rate::Rate;

/// What every sink adapter forwards to its `PacedSink` field `inner`: `Sink`, a pass-through
/// `Stream` (for a framed socket paced on its writing side), the accessors and `Debug`.
/// `$pace` bounds what pacing needs (the cost function's type); `$make` is the expression that
/// builds the adapter over a `Vec<u32>` in the doctests.
macro_rules! sink_adapter {
    (
        $adapter:ident [$($bound:tt)*] [$($param:tt)*],
        where [$($pace:tt)*],
        $make:literal
    ) => {
        impl<$($bound)*> $adapter<$($param)*> {
            /// A reference to the underlying sink.
            ///
            /// # Examples
            ///
            /// ```
            /// use std::time::Duration;
            /// use paced::{PaceSinkExt, Rate};
            ///
            #[doc = concat!("let sink = ", $make, ";")]
            /// assert!(sink.get_ref().is_empty());
            /// ```
            pub fn get_ref(&self) -> &Si {
                self.inner.get_ref()
            }

            /// A mutable reference to the underlying sink. Items given to it directly are not
            /// paced.
            ///
            /// # Examples
            ///
            /// ```
            /// use std::time::Duration;
            /// use paced::{PaceSinkExt, Rate};
            ///
            #[doc = concat!("let mut sink = ", $make, ";")]
            /// sink.get_mut().push(7);
            /// assert_eq!(sink.get_ref(), &[7]);
            /// ```
            pub fn get_mut(&mut self) -> &mut Si {
                self.inner.get_mut()
            }

            /// A pinned mutable reference to the underlying sink. Items given to it directly
            /// are not paced.
            ///
            /// # Examples
            ///
            /// ```
            /// use std::time::Duration;
            /// use paced::{PaceSinkExt, Rate};
            ///
            #[doc = concat!("let mut sink = std::pin::pin!(", $make, ");")]
            /// assert!(sink.as_mut().get_pin_mut().is_empty());
            /// ```
            pub fn get_pin_mut(self: std::pin::Pin<&mut Self>) -> std::pin::Pin<&mut Si> {
                self.project().inner.get_pin_mut()
            }

            /// The underlying sink. An item still held is dropped, charged nothing.
            ///
            /// # Examples
            ///
            /// ```
            /// use std::time::Duration;
            /// use paced::{PaceSinkExt, Rate};
            ///
            #[doc = concat!("let sink = ", $make, ";")]
            /// let vec: Vec<u32> = sink.into_inner();
            /// assert!(vec.is_empty());
            /// ```
            pub fn into_inner(self) -> Si {
                self.inner.into_inner()
            }

            /// The item given to `start_send` that waits for its time, if any.
            ///
            /// # Examples
            ///
            /// ```
            /// use std::time::Duration;
            /// use futures_util::SinkExt;
            /// use paced::{PaceSinkExt, Rate};
            ///
            /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
            /// # async fn main() {
            #[doc = concat!("let mut sink = std::pin::pin!(", $make, ");")]
            /// sink.feed(1).await.unwrap(); // conforms: handed on at once
            /// sink.feed(2).await.unwrap(); // held until its time
            /// assert_eq!(sink.get_ref(), &[1]);
            /// assert_eq!(sink.held(), Some(&2));
            /// # }
            /// ```
            pub fn held(&self) -> Option<&Item> {
                self.inner.held()
            }

            /// Takes back the item that waits for its time, if any, charging nothing for it:
            /// to reroute it after the inner sink failed, for instance. The sink is then ready
            /// for another item.
            ///
            /// # Examples
            ///
            /// ```
            /// use std::time::Duration;
            /// use futures_util::SinkExt;
            /// use paced::{PaceSinkExt, Rate};
            ///
            /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
            /// # async fn main() {
            #[doc = concat!("let mut sink = std::pin::pin!(", $make, ");")]
            /// sink.feed(1).await.unwrap();
            /// sink.feed(2).await.unwrap();
            /// assert_eq!(sink.as_mut().take_held(), Some(2));
            /// assert_eq!(sink.held(), None);
            /// # }
            /// ```
            pub fn take_held(self: std::pin::Pin<&mut Self>) -> Option<Item>
            where
                $($pace)*
            {
                self.project().inner.take_held()
            }
        }

        impl<$($bound)*> futures_sink::Sink<Item> for $adapter<$($param)*>
        where
            Si: futures_sink::Sink<Item>,
            $($pace)*
        {
            type Error = Si::Error;

            fn poll_ready(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Result<(), Si::Error>> {
                self.project().inner.poll_ready(cx)
            }

            fn start_send(self: std::pin::Pin<&mut Self>, item: Item) -> Result<(), Si::Error> {
                self.project().inner.start_send(item)
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Result<(), Si::Error>> {
                self.project().inner.poll_flush(cx)
            }

            fn poll_close(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Result<(), Si::Error>> {
                self.project().inner.poll_close(cx)
            }
        }

        /// The underlying sink's items, unpaced: pacing one side of a framed socket leaves
        /// the other readable.
        impl<$($bound)*> futures_core::Stream for $adapter<$($param)*>
        where
            Si: futures_core::Stream,
        {
            type Item = Si::Item;

            fn poll_next(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<Si::Item>> {
                self.project().inner.poll_next(cx)
            }

            fn size_hint(&self) -> (usize, Option<usize>) {
                self.inner.size_hint()
            }
        }

        impl<$($bound)*> std::fmt::Debug for $adapter<$($param)*>
        where
            Si: std::fmt::Debug,
            Item: std::fmt::Debug,
        {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($adapter))
                    .field("inner", &self.inner)
                    .finish()
            }
        }
    };
}

mod min_interval;
mod paced;
mod throttle;
mod throttle_with;

pub use min_interval::MinInterval;
pub use throttle::Throttle;
pub use throttle_with::ThrottleWith;

/// Pacing operators for every [`Sink`]: pace where the items are written, not where they are
/// read.
///
/// An item given to `start_send` is handed to the inner sink at once if it conforms, and is
/// otherwise **held** until it does. While an item is held, `poll_ready` is pending, so the
/// writer waits; `poll_ready` says ready only when nothing is held and the inner sink is ready.
/// The held item is handed on by whichever of `poll_ready`, `poll_flush` or `poll_close` is
/// polled at or after its time, and `poll_flush` and `poll_close` flush or close the inner sink
/// only after it has gone: `SinkExt::send` and `send_all` do all of this for you. While the
/// held item waits for its time, the adapter flushes the inner sink, so what a buffering sink
/// (a `FramedWrite`) already holds goes out at its time, also under `send_all`, which flushes
/// only at the end.
///
/// **Promises**, as for the stream operators of [`PaceExt`](crate::PaceExt): items reach the
/// inner sink in order, none is lost or duplicated, the bound of each operator holds for the
/// items handed to the inner sink, and a held item goes within tokio's 1 ms timer tick of the
/// moment it conforms, provided the sink is being polled and the inner sink is ready. Building
/// an adapter needs no runtime; its one timer is created on the first wait and armed only
/// while an item is held, so an idle sink costs no wake-ups.
///
/// **Charging.** Tokens are taken when an item is handed to the inner sink, and only once the
/// inner sink is ready for it: the adapter polls the inner sink's `poll_ready` *before* asking
/// the bucket or the shared limiter, so no tokens are taken for an item stuck behind a full
/// channel or socket. An item that is never handed on (the adapter dropped, or the item taken
/// back with `take_held`) is charged nothing, and with a shared limiter its place in the queue
/// goes to the next waiter. If the inner sink stops being ready (or fails) while the held item
/// waits in a shared limiter's queue, the item gives up its place and joins again at the back
/// once the sink is ready: a stuck sink does not hold up the limiter's other users.
///
/// **Errors.** An error of the inner sink comes out of `poll_ready`, `poll_flush` or
/// `poll_close` unchanged. The held item is not lost: it stays held, and the next
/// `poll_ready`, `poll_flush` or `poll_close` tries to hand it on again (a sink that recovers
/// gets it). To give up on it, take it back with `take_held` (charged nothing) or drop the
/// adapter (it is dropped, charged nothing). If the inner sink's `start_send` itself fails,
/// the item was handed to it and is charged; what became of it is that sink's to say.
///
/// **The `Sink` contract.** As for every sink, `start_send` may only follow a `poll_ready`
/// that returned `Ready(Ok(()))`. Calling it while an item is still held panics, naming the
/// mistake, rather than dropping or reordering an item.
///
/// **Names.** The methods have the names of their stream counterparts. A type that is both a
/// `Stream` and a `Sink`, such as a framed socket, sees both with [`PaceExt`](crate::PaceExt)
/// in scope too: call `PaceSinkExt::throttle(framed, ...)` (or `PaceExt::throttle` for the
/// reading side), or split it first with `StreamExt::split`. The adapters pass the inner
/// sink's `Stream` through unpaced, so pacing the writing side keeps the reading side.
///
/// # Examples
///
/// ```
/// use futures_util::SinkExt;
/// use paced::{PaceSinkExt, Rate};
/// use tokio_util::sync::PollSender;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let (tx, mut rx) = tokio::sync::mpsc::channel::<u32>(16);
/// // At most 10 items per second into the channel, 2 at once.
/// let mut tx = std::pin::pin!(PollSender::new(tx).throttle(Rate::per_second(10), |_| 1, 2));
/// let start = tokio::time::Instant::now();
/// for n in 0..4 {
///     tx.send(n).await.unwrap();
/// }
/// assert_eq!(start.elapsed().as_millis(), 200);
/// for n in 0..4 {
///     assert_eq!(rx.recv().await, Some(n));
/// }
/// # }
/// ```
pub trait PaceSinkExt<Item>: Sink<Item> {
    /// Hands items to the sink through a token bucket, each costing `cost(&item)` tokens.
    ///
    /// The bucket holds at most `burst` tokens, starts full and refills at `rate`, exactly as
    /// for [`PaceExt::throttle`](crate::PaceExt::throttle) with [`Shaping`](crate::Shaping):
    /// when no cost exceeds `burst`, the total cost handed to the inner sink in any window
    /// `[t, t + w]` is at most `burst + w * rate`, and an item dearer than the bucket waits
    /// until the bucket is full and the rest of its cost has flowed in.
    ///
    /// # Panics
    ///
    /// Panics if `burst` is 0: no item could ever pass (message
    /// `"PaceSinkExt::throttle: {error}"`, the [`ConfigError`]). Use
    /// [`try_throttle`](PaceSinkExt::try_throttle) for a burst from configuration.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::SinkExt;
    /// use paced::{PaceSinkExt, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let (tx, rx) = futures_channel::mpsc::unbounded::<String>();
    /// // 100 bytes per second, 50 at once: the cost of a message is its length.
    /// let mut tx = std::pin::pin!(tx.throttle(Rate::per_second(100), |m| m.len() as u64, 50));
    /// let start = tokio::time::Instant::now();
    /// tx.send("a".repeat(50)).await.unwrap(); // the whole burst, at once
    /// tx.send("b".repeat(25)).await.unwrap(); // 25 more bytes: 250 ms later
    /// assert_eq!(start.elapsed().as_millis(), 250);
    /// # drop(rx);
    /// # }
    /// ```
    #[track_caller]
    fn throttle<F>(self, rate: Rate, cost: F, burst: u64) -> Throttle<Self, Item, F>
    where
        Self: Sized,
        F: FnMut(&Item) -> u64,
    {
        ConfigError::or_panic(
            self.try_throttle(rate, cost, burst),
            "PaceSinkExt::throttle",
        )
    }

    /// [`throttle`](PaceSinkExt::throttle), or a [`ConfigError`] for a burst that cannot be:
    /// for a burst that comes from configuration.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroBurst`] if `burst` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{ConfigError, PaceSinkExt, Rate};
    ///
    /// let sink = Vec::<u32>::new().try_throttle(Rate::per_second(5), |_| 1, 0);
    /// assert_eq!(sink.err(), Some(ConfigError::ZeroBurst));
    /// ```
    fn try_throttle<F>(
        self,
        rate: Rate,
        cost: F,
        burst: u64,
    ) -> Result<Throttle<Self, Item, F>, ConfigError>
    where
        Self: Sized,
        F: FnMut(&Item) -> u64,
    {
        Throttle::try_new(self, rate, cost, burst)
    }

    /// Like [`throttle`](PaceSinkExt::throttle), drawing on a shared [`Limiter`]: a
    /// [`RateLimiter`](crate::RateLimiter), a [`Stagger`](crate::Stagger) (every item takes
    /// one place, whatever its cost), a [`RateLimiter`](crate::RateLimiter) (several
    /// limits at once: `cost(&item)` returns one amount per dimension, `[u64; N]`, all charged
    /// at one instant) or with the `redis` feature a limiter across machines.
    ///
    /// The held item waits in the limiter's queue, in arrival order with every other user
    /// (streams, tasks, other sinks), and is charged when it is granted, right before it is
    /// handed to the inner sink. The queue is joined when the sink is next polled after
    /// `start_send` (`send` does so at once) and only while the inner sink is ready. (A
    /// `RedisRateLimiter`'s wait is a reservation: the tokens are taken in Redis when the item
    /// starts waiting, still only once the inner sink is ready, and given back if the item is
    /// dropped before its turn; when Redis answers with an error, the item is held and asked
    /// for again at a backoff of up to 1 s, as in `PaceExt::throttle_with`.)
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::SinkExt;
    /// use paced::{PaceSinkExt, Rate, RateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// // One provider's 5 messages per second, shared by two writers.
    /// let provider = RateLimiter::new(Rate::per_second(5), 5);
    /// let write = |limiter: &RateLimiter| {
    ///     let mut sink = Box::pin(Vec::new().throttle_with(limiter, |_: &u32| 1));
    ///     async move {
    ///         for n in 0..5 {
    ///             sink.send(n).await.unwrap();
    ///         }
    ///     }
    /// };
    /// let start = tokio::time::Instant::now();
    /// tokio::join!(write(&provider), write(&provider));
    /// // 5 at once, then 5 more at 5 per second.
    /// assert_eq!(start.elapsed().as_secs(), 1);
    /// # }
    /// ```
    ///
    /// Writing requests for an LLM, each one request and its estimated tokens:
    ///
    /// ```
    /// use futures_util::SinkExt;
    /// use paced::{Limit, RateLimiter, PaceSinkExt, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let llm = RateLimiter::builder(["requests", "tokens"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(2), 2))
    ///     .limit("tokens", Limit::bucket(Rate::per_second(1_000), 10_000))
    ///     .build()
    ///     .unwrap();
    /// let mut sink = Box::pin(Vec::new().throttle_with(&llm, |tokens: &u64| [1, *tokens]));
    /// let start = tokio::time::Instant::now();
    /// for tokens in [100, 100, 100] {
    ///     sink.send(tokens).await.unwrap();
    /// }
    /// // Tokens to spare; the third request waits 500 ms for the requests limit.
    /// assert_eq!(start.elapsed().as_millis(), 500);
    /// assert_eq!(sink.get_ref().len(), 3);
    /// # }
    /// ```
    fn throttle_with<F, Q>(self, limiter: &Q, cost: F) -> ThrottleWith<Self, Item, F, Q>
    where
        Self: Sized,
        F: FnMut(&Item) -> Q::Cost,
        Q: Limiter,
    {
        ThrottleWith::new(self, limiter, cost)
    }

    /// Hands items to the sink at least `interval` apart.
    ///
    /// The gap is counted from the moment the previous item was handed to the inner sink, as
    /// read from the clock then: a late timer can only make gaps longer. An `interval` of zero
    /// passes everything through without reading the clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures_util::SinkExt;
    /// use paced::PaceSinkExt;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let mut sink = std::pin::pin!(Vec::new().min_interval(Duration::from_millis(100)));
    /// let start = tokio::time::Instant::now();
    /// for n in 0..3 {
    ///     sink.send(n).await.unwrap();
    /// }
    /// assert_eq!(sink.get_ref(), &[0, 1, 2]);
    /// assert_eq!(start.elapsed().as_millis(), 200);
    /// # }
    /// ```
    fn min_interval(self, interval: Duration) -> MinInterval<Self, Item>
    where
        Self: Sized,
    {
        MinInterval::new(self, interval)
    }
}

impl<Si: Sink<Item> + ?Sized, Item> PaceSinkExt<Item> for Si {}
