//! Quota headers on an enforcing layer's responses (feature `http`): which ones
//! ([`QuotaHeaders`]), the layer's mode that writes them ([`Announcing`]), its future
//! ([`AnnouncingFuture`]), and how a token bucket maps onto them.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::error::NotUntil;
use crate::stats::LimitState;
use crate::tower::request::RequestLimiter;

/// Which quota headers an enforcing [`RateLimitLayer`](super::RateLimitLayer) announces on
/// every response it handles, allowed or refused (see
/// [`headers`](super::RateLimitLayer::headers)).
///
/// A token bucket (a [`RateLimiter`](crate::RateLimiter) or one key's bucket of a
/// [`KeyedRateLimiter`](crate::KeyedRateLimiter)) maps onto the fields so:
///
/// | field | value |
/// |---|---|
/// | `RateLimit-Policy: "default";q=Q;w=W` | `Q` = the burst; `W` = the seconds the bucket takes to refill from empty (`burst / rate`), rounded up, at least 1: `Q` per `W` is the rate |
/// | `RateLimit: "default";r=R;t=T` | `R` = the whole tokens left after this request; `T` = the seconds until the bucket is full again, rounded up |
/// | `X-RateLimit-Limit` | the burst |
/// | `X-RateLimit-Remaining` | the whole tokens left after this request |
/// | `X-RateLimit-Reset` | the seconds until the bucket is full again, rounded up (a delay, not an epoch time) |
///
/// The values are read from the quota right after the decision: under concurrent requests
/// they may already count a request decided a moment later, so `remaining` is never more than
/// there is and `reset` never early. Quotas that are not a plain token bucket (a warming-up
/// limiter, a [`Stagger`](crate::Stagger), a Redis quota) announce nothing but `Retry-After`.
///
/// # Examples
///
/// ```
/// use paced::tower::QuotaHeaders;
///
/// let both = QuotaHeaders::Both;
/// assert_ne!(both, QuotaHeaders::Draft);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QuotaHeaders {
    /// The IETF httpapi draft "RateLimit header fields for HTTP": `RateLimit-Policy` and
    /// `RateLimit`.
    Draft,
    /// The de facto trio `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset`
    /// (GitHub, Shopify, Okta and many others).
    XRateLimit,
    /// Both sets.
    Both,
}

/// The mode of an enforcing layer that announces its quota: refuses what does not conform, and
/// writes [`QuotaHeaders`] on every response (made with
/// [`headers`](super::RateLimitLayer::headers)).
///
/// # Examples
///
/// ```
/// use paced::tower::{Announcing, QuotaHeaders, RateLimitLayer};
/// use paced::{Rate, RateLimiter};
///
/// let quota = RateLimiter::new(Rate::per_second(10), 5);
/// let _layer: RateLimitLayer<RateLimiter, _, Announcing> =
///     RateLimitLayer::new(&quota).enforcing().headers(QuotaHeaders::Draft);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Announcing {
    headers: QuotaHeaders,
}

impl Announcing {
    /// Enforcing, announcing `headers`.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::tower::{Announcing, QuotaHeaders};
    ///
    /// assert_eq!(Announcing::new(QuotaHeaders::Both).headers(), QuotaHeaders::Both);
    /// ```
    #[must_use]
    pub const fn new(headers: QuotaHeaders) -> Announcing {
        Announcing { headers }
    }

    /// The headers announced.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::tower::{Announcing, QuotaHeaders};
    ///
    /// assert_eq!(Announcing::new(QuotaHeaders::Draft).headers(), QuotaHeaders::Draft);
    /// ```
    #[must_use]
    pub const fn headers(&self) -> QuotaHeaders {
        self.headers
    }
}

/// Whole seconds, rounded up, so that a client that waits that long is never early.
fn secs_ceil(d: Duration) -> u64 {
    let secs = d.as_secs();
    if d.subsec_nanos() > 0 {
        secs.saturating_add(1)
    } else {
        secs
    }
}

fn number(n: u64) -> HeaderValue {
    HeaderValue::from(n)
}

/// Writes `which` headers for `state` into `headers`.
pub(crate) fn write(headers: &mut HeaderMap, which: QuotaHeaders, state: &LimitState) {
    let window = secs_ceil(state.window).max(1);
    let reset = secs_ceil(state.reset);
    if matches!(which, QuotaHeaders::Draft | QuotaHeaders::Both) {
        let policy = format!("\"default\";q={};w={window}", state.limit);
        let now = format!("\"default\";r={};t={reset}", state.remaining);
        // Digits, quotes, semicolons and letters only: always a valid header value.
        if let Ok(policy) = HeaderValue::from_str(&policy) {
            headers.insert(HeaderName::from_static("ratelimit-policy"), policy);
        }
        if let Ok(now) = HeaderValue::from_str(&now) {
            headers.insert(HeaderName::from_static("ratelimit"), now);
        }
    }
    if matches!(which, QuotaHeaders::XRateLimit | QuotaHeaders::Both) {
        headers.insert(
            HeaderName::from_static("x-ratelimit-limit"),
            number(state.limit),
        );
        headers.insert(
            HeaderName::from_static("x-ratelimit-remaining"),
            number(state.remaining),
        );
        headers.insert(HeaderName::from_static("x-ratelimit-reset"), number(reset));
    }
}

/// The `429 Too Many Requests` an announcing layer answers a refusal with.
fn refusal<B: Default>(
    refused: NotUntil,
    which: QuotaHeaders,
    state: Option<&LimitState>,
) -> Response<B> {
    let mut response = Response::new(B::default());
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let headers = response.headers_mut();
    if !refused.is_never() {
        headers.insert(RETRY_AFTER, number(refused.retry_after_secs()));
    }
    if let Some(state) = state {
        write(headers, which, state);
    }
    response
}

pin_project! {
    /// The future of an announcing [`RateLimit`](super::RateLimit): the quota decided, then
    /// the inner service's response with the quota headers, or a `429 Too Many Requests` with
    /// `Retry-After` and the quota headers.
    #[must_use = "futures do nothing unless polled"]
    pub struct AnnouncingFuture<S, Req, Q>
    where
        S: Service<Req>,
        Q: RequestLimiter<Req>,
    {
        #[pin]
        permit: Q::Permit,
        cost: Q::Cost,
        headers: QuotaHeaders,
        // The ready inner service and the request, until the decision.
        call: Option<(S, Req)>,
        state: Option<LimitState>,
        #[pin]
        response: Option<S::Future>,
    }
}

impl<S, Req, Q> AnnouncingFuture<S, Req, Q>
where
    S: Service<Req>,
    Q: RequestLimiter<Req>,
{
    pub(super) fn new(
        permit: Q::Permit,
        cost: Q::Cost,
        headers: QuotaHeaders,
        ready: S,
        req: Req,
    ) -> Self {
        AnnouncingFuture {
            permit,
            cost,
            headers,
            call: Some((ready, req)),
            state: None,
            response: None,
        }
    }
}

impl<S, Req, Q, B> Future for AnnouncingFuture<S, Req, Q>
where
    S: Service<Req, Response = Response<B>>,
    Q: RequestLimiter<Req>,
    B: Default,
{
    type Output = Result<Response<B>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut me = self.project();
        if me.response.is_none() {
            let decided = ready!(Q::poll_try_acquire(me.permit.as_mut(), cx, *me.cost));
            *me.state = Q::state(me.permit.as_mut());
            // A future is not polled after it completed (as tower's own futures, this one
            // panics if it is).
            let (mut service, req) = me
                .call
                .take()
                .expect("paced::tower::AnnouncingFuture polled after completion");
            if let Err(refused) = decided {
                // Dropping the ready inner service gives back whatever its readiness reserved.
                drop(service);
                return Poll::Ready(Ok(refusal(refused, *me.headers, me.state.as_ref())));
            }
            me.response.set(Some(service.call(req)));
        }
        let Some(response) = me.response.as_pin_mut() else {
            return Poll::Pending;
        };
        let mut response = ready!(response.poll(cx))?;
        if let Some(state) = me.state.as_ref() {
            write(response.headers_mut(), *me.headers, state);
        }
        Poll::Ready(Ok(response))
    }
}

impl<S, Req, Q> fmt::Debug for AnnouncingFuture<S, Req, Q>
where
    S: Service<Req>,
    Q: RequestLimiter<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnnouncingFuture")
            .field("cost", &self.cost)
            .field("headers", &self.headers)
            .field("decided", &self.call.is_none())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(limit: u64, window_ms: u64, remaining: u64, reset_ms: u64) -> LimitState {
        LimitState {
            limit,
            window: Duration::from_millis(window_ms),
            remaining,
            reset: Duration::from_millis(reset_ms),
        }
    }

    #[test]
    fn a_bucket_maps_onto_both_sets_of_headers() {
        let mut headers = HeaderMap::new();
        write(
            &mut headers,
            QuotaHeaders::Both,
            &state(100, 10_000, 42, 5_800),
        );
        assert_eq!(headers["ratelimit-policy"], "\"default\";q=100;w=10");
        assert_eq!(headers["ratelimit"], "\"default\";r=42;t=6");
        assert_eq!(headers["x-ratelimit-limit"], "100");
        assert_eq!(headers["x-ratelimit-remaining"], "42");
        assert_eq!(headers["x-ratelimit-reset"], "6");
    }

    #[test]
    fn windows_below_a_second_read_one_and_a_full_bucket_resets_now() {
        let mut headers = HeaderMap::new();
        write(&mut headers, QuotaHeaders::Draft, &state(5, 50, 5, 0));
        assert_eq!(headers["ratelimit-policy"], "\"default\";q=5;w=1");
        assert_eq!(headers["ratelimit"], "\"default\";r=5;t=0");
        assert!(!headers.contains_key("x-ratelimit-limit"));
        let mut headers = HeaderMap::new();
        write(
            &mut headers,
            QuotaHeaders::XRateLimit,
            &state(u64::MAX, u64::MAX, 0, u64::MAX),
        );
        assert_eq!(headers["x-ratelimit-limit"], u64::MAX.to_string().as_str());
        assert!(!headers.contains_key("ratelimit"));
    }
}
