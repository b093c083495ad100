//! [`RateLimited`]: why an enforcing [`RateLimit`](super::RateLimit) refused a request.

use std::fmt;
use std::time::Duration;

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
/// [`retry_after`](RateLimited::retry_after) says how long until a request of the same cost
/// would conform, counting the requests already waiting on the quota; the `Retry-After` header
/// wants whole seconds, which [`retry_after_secs`](RateLimited::retry_after_secs) rounds up.
///
/// # Examples
///
/// ```
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use pacer::tower::{RateLimitLayer, RateLimited};
/// use pacer::{Rate, RateLimiter};
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
/// let refused = err.downcast_ref::<RateLimited>().unwrap();
/// assert_eq!(refused.retry_after(), Duration::from_millis(500));
/// assert_eq!(refused.retry_after_secs(), 1);
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RateLimited {
    retry_after: Duration,
}

impl RateLimited {
    pub(crate) fn new(retry_after: Duration) -> RateLimited {
        RateLimited { retry_after }
    }

    /// How long until a request of the same cost would conform, if nothing else were taken
    /// meanwhile; `Duration::MAX` if it never conforms without waiting (a cost above the
    /// burst).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Duration;
    /// use pacer::tower::{RateLimitLayer, RateLimited};
    /// use pacer::{Rate, RateLimiter};
    /// use tower::ServiceExt;
    /// use tower_layer::Layer;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let quota = RateLimiter::new(Rate::per_second(10), 5);
    /// let echo = tower::service_fn(|n: u64| async move { Ok::<_, Infallible>(n) });
    /// let server = RateLimitLayer::new(&quota).cost(|n: &u64| *n).enforcing().layer(echo);
    /// let err = server.oneshot(6).await.unwrap_err();
    /// let refused = err.downcast_ref::<RateLimited>().unwrap();
    /// assert_eq!(refused.retry_after(), Duration::MAX);
    /// # }
    /// ```
    #[must_use]
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// [`retry_after`](RateLimited::retry_after) in whole seconds, rounded up (so that a
    /// client that waits that long conforms), for a `Retry-After` header; saturates at
    /// `u64::MAX`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Duration;
    /// use pacer::tower::{RateLimitLayer, RateLimited};
    /// use pacer::{Rate, RateLimiter};
    /// use tower::ServiceExt;
    /// use tower_layer::Layer;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let quota = RateLimiter::new(Rate::new(1, Duration::from_secs(60)), 1);
    /// let echo = tower::service_fn(|n: u64| async move { Ok::<_, Infallible>(n) });
    /// let server = RateLimitLayer::new(&quota).enforcing().layer(echo);
    /// server.clone().oneshot(1).await.unwrap();
    /// let err = server.oneshot(2).await.unwrap_err();
    /// assert_eq!(err.downcast_ref::<RateLimited>().unwrap().retry_after_secs(), 60);
    /// # }
    /// ```
    #[must_use]
    pub fn retry_after_secs(&self) -> u64 {
        let secs = self.retry_after.as_secs();
        if self.retry_after.subsec_nanos() > 0 {
            secs.saturating_add(1)
        } else {
            secs
        }
    }
}

impl fmt::Display for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.retry_after == Duration::MAX {
            f.write_str("rate limited: the request costs more than the burst")
        } else {
            write!(f, "rate limited: retry after {:?}", self.retry_after)
        }
    }
}

impl std::error::Error for RateLimited {}
