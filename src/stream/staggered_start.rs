//! `staggered_start`: at most `k` emissions in any window of `period`.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::stream::FusedStream;
use futures_core::Stream;
use pin_project_lite::pin_project;

use super::paced::Paced;
use crate::core::{Nanos, Window};
use crate::error::ConfigError;

pin_project! {
    /// Stream for [`staggered_start`](crate::PaceExt::staggered_start): at most `k` items in any
    /// window of `period`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures_util::StreamExt;
    /// use paced::stream::StaggeredStart;
    /// use paced::PaceExt;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let consumers = futures_util::stream::iter(1..=3);
    /// let starts: StaggeredStart<_> = consumers.staggered_start(2, Duration::from_secs(1));
    /// let start = tokio::time::Instant::now();
    /// assert_eq!(starts.collect::<Vec<_>>().await, [1, 2, 3]);
    /// assert_eq!(start.elapsed(), Duration::from_secs(1));
    /// # }
    /// ```
    #[must_use = "streams do nothing unless polled"]
    pub struct StaggeredStart<S: Stream> {
        #[pin]
        inner: Paced<S, Window>,
    }
}

impl<S: Stream> StaggeredStart<S> {
    pub(crate) fn try_new(stream: S, k: usize, period: Duration) -> Result<Self, ConfigError> {
        if k == 0 {
            return Err(ConfigError::ZeroStarts);
        }
        Ok(StaggeredStart {
            inner: Paced::new(stream, Window::new(k, Nanos::from_duration(period))),
        })
    }
}

accessors!(
    StaggeredStart [S: Stream] [S],
    inner,
    "futures_util::stream::iter([1, 2, 3]).staggered_start(2, Duration::from_secs(1))"
);

forward_stream!(StaggeredStart [S: Stream] [S], S::Item, |me, cx| me.inner.poll_paced(cx));

debug_adapter!(StaggeredStart [S] [], inner);
