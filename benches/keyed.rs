//! The keyed limiter, `pacer::KeyedRateLimiter`, side by side with governor's keyed limiter
//! (`governor::RateLimiter::keyed`, a `DashMap` of GCRA cells, both hashing with std's
//! `RandomState`) in the same run, and `throttle_by_key` beside `throttle` and a bare stream.
//!
//! - `keyed_try_acquire/{10,100000}_keys`: one non-blocking acquisition of cost 1 on one
//!   thread, cycling through the keys `0..n` (`u64`) so that every call finds its key already
//!   there (every key is touched before timing). Two quotas, the same for both limiters:
//!   - `slow_refill`: one token per second with a burst of `u32::MAX` (governor's largest; with
//!     it, governor's GCRA cannot represent a period much above 4 s), more than any key takes
//!     in a run (a few times 10^7 calls spread over the keys). It never binds, and no bucket is
//!     full again between two visits, so pacer keeps every key's state, as governor does: the
//!     cost of a call on an existing key.
//!   - `fast_refill`: `u32::MAX` tokens per second with the same burst. It never binds either,
//!     but a bucket is full again a nanosecond after a call, long before its key comes round
//!     again, so pacer forgets the key and creates it afresh on the next call; governor keeps
//!     it. The cost of forgetting, measured.
//!
//!   Every timed call is counted and the run fails if one was refused; an untimed pre-run of
//!   `PRE_RUN` calls checks the same first, and the keys pacer tracks are checked after.
//! - `keyed_overhead`: `N` items of `stream::iter` drained per iteration on a current-thread
//!   runtime, as in the `overhead` bench: bare, through `throttle` (Shaping) and through
//!   `throttle_by_key` with `KEYS` distinct keys (item % `KEYS`), both with the two quotas
//!   above. Before timing, each stream is drained once and checked to yield all `N` items in
//!   order, and the keyed limiter to have granted every one without any wait.
//!
//! Memory is measured by the `keyed_memory` bench.
//!
//! Run: `cargo bench --bench keyed -- --warm-up-time 1 --measurement-time 3`

use std::cell::Cell;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use futures_util::{Stream, StreamExt};
use governor::Quota;
use pacer::{KeyedRateLimiter, PaceExt, Rate, Shaping};
use tokio::runtime::Runtime;

/// Untimed calls before a `try_acquire` benchmark.
const PRE_RUN: u64 = 1_000_000;
/// Items per iteration of a stream benchmark.
const N: u64 = 10_000;
/// Distinct keys in a keyed stream.
const KEYS: u64 = 4;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("current-thread runtime")
}

/// The two quotas, as pacer's rate and burst and as governor's quota.
#[derive(Clone, Copy)]
enum Refill {
    Slow,
    Fast,
}

impl Refill {
    fn name(self) -> &'static str {
        match self {
            Refill::Slow => "slow_refill",
            Refill::Fast => "fast_refill",
        }
    }

    fn pacer(self) -> (Rate, u64) {
        let per_second = match self {
            Refill::Slow => 1,
            Refill::Fast => u32::MAX.into(),
        };
        (Rate::per_second(per_second), u32::MAX.into())
    }

    fn governor(self) -> Quota {
        let per_second = match self {
            Refill::Slow => NonZeroU32::MIN,
            Refill::Fast => NonZeroU32::MAX,
        };
        Quota::per_second(per_second).allow_burst(NonZeroU32::MAX)
    }
}

// ---------------------------------------------------------------------------------------------
// Uncontended try_acquire on an existing key

/// Keys `0..n`, round and round.
struct Cycle {
    next: Cell<u64>,
    n: u64,
}

impl Cycle {
    fn new(n: u64) -> Cycle {
        Cycle {
            next: Cell::new(0),
            n,
        }
    }

    fn key(&self) -> u64 {
        let k = self.next.get();
        self.next.set(if k + 1 == self.n { 0 } else { k + 1 });
        k
    }
}

/// Checks that `PRE_RUN` untimed calls of `attempt` all succeed, then times it, counting the
/// successes of the timed calls too.
fn bench_try<A>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, attempt: A)
where
    A: Fn() -> bool,
{
    let granted = (0..PRE_RUN).filter(|_| attempt()).count() as u64;
    assert_eq!(granted, PRE_RUN, "{name}: granted {granted} of {PRE_RUN}");
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut granted = 0u64;
            let start = Instant::now();
            for _ in 0..iters {
                granted += u64::from(black_box(attempt()));
            }
            let took = start.elapsed();
            assert_eq!(granted, iters, "{name}: a timed call was refused");
            took
        });
    });
}

fn try_acquire(c: &mut Criterion) {
    // pacer reads tokio's clock inside a runtime, as it would in use; governor reads quanta's.
    let rt = runtime();
    let _guard = rt.enter();
    let mut group = c.benchmark_group("keyed_try_acquire");
    for n in [10u64, 100_000] {
        for refill in [Refill::Slow, Refill::Fast] {
            let (rate, burst) = refill.pacer();
            let pacer = KeyedRateLimiter::<u64>::new(rate, burst);
            for key in 0..n {
                assert!(
                    pacer.try_acquire(&key, 1).is_ok(),
                    "pacer: key {key} refused"
                );
            }
            let keys = Cycle::new(n);
            bench_try(
                &mut group,
                &format!("pacer/{}/{n}_keys", refill.name()),
                || pacer.try_acquire(&keys.key(), 1).is_ok(),
            );
            let stats = pacer.stats();
            assert_eq!((stats.rejected, stats.waiting), (0, 0));
            let tracked = pacer.tracked_keys();
            match refill {
                Refill::Slow => assert_eq!(tracked as u64, n, "pacer forgot a key"),
                Refill::Fast => println!(
                    "note: pacer/{}/{n}_keys tracks {tracked} of {n} keys after the run: a \
                     bucket is full again before its key comes round, so it is forgotten and \
                     created afresh",
                    refill.name()
                ),
            }

            let governor = governor::RateLimiter::keyed(refill.governor());
            for key in 0..n {
                assert!(
                    governor.check_key(&key).is_ok(),
                    "governor: key {key} refused"
                );
            }
            let keys = Cycle::new(n);
            bench_try(
                &mut group,
                &format!("governor/{}/{n}_keys", refill.name()),
                || governor.check_key(&keys.key()).is_ok(),
            );
            assert_eq!(governor.len() as u64, n);
        }
    }
    group.finish();
}

// ---------------------------------------------------------------------------------------------
// throttle_by_key per item, nothing binding

fn source() -> futures_util::stream::Iter<std::ops::Range<u64>> {
    futures_util::stream::iter(0..N)
}

/// Drains `make()` once, untimed, and asserts that it yields `0..N` in order; then benchmarks
/// draining it.
fn bench_stream<S, M>(group: &mut BenchmarkGroup<'_, WallTime>, rt: &Runtime, name: &str, make: M)
where
    M: Fn() -> S,
    S: Stream<Item = u64>,
{
    let items = rt.block_on(make().collect::<Vec<_>>());
    assert!(
        items.iter().copied().eq(0..N),
        "{name}: yielded {} items, not 0..{N} in order",
        items.len()
    );
    group.bench_function(name, |b| {
        b.to_async(rt).iter(|| async {
            let mut s = pin!(make());
            while let Some(x) = s.next().await {
                black_box(x);
            }
        });
    });
}

fn overhead(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("keyed_overhead");
    group.throughput(Throughput::Elements(N));

    bench_stream(&mut group, &rt, "baseline/stream_iter", source);
    for refill in [Refill::Slow, Refill::Fast] {
        let (rate, burst) = refill.pacer();
        bench_stream(
            &mut group,
            &rt,
            &format!("pacer/throttle_shaping/{}", refill.name()),
            || PaceExt::throttle(source(), rate, |_| 1, burst, Shaping),
        );
        let limiter = rt.block_on(async { KeyedRateLimiter::<u64>::new(rate, burst) });
        bench_stream(
            &mut group,
            &rt,
            &format!("pacer/throttle_by_key_{KEYS}_keys/{}", refill.name()),
            || source().throttle_by_key(&limiter, |x| x % KEYS, |_| 1, 64),
        );
        let stats = limiter.stats();
        assert_eq!(
            (stats.rejected, stats.waiting, stats.total_wait),
            (0, 0, Duration::ZERO),
            "throttle_by_key/{}: an item waited",
            refill.name()
        );
    }
    group.finish();
}

criterion_group!(benches, try_acquire, overhead);
criterion_main!(benches);
