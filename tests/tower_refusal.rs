//! An enforcing `RateLimitLayer`'s refusal, as a server sees it: a `BoxError` that downcasts to
//! `paced::NotUntil` (`paced::tower::RateLimited` is its alias), with exact `retry_after`,
//! `retry_after_secs` (rounded up), `is_never` and `Display` under paused time.
#![cfg(feature = "tower")]

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use paced::tower::{BoxError, RateLimitLayer, RateLimited};
use paced::{NotUntil, Rate, RateLimiter};
use tokio::time::{advance, Instant};
use tower::{Layer, Service, ServiceExt};

/// An enforcing server over `quota` where each request costs its value, and a count of the
/// requests that reached the inner service.
fn server(
    quota: &RateLimiter,
) -> (
    impl Service<u64, Response = u64, Error = BoxError> + Clone + use<>,
    Arc<AtomicU64>,
) {
    let called = Arc::new(AtomicU64::new(0));
    let count = called.clone();
    let inner = tower::service_fn(move |cost: u64| {
        count.fetch_add(1, Ordering::Relaxed);
        async move { Ok::<_, Infallible>(cost) }
    });
    let layer = RateLimitLayer::new(quota)
        .cost(|cost: &u64| *cost)
        .enforcing();
    (layer.layer(inner), called)
}

/// The refusal inside `err`, found as a server finds it; panics if `err` is not one.
fn refusal(err: BoxError) -> NotUntil {
    assert!(err.is::<RateLimited>(), "not a refusal: {err}");
    let by_ref = *err.downcast_ref::<NotUntil>().expect("a NotUntil");
    let owned = *err.downcast::<NotUntil>().expect("a NotUntil");
    assert_eq!(by_ref, owned);
    owned
}

#[tokio::test(start_paused = true)]
async fn a_refusal_is_a_not_until_with_exact_retry_after() {
    // 4 per second (one token every 250 ms), bursts of 2.
    let quota = RateLimiter::new(Rate::per_second(4), 2);
    let (service, called) = server(&quota);
    assert_eq!(service.clone().oneshot(2).await.unwrap(), 2);

    let refused = refusal(service.clone().oneshot(1).await.unwrap_err());
    assert_eq!(refused.retry_after(), Duration::from_millis(250));
    assert_eq!(refused.retry_after_secs(), 1);
    assert!(!refused.is_never());
    assert_eq!(refused.to_string(), "rate limited: retry after 250ms");

    // Two tokens are 500 ms away; 100 ms later, 400 ms.
    advance(Duration::from_millis(100)).await;
    let refused = refusal(service.clone().oneshot(2).await.unwrap_err());
    assert_eq!(refused.retry_after(), Duration::from_millis(400));
    assert_eq!(refused.retry_after_secs(), 1);
    assert!(!refused.is_never());
    assert_eq!(refused.to_string(), "rate limited: retry after 400ms");

    // Refusals reach nothing and take nothing: the token is there at 250 ms.
    assert_eq!(called.load(Ordering::Relaxed), 1);
    advance(Duration::from_millis(150)).await;
    assert_eq!(service.oneshot(1).await.unwrap(), 1);
    assert_eq!(called.load(Ordering::Relaxed), 2);
    assert_eq!((quota.stats().granted, quota.stats().rejected), (2, 2));
}

#[tokio::test(start_paused = true)]
async fn retry_after_secs_rounds_up_to_whole_seconds() {
    // One token every 2.5 s.
    let quota = RateLimiter::new(Rate::new(2, Duration::from_secs(5)), 1);
    let (service, _) = server(&quota);
    service.clone().oneshot(1).await.unwrap();
    let refused = refusal(service.clone().oneshot(1).await.unwrap_err());
    assert_eq!(refused.retry_after(), Duration::from_millis(2500));
    assert_eq!(refused.retry_after_secs(), 3);
    assert_eq!(refused.to_string(), "rate limited: retry after 2.5s");

    // One nanosecond short of a whole second still rounds up...
    advance(Duration::from_millis(1500) + Duration::from_nanos(1)).await;
    let refused = refusal(service.clone().oneshot(1).await.unwrap_err());
    assert_eq!(refused.retry_after(), Duration::from_nanos(999_999_999));
    assert_eq!(refused.retry_after_secs(), 1);

    // ...and a whole number of seconds stays as it is.
    let quota = RateLimiter::new(Rate::new(1, Duration::from_secs(2)), 1);
    let (service, _) = server(&quota);
    service.clone().oneshot(1).await.unwrap();
    let refused = refusal(service.oneshot(1).await.unwrap_err());
    assert_eq!(refused.retry_after(), Duration::from_secs(2));
    assert_eq!(refused.retry_after_secs(), 2);
    assert_eq!(refused.to_string(), "rate limited: retry after 2s");
}

#[tokio::test(start_paused = true)]
async fn a_cost_above_the_burst_is_never() {
    let quota = RateLimiter::new(Rate::per_second(4), 2);
    let (service, called) = server(&quota);
    let start = Instant::now();
    // Refused at once, bucket full: no wait would let 3 tokens through a burst of 2.
    let refused = refusal(service.clone().oneshot(3).await.unwrap_err());
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(refused.is_never());
    assert_eq!(refused.retry_after(), Duration::MAX);
    assert_eq!(refused.retry_after_secs(), u64::MAX);
    assert!(
        refused.to_string().starts_with("rate limited: never"),
        "{refused}"
    );
    assert_eq!(called.load(Ordering::Relaxed), 0);
    // The burst itself still passes.
    assert_eq!(service.oneshot(2).await.unwrap(), 2);
}
