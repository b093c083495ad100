//! `min_interval`: at least `d` between emissions, counted from the previous emission.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::stream::FusedStream;
use futures_core::Stream;
use pin_project_lite::pin_project;

use super::paced::Paced;
use crate::core::{Bucket, Nanos};

pin_project! {
    /// Stream for [`min_interval`](crate::PaceExt::min_interval): consecutive items at least
    /// `interval` apart.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures_util::StreamExt;
    /// use paced::stream::MinInterval;
    /// use paced::PaceExt;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let sms = futures_util::stream::iter(["hi", "there"]);
    /// let paced: MinInterval<_> = sms.min_interval(Duration::from_millis(200));
    /// let start = tokio::time::Instant::now();
    /// assert_eq!(paced.collect::<Vec<_>>().await, ["hi", "there"]);
    /// assert_eq!(start.elapsed(), Duration::from_millis(200));
    /// # }
    /// ```
    #[must_use = "streams do nothing unless polled"]
    pub struct MinInterval<S: Stream> {
        #[pin]
        inner: Paced<S, Bucket>,
    }
}

impl<S: Stream> MinInterval<S> {
    pub(crate) fn new(stream: S, interval: Duration) -> Self {
        // A bucket of one token that refills once per interval: the gap is counted from the
        // actual emission, because the bucket is always empty right after one.
        let bucket = Bucket::interval(Nanos::from_duration(interval));
        MinInterval {
            inner: Paced::new(stream, bucket),
        }
    }
}

impl<S: Stream> MinInterval<S> {
    /// Waits below tokio's 1 ms tick precisely, at the price of CPU time while waiting.
    ///
    /// tokio's timer fires on 1 ms ticks, so an item that waits leaves up to a tick late, and
    /// a stream that waits before every item tops out near 1,000 items per second. With
    /// `precise`, the timer sleeps only until one tick before an item's time and the rest of
    /// the wait is spent yielding to the scheduler and reading the clock again, so the item
    /// leaves within microseconds of its time and sub-millisecond pacing keeps its rate.
    ///
    /// **This costs CPU**: while an item is less than a tick from its time, the task stays
    /// busy (it yields, so other tasks on the runtime still run). At high rates with short
    /// waits that is most of a core, as governor's timer thread costs. Without `precise`
    /// nothing ever spins. Under paused time the clock does not move across a yield, so the
    /// wait falls back to the timer and the schedule is exactly that of the plain operator.
    ///
    /// With the feature `hires-timer` on Linux, the part of the wait below a tick sleeps on a
    /// `timerfd` instead, and only its last few microseconds (as late as the timerfd's recent
    /// wake-ups were, at most 30 µs) are spent yielding: sub-millisecond pacing without a busy
    /// core. The adapter opens its timerfd on its first wait below a tick and closes it when
    /// dropped; it uses the runtime's IO driver (`enable_all`, `#[tokio::main]`). Under paused
    /// time, on a runtime without an IO driver, or when no timerfd can be had, it waits as
    /// described above.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures_util::StreamExt;
    /// use paced::PaceExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// // At least 100 µs apart, and not a tick more.
    /// let start = std::time::Instant::now();
    /// let n = futures_util::stream::repeat(())
    ///     .take(101)
    ///     .min_interval(Duration::from_micros(100))
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
    MinInterval [S: Stream] [S],
    inner,
    "futures_util::stream::iter([1, 2, 3]).min_interval(Duration::from_millis(10))"
);

impl<S: Stream> Stream for MinInterval<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        self.project().inner.poll_paced(cx)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl<S: Stream> FusedStream for MinInterval<S> {
    fn is_terminated(&self) -> bool {
        self.inner.is_terminated()
    }
}

impl<S> fmt::Debug for MinInterval<S>
where
    S: Stream + fmt::Debug,
    S::Item: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MinInterval")
            .field("inner", &self.inner)
            .finish()
    }
}
