//! Feature `http`: the quota headers, read by `classify_http` and fed to an `Adaptive`, never
//! panic and never push the rate outside `[min, max]`, whatever the server sends; and a real
//! axum server on 127.0.0.1 that announces its quota is never refused by a hyper client
//! through `AdaptiveLayer::http`.
#![cfg(feature = "http")]

#[path = "../../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use http::{HeaderValue, Response};
use paced::tower::{classify_http, quota_from_headers, retry_after, Outcome};
use paced::{Adaptive, Rate, RateLimiter};
use proptest::prelude::*;

use common::paused;

const NAMES: [&str; 7] = [
    "retry-after",
    "ratelimit",
    "ratelimit-policy",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-ratelimit-reset-after",
];

/// Header values: arbitrary text, and near-misses of the real syntax.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[ -~]{0,40}",
        "-?[0-9]{0,25}(\\.[0-9]{0,5})?",
        "(\"[a-z;,]{0,5}\"|[a-z]{0,3})(;[qrtw ]{0,2}=-?[0-9]{0,17}){0,4}(, ?[a-z]{0,2};q=[0-9]{0,3};w=[0-9]{0,3})?",
        "(Mon|Sun), [0-9]{2} (Jan|Nov) [0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn any_headers_keep_the_rate_within_min_and_max(
        status in prop_oneof![Just(200u16), Just(429), Just(503), Just(500), 100u16..600],
        headers in prop::collection::vec((0usize..NAMES.len(), value()), 0..8),
        min in 1u64..1_000_000,
        span in 0u64..1_000_000,
    ) {
        paused(async move {
            let (min, max) = (Rate::new(min, Duration::from_secs(1000)), Rate::new(min + span, Duration::from_secs(1000)));
            let adaptive = Adaptive::new(RateLimiter::new(max, 4), min, max);
            let mut response = Response::builder().status(status).body(()).unwrap();
            for (name, v) in &headers {
                if let Ok(v) = HeaderValue::from_str(v) {
                    response.headers_mut().append(NAMES[*name], v);
                }
            }
            let _ = retry_after(response.headers());
            let _ = quota_from_headers(response.headers());
            for _ in 0..3 {
                match classify_http::<_, ()>(&Ok(response.clone())) {
                    Outcome::Success => adaptive.on_success(),
                    Outcome::Throttled { retry_after } => adaptive.on_throttled(retry_after),
                    Outcome::Quota(quota) => adaptive.on_quota(quota),
                    _ => {}
                }
                let rate = adaptive.rate();
                assert!(rate >= min && rate <= max, "{rate:?} outside [{min:?}, {max:?}]");
                tokio::time::advance(Duration::from_millis(300)).await;
            }
        });
    }
}

#[test]
fn a_refusal_without_retry_after_waits_for_the_announced_reset() {
    let refused = Response::builder()
        .status(429)
        .header("x-ratelimit-remaining", "0")
        .header("x-ratelimit-reset", "3")
        .body(())
        .unwrap();
    assert_eq!(
        classify_http::<_, ()>(&Ok(refused)),
        Outcome::Throttled {
            retry_after: Some(Duration::from_secs(3))
        }
    );
    let refused = Response::builder().status(503).body(()).unwrap();
    assert_eq!(
        classify_http::<_, ()>(&Ok(refused)),
        Outcome::Throttled { retry_after: None }
    );
    assert_eq!(
        classify_http::<(), _>(&Err("connection reset")),
        Outcome::Ignore
    );
}

/// Real HTTP on 127.0.0.1, in real time: an axum server whose quota is a token bucket of
/// 100/s (burst 10), announced with every answer (`RateLimit-Policy: "default";q=100;w=1`,
/// `RateLimit: "default";r=<tokens left>;t=<seconds until full, rounded up>`), and a hyper-util
/// client through `AdaptiveLayer::http` + `RateLimitLayer`, starting at 10/s (it knows nothing
/// before the first answer) with `max` 250/s, from 8 tasks for 2 s. Not one 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_real_http_an_announced_quota_is_never_exceeded() {
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::get;
    use axum::Router;
    use http_body_util::Empty;
    use hyper::body::Bytes;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use paced::tower::{AdaptiveLayer, RateLimitLayer};
    use tower::{ServiceBuilder, ServiceExt};

    const TASKS: usize = 8;
    let quota = RateLimiter::new(Rate::per_second(100), 10);
    let app = Router::new().route(
        "/",
        get(move || {
            let quota = quota.clone();
            async move {
                let granted = quota.try_acquire(1).is_ok();
                let left = quota.available();
                let mut headers = HeaderMap::new();
                headers.insert(
                    "ratelimit-policy",
                    HeaderValue::from_static("\"default\";q=100;w=1"),
                );
                // Until full: (10 - left) tokens at 100/s, in whole seconds, rounded up.
                let reset = if left >= 10 { 0 } else { 1 };
                let value = format!("\"default\";r={left};t={reset}");
                headers.insert("ratelimit", HeaderValue::from_str(&value).unwrap());
                let status = if granted {
                    StatusCode::OK
                } else {
                    StatusCode::TOO_MANY_REQUESTS
                };
                (status, headers, "ok")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let max = Rate::per_second(250);
    let adaptive = Adaptive::new(
        RateLimiter::new(Rate::per_second(10), 2),
        Rate::per_second(10),
        max,
    );
    let client = ServiceBuilder::new()
        .layer(AdaptiveLayer::http(&adaptive))
        .layer(RateLimitLayer::new(adaptive.limiter()))
        .service(Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>());
    let start = std::time::Instant::now();
    let deadline = start + Duration::from_millis(2_000);
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while std::time::Instant::now() < deadline {
                    let request = http::Request::get(format!("http://{addr}/"))
                        .body(Empty::new())
                        .unwrap();
                    let bound = tokio::time::Instant::from_std(deadline);
                    match tokio::time::timeout_at(bound, client.clone().oneshot(request)).await {
                        Ok(response) => seen.push(response.unwrap().status()),
                        Err(_) => break,
                    }
                }
                seen
            })
        })
        .collect();
    let mut seen = Vec::new();
    for task in tasks {
        seen.extend(task.await.unwrap());
    }
    let ok = seen.iter().filter(|&&s| s == StatusCode::OK).count();
    let refused = seen
        .iter()
        .filter(|&&s| s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    let stats = adaptive.stats();
    println!(
        "{ok} × 200, {refused} × 429 in {:?}; {stats:?}",
        start.elapsed()
    );
    assert_eq!(refused, 0, "{stats:?}");
    assert_eq!(ok, seen.len());
    assert_eq!(stats.rate, Rate::per_second(100));
    // Goodput: the 2 s at 100/s less the first round trip; a loaded machine may lose some.
    assert!(ok >= 150, "{ok} × 200");
}
