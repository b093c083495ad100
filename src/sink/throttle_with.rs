//! `throttle_with` for a sink: each item handed on once a shared [`Limiter`] grants its cost.

use pin_project_lite::pin_project;

use super::paced::{Granted, PacedSink};
use crate::limiter::{Limiter, RateLimiter};

pin_project! {
    /// Sink for [`throttle_with`](crate::PaceSinkExt::throttle_with): items handed to the
    /// inner sink as a shared [`Limiter`] (a [`RateLimiter`] unless said otherwise) grants
    /// their cost.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::SinkExt;
    /// use paced::sink::ThrottleWith;
    /// use paced::{PaceSinkExt, Rate, RateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(Rate::per_second(10), 1);
    /// let a: ThrottleWith<Vec<u32>, u32, _> = Vec::new().throttle_with(&limiter, |_| 1);
    /// let b = Vec::new().throttle_with(&limiter, |_: &u32| 1);
    /// let (mut a, mut b) = (Box::pin(a), Box::pin(b));
    /// let (mut to_a, mut to_b) = (
    ///     futures_util::stream::iter((0..5).map(Ok)),
    ///     futures_util::stream::iter((5..10).map(Ok)),
    /// );
    /// let start = tokio::time::Instant::now();
    /// let (sent_a, sent_b) = tokio::join!(a.send_all(&mut to_a), b.send_all(&mut to_b));
    /// sent_a.unwrap();
    /// sent_b.unwrap();
    /// assert_eq!(a.get_ref().len() + b.get_ref().len(), 10);
    /// // Ten items between both sinks, one per 100 ms.
    /// assert_eq!(start.elapsed().as_millis(), 900);
    /// # }
    /// ```
    #[must_use = "sinks do nothing unless polled"]
    pub struct ThrottleWith<Si, Item, F, Q: Limiter = RateLimiter> {
        #[pin]
        inner: PacedSink<Si, Item, Granted<Q, F>, Q::Cost>,
    }
}

impl<Si, Item, F, Q: Limiter> ThrottleWith<Si, Item, F, Q> {
    pub(crate) fn new(sink: Si, limiter: &Q, cost: F) -> Self {
        ThrottleWith {
            inner: PacedSink::new(sink, Granted::new(limiter, cost)),
        }
    }
}

sink_adapter!(
    ThrottleWith [Si, Item, F, Q: Limiter] [Si, Item, F, Q],
    where [F: FnMut(&Item) -> Q::Cost],
    "Vec::<u32>::new().throttle_with(&paced::RateLimiter::new(Rate::per_second(1), 1), |_| 1)"
);
