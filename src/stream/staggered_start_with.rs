//! `staggered_start_with`: `staggered_start` drawing on a shared [`Stagger`].

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::stream::FusedStream;
use futures_core::Stream;
use pin_project_lite::pin_project;

use super::shared_paced::SharedPaced;
use crate::limiter::Stagger;

pin_project! {
    /// Stream for [`staggered_start_with`](crate::PaceExt::staggered_start_with): items let
    /// through by a shared [`Stagger`], at most `k` per window among all its users.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures_util::StreamExt;
    /// use paced::stream::StaggeredStartWith;
    /// use paced::{PaceExt, Stagger};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let stagger = Stagger::new(2, Duration::from_secs(1));
    /// let a: StaggeredStartWith<_> = futures_util::stream::iter(0..3).staggered_start_with(&stagger);
    /// let b = futures_util::stream::iter(3..6).staggered_start_with(&stagger);
    /// let start = tokio::time::Instant::now();
    /// let (a, b) = tokio::join!(a.count(), b.count());
    /// assert_eq!(a + b, 6);
    /// assert_eq!(start.elapsed(), Duration::from_secs(2));
    /// # }
    /// ```
    #[must_use = "streams do nothing unless polled"]
    pub struct StaggeredStartWith<S: Stream> {
        #[pin]
        inner: SharedPaced<S, Stagger>,
    }
}

impl<S: Stream> StaggeredStartWith<S> {
    pub(crate) fn new(stream: S, stagger: &Stagger) -> Self {
        StaggeredStartWith {
            inner: SharedPaced::new(stream, stagger),
        }
    }
}

accessors!(
    StaggeredStartWith [S: Stream] [S],
    inner,
    "futures_util::stream::iter([1, 2, 3]).staggered_start_with(&paced::Stagger::new(1, Duration::from_secs(1)))"
);

forward_stream!(StaggeredStartWith [S: Stream] [S], S::Item, |me, cx| me.inner.poll_granted(cx, |_| 1));

debug_adapter!(StaggeredStartWith [S] [], inner);
