//! The keyed limiter, `paced::KeyedRateLimiter`, side by side with governor's keyed limiter
//! (`governor::RateLimiter::keyed`, a `DashMap` of GCRA cells, both hashing with std's
//! `RandomState`) in the same run, and `throttle_by_key` beside `throttle` and a bare stream.
//!
//! - `keyed_try_acquire/{10,100000}_keys`: one non-blocking acquisition of cost 1 on one
//!   thread, cycling through the keys `0..n` (`u64`) so that every call finds its key already
//!   there (every key is touched before timing). Two quotas, the same for both limiters:
//!   - `slow_refill`: one token per second with a burst of `u32::MAX` (governor's largest; with
//!     it, governor's GCRA cannot represent a period much above 4 s), more than any key takes
//!     in a run (a few times 10^7 calls spread over the keys). It never binds, and no bucket is
//!     full again between two visits, so paced keeps every key's state, as governor does: the
//!     cost of a call on an existing key.
//!   - `fast_refill`: `u32::MAX` tokens per second with the same burst. It never binds either,
//!     but a bucket is full again a nanosecond after a call, long before its key comes round
//!     again, so paced forgets the key and creates it afresh on the next call; governor keeps
//!     it. The cost of forgetting, measured.
//!
//!   Every timed call is counted and the run fails if one was refused; an untimed pre-run of
//!   `PRE_RUN` calls checks the same first, and the keys paced tracks are checked after.
//! - `keyed_overhead`: `N` items of `stream::iter` drained per iteration on a current-thread
//!   runtime, as in the `overhead` bench: bare, through `throttle` (Shaping) and through
//!   `throttle_by_key` with `KEYS` distinct keys (item % `KEYS`), both with the two quotas
//!   above. Before timing, each stream is drained once and checked to yield all `N` items in
//!   order, and the keyed limiter to have granted every one without any wait.
//!
//! - `keyed_try_acquire/.../fast_hash`: the same with foldhash (`foldhash::fast::RandomState`)
//!   as both limiters' hasher, instead of std's SipHash.
//! - `clock`: one `tokio::time::Instant::now()` (inside a runtime, as paced reads it) and one
//!   `quanta::Clock::now()` (governor's clock): the floor under each side, to subtract.
//! - `keyed_contended`: `TASKS` tasks on a 2-worker multi-thread runtime, each awaiting
//!   `PER_TASK` acquisitions of cost 1 over `CONTENDED_KEYS` keys (`.../1000_keys`: task `t`
//!   asks key `(t * PER_TASK + i) % CONTENDED_KEYS`, so every task walks the same keys in
//!   step; `.../1000_keys_spread`: each task its own fixed pseudo-random keys), with the slow
//!   quota, which never binds: paced's `KeyedRateLimiter::acquire` beside governor's
//!   `until_key_ready`. Reported as acquisitions per second of wall time. An acquisition not granted at its first poll is counted and the
//!   count printed after each row: for paced, tokio's cooperative budget (one `Pending` per 128
//!   grants of a task, 0.75 % of them here), checked not to be a wait on a key (paced's stats
//!   record none); governor does not yield. It no longer fails the run.
//!
//!   After the group, the same runs outside criterion print CPU beside wall time (`cpu ...`
//!   lines: the worker threads' CPU per acquisition, the cores busy, and the cache line's
//!   latency between the two cores before and after: this VM's near or far state, which moves
//!   both limiters' wall figures by two to four times, so compare within one state). Run only
//!   those with a filter that matches no benchmark: `-- nomatch`.
//!
//! Memory is measured by the `keyed_memory` bench.
//!
//! Run: `cargo bench -p paced-benches --bench keyed -- --warm-up-time 1 --measurement-time 3`

use std::cell::Cell;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use futures_util::{Stream, StreamExt};
use governor::Quota;
use paced::{KeyedRateLimiter, PaceExt, Rate, Shaping};
use tokio::runtime::Runtime;

#[path = "common/cpu.rs"]
mod cpu;

/// Tasks, acquisitions per task and keys of the contended benchmark.
const TASKS: u64 = 64;
const PER_TASK: u64 = 2_000;
const CONTENDED_KEYS: u64 = 1_000;

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

/// The two quotas, as paced's rate and burst and as governor's quota.
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

    fn paced(self) -> (Rate, u64) {
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
    // paced reads tokio's clock inside a runtime, as it would in use; governor reads quanta's.
    let rt = runtime();
    let _guard = rt.enter();
    let mut group = c.benchmark_group("keyed_try_acquire");
    for n in [10u64, 100_000] {
        for refill in [Refill::Slow, Refill::Fast] {
            let (rate, burst) = refill.paced();
            let paced = KeyedRateLimiter::<u64>::new(rate, burst);
            for key in 0..n {
                assert!(
                    paced.try_acquire(&key, 1).is_ok(),
                    "paced: key {key} refused"
                );
            }
            let keys = Cycle::new(n);
            bench_try(
                &mut group,
                &format!("paced/{}/{n}_keys", refill.name()),
                || paced.try_acquire(&keys.key(), 1).is_ok(),
            );
            let stats = paced.stats();
            assert_eq!((stats.rejected, stats.waiting), (0, 0));
            let tracked = paced.tracked_keys();
            match refill {
                Refill::Slow => assert_eq!(tracked as u64, n, "paced forgot a key"),
                Refill::Fast => println!(
                    "note: paced/{}/{n}_keys tracks {tracked} of {n} keys after the run: a \
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
        // A fast hasher on both sides, the quota that keeps every key.
        let (rate, burst) = Refill::Slow.paced();
        let paced = KeyedRateLimiter::<u64, u64, _>::with_hasher(rate, burst, FastHash::default());
        for key in 0..n {
            assert!(paced.try_acquire(&key, 1).is_ok());
        }
        let keys = Cycle::new(n);
        bench_try(
            &mut group,
            &format!("paced/slow_refill/{n}_keys/fast_hash"),
            || paced.try_acquire(&keys.key(), 1).is_ok(),
        );
        assert_eq!(paced.tracked_keys() as u64, n, "paced forgot a key");
        let governor = governor::RateLimiter::dashmap_with_hasher(
            Refill::Slow.governor(),
            FastHash::default(),
        );
        for key in 0..n {
            assert!(governor.check_key(&key).is_ok());
        }
        let keys = Cycle::new(n);
        bench_try(
            &mut group,
            &format!("governor/slow_refill/{n}_keys/fast_hash"),
            || governor.check_key(&keys.key()).is_ok(),
        );
    }
    group.finish();
}

type FastHash = foldhash::fast::RandomState;

/// The floor under each side: one read of each clock.
fn clock(c: &mut Criterion) {
    let rt = runtime();
    let _guard = rt.enter();
    let mut group = c.benchmark_group("clock");
    group.bench_function("tokio_instant_now", |b| {
        b.iter(|| black_box(tokio::time::Instant::now()));
    });
    let quanta = quanta::Clock::new();
    group.bench_function("quanta_now", |b| b.iter(|| black_box(quanta.now())));
    group.finish();
}

// ---------------------------------------------------------------------------------------------
// Contended acquire over many keys, nothing binding

fn two_workers() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("multi-thread runtime")
}

/// Which key a contended task asks for its `i`-th acquisition.
#[derive(Clone, Copy)]
enum Keys {
    /// Task `t` asks `(t * PER_TASK + i) % CONTENDED_KEYS`: since `PER_TASK` is a multiple of
    /// `CONTENDED_KEYS`, every task walks the same keys in the same order, so the tasks of
    /// both workers start on one key and stay near each other: the worst case for any
    /// table (kept as the first row, for comparison with earlier runs).
    Lockstep,
    /// Each task asks keys from its own fixed pseudo-random sequence (a 64-bit mix of `t` and
    /// `i`), the same for both limiters: tasks serving unrelated tenants.
    Spread,
}

impl Keys {
    fn key(self, t: u64, i: u64) -> u64 {
        match self {
            Keys::Lockstep => (t * PER_TASK + i) % CONTENDED_KEYS,
            Keys::Spread => {
                let mut x = (t << 32 | i).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                x ^= x >> 29;
                x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
                (x >> 32) % CONTENDED_KEYS
            }
        }
    }

    fn name(self) -> &'static str {
        match self {
            Keys::Lockstep => "",
            Keys::Spread => "_spread",
        }
    }
}

/// Runs `TASKS` tasks of `PER_TASK` acquisitions each through `acquire(key)`, released
/// together; returns the wall time from their release to the last one's end, and adds to
/// `waited` the acquisitions that were not granted at their first poll. The quota never binds,
/// but paced's `acquire` spends tokio's cooperative budget as a `Semaphore` does: a task that
/// took 128 grants in a row is answered `Pending` once and polled again (governor's
/// `until_key_ready` does not yield). Those are counted and printed beside the figures, not a
/// failure; the limiter's own stats are checked to show no wait.
fn run_contended<L, F, A>(
    rt: &Runtime,
    limiter: &Arc<L>,
    keys: Keys,
    waited: &AtomicU64,
    acquire: A,
) -> Duration
where
    L: Send + Sync + 'static,
    A: Fn(Arc<L>, u64) -> F + Send + Sync + Copy + 'static,
    F: std::future::Future<Output = ()> + Send,
{
    rt.block_on(async {
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS as usize + 1));
        let pending = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let (limiter, barrier, pending) =
                    (limiter.clone(), barrier.clone(), pending.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    for i in 0..PER_TASK {
                        let key = keys.key(t, i);
                        let mut fut = pin!(acquire(limiter.clone(), key));
                        let ready = std::future::poll_fn(|cx| {
                            Poll::Ready(fut.as_mut().poll(cx).is_ready())
                        })
                        .await;
                        if !ready {
                            pending.fetch_add(1, Ordering::Relaxed);
                            fut.await;
                        }
                    }
                })
            })
            .collect();
        barrier.wait().await;
        let start = Instant::now();
        for task in tasks {
            task.await.expect("a task panicked");
        }
        let took = start.elapsed();
        waited.fetch_add(pending.load(Ordering::Relaxed), Ordering::Relaxed);
        took
    })
}

/// Prints how many of the contended benchmark's acquisitions were not granted at their first
/// poll (see [`run_contended`]).
fn report_waits(name: &str, waited: &AtomicU64, runs: &AtomicU64) {
    let (waited, runs) = (waited.load(Ordering::Relaxed), runs.load(Ordering::Relaxed));
    if runs == 0 {
        // Filtered out.
        return;
    }
    println!(
        "note: keyed_contended/{name}: {waited} of {} acquisitions were not granted at their \
         first poll",
        runs * TASKS * PER_TASK
    );
}

fn contended(c: &mut Criterion) {
    let rt = two_workers();
    let mut group = c.benchmark_group("keyed_contended");
    group.throughput(Throughput::Elements(TASKS * PER_TASK));
    group.sample_size(20);
    for keys in [Keys::Lockstep, Keys::Spread] {
        let (rate, burst) = Refill::Slow.paced();
        let paced = Arc::new(rt.block_on(async { KeyedRateLimiter::<u64>::new(rate, burst) }));
        bench_contended(
            &mut group,
            &rt,
            "paced/acquire",
            keys,
            &paced,
            |l, key| async move {
                l.acquire(&key, 1).await;
            },
        );
        // The quota itself never binds: nothing is refused and nothing ever waited on a key (a
        // first poll answered `Pending` is tokio's cooperative budget, spent every 128 grants).
        let stats = paced.stats();
        assert_eq!(
            (stats.rejected, stats.waiting, stats.total_wait),
            (0, 0, Duration::ZERO),
            "keyed_contended: an acquisition waited on its key"
        );
        let governor = Arc::new(governor::RateLimiter::keyed(Refill::Slow.governor()));
        let name = "governor/until_key_ready";
        bench_contended(
            &mut group,
            &rt,
            name,
            keys,
            &governor,
            |l, key| async move {
                l.until_key_ready(&key).await;
            },
        );
    }
    group.finish();
}

/// One row of `keyed_contended`: `acquire` through [`run_contended`], timed by criterion, then
/// the count of first polls answered `Pending`.
fn bench_contended<L, F, A>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    name: &str,
    keys: Keys,
    limiter: &Arc<L>,
    acquire: A,
) where
    L: Send + Sync + 'static,
    A: Fn(Arc<L>, u64) -> F + Send + Sync + Copy + 'static,
    F: std::future::Future<Output = ()> + Send,
{
    let (waited, runs) = (AtomicU64::new(0), AtomicU64::new(0));
    let name = format!("{name}/{CONTENDED_KEYS}_keys{}", keys.name());
    group.bench_function(&name, |b| {
        b.iter_custom(|iters| {
            runs.fetch_add(iters, Ordering::Relaxed);
            (0..iters)
                .map(|_| run_contended(rt, limiter, keys, &waited, acquire))
                .sum()
        });
    });
    report_waits(&name, &waited, &runs);
}

/// `keyed_contended`'s figures again outside criterion, with the CPU they cost: each key pattern
/// and limiter runs `run_contended` for at least a second of wall time, and a line is printed
/// with acquisitions per second of wall time, the worker threads' CPU time per acquisition,
/// how many cores were busy, and the cache line's latency between the two cores before and
/// after (this VM's near or far state, which moves both limiters' wall figures by two to four
/// times; compare within one state).
fn contended_cpu(_: &mut Criterion) {
    let rt = two_workers();
    println!(
        "CPU beside wall time of keyed_contended, {TASKS} tasks on 2 worker threads, \
         {CONTENDED_KEYS} keys:"
    );
    let (rate, burst) = Refill::Slow.paced();
    for keys in [Keys::Lockstep, Keys::Spread] {
        for _ in 0..2 {
            let paced = Arc::new(rt.block_on(async { KeyedRateLimiter::<u64>::new(rate, burst) }));
            cpu_note(&rt, "paced/acquire", keys, &paced, |l, key| async move {
                l.acquire(&key, 1).await;
            });
            let governor = Arc::new(governor::RateLimiter::keyed(Refill::Slow.governor()));
            cpu_note(
                &rt,
                "governor/until_key_ready",
                keys,
                &governor,
                |l, key| async move {
                    l.until_key_ready(&key).await;
                },
            );
        }
    }
}

/// Runs `acquire` through [`run_contended`] for at least a second and prints the figures of
/// [`contended_cpu`].
fn cpu_note<L, F, A>(rt: &Runtime, name: &str, keys: Keys, limiter: &Arc<L>, acquire: A)
where
    L: Send + Sync + 'static,
    A: Fn(Arc<L>, u64) -> F + Send + Sync + Copy + 'static,
    F: std::future::Future<Output = ()> + Send,
{
    let waited = AtomicU64::new(0);
    // `wall`: the timed part of each run (from the tasks' release to the last one's end), as
    // criterion times it; `whole`: the whole call, spawning included, over which the CPU time
    // is read (for the cores busy).
    let (mut runs, mut wall, mut whole) = (0u64, Duration::ZERO, Duration::ZERO);
    let mut cpu = Some(Duration::ZERO);
    let line_before = cpu::line_latency();
    while wall < Duration::from_secs(1) {
        let (before, started) = (cpu::workers_cpu(), Instant::now());
        wall += run_contended(rt, limiter, keys, &waited, acquire);
        whole += started.elapsed();
        let spent = before
            .zip(cpu::workers_cpu())
            .map(|(b, a)| a.saturating_sub(b));
        cpu = cpu.zip(spent).map(|(total, run)| total + run);
        runs += 1;
    }
    let line = cpu::describe_line(line_before, cpu::line_latency());
    let acquisitions = runs * TASKS * PER_TASK;
    let name = format!(
        "keyed_contended/{name}/{CONTENDED_KEYS}_keys{}",
        keys.name()
    );
    let per_s = acquisitions as f64 / wall.as_secs_f64();
    match cpu {
        Some(cpu) => println!(
            "cpu {name:<52} {per_s:>11.0} acq/s, {:>6.1} ns CPU per acquisition, {:.2} cores \
             busy ({runs} runs: timed {wall:.2?} of {whole:.2?}, CPU {cpu:.2?}; {line})",
            cpu.as_nanos() as f64 / acquisitions as f64,
            cpu.as_secs_f64() / whole.as_secs_f64(),
        ),
        None => println!("cpu {name:<52} {per_s:>11.0} acq/s, CPU time not available ({line})"),
    }
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
        let (rate, burst) = refill.paced();
        bench_stream(
            &mut group,
            &rt,
            &format!("paced/throttle_shaping/{}", refill.name()),
            || PaceExt::throttle(source(), rate, |_| 1, burst, Shaping),
        );
        let limiter = rt.block_on(async { KeyedRateLimiter::<u64>::new(rate, burst) });
        bench_stream(
            &mut group,
            &rt,
            &format!("paced/throttle_by_key_{KEYS}_keys/{}", refill.name()),
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

criterion_group!(
    benches,
    clock,
    try_acquire,
    contended,
    contended_cpu,
    overhead
);
criterion_main!(benches);
