//! The async side of the one waiter engine: a [`Waiter`] holds one request's place in a
//! lane's queue (through a [`Handle`]), sleeps until its deadline when it heads the queue, and
//! gives its place back if dropped.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;

use super::coop::poll_budget;
use super::lane::Step;
use crate::core::Nanos;
use crate::error::NotUntil;
use crate::timer::Timer;

/// A request's way into a limiter's queue: a borrowed handle for a future, an owned one for a
/// stream; for a keyed limiter, the key too.
pub(crate) trait Handle {
    /// What a request costs (see [`Pace::Cost`](crate::core::Pace::Cost)).
    type Cost: Copy;
    /// The instant the limiter's times count from.
    fn origin(&self) -> Instant;
    /// Advances the request behind `ticket` (`None`: not queued yet), reading the clock under
    /// the lock. A new request joins the queue unless it could not be granted within
    /// `timeout`, in which case it is refused with the time it would have taken.
    fn poll(
        &self,
        ticket: &mut Option<u64>,
        cost: Self::Cost,
        waker: &Waker,
        timeout: Option<Duration>,
    ) -> Result<Step, NotUntil>;
    /// Takes the request behind `ticket` out of the queue, giving its place to the next.
    fn cancel(&self, ticket: u64);
}

pin_project! {
    /// One request at a time on a shared limiter: queued, woken when it heads the queue,
    /// sleeping until its deadline, and out of the queue again if dropped.
    pub(crate) struct Waiter<H: Handle> {
        handle: H,
        ticket: Option<u64>,
        #[pin]
        timer: Timer,
    }

    impl<H: Handle> PinnedDrop for Waiter<H> {
        fn drop(this: Pin<&mut Self>) {
            let me = this.project();
            if let Some(ticket) = me.ticket.take() {
                me.handle.cancel(ticket);
            }
        }
    }
}

impl<H: Handle> Waiter<H> {
    pub(crate) fn new(handle: H) -> Self {
        Waiter::queued(handle, None)
    }

    /// A waiter for a request that already holds `ticket`'s place in the queue (asked once
    /// directly, and told to wait).
    pub(crate) fn queued(handle: H, ticket: Option<u64>) -> Self {
        let origin = handle.origin();
        Waiter {
            handle,
            ticket,
            timer: Timer::with_origin(origin),
        }
    }

    /// The way into the queue this waiter uses.
    #[cfg(feature = "tower")]
    pub(crate) fn handle(&self) -> &H {
        &self.handle
    }

    /// Waits until `cost` is granted. With a `timeout`, a request that could not be granted
    /// within it is refused at once instead, taking nothing.
    ///
    /// Every poll takes a unit of the task's cooperative budget first (answering `Pending`,
    /// the task scheduled again, once it is spent) and keeps it only if the request is
    /// granted, as a tokio `Semaphore`'s `acquire` does: a task looping on grants that need
    /// no wait yields to the others on its thread.
    pub(crate) fn poll_acquire(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        cost: H::Cost,
        timeout: Option<Duration>,
    ) -> Poll<Result<(), NotUntil>> {
        self.poll_acquire_at(cx, cost, timeout)
            .map(|granted| granted.map(|_| ()))
    }

    /// [`Waiter::poll_acquire`], answering with the time of the grant (the limiter's time,
    /// read under its lock): what a grant that may be corrected later needs to know.
    pub(crate) fn poll_acquire_at(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        cost: H::Cost,
        timeout: Option<Duration>,
    ) -> Poll<Result<Nanos, NotUntil>> {
        let budget = ready!(poll_budget(cx));
        let mut me = self.project();
        // Woken by its timer, maybe after the deadline: the grant below would then end the wait
        // without the timer hearing how late the wake-up came.
        me.timer.as_mut().woken();
        loop {
            match me.handle.poll(me.ticket, cost, cx.waker(), timeout)? {
                Step::Granted(at) => {
                    budget.made_progress();
                    return Poll::Ready(Ok(at));
                }
                Step::Queued => return Poll::Pending,
                Step::Wait(at, lateness) => {
                    ready!(me.timer.as_mut().poll_until(cx, at, lateness));
                }
            }
        }
    }
}

pin_project! {
    /// Waits until `cost` is granted through a handle, as [`Waiter::poll_acquire_at`] does;
    /// the first poll asks the handle directly and a [`Waiter`] is made only for a request
    /// that must wait, so that a grant that needs no wait costs the handle's poll and a unit of
    /// the task's budget. The request's place in the queue (its ticket) passes to the waiter in
    /// the poll that took it, so dropping the future at any point gives it back.
    #[project = AcquireProj]
    // The cost's type is a parameter of its own, not `H::Cost`: with the projection, rustc
    // could not prove the future of a handle that borrows its key `Send` for every lifetime
    // (`tokio::spawn` of a keyed `acquire` failed to compile).
    pub(crate) enum Acquire<H: Handle<Cost = C>, C> {
        First {
            // Taken when the request must wait, for its waiter.
            handle: Option<H>,
            cost: C,
            timeout: Option<Duration>,
        },
        Waiting {
            #[pin]
            waiter: Waiter<H>,
            cost: C,
            timeout: Option<Duration>,
        },
    }
}

impl<H: Handle<Cost = C>, C> Acquire<H, C> {
    pub(crate) fn new(handle: H, cost: C, timeout: Option<Duration>) -> Self {
        Acquire::First {
            handle: Some(handle),
            cost,
            timeout,
        }
    }
}

impl<H: Handle<Cost = C>, C: Copy> Acquire<H, C> {
    /// Hands a request that must wait (`step`, holding `ticket`'s place) to a waiter on
    /// `handle`, taken from `First` with the request's `cost` and `timeout`.
    #[inline(never)]
    fn start_waiting(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        step: Step,
        ticket: Option<u64>,
        handle: H,
        cost: C,
        timeout: Option<Duration>,
    ) -> Poll<Result<Nanos, NotUntil>> {
        self.set(Acquire::Waiting {
            waiter: Waiter::queued(handle, ticket),
            cost,
            timeout,
        });
        let AcquireProj::Waiting { mut waiter, .. } = self.as_mut().project() else {
            return Poll::Pending;
        };
        match step {
            // Heading the queue: sleep until its time, then ask again.
            Step::Wait(at, lateness) => {
                ready!(waiter.as_mut().project().timer.poll_until(cx, at, lateness));
            }
            // Queued behind others: the lane wakes it when it heads the queue.
            Step::Queued | Step::Granted(_) => return Poll::Pending,
        }
        self.poll_waiting(cx)
    }

    /// Polls the waiter of a request that had to wait.
    #[inline(never)]
    fn poll_waiting(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Nanos, NotUntil>> {
        match self.project() {
            AcquireProj::Waiting {
                waiter,
                cost,
                timeout,
            } => waiter.poll_acquire_at(cx, *cost, *timeout),
            AcquireProj::First { .. } => Poll::Pending,
        }
    }
}

impl<H: Handle<Cost = C>, C: Copy> Future for Acquire<H, C> {
    type Output = Result<Nanos, NotUntil>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let AcquireProj::First {
            handle: slot,
            cost,
            timeout,
        } = self.as_mut().project()
        else {
            return self.poll_waiting(cx);
        };
        let Some(handle) = slot.as_ref() else {
            // Never: the handle leaves `First` only as the request becomes `Waiting`.
            return Poll::Pending;
        };
        let budget = ready!(poll_budget(cx));
        let mut ticket = None;
        let step = handle.poll(&mut ticket, *cost, cx.waker(), *timeout)?;
        if let Step::Granted(at) = step {
            budget.made_progress();
            return Poll::Ready(Ok(at));
        }
        // The unit goes back: the waiter takes one again when it is granted.
        drop(budget);
        let (cost, timeout) = (*cost, *timeout);
        match slot.take() {
            Some(handle) => self.start_waiting(cx, step, ticket, handle, cost, timeout),
            None => Poll::Pending,
        }
    }
}

pin_project! {
    /// An [`Acquire`] without a timeout, answering `()`: a limiter's `acquire` future, with no
    /// `async fn` state machine around it.
    #[must_use = "futures do nothing unless polled"]
    pub(crate) struct Granted<F> {
        #[pin]
        inner: F,
    }
}

impl<F> Granted<F> {
    pub(crate) fn new(inner: F) -> Self {
        Granted { inner }
    }
}

impl<F: Future<Output = Result<Nanos, NotUntil>>> Future for Granted<F> {
    type Output = ();

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // Without a timeout a request is never refused.
        self.project().inner.poll(cx).map(|_| ())
    }
}

pin_project! {
    /// An [`Acquire`] answering whether it was granted: a limiter's `acquire_timeout` future.
    #[must_use = "futures do nothing unless polled"]
    pub(crate) struct Answered<F> {
        #[pin]
        inner: F,
    }
}

impl<F> Answered<F> {
    pub(crate) fn new(inner: F) -> Self {
        Answered { inner }
    }
}

impl<F: Future<Output = Result<Nanos, NotUntil>>> Future for Answered<F> {
    type Output = Result<(), NotUntil>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), NotUntil>> {
        self.project().inner.poll(cx).map(|r| r.map(|_| ()))
    }
}

impl<H: Handle> std::fmt::Debug for Waiter<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter")
            .field("queued", &self.ticket.is_some())
            .finish_non_exhaustive()
    }
}
