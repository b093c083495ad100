//! The engine behind the adapters that draw on a shared limiter: pull one item, wait for its
//! grant in the limiter's queue, emit it.

use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures_core::Stream;
use pin_project_lite::pin_project;

use super::paced::Checked;
use crate::core::Nanos;
use crate::Quota;

pin_project! {
    /// A stream whose items are granted by the shared quota `Q`, one held at a time.
    pub(crate) struct SharedPaced<S: Stream, Q: Quota> {
        #[pin]
        stream: S,
        #[pin]
        permit: Q::Permit,
        quota: Q,
        // The item pulled from upstream and its cost, while it waits for its grant.
        held: Option<(S::Item, u64)>,
        done: bool,
    }
}

impl<S: Stream, Q: Quota> SharedPaced<S, Q> {
    pub(crate) fn new(stream: S, quota: &Q) -> Self {
        SharedPaced {
            stream,
            permit: quota.permit(),
            quota: quota.clone(),
            held: None,
            done: false,
        }
    }

    pub(crate) fn get_ref(&self) -> &S {
        &self.stream
    }

    pub(crate) fn get_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    pub(crate) fn get_pin_mut(self: Pin<&mut Self>) -> Pin<&mut S> {
        self.project().stream
    }

    pub(crate) fn into_inner(self) -> S {
        self.stream
    }

    pub(crate) fn is_terminated(&self) -> bool {
        self.done && self.held.is_none()
    }

    pub(crate) fn size_hint(&self) -> (usize, Option<usize>) {
        let held = usize::from(self.held.is_some());
        if self.done {
            return (held, Some(held));
        }
        let (lower, upper) = self.stream.size_hint();
        (
            lower.saturating_add(held),
            upper.and_then(|u| u.checked_add(held)),
        )
    }

    fn poll_upstream(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let me = self.project();
        if *me.done {
            return Poll::Ready(None);
        }
        let item = ready!(me.stream.poll_next(cx));
        *me.done = item.is_none();
        Poll::Ready(item)
    }

    /// Shaping: every item leaves once the limiter grants its cost, in queue order.
    pub(crate) fn poll_granted(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut cost: impl FnMut(&S::Item) -> u64,
    ) -> Poll<Option<S::Item>> {
        loop {
            let me = self.as_mut().project();
            if let Some(&(_, cost)) = me.held.as_ref() {
                ready!(me.quota.poll_acquire(me.permit, cx, cost));
                return Poll::Ready(me.held.take().map(|(item, _)| item));
            }
            let Some(item) = ready!(self.as_mut().poll_upstream(cx)) else {
                return Poll::Ready(None);
            };
            let cost = cost(&item);
            *self.as_mut().project().held = Some((item, cost));
        }
    }

    /// Enforcing: every item leaves as soon as the quota has answered, `Ok` if it granted the
    /// item's cost without waiting (nobody queued, tokens there) and `Err((item, wait))`
    /// otherwise, taking nothing.
    pub(crate) fn poll_checked(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut cost: impl FnMut(&S::Item) -> u64,
    ) -> Poll<Option<Checked<S::Item>>> {
        loop {
            let me = self.as_mut().project();
            if let Some(&(_, cost)) = me.held.as_ref() {
                let answer = ready!(me.quota.poll_try_acquire(me.permit, cx, cost));
                let Some((item, _)) = me.held.take() else {
                    return Poll::Ready(None);
                };
                return Poll::Ready(Some(match answer {
                    Ok(()) => Ok(item),
                    Err(refused) => Err((item, Nanos::from_duration(refused.retry_after()))),
                }));
            }
            let Some(item) = ready!(self.as_mut().poll_upstream(cx)) else {
                return Poll::Ready(None);
            };
            let cost = cost(&item);
            *self.as_mut().project().held = Some((item, cost));
        }
    }
}

impl<S, Q> fmt::Debug for SharedPaced<S, Q>
where
    S: Stream + fmt::Debug,
    S::Item: fmt::Debug,
    Q: Quota,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedPaced")
            .field("stream", &self.stream)
            .field("held", &self.held.as_ref().map(|(item, _)| item))
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}
