//! The price of the `metrics` feature on the hot path: one uncontended `RateLimiter::try_acquire`
//! on one thread, with a limit that never binds (the lock-free path), as `shared`'s
//! `try_acquire/paced/rate_limiter_1e9ps_huge_burst` measures it:
//!
//! - `no_name`: the feature on, the limiter not named (one branch per grant);
//! - `named_noop_recorder`: named with no recorder installed (the facade's no-op handles);
//! - `named_debugging_recorder`: named under `metrics_util`'s `DebuggingRecorder` (atomic
//!   counters, a histogram that appends to a lock-free bucket);
//! - `named_prometheus_recorder`: named under `metrics-exporter-prometheus`'s recorder (atomic
//!   counters, a histogram that appends to a lock-free bucket until a scrape drains it).
//!
//! `no_name` runs again last (`no_name_again`): on a noisy machine the first case of a run can
//! read slower than it is. The histograms of the two recorders are drained between samples, so that memory stays flat.
//! Every timed call is counted and the run fails if one was refused.
//!
//! Run: `cargo bench -p paced-benches --features metrics --bench metrics -- --warm-up-time 1 --measurement-time 3`
//! (and, for the feature off, `cargo bench -p paced-benches --bench shared -- try_acquire/paced/rate`).

use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};
use metrics_exporter_prometheus::PrometheusBuilder;
use metrics_util::debugging::DebuggingRecorder;
use paced::{Rate, RateLimiter};

fn limiter() -> RateLimiter {
    RateLimiter::new(Rate::per_second(1_000_000_000), u64::MAX / 2)
}

fn bench_try(c: &mut Criterion, name: &str, limiter: &RateLimiter, drain: &dyn Fn()) {
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            drain();
            let mut granted = 0u64;
            let start = Instant::now();
            for _ in 0..iters {
                granted += u64::from(black_box(limiter.try_acquire(1).is_ok()));
            }
            let took = start.elapsed();
            assert_eq!(granted, iters, "{name}: a timed call was refused");
            took
        });
    });
}

fn try_acquire(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();

    bench_try(c, "metrics_try_acquire/no_name", &limiter(), &|| {});

    let named = limiter().with_metrics("bench");
    bench_try(c, "metrics_try_acquire/named_noop_recorder", &named, &|| {});

    let debugging = DebuggingRecorder::new();
    let snapshotter = debugging.snapshotter();
    let named = metrics::with_local_recorder(&debugging, || limiter().with_metrics("bench"));
    bench_try(
        c,
        "metrics_try_acquire/named_debugging_recorder",
        &named,
        &|| drop(snapshotter.snapshot()),
    );
    assert!(!snapshotter.snapshot().into_vec().is_empty());

    let prometheus = PrometheusBuilder::new().build_recorder();
    let handle = prometheus.handle();
    let named = metrics::with_local_recorder(&prometheus, || limiter().with_metrics("bench"));
    bench_try(
        c,
        "metrics_try_acquire/named_prometheus_recorder",
        &named,
        &|| drop(handle.render()),
    );
    assert!(handle
        .render()
        .contains("paced_grants_total{limiter=\"bench\"}"));

    // Once more at the end: on a noisy machine the first case of a run can read slower.
    bench_try(c, "metrics_try_acquire/no_name_again", &limiter(), &|| {});
}

criterion_group!(benches, try_acquire);
criterion_main!(benches);
