//! [`RateLimit`]: the service a [`RateLimitLayer`](super::RateLimitLayer) wraps around another.

use std::fmt;
use std::task::{Context, Poll};

use tower_service::Service;

use super::future::ResponseFuture;
use crate::mode::{Enforcing, Shaping};
use crate::tower::error::BoxError;
use crate::tower::request::sealed::{Answered, RequestSealed};
use crate::tower::request::{Cost, KeepCharge, OnePerRequest, RequestLimiter};

/// A service whose requests draw their cost from a shared limiter before they reach `S`: built
/// by [`RateLimitLayer`](super::RateLimitLayer), which documents the two flavours.
///
/// **Readiness.** `poll_ready` is the inner service's `poll_ready`, nothing more: the limiter is
/// not consulted there, because a request's cost (and, for a keyed limiter, its key) is only
/// known in `call`, and because a token reserved in `poll_ready` by a caller that then never
/// calls would be lost to everyone else. `call` moves the inner service that was just made
/// ready into the [`ResponseFuture`] (leaving a fresh clone behind for the next caller, the
/// usual tower pattern, hence `S: Clone`); the future waits for the tokens and calls it the
/// moment they are granted. So the inner service is never called unready, and a request
/// reaches it when it is charged, not later: the limiter's bound holds at the inner service,
/// even when it applies backpressure. The price is that a waiting request keeps whatever the
/// inner service's readiness reserved (a `ConcurrencyLimit` slot, a `Buffer` slot) until its
/// turn; dropping the future gives that back too.
///
/// **Clones share the limit.** Every clone holds a handle to the same limiter, whatever the
/// number of tasks it is cloned into.
///
/// **Errors.** Shaping never refuses, so its error type is `S::Error`, untouched. Enforcing
/// boxes ([`BoxError`]): the inner error as it was, or a [`RateLimited`](crate::tower::RateLimited).
///
/// # Examples
///
/// ```
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use paced::tower::{RateLimit, RateLimitLayer};
/// use paced::{Rate, RateLimiter};
/// use tower::ServiceExt;
/// use tower_layer::Layer;
/// use tokio::time::Instant;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let limiter = RateLimiter::new(Rate::per_second(4), 1);
/// let echo = tower::service_fn(|n: u32| async move { Ok::<_, Infallible>(n) });
/// let service: RateLimit<_, RateLimiter> = RateLimitLayer::new(&limiter).layer(echo);
/// let start = Instant::now();
/// // Eight tasks, each with its own clone, one limiter: eight requests take 7 × 250 ms.
/// let tasks: Vec<_> = (0..8).map(|n| tokio::spawn(service.clone().oneshot(n))).collect();
/// for task in tasks {
///     task.await.unwrap().unwrap();
/// }
/// assert_eq!(start.elapsed(), Duration::from_millis(1750));
/// # }
/// ```
#[derive(Clone)]
pub struct RateLimit<S, Q, C = OnePerRequest, M = Shaping, A = KeepCharge> {
    inner: S,
    limiter: Q,
    cost: C,
    // The flavour is in the type (`Shaping` or `Enforcing`); the value is a unit.
    _mode: M,
    // What a response does to its grant: nothing, or settle it.
    answered: A,
}

impl<S, Q, C, M, A> RateLimit<S, Q, C, M, A> {
    pub(super) fn new(inner: S, limiter: Q, cost: C, mode: M, answered: A) -> Self {
        RateLimit {
            inner,
            limiter,
            cost,
            _mode: mode,
            answered,
        }
    }
}

service_accessors!(
    RateLimit [S, Q, C, M, A],
    "use paced::tower::RateLimitLayer;\nuse paced::{Rate, RateLimiter};\nuse tower_layer::Layer;\n\nlet limiter = RateLimiter::new(Rate::per_second(1), 1);",
    "RateLimitLayer::new(&limiter).layer(7u8)"
);

impl<S, Q, C, M, A: Clone> RateLimit<S, Q, C, M, A> {
    /// `call` for both flavours: the ready inner service goes into the future, a fresh clone
    /// stays for the next caller.
    fn start<Req>(&mut self, req: Req) -> ResponseFuture<S, Req, Q, M, A>
    where
        S: Service<Req> + Clone,
        Q: RequestLimiter<Req>,
        C: Cost<Req, Q::Cost>,
    {
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        let permit = self.limiter.permit(&req);
        let cost = self.cost.cost(&req);
        ResponseFuture::new(permit, cost, self.answered.clone(), ready, req)
    }
}

impl<S, Req, Q, C, A> Service<Req> for RateLimit<S, Q, C, Shaping, A>
where
    S: Service<Req> + Clone,
    Q: RequestLimiter<Req>,
    C: Cost<Req, Q::Cost>,
    A: Answered<S::Response, <Q as RequestSealed<Req>>::Grant> + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S, Req, Q, Shaping, A>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.start(req)
    }
}

impl<S, Req, Q, C, A> Service<Req> for RateLimit<S, Q, C, Enforcing, A>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    Q: RequestLimiter<Req>,
    C: Cost<Req, Q::Cost>,
    A: Answered<S::Response, <Q as RequestSealed<Req>>::Grant> + Clone,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req, Q, Enforcing, A>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.start(req)
    }
}

/// Shows the inner service and the mode only: a limiter's own `Debug` may read its shared
/// state, and a cost is usually a closure.
#[cfg(feature = "http")]
impl<S, Req, Q, C, B> Service<Req> for RateLimit<S, Q, C, super::Announcing>
where
    S: Service<Req, Response = http::Response<B>> + Clone,
    Q: RequestLimiter<Req>,
    C: Cost<Req, Q::Cost>,
    B: Default,
{
    type Response = http::Response<B>;
    // A refusal is a response (429), so the only errors are the inner service's: an axum
    // `Router` takes the layer as it is.
    type Error = S::Error;
    type Future = super::AnnouncingFuture<S, Req, Q>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        let permit = self.limiter.permit(&req);
        let cost = self.cost.cost(&req);
        super::AnnouncingFuture::new(permit, cost, self._mode.headers(), ready, req)
    }
}

impl<S: fmt::Debug, Q, C, M: fmt::Debug, A> fmt::Debug for RateLimit<S, Q, C, M, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("mode", &self._mode)
            .finish_non_exhaustive()
    }
}
