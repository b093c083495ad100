//! `throttle` for a sink: a token bucket with a cost per item, delaying what does not conform.

use pin_project_lite::pin_project;

use super::paced::{Local, PacedSink};
use crate::core::{Bucket, ByItem};
use crate::error::ConfigError;
use crate::rate::Rate;

pin_project! {
    /// Sink for [`throttle`](crate::PaceSinkExt::throttle): each item handed to the inner sink
    /// once the token bucket holds its cost.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::SinkExt;
    /// use paced::sink::Throttle;
    /// use paced::{PaceSinkExt, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let sink = Vec::new().throttle(Rate::per_second(2), |_: &u32| 1, 1);
    /// let mut sink = std::pin::pin!(sink);
    /// let start = tokio::time::Instant::now();
    /// for n in 0..3 {
    ///     sink.send(n).await.unwrap();
    /// }
    /// assert_eq!(sink.get_ref(), &[0, 1, 2]);
    /// assert_eq!(start.elapsed().as_millis(), 1000);
    /// # }
    /// ```
    #[must_use = "sinks do nothing unless polled"]
    pub struct Throttle<Si, Item, F> {
        #[pin]
        inner: PacedSink<Si, Item, Local<Bucket, ByItem<F>>>,
    }
}

impl<Si, Item, F> Throttle<Si, Item, F> {
    pub(crate) fn try_new(sink: Si, rate: Rate, cost: F, burst: u64) -> Result<Self, ConfigError> {
        let bucket = Bucket::try_of(rate, burst)?;
        Ok(Throttle {
            inner: PacedSink::new(sink, Local::costed(bucket, ByItem(cost))),
        })
    }
}

sink_adapter!(
    Throttle [Si, Item, F] [Si, Item, F],
    where [F: FnMut(&Item) -> u64],
    "Vec::<u32>::new().throttle(Rate::per_second(1), |_| 1, 1)"
);
