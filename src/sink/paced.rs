//! The engine behind every sink adapter: hold the one item given to `start_send` until its
//! gate lets it through, then hand it to the inner sink.
//!
//! The order of the steps is the point. The inner sink must be ready *before* the gate is
//! asked, because the gate charges the item when it lets it through: asking first could take
//! tokens for an item the inner sink cannot accept yet, and a shared limiter would count it as
//! sent while it waits on a full channel or socket.

use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures_core::Stream;
use futures_sink::Sink;
use pin_project_lite::pin_project;

use crate::core::{Cost, Decision, Nanos, One, Pace};
use crate::limiter::Limiter;
use crate::timer::{Lateness, Timer};

/// When a held item may go, charging it as it does; `C` is what an item costs (one number,
/// or one amount per dimension for a `RateLimiter`).
pub(crate) trait Gate<T, C = u64> {
    /// Offers `item`, with the inner sink ready: `None` if it may go at once, and it has been
    /// charged; otherwise its cost, and it is held until [`Gate::poll_grant`] lets it go.
    fn offer(self: Pin<&mut Self>, item: &T) -> Option<C>;
    /// Waits until the held item of `cost` may go, and charges it.
    fn poll_grant(self: Pin<&mut Self>, cx: &mut Context<'_>, cost: C) -> Poll<()>;
    /// The held item will not be delivered: stop waiting for it, charging nothing.
    fn cancel(self: Pin<&mut Self>);
    /// The inner sink cannot take the held item now: a gate with a place in a shared queue
    /// gives it up (joining again at the back once the sink is ready), so that a stuck sink
    /// does not hold up every other user of the limiter. A gate of this sink's own keeps
    /// waiting for its deadline.
    fn step_aside(self: Pin<&mut Self>) {}
}

pin_project! {
    /// A gate over a rule of the clock-free core, kept by this sink alone: a bucket or an
    /// interval, what its items cost, and the one timer that waits for the held item's
    /// deadline.
    pub(crate) struct Local<P, C = One> {
        #[pin]
        timer: Timer,
        pace: P,
        cost: C,
        // The held item's offer and deadline, meaningful while one is held.
        since: Nanos,
        deadline: Nanos,
    }
}

impl<P> Local<P> {
    /// Every item costs one.
    pub(crate) const fn new(pace: P) -> Self {
        Local::costed(pace, One)
    }
}

impl<P, C> Local<P, C> {
    pub(crate) const fn costed(pace: P, cost: C) -> Self {
        Local {
            timer: Timer::new(),
            pace,
            cost,
            since: Nanos(0),
            deadline: Nanos(0),
        }
    }
}

impl<T, P: Pace<Cost = u64>, C: Cost<T>> Gate<T> for Local<P, C> {
    fn offer(self: Pin<&mut Self>, item: &T) -> Option<u64> {
        let me = self.project();
        if me.pace.is_unlimited() {
            return None;
        }
        let cost = me.cost.cost(item);
        let now = me.timer.now();
        match me.pace.offer(now, cost) {
            Decision::Go => None,
            Decision::NotUntil(deadline) => {
                *me.since = now;
                *me.deadline = deadline;
                Some(cost)
            }
        }
    }

    fn poll_grant(self: Pin<&mut Self>, cx: &mut Context<'_>, cost: u64) -> Poll<()> {
        let me = self.project();
        let lateness = Lateness::of(&*me.pace, cost);
        let now = ready!(me.timer.poll_until(cx, *me.deadline, lateness));
        me.pace.commit(now, *me.since, cost);
        Poll::Ready(())
    }

    fn cancel(self: Pin<&mut Self>) {
        self.project().timer.disarm();
    }
}

impl<P: fmt::Debug, C> fmt::Debug for Local<P, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Local")
            .field("pace", &self.pace)
            .field("timer", &self.timer)
            .finish()
    }
}

pin_project! {
    /// A gate that waits in a shared limiter's queue, with a cost per item.
    pub(crate) struct Granted<Q: Limiter, F> {
        #[pin]
        permit: Q::Permit,
        limiter: Q,
        cost: F,
    }
}

impl<Q: Limiter, F> Granted<Q, F> {
    pub(crate) fn new(limiter: &Q, cost: F) -> Self {
        Granted {
            permit: limiter.permit(),
            limiter: limiter.clone(),
            cost,
        }
    }
}

impl<T, Q: Limiter, F: FnMut(&T) -> Q::Cost> Gate<T, Q::Cost> for Granted<Q, F> {
    fn offer(self: Pin<&mut Self>, item: &T) -> Option<Q::Cost> {
        // Always held: the queue is joined on the next poll, which has a waker to be woken
        // by; asking here without one would count as a refusal in the limiter's statistics.
        Some((self.project().cost)(item))
    }

    fn poll_grant(self: Pin<&mut Self>, cx: &mut Context<'_>, cost: Q::Cost) -> Poll<()> {
        let me = self.project();
        me.limiter.poll_acquire(me.permit, cx, cost)
    }

    fn cancel(self: Pin<&mut Self>) {
        let mut me = self.project();
        // Dropping the permit in place leaves the queue, taking nothing.
        me.permit.set(me.limiter.permit());
    }

    fn step_aside(self: Pin<&mut Self>) {
        Gate::<T, Q::Cost>::cancel(self);
    }
}

impl<Q: Limiter, F> fmt::Debug for Granted<Q, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Granted").finish_non_exhaustive()
    }
}

pin_project! {
    /// A sink that holds at most one item of cost `C` until its gate `G` lets it through.
    pub(crate) struct PacedSink<Si, T, G, C = u64> {
        #[pin]
        sink: Si,
        #[pin]
        pub(crate) gate: G,
        // The item given to `start_send` that has not gone yet, with its cost.
        held: Option<(T, C)>,
    }
}

impl<Si, T, G, C: Copy> PacedSink<Si, T, G, C> {
    pub(crate) const fn new(sink: Si, gate: G) -> Self {
        PacedSink {
            sink,
            gate,
            held: None,
        }
    }

    pub(crate) fn get_ref(&self) -> &Si {
        &self.sink
    }

    pub(crate) fn get_mut(&mut self) -> &mut Si {
        &mut self.sink
    }

    pub(crate) fn get_pin_mut(self: Pin<&mut Self>) -> Pin<&mut Si> {
        self.project().sink
    }

    pub(crate) fn into_inner(self) -> Si {
        self.sink
    }

    pub(crate) fn held(&self) -> Option<&T> {
        self.held.as_ref().map(|(item, _)| item)
    }

    pub(crate) fn take_held(self: Pin<&mut Self>) -> Option<T>
    where
        G: Gate<T, C>,
    {
        let me = self.project();
        let (item, _) = me.held.take()?;
        me.gate.cancel();
        Some(item)
    }

    /// Hands the held item, if any, to the inner sink once the sink is ready and the gate
    /// lets it through. An error of the inner sink's `poll_ready` leaves the item held.
    fn poll_deliver<E>(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), E>>
    where
        Si: Sink<T, Error = E>,
        G: Gate<T, C>,
    {
        let mut me = self.project();
        if let Some(&(_, cost)) = me.held.as_ref() {
            match me.sink.as_mut().poll_ready(cx) {
                Poll::Ready(Ok(())) => {}
                not_ready => {
                    me.gate.step_aside();
                    return not_ready;
                }
            }
            if me.gate.as_mut().poll_grant(cx, cost).is_pending() {
                // Until the held item's time, push what the inner sink already holds on its
                // way: a caller such as `send_all` only flushes at the end, and a buffering
                // sink (a `FramedWrite`) would otherwise keep the paced items until then.
                if let Poll::Ready(Err(e)) = me.sink.as_mut().poll_flush(cx) {
                    return Poll::Ready(Err(e));
                }
                return Poll::Pending;
            }
            if let Some((item, _)) = me.held.take() {
                me.sink.start_send(item)?;
            }
        }
        Poll::Ready(Ok(()))
    }

    pub(crate) fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Si::Item>>
    where
        Si: Stream,
    {
        self.project().sink.poll_next(cx)
    }

    pub(crate) fn size_hint(&self) -> (usize, Option<usize>)
    where
        Si: Stream,
    {
        self.sink.size_hint()
    }
}

impl<Si: Sink<T>, T, G: Gate<T, C>, C: Copy> Sink<T> for PacedSink<Si, T, G, C> {
    type Error = Si::Error;

    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Si::Error>> {
        ready!(self.as_mut().poll_deliver(cx))?;
        self.project().sink.poll_ready(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: T) -> Result<(), Si::Error> {
        let me = self.project();
        assert!(
            me.held.is_none(),
            "start_send called on a paced sink that still holds an item: \
             `poll_ready` must return `Ready(Ok(()))` before each `start_send`"
        );
        match me.gate.offer(&item) {
            // Our `poll_ready` said ready only once the inner sink was.
            None => me.sink.start_send(item),
            Some(cost) => {
                *me.held = Some((item, cost));
                Ok(())
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Si::Error>> {
        ready!(self.as_mut().poll_deliver(cx))?;
        self.project().sink.poll_flush(cx)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Si::Error>> {
        ready!(self.as_mut().poll_deliver(cx))?;
        self.project().sink.poll_close(cx)
    }
}

impl<Si: fmt::Debug, T: fmt::Debug, G: fmt::Debug, C: Copy> fmt::Debug for PacedSink<Si, T, G, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PacedSink")
            .field("sink", &self.sink)
            .field("held", &self.held())
            .field("gate", &self.gate)
            .finish()
    }
}
