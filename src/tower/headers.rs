//! Reading a destination's refusal and quota headers (feature `http`): `Retry-After`, and the
//! quota that binds a request rate (`dialects.rs` reads every limit, in each dialect).
//!
//! Every parser here is defensive: a header that is missing, malformed, negative, non-finite
//! or not ASCII reads as absent, a number too large for a `u64` reads as absent, and a delay
//! longer than [`MAX_DELAY`] (a year) reads as `MAX_DELAY`. None of them panics, and whatever
//! they return, [`Adaptive::on_quota`](crate::Adaptive::on_quota) keeps the rate within its
//! `[min, max]`.

use std::time::{Duration, SystemTime};

use http::header::{HeaderMap, HeaderName, RETRY_AFTER};

use super::dialects::{binding_request_limit, limits_from_headers};
use super::values::MAX_DELAY;
use crate::limiter::Announced;

/// `Retry-After` (RFC 9110): delta-seconds (`120`) or an HTTP-date
/// (`Wed, 21 Oct 2026 07:28:00 GMT`, parsed with `httpdate`; a date in the past is a zero
/// delay). Anything else reads as `None`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use http::HeaderMap;
/// use paced::tower::retry_after;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("retry-after", "2".parse().unwrap());
/// assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
/// headers.insert("retry-after", "Thu, 01 Jan 1970 00:00:00 GMT".parse().unwrap());
/// assert_eq!(retry_after(&headers), Some(Duration::ZERO)); // in the past
/// headers.insert("retry-after", "-1".parse().unwrap());
/// assert_eq!(retry_after(&headers), None);
/// ```
#[must_use]
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = header_str(headers, &RETRY_AFTER)?;
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        let secs = value.parse::<u64>().ok()?;
        return Some(Duration::from_secs(secs).min(MAX_DELAY));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    let delay = date
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO);
    Some(delay.min(MAX_DELAY))
}

/// The quota a response announces for requests, if it announces one: of every limit
/// [`limits_from_headers`](crate::tower::limits_from_headers) reads (the IETF draft's
/// `RateLimit` / `RateLimit-Policy` with one policy or several, or its older forms), the de facto `X-RateLimit-*`
/// with GitHub's and Discord's forms, OpenAI's `x-ratelimit-*-requests` and Anthropic's
/// `anthropic-ratelimit-requests-*`), the one that binds
/// ([`binding_request_limit`](crate::tower::binding_request_limit): the lowest rate among those
/// that count requests), read against the system clock. Limits of tokens are not taken.
///
/// - The IETF draft (draft-ietf-httpapi-ratelimit-headers): `RateLimit: "default";r=50;t=30`
///   (`remaining`, `reset` in seconds) and `RateLimit-Policy: "default";q=100;w=60` (`limit`
///   per `window` in seconds). Only the parameters `r`, `t`, `q` and `w` are read, as
///   non-negative integers; each item's policy is the one of the same name (or, for a single
///   item, the first). An item needs `r` and `t`. Without one, the draft's older forms:
///   `RateLimit: limit=100, remaining=25, reset=5`, or `RateLimit-Limit`, `-Remaining` and
///   `-Reset`.
/// - Without those, the de facto headers: `X-RateLimit-Remaining` with `X-RateLimit-Reset-After`
///   (Discord: seconds, fractions allowed) or `X-RateLimit-Reset`: delta seconds, or, above
///   [`EPOCH_THRESHOLD_SECS`](super::EPOCH_THRESHOLD_SECS) (10⁹), Unix epoch seconds (GitHub, Discord), read against the
///   system clock (a time in the past is a zero reset). `X-RateLimit-Limit` (its leading
///   integer: `100, 100;w=60` reads 100) is the `limit`, with no window.
///
/// A quota needs its remaining calls and its reset; `None` without them.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use http::HeaderMap;
/// use paced::tower::quota_from_headers;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("ratelimit-policy", r#""default";q=100;w=60"#.parse().unwrap());
/// headers.insert("ratelimit", r#""default";r=50;t=30"#.parse().unwrap());
/// let quota = quota_from_headers(&headers).unwrap();
/// assert_eq!((quota.remaining, quota.reset), (50, Duration::from_secs(30)));
/// assert_eq!((quota.limit, quota.window), (Some(100), Some(Duration::from_secs(60))));
///
/// let mut headers = HeaderMap::new();
/// headers.insert("x-ratelimit-limit", "5000".parse().unwrap());
/// headers.insert("x-ratelimit-remaining", "4000".parse().unwrap());
/// headers.insert("x-ratelimit-reset", "1800".parse().unwrap());
/// let quota = quota_from_headers(&headers).unwrap();
/// assert_eq!((quota.remaining, quota.reset, quota.limit), (4000, Duration::from_secs(1800), Some(5000)));
///
/// // OpenAI: the requests limit; the tokens one is not for a request rate.
/// let mut headers = HeaderMap::new();
/// headers.insert("x-ratelimit-remaining-requests", "499".parse().unwrap());
/// headers.insert("x-ratelimit-reset-requests", "120ms".parse().unwrap());
/// headers.insert("x-ratelimit-remaining-tokens", "0".parse().unwrap());
/// headers.insert("x-ratelimit-reset-tokens", "6m0s".parse().unwrap());
/// let quota = quota_from_headers(&headers).unwrap();
/// assert_eq!((quota.remaining, quota.reset), (499, Duration::from_millis(120)));
/// ```
#[must_use]
pub fn quota_from_headers(headers: &HeaderMap) -> Option<Announced> {
    let limits = limits_from_headers(headers, SystemTime::now());
    binding_request_limit(&limits).map(|limit| limit.announced)
}

/// The header's value, trimmed, if present once or more (the first) and visible ASCII.
fn header_str<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    Some(headers.get(name)?.to_str().ok()?.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tower::dialects::tests::headers;
    use std::time::UNIX_EPOCH;

    #[test]
    fn retry_after_forms() {
        let ra = |v: &str| retry_after(&headers(&[("retry-after", v)]));
        assert_eq!(ra(" 7 "), Some(Duration::from_secs(7)));
        assert_eq!(ra("0"), Some(Duration::ZERO));
        assert_eq!(ra("99999999999999999999999"), None);
        assert_eq!(ra("18446744073709551615"), Some(MAX_DELAY));
        assert_eq!(ra("-3"), None);
        assert_eq!(ra("1.5"), None);
        assert_eq!(ra("soon"), None);
        assert_eq!(ra(""), None);
        assert_eq!(ra("Sun, 06 Nov 1994 08:49:37 GMT"), Some(Duration::ZERO));
        let future = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
        let d = ra(&future).unwrap();
        assert!(
            d <= Duration::from_secs(120) && d >= Duration::from_secs(118),
            "{d:?}"
        );
        assert_eq!(retry_after(&HeaderMap::new()), None);
    }

    #[test]
    fn ietf_fields() {
        let q = |policy: Option<&str>, limit: &str| {
            let mut pairs = vec![("ratelimit", limit)];
            if let Some(p) = policy {
                pairs.push(("ratelimit-policy", p));
            }
            quota_from_headers(&headers(&pairs))
        };
        let got = q(Some(r#""default";q=100;w=60"#), r#""default";r=50;t=30"#).unwrap();
        assert_eq!(
            got,
            Announced::new(50, Duration::from_secs(30)).with_policy(100, Duration::from_secs(60))
        );
        // Named policies: the one the `RateLimit` item names.
        let got = q(
            Some(r#""burst";q=10;w=1, "day";q=1000;w=86400"#),
            r#""day";r=900;t=3600"#,
        )
        .unwrap();
        assert_eq!(got.limit, Some(1000));
        // Unknown parameters ignored, spaces tolerated, a quoted `;` or `,` is no separator.
        let got = q(
            Some(r#""a;b,c" ; pk=:abc=: ; q=5 ; w=1"#),
            r#""a;b,c";r=2;t=1;x=9"#,
        )
        .unwrap();
        assert_eq!(
            got,
            Announced::new(2, Duration::from_secs(1)).with_policy(5, Duration::from_secs(1))
        );
        // No policy, or a broken one: the quota without it.
        assert_eq!(q(None, "d;r=1;t=2").unwrap().limit, None);
        assert_eq!(q(Some("q=-1;w=60"), "d;r=1;t=2").unwrap().limit, None);
        assert_eq!(q(Some("q=1"), "d;r=1;t=2").unwrap().window, None);
        // Missing, negative, fractional, huge: no quota.
        for bad in [
            "",
            "r=1",
            "t=1",
            "d;r=-1;t=2",
            "d;r=1;t=-2",
            "d;r=1.5;t=2",
            "d;r=1;t=9999999999999999",
            "d;r=;t=",
            "\"unterminated;r=1;t=2",
        ] {
            assert_eq!(q(None, bad), None, "{bad}");
        }
        // Huge but allowed: capped.
        assert_eq!(q(None, "d;r=1;t=999999999999999").unwrap().reset, MAX_DELAY);
    }

    #[test]
    fn de_facto_headers() {
        let q = |pairs: &[(&'static str, &str)]| quota_from_headers(&headers(pairs));
        let got = q(&[
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", "4000"),
            ("x-ratelimit-reset", "1800"),
        ])
        .unwrap();
        assert_eq!(got, {
            let mut a = Announced::new(4000, Duration::from_secs(1800));
            a.limit = Some(5000);
            a
        });
        // Discord: the delta in fractions of a second wins over the epoch time.
        let got = q(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "1470173023.123"),
            ("x-ratelimit-reset-after", "1.5"),
        ])
        .unwrap();
        assert_eq!(got.reset, Duration::from_millis(1500));
        // An epoch time: against the system clock; in the past, zero.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let later = (now + 60).to_string();
        let got = q(&[
            ("x-ratelimit-remaining", "3"),
            ("x-ratelimit-reset", &later),
        ])
        .unwrap();
        assert!(got.reset <= Duration::from_secs(60) && got.reset >= Duration::from_secs(58));
        let got = q(&[
            ("x-ratelimit-remaining", "3"),
            ("x-ratelimit-reset", "1000000001"),
        ]);
        assert_eq!(got.unwrap().reset, Duration::ZERO);
        // A limit with a policy comment: its leading integer.
        let got = q(&[
            ("x-ratelimit-limit", "100, 100;w=60"),
            ("x-ratelimit-remaining", "3"),
            ("x-ratelimit-reset", "2"),
        ]);
        assert_eq!(got.unwrap().limit, Some(100));
        for (remaining, reset) in [
            ("-1", "2"),
            ("x", "2"),
            ("1", "-2"),
            ("1", "NaN"),
            ("1", "inf"),
            ("1", "1e3"),
            ("1", "1.2.3"),
            ("99999999999999999999999", "2"),
        ] {
            let got = q(&[
                ("x-ratelimit-remaining", remaining),
                ("x-ratelimit-reset", reset),
            ]);
            assert_eq!(got, None, "{remaining} {reset}");
        }
        // Huge reset: capped.
        let got = q(&[
            ("x-ratelimit-remaining", "1"),
            ("x-ratelimit-reset-after", "1e400"),
        ]);
        assert_eq!(got, None);
        let huge = "9".repeat(400);
        let got = q(&[
            ("x-ratelimit-remaining", "1"),
            ("x-ratelimit-reset-after", &huge),
        ]);
        assert_eq!(got.unwrap().reset, MAX_DELAY);
        assert_eq!(q(&[("x-ratelimit-remaining", "1")]), None);
    }

    #[test]
    fn the_ietf_fields_win() {
        let got = quota_from_headers(&headers(&[
            ("ratelimit", "d;r=1;t=2"),
            ("x-ratelimit-remaining", "7"),
            ("x-ratelimit-reset", "9"),
        ]));
        assert_eq!(got.unwrap().remaining, 1);
        // A broken `RateLimit` falls back to the de facto headers.
        let got = quota_from_headers(&headers(&[
            ("ratelimit", "d;r=x"),
            ("x-ratelimit-remaining", "7"),
            ("x-ratelimit-reset", "9"),
        ]));
        assert_eq!(got.unwrap().remaining, 7);
    }
}
