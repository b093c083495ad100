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
    /// use pacer::{MinInterval, PaceExt};
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
