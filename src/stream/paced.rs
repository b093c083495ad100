//! The loop behind every stream adapter that holds one item until its time: pull, ask the
//! pacing rule when the item may leave, wait on the timer if it must, emit, then charge the rule.

use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures_core::Stream;
use pin_project_lite::pin_project;

use super::upstream::Upstream;
use crate::core::{Cost, Decision, Nanos, One, Pace};
use crate::error::{NotUntil, RateExceeded};
use crate::timer::{Lateness, PreciseTimer};

/// An item let through, or refused with how long until it would have conformed.
pub(crate) type Checked<T> = Result<T, (T, Nanos)>;

/// An enforcing adapter's item: let through, or handed back in a [`RateExceeded`] that says how
/// long until it would have conformed.
#[inline]
pub(crate) fn exceeded<T>(checked: Checked<T>) -> Result<T, RateExceeded<T>> {
    checked.map_err(|(item, wait)| RateExceeded::new(item, NotUntil::new(wait)))
}

/// An item pulled from upstream that waits for its deadline.
#[derive(Debug)]
pub(crate) struct Held<T> {
    pub(crate) item: T,
    cost: u64,
    /// When it was offered: first in line since then.
    since: Nanos,
    deadline: Nanos,
}

pin_project! {
    /// A stream paced by the rule `P`, its items costing what `C` says, holding at most one
    /// upstream item.
    pub(crate) struct Paced<S: Stream, P, C = One> {
        #[pin]
        upstream: Upstream<S, Held<S::Item>>,
        #[pin]
        timer: PreciseTimer,
        pace: P,
        cost: C,
    }
}

impl<S: Stream, P> Paced<S, P> {
    /// Every item costs one.
    pub(crate) const fn new(stream: S, pace: P) -> Self {
        Paced::costed(stream, pace, One)
    }
}

impl<S: Stream, P, C> Paced<S, P, C> {
    pub(crate) const fn costed(stream: S, pace: P, cost: C) -> Self {
        Paced {
            upstream: Upstream::new(stream),
            timer: PreciseTimer::new(),
            pace,
            cost,
        }
    }

    /// Finishes waits shorter than tokio's tick by yielding (see `Timer::set_precise`).
    pub(crate) fn set_precise(&mut self) {
        self.timer.set_precise(true);
    }

    forward_upstream!();

    /// Shaping: every item leaves, as soon as the rule allows.
    pub(crate) fn poll_paced(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<S::Item>>
    where
        P: Pace<Cost = u64>,
        C: Cost<S::Item>,
    {
        loop {
            let mut me = self.as_mut().project();
            let held = me.upstream.as_mut().held();
            if let Some((deadline, cost)) = held.as_ref().map(|held| (held.deadline, held.cost)) {
                let lateness = Lateness::of(&*me.pace, cost);
                let now = ready!(me.timer.as_mut().poll_until(cx, deadline, lateness));
                if let Some(held) = me.upstream.as_mut().held().take() {
                    me.pace.commit(now, held.since, held.cost);
                    return Poll::Ready(Some(held.item));
                }
            }
            let Some(item) = ready!(me.upstream.as_mut().poll_next(cx)) else {
                return Poll::Ready(None);
            };
            if me.pace.is_unlimited() {
                return Poll::Ready(Some(item));
            }
            let cost = me.cost.cost(&item);
            let now = me.timer.as_mut().now();
            let Decision::NotUntil(deadline) = me.pace.offer(now, cost) else {
                return Poll::Ready(Some(item));
            };
            *me.upstream.held() = Some(Held {
                item,
                cost,
                since: now,
                deadline,
            });
        }
    }

    /// Enforcing: every item leaves at once, as `Ok` if the rule allows it now and as
    /// `Err((item, wait))` otherwise, with how long until it would have been allowed
    /// (`Nanos::MAX` if never). A refused item is not charged.
    pub(crate) fn poll_checked(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Checked<S::Item>>>
    where
        P: Pace<Cost = u64>,
        C: Cost<S::Item>,
    {
        let me = self.project();
        let Some(item) = ready!(me.upstream.poll_next(cx)) else {
            return Poll::Ready(None);
        };
        let cost = me.cost.cost(&item);
        if me.pace.needs_wait(cost) {
            return Poll::Ready(Some(Err((item, Nanos::MAX))));
        }
        let now = me.timer.now();
        Poll::Ready(Some(match me.pace.offer(now, cost) {
            Decision::Go => Ok(item),
            Decision::NotUntil(Nanos::MAX) => Err((item, Nanos::MAX)),
            Decision::NotUntil(deadline) => Err((item, deadline.saturating_sub(now))),
        }))
    }
}

impl<S, P, C> fmt::Debug for Paced<S, P, C>
where
    S: Stream + fmt::Debug,
    S::Item: fmt::Debug,
    P: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Paced")
            .field("upstream", &self.upstream)
            .field("pace", &self.pace)
            .finish()
    }
}
