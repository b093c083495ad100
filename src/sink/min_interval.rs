//! `min_interval` for a sink: at least `d` between items handed to the inner sink.

use std::time::Duration;

use pin_project_lite::pin_project;

use super::paced::{Local, PacedSink};
use crate::core::{Bucket, Nanos};

pin_project! {
    /// Sink for [`min_interval`](crate::PaceSinkExt::min_interval): items handed to the inner
    /// sink at least `interval` apart.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures_util::SinkExt;
    /// use paced::sink::MinInterval;
    /// use paced::PaceSinkExt;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let mut sink: MinInterval<Vec<&str>, &str> =
    ///     Vec::new().min_interval(Duration::from_millis(200));
    /// let mut sink = std::pin::pin!(sink);
    /// let start = tokio::time::Instant::now();
    /// sink.send("hi").await.unwrap();
    /// sink.send("there").await.unwrap();
    /// assert_eq!(sink.get_ref(), &["hi", "there"]);
    /// assert_eq!(start.elapsed(), Duration::from_millis(200));
    /// # }
    /// ```
    #[must_use = "sinks do nothing unless polled"]
    pub struct MinInterval<Si, Item> {
        #[pin]
        inner: PacedSink<Si, Item, Local<Bucket>>,
    }
}

impl<Si, Item> MinInterval<Si, Item> {
    pub(crate) fn new(sink: Si, interval: Duration) -> Self {
        // As for the stream: a bucket of one token, always empty right after an item went, so
        // the gap counts from the actual hand-over.
        let bucket = Bucket::interval(Nanos::from_duration(interval));
        MinInterval {
            inner: PacedSink::new(sink, Local::new(bucket)),
        }
    }
}

sink_adapter!(
    MinInterval [Si, Item] [Si, Item],
    where [],
    "Vec::<u32>::new().min_interval(Duration::from_millis(10))"
);
