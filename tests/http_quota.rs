//! Feature `http`: the quota headers, read by `classify_http` and fed to an `Adaptive`, never
//! panic and never push the rate outside `[min, max]`, whatever the server sends; and a real
//! axum server on 127.0.0.1 that announces its quota is never refused by a hyper client
//! through `AdaptiveLayer::http`.
#![cfg(feature = "http")]

mod common;

use std::time::Duration;

use http::{HeaderValue, Response};
use pacer::tower::{classify_http, quota_from_headers, retry_after, Outcome};
use pacer::{Adaptive, Rate, RateLimiter};
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
                    Outcome::Ignore => {}
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
