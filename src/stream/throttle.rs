//! `throttle`: a token bucket with a cost per item, shaping or enforcing.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::stream::FusedStream;
use futures_core::Stream;
use pin_project_lite::pin_project;

use super::paced::{exceeded, Paced};
use crate::core::{Bucket, ByItem};
use crate::error::{ConfigError, RateExceeded};
use crate::mode::{Enforcing, Shaping};
use crate::rate::Rate;

pin_project! {
    /// Stream for [`throttle`](crate::PaceExt::throttle): a token bucket with a cost per item.
    ///
    /// With [`Shaping`] it yields `S::Item`, each item delayed until it conforms; with
    /// [`Enforcing`] it yields `Result<S::Item, RateExceeded<S::Item>>` without delay.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use paced::stream::Throttle;
    /// use paced::{PaceExt, Rate, Shaping};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// // Requests cost their size in bytes: at most 1 KiB per second, 512 B at once.
    /// let requests = futures_util::stream::iter([vec![0u8; 512], vec![0u8; 512]]);
    /// let paced: Throttle<_, _, Shaping> =
    ///     requests.throttle(Rate::per_second(1024), |r| r.len() as u64, 512, Shaping);
    /// let start = tokio::time::Instant::now();
    /// assert_eq!(paced.count().await, 2);
    /// assert_eq!(start.elapsed().as_millis(), 500);
    /// # }
    /// ```
    #[must_use = "streams do nothing unless polled"]
    pub struct Throttle<S: Stream, F, M> {
        #[pin]
        inner: Paced<S, Bucket, ByItem<F>>,
        mode: M,
    }
}

impl<S: Stream, F, M> Throttle<S, F, M> {
    pub(crate) fn try_new(
        stream: S,
        rate: Rate,
        cost: F,
        burst: u64,
        mode: M,
    ) -> Result<Self, ConfigError> {
        Ok(Throttle {
            inner: Paced::costed(stream, Bucket::try_of(rate, burst)?, ByItem(cost)),
            mode,
        })
    }
}

impl<S: Stream, F> Throttle<S, F, Shaping> {
    /// Ends every wait on time, even where the bucket would absorb a late wake-up; at the
    /// price of CPU time while waiting where the system has no high-resolution timer.
    ///
    /// tokio's timer fires on 1 ms ticks, so a `Sleep` wakes up to two ticks late. A wait for
    /// which that would cost rate (burst 1, or spare tokens for less than 3 ms) already ends
    /// on time by default on Linux: paced's timer thread wakes the task shortly before its
    /// time, and the task yields for the last few microseconds (as late as 4 in 5 recent
    /// wake-ups were, at most 200 µs). With `precise` every wait does, and the task is woken
    /// earlier (as late as 19 in 20 recent wake-ups were), so each item leaves within
    /// microseconds of its time, even 100 µs apart.
    ///
    /// Where there is no such timer (other systems, or the thread could not be started),
    /// `precise` sleeps until two ticks before an item's time and spends the rest yielding
    /// to the scheduler and reading the clock again. **That costs CPU**: the task stays busy
    /// for up to two ticks per wait (it yields, so other tasks on the runtime still run);
    /// without `precise` nothing there ever spins. Under paused time the clock does not move
    /// across a yield, so the wait falls back to the timer and the schedule is exactly that of
    /// the plain operator.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures_util::StreamExt;
    /// use paced::{PaceExt, Rate, Shaping};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// // 10,000 per second, one at a time: evenly, 100 µs apart.
    /// let start = std::time::Instant::now();
    /// let n = futures_util::stream::repeat(())
    ///     .take(101)
    ///     .throttle(Rate::per_second(10_000), |_| 1, 1, Shaping)
    ///     .precise()
    ///     .count()
    ///     .await;
    /// assert_eq!(n, 101);
    /// assert!(start.elapsed() >= Duration::from_millis(10));
    /// # }
    /// ```
    pub fn precise(mut self) -> Self {
        self.inner.set_precise();
        self
    }
}

accessors!(
    Throttle [S: Stream, F, M] [S, F, M],
    inner,
    "futures_util::stream::iter([1, 2, 3]).throttle(Rate::per_second(1), |_| 1, 1, Shaping)"
);

forward_stream!(
    Throttle [S: Stream, F: FnMut(&S::Item) -> u64] [S, F, Shaping],
    S::Item,
    |me, cx| me.inner.poll_paced(cx)
);

forward_stream!(
    Throttle [S: Stream, F: FnMut(&S::Item) -> u64] [S, F, Enforcing],
    Result<S::Item, RateExceeded<S::Item>>,
    |me, cx| me.inner.poll_checked(cx).map(|next| next.map(exceeded))
);

debug_adapter!(Throttle [S, F, M] [M: fmt::Debug], inner, mode);
