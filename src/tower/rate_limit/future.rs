//! [`ResponseFuture`]: a request waiting for its tokens, then the inner service's answer.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tower_service::Service;

use crate::mode::{Enforcing, Shaping};
use crate::tower::error::BoxError;
use crate::tower::request::sealed::Answered;
use crate::tower::request::{KeepCharge, RequestLimiter};

pin_project! {
    /// Response future of [`RateLimit`](super::RateLimit): waits for the request's tokens
    /// (shaping) or checks them (enforcing), then calls the inner service and resolves to its
    /// answer.
    ///
    /// It takes its place in the limiter's queue when first polled; dropped before its tokens
    /// are granted, it gives its place to the next waiter and has been charged nothing. It
    /// holds the clone of the inner service that `poll_ready` made ready, so the inner
    /// service is called the moment the tokens are granted. With
    /// [`settle`](super::RateLimitLayer::settle), it settles the request's
    /// [`Permit`](crate::limiter::Permit) (a [`KeyedPermit`](crate::limiter::KeyedPermit) on its key, for a keyed
    /// layer) from the inner service's `Ok` response as soon as it has it;
    /// an `Err`, or the future dropped before the answer, keeps the charge.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use paced::tower::{RateLimit, RateLimitLayer};
    /// use paced::{Rate, RateLimiter};
    /// use tower::ServiceExt;
    /// use tower_layer::Layer;
    /// use tower_service::Service;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(Rate::per_second(1), 1);
    /// let echo = tower::service_fn(|n: u32| async move { Ok::<_, Infallible>(n) });
    /// let mut service = RateLimitLayer::new(&limiter).layer(echo);
    /// let first = service.ready().await.unwrap().call(1);
    /// let second = service.ready().await.unwrap().call(2);
    /// drop(second); // never polled, never charged
    /// assert_eq!(first.await.unwrap(), 1);
    /// assert_eq!(limiter.stats().granted, 1);
    /// # }
    /// ```
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, Req, Q, M, A = KeepCharge>
    where
        S: Service<Req>,
        Q: RequestLimiter<Req>,
    {
        #[pin]
        permit: Q::Permit,
        cost: Q::Cost,
        // What the grant keeps to settle, from the grant until the answer.
        grant: Option<Q::Grant>,
        answered: A,
        // The ready inner service and the request, until the tokens are granted.
        call: Option<(S, Req)>,
        #[pin]
        response: Option<S::Future>,
        mode: PhantomData<fn() -> M>,
    }
}

impl<S, Req, Q, M, A> ResponseFuture<S, Req, Q, M, A>
where
    S: Service<Req>,
    Q: RequestLimiter<Req>,
{
    pub(super) fn new(permit: Q::Permit, cost: Q::Cost, answered: A, ready: S, req: Req) -> Self {
        ResponseFuture {
            permit,
            cost,
            grant: None,
            answered,
            call: Some((ready, req)),
            response: None,
            mode: PhantomData,
        }
    }

    /// Calls the inner service with the request, now that its tokens are granted.
    fn start(self: Pin<&mut Self>) {
        let mut me = self.project();
        *me.grant = Some(Q::grant(me.permit, *me.cost));
        let (mut service, req) = me
            .call
            .take()
            .expect("paced::tower::ResponseFuture polled after completion");
        me.response.set(Some(service.call(req)));
    }
}

/// Settles the grant from an `Ok` answer; an `Err` keeps the charge.
fn answer<R, E, G, A: Answered<R, G>>(
    answered: &A,
    grant: &mut Option<G>,
    answer: Result<R, E>,
) -> Result<R, E> {
    if let (Ok(response), Some(grant)) = (&answer, grant.take()) {
        answered.answered(grant, response);
    }
    answer
}

impl<S, Req, Q, A> Future for ResponseFuture<S, Req, Q, Shaping, A>
where
    S: Service<Req>,
    Q: RequestLimiter<Req>,
    A: Answered<S::Response, Q::Grant>,
{
    type Output = Result<S::Response, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let me = self.as_mut().project();
            if let Some(response) = me.response.as_pin_mut() {
                let answered = ready!(response.poll(cx));
                return Poll::Ready(answer(me.answered, me.grant, answered));
            }
            ready!(Q::poll_acquire(me.permit, cx, *me.cost));
            self.as_mut().start();
        }
    }
}

impl<S, Req, Q, A> Future for ResponseFuture<S, Req, Q, Enforcing, A>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    Q: RequestLimiter<Req>,
    A: Answered<S::Response, Q::Grant>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let me = self.as_mut().project();
            if let Some(response) = me.response.as_pin_mut() {
                let answered = ready!(response.poll(cx));
                return Poll::Ready(answer(me.answered, me.grant, answered).map_err(Into::into));
            }
            if let Err(refused) = ready!(Q::poll_try_acquire(me.permit, cx, *me.cost)) {
                // Dropping the ready inner service gives back whatever its readiness reserved.
                *me.call = None;
                return Poll::Ready(Err(Box::new(refused)));
            }
            self.as_mut().start();
        }
    }
}

impl<S, Req, Q, M, A> fmt::Debug for ResponseFuture<S, Req, Q, M, A>
where
    S: Service<Req>,
    Q: RequestLimiter<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("cost", &self.cost)
            .field("waiting", &self.call.is_some())
            .finish_non_exhaustive()
    }
}
