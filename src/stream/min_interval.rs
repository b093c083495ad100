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
    /// Ends every wait on time also where the system has no high-resolution timer, and ends
    /// more of them on time on Linux; at the price of CPU time while waiting.
    ///
    /// tokio's timer fires on 1 ms ticks, so a `Sleep` wakes up to two ticks late, and every
    /// gap counts from the previous item: any lateness is lost. So on Linux a `min_interval`
    /// wait ends on time by default: paced's timer thread wakes the task shortly before its
    /// time, and the task yields for the last few microseconds (as late as 4 in 5 recent
    /// wake-ups were, at most 200 µs). With `precise` the task is woken earlier, as late as 19
    /// in 20 recent wake-ups were, and yields longer: that keeps the rate at intervals of
    /// 100 µs, where a late wake-up costs a larger share of each gap.
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

forward_stream!(MinInterval [S: Stream] [S], S::Item, |me, cx| me.inner.poll_paced(cx));

debug_adapter!(MinInterval [S] [], inner);
