//! [`RateLimited`], the crate's one refusal ([`NotUntil`]), and the [`BoxError`] it travels in.

use crate::error::NotUntil;

/// The error type of an enforcing [`RateLimit`](super::RateLimit): the inner service's error
/// or a [`RateLimited`] refusal, boxed, as tower's own `LoadShed` and `Timeout` do.
///
/// A box rather than an enum because that is what the rest of the tower stack (`Buffer`,
/// `Timeout`, axum's `HandleErrorLayer`) passes along: a refusal is found with
/// `err.downcast_ref::<RateLimited>()`, and any other error is the inner service's, unchanged.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An enforcing [`RateLimit`](super::RateLimit) refused the request: it did not conform when
/// it arrived. Nothing was charged and the inner service was not called.
///
/// It is the crate's one refusal, [`NotUntil`], under the name a tower user looks for: a
/// server maps it to `429 Too Many Requests` with `Retry-After:`
/// [`retry_after_secs`](NotUntil::retry_after_secs) as it maps every other refusal of the
/// crate. [`retry_after`](NotUntil::retry_after) counts the requests already waiting on the
/// quota; [`is_never`](NotUntil::is_never) says the request costs more than the burst.
///
/// # Examples
///
/// ```
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use paced::tower::{RateLimitLayer, RateLimited};
/// use paced::{NotUntil, Rate, RateLimiter};
/// use tower::ServiceExt;
/// use tower_layer::Layer;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let quota = RateLimiter::new(Rate::per_second(2), 1);
/// let echo = tower::service_fn(|req: &'static str| async move { Ok::<_, Infallible>(req) });
/// let server = RateLimitLayer::new(&quota).enforcing().layer(echo);
/// assert_eq!(server.clone().oneshot("first").await.unwrap(), "first");
/// let err = server.oneshot("second").await.unwrap_err();
/// let refused: &NotUntil = err.downcast_ref::<RateLimited>().unwrap();
/// assert_eq!(refused.retry_after(), Duration::from_millis(500));
/// assert_eq!(refused.retry_after_secs(), 1);
/// assert!(!refused.is_never());
/// # }
/// ```
pub type RateLimited = NotUntil;
