//! [`classify_http`]: the classifier for an `http::Response` (feature `http`).

use super::outcome::Outcome;
use crate::tower::headers::{quota_from_headers, retry_after};

/// Reads an HTTP response for an [`AdaptiveLayer`](super::AdaptiveLayer) (feature `http`):
///
/// - `429 Too Many Requests` and `503 Service Unavailable`: [`Outcome::Throttled`], with the
///   delay of `Retry-After` ([`retry_after`](crate::tower::retry_after): delta-seconds or an
///   HTTP-date), or else, if the quota headers say nothing is left, the time until they say it
///   is restored;
/// - other server errors, and transport errors: [`Outcome::Ignore`] (they say nothing about
///   the rate);
/// - anything else went through: [`Outcome::Quota`] if the headers announce a quota
///   ([`quota_from_headers`](crate::tower::quota_from_headers): `RateLimit` /
///   `RateLimit-Policy`, or `X-RateLimit-*`), else [`Outcome::Success`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use http::Response;
/// use paced::tower::{classify_http, Outcome};
/// use paced::Announced;
///
/// let ok = Response::builder()
///     .header("x-ratelimit-remaining", "4000")
///     .header("x-ratelimit-reset", "1800")
///     .body(())
///     .unwrap();
/// let quota = match classify_http::<_, ()>(&Ok(ok)) {
///     Outcome::Quota(quota) => quota,
///     other => panic!("{other:?}"),
/// };
/// assert_eq!((quota.remaining, quota.reset), (4000, Duration::from_secs(1800)));
///
/// let refused = Response::builder().status(429).header("retry-after", "2").body(()).unwrap();
/// let retry_after = Some(Duration::from_secs(2));
/// assert_eq!(classify_http::<_, ()>(&Ok(refused)), Outcome::Throttled { retry_after });
/// let broken = Response::builder().status(500).body(()).unwrap();
/// assert_eq!(classify_http::<_, ()>(&Ok(broken)), Outcome::Ignore);
/// ```
pub fn classify_http<B, E>(result: &Result<http::Response<B>, E>) -> Outcome {
    let Ok(response) = result else {
        return Outcome::Ignore;
    };
    let headers = response.headers();
    match response.status().as_u16() {
        429 | 503 => Outcome::Throttled {
            retry_after: retry_after(headers).or_else(|| {
                quota_from_headers(headers)
                    .filter(|q| q.remaining == 0)
                    .map(|q| q.reset)
            }),
        },
        _ if response.status().is_server_error() => Outcome::Ignore,
        _ => quota_from_headers(headers).map_or(Outcome::Success, Outcome::Quota),
    }
}
