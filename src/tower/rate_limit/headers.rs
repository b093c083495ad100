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
/// A [`RateLimiter`](crate::RateLimiter) announces every limit, in the order its
/// builder was given them, and a keyed layer over a
/// `KeyedRateLimiter<K, [u64; N]>` every limit of the request's key
/// (its own limits, or the builder's) the same way: the draft's fields carry one policy per limit, named after the
/// limit's dimension and its window (`W` above, in words when it is a second, minute, hour or
/// day: `"requests-minute"`, `"tokens-day"`, else `"tokens-90s"`; a name that repeats takes
/// `-2`, `-3`, ... after it), with the quota unit `qu` set to the dimension's name for a
/// dimension not called `requests` (the draft's default unit); a bucket maps as above, and a
/// fixed window so:
///
/// ```text
/// RateLimit-Policy: "requests-minute";q=500;w=60, "tokens-day";q=1000000;w=86400;qu="tokens"
/// RateLimit: "requests-minute";r=499;t=1, "tokens-day";r=998200;t=41000
/// ```
///
/// | field | a fixed window's value |
/// |---|---|
/// | `q`, `w` | its quota and its length in seconds (rounded up, at least 1) |
/// | `r` | what is left of the quota in the window in force |
/// | `t` | the seconds until nothing of it is used (the window's end; later while a debt carries into the next windows), rounded up |
///
/// Names are made of the dimension's letters, digits, `-`, `_` and `.` (any other character
/// becomes `_`). The `X-RateLimit-*` trio has room for one limit: it announces the one with
/// the fewest whole tokens left (of those, the one that takes longest to reset).
/// [`limits_from_headers`](crate::tower::limits_from_headers) reads every policy back, each
/// with its name, its dimension (from `qu`) and its numbers.
///
/// The values are read from the quota right after the decision: under concurrent requests
/// they may already count a request decided a moment later, so `remaining` is never more than
/// there is and `reset` never early. Quotas that are not a plain token bucket, a
/// `RateLimiter` nor a `KeyedRateLimiter` (a warming-up limiter, a
/// [`Stagger`](crate::Stagger), a Redis quota) announce nothing but `Retry-After`.
///
/// # Examples
///
/// ```
/// use paced::tower::QuotaHeaders;
///
/// let both = QuotaHeaders::Both;
/// assert_ne!(both, QuotaHeaders::Draft);
/// ```
///
/// A server that holds each client to requests and tokens per minute announces both:
///
/// ```
/// use std::convert::Infallible;
/// use paced::tower::{limits_from_headers, Dimension, QuotaHeaders, RateLimitLayer};
/// use paced::{Limit, RateLimiter, Rate};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let quota = RateLimiter::builder(["requests", "tokens"])
///     .limit("requests", Limit::bucket(Rate::per_minute(500), 500))
///     .limit("tokens", Limit::bucket(Rate::per_minute(40_000), 40_000))
///     .build()
///     .unwrap();
/// let api = ServiceBuilder::new()
///     .layer(
///         RateLimitLayer::new(&quota)
///             .cost(|prompt: &String| [1, prompt.len() as u64])
///             .enforcing()
///             .headers(QuotaHeaders::Draft),
///     )
///     .service_fn(|_: String| async { Ok::<_, Infallible>(http::Response::new(())) });
/// let answer = api.oneshot("x".repeat(1_000)).await.unwrap();
/// assert_eq!(
///     answer.headers()["ratelimit-policy"],
///     r#""requests-minute";q=500;w=60, "tokens-minute";q=40000;w=60;qu="tokens""#
/// );
/// assert_eq!(
///     answer.headers()["ratelimit"],
///     r#""requests-minute";r=499;t=1, "tokens-minute";r=39000;t=2"#
/// );
/// let limits = limits_from_headers(answer.headers(), std::time::SystemTime::now());
/// assert_eq!((limits[1].name.as_str(), limits[1].dimension), ("tokens-minute", Dimension::Tokens));
/// assert_eq!(limits[1].announced.remaining, 39_000);
/// # }
/// ```
///
/// One that holds each tenant to its own requests and tokens per minute announces the
/// request's tenant's:
///
/// ```
/// use std::convert::Infallible;
/// use paced::tower::{QuotaHeaders, RateLimitLayer};
/// use paced::{KeyedRateLimiter, Limit, Rate};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// type Prompt = (&'static str, u64); // (tenant, tokens)
/// let tenants = KeyedRateLimiter::builder(["requests", "tokens"])
///     .limit("requests", Limit::bucket(Rate::per_minute(500), 500))
///     .limit("tokens", Limit::bucket(Rate::per_minute(40_000), 40_000))
///     .build()
///     .unwrap();
/// let api = ServiceBuilder::new()
///     .layer(
///         RateLimitLayer::keyed(&tenants, |p: &Prompt| p.0)
///             .cost(|p: &Prompt| [1, p.1])
///             .enforcing()
///             .headers(QuotaHeaders::Draft),
///     )
///     .service_fn(|_: Prompt| async { Ok::<_, Infallible>(http::Response::new(())) });
/// api.clone().oneshot(("acme", 1_000)).await.unwrap();
/// let answer = api.oneshot(("globex", 2_000)).await.unwrap();
/// assert_eq!(
///     answer.headers()["ratelimit"],
///     r#""requests-minute";r=499;t=1, "tokens-minute";r=38000;t=3"#
/// );
/// # }
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

/// A window's seconds in words, for a policy's name.
fn window_name(secs: u64) -> String {
    match secs {
        1 => "second".to_owned(),
        60 => "minute".to_owned(),
        3_600 => "hour".to_owned(),
        86_400 => "day".to_owned(),
        n => format!("{n}s"),
    }
}

/// A dimension's name as a policy's: letters, digits, `-`, `_` and `.`; any other character
/// `_`.
fn token(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Writes `which` headers for every limit of `states` (one per limit, each with its
/// dimension's name) into `headers`.
pub(crate) fn write_all(
    headers: &mut HeaderMap,
    which: QuotaHeaders,
    states: &[(String, LimitState)],
) {
    if matches!(which, QuotaHeaders::Draft | QuotaHeaders::Both) {
        let mut names: Vec<String> = Vec::with_capacity(states.len());
        let (mut policy, mut now) = (String::new(), String::new());
        for (dimension, state) in states {
            let window = secs_ceil(state.window).max(1);
            let reset = secs_ceil(state.reset);
            let dimension = token(dimension);
            let base = format!("{dimension}-{}", window_name(window));
            let mut name = base.clone();
            let mut n = 1;
            while names.contains(&name) {
                n += 1;
                name = format!("{base}-{n}");
            }
            if !policy.is_empty() {
                policy.push_str(", ");
                now.push_str(", ");
            }
            policy.push_str(&format!("\"{name}\";q={};w={window}", state.limit));
            if dimension != "requests" {
                policy.push_str(&format!(";qu=\"{dimension}\""));
            }
            now.push_str(&format!("\"{name}\";r={};t={reset}", state.remaining));
            names.push(name);
        }
        // Quotes, digits, semicolons, commas, spaces and the characters of `token`: always a
        // valid header value.
        if let (Ok(policy), Ok(now)) = (HeaderValue::from_str(&policy), HeaderValue::from_str(&now))
        {
            if !states.is_empty() {
                headers.insert(HeaderName::from_static("ratelimit-policy"), policy);
                headers.insert(HeaderName::from_static("ratelimit"), now);
            }
        }
    }
    if matches!(which, QuotaHeaders::XRateLimit | QuotaHeaders::Both) {
        // The trio carries one limit: the one with the fewest left (counted in its own units, so
        // across dimensions not always the one that refuses first), then the longest to reset.
        if let Some((_, binding)) = states
            .iter()
            .min_by_key(|(_, s)| (s.remaining, std::cmp::Reverse(s.reset)))
        {
            write(headers, QuotaHeaders::XRateLimit, binding);
        }
    }
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
    states: &[(String, LimitState)],
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
    write_all(headers, which, states);
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
        // A limiter of several limits: each, with its dimension's name.
        states: Vec<(String, LimitState)>,
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
            states: Vec::new(),
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
            if me.state.is_none() {
                *me.states = Q::states(me.permit.as_mut());
            }
            // A future is not polled after it completed (as tower's own futures, this one
            // panics if it is).
            let (mut service, req) = me
                .call
                .take()
                .expect("paced::tower::AnnouncingFuture polled after completion");
            if let Err(refused) = decided {
                // Dropping the ready inner service gives back whatever its readiness reserved.
                drop(service);
                return Poll::Ready(Ok(refusal(
                    refused,
                    *me.headers,
                    me.state.as_ref(),
                    me.states,
                )));
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
        write_all(response.headers_mut(), *me.headers, me.states);
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
    fn several_limits_are_several_policies_named_after_dimension_and_window() {
        let mut headers = HeaderMap::new();
        let states = [
            ("requests".to_owned(), state(500, 60_000, 499, 120)),
            ("tokens".to_owned(), state(40_000, 60_000, 39_000, 1_500)),
            (
                "tokens".to_owned(),
                state(1_000_000, 86_400_000, 0, 40_000_001),
            ),
            ("tokens".to_owned(), state(7, 86_400_000, 7, 0)),
            ("in put\"".to_owned(), state(9, 90_000, 9, 0)),
        ];
        write_all(&mut headers, QuotaHeaders::Both, &states);
        assert_eq!(
            headers["ratelimit-policy"],
            "\"requests-minute\";q=500;w=60, \"tokens-minute\";q=40000;w=60;qu=\"tokens\", \
             \"tokens-day\";q=1000000;w=86400;qu=\"tokens\", \"tokens-day-2\";q=7;w=86400;qu=\"tokens\", \
             \"in_put_-90s\";q=9;w=90;qu=\"in_put_\""
        );
        assert_eq!(
            headers["ratelimit"],
            "\"requests-minute\";r=499;t=1, \"tokens-minute\";r=39000;t=2, \
             \"tokens-day\";r=0;t=40001, \"tokens-day-2\";r=7;t=0, \"in_put_-90s\";r=9;t=0"
        );
        // The trio: the limit with the fewest left.
        assert_eq!(headers["x-ratelimit-limit"], "1000000");
        assert_eq!(headers["x-ratelimit-remaining"], "0");
        assert_eq!(headers["x-ratelimit-reset"], "40001");
        // No limits, no headers.
        let mut headers = HeaderMap::new();
        write_all(&mut headers, QuotaHeaders::Both, &[]);
        assert!(headers.is_empty());
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
