//! `batched_interval`: at most one batch of up to `n` items per interval.

use std::fmt;
use std::mem;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures_core::stream::FusedStream;
use futures_core::Stream;
use pin_project_lite::pin_project;

use super::upstream::Source;
use crate::core::{Bucket, Decision, Nanos};
use crate::error::ConfigError;
use crate::timer::{Lateness, Timer};

pin_project! {
    /// Stream for [`batched_interval`](crate::PaceExt::batched_interval): batches of
    /// `1..=max_batch` items, consecutive batches at least `interval` apart.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures_util::StreamExt;
    /// use paced::stream::BatchedInterval;
    /// use paced::PaceExt;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let rows = futures_util::stream::iter(0..5);
    /// let batches: BatchedInterval<_> = rows.batched_interval(2, Duration::from_secs(1));
    /// assert_eq!(batches.collect::<Vec<_>>().await, [vec![0, 1], vec![2, 3], vec![4]]);
    /// # }
    /// ```
    #[must_use = "streams do nothing unless polled"]
    pub struct BatchedInterval<S: Stream> {
        #[pin]
        source: Source<S>,
        #[pin]
        timer: Timer,
        // One batch per interval: a bucket of one token.
        gate: Bucket,
        batch: Vec<S::Item>,
        max_batch: usize,
    }
}

impl<S: Stream> BatchedInterval<S> {
    pub(crate) fn try_new(
        stream: S,
        max_batch: usize,
        interval: Duration,
    ) -> Result<Self, ConfigError> {
        if max_batch == 0 {
            return Err(ConfigError::ZeroBatch);
        }
        Ok(BatchedInterval {
            source: Source::new(stream),
            timer: Timer::new(),
            gate: Bucket::interval(Nanos::from_duration(interval)),
            batch: Vec::new(),
            max_batch,
        })
    }
}

accessors!(
    BatchedInterval [S: Stream] [S],
    source,
    "futures_util::stream::iter([1, 2, 3]).batched_interval(2, Duration::from_millis(10))"
);

impl<S: Stream> Stream for BatchedInterval<S> {
    type Item = Vec<S::Item>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut me = self.project();
        // Take in whatever upstream has ready, up to a full batch: a batch holds every item
        // that has arrived by the time it leaves.
        while !me.source.is_done() && me.batch.len() < *me.max_batch {
            match me.source.as_mut().poll_next(cx) {
                Poll::Ready(Some(item)) => me.batch.push(item),
                Poll::Ready(None) => {}
                Poll::Pending => break,
            }
        }
        if me.batch.is_empty() {
            return if me.source.is_done() {
                Poll::Ready(None)
            } else {
                Poll::Pending
            };
        }
        if !me.gate.is_unlimited() {
            // The timer is armed exactly while a batch waits for its interval.
            // One batch per interval: a late one moves the next.
            let lateness = Lateness::of(&*me.gate, 1);
            if let Some(deadline) = me.timer.armed() {
                let now = ready!(me.timer.as_mut().poll_until(cx, deadline, lateness));
                me.gate.commit(now, 1);
            } else {
                let now = me.timer.as_mut().now();
                if let Decision::NotUntil(deadline) = me.gate.offer(now, 1) {
                    let now = ready!(me.timer.as_mut().poll_until(cx, deadline, lateness));
                    me.gate.commit(now, 1);
                }
            }
        }
        let next = Vec::with_capacity(me.batch.len());
        Poll::Ready(Some(mem::replace(me.batch, next)))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let (lower, upper) = self.source.size_hint(self.batch.len());
        // Every batch holds between one and `max_batch` items.
        (lower.div_ceil(self.max_batch), upper)
    }
}

impl<S: Stream> FusedStream for BatchedInterval<S> {
    fn is_terminated(&self) -> bool {
        self.source.is_done() && self.batch.is_empty()
    }
}

debug_adapter!(BatchedInterval [S] [], source, gate, batch, max_batch);
