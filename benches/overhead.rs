//! Per-item overhead of every paced operator with a limit that never binds, side by side with
//! a bare stream and with the peers (tokio-stream, governor, leaky-bucket) in the same run.
//!
//! Every benchmark drains `N` items per iteration on a current-thread runtime with a manual
//! `while let Some(x) = s.next().await` loop, so `time / N` is the cost per item. Before a
//! benchmark is timed, the same stream is drained once and checked to yield all `N` items (and,
//! for `Enforcing`, to refuse none): a limit that binds, or a stream that ends early, fails the
//! run instead of being measured.
//!
//! Run: `cargo bench -p paced-benches --bench overhead -- --warm-up-time 1 --measurement-time 2`

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use futures_util::{Stream, StreamExt};
use governor::prelude::StreamRateLimitExt;
use governor::{Quota, RateLimiter};
use paced::{Enforcing, PaceExt, Rate, Shaping};
use tokio::runtime::Runtime;

/// Items per iteration.
const N: u64 = 10_000;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("current-thread runtime")
}

fn source() -> futures_util::stream::Iter<std::ops::Range<u64>> {
    futures_util::stream::iter(0..N)
}

/// Drains `make()` once, untimed, and asserts that the items it yields, as counted by `count`,
/// add up to `N`; then benchmarks draining it.
fn bench_stream<S, M, C>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    name: &str,
    make: M,
    count: C,
) where
    M: Fn() -> S,
    S: Stream,
    C: Fn(&S::Item) -> u64,
{
    let total = rt.block_on(async {
        let mut s = pin!(make());
        let mut total = 0;
        while let Some(x) = s.next().await {
            total += count(&x);
        }
        total
    });
    assert_eq!(total, N, "{name}: yielded {total} of {N} items");
    group.bench_function(name, |b| {
        b.to_async(rt).iter(|| async {
            let mut s = pin!(make());
            while let Some(x) = s.next().await {
                black_box(x);
            }
        });
    });
}

/// The same for a per-item limiter future (`until_ready`, `acquire_one`): `N` awaits per
/// iteration. The check runs the loop once and asserts it finished quickly, i.e. never waited.
fn bench_per_item<M, F>(group: &mut BenchmarkGroup<'_, WallTime>, rt: &Runtime, name: &str, wait: M)
where
    M: Fn() -> F,
    F: Future,
{
    let start = std::time::Instant::now();
    rt.block_on(async {
        for i in 0..N {
            wait().await;
            black_box(i);
        }
    });
    let took = start.elapsed();
    assert!(
        took < Duration::from_millis(50),
        "{name}: {N} non-binding waits took {took:?}, the limit binds"
    );
    group.bench_function(name, |b| {
        b.to_async(rt).iter(|| async {
            for i in 0..N {
                wait().await;
                black_box(i);
            }
        });
    });
}

fn one<T>(_: &T) -> u64 {
    1
}

fn overhead(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("overhead");
    group.throughput(Throughput::Elements(N));

    // Baseline: the bare source.
    bench_stream(&mut group, &rt, "baseline/stream_iter", source, one);

    // paced, with limits that never bind.
    bench_stream(
        &mut group,
        &rt,
        "paced/throttle_shaping_1e9ps_huge_burst",
        || {
            PaceExt::throttle(
                source(),
                Rate::per_second(1_000_000_000),
                |_| 1,
                u64::MAX / 2,
                Shaping,
            )
        },
        one,
    );
    bench_stream(
        &mut group,
        &rt,
        "paced/throttle_enforcing_1e9ps_huge_burst",
        || {
            PaceExt::throttle(
                source(),
                Rate::per_second(1_000_000_000),
                |_| 1,
                u64::MAX / 2,
                Enforcing,
            )
        },
        |r| {
            assert!(r.is_ok(), "Enforcing refused an item: the limit binds");
            1
        },
    );
    bench_stream(
        &mut group,
        &rt,
        "paced/min_interval_1ns",
        || source().min_interval(Duration::from_nanos(1)),
        one,
    );
    bench_stream(
        &mut group,
        &rt,
        "paced/min_interval_0",
        || source().min_interval(Duration::ZERO),
        one,
    );
    bench_stream(
        &mut group,
        &rt,
        "paced/batched_interval_1024_0",
        || source().batched_interval(1024, Duration::ZERO),
        |batch| batch.len() as u64,
    );
    bench_stream(
        &mut group,
        &rt,
        "paced/batched_interval_1024_1ns",
        || source().batched_interval(1024, Duration::from_nanos(1)),
        |batch| batch.len() as u64,
    );
    bench_stream(
        &mut group,
        &rt,
        "paced/staggered_start_max_1ns",
        || source().staggered_start(usize::MAX, Duration::from_nanos(1)),
        one,
    );
    bench_stream(
        &mut group,
        &rt,
        "paced/staggered_start_1_0",
        || source().staggered_start(1, Duration::ZERO),
        one,
    );

    // tokio-stream: only a zero duration does not bind. Any non-zero duration sleeps once per
    // item on the 1 ms timer (checked in `main` below), so `throttle(1ns)` is not an overhead
    // measurement.
    bench_stream(
        &mut group,
        &rt,
        "tokio_stream/throttle_0",
        || tokio_stream::StreamExt::throttle(source(), Duration::ZERO),
        one,
    );

    // governor, 1 cell per ns with a burst of u32::MAX: never binds at these speeds.
    let quota = Quota::with_period(Duration::from_nanos(1))
        .expect("non-zero period")
        .allow_burst(NonZeroU32::MAX);
    let limiter = RateLimiter::direct(quota);
    bench_stream(
        &mut group,
        &rt,
        "governor/ratelimit_stream",
        || source().ratelimit_stream(&limiter),
        one,
    );
    let limiter = RateLimiter::direct(quota);
    bench_per_item(&mut group, &rt, "governor/until_ready", || {
        limiter.until_ready()
    });

    // leaky-bucket, a bucket as large as it allows, refilled by as much every 1 ms.
    let bucket = rt.block_on(async {
        leaky_bucket::RateLimiter::builder()
            .max(usize::MAX)
            .initial(usize::MAX)
            .refill(usize::MAX)
            .interval(Duration::from_millis(1))
            .build()
    });
    bench_per_item(&mut group, &rt, "leaky_bucket/acquire_one", || {
        bucket.acquire_one()
    });
    group.finish();

    // For reference: one clock read.
    let mut group = c.benchmark_group("clock");
    let _guard = rt.enter();
    group.bench_function("std_instant_now", |b| b.iter(std::time::Instant::now));
    group.bench_function("tokio_instant_now", |b| b.iter(tokio::time::Instant::now));
    group.finish();
}

/// Shows, untimed, that tokio-stream's `throttle` binds with any non-zero duration: each item
/// waits for a timer tick.
fn tokio_stream_throttle_binds() {
    let rt = runtime();
    let items = 50;
    let took = rt.block_on(async {
        let start = std::time::Instant::now();
        let mut s = pin!(tokio_stream::StreamExt::throttle(
            futures_util::stream::iter(0..items),
            Duration::from_nanos(1),
        ));
        while let Some(x) = s.next().await {
            black_box(x);
        }
        start.elapsed()
    });
    println!(
        "note: tokio_stream throttle(1ns) took {took:?} for {items} items ({:?} per item): it \
         binds at one timer tick per item, so the overhead table uses throttle(0)",
        took / items
    );
}

fn notes(_: &mut Criterion) {
    tokio_stream_throttle_binds();
}

criterion_group!(benches, notes, overhead);
criterion_main!(benches);
