//! Quota headers both ways over real HTTP on 127.0.0.1 (feature `http`): an axum server whose
//! enforcing layer announces its quota, and a hyper client that reads it. Real time (sockets do
//! not run on paused time), at a rate of one token a minute, so that no token flows in while a
//! test runs: `Remaining` must count down exactly and `Reset` is checked against the exact
//! bucket, never early.
#![cfg(feature = "http")]

use std::net::SocketAddr;

use axum::http::Request;
use axum::routing::get;
use axum::Router;
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use paced::tower::{QuotaHeaders, RateLimitLayer};
use paced::{KeyedRateLimiter, Rate, RateLimiter};

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
