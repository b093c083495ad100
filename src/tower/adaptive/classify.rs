//! [`classify_http`]: the classifier for an `http::Response` (feature `http`).

use super::outcome::Outcome;
use std::time::SystemTime;

use crate::tower::dialects::{binding_request_limit, limits_from_headers};
use crate::tower::headers::retry_after;

/// Reads an HTTP response for an [`AdaptiveLayer`](super::AdaptiveLayer) (feature `http`):
///
/// - `429 Too Many Requests` and `503 Service Unavailable`: [`Outcome::Throttled`], with the
///   delay of `Retry-After` ([`retry_after`](crate::tower::retry_after): delta-seconds or an
///   HTTP-date), or else, if the quota headers say a limit has nothing left, the time until
///   they say it is restored (the longest, if several have nothing left: of any dimension, a
///   refusal for want of tokens too is lifted only then);
/// - other server errors, and transport errors: [`Outcome::Ignore`] (they say nothing about
///   the rate);
/// - anything else went through: [`Outcome::Quota`] if the headers announce a limit of
///   requests ([`quota_from_headers`](crate::tower::quota_from_headers): `RateLimit` /
///   `RateLimit-Policy`, `X-RateLimit-*`, OpenAI's and Anthropic's headers; of several, the
///   one that binds, [`binding_request_limit`](crate::tower::binding_request_limit)), else
///   [`Outcome::Success`]. Limits of tokens are not reported: a request-rate `Adaptive`
///   cannot pace them; a limiter of several dimensions
///   ([`limits_from_headers`](crate::tower::limits_from_headers) reads them all) takes them.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use http::Response;
/// use paced::tower::{classify_http, Outcome};
/// use paced::limiter::Announced;
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
                limits_from_headers(headers, SystemTime::now())
                    .iter()
                    .filter(|l| l.announced.remaining == 0)
                    .map(|l| l.announced.reset)
                    .max()
            }),
        },
        _ if response.status().is_server_error() => Outcome::Ignore,
        _ => binding_request_limit(&limits_from_headers(headers, SystemTime::now()))
            .map_or(Outcome::Success, |l| Outcome::Quota(l.announced)),
    }
}
