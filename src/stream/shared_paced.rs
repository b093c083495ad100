//! The engine behind the adapters that draw on a shared limiter: pull one item, wait for its
//! grant in the limiter's queue, emit it.

use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures_core::Stream;
use pin_project_lite::pin_project;

use super::paced::Checked;
use super::upstream::Upstream;
use crate::core::Nanos;
use crate::limiter::Limiter;

pin_project! {
    /// A stream whose items are granted by the shared limiter `Q`, one held at a time.
    pub(crate) struct SharedPaced<S: Stream, Q: Limiter> {
        // The item pulled from upstream is held with its cost while it waits for its grant.
        #[pin]
        upstream: Upstream<S, (S::Item, Q::Cost)>,
        #[pin]
        permit: Q::Permit,
        limiter: Q,
    }
}

impl<S: Stream, Q: Limiter> SharedPaced<S, Q> {
    pub(crate) fn new(stream: S, limiter: &Q) -> Self {
        SharedPaced {
            upstream: Upstream::new(stream),
            permit: limiter.permit(),
            limiter: limiter.clone(),
        }
    }

    forward_upstream!();

    /// Shaping: every item leaves once the limiter grants its cost, in queue order.
    pub(crate) fn poll_granted(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut cost: impl FnMut(&S::Item) -> Q::Cost,
    ) -> Poll<Option<S::Item>> {
        loop {
            let mut me = self.as_mut().project();
            if let Some(&(_, cost)) = me.upstream.as_mut().held().as_ref() {
                ready!(me.limiter.poll_acquire(me.permit, cx, cost));
                return Poll::Ready(me.upstream.held().take().map(|(item, _)| item));
            }
            let Some(item) = ready!(me.upstream.as_mut().poll_next(cx)) else {
                return Poll::Ready(None);
            };
            let cost = cost(&item);
            *me.upstream.held() = Some((item, cost));
        }
    }

    /// Enforcing: every item leaves as soon as the limiter has answered, `Ok` if it granted the
    /// item's cost without waiting (nobody queued, tokens there) and `Err((item, wait))`
    /// otherwise, taking nothing.
    pub(crate) fn poll_checked(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut cost: impl FnMut(&S::Item) -> Q::Cost,
    ) -> Poll<Option<Checked<S::Item>>> {
        loop {
            let mut me = self.as_mut().project();
            if let Some(&(_, cost)) = me.upstream.as_mut().held().as_ref() {
                let answer = ready!(me.limiter.poll_try_acquire(me.permit, cx, cost));
                let Some((item, _)) = me.upstream.held().take() else {
                    return Poll::Ready(None);
                };
                return Poll::Ready(Some(match answer {
                    Ok(()) => Ok(item),
                    Err(refused) => Err((item, Nanos::from_duration(refused.retry_after()))),
                }));
            }
            let Some(item) = ready!(me.upstream.as_mut().poll_next(cx)) else {
                return Poll::Ready(None);
            };
            let cost = cost(&item);
            *me.upstream.held() = Some((item, cost));
        }
    }
}

impl<S, Q> fmt::Debug for SharedPaced<S, Q>
where
    S: Stream + fmt::Debug,
    S::Item: fmt::Debug,
    Q: Limiter,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedPaced")
            .field("upstream", &self.upstream)
            .finish_non_exhaustive()
    }
}
