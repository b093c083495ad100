//! [`AdaptiveLayer`]: reports every response of a service to an [`Adaptive`], as a classifier
//! reads it; its service [`AdaptiveService`] and future [`AdaptiveFuture`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::limiter::Adaptive;

/// What a response says about the destination's limit: the classifier of an
/// [`AdaptiveLayer`] turns each `Result` into one.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use pacer::tower::Outcome;
///
/// // A classifier over a plain status code and an optional delay.
/// let classify = |answer: &Result<(u16, Option<u64>), std::io::Error>| match answer {
///     Ok((429 | 503, secs)) => Outcome::Throttled { retry_after: secs.map(Duration::from_secs) },
///     Ok(_) => Outcome::Success,
///     Err(_) => Outcome::Ignore,
/// };
/// assert_eq!(classify(&Ok((200, None))), Outcome::Success);
/// assert_eq!(
///     classify(&Ok((429, Some(2)))),
///     Outcome::Throttled { retry_after: Some(Duration::from_secs(2)) },
/// );
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The call went through: reported with [`Adaptive::on_success`].
    Success,
    /// The call was refused for going too fast (`429 Too Many Requests`, `503 Slow Down`):
    /// reported with [`Adaptive::on_throttled`], which also pauses the limiter for
    /// `retry_after` if there is one.
    Throttled {
        /// The destination's `Retry-After`, if it sent one.
        retry_after: Option<Duration>,
    },
    /// The answer says nothing about the rate (a connection error, a `500`): not reported.
    Ignore,
}

/// A tower [`Layer`] that reports the outcome of every response of the inner service to an
/// [`Adaptive`], as `classify(&result)` reads it, so that the controller finds the
/// destination's limit from the answers.
///
/// It only reports; the pacing is the [`RateLimitLayer`](crate::tower::RateLimitLayer) over the
/// controller's [`limiter`](Adaptive::limiter), below it in the same stack:
///
/// ```text
/// ServiceBuilder::new()
///     .layer(AdaptiveLayer::new(&adaptive, classify))
///     .layer(RateLimitLayer::new(adaptive.limiter()))
///     .service(client)
/// ```
///
/// The report is made when the response future completes, with the result it resolves to,
/// which is then returned unchanged. A response future dropped before it completes (a
/// timeout, a cancelled task) reports nothing, nor does an [`Outcome::Ignore`].
///
/// # A classifier for `http::Response`
///
/// pacer does not depend on `http`; the classifier for an HTTP client is yours, a few lines:
/// `429` and `503` are refusals, with `Retry-After` in its delta-seconds form (`Retry-After:
/// 2`); the HTTP-date form (`Retry-After: Wed, 21 Oct 2026 07:28:00 GMT`) is not parsed and
/// reads as a refusal without a delay; other server errors and transport errors say nothing
/// about the rate; everything else went through.
///
/// ```
/// use std::time::Duration;
/// use http::{header::RETRY_AFTER, Response, StatusCode};
/// use pacer::tower::Outcome;
///
/// fn classify<B, E>(result: &Result<Response<B>, E>) -> Outcome {
///     match result {
///         Ok(r) if matches!(r.status().as_u16(), 429 | 503) => Outcome::Throttled {
///             retry_after: r.headers().get(RETRY_AFTER)
///                 .and_then(|v| v.to_str().ok()?.trim().parse().ok())
///                 .map(Duration::from_secs),
///         },
///         Ok(r) if r.status().is_server_error() => Outcome::Ignore,
///         Ok(_) => Outcome::Success,
///         Err(_) => Outcome::Ignore,
///     }
/// }
///
/// let refused = Response::builder().status(429).header(RETRY_AFTER, "2").body(()).unwrap();
/// let retry_after = Some(Duration::from_secs(2));
/// assert_eq!(classify::<_, ()>(&Ok(refused)), Outcome::Throttled { retry_after });
/// let ok = Response::builder().status(StatusCode::OK).body(()).unwrap();
/// assert_eq!(classify::<_, ()>(&Ok(ok)), Outcome::Success);
/// ```
///
/// # Examples
///
/// ```
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use pacer::tower::{AdaptiveLayer, Outcome, RateLimitLayer};
/// use pacer::{Adaptive, Rate, RateLimiter};
/// use tower::{ServiceBuilder, ServiceExt};
/// use tokio::time::Instant;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let limiter = RateLimiter::new(Rate::per_second(100), 10);
/// let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(100));
/// // A destination that answers a status code; 429 means "wait a second".
/// let api = ServiceBuilder::new()
///     .layer(AdaptiveLayer::new(&adaptive, |status: &Result<u16, Infallible>| match status {
///         Ok(429) => Outcome::Throttled { retry_after: Some(Duration::from_secs(1)) },
///         _ => Outcome::Success,
///     }))
///     .layer(RateLimitLayer::new(adaptive.limiter()))
///     .service_fn(|status: u16| async move { Ok::<_, Infallible>(status) });
/// let start = Instant::now();
/// assert_eq!(api.clone().oneshot(429).await.unwrap(), 429);
/// assert_eq!(adaptive.rate(), Rate::new(80_000, Duration::from_secs(1000))); // 80/s
/// assert_eq!(api.oneshot(200).await.unwrap(), 200); // after the pause
/// assert_eq!(start.elapsed(), Duration::from_secs(1));
/// assert_eq!((adaptive.stats().successes, adaptive.stats().refusals), (1, 1));
/// # }
/// ```
#[derive(Clone)]
#[must_use = "a layer does nothing until it wraps a service"]
pub struct AdaptiveLayer<F> {
    adaptive: Adaptive,
    classify: F,
}

impl<F> AdaptiveLayer<F> {
    /// A layer that reports each response to `adaptive` as `classify(&result)` reads it. The
    /// classifier is any `Fn(&Result<S::Response, S::Error>) -> Outcome + Clone`.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::tower::{AdaptiveLayer, Outcome};
    /// use pacer::{Adaptive, Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(50), 5);
    /// let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(50));
    /// let _layer = AdaptiveLayer::new(&adaptive, |result: &Result<u16, String>| match result {
    ///     Ok(429) => Outcome::Throttled { retry_after: None },
    ///     Ok(_) => Outcome::Success,
    ///     Err(_) => Outcome::Ignore,
    /// });
    /// ```
    pub fn new(adaptive: &Adaptive, classify: F) -> Self {
        AdaptiveLayer {
            adaptive: adaptive.clone(),
            classify,
        }
    }
}

impl<S, F: Clone> Layer<S> for AdaptiveLayer<F> {
    type Service = AdaptiveService<S, F>;

    fn layer(&self, inner: S) -> Self::Service {
        AdaptiveService {
            inner,
            adaptive: self.adaptive.clone(),
            classify: self.classify.clone(),
        }
    }
}

impl<F> fmt::Debug for AdaptiveLayer<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveLayer")
            .field("adaptive", &self.adaptive)
            .finish_non_exhaustive()
    }
}

/// A service that reports each response of `S` to an [`Adaptive`]: built by
/// [`AdaptiveLayer`], which documents it.
///
/// `poll_ready` is the inner service's; `call` wraps the inner future in an
/// [`AdaptiveFuture`]. Every clone reports to the same controller.
///
/// # Examples
///
/// ```
/// use std::convert::Infallible;
/// use pacer::tower::{AdaptiveLayer, AdaptiveService, Outcome};
/// use pacer::{Adaptive, Rate, RateLimiter};
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
pub struct AdaptiveService<S, F> {
    inner: S,
    adaptive: Adaptive,
    classify: F,
}

impl<S, F> AdaptiveService<S, F> {
    /// The inner service.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::tower::{AdaptiveLayer, Outcome};
    /// use pacer::{Adaptive, Rate, RateLimiter};
    /// use tower_layer::Layer;
    ///
    /// let adaptive = Adaptive::new(
    ///     RateLimiter::new(Rate::per_second(1), 1), Rate::per_second(1), Rate::per_second(1));
    /// let service = AdaptiveLayer::new(&adaptive, |_: &Result<(), ()>| Outcome::Ignore).layer(7u8);
    /// assert_eq!(*service.get_ref(), 7);
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::tower::{AdaptiveLayer, Outcome};
    /// use pacer::{Adaptive, Rate, RateLimiter};
    /// use tower_layer::Layer;
    ///
    /// let adaptive = Adaptive::new(
    ///     RateLimiter::new(Rate::per_second(1), 1), Rate::per_second(1), Rate::per_second(1));
    /// let mut service =
    ///     AdaptiveLayer::new(&adaptive, |_: &Result<(), ()>| Outcome::Ignore).layer(7u8);
    /// *service.get_mut() += 1;
    /// assert_eq!(*service.get_ref(), 8);
    /// ```
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::tower::{AdaptiveLayer, Outcome};
    /// use pacer::{Adaptive, Rate, RateLimiter};
    /// use tower_layer::Layer;
    ///
    /// let adaptive = Adaptive::new(
    ///     RateLimiter::new(Rate::per_second(1), 1), Rate::per_second(1), Rate::per_second(1));
    /// let service = AdaptiveLayer::new(&adaptive, |_: &Result<(), ()>| Outcome::Ignore).layer(7u8);
    /// assert_eq!(service.into_inner(), 7);
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, F, Req> Service<Req> for AdaptiveService<S, F>
where
    S: Service<Req>,
    F: Fn(&Result<S::Response, S::Error>) -> Outcome + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = AdaptiveFuture<S::Future, F>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        AdaptiveFuture {
            response: self.inner.call(req),
            report: Some((self.adaptive.clone(), self.classify.clone())),
        }
    }
}

impl<S: fmt::Debug, F> fmt::Debug for AdaptiveService<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveService")
            .field("inner", &self.inner)
            .field("adaptive", &self.adaptive)
            .finish_non_exhaustive()
    }
}

pin_project! {
    /// Response future of [`AdaptiveService`]: the inner future, whose result is classified
    /// and reported when it completes, then returned unchanged. Dropped before that, it
    /// reports nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use pacer::tower::{AdaptiveLayer, Outcome};
    /// use pacer::{Adaptive, Rate, RateLimiter};
    /// use tower::ServiceExt;
    /// use tower_layer::Layer;
    /// use tower_service::Service;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let adaptive = Adaptive::new(
    ///     RateLimiter::new(Rate::per_second(10), 1), Rate::per_second(1), Rate::per_second(10));
    /// let echo = tower::service_fn(|n: u32| async move { Ok::<_, Infallible>(n) });
    /// let mut service =
    ///     AdaptiveLayer::new(&adaptive, |_: &Result<u32, Infallible>| Outcome::Success).layer(echo);
    /// let answered = service.ready().await.unwrap().call(1);
    /// let dropped = service.ready().await.unwrap().call(2);
    /// drop(dropped); // never completed, never reported
    /// assert_eq!(answered.await.unwrap(), 1);
    /// assert_eq!(adaptive.stats().successes, 1);
    /// # }
    /// ```
    #[must_use = "futures do nothing unless polled"]
    pub struct AdaptiveFuture<Fut, F> {
        #[pin]
        response: Fut,
        // Taken when the response is reported, so that it is reported once.
        report: Option<(Adaptive, F)>,
    }
}

impl<Fut, F, T, E> Future for AdaptiveFuture<Fut, F>
where
    Fut: Future<Output = Result<T, E>>,
    F: Fn(&Result<T, E>) -> Outcome,
{
    type Output = Result<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let me = self.project();
        let result = ready!(me.response.poll(cx));
        if let Some((adaptive, classify)) = me.report.take() {
            match classify(&result) {
                Outcome::Success => adaptive.on_success(),
                Outcome::Throttled { retry_after } => adaptive.on_throttled(retry_after),
                Outcome::Ignore => {}
            }
        }
        Poll::Ready(result)
    }
}

impl<Fut, F> fmt::Debug for AdaptiveFuture<Fut, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveFuture")
            .field("reported", &self.report.is_none())
            .finish_non_exhaustive()
    }
}
