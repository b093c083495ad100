//! The Redis limiters under the `metrics` feature, against a private `redis-server` (see
//! `tests/common/redis_server.rs` at the root): a named quota's counters on the facade match its
//! `stats()`, and the name given last wins. Here rather than beside the other Redis tests because
//! they read the counters with `metrics-util`'s debugging recorder.
#![cfg(all(feature = "redis", feature = "metrics"))]

use metrics::{SharedString, Unit};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::CompositeKey;
use paced::redis::FailurePolicy;
use paced::{Rate, RedisKeyedRateLimiter, RedisRateLimiter};

#[path = "../../tests/common/redis_server.rs"]
#[allow(dead_code)] // `check_bound`, for the tests that time grants
mod redis_server;
use redis_server::Server;

/// What a `DebuggingRecorder`'s snapshot holds.
type Snapshot = Vec<(CompositeKey, Option<Unit>, Option<SharedString>, DebugValue)>;

/// A URL where nothing listens: Redis is down from the start.
fn nowhere() -> String {
    let port = redis_server::free_port();
    format!("redis://127.0.0.1:{port}/")
}

/// The counter `name` of `limiter` in `snapshot` (with the label `kind`, if given).
fn counter(snapshot: &Snapshot, limiter: &str, name: &str, kind: Option<&str>) -> u64 {
    snapshot
        .iter()
        .find(|(key, ..)| {
            let key = key.key();
            key.name() == name
                && key
                    .labels()
                    .any(|l| l.key() == "limiter" && l.value() == limiter)
                && kind
                    .is_none_or(|kind| key.labels().any(|l| l.key() == "kind" && l.value() == kind))
        })
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => *n,
            other => panic!("{name} is not a counter: {other:?}"),
        })
        .unwrap_or_else(|| panic!("no {name} for {limiter}"))
}

/// The `metrics` feature: a named quota's counters on the facade match its `stats()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_quota_records_to_the_metrics_facade() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let server = Server::start();
    let (up, down) = metrics::with_local_recorder(&recorder, || {
        let up = RedisRateLimiter::builder(server.url(), "named", Rate::per_hour(1), 3)
            .with_metrics("up")
            .build()
            .unwrap();
        let down = RedisRateLimiter::builder(nowhere(), "named", Rate::per_second(100), 10)
            .failure_policy(FailurePolicy::FailOpen { share: 1.0 })
            .with_metrics("down")
            .build()
            .unwrap();
        (up, down)
    });
    up.try_acquire(2).await.unwrap();
    for _ in 0..5 {
        let _ = up.try_acquire(2).await.unwrap_err();
    }
    for _ in 0..3 {
        up.acquire(0).await.unwrap();
    }
    down.try_acquire(1).await.unwrap();
    let snapshot = snapshotter.snapshot().into_vec();
    let counter = |limiter, name, kind| counter(&snapshot, limiter, name, kind);
    // Burst 3 at one per hour: one try of 2 granted, then refusals; cost 0 always passes.
    let stats = up.stats();
    assert_eq!((stats.granted, stats.rejected), (4, 5));
    assert_eq!(counter("up", "paced_grants_total", None), 4);
    assert_eq!(counter("up", "paced_tokens_granted_total", None), 2);
    assert_eq!(counter("up", "paced_refusals_total", None), 5);
    assert_eq!(
        counter("up", "paced_redis_round_trips_total", None),
        stats.round_trips
    );
    assert_eq!(counter("up", "paced_redis_errors_total", Some("outage")), 0);
    // Redis down, failing open: the fallback grants.
    let stats = down.stats();
    assert_eq!(counter("down", "paced_redis_fallbacks_total", None), 1);
    assert_eq!(counter("down", "paced_grants_total", None), 1);
    assert_eq!(
        counter("down", "paced_redis_errors_total", Some("outage")),
        stats.errors
    );
    assert!(stats.errors >= 1);
}

/// The metrics name given last wins: one set of handles, under the last name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_metrics_name_given_wins() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let server = Server::start();
    let quota = metrics::with_local_recorder(&recorder, || {
        RedisRateLimiter::builder(server.url(), "renamed", Rate::per_hour(1), 3)
            .with_metrics("first")
            .with_metrics("last")
            .build()
            .unwrap()
    });
    quota.try_acquire(1).await.unwrap();
    let limiters: Vec<String> = snapshotter
        .snapshot()
        .into_vec()
        .iter()
        .flat_map(|(key, ..)| {
            key.key()
                .labels()
                .filter(|l| l.key() == "limiter")
                .map(|l| l.value().to_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(!limiters.is_empty());
    assert!(limiters.iter().all(|l| l == "last"), "{limiters:?}");
}

/// The `metrics` feature: a named keyed quota's counters on the facade match its `stats()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_keyed_quota_records_to_the_metrics_facade() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let server = Server::start();
    let tenants = metrics::with_local_recorder(&recorder, || {
        RedisKeyedRateLimiter::<String>::builder(server.url(), "named", Rate::per_hour(1), 2)
            .with_metrics("tenants")
            .build()
            .unwrap()
    });
    for tenant in ["a", "b"] {
        tenants.try_acquire(tenant, 2).await.unwrap();
        let _ = tenants.try_acquire(tenant, 1).await.unwrap_err();
    }
    tenants.acquire("c", 1).await.unwrap();
    let stats = tenants.stats();
    assert_eq!((stats.granted, stats.rejected), (3, 2));
    let snapshot = snapshotter.snapshot().into_vec();
    let counter = |name| counter(&snapshot, "tenants", name, None);
    assert_eq!(counter("paced_grants_total"), 3);
    assert_eq!(counter("paced_tokens_granted_total"), 5);
    assert_eq!(counter("paced_refusals_total"), 2);
    assert_eq!(counter("paced_redis_round_trips_total"), stats.round_trips);
}
