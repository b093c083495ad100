//! [`AdaptiveService`]: the service an `AdaptiveLayer` wraps around another.

use std::fmt;
use std::task::{Context, Poll};

use tower_service::Service;

use super::feedback::Feedback;
use super::future::AdaptiveFuture;
use crate::Adaptive;

/// A service that reports each response of `S` to an [`Adaptive`]: built by
/// [`AdaptiveLayer`], which documents it.
///
/// `poll_ready` is the inner service's; `call` wraps the inner future in an
/// [`AdaptiveFuture`]. Every clone reports to the same controller.
///
/// [`AdaptiveLayer`]: super::AdaptiveLayer
///
/// # Examples
///
/// ```
/// use std::convert::Infallible;
/// use paced::tower::{AdaptiveLayer, AdaptiveService, Outcome};
/// use paced::{Adaptive, Rate, RateLimiter};
/// use tower::ServiceExt;
/// use tower_layer::Layer;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let limiter = RateLimiter::new(Rate::per_second(10), 1);
/// let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(10));
/// let echo = tower::service_fn(|n: u32| async move { Ok::<_, Infallible>(n) });
/// let service: AdaptiveService<_, _> =
///     AdaptiveLayer::new(&adaptive, |_: &Result<u32, Infallible>| Outcome::Success).layer(echo);
/// assert_eq!(service.oneshot(7).await.unwrap(), 7);
/// assert_eq!(adaptive.stats().successes, 1);
/// # }
/// ```
#[derive(Clone)]
pub struct AdaptiveService<S, F, A = Adaptive> {
    inner: S,
    adaptive: A,
    classify: F,
}

impl<S, F, A> AdaptiveService<S, F, A> {
    pub(super) fn new(inner: S, adaptive: A, classify: F) -> Self {
        AdaptiveService {
            inner,
            adaptive,
            classify,
        }
    }
}

service_accessors!(
    AdaptiveService [S, F, A],
    "use paced::tower::{AdaptiveLayer, Outcome};\nuse paced::{Adaptive, Rate, RateLimiter};\nuse tower_layer::Layer;\n\nlet adaptive = Adaptive::new(\n    RateLimiter::new(Rate::per_second(1), 1), Rate::per_second(1), Rate::per_second(1));",
    "AdaptiveLayer::new(&adaptive, |_: &Result<(), ()>| Outcome::Ignore).layer(7u8)"
);

impl<S, F, A, Req> Service<Req> for AdaptiveService<S, F, A>
where
    S: Service<Req>,
    A: Feedback,
    F: Fn(&Result<S::Response, S::Error>) -> A::Outcome + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = AdaptiveFuture<S::Future, F, A>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        AdaptiveFuture::new(
            self.inner.call(req),
            self.adaptive.clone(),
            self.classify.clone(),
        )
    }
}

/// Shows the inner service only: the controller's `Debug` reads its state, under its lock.
impl<S: fmt::Debug, F, A> fmt::Debug for AdaptiveService<S, F, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}
