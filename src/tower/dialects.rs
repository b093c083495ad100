//! Every limit a response announces, in each dialect destinations speak (feature `http`): the
//! IETF draft with several policies, OpenAI's, Anthropic's, GitHub's and the de facto
//! `X-RateLimit-*`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::HeaderMap;

use super::headers::{leading_u64, non_negative, param, sf_items, EPOCH_THRESHOLD_SECS, MAX_DELAY};
use crate::limiter::Announced;

/// What a limit counts.
///
/// An [`Adaptive`](crate::Adaptive) paces requests: it takes only the limits that count
/// requests ([`Requests`](Dimension::Requests), and [`Units`](Dimension::Units), which a
/// destination charges per request). Limits of tokens are for a limiter of several dimensions,
/// which charges each call its tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dimension {
    /// Calls (`x-ratelimit-*-requests`, `anthropic-ratelimit-requests-*`, a GitHub resource, an
    /// IETF policy whose quota unit is `requests`, its default).
    Requests,
    /// Tokens, input and output together (`x-ratelimit-*-tokens`,
    /// `anthropic-ratelimit-tokens-*`).
    Tokens,
    /// Input (prompt) tokens (`anthropic-ratelimit-input-tokens-*`).
    InputTokens,
    /// Output (completion) tokens (`anthropic-ratelimit-output-tokens-*`).
    OutputTokens,
    /// Units the destination charges per request, by a cost of its own or unsaid: the plain
    /// `X-RateLimit-*` trio, GitHub's `graphql` points, an IETF policy with another quota unit
    /// (`qu`).
    Units,
}

impl Dimension {
    /// Whether the limit counts requests (or units charged per request), so that a
    /// request-rate [`Adaptive`](crate::Adaptive) can pace at it: `Requests` and `Units`.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::tower::Dimension;
    ///
    /// assert!(Dimension::Requests.counts_requests());
    /// assert!(!Dimension::InputTokens.counts_requests());
    /// ```
    #[must_use]
    pub const fn counts_requests(self) -> bool {
        matches!(self, Dimension::Requests | Dimension::Units)
    }
}

/// One limit a response announced: its name, what it counts and where it stands.
///
/// The name is the IETF policy's (`"minute"`), GitHub's resource (`"core"`, `"search"`,
/// `"graphql"`), the counted thing for OpenAI's and Anthropic's headers (`"requests"`,
/// `"tokens"`, `"input-tokens"`, `"output-tokens"`), and `"default"` for the plain
/// `X-RateLimit-*` trio.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct AnnouncedLimit {
    /// The limit's name, as the destination gives it.
    pub name: String,
    /// What it counts.
    pub dimension: Dimension,
    /// Where it stands: `remaining` until `reset`, and its `limit` (and `window`) if announced.
    pub announced: Announced,
}

impl AnnouncedLimit {
    /// A limit named `name` of `dimension`, standing at `announced`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::tower::{AnnouncedLimit, Dimension};
    /// use paced::Announced;
    ///
    /// let tokens = AnnouncedLimit::new("tokens", Dimension::Tokens, Announced::new(9000, Duration::from_secs(6)));
    /// assert_eq!(tokens.name, "tokens");
    /// ```
    #[must_use]
    pub fn new(name: impl Into<String>, dimension: Dimension, announced: Announced) -> Self {
        AnnouncedLimit {
            name: name.into(),
            dimension,
            announced,
        }
    }
}

/// Every limit a response announces, each with its name and what it counts, in the order below
/// (empty if it announces none). `now` is the time the response came, which epoch and RFC 3339
/// resets are read against (`SystemTime::now()`, unless replaying).
///
/// - The IETF draft (draft-ietf-httpapi-ratelimit-headers): one limit per item of `RateLimit`
///   (`"minute";r=250;t=30, "day";r=9000;t=40000`: `remaining`, `reset` in seconds), with the
///   policy of the same name in `RateLimit-Policy` (`"minute";q=500;w=60, "day";q=10000;w=86400`:
///   `limit` per `window` in seconds; its quota unit `qu` other than `"requests"` makes the
///   dimension [`Units`](Dimension::Units)). A `RateLimit` of one item takes the first policy
///   when none has its name, as the draft's single-policy servers send them. Fields repeated
///   on several lines are one list. Only `r`, `t`, `q` and `w` are read, as integers; an item
///   without `r` and `t` is skipped.
/// - Otherwise (no IETF item read), the `X-RateLimit-*` trio: `X-RateLimit-Remaining` with
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
/// nothing left that is not a bucket (it pauses the `Adaptive` until its reset). Of equal rates,
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
/// (the rule is stated there): zero when it pauses instead. Never NaN.
fn pace(quota: &Announced) -> f64 {
    let sustained = match (quota.limit, quota.window) {
        (Some(limit), Some(window)) if !window.is_zero() => {
            Some(limit as f64 / window.as_secs_f64())
        }
        _ => None,
    };
    let bucket = sustained.is_some() && quota.window.is_some_and(|w| quota.reset >= w);
    if quota.remaining == 0 && !bucket {
        return 0.0;
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
                let unit = policy.iter().find(|(k, _)| *k == "qu");
                if unit.is_some_and(|(_, u)| u.trim_matches('"') != "requests") {
                    dimension = Dimension::Units;
                }
            }
            Some(AnnouncedLimit::new(*name, dimension, announced))
        })
        .collect()
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

/// OpenAI's `x-ratelimit-{limit,remaining,reset}-{suffix}`.
fn openai(headers: &HeaderMap, suffix: &str, dimension: Dimension) -> Option<AnnouncedLimit> {
    let field = |what: &str| get(headers, &format!("x-ratelimit-{what}-{suffix}"));
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
