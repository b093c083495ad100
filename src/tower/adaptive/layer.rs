//! [`AdaptiveLayer`]: reports each response of a service to an [`Adaptive`], as classified.

use std::fmt;

use tower_layer::Layer;

#[cfg(feature = "http")]
use super::outcome::Outcome;
use super::service::AdaptiveService;
use crate::Adaptive;

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
/// [`Outcome::Ignore`]: super::Outcome::Ignore
///
/// # A classifier for `http::Response`
///
/// With the `http` feature, [`AdaptiveLayer::http`] (or `AdaptiveLayer::new(&adaptive,
/// paced::tower::classify_http)`) reads `429`/`503`, `Retry-After` in both forms and the quota
/// headers. Without it, paced does not depend on `http`, and a classifier is a few lines:
/// `429` and `503` are refusals, with `Retry-After` in its delta-seconds form (`Retry-After:
/// 2`); the HTTP-date form (`Retry-After: Wed, 21 Oct 2026 07:28:00 GMT`) is not parsed and
/// reads as a refusal without a delay; other server errors and transport errors say nothing
/// about the rate; everything else went through.
///
/// ```
/// use std::time::Duration;
/// use http::{header::RETRY_AFTER, Response, StatusCode};
/// use paced::tower::Outcome;
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
/// use paced::tower::{AdaptiveLayer, Outcome, RateLimitLayer};
/// use paced::{Adaptive, Rate, RateLimiter};
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
/// assert_eq!((adaptive.stats().successes, adaptive.stats().throttled), (1, 1));
/// # }
/// ```
#[derive(Clone)]
#[must_use = "a layer does nothing until it wraps a service"]
pub struct AdaptiveLayer<F, A = Adaptive> {
    adaptive: A,
    classify: F,
}

impl<F> AdaptiveLayer<F> {
    /// A layer that reports each response to `adaptive` as `classify(&result)` reads it. The
    /// classifier is any `Fn(&Result<S::Response, S::Error>) -> Outcome + Clone`.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::tower::{AdaptiveLayer, Outcome};
    /// use paced::{Adaptive, Rate, RateLimiter};
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

#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
impl<B, E> AdaptiveLayer<fn(&Result<http::Response<B>, E>) -> Outcome> {
    /// A layer over an HTTP client that reports each response to `adaptive` as
    /// [`classify_http`](crate::tower::classify_http) reads it: `429` and `503` with their
    /// `Retry-After`, and the quota the headers announce (feature `http`). The body and error
    /// types are inferred from the service it wraps, once that service is called.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Duration;
    /// use http::Response;
    /// use paced::tower::{AdaptiveLayer, RateLimitLayer};
    /// use paced::{Adaptive, Rate, RateLimiter};
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(Rate::per_second(100), 10);
    /// let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(100));
    /// let api = ServiceBuilder::new()
    ///     .layer(AdaptiveLayer::http(&adaptive))
    ///     .layer(RateLimitLayer::new(adaptive.limiter()))
    ///     .service_fn(|_: ()| async {
    ///         let response = Response::builder()
    ///             .header("ratelimit-policy", r#""default";q=600;w=60"#)
    ///             .header("ratelimit", r#""default";r=599;t=60"#)
    ///             .body(())
    ///             .unwrap();
    ///         Ok::<_, Infallible>(response)
    ///     });
    /// api.oneshot(()).await.unwrap();
    /// assert_eq!(adaptive.rate(), Rate::per_second(10)); // 600 a minute
    /// # }
    /// ```
    pub fn http(adaptive: &Adaptive) -> Self {
        AdaptiveLayer::new(adaptive, super::classify_http::<B, E>)
    }
}

#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
impl<B, E, const N: usize>
    AdaptiveLayer<
        fn(&Result<http::Response<B>, E>) -> super::LimitsOutcome,
        crate::Adaptive<[u64; N]>,
    >
{
    /// A layer over an HTTP client that reports each response to `adaptive`, an
    /// [`Adaptive`](crate::Adaptive) of several limits, with every limit its headers announce
    /// ([`classify_http_limits`](crate::tower::classify_http_limits); feature `http`): an
    /// answer that went through sets each announced limit
    /// ([`on_limits`](crate::Adaptive::on_limits)); a `429` lowers the limits it
    /// announces with nothing left, or every adapted limit if it names none
    /// ([`on_throttled_limits`](crate::Adaptive::on_throttled_limits)), and pauses the
    /// limiter for its `Retry-After`.
    ///
    /// It only reports: the pacing is the caller's, with
    /// [`acquire`](crate::Adaptive#method.acquire-1) and the cost of each call.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::Response;
    /// use paced::tower::AdaptiveLayer;
    /// use paced::{Adaptive, Limit, RateLimiter, Rate};
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::builder(["requests", "tokens"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(10), 10))
    ///     .limit("tokens", Limit::bucket(Rate::per_second(1_000), 1_000))
    ///     .build()
    ///     .unwrap();
    /// let adaptive = Adaptive::builder(limiter)
    ///     .adapt(0, Rate::per_second(1), Rate::per_second(10))
    ///     .adapt(1, Rate::per_second(10), Rate::per_second(1_000))
    ///     .build()
    ///     .unwrap();
    /// let api = ServiceBuilder::new()
    ///     .layer(AdaptiveLayer::http_multi(&adaptive))
    ///     .service_fn(|_: ()| async {
    ///         let response = Response::builder()
    ///             .status(429)
    ///             .header("x-ratelimit-remaining-requests", "5")
    ///             .header("x-ratelimit-reset-requests", "1s")
    ///             .header("x-ratelimit-remaining-tokens", "0")
    ///             .header("x-ratelimit-reset-tokens", "2s")
    ///             .body(())
    ///             .unwrap();
    ///         Ok::<_, Infallible>(response)
    ///     });
    /// adaptive.acquire([1, 500]).await;
    /// api.oneshot(()).await.unwrap();
    /// assert_eq!(adaptive.rate(0), Some(Rate::per_second(10))); // requests untouched
    /// assert_eq!(adaptive.rate(1), Some(Rate::per_second(800))); // tokens lowered
    /// # }
    /// ```
    pub fn http_multi(adaptive: &crate::Adaptive<[u64; N]>) -> Self {
        AdaptiveLayer {
            adaptive: adaptive.clone(),
            classify: super::classify_http_limits::<B, E>,
        }
    }
}

impl<S, F: Clone, A: Clone> Layer<S> for AdaptiveLayer<F, A> {
    type Service = AdaptiveService<S, F, A>;

    fn layer(&self, inner: S) -> Self::Service {
        AdaptiveService::new(inner, self.adaptive.clone(), self.classify.clone())
    }
}

/// Shows nothing of the controller: its `Debug` reads its state, under its lock.
impl<F, A> fmt::Debug for AdaptiveLayer<F, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveLayer").finish_non_exhaustive()
    }
}
