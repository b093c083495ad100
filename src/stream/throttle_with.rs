//! `throttle_with`: `throttle` drawing on a shared [`RateLimiter`].

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::stream::FusedStream;
use futures_core::Stream;
use pin_project_lite::pin_project;

use super::paced::exceeded;
use super::shared_paced::SharedPaced;
use crate::error::RateExceeded;
use crate::limiter::{Limiter, RateLimiter};
use crate::mode::{Enforcing, Shaping};

pin_project! {
    /// Stream for [`throttle_with`](crate::PaceExt::throttle_with): items paced by a shared
    /// [`Limiter`] (a [`RateLimiter`] unless said otherwise), each costing `cost(&item)` tokens.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use paced::stream::ThrottleWith;
    /// use paced::{PaceExt, Rate, RateLimiter, Shaping};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(Rate::per_second(10), 1);
    /// let a: ThrottleWith<_, _, Shaping> =
    ///     futures_util::stream::iter(0..5).throttle_with(&limiter, |_| 1, Shaping);
    /// let b = futures_util::stream::iter(5..10).throttle_with(&limiter, |_| 1, Shaping);
    /// let start = tokio::time::Instant::now();
    /// let (a, b) = tokio::join!(a.count(), b.count());
    /// assert_eq!(a + b, 10);
    /// // Ten items between both streams, one per 100 ms.
    /// assert_eq!(start.elapsed().as_millis(), 900);
    /// # }
    /// ```
    #[must_use = "streams do nothing unless polled"]
    pub struct ThrottleWith<S: Stream, F, M, Q: Limiter = RateLimiter> {
        #[pin]
        inner: SharedPaced<S, Q>,
        cost: F,
        mode: M,
    }
}

impl<S: Stream, F, M, Q: Limiter> ThrottleWith<S, F, M, Q> {
    pub(crate) fn new(stream: S, limiter: &Q, cost: F, mode: M) -> Self {
        ThrottleWith {
            inner: SharedPaced::new(stream, limiter),
            cost,
            mode,
        }
    }
}

accessors!(
    ThrottleWith [S: Stream, F, M, Q: Limiter] [S, F, M, Q],
    inner,
    "futures_util::stream::iter([1, 2, 3]).throttle_with(&paced::RateLimiter::new(Rate::per_second(1), 1), |_| 1, Shaping)"
);

forward_stream!(
    ThrottleWith [S: Stream, F: FnMut(&S::Item) -> Q::Cost, Q: Limiter] [S, F, Shaping, Q],
    S::Item,
    |me, cx| me.inner.poll_granted(cx, me.cost)
);

forward_stream!(
    ThrottleWith [S: Stream, F: FnMut(&S::Item) -> Q::Cost, Q: Limiter] [S, F, Enforcing, Q],
    Result<S::Item, RateExceeded<S::Item>>,
    |me, cx| me.inner.poll_checked(cx, me.cost).map(|next| next.map(exceeded))
);

debug_adapter!(ThrottleWith [S, F, M, Q] [M: fmt::Debug, Q: Limiter], inner, mode);
