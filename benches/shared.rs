//! The shared limiters, `paced::RateLimiter` and `paced::Stagger`, side by side with governor's
//! direct limiter and leaky-bucket in the same run.
//!
//! - `try_acquire`: the cost of one non-blocking acquisition on one thread, with a limit that
//!   never binds. Every timed call is counted and the run fails if one was refused; an untimed
//!   pre-run of `PRE_RUN` calls checks the same first.
//! - `contended_nonbinding`: `TASKS` tasks on a 2-worker multi-thread runtime, released together
//!   by a barrier, each awaiting `PER_TASK_FREE` acquisitions of cost 1 on one shared limiter
//!   whose limit never binds: the synchronisation, not the pacing. Before timing, one untimed
//!   run polls every acquisition through a counter and fails if any of them was ever pending.
//! - `contended_binding_1e6ps_burst1000`: the same with `BIND_RATE` per second and a burst of
//!   `BIND_BURST`, `PER_TASK_BIND` acquisitions per task (a run lasts about 30 ms), so waiters
//!   queue and sleep. Before timing, one untimed run stamps every grant and checks that no more
//!   were granted than `burst + rate * elapsed`, over the whole run and over every window.
//! - `refused_with_queue`: one `try_acquire` refused because `N` waiters are queued ahead
//!   (each an `acquire` future polled once), on one thread: the price of telling a caller when
//!   it could go, behind a queue. The rate is one per hour, so the queue's head never falls due
//!   during the run.
//!
//! The contended groups report acquisitions per second (wall time, from the barrier's release
//! to the last task's end). Afterwards, outside criterion, each contended case runs again for at
//! least a second of such wall time and prints the CPU time spent meanwhile (every thread but the
//! main one, from `/proc/self/task/*/schedstat`), since the two cores may not both be free.
//!
//! Two diagnostics, read from the environment (not for published rows):
//! `PACED_BENCH_CPU_ONLY=1` makes the CPU pass time only the never-binding paced and governor
//! cases, alternately, three times each (about ten seconds a process, to count how often a
//! process lands in a slow mode), and `PACED_BENCH_CPU_ONLY=semaphore` paced and tokio's
//! `Semaphore` (a permit taken and dropped; it spends the cooperative budget too); `PACED_BENCH_UNCONSTRAINED=1` wraps every contended
//! acquisition in `tokio::task::unconstrained`, so that no task yields to tokio's cooperative
//! budget (paced's grants spend it, governor's do not).
//!
//! Each CPU note also prints the one-way latency of a cache line between two threads, measured
//! just before and after the note (`line`, the fastest of 40 batches of 100 round trips): the
//! host places this VM's two vCPUs near each other (about 40 ns) or far apart (about 170 ns)
//! and moves them now and then, and a contended acquisition that reads tokio's clock costs
//! about 2.4 times as much in the far state (issue 23). A note whose line is at 90 ns or more
//! is marked `far`: compare paced and governor within one state.
//!
//! `PACED_BENCH_INTERLEAVE=SECONDS` (a diagnostic) skips the rest and runs, round after round
//! for that long, one contended never-binding run of each of these kinds, then prints each
//! kind's CPU per acquisition split by the line latency measured in the same round (only the
//! rounds where governor kept both workers busy): `paced`, `paced_unconstrained` (inside
//! `tokio::task::unconstrained`), `paced_try` (a loop on `try_acquire`: no future, no budget),
//! `governor`, `governor_coop` (inside `tokio::task::coop::cooperative`), `governor_tokio_clock`
//! (a read of tokio's clock before each `until_ready`), and bare compare-and-swap loops on one
//! padded word after a read of tokio's clock (`cas_tokio_clock`), quanta's (`cas_quanta`),
//! quanta's behind an `lfence` (`cas_lfence_quanta`), `rdtscp` (`cas_rdtscp`) or nothing
//! (`cas`). `PACED_BENCH_KINDS=a,b,...` picks some.
//!
//! A run that does not finish within `HANG` fails the benchmark, except for leaky-bucket, which
//! now and then leaves its waiters asleep for good: that run is reported and retried.
//!
//! Run: `cargo bench -p paced-benches --bench shared -- --warm-up-time 1 --measurement-time 2`

use std::future::{poll_fn, Future};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, Criterion, SamplingMode, Throughput,
};
use governor::{DefaultDirectRateLimiter, Quota};
use paced::{Rate, Stagger};
use tokio::runtime::Runtime;
use tokio::sync::Barrier;
use tokio::task::JoinHandle;

#[path = "common/cpu.rs"]
mod cpu;
use cpu::{describe_line, line_latency, workers_cpu, Padded, FAR_LINE};

/// Untimed calls before an uncontended benchmark.
const PRE_RUN: u64 = 1_000_000;
/// Tasks sharing one limiter.
const TASKS: usize = 64;
/// Acquisitions per task with a limit that never binds.
const PER_TASK_FREE: u64 = 1_000;
/// Acquisitions per task with the binding limit: `TASKS * PER_TASK_BIND - BIND_BURST` tokens at
/// `BIND_RATE` take 31 ms.
const PER_TASK_BIND: u64 = 500;
const BIND_RATE: u64 = 1_000_000;
const BIND_BURST: u64 = 1_000;

fn current_thread() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("current-thread runtime")
}

fn two_workers() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("multi-thread runtime")
}

// ---------------------------------------------------------------------------------------------
// Uncontended try_acquire

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

fn uncontended(c: &mut Criterion) {
    // Every limiter reads tokio's clock (or quanta's) inside a runtime, as it would in use.
    let rt = current_thread();
    let _guard = rt.enter();
    let mut group = c.benchmark_group("try_acquire");

    let limiter = paced::RateLimiter::new(Rate::per_second(1_000_000_000), u64::MAX / 2);
    bench_try(&mut group, "paced/rate_limiter_1e9ps_huge_burst", || {
        limiter.try_acquire(1).is_ok()
    });
    assert_eq!(limiter.stats().rejected, 0);
    // `acquire(1)` on the same limiter: the whole future, awaited (never waits).
    group.bench_function("paced/rate_limiter_acquire_1e9ps_huge_burst", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(limiter.acquire(black_box(1))).await;
                }
                start.elapsed()
            })
        });
    });
    assert_eq!(limiter.stats().rejected, 0);

    let stagger = Stagger::new(usize::MAX, Duration::from_nanos(1));
    bench_try(&mut group, "paced/stagger_max_1ns", || {
        stagger.try_acquire().is_ok()
    });
    let stagger = Stagger::new(usize::MAX, Duration::ZERO);
    bench_try(&mut group, "paced/stagger_max_0", || {
        stagger.try_acquire().is_ok()
    });

    let governor = governor_free();
    bench_try(&mut group, "governor/check", || governor.check().is_ok());

    let bucket = leaky_free(true);
    bench_try(&mut group, "leaky_bucket/try_acquire_fair", || {
        bucket.try_acquire(1)
    });
    let bucket = leaky_free(false);
    bench_try(&mut group, "leaky_bucket/try_acquire_unfair", || {
        bucket.try_acquire(1)
    });
    group.finish();
}

// ---------------------------------------------------------------------------------------------
// throttle_with: a stream drawing on a shared limiter whose limit never binds, per item

/// Items per `throttle_with` iteration.
const STREAM_ITEMS: u64 = 10_000;

/// Drains `make()` once, untimed, and asserts it yields all `STREAM_ITEMS` items (counted by
/// `count`); then times draining it: `time / STREAM_ITEMS` is the cost per item.
fn bench_stream<S, M, C>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    name: &str,
    make: M,
    count: C,
) where
    M: Fn() -> S,
    S: futures_util::Stream,
    C: Fn(&S::Item) -> u64,
{
    use futures_util::StreamExt;
    let total = rt.block_on(async {
        let mut s = pin!(make());
        let mut total = 0;
        while let Some(x) = s.next().await {
            total += count(&x);
        }
        total
    });
    assert_eq!(
        total, STREAM_ITEMS,
        "{name}: yielded {total} of {STREAM_ITEMS} items"
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

fn throttle_with(c: &mut Criterion) {
    use paced::{Enforcing, PaceExt, Shaping};
    let rt = current_thread();
    let mut group = c.benchmark_group("throttle_with");
    group.throughput(Throughput::Elements(STREAM_ITEMS));
    let source = || futures_util::stream::iter(0..STREAM_ITEMS);
    let limiter = paced::RateLimiter::new(Rate::per_second(1_000_000_000), u64::MAX / 2);
    bench_stream(
        &mut group,
        &rt,
        "paced/rate_limiter_shaping_1e9ps_huge_burst",
        || source().throttle_with(&limiter, |_| 1, Shaping),
        |_| 1,
    );
    bench_stream(
        &mut group,
        &rt,
        "paced/rate_limiter_enforcing_1e9ps_huge_burst",
        || source().throttle_with(&limiter, |_| 1, Enforcing),
        |r| {
            assert!(r.is_ok(), "Enforcing refused an item: the limit binds");
            1
        },
    );
    group.finish();
}

// ---------------------------------------------------------------------------------------------
// Several limits at once: a grant of a RateLimiter of two limits, of one, and two
// RateLimiters asked one after the other (what composing them by hand costs)

fn multi(c: &mut Criterion) {
    use paced::{Limit, RateLimiter};

    let rt = current_thread();
    let _guard = rt.enter();
    let mut group = c.benchmark_group("multi");
    let free = || Limit::bucket(Rate::per_second(1_000_000_000), u64::MAX / 2);
    // One read of tokio's clock, the floor under every row: compare work above it.
    bench_try(&mut group, "clock/tokio_instant_now", || {
        black_box(tokio::time::Instant::now());
        true
    });

    let one: RateLimiter<[u64; 1]> = RateLimiter::builder(["tokens"])
        .limit("tokens", free())
        .build()
        .unwrap();
    bench_try(&mut group, "paced/multi_one_limit", || {
        one.try_acquire([1]).is_ok()
    });
    let two: RateLimiter<[u64; 2]> = RateLimiter::builder(["requests", "tokens"])
        .limit("requests", free())
        .limit("tokens", free())
        .build()
        .unwrap();
    bench_try(&mut group, "paced/multi_two_limits", || {
        two.try_acquire([1, 1]).is_ok()
    });
    let requests = paced_free();
    let tokens = paced_free();
    bench_try(&mut group, "paced/two_rate_limiters", || {
        requests.try_acquire(1).is_ok() && tokens.try_acquire(1).is_ok()
    });
    let single = paced_free();
    bench_try(&mut group, "paced/one_rate_limiter", || {
        single.try_acquire(1).is_ok()
    });
    group.finish();
}

// ---------------------------------------------------------------------------------------------
// A refused try_acquire behind a queue

/// Queues `n` requests made by `acquire` (each polled once, then kept pending).
fn queue_up<F: Future>(n: usize, mut acquire: impl FnMut() -> F) -> Vec<std::pin::Pin<Box<F>>> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    (0..n)
        .map(|_| {
            let mut waiter = Box::pin(acquire());
            assert!(waiter.as_mut().poll(&mut cx).is_pending(), "not queued");
            waiter
        })
        .collect()
}

/// Times `attempt`, which must be refused every time.
fn bench_refused<A>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, attempt: A)
where
    A: Fn() -> bool,
{
    group.bench_function(name, |b| {
        b.iter(|| assert!(!black_box(attempt()), "{name}: granted"));
    });
}

fn refused_with_queue(c: &mut Criterion) {
    let rt = current_thread();
    let _guard = rt.enter();
    let mut group = c.benchmark_group("refused_with_queue");
    let hour = Duration::from_secs(3600);

    for n in [1, 100, 10_000] {
        let limiter = paced::RateLimiter::new(Rate::new(1, hour), 1);
        assert!(limiter.try_acquire(1).is_ok());
        let _waiters = queue_up(n, || limiter.acquire(1));
        assert_eq!(limiter.stats().waiting, n);
        bench_refused(&mut group, &format!("paced/rate_limiter/{n}"), || {
            limiter.try_acquire(1).is_ok()
        });
    }

    let n = 1_000;
    let limiter = paced::RateLimiter::warming_up(Rate::new(1, hour), hour, 3.0);
    assert!(limiter.try_acquire(1).is_ok());
    let _waiters = queue_up(n, || limiter.acquire(1));
    bench_refused(&mut group, &format!("paced/warming_up/{n}"), || {
        limiter.try_acquire(1).is_ok()
    });

    let stagger = Stagger::new(1, hour);
    assert!(stagger.try_acquire().is_ok());
    let _waiters = queue_up(n, || stagger.acquire());
    bench_refused(&mut group, &format!("paced/stagger/{n}"), || {
        stagger.try_acquire().is_ok()
    });

    let keyed = paced::KeyedRateLimiter::<u64>::new(Rate::new(1, hour), 1);
    assert!(keyed.try_acquire(&7, 1).is_ok());
    let _waiters = queue_up(n, || keyed.acquire(&7, 1));
    bench_refused(&mut group, &format!("paced/keyed/{n}"), || {
        keyed.try_acquire(&7, 1).is_ok()
    });
    group.finish();
}

// ---------------------------------------------------------------------------------------------
// The limiters, never binding and binding

/// governor: a direct limiter with the largest burst, refilled at u32::MAX per second.
fn governor_free() -> Governor {
    let quota = Quota::per_second(NonZeroU32::MAX).allow_burst(NonZeroU32::MAX);
    Arc::new(governor::RateLimiter::direct(quota))
}

/// leaky-bucket: the largest balance it supports (`isize::MAX`), full, refilled by as much
/// every 1 ms. Fair (its default) or not: a fair limiter skips the lock-free fast path.
fn leaky_free(fair: bool) -> Leaky {
    Arc::new(
        leaky_bucket::RateLimiter::builder()
            .max(usize::MAX / 2)
            .initial(usize::MAX / 2)
            .refill(usize::MAX / 2)
            .interval(Duration::from_millis(1))
            .fair(fair)
            .build(),
    )
}

fn paced_free() -> paced::RateLimiter {
    paced::RateLimiter::new(Rate::per_second(1_000_000_000), u64::MAX / 2)
}

fn paced_bind() -> paced::RateLimiter {
    paced::RateLimiter::new(Rate::per_second(BIND_RATE), BIND_BURST)
}

fn governor_bind() -> Governor {
    let rate = NonZeroU32::new(BIND_RATE as u32).expect("non-zero rate");
    let burst = NonZeroU32::new(BIND_BURST as u32).expect("non-zero burst");
    Arc::new(governor::RateLimiter::direct(
        Quota::per_second(rate).allow_burst(burst),
    ))
}

/// leaky-bucket refills in steps of its interval, so `BIND_RATE` is `BIND_RATE / 1000` tokens
/// every 1 ms (its finest interval).
fn leaky_bind(fair: bool) -> Leaky {
    Arc::new(
        leaky_bucket::RateLimiter::builder()
            .max(BIND_BURST as usize)
            .initial(BIND_BURST as usize)
            .refill((BIND_RATE / 1000) as usize)
            .interval(Duration::from_millis(1))
            .fair(fair)
            .build(),
    )
}

/// A limiter shared by handle; `acquire_one` waits for one unit.
trait Limiter: Clone + Send + Sync + 'static {
    fn acquire_one(&self) -> impl Future<Output = ()> + Send + '_;
    /// What to print about a limiter whose run hung.
    fn describe(&self) -> String;
    /// Checks the limiter's own counters, if it keeps any, after a checked run of `total`
    /// acquisitions.
    fn check_counters(&self, _total: u64, _binding: bool) {}
}

impl Limiter for paced::RateLimiter {
    fn acquire_one(&self) -> impl Future<Output = ()> + Send + '_ {
        self.acquire(1)
    }
    fn describe(&self) -> String {
        format!("{self:?}")
    }
    fn check_counters(&self, total: u64, binding: bool) {
        let stats = self.stats();
        assert_eq!(
            (stats.granted, stats.rejected, stats.waiting),
            (total, 0, 0),
            "paced: counters after the checked run"
        );
        assert_eq!(
            stats.total_wait > Duration::ZERO,
            binding,
            "paced: waited {:?} in the checked run",
            stats.total_wait
        );
    }
}

impl Limiter for Governor {
    fn acquire_one(&self) -> impl Future<Output = ()> + Send + '_ {
        self.until_ready()
    }
    fn describe(&self) -> String {
        format!("{self:?}")
    }
}

/// tokio's `Semaphore` (a permit taken and given back), a diagnostic peer of the CPU pass: it
/// spends tokio's cooperative budget as paced's grants do.
impl Limiter for Arc<tokio::sync::Semaphore> {
    fn acquire_one(&self) -> impl Future<Output = ()> + Send + '_ {
        // Dropped at once: the permit goes back.
        let permit = self.acquire();
        async move {
            drop(permit.await);
        }
    }
    fn describe(&self) -> String {
        format!("{} permits", self.available_permits())
    }
}

impl Limiter for Leaky {
    fn acquire_one(&self) -> impl Future<Output = ()> + Send + '_ {
        self.acquire(1)
    }
    fn describe(&self) -> String {
        format!("balance {}", self.balance())
    }
}

/// The binding limit, for the checks: at most `burst + rate * w` grants in any window of
/// length `w`, give or take `slack`.
#[derive(Clone, Copy)]
struct Bound {
    rate: u64,
    burst: u64,
    slack: u64,
}

const BINDING: Bound = Bound {
    rate: BIND_RATE,
    burst: BIND_BURST,
    slack: 0,
};

/// leaky-bucket adds `BIND_RATE / 1000` tokens at each 1 ms step, so it may grant up to one
/// step more than the continuous bound; paced and governor are GCRAs and get no slack.
const LEAKY_BINDING: Bound = Bound {
    slack: BIND_RATE / 1000,
    ..BINDING
};

/// One contended case: `TASKS` tasks, each awaiting `per_task` acquisitions on a limiter from
/// `make`, which never binds (`bound: None`) or binds as `bound` says.
struct Case<L> {
    name: &'static str,
    make: fn() -> L,
    per_task: u64,
    bound: Option<Bound>,
    /// leaky-bucket 1.1.2 now and then never wakes its waiters again (every thread parked, no
    /// timer armed): such a run is reported and retried with a fresh limiter. For the others a
    /// hang fails the run.
    may_hang: bool,
}

impl<L> Case<L> {
    fn total(&self) -> u64 {
        TASKS as u64 * self.per_task
    }
}

/// How long a run may take before it counts as hung (a run normally takes under 100 ms).
const HANG: Duration = Duration::from_secs(5);

/// What one contended run saw.
struct Run {
    /// From the barrier's release to the end of the last task.
    wall: Duration,
    /// CPU time of every thread but the main one over `wall`, if asked for and available.
    cpu: Option<Duration>,
    /// Polls of the acquisition futures (probed runs only).
    polls: u64,
    /// When each grant was seen, sorted (probed runs only).
    stamps: Vec<Instant>,
}

/// `TASKS` tasks released together, each awaiting `per_task` acquisitions on `limiter`. A probed
/// run counts the polls of every acquisition and stamps every grant.
async fn run<L: Limiter>(limiter: &L, per_task: u64, probe: bool, cpu: bool) -> Run {
    let unconstrained = std::env::var_os("PACED_BENCH_UNCONSTRAINED").is_some();
    let barrier = Arc::new(Barrier::new(TASKS + 1));
    let ready = Arc::new(AtomicUsize::new(0));
    let mut tasks = AbortOnDrop(Vec::with_capacity(TASKS));
    tasks.0.extend((0..TASKS).map(|_| {
        let (limiter, barrier, ready) = (limiter.clone(), barrier.clone(), ready.clone());
        tokio::spawn(async move {
            let mut polls = 0u64;
            let mut stamps = Vec::new();
            if probe {
                stamps.reserve(per_task as usize);
            }
            ready.fetch_add(1, Ordering::Release);
            barrier.wait().await;
            for _ in 0..per_task {
                if probe {
                    let mut acquire = pin!(limiter.acquire_one());
                    poll_fn(|cx| {
                        polls += 1;
                        acquire.as_mut().poll(cx)
                    })
                    .await;
                    stamps.push(Instant::now());
                } else if unconstrained {
                    tokio::task::unconstrained(limiter.acquire_one()).await;
                } else {
                    limiter.acquire_one().await;
                }
            }
            (polls, stamps)
        })
    }));
    // Arrive last, so that the clock starts at the release.
    while ready.load(Ordering::Acquire) < TASKS {
        tokio::task::yield_now().await;
    }
    let cpu_before = if cpu { workers_cpu() } else { None };
    let start = Instant::now();
    barrier.wait().await;
    let mut polls = 0;
    let mut stamps = Vec::new();
    for task in &mut tasks.0 {
        let (p, s) = task.await.expect("task panicked");
        polls += p;
        stamps.extend(s);
    }
    let wall = start.elapsed();
    let cpu = match (cpu_before, cpu.then(workers_cpu).flatten()) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    stamps.sort_unstable();
    Run {
        wall,
        cpu,
        polls,
        stamps,
    }
}

/// The tasks of a run, aborted if the run is given up (a hung run's tasks would otherwise stay
/// in the runtime for good).
struct AbortOnDrop<T>(Vec<JoinHandle<T>>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// A run on a fresh limiter that finishes within `HANG`, retrying (and saying so) if the case
/// may hang; returns the limiter too.
fn guarded<L: Limiter>(rt: &Runtime, case: &Case<L>, probe: bool, cpu: bool) -> (L, Run) {
    loop {
        let limiter = rt.block_on(async { (case.make)() });
        let outcome = rt.block_on(async {
            tokio::time::timeout(HANG, run(&limiter, case.per_task, probe, cpu)).await
        });
        match outcome {
            Ok(r) => return (limiter, r),
            Err(_) => {
                let what = format!(
                    "{}: a run of {} acquisitions hung for {HANG:?}, every waiter asleep; {}",
                    case.name,
                    case.total(),
                    limiter.describe()
                );
                assert!(case.may_hang, "{what}");
                println!("note {what}; retrying with a fresh limiter");
            }
        }
    }
}

/// The most grants seen in any window `[t_i, t_j]` beyond `burst + rate * (t_j - t_i)`, from
/// the sorted stamps. A stamp is read after its grant, so a grant can look later than it was:
/// at most one per task at any moment, hence up to `TASKS` grants of apparent excess.
fn window_excess(stamps: &[Instant], bound: Bound) -> f64 {
    let Some(&t0) = stamps.first() else {
        return 0.0;
    };
    let per_ns = bound.rate as f64 / 1e9;
    let at = |t: Instant| per_ns * t.duration_since(t0).as_nanos() as f64;
    // Grants in [t_i, t_j] = j - i + 1; the excess is max over i <= j of
    // (j + 1 - at(t_j)) - (i - at(t_i)) - burst.
    let mut min_start = f64::INFINITY;
    let mut excess = f64::NEG_INFINITY;
    for (j, &t) in stamps.iter().enumerate() {
        min_start = min_start.min(j as f64 - at(t));
        excess = excess.max((j + 1) as f64 - at(t) - min_start);
    }
    excess - bound.burst as f64
}

/// One probed, untimed run, checked: every acquisition granted, and, for a binding case, no
/// more than `burst + rate * elapsed (+ slack)` granted over the run and in any window; for a
/// non-binding case, no acquisition ever pending; paced's counters agree. Prints what it saw.
fn check<L: Limiter>(rt: &Runtime, case: &Case<L>) {
    let (limiter, r) = guarded(rt, case, true, false);
    let (name, total) = (case.name, case.total());
    assert_eq!(r.stamps.len() as u64, total, "{name}: grants missing");
    limiter.check_counters(total, case.bound.is_some());
    let polls_per = r.polls as f64 / total as f64;
    match case.bound {
        None => {
            // A grant that needs no wait spends tokio's cooperative budget (128 units a poll),
            // so a task yields once per 128 grants in a row: those extra polls are not waits.
            let yields = TASKS as u64 * case.per_task.div_ceil(128);
            assert!(
                r.polls <= total + yields,
                "{name}: {} polls for {total} acquisitions (and at most {yields} yields to the \
                 budget), so some waited: the limit binds",
                r.polls
            );
            println!(
                "check {name}: {total} acquisitions in {:?}, none pending",
                r.wall
            );
        }
        Some(bound) => {
            let allowed = bound.burst as f64 + bound.rate as f64 * r.wall.as_secs_f64();
            assert!(
                total as f64 <= allowed + bound.slack as f64,
                "{name}: {total} granted in {:?}, more than burst + rate * elapsed = {allowed:.0}",
                r.wall
            );
            let excess = window_excess(&r.stamps, bound);
            assert!(
                excess <= (TASKS as u64 + bound.slack) as f64,
                "{name}: {excess:.0} grants beyond burst + rate * window in some window"
            );
            let min_wall = (total - bound.burst) as f64 / bound.rate as f64;
            println!(
                "check {name}: {total} granted in {:?} (the bound needs >= {:.1} ms; {:.0}/s), \
                 {polls_per:.2} polls per acquisition, worst window excess {excess:.0} \
                 (stamping slack {TASKS}, allowed slack {})",
                r.wall,
                min_wall * 1e3,
                total as f64 / r.wall.as_secs_f64(),
                bound.slack,
            );
        }
    }
}

/// Checks a contended case once, then times it: `iter_custom` with a fresh limiter per
/// iteration, timing only the run from the barrier's release.
fn bench_contended<L: Limiter>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    case: &Case<L>,
) {
    check(rt, case);
    group.bench_function(case.name, |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| guarded(rt, case, false, false).1.wall)
                .sum()
        });
    });
}

type Governor = Arc<DefaultDirectRateLimiter>;
type Leaky = Arc<leaky_bucket::RateLimiter>;

/// Every limiter in one setting.
struct Cases {
    paced: Case<paced::RateLimiter>,
    governor: Case<Governor>,
    leaky: [Case<Leaky>; 2],
}

impl Cases {
    fn nonbinding() -> Cases {
        let per_task = PER_TASK_FREE;
        Cases {
            paced: Case {
                name: "paced/acquire",
                make: paced_free,
                per_task,
                bound: None,
                may_hang: false,
            },
            governor: Case {
                name: "governor/until_ready",
                make: governor_free,
                per_task,
                bound: None,
                may_hang: false,
            },
            leaky: [
                Case {
                    name: "leaky_bucket/acquire_fair",
                    make: || leaky_free(true),
                    per_task,
                    bound: None,
                    may_hang: true,
                },
                Case {
                    name: "leaky_bucket/acquire_unfair",
                    make: || leaky_free(false),
                    per_task,
                    bound: None,
                    may_hang: true,
                },
            ],
        }
    }

    fn binding() -> Cases {
        let per_task = PER_TASK_BIND;
        Cases {
            paced: Case {
                name: "paced/acquire",
                make: paced_bind,
                per_task,
                bound: Some(BINDING),
                may_hang: false,
            },
            governor: Case {
                name: "governor/until_ready",
                make: governor_bind,
                per_task,
                bound: Some(BINDING),
                may_hang: false,
            },
            leaky: [
                Case {
                    name: "leaky_bucket/acquire_fair",
                    make: || leaky_bind(true),
                    per_task,
                    bound: Some(LEAKY_BINDING),
                    may_hang: true,
                },
                Case {
                    name: "leaky_bucket/acquire_unfair",
                    make: || leaky_bind(false),
                    per_task,
                    bound: Some(LEAKY_BINDING),
                    may_hang: true,
                },
            ],
        }
    }

    /// Times every case in `group`.
    fn bench(&self, group: &mut BenchmarkGroup<'_, WallTime>, rt: &Runtime) {
        bench_contended(group, rt, &self.paced);
        bench_contended(group, rt, &self.governor);
        for case in &self.leaky {
            bench_contended(group, rt, case);
        }
    }

    /// Prints every case's CPU time.
    fn cpu_notes(&self, rt: &Runtime, group: &str, at_least: Duration) {
        cpu_note(rt, group, &self.paced, at_least);
        cpu_note(rt, group, &self.governor, at_least);
        for case in &self.leaky {
            cpu_note(rt, group, case, at_least);
        }
    }
}

fn contended(c: &mut Criterion) {
    let rt = two_workers();

    let cases = Cases::nonbinding();
    let mut group = c.benchmark_group("contended_nonbinding");
    group.throughput(Throughput::Elements(cases.paced.total()));
    group.sampling_mode(SamplingMode::Flat).sample_size(20);
    cases.bench(&mut group, &rt);
    group.finish();

    let cases = Cases::binding();
    let mut group = c.benchmark_group("contended_binding_1e6ps_burst1000");
    group.throughput(Throughput::Elements(cases.paced.total()));
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    cases.bench(&mut group, &rt);
    group.finish();
}

// ---------------------------------------------------------------------------------------------
// CPU time beside wall time, outside criterion

/// Runs a contended case for at least `at_least` of wall time, then prints acquisitions per
/// second of wall time and the CPU time the other threads spent meanwhile.
fn cpu_note<L: Limiter>(rt: &Runtime, group: &str, case: &Case<L>, at_least: Duration) {
    let (mut runs, mut wall, mut cpu) = (0u64, Duration::ZERO, Some(Duration::ZERO));
    let line_before = line_latency();
    while wall < at_least {
        let (_, r) = guarded(rt, case, false, true);
        wall += r.wall;
        cpu = cpu.zip(r.cpu).map(|(a, b)| a + b);
        runs += 1;
    }
    let line = describe_line(line_before, line_latency());
    let acquisitions = runs * case.total();
    let name = format!("{group}/{}", case.name);
    let per_s = acquisitions as f64 / wall.as_secs_f64();
    match cpu {
        Some(cpu) => println!(
            "cpu {name:<48} {per_s:>11.0} acq/s, {:>7.1} ns CPU per acquisition, \
             {:.2} cores busy ({runs} runs: wall {wall:.2?}, CPU {cpu:.2?}; {line})",
            cpu.as_nanos() as f64 / acquisitions as f64,
            cpu.as_secs_f64() / wall.as_secs_f64(),
        ),
        None => println!("cpu {name:<48} {per_s:>11.0} acq/s, CPU time not available"),
    }
}

// ---------------------------------------------------------------------------------------------
// The line between the two cores, and the diagnostic kinds of issue 23

/// paced's `acquire` inside `tokio::task::unconstrained`: no yield to the budget.
#[derive(Clone)]
struct PacedUnconstrained(paced::RateLimiter);

impl Limiter for PacedUnconstrained {
    fn acquire_one(&self) -> impl Future<Output = ()> + Send + '_ {
        tokio::task::unconstrained(self.0.acquire(1))
    }
    fn describe(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// paced's `try_acquire` in a loop: no future, no budget (the limit never binds).
#[derive(Clone)]
struct PacedTry(paced::RateLimiter);

impl Limiter for PacedTry {
    fn acquire_one(&self) -> impl Future<Output = ()> + Send + '_ {
        while self.0.try_acquire(1).is_err() {}
        std::future::ready(())
    }
    fn describe(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// governor's `until_ready` inside `tokio::task::coop::cooperative`: it spends the budget as
/// paced's grants do.
#[derive(Clone)]
struct GovernorCoop(Governor);

impl Limiter for GovernorCoop {
    fn acquire_one(&self) -> impl Future<Output = ()> + Send + '_ {
        tokio::task::coop::cooperative(self.0.until_ready())
    }
    fn describe(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// governor's `until_ready` after one read of tokio's clock, the clock paced reads.
#[derive(Clone)]
struct GovernorTokioClock(Governor);

impl Limiter for GovernorTokioClock {
    fn acquire_one(&self) -> impl Future<Output = ()> + Send + '_ {
        black_box(tokio::time::Instant::now());
        self.0.until_ready()
    }
    fn describe(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// What a bare compare-and-swap loop reads before it loads the word.
#[derive(Clone, Copy)]
enum Before {
    Nothing,
    TokioClock,
    Quanta,
    /// quanta's TSC read behind a load fence, as the vDSO's ordered TSC read is.
    LfenceQuanta,
    Rdtscp,
}

/// A bare "acquisition": read something, load one shared padded word, compare-and-swap it up
/// by one.
#[derive(Clone)]
struct BareCas(Arc<Padded>, Before);

impl Limiter for BareCas {
    fn acquire_one(&self) -> impl Future<Output = ()> + Send + '_ {
        match self.1 {
            Before::Nothing => {}
            Before::TokioClock => {
                black_box(tokio::time::Instant::now());
            }
            Before::Quanta => {
                black_box(quanta::Instant::now());
            }
            Before::LfenceQuanta => {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `lfence` is part of SSE2, which every x86_64 CPU has.
                unsafe {
                    std::arch::x86_64::_mm_lfence();
                }
                black_box(quanta::Instant::now());
            }
            Before::Rdtscp => {
                #[cfg(target_arch = "x86_64")]
                {
                    let mut aux = 0u32;
                    // SAFETY: `rdtscp` is on every x86_64 CPU this benchmark runs on (the
                    // kernel's vDSO uses it too).
                    black_box(unsafe { std::arch::x86_64::__rdtscp(&mut aux) });
                }
            }
        }
        let word = &self.0 .0;
        let mut seen = word.load(Ordering::Acquire);
        while let Err(now) =
            word.compare_exchange_weak(seen, seen + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            seen = now;
        }
        std::future::ready(())
    }
    fn describe(&self) -> String {
        format!("word {}", self.0 .0.load(Ordering::Relaxed))
    }
}

/// One untimed never-binding run of `make`'s limiter: CPU ns per acquisition (NaN where CPU
/// time is not available).
fn cpu_per_acquisition<L: Limiter>(rt: &Runtime, make: fn() -> L) -> f64 {
    let case = Case {
        name: "diagnostic",
        make,
        per_task: PER_TASK_FREE,
        bound: None,
        may_hang: false,
    };
    let (_, r) = guarded(rt, &case, false, true);
    r.cpu
        .map_or(f64::NAN, |c| c.as_nanos() as f64 / case.total() as f64)
}

fn bare(before: Before) -> BareCas {
    BareCas(Arc::new(Padded(AtomicU64::new(0))), before)
}

/// One round of [`interleave`]: the line's latency, and each kind's CPU per acquisition.
type Round = (f64, Vec<f64>);

/// `PACED_BENCH_INTERLEAVE`: every kind once per round, the line latency measured in the same
/// round, for `total`; then each kind's CPU per acquisition where the line was near and where
/// it was far (rounds where governor kept both workers busy), and the rounds as characters
/// (`_` under 35 ns, `.` under 65, `m` under 90, `S` above; `?` not measured).
fn interleave(rt: &Runtime, total: Duration) {
    const ALL: &str = "paced,paced_unconstrained,paced_try,governor,governor_coop,\
                       governor_tokio_clock,cas_tokio_clock,cas_quanta,cas_lfence_quanta,\
                       cas_rdtscp,cas";
    let kinds = std::env::var("PACED_BENCH_KINDS").unwrap_or_else(|_| ALL.to_owned());
    let mut kinds: Vec<&str> = kinds.split(',').collect();
    if !kinds.contains(&"governor") {
        kinds.push("governor");
    }
    let mut rounds: Vec<Round> = Vec::new();
    let start = Instant::now();
    while start.elapsed() < total {
        let costs = kinds
            .iter()
            .map(|kind| match *kind {
                "paced" => cpu_per_acquisition(rt, paced_free),
                "paced_unconstrained" => {
                    cpu_per_acquisition(rt, || PacedUnconstrained(paced_free()))
                }
                "paced_try" => cpu_per_acquisition(rt, || PacedTry(paced_free())),
                "governor" => cpu_per_acquisition(rt, governor_free),
                "governor_coop" => cpu_per_acquisition(rt, || GovernorCoop(governor_free())),
                "governor_tokio_clock" => {
                    cpu_per_acquisition(rt, || GovernorTokioClock(governor_free()))
                }
                "cas_tokio_clock" => cpu_per_acquisition(rt, || bare(Before::TokioClock)),
                "cas_quanta" => cpu_per_acquisition(rt, || bare(Before::Quanta)),
                "cas_lfence_quanta" => cpu_per_acquisition(rt, || bare(Before::LfenceQuanta)),
                "cas_rdtscp" => cpu_per_acquisition(rt, || bare(Before::Rdtscp)),
                "cas" => cpu_per_acquisition(rt, || bare(Before::Nothing)),
                other => panic!("PACED_BENCH_KINDS: no kind {other:?}; the kinds: {ALL}"),
            })
            .collect();
        rounds.push((line_latency().unwrap_or(f64::NAN), costs));
    }
    let governor = kinds.iter().position(|k| *k == "governor").expect("added");
    let both = |r: &&Round| r.1[governor] > 35.0;
    let near: Vec<_> = rounds.iter().filter(both).filter(|r| r.0 < 60.0).collect();
    let far: Vec<_> = rounds
        .iter()
        .filter(both)
        .filter(|r| r.0 >= FAR_LINE)
        .collect();
    let median = |set: &[&Round], pick: &dyn Fn(&Round) -> f64| {
        let mut v: Vec<f64> = set
            .iter()
            .map(|r| pick(r))
            .filter(|x| x.is_finite())
            .collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    println!(
        "{} rounds; governor on both workers in {}: line near (< 60 ns) in {}, far (>= {FAR_LINE} \
         ns) in {}",
        rounds.len(),
        rounds.iter().filter(both).count(),
        near.len(),
        far.len()
    );
    println!(
        "  {:<22} {:>8} {:>8}   (median ns CPU per acquisition)",
        "kind", "near", "far"
    );
    println!(
        "  {:<22} {:>8.1} {:>8.1}   (ns one way)",
        "line",
        median(&near, &|r| r.0),
        median(&far, &|r| r.0)
    );
    for (i, kind) in kinds.iter().enumerate() {
        println!(
            "  {kind:<22} {:>8.1} {:>8.1}",
            median(&near, &|r| r.1[i]),
            median(&far, &|r| r.1[i])
        );
    }
    let mark = |x: f64| match x {
        x if !x.is_finite() => '?',
        x if x < 35.0 => '_',
        x if x < 65.0 => '.',
        x if x < FAR_LINE => 'm',
        _ => 'S',
    };
    for chunk in rounds.chunks(100) {
        println!();
        let row: String = chunk.iter().map(|r| mark(r.0)).collect();
        println!("  {:<22} {row}", "line");
        for (i, kind) in kinds.iter().enumerate() {
            let row: String = chunk.iter().map(|r| mark(r.1[i])).collect();
            println!("  {kind:<22} {row}");
        }
    }
}

fn cpu_notes(_: &mut Criterion) {
    let rt = two_workers();
    let at_least = Duration::from_secs(1);
    println!(
        "CPU beside wall time over the timed part of each run, {TASKS} tasks on 2 worker threads:"
    );
    if let Ok(secs) = std::env::var("PACED_BENCH_INTERLEAVE") {
        let secs = secs.parse().expect("PACED_BENCH_INTERLEAVE: whole seconds");
        interleave(&rt, Duration::from_secs(secs));
        return;
    }
    if std::env::var_os("PACED_BENCH_CPU_ONLY").is_some() {
        let cases = Cases::nonbinding();
        let semaphore: Case<Arc<tokio::sync::Semaphore>> = Case {
            name: "tokio_semaphore/acquire",
            make: || Arc::new(tokio::sync::Semaphore::new(1 << 20)),
            per_task: PER_TASK_FREE,
            bound: None,
            may_hang: false,
        };
        let peer_is_semaphore =
            std::env::var("PACED_BENCH_CPU_ONLY").is_ok_and(|v| v == "semaphore");
        for _ in 0..3 {
            cpu_note(&rt, "contended_nonbinding", &cases.paced, at_least);
            if peer_is_semaphore {
                cpu_note(&rt, "contended_nonbinding", &semaphore, at_least);
            } else {
                cpu_note(&rt, "contended_nonbinding", &cases.governor, at_least);
            }
        }
        return;
    }
    Cases::nonbinding().cpu_notes(&rt, "contended_nonbinding", at_least);
    Cases::binding().cpu_notes(&rt, "contended_binding", at_least);
}

criterion_group!(
    benches,
    uncontended,
    throttle_with,
    multi,
    refused_with_queue,
    contended,
    cpu_notes
);
criterion_main!(benches);
