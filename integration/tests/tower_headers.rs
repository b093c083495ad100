//! Quota headers both ways over real HTTP on 127.0.0.1 (feature `http`): an axum server whose
//! enforcing layer announces its quota, and a hyper client that reads it. Real time (sockets do
//! not run on paused time), at a rate of one token a minute, so that no token flows in while a
//! test runs: `Remaining` must count down exactly and `Reset` is checked against the exact
//! bucket, never early.
#![cfg(feature = "http")]

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::Request;
use axum::routing::get;
use axum::Router;
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use paced::tower::{limits_from_headers, Dimension, QuotaHeaders, RateLimitLayer};
use paced::{KeyedRateLimiter, Limit, Rate, RateLimiter};

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    addr
}

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// One request; the status and the headers of the answer, as strings.
async fn call(client: &HttpClient, addr: SocketAddr, path: &str) -> (u16, Vec<(String, String)>) {
    let req = Request::get(format!("http://{addr}{path}"))
        .body(Empty::new())
        .unwrap();
    let res = client.request(req).await.unwrap();
    let headers = res
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
        .collect();
    (res.status().as_u16(), headers)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The parameters of a structured-field item such as `"default";q=5;w=300`, with its name.
fn parameters(value: &str) -> (String, Vec<(String, u64)>) {
    let mut parts = value.split(';');
    let name = parts.next().unwrap().trim().trim_matches('"').to_string();
    let params = parts
        .map(|p| {
            let (k, v) = p.trim().split_once('=').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect();
    (name, params)
}

fn param(params: &[(String, u64)], key: &str) -> u64 {
    params.iter().find(|(k, _)| k == key).unwrap().1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remaining_counts_down_exactly_and_reset_is_never_early() {
    const BURST: u64 = 5;
    let quota = RateLimiter::new(Rate::per_minute(1), BURST);
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(&quota)
            .enforcing()
            .headers(QuotaHeaders::Both),
    );
    let addr = serve(app).await;
    let client = client();
    for granted in 1..=BURST {
        let (status, headers) = call(&client, addr, "/").await;
        assert_eq!(status, 200);
        let remaining = BURST - granted;
        // The de facto trio.
        assert_eq!(header(&headers, "x-ratelimit-limit"), Some("5"));
        assert_eq!(
            header(&headers, "x-ratelimit-remaining"),
            Some(remaining.to_string().as_str())
        );
        // `granted` tokens owed at one a minute: full again in granted × 60 s, less the few
        // milliseconds since the first grant, rounded up: exactly granted × 60, never less.
        let reset: u64 = header(&headers, "x-ratelimit-reset")
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(reset, granted * 60);
        // The draft's two fields, parsed.
        let (name, policy) = parameters(header(&headers, "ratelimit-policy").unwrap());
        assert_eq!(name, "default");
        assert_eq!(
            (param(&policy, "q"), param(&policy, "w")),
            (BURST, BURST * 60)
        );
        let (name, now) = parameters(header(&headers, "ratelimit").unwrap());
        assert_eq!(name, "default");
        assert_eq!(
            (param(&now, "r"), param(&now, "t")),
            (remaining, granted * 60)
        );
        assert_eq!(header(&headers, "retry-after"), None);
    }
    // Refused: 429, Retry-After (the next token, a minute away, rounded up) and the headers.
    let (status, headers) = call(&client, addr, "/").await;
    assert_eq!(status, 429);
    assert_eq!(header(&headers, "retry-after"), Some("60"));
    assert_eq!(header(&headers, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(header(&headers, "x-ratelimit-reset"), Some("300"));
    assert_eq!(quota.stats().granted, BURST);
    assert_eq!(quota.stats().rejected, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_announces_its_own_bucket() {
    let per_path = KeyedRateLimiter::<String>::new(Rate::per_minute(1), 2);
    per_path.set_limit(&"/big".to_string(), Rate::per_minute(10), 10);
    let app = Router::new()
        .route("/small", get(|| async { "small" }))
        .route("/big", get(|| async { "big" }))
        .layer(
            RateLimitLayer::keyed(&per_path, |req: &Request<axum::body::Body>| {
                req.uri().path().to_string()
            })
            .enforcing()
            .headers(QuotaHeaders::Draft),
        );
    let addr = serve(app).await;
    let client = client();
    let (_, headers) = call(&client, addr, "/small").await;
    assert!(header(&headers, "x-ratelimit-limit").is_none());
    let (_, policy) = parameters(header(&headers, "ratelimit-policy").unwrap());
    assert_eq!((param(&policy, "q"), param(&policy, "w")), (2, 120));
    let (_, now) = parameters(header(&headers, "ratelimit").unwrap());
    assert_eq!((param(&now, "r"), param(&now, "t")), (1, 60));
    let (_, headers) = call(&client, addr, "/big").await;
    let (_, policy) = parameters(header(&headers, "ratelimit-policy").unwrap());
    // 10 a minute, 10 at once: a full bucket in 60 s.
    assert_eq!((param(&policy, "q"), param(&policy, "w")), (10, 60));
    let (_, now) = parameters(header(&headers, "ratelimit").unwrap());
    assert_eq!((param(&now, "r"), param(&now, "t")), (9, 6));
    let (status, _) = call(&client, addr, "/small").await;
    assert_eq!(status, 200);
    let (status, headers) = call(&client, addr, "/small").await;
    assert_eq!(status, 429);
    let (_, now) = parameters(header(&headers, "ratelimit").unwrap());
    assert_eq!((param(&now, "r"), param(&now, "t")), (0, 120));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_above_the_burst_is_refused_without_retry_after() {
    let quota = RateLimiter::new(Rate::per_minute(1), 3);
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(&quota)
            .cost(|_: &Request<axum::body::Body>| 4)
            .enforcing()
            .headers(QuotaHeaders::XRateLimit),
    );
    let addr = serve(app).await;
    let (status, headers) = call(&client(), addr, "/").await;
    assert_eq!(status, 429);
    // It never conforms: no `Retry-After` could be honest.
    assert_eq!(header(&headers, "retry-after"), None);
    assert_eq!(header(&headers, "x-ratelimit-remaining"), Some("3"));
    assert_eq!(header(&headers, "x-ratelimit-reset"), Some("0"));
}

/// One request to `/?tokens=N`; the status and the headers of the answer.
async fn call_with_tokens(
    client: &HttpClient,
    addr: SocketAddr,
    tokens: u64,
) -> (u16, http::HeaderMap) {
    let req = Request::get(format!("http://{addr}/?tokens={tokens}"))
        .body(Empty::new())
        .unwrap();
    let res = client.request(req).await.unwrap();
    (res.status().as_u16(), res.headers().clone())
}

/// The seconds from `now` until the next midnight UTC, rounded up.
fn until_midnight(now: SystemTime) -> u64 {
    let since = now.duration_since(UNIX_EPOCH).unwrap();
    let left = Duration::from_secs(86_400)
        - Duration::from_nanos((since.as_nanos() % 86_400_000_000_000) as u64);
    left.as_secs() + u64::from(left.subsec_nanos() > 0)
}

/// One request to `/{path}?tokens=N`; the status and the headers of the answer.
async fn call_tenant(
    client: &HttpClient,
    addr: SocketAddr,
    path: &str,
    tokens: u64,
) -> (u16, http::HeaderMap) {
    let req = Request::get(format!("http://{addr}{path}?tokens={tokens}"))
        .body(Empty::new())
        .unwrap();
    let res = client.request(req).await.unwrap();
    (res.status().as_u16(), res.headers().clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_multi_limit_server_announces_every_limit_of_the_requests_key() {
    // Each tenant (the path): 5 requests an hour (one every 720 s) and 1,000 tokens an hour
    // (one every 3.6 s); "/big" has 10,000 tokens an hour of its own. Nothing refills
    // noticeably while the test runs.
    let tenants = KeyedRateLimiter::<String, [u64; 2]>::builder(["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_hour(5), 5))
        .limit("tokens", Limit::bucket(Rate::per_hour(1_000), 1_000))
        .build()
        .unwrap();
    tenants.set_limit("/big", 1, Limit::bucket(Rate::per_hour(10_000), 10_000));
    let cost = |req: &Request<axum::body::Body>| {
        let tokens = req
            .uri()
            .query()
            .and_then(|q| q.strip_prefix("tokens="))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        [1, tokens]
    };
    let app = Router::new()
        .route("/acme", get(|| async { "ok" }))
        .route("/globex", get(|| async { "ok" }))
        .route("/big", get(|| async { "ok" }))
        .layer(
            RateLimitLayer::keyed(&tenants, |req: &Request<axum::body::Body>| {
                req.uri().path().to_string()
            })
            .cost(cost)
            .enforcing()
            .headers(QuotaHeaders::Draft),
        );
    let addr = serve(app).await;
    let client = client();
    let policy = "\"requests-hour\";q=5;w=3600, \"tokens-hour\";q=1000;w=3600;qu=\"tokens\"";
    let expect = [
        // Each call's key, tokens, and the key's limits after it (whole seconds until full,
        // rounded up).
        (
            "/acme",
            100,
            policy,
            "\"requests-hour\";r=4;t=720, \"tokens-hour\";r=900;t=360",
        ),
        (
            "/acme",
            200,
            policy,
            "\"requests-hour\";r=3;t=1440, \"tokens-hour\";r=700;t=1080",
        ),
        // Another tenant: its own limits, untouched by acme's calls.
        (
            "/globex",
            300,
            policy,
            "\"requests-hour\";r=4;t=720, \"tokens-hour\";r=700;t=1080",
        ),
        // A tenant with a limit of its own announces it.
        (
            "/big",
            1_000,
            "\"requests-hour\";q=5;w=3600, \"tokens-hour\";q=10000;w=3600;qu=\"tokens\"",
            "\"requests-hour\";r=4;t=720, \"tokens-hour\";r=9000;t=360",
        ),
    ];
    for (path, tokens, policy, now) in expect {
        let (status, headers) = call_tenant(&client, addr, path, tokens).await;
        assert_eq!(status, 200, "{path}");
        assert_eq!(headers["ratelimit-policy"], policy, "{path}");
        assert_eq!(headers["ratelimit"], now, "{path}");
        assert!(headers.get("retry-after").is_none());
    }
    // Refused: 900 tokens where 700 are left; the 200 missing come in 720 s. The key's limits
    // as they are (the refusal charged nothing), and read back by a client.
    let (status, headers) = call_tenant(&client, addr, "/acme", 900).await;
    assert_eq!(status, 429);
    assert_eq!(headers["retry-after"], "720");
    assert_eq!(headers["ratelimit-policy"], policy);
    assert_eq!(
        headers["ratelimit"],
        "\"requests-hour\";r=3;t=1440, \"tokens-hour\";r=700;t=1080"
    );
    let limits = limits_from_headers(&headers, SystemTime::now());
    let read: Vec<_> = limits
        .iter()
        .map(|l| (l.dimension, l.announced.limit, l.announced.remaining))
        .collect();
    assert_eq!(
        read,
        [
            (Dimension::Requests, Some(5), 3),
            (Dimension::Tokens, Some(1_000), 700)
        ]
    );
    assert_eq!(tenants.available("/acme"), [3, 700]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_limit_server_announces_every_limit_and_the_client_reads_them_back() {
    // 5 requests a minute (one every 12 s), 1,000 tokens a minute (one every 60 ms) and 3,000
    // a day (midnight UTC to midnight): nothing refills noticeably while the test runs.
    let quota = RateLimiter::builder(["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_minute(5), 5))
        .limit("tokens", Limit::bucket(Rate::per_minute(1_000), 1_000))
        .limit("tokens", Limit::window(3_000, Duration::from_secs(86_400)))
        .build()
        .unwrap();
    let cost = |req: &Request<axum::body::Body>| {
        let tokens = req
            .uri()
            .query()
            .and_then(|q| q.strip_prefix("tokens="))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        [1, tokens]
    };
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(&quota)
            .cost(cost)
            .enforcing()
            .headers(QuotaHeaders::Both),
    );
    let addr = serve(app).await;
    let client = client();
    let mut spent = 0;
    for (i, tokens) in [100, 200, 300].into_iter().enumerate() {
        let before = SystemTime::now();
        let (status, headers) = call_with_tokens(&client, addr, tokens).await;
        let after = SystemTime::now();
        assert_eq!(status, 200);
        spent += tokens;
        let granted = i as u64 + 1;
        // The draft's fields, one policy per limit, named after its dimension and window.
        assert_eq!(
            headers["ratelimit-policy"],
            "\"requests-minute\";q=5;w=60, \"tokens-minute\";q=1000;w=60;qu=\"tokens\", \
             \"tokens-day\";q=3000;w=86400;qu=\"tokens\""
        );
        // Read back as a client reads any destination.
        let limits = limits_from_headers(&headers, after);
        let read: Vec<_> = limits
            .iter()
            .map(|l| {
                (
                    l.name.as_str(),
                    l.dimension,
                    l.announced.limit,
                    l.announced.window,
                    l.announced.remaining,
                )
            })
            .collect();
        let minute = Some(Duration::from_secs(60));
        let day = Some(Duration::from_secs(86_400));
        assert_eq!(
            read,
            [
                (
                    "requests-minute",
                    Dimension::Requests,
                    Some(5),
                    minute,
                    5 - granted
                ),
                (
                    "tokens-minute",
                    Dimension::Tokens,
                    Some(1_000),
                    minute,
                    1_000 - spent
                ),
                (
                    "tokens-day",
                    Dimension::Tokens,
                    Some(3_000),
                    day,
                    3_000 - spent
                ),
            ]
        );
        // Resets: the buckets' exactly (what is owed, less the milliseconds since, rounded
        // up); the day's at the next midnight UTC, as seen between sending and reading.
        assert_eq!(limits[0].announced.reset, Duration::from_secs(granted * 12));
        assert_eq!(
            limits[1].announced.reset,
            Duration::from_secs((spent * 60).div_ceil(1_000))
        );
        let day_reset = limits[2].announced.reset.as_secs();
        assert!(
            (until_midnight(after)..=until_midnight(before)).contains(&day_reset),
            "{day_reset}"
        );
        // The trio: the limit with the fewest left, the requests.
        assert_eq!(
            headers["x-ratelimit-remaining"],
            (5 - granted).to_string().as_str()
        );
        assert_eq!(headers["x-ratelimit-limit"], "5");
    }
    // 600 of the minute's tokens taken: 500 more are 100 short, 6 s at one every 60 ms. The
    // refusal carries every limit too, none charged.
    let (status, headers) = call_with_tokens(&client, addr, 500).await;
    assert_eq!(status, 429);
    assert_eq!(headers["retry-after"], "6");
    let limits = limits_from_headers(&headers, SystemTime::now());
    let remaining: Vec<_> = limits.iter().map(|l| l.announced.remaining).collect();
    assert_eq!(remaining, [2, 400, 2_400]);
}

mod paused {
    use std::convert::Infallible;
    use std::time::Duration;

    use paced::tower::{QuotaHeaders, RateLimitLayer};
    use paced::{Rate, RateLimiter};
    use proptest::prelude::*;
    use tower::{service_fn, Layer, ServiceExt};

    /// The obviously right bucket, in units where a token is `per` nanoseconds' worth of
    /// refill at one token a nanosecond times `tokens`.
    struct Model {
        tokens: u128,
        per: u128,
        burst: u128,
        level: u128,
        at: u128,
    }

    impl Model {
        fn refill(&mut self, now: u128) {
            self.level = (self.level + (now - self.at) * self.tokens).min(self.burst * self.per);
            self.at = now;
        }
        fn secs_ceil(nanos: u128) -> u64 {
            u64::try_from(nanos.div_ceil(1_000_000_000)).unwrap()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// On every response, allowed or refused, the headers say exactly what the bucket
        /// holds and when it is full, and `Retry-After` when the request would conform.
        #[test]
        fn headers_say_exactly_what_the_bucket_holds(
            tokens in 1u64..20,
            per_ms in 1u64..2_000,
            burst in 1u64..20,
            calls in prop::collection::vec((0u64..3_000, 0u64..25), 1..40),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let per = Duration::from_millis(per_ms);
                let quota = RateLimiter::new(Rate::new(tokens, per), burst);
                let layer = RateLimitLayer::new(&quota)
                    .cost(|c: &u64| *c)
                    .enforcing()
                    .headers(QuotaHeaders::Both);
                let api = layer.layer(service_fn(|_: u64| async {
                    Ok::<_, Infallible>(http::Response::new(String::new()))
                }));
                let mut model = Model {
                    tokens: tokens.into(),
                    per: per.as_nanos(),
                    burst: burst.into(),
                    level: u128::from(burst) * per.as_nanos(),
                    at: 0,
                };
                let mut now = 0u128;
                for (gap, cost) in calls {
                    tokio::time::advance(Duration::from_millis(gap)).await;
                    now += u128::from(gap) * 1_000_000;
                    model.refill(now);
                    let res = api.clone().oneshot(cost).await.unwrap();
                    let need = u128::from(cost) * model.per;
                    let granted = cost <= burst && model.level >= need;
                    if granted {
                        model.level -= need;
                        prop_assert_eq!(res.status(), 200);
                        prop_assert!(res.headers().get("retry-after").is_none());
                    } else {
                        prop_assert_eq!(res.status(), 429);
                        let retry = res.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
                        if cost > burst {
                            prop_assert_eq!(retry, None);
                        } else {
                            let wait = (need - model.level).div_ceil(model.tokens);
                            prop_assert_eq!(retry, Some(Model::secs_ceil(wait).to_string()));
                        }
                    }
                    let remaining = u64::try_from(model.level / model.per).unwrap();
                    let to_full = (model.burst * model.per - model.level).div_ceil(model.tokens);
                    let h = |name: &str| res.headers()[name].to_str().unwrap().to_string();
                    prop_assert_eq!(h("x-ratelimit-limit"), burst.to_string());
                    prop_assert_eq!(h("x-ratelimit-remaining"), remaining.to_string());
                    prop_assert_eq!(h("x-ratelimit-reset"), Model::secs_ceil(to_full).to_string());
                    let window = Model::secs_ceil((model.burst * model.per).div_ceil(model.tokens)).max(1);
                    prop_assert_eq!(h("ratelimit-policy"), format!("\"default\";q={burst};w={window}"));
                    prop_assert_eq!(
                        h("ratelimit"),
                        format!("\"default\";r={remaining};t={}", Model::secs_ceil(to_full))
                    );
                }
                Ok(())
            })?;
        }
    }
}

/// A server over a `RateLimiter` (a bucket of requests and a fixed window of tokens),
/// on paused time, against an exact model of both.
mod paused_multi {
    use std::convert::Infallible;
    use std::time::Duration;

    use paced::tower::{QuotaHeaders, RateLimitLayer};
    use paced::{Limit, Rate, RateLimiter};
    use proptest::prelude::*;
    use tower::{service_fn, Layer, ServiceExt};

    fn secs_ceil(nanos: u128) -> u64 {
        u64::try_from(nanos.div_ceil(1_000_000_000)).unwrap()
    }

    fn window_name(secs: u64) -> String {
        match secs {
            1 => "second".to_owned(),
            60 => "minute".to_owned(),
            3_600 => "hour".to_owned(),
            86_400 => "day".to_owned(),
            n => format!("{n}s"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// On every response, allowed or refused, the draft's fields say exactly what each
        /// limit holds and when it is back to full (never early, never more than there is),
        /// the trio the limit with the fewest left, and `Retry-After` the latest of the
        /// limits' waits.
        #[test]
        fn headers_say_exactly_what_every_limit_holds(
            tokens in 1u64..20,
            per_ms in 1u64..2_000,
            burst in 1u64..20,
            quota in 1u64..50,
            len_ms in 1u64..5_000,
            calls in prop::collection::vec((0u64..3_000, 0u64..50), 1..40),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let per = Duration::from_millis(per_ms);
                let len = u128::from(len_ms) * 1_000_000;
                let limiter = RateLimiter::builder(["requests", "tokens"])
                    .limit("requests", Limit::bucket(Rate::new(tokens, per), burst))
                    .limit(
                        "tokens",
                        Limit::window(quota, Duration::from_millis(len_ms))
                            .aligned_to_instant(tokio::time::Instant::now()),
                    )
                    .build()
                    .unwrap();
                let layer = RateLimitLayer::new(&limiter)
                    .cost(|t: &u64| [1, *t])
                    .enforcing()
                    .headers(QuotaHeaders::Both);
                let api = layer.layer(service_fn(|_: u64| async {
                    Ok::<_, Infallible>(http::Response::new(String::new()))
                }));
                // The bucket in units of 1/tokens of a nanosecond's refill; the window's use
                // in window `k` (from the start).
                let (per, tokens) = (per.as_nanos(), u128::from(tokens));
                let full = u128::from(burst) * per;
                let (mut level, mut at) = (full, 0u128);
                let (mut k, mut used) = (0u128, 0u64);
                let mut now = 0u128;
                let w1 = secs_ceil(full.div_ceil(tokens)).max(1);
                let w2 = secs_ceil(len).max(1);
                let (n1, n2) = (
                    format!("requests-{}", window_name(w1)),
                    format!("tokens-{}", window_name(w2)),
                );
                for (gap, t) in calls {
                    // Costs within the window's quota (one above it waits for an empty window:
                    // another model).
                    let t = t % (quota + 1);
                    tokio::time::advance(Duration::from_millis(gap)).await;
                    now += u128::from(gap) * 1_000_000;
                    level = (level + (now - at) * tokens).min(full);
                    at = now;
                    if now / len != k {
                        k = now / len;
                        used = 0;
                    }
                    let res = api.clone().oneshot(t).await.unwrap();
                    let bucket_wait = per.saturating_sub(level).div_ceil(tokens);
                    let window_wait = if t > 0 && used + t > quota { (k + 1) * len - now } else { 0 };
                    if bucket_wait == 0 && window_wait == 0 {
                        level -= per;
                        used += t;
                        prop_assert_eq!(res.status(), 200);
                    } else {
                        prop_assert_eq!(res.status(), 429);
                        let retry = secs_ceil(bucket_wait.max(window_wait)).to_string();
                        prop_assert_eq!(res.headers()["retry-after"].to_str().unwrap(), retry);
                    }
                    let h = |name: &str| res.headers()[name].to_str().unwrap().to_string();
                    prop_assert_eq!(
                        h("ratelimit-policy"),
                        format!("\"{n1}\";q={burst};w={w1}, \"{n2}\";q={quota};w={w2};qu=\"tokens\"")
                    );
                    let (r1, t1) = (u64::try_from(level / per).unwrap(), secs_ceil((full - level).div_ceil(tokens)));
                    let (r2, t2) = (quota - used, if used > 0 { secs_ceil((k + 1) * len - now) } else { 0 });
                    prop_assert_eq!(
                        h("ratelimit"),
                        format!("\"{n1}\";r={r1};t={t1}, \"{n2}\";r={r2};t={t2}")
                    );
                    let (least, reset) = if (r2, std::cmp::Reverse(t2)) < (r1, std::cmp::Reverse(t1)) {
                        (r2, t2)
                    } else {
                        (r1, t1)
                    };
                    prop_assert_eq!(h("x-ratelimit-remaining"), least.to_string());
                    prop_assert_eq!(h("x-ratelimit-reset"), reset.to_string());
                }
                Ok(())
            })?;
        }
    }
}

/// The dialects of LLM providers through `AdaptiveLayer::http`, on paused time: the limit of
/// requests that binds sets the rate, clamped into `[min, max]`; limits of tokens do not, but
/// a `429` for want of tokens waits for them.
mod dialects {
    use std::convert::Infallible;
    use std::time::{Duration, SystemTime};

    use http::{HeaderValue, Response};
    use paced::tower::{AdaptiveLayer, RateLimitLayer};
    use paced::{Adaptive, Rate, RateLimiter};
    use proptest::prelude::*;
    use tokio::time::Instant;
    use tower::util::BoxCloneService;
    use tower::{ServiceBuilder, ServiceExt};

    type Api = BoxCloneService<Response<()>, Response<()>, Infallible>;

    /// A destination that answers each request with the response it carries, through
    /// `AdaptiveLayer::http` and a `RateLimitLayer` over the controller's limiter.
    fn api(adaptive: &Adaptive) -> Api {
        let api = ServiceBuilder::new()
            .layer(AdaptiveLayer::http(adaptive))
            .layer(RateLimitLayer::new(adaptive.limiter()))
            .service_fn(|answer: Response<()>| async move { Ok::<_, Infallible>(answer) });
        BoxCloneService::new(api)
    }

    fn answer(status: u16, headers: &[(&'static str, String)]) -> Response<()> {
        let mut response = Response::builder().status(status).body(()).unwrap();
        for (name, value) in headers {
            response
                .headers_mut()
                .append(*name, HeaderValue::from_str(value).unwrap());
        }
        response
    }

    /// An RFC 3339 time `secs` from now, as Anthropic writes its resets.
    fn in_secs(secs: u64) -> String {
        let at = SystemTime::now() + Duration::from_secs(secs);
        jiff::Timestamp::try_from(at).unwrap().to_string()
    }

    fn openai(requests: (u64, &str), tokens: (u64, &str)) -> Vec<(&'static str, String)> {
        vec![
            ("x-ratelimit-limit-requests", "500".into()),
            ("x-ratelimit-remaining-requests", requests.0.to_string()),
            ("x-ratelimit-reset-requests", requests.1.into()),
            ("x-ratelimit-limit-tokens", "30000".into()),
            ("x-ratelimit-remaining-tokens", tokens.0.to_string()),
            ("x-ratelimit-reset-tokens", tokens.1.into()),
        ]
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn openai_the_requests_set_the_rate_and_a_429_for_tokens_waits_for_them() {
        let max = Rate::per_second(100);
        let adaptive = Adaptive::new(RateLimiter::new(max, 10), Rate::per_second(1), max);
        let api = api(&adaptive);
        // 119 requests left for a minute: 2/s. The tokens are drained for 6 minutes, which a
        // request rate does not take: no pause.
        let ok = answer(200, &openai((119, "1m0s"), (0, "6m0s")));
        let start = Instant::now();
        api.clone().oneshot(ok.clone()).await.unwrap();
        assert_eq!(adaptive.rate(), Rate::per_second(2));
        api.clone().oneshot(ok).await.unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        // Refused for want of tokens, without `Retry-After`: the next call waits for them.
        let refused = answer(429, &openai((117, "59s"), (0, "6.5s")));
        api.clone().oneshot(refused).await.unwrap();
        let at = Instant::now();
        api.clone()
            .oneshot(answer(200, &openai((116, "58s"), (900, "1s"))))
            .await
            .unwrap();
        let waited = at.elapsed();
        assert!(
            waited >= Duration::from_millis(6_500) && waited < Duration::from_millis(7_000),
            "{waited:?}"
        );
        assert_eq!(adaptive.stats().throttled, 1);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn anthropic_the_requests_set_the_rate_within_min_and_max() {
        let (min, max) = (Rate::per_second(1), Rate::per_second(50));
        let adaptive = Adaptive::new(RateLimiter::new(max, 10), min, max);
        let api = api(&adaptive);
        let headers = |requests: (u64, u64), input_tokens: (u64, u64)| {
            vec![
                ("anthropic-ratelimit-requests-limit", "4000".to_string()),
                (
                    "anthropic-ratelimit-requests-remaining",
                    requests.0.to_string(),
                ),
                ("anthropic-ratelimit-requests-reset", in_secs(requests.1)),
                (
                    "anthropic-ratelimit-input-tokens-limit",
                    "400000".to_string(),
                ),
                (
                    "anthropic-ratelimit-input-tokens-remaining",
                    input_tokens.0.to_string(),
                ),
                (
                    "anthropic-ratelimit-input-tokens-reset",
                    in_secs(input_tokens.1),
                ),
            ]
        };
        // 3,999 requests left for a minute, 67/s: clamped to `max`; the input tokens are
        // drained, which a request rate does not take.
        let start = Instant::now();
        api.clone()
            .oneshot(answer(200, &headers((3999, 60), (0, 30))))
            .await
            .unwrap();
        assert_eq!(adaptive.rate(), max);
        // One request left for an hour: clamped to `min`.
        api.clone()
            .oneshot(answer(200, &headers((1, 3600), (1000, 30))))
            .await
            .unwrap();
        assert_eq!(adaptive.rate(), min);
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        // None left for 20 s (less what the system clock moved on): the next call waits.
        api.clone()
            .oneshot(answer(200, &headers((0, 20), (1000, 30))))
            .await
            .unwrap();
        let at = Instant::now();
        api.clone().oneshot(answer(200, &[])).await.unwrap();
        let waited = at.elapsed();
        assert!(
            waited >= Duration::from_secs(18) && waited <= Duration::from_secs(21),
            "{waited:?}"
        );
        assert_eq!(adaptive.stats().successes, 4);
    }

    const NAMES: [&str; 16] = [
        "ratelimit",
        "ratelimit-policy",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "x-ratelimit-resource",
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
        "anthropic-ratelimit-requests-limit",
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-requests-reset",
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-ratelimit-tokens-reset",
        "retry-after",
    ];

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            "[ -~]{0,30}",
            "[0-9]{0,22}",
            "([0-9]{0,6}(\\.[0-9]{0,4})?(h|m|s|ms|us|ns)){1,3}",
            "20[0-9]{2}-1[0-2]-[0-2][0-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,4})?(Z|[+-]0[0-9]:00)",
            "(\"[a-z]{0,3}\"|[a-z]{0,3})(;[qrtw]=[0-9]{0,16}){0,3}(, ?\"[a-z]{0,2}\";[qrtw]=[0-9]{0,5}){0,2}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// Whatever the dialects say, the rate stays within `[min, max]`.
        #[test]
        fn any_dialect_keeps_the_rate_within_min_and_max(
            status in prop_oneof![Just(200u16), Just(429), Just(503)],
            headers in prop::collection::vec((0usize..NAMES.len(), value()), 0..10),
            min in 1u64..1_000_000,
            span in 0u64..1_000_000,
        ) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let per = Duration::from_secs(1000);
                let (min, max) = (Rate::new(min, per), Rate::new(min + span, per));
                let adaptive = Adaptive::new(RateLimiter::new(max, 4), min, max);
                let api = api(&adaptive);
                let mut response = Response::builder().status(status).body(()).unwrap();
                for (name, v) in &headers {
                    if let Ok(v) = HeaderValue::from_str(v) {
                        response.headers_mut().append(NAMES[*name], v);
                    }
                }
                for _ in 0..2 {
                    // A pause of up to a day (a year, for `Retry-After`) is no hang on
                    // paused time: the clock jumps.
                    api.clone().oneshot(response.clone()).await.unwrap();
                    let rate = adaptive.rate();
                    prop_assert!(rate >= min && rate <= max, "{:?} outside [{:?}, {:?}]", rate, min, max);
                }
                Ok(())
            })?;
        }
    }
}
