//! Every limit a response announces, in each dialect destinations speak (feature `http`): the
//! IETF draft with several policies, OpenAI's, Anthropic's, GitHub's and the de facto
//! `X-RateLimit-*`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::HeaderMap;

use super::values::{
    leading_u64, non_negative, param, sf_items, split_outside_quotes, EPOCH_THRESHOLD_SECS,
    MAX_DELAY,
};
use crate::limiter::{Announced, AnnouncedLimit, Dimension};

/// Every limit a response announces, each with its name and what it counts, in the order below
/// (empty if it announces none). `now` is the time the response came, which epoch and RFC 3339
/// resets are read against (`SystemTime::now()`, unless replaying).
///
/// - The IETF draft (draft-ietf-httpapi-ratelimit-headers): one limit per item of `RateLimit`
///   (`"minute";r=250;t=30, "day";r=9000;t=40000`: `remaining`, `reset` in seconds), with the
///   policy of the same name in `RateLimit-Policy` (`"minute";q=500;w=60, "day";q=10000;w=86400`:
///   `limit` per `window` in seconds; its quota unit `qu` gives the dimension: `"requests"`
///   (the default), `"tokens"`, `"input-tokens"` and `"output-tokens"` (as paced's announcing
///   layer over a [`RateLimiter`](crate::RateLimiter) names its dimensions) their
///   own, any other [`Units`](Dimension::Units)). A `RateLimit` of one item takes the first policy
///   when none has its name, as the draft's single-policy servers send them. Fields repeated
///   on several lines are one list. Only `r`, `t`, `q` and `w` are read, as integers; an item
///   without `r` and `t` is skipped.
/// - Otherwise, the draft's older single-policy forms (as `express-rate-limit` sends them),
///   named `"default"`: draft 7's `RateLimit: limit=100, remaining=25, reset=5`, or drafts
///   1 to 6's `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` (seconds), with the
///   window of `RateLimit-Policy: 100;w=60` (or of `RateLimit-Limit: 100, 100;w=60`).
/// - Otherwise (no IETF field read), the `X-RateLimit-*` trio: `X-RateLimit-Remaining` with
///   `X-RateLimit-Reset-After` (Discord: seconds, fractions allowed) or `X-RateLimit-Reset`:
///   delta seconds or, above [`EPOCH_THRESHOLD_SECS`], Unix epoch seconds (GitHub, Discord);
///   `X-RateLimit-Limit` (its leading integer), or else `remaining + X-RateLimit-Used`.
///   Named after GitHub's `X-RateLimit-Resource` (`"core"`, `"search"`: requests; `"graphql"`:
///   points, [`Units`](Dimension::Units)), or `"default"` ([`Units`](Dimension::Units)).
/// - OpenAI: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets as Go durations
///   (`1s`, `6m0s`, `20ms`, `1h2m3.5s`), read exactly in nanoseconds.
/// - Anthropic: `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
///   remaining,reset}`, resets as RFC 3339 times (`2026-11-26T12:00:30Z`, fractions and
///   offsets allowed), read as the time from `now` (zero if past).
///
/// A limit needs its remaining count and its reset; its `limit` is read when present. A value
/// that is missing, malformed, negative or too large for a `u64` reads as absent, and a reset
/// or window longer than [`MAX_DELAY`] (a year) reads as `MAX_DELAY`. Nothing here panics.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::HeaderMap;
/// use paced::tower::{limits_from_headers, Dimension};
///
/// // An OpenAI answer: 59 of 60 requests left for 1 s, 149,984 of 150,000 tokens for 6 ms.
/// let mut headers = HeaderMap::new();
/// headers.insert("x-ratelimit-limit-requests", "60".parse().unwrap());
/// headers.insert("x-ratelimit-remaining-requests", "59".parse().unwrap());
/// headers.insert("x-ratelimit-reset-requests", "1s".parse().unwrap());
/// headers.insert("x-ratelimit-limit-tokens", "150000".parse().unwrap());
/// headers.insert("x-ratelimit-remaining-tokens", "149984".parse().unwrap());
/// headers.insert("x-ratelimit-reset-tokens", "6ms".parse().unwrap());
/// let limits = limits_from_headers(&headers, SystemTime::now());
/// assert_eq!(limits.len(), 2);
/// assert_eq!((limits[0].name.as_str(), limits[0].dimension), ("requests", Dimension::Requests));
/// assert_eq!(limits[0].announced.remaining, 59);
/// assert_eq!(limits[0].announced.reset, Duration::from_secs(1));
/// assert_eq!((limits[1].name.as_str(), limits[1].dimension), ("tokens", Dimension::Tokens));
/// assert_eq!(limits[1].announced.reset, Duration::from_millis(6));
///
/// // The IETF draft with two policies.
/// let mut headers = HeaderMap::new();
/// headers.insert("ratelimit-policy", r#""minute";q=500;w=60, "day";q=10000;w=86400"#.parse().unwrap());
/// headers.insert("ratelimit", r#""minute";r=250;t=30, "day";r=9000;t=40000"#.parse().unwrap());
/// let limits = limits_from_headers(&headers, SystemTime::now());
/// let names: Vec<_> = limits.iter().map(|l| l.name.as_str()).collect();
/// assert_eq!(names, ["minute", "day"]);
/// assert_eq!(limits[1].announced.limit, Some(10_000));
/// assert_eq!(limits[1].announced.window, Some(Duration::from_secs(86_400)));
/// ```
#[must_use]
pub fn limits_from_headers(headers: &HeaderMap, now: SystemTime) -> Vec<AnnouncedLimit> {
    let mut limits = ietf(headers);
    if limits.is_empty() {
        limits.extend(ietf_older(headers));
    }
    if limits.is_empty() {
        limits.extend(x_ratelimit(headers, now));
    }
    for (suffix, dimension) in [
        ("requests", Dimension::Requests),
        ("tokens", Dimension::Tokens),
    ] {
        limits.extend(openai(headers, suffix, dimension));
    }
    for (part, dimension) in [
        ("requests", Dimension::Requests),
        ("tokens", Dimension::Tokens),
        ("input-tokens", Dimension::InputTokens),
        ("output-tokens", Dimension::OutputTokens),
    ] {
        limits.extend(anthropic(headers, part, dimension, now));
    }
    limits
}

/// Of several announced limits, the one that binds a request-rate
/// [`Adaptive`](crate::Adaptive): among those that count requests
/// ([`Dimension::counts_requests`]), the one that allows the lowest rate as
/// [`Adaptive::on_quota`](crate::Adaptive::on_quota) reads it: `(remaining + 1) / reset`, or a
/// token bucket's refill rate `limit / window` if that is higher, and zero for a limit with
/// nothing left that is not a bucket (it pauses the `Adaptive` until its reset, unless that is
/// now). Of equal rates,
/// the one with the longer reset; `None` if no limit counts requests.
///
/// Limits of tokens are left out: a request-rate `Adaptive` cannot pace them (a limiter of
/// several dimensions charges each call its tokens). [`classify_http`](crate::tower::classify_http)
/// reports this limit on a response that went through.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use http::HeaderMap;
/// use paced::tower::{binding_request_limit, limits_from_headers};
///
/// let mut headers = HeaderMap::new();
/// headers.insert("ratelimit-policy", r#""minute";q=500;w=60, "day";q=10000;w=86400"#.parse().unwrap());
/// // 250 left for 30 s (8.4/s), 9,000 left for 40,000 s (0.23/s): the day binds.
/// headers.insert("ratelimit", r#""minute";r=250;t=30, "day";r=9000;t=40000"#.parse().unwrap());
/// let limits = limits_from_headers(&headers, SystemTime::now());
/// assert_eq!(binding_request_limit(&limits).unwrap().name, "day");
/// ```
#[must_use]
pub fn binding_request_limit(limits: &[AnnouncedLimit]) -> Option<&AnnouncedLimit> {
    limits
        .iter()
        .filter(|l| l.dimension.counts_requests())
        .min_by(|a, b| {
            pace(&a.announced)
                .total_cmp(&pace(&b.announced))
                .then(b.announced.reset.cmp(&a.announced.reset))
        })
}

/// The rate, in calls per second, at which `Adaptive::on_quota` paces for an announcement
/// (the rule is stated there): zero when it pauses instead, infinite when it neither pauses nor
/// paces. Never NaN.
fn pace(quota: &Announced) -> f64 {
    let sustained = match (quota.limit, quota.window) {
        (Some(limit), Some(window)) if !window.is_zero() => {
            Some(limit as f64 / window.as_secs_f64())
        }
        _ => None,
    };
    let bucket = sustained.is_some() && quota.window.is_some_and(|w| quota.reset >= w);
    if quota.remaining == 0 && !bucket {
        // A pause until `reset`; none if that is now.
        return if quota.reset.is_zero() {
            f64::INFINITY
        } else {
            0.0
        };
    }
    // A zero reset is read as a millisecond, as `Adaptive::on_quota` reads it.
    let spread = (quota.remaining as f64 + 1.0) / quota.reset.as_secs_f64().max(0.001);
    match sustained {
        Some(sustained) if bucket => spread.max(sustained),
        _ => spread,
    }
}

/// The items of a structured-field list, over every line of the field.
fn items<'a>(headers: &'a HeaderMap, name: &str) -> Vec<(&'a str, Vec<(&'a str, &'a str)>)> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(sf_items)
        .collect()
}

/// The IETF draft's `RateLimit` items, each with its policy from `RateLimit-Policy`.
fn ietf(headers: &HeaderMap) -> Vec<AnnouncedLimit> {
    let policies = items(headers, "ratelimit-policy");
    let limits = items(headers, "ratelimit");
    let single = limits.len() == 1;
    limits
        .iter()
        .filter_map(|(name, params)| {
            let remaining = param(params, "r")?;
            let mut announced = Announced::new(remaining, secs(param(params, "t")?));
            let mut dimension = Dimension::Requests;
            let policy = policies
                .iter()
                .find(|(n, _)| n == name)
                .or_else(|| policies.first().filter(|_| single));
            if let Some((_, policy)) = policy {
                if let (Some(q), Some(w)) = (param(policy, "q"), param(policy, "w")) {
                    announced = announced.with_policy(q, secs(w));
                }
                if let Some((_, unit)) = policy.iter().find(|(k, _)| *k == "qu") {
                    dimension = match unit.trim_matches('"') {
                        "requests" => Dimension::Requests,
                        "tokens" => Dimension::Tokens,
                        "input-tokens" => Dimension::InputTokens,
                        "output-tokens" => Dimension::OutputTokens,
                        _ => Dimension::Units,
                    };
                }
            }
            Some(AnnouncedLimit::new(*name, dimension, announced))
        })
        .collect()
}

/// The draft's older forms: draft 7's `RateLimit` dictionary, or the three fields of drafts 1
/// to 6; the window from a policy item `limit;w=window`.
fn ietf_older(headers: &HeaderMap) -> Option<AnnouncedLimit> {
    let dictionary: Vec<(&str, &str)> = get(headers, "ratelimit")
        .map(|v| {
            split_outside_quotes(v, b',')
                .filter_map(|member| {
                    let (key, value) = member.split_once('=')?;
                    // A member's own parameters (`reset=5;x=1`) are not read.
                    let value = value.split(';').next().unwrap_or("");
                    Some((key.trim(), value.trim()))
                })
                .collect()
        })
        .unwrap_or_default();
    let member = |key: &str| {
        dictionary
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| integer(v))
    };
    let (remaining, reset, limit) = match (member("remaining"), member("reset")) {
        (Some(remaining), Some(reset)) => (remaining, reset, member("limit")),
        _ => (
            integer(get(headers, "ratelimit-remaining")?)?,
            integer(get(headers, "ratelimit-reset")?)?,
            get(headers, "ratelimit-limit").and_then(leading_u64),
        ),
    };
    let mut announced = Announced::new(remaining, secs(reset));
    announced.limit = limit;
    if let Some(limit) = limit {
        let window = ["ratelimit-policy", "ratelimit-limit"]
            .into_iter()
            .flat_map(|field| items(headers, field))
            .filter(|(name, _)| integer(name) == Some(limit))
            .find_map(|(_, params)| param(&params, "w"));
        if let Some(window) = window {
            announced = announced.with_policy(limit, secs(window));
        }
    }
    Some(AnnouncedLimit::new(
        "default",
        Dimension::Requests,
        announced,
    ))
}

/// `X-RateLimit-Limit`, `-Remaining`, `-Reset`, `-Reset-After`, `-Used` and `-Resource`.
fn x_ratelimit(headers: &HeaderMap, now: SystemTime) -> Option<AnnouncedLimit> {
    let remaining = leading_u64(get(headers, "x-ratelimit-remaining")?)?;
    let reset = match get(headers, "x-ratelimit-reset-after").and_then(non_negative) {
        Some(secs) => secs,
        None => {
            let reset = non_negative(get(headers, "x-ratelimit-reset")?)?;
            if reset > EPOCH_THRESHOLD_SECS {
                let now = now
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or(Duration::ZERO)
                    .as_secs_f64();
                (reset - now).max(0.0)
            } else {
                reset
            }
        }
    };
    let reset = Duration::try_from_secs_f64(reset)
        .unwrap_or(MAX_DELAY)
        .min(MAX_DELAY);
    let mut announced = Announced::new(remaining, reset);
    announced.limit = get(headers, "x-ratelimit-limit")
        .and_then(leading_u64)
        .or_else(|| remaining.checked_add(integer(get(headers, "x-ratelimit-used")?)?));
    let resource = get(headers, "x-ratelimit-resource").filter(|r| !r.is_empty());
    let (name, dimension) = match resource {
        Some("graphql") => ("graphql", Dimension::Units),
        Some(resource) => (resource, Dimension::Requests),
        None => ("default", Dimension::Units),
    };
    Some(AnnouncedLimit::new(name, dimension, announced))
}

/// OpenAI's `x-ratelimit-{limit,remaining,reset}-{suffix}`. Read as UTF-8: a reset below a
/// millisecond is a Go duration in microseconds, which Go writes with the micro sign (`150µs`).
fn openai(headers: &HeaderMap, suffix: &str, dimension: Dimension) -> Option<AnnouncedLimit> {
    let field = |what: &str| get_utf8(headers, &format!("x-ratelimit-{what}-{suffix}"));
    let remaining = integer(field("remaining")?)?;
    let reset = go_duration(field("reset")?)?.min(MAX_DELAY);
    let mut announced = Announced::new(remaining, reset);
    announced.limit = field("limit").and_then(integer);
    Some(AnnouncedLimit::new(suffix, dimension, announced))
}

/// Anthropic's `anthropic-ratelimit-{part}-{limit,remaining,reset}`.
fn anthropic(
    headers: &HeaderMap,
    part: &str,
    dimension: Dimension,
    now: SystemTime,
) -> Option<AnnouncedLimit> {
    let field = |what: &str| get(headers, &format!("anthropic-ratelimit-{part}-{what}"));
    let remaining = integer(field("remaining")?)?;
    let reset = rfc3339_from(field("reset")?, now)?;
    let mut announced = Announced::new(remaining, reset);
    announced.limit = field("limit").and_then(integer);
    Some(AnnouncedLimit::new(part, dimension, announced))
}

/// The header's first value, trimmed, if it is visible ASCII.
fn get<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    Some(headers.get(name)?.to_str().ok()?.trim())
}

/// The header's first value, trimmed, if it is valid UTF-8: for a grammar that allows more than
/// ASCII. Its parser still rejects what it does not read.
fn get_utf8<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    Some(
        std::str::from_utf8(headers.get(name)?.as_bytes())
            .ok()?
            .trim(),
    )
}

/// A count: digits only, no sign, within a `u64`.
fn integer(value: &str) -> Option<u64> {
    let value = value.trim();
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// Whole seconds, capped at [`MAX_DELAY`].
fn secs(secs: u64) -> Duration {
    Duration::from_secs(secs).min(MAX_DELAY)
}

/// The time from `now` to an RFC 3339 time (`2026-11-26T12:00:30Z`, `...30.5+02:00`), zero if
/// it is past, at most [`MAX_DELAY`]; `None` if it is not one.
fn rfc3339_from(value: &str, now: SystemTime) -> Option<Duration> {
    let at = SystemTime::try_from(value.parse::<jiff::Timestamp>().ok()?).ok()?;
    Some(
        at.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_DELAY),
    )
}

/// A Go duration, as Go's `time.ParseDuration` writes and reads it: a sequence of decimal
/// numbers, each with a fraction if it likes and a unit (`ns`, `us`, `µs`, `μs`, `ms`, `s`, `m`,
/// `h`): `1s`, `6m0s`, `1h2m3.5s`, `20ms`, and a bare `0`. Exact: the fraction is counted in
/// integer nanoseconds (digits beyond a nanosecond are dropped), never through a float. `None`
/// for anything else, a negative duration, or one beyond Go's range (`i64::MAX` nanoseconds,
/// 292 years).
pub(crate) fn go_duration(value: &str) -> Option<Duration> {
    const NANOS_MAX: u128 = i64::MAX as u128;
    let mut rest = value.strip_prefix('+').unwrap_or(value);
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let (whole, after) = split_digits(rest);
        let (fraction, after) = match after.strip_prefix('.') {
            Some(after) => split_digits(after),
            None => ("", after),
        };
        if whole.is_empty() && fraction.is_empty() {
            return None;
        }
        let unit_len = after
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        // At most 19 significant digits: beyond that any unit is past `NANOS_MAX`.
        let whole = whole.trim_start_matches('0');
        if whole.len() > 19 {
            return None;
        }
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().ok()?
        };
        // A nanosecond is the finest unit and the coarsest is 3.6e12 ns: 13 digits of a
        // fraction reach below a nanosecond in every unit.
        let fraction = &fraction[..fraction.len().min(13)];
        let fraction_nanos = if fraction.is_empty() {
            0
        } else {
            fraction.parse::<u128>().ok()? * scale / 10u128.pow(fraction.len() as u32)
        };
        total += whole * scale + fraction_nanos;
        if total > NANOS_MAX {
            return None;
        }
        rest = after;
    }
    u64::try_from(total).ok().map(Duration::from_nanos)
}

/// The leading ASCII digits of `value`, and the rest.
fn split_digits(value: &str) -> (&str, &str) {
    let end = value
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(value.len());
    value.split_at(end)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    /// A header map of `pairs`, in order (a name given twice is sent twice).
    pub(crate) fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(*k, HeaderValue::from_str(v).unwrap());
        }
        map
    }

    /// 2026-11-26T12:00:00Z.
    fn noon() -> SystemTime {
        let at: jiff::Timestamp = "2026-11-26T12:00:00Z".parse().unwrap();
        SystemTime::try_from(at).unwrap()
    }

    /// The limits announced by a response with the headers `pairs`, at `noon()`.
    fn read(pairs: &[(&'static str, &str)]) -> Vec<AnnouncedLimit> {
        limits_from_headers(&headers(pairs), noon())
    }

    fn limit(name: &str, dimension: Dimension, remaining: u64, reset: Duration) -> AnnouncedLimit {
        AnnouncedLimit::new(name, dimension, Announced::new(remaining, reset))
    }

    /// [`limit`], announcing a limit of `max` too.
    fn capped(
        name: &str,
        dimension: Dimension,
        remaining: u64,
        reset: Duration,
        max: u64,
    ) -> AnnouncedLimit {
        let mut capped = limit(name, dimension, remaining, reset);
        capped.announced.limit = Some(max);
        capped
    }

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn go_durations() {
        let d = |s: &str| go_duration(s);
        let ns = |n: u64| Some(Duration::from_nanos(n));
        assert_eq!(d("0"), Some(Duration::ZERO));
        assert_eq!(d("+0"), Some(Duration::ZERO));
        assert_eq!(d("0s"), Some(Duration::ZERO));
        assert_eq!(d("1s"), Some(SEC));
        assert_eq!(d("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(d("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(d("1h2m3.5s"), Some(Duration::from_millis(3_723_500)));
        assert_eq!(d("3.5s"), Some(Duration::from_millis(3_500)));
        assert_eq!(d("2m59.56s"), Some(Duration::from_millis(179_560)));
        assert_eq!(d("500us"), Some(Duration::from_micros(500)));
        assert_eq!(d("500µs"), Some(Duration::from_micros(500))); // U+00B5
        assert_eq!(d("500μs"), Some(Duration::from_micros(500))); // U+03BC
        assert_eq!(d("7ns"), ns(7));
        assert_eq!(d("1.5h"), Some(Duration::from_secs(5_400)));
        assert_eq!(d(".5s"), Some(Duration::from_millis(500)));
        assert_eq!(d("1.s"), Some(SEC));
        assert_eq!(d("1s1s"), Some(2 * SEC));
        assert_eq!(d("0.000000001s"), ns(1));
        // Below a nanosecond: dropped, never rounded up.
        assert_eq!(d("0.0000000019s"), ns(1));
        assert_eq!(d("1.9ns"), ns(1));
        // Exact where a float is not: 0.1 + 0.2.
        assert_eq!(d("0.3s"), ns(300_000_000));
        assert_eq!(d("1.000000001h"), ns(3_600_000_003_600));
        assert_eq!(d("00000000000000000000001s"), Some(SEC));
        assert_eq!(
            d("1.00000000000000000000000000001s"),
            Some(SEC),
            "long fractions"
        );
        // Go's range: up to i64::MAX nanoseconds (2562047h47m16.854775807s).
        assert_eq!(d("2562047h47m16.854775807s"), ns(i64::MAX as u64));
        assert_eq!(d("9223372036854775807ns"), ns(i64::MAX as u64));
        for bad in [
            "",
            "+",
            "1",
            "00",
            "-1s",
            "-0s",
            "+-1s",
            "s",
            ".s",
            "1.2.3s",
            "1 s",
            "1S",
            "1sec",
            "1d",
            "1e3s",
            "1s2",
            "inf",
            "NaN",
            "0x10s",
            "9223372036854775808ns",
            "2562047h47m16.854775808s",
            "2562048h",
            "99999999999999999999h",
            "999999999999999999999999999999s",
            "1h\u{0}",
        ] {
            assert_eq!(d(bad), None, "{bad:?}");
        }
    }

    /// Go writes a duration below a millisecond with the micro sign (U+00B5), and reads the
    /// Greek mu (U+03BC) too: both arrive as UTF-8 bytes and read as microseconds. Bytes that
    /// are not UTF-8, or a unit that is not Go's, read as absent.
    #[test]
    fn openai_resets_below_a_millisecond_in_micro_signs() {
        let with_reset = |reset: &[u8]| {
            let mut map = headers(&[
                ("x-ratelimit-limit-tokens", "2000000"),
                ("x-ratelimit-remaining-tokens", "1999619"),
            ]);
            map.insert(
                "x-ratelimit-reset-tokens",
                HeaderValue::from_bytes(reset).unwrap(),
            );
            limits_from_headers(&map, noon())
        };
        for reset in ["150µs", "150μs", " 150µs ", "150us"] {
            let got = with_reset(reset.as_bytes());
            assert_eq!(got.len(), 1, "{reset}");
            assert_eq!(
                got[0].announced.reset,
                Duration::from_micros(150),
                "{reset}"
            );
        }
        assert_eq!(
            with_reset("1ms500µs".as_bytes())[0].announced.reset,
            Duration::from_micros(1_500)
        );
        // Latin-1's micro sign alone (0xB5) is not UTF-8; "150ŝ" is not a unit.
        for reset in [&b"150\xb5s"[..], "150ŝ".as_bytes()] {
            assert!(with_reset(reset).is_empty(), "{reset:?}");
        }
    }

    #[test]
    fn openai() {
        let got = read(&[
            ("x-ratelimit-limit-requests", "10000"),
            ("x-ratelimit-limit-tokens", "2000000"),
            ("x-ratelimit-remaining-requests", "9999"),
            ("x-ratelimit-remaining-tokens", "1999619"),
            ("x-ratelimit-reset-requests", "6ms"),
            ("x-ratelimit-reset-tokens", "11ms"),
        ]);
        assert_eq!(
            got,
            [
                capped(
                    "requests",
                    Dimension::Requests,
                    9999,
                    Duration::from_millis(6),
                    10_000
                ),
                capped(
                    "tokens",
                    Dimension::Tokens,
                    1_999_619,
                    Duration::from_millis(11),
                    2_000_000
                ),
            ]
        );
        // A free tier's day of requests; the tokens' reset broken: only the requests.
        let got = read(&[
            ("x-ratelimit-limit-requests", "200"),
            ("x-ratelimit-remaining-requests", "150"),
            ("x-ratelimit-reset-requests", "6h28m48s"),
            ("x-ratelimit-remaining-tokens", "40000"),
            ("x-ratelimit-reset-tokens", "soon"),
        ]);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].announced.reset, Duration::from_secs(23_328));
        // A broken limit is no limit; a missing remaining count is no quota.
        let got = read(&[
            ("x-ratelimit-limit-requests", "lots"),
            ("x-ratelimit-remaining-requests", "3"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-limit-tokens", "100"),
            ("x-ratelimit-reset-tokens", "1s"),
        ]);
        assert_eq!(got, [limit("requests", Dimension::Requests, 3, SEC)]);
        for (remaining, reset) in [
            ("-1", "1s"),
            ("1.5", "1s"),
            ("99999999999999999999999", "1s"),
            ("", "1s"),
            ("1", "-1s"),
            ("1", "1"),
            ("1", "1 s"),
            ("1", "3000000h"),
        ] {
            let got = read(&[
                ("x-ratelimit-remaining-requests", remaining),
                ("x-ratelimit-reset-requests", reset),
            ]);
            assert_eq!(got, [], "{remaining} {reset}");
        }
        // Long but within Go's range: capped at a year.
        let got = read(&[
            ("x-ratelimit-remaining-requests", "1"),
            ("x-ratelimit-reset-requests", "2000000h"),
        ]);
        assert_eq!(got[0].announced.reset, MAX_DELAY);
    }

    #[test]
    fn anthropic() {
        let got = read(&[
            ("anthropic-ratelimit-requests-limit", "4000"),
            ("anthropic-ratelimit-requests-remaining", "3999"),
            (
                "anthropic-ratelimit-requests-reset",
                "2026-11-26T12:00:00.015Z",
            ),
            ("anthropic-ratelimit-tokens-limit", "480000"),
            ("anthropic-ratelimit-tokens-remaining", "479000"),
            ("anthropic-ratelimit-tokens-reset", "2026-11-26T12:00:01Z"),
            ("anthropic-ratelimit-input-tokens-limit", "400000"),
            ("anthropic-ratelimit-input-tokens-remaining", "399000"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2026-11-26T13:00:30+01:00",
            ),
            ("anthropic-ratelimit-output-tokens-limit", "80000"),
            ("anthropic-ratelimit-output-tokens-remaining", "80000"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2026-11-26T11:59:00Z",
            ),
            ("retry-after", "1"),
        ]);
        assert_eq!(
            got,
            [
                capped(
                    "requests",
                    Dimension::Requests,
                    3999,
                    Duration::from_millis(15),
                    4000
                ),
                capped("tokens", Dimension::Tokens, 479_000, SEC, 480_000),
                capped(
                    "input-tokens",
                    Dimension::InputTokens,
                    399_000,
                    30 * SEC,
                    400_000
                ),
                // In the past: restored now.
                capped(
                    "output-tokens",
                    Dimension::OutputTokens,
                    80_000,
                    Duration::ZERO,
                    80_000
                ),
            ]
        );
        for bad in [
            "2026-11-26T12:00:30", // no offset: not RFC 3339
            "2026-13-26T12:00:30Z",
            "2026-11-31T12:00:30Z",
            "tomorrow",
            "1764158430",
            "",
        ] {
            let got = read(&[
                ("anthropic-ratelimit-requests-remaining", "1"),
                ("anthropic-ratelimit-requests-reset", bad),
            ]);
            assert_eq!(got, [], "{bad:?}");
        }
        // RFC 3339 lets a space stand for the `T`, and lower case for `T` and `Z`.
        for spelled in ["2026-11-26 12:00:30Z", "2026-11-26t12:00:30z"] {
            let got = read(&[
                ("anthropic-ratelimit-requests-remaining", "1"),
                ("anthropic-ratelimit-requests-reset", spelled),
            ]);
            assert_eq!(
                got,
                [limit("requests", Dimension::Requests, 1, 30 * SEC)],
                "{spelled}"
            );
        }
        // Far ahead: a year at most.
        let got = read(&[
            ("anthropic-ratelimit-requests-remaining", "1"),
            ("anthropic-ratelimit-requests-reset", "9000-01-01T00:00:00Z"),
        ]);
        assert_eq!(got[0].announced.reset, MAX_DELAY);
    }

    #[test]
    fn github() {
        let reset = (noon().duration_since(UNIX_EPOCH).unwrap().as_secs() + 1800).to_string();
        let got = read(&[
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", "4987"),
            ("x-ratelimit-reset", &reset),
            ("x-ratelimit-used", "13"),
            ("x-ratelimit-resource", "core"),
        ]);
        assert_eq!(
            got,
            [capped("core", Dimension::Requests, 4987, 1800 * SEC, 5000)]
        );
        // GraphQL counts points; a missing limit is remaining + used.
        let got = read(&[
            ("x-ratelimit-remaining", "4900"),
            ("x-ratelimit-reset", &reset),
            ("x-ratelimit-used", "100"),
            ("x-ratelimit-resource", "graphql"),
        ]);
        assert_eq!(
            got,
            [capped("graphql", Dimension::Units, 4900, 1800 * SEC, 5000)]
        );
        // The plain trio: "default", units unsaid; a used count that overflows is no limit.
        let got = read(&[
            ("x-ratelimit-remaining", "18446744073709551615"),
            ("x-ratelimit-reset", "60"),
            ("x-ratelimit-used", "1"),
        ]);
        assert_eq!(
            got,
            [limit("default", Dimension::Units, u64::MAX, 60 * SEC)]
        );
    }

    #[test]
    fn ietf_several_policies() {
        let got = read(&[
            (
                "ratelimit-policy",
                r#""minute";q=500;w=60, "day";q=10000;w=86400;qu="requests""#,
            ),
            (
                "ratelimit-policy",
                r#""bytes";q=1000000;w=60;qu="content-bytes""#,
            ),
            ("ratelimit", r#""day";r=9000;t=40000, "minute";r=250;t=30"#),
            (
                "ratelimit",
                r#""bytes";r=5;t=1, "orphan";r=1;t=1, "broken";r=1"#,
            ),
            // Not read: the IETF fields win.
            ("x-ratelimit-remaining", "1"),
            ("x-ratelimit-reset", "1"),
        ]);
        let day = Announced::new(9000, 40_000 * SEC).with_policy(10_000, 86_400 * SEC);
        let minute = Announced::new(250, 30 * SEC).with_policy(500, 60 * SEC);
        let bytes = Announced::new(5, SEC).with_policy(1_000_000, 60 * SEC);
        assert_eq!(
            got,
            [
                AnnouncedLimit::new("day", Dimension::Requests, day),
                AnnouncedLimit::new("minute", Dimension::Requests, minute),
                AnnouncedLimit::new("bytes", Dimension::Units, bytes),
                // Several items: no policy is guessed for one without its name.
                limit("orphan", Dimension::Requests, 1, SEC),
            ]
        );
        // The quota unit gives the dimension: paced's own several dimensions, and others.
        let got = read(&[
            (
                "ratelimit-policy",
                r#""t";q=9;w=60;qu="tokens", "i";q=9;w=60;qu="input-tokens", "o";q=9;w=60;qu="output-tokens", "x";q=9;w=60;qu="widgets""#,
            ),
            (
                "ratelimit",
                r#""t";r=1;t=1, "i";r=1;t=1, "o";r=1;t=1, "x";r=1;t=1"#,
            ),
        ]);
        let dimensions: Vec<_> = got.iter().map(|l| l.dimension).collect();
        assert_eq!(
            dimensions,
            [
                Dimension::Tokens,
                Dimension::InputTokens,
                Dimension::OutputTokens,
                Dimension::Units
            ]
        );
        // One item, no policy of its name: the first, as single-policy servers send it.
        let got = read(&[
            ("ratelimit-policy", r#""p";q=100;w=60"#),
            ("ratelimit", r#""default";r=50;t=30"#),
        ]);
        assert_eq!(got[0].announced.limit, Some(100));
        // No item read: the de facto headers.
        let got = read(&[
            ("ratelimit", r#""a";r=x;t=1, "b";t=2"#),
            ("x-ratelimit-remaining", "7"),
            ("x-ratelimit-reset", "9"),
        ]);
        assert_eq!(got, [limit("default", Dimension::Units, 7, 9 * SEC)]);
    }

    #[test]
    fn ietf_older_forms() {
        let window = Announced::new(25, 5 * SEC).with_policy(100, 60 * SEC);
        let windowed = [AnnouncedLimit::new("default", Dimension::Requests, window)];
        // Draft 7, as express-rate-limit sends it.
        let got = read(&[
            ("ratelimit-policy", "100;w=60"),
            ("ratelimit", "limit=100, remaining=25, reset=5"),
        ]);
        assert_eq!(got, windowed);
        // Drafts 1 to 6: three fields; the window in the limit's policy, or none.
        let got = read(&[
            ("ratelimit-limit", "100, 100;w=60"),
            ("ratelimit-remaining", "25"),
            ("ratelimit-reset", "5"),
        ]);
        assert_eq!(got, windowed);
        let got = read(&[
            ("ratelimit-limit", "100"),
            ("ratelimit-remaining", "25"),
            ("ratelimit-reset", "5"),
            ("ratelimit-policy", "50;w=1"),
        ]);
        assert_eq!(
            got,
            [capped("default", Dimension::Requests, 25, 5 * SEC, 100)]
        );
        // Broken: the de facto headers, or nothing.
        for (remaining, reset) in [("-1", "5"), ("1", "5.5"), ("x", "5"), ("1", "")] {
            let got = read(&[
                ("ratelimit-remaining", remaining),
                ("ratelimit-reset", reset),
                ("x-ratelimit-remaining", "7"),
                ("x-ratelimit-reset", "9"),
            ]);
            assert_eq!(got, [limit("default", Dimension::Units, 7, 9 * SEC)]);
            let dictionary = format!("limit=9, remaining={remaining}, reset={reset}");
            let got = read(&[("ratelimit", &dictionary)]);
            assert_eq!(got, [], "{dictionary}");
        }
    }

    #[test]
    fn the_binding_limit_is_the_slowest_one_of_requests() {
        let minute = AnnouncedLimit::new(
            "minute",
            Dimension::Requests,
            Announced::new(250, 30 * SEC).with_policy(500, 60 * SEC),
        );
        let day = AnnouncedLimit::new(
            "day",
            Dimension::Requests,
            Announced::new(9000, 40_000 * SEC).with_policy(10_000, 86_400 * SEC),
        );
        let tokens = limit("tokens", Dimension::Tokens, 0, 60 * SEC);
        let all = [tokens.clone(), minute.clone(), day.clone()];
        assert_eq!(binding_request_limit(&all), Some(&day));
        // Nothing left binds: it pauses.
        let empty = limit("hour", Dimension::Units, 0, 10 * SEC);
        let all = [minute.clone(), day.clone(), empty.clone()];
        assert_eq!(binding_request_limit(&all), Some(&empty));
        // Of two with nothing left, the longer wait.
        let longer = limit("week", Dimension::Requests, 0, 100 * SEC);
        let all = [empty.clone(), longer.clone()];
        assert_eq!(binding_request_limit(&all), Some(&longer));
        // A drained token bucket refills at its own rate: 500/60 s is more than the day's.
        let drained = AnnouncedLimit::new(
            "minute",
            Dimension::Requests,
            Announced::new(0, 60 * SEC).with_policy(500, 60 * SEC),
        );
        let all = [drained, day.clone()];
        assert_eq!(binding_request_limit(&all), Some(&day));
        // A zero reset: restored now, it binds nothing while another limit does.
        let now = limit("now", Dimension::Requests, 0, Duration::ZERO);
        assert_eq!(
            binding_request_limit(&[now.clone(), minute.clone()]),
            Some(&minute)
        );
        // Tokens only: nothing for a request rate.
        assert_eq!(binding_request_limit(&[tokens]), None);
        assert_eq!(binding_request_limit(&[]), None);
    }

    const NAMES: [&str; 25] = [
        "ratelimit",
        "ratelimit-policy",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "x-ratelimit-reset-after",
        "x-ratelimit-used",
        "x-ratelimit-resource",
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-requests-reset",
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-ratelimit-tokens-reset",
        "anthropic-ratelimit-input-tokens-limit",
        "anthropic-ratelimit-input-tokens-remaining",
        "anthropic-ratelimit-input-tokens-reset",
        "anthropic-ratelimit-output-tokens-remaining",
    ];

    /// Header values: arbitrary text, and near-misses of each dialect's syntax.
    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[ -~]{0,40}",
            "[+-]?[0-9]{0,25}(\\.[0-9]{0,5})?",
            "[+-]?([0-9]{0,20}(\\.[0-9]{0,12})?(h|m|s|ms|us|µs|μs|ns|d|)){1,4}",
            "[0-9]{1,5}-[0-9]{1,2}-[0-9]{1,2}[T ][0-9]{1,2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{0,12})?(Z|[+-][0-9]{2}:[0-9]{2})?",
            "(\"[a-z;,]{0,5}\"|[a-z]{0,3})(;[qrtwu ]{0,2}=-?[0-9]{0,17}){0,4}(, ?[a-z]{0,2};q=[0-9]{0,3};w=[0-9]{0,3})?",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

        /// Whatever the values, no panic, and nothing out of range: every reset and window
        /// within `MAX_DELAY`, every token limit under its dialect's name, the binding limit
        /// one of requests among those read.
        #[test]
        fn any_values_read_sanely(
            pairs in prop::collection::vec((0usize..NAMES.len(), value()), 0..12),
            secs in 0u64..4_000_000_000,
        ) {
            let mut map = HeaderMap::new();
            for (name, v) in &pairs {
                if let Ok(v) = HeaderValue::from_str(v) {
                    map.append(NAMES[*name], v);
                }
            }
            let now = UNIX_EPOCH + Duration::from_secs(secs);
            let limits = limits_from_headers(&map, now);
            for l in &limits {
                prop_assert!(l.announced.reset <= MAX_DELAY, "{l:?}");
                prop_assert!(l.announced.window.is_none_or(|w| w <= MAX_DELAY), "{l:?}");
                // An IETF policy names its unit (`qu`) as it likes.
                let ietf = map.contains_key("ratelimit-policy");
                let fixed = ietf || match l.dimension {
                    Dimension::Tokens => l.name == "tokens",
                    Dimension::InputTokens => l.name == "input-tokens",
                    Dimension::OutputTokens => l.name == "output-tokens",
                    Dimension::Requests | Dimension::Units => true,
                };
                prop_assert!(fixed, "{l:?}");
            }
            if let Some(binding) = binding_request_limit(&limits) {
                prop_assert!(binding.dimension.counts_requests());
                prop_assert!(limits.contains(binding));
            }
            // Against the system clock: only that it does not panic.
            let _ = super::super::headers::quota_from_headers(&map);
        }

        /// Any Go duration written from whole and fractional parts reads back exactly.
        #[test]
        fn go_durations_read_exactly(
            h in 0u64..1_000_000,
            m in 0u64..1_000,
            s in 0u64..100_000,
            frac in 0u64..1_000_000_000,
        ) {
            let text = format!("{h}h{m}m{s}.{frac:09}s");
            let nanos = ((h * 60 + m) * 60 + s) as u128 * 1_000_000_000 + u128::from(frac);
            prop_assert_eq!(go_duration(&text), Some(Duration::from_nanos(nanos as u64)));
        }

        /// Any text: no panic, and never beyond Go's range.
        #[test]
        fn go_durations_never_panic(text in "\\PC{0,30}") {
            if let Some(d) = go_duration(&text) {
                prop_assert!(d.as_nanos() <= i64::MAX as u128);
            }
        }
    }
}
