//! The shared limiters, `pacer::RateLimiter` and `pacer::Stagger`, side by side with governor's
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
//!
//! The contended groups report acquisitions per second (wall time, from the barrier's release
//! to the last task's end). Afterwards, outside criterion, each contended case runs again for a
//! while and prints its CPU time (the process's threads, from `/proc/self/task/*/schedstat`)
//! beside its wall time, since the two cores may not both be free.
//!
//! Run: `cargo bench --bench shared -- --warm-up-time 1 --measurement-time 2`

use std::future::{poll_fn, Future};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, Criterion, SamplingMode, Throughput,
};
use governor::{DefaultDirectRateLimiter, Quota};
use pacer::{Rate, Stagger};
use tokio::runtime::Runtime;
use tokio::sync::Barrier;

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

    let limiter = pacer::RateLimiter::new(Rate::per_second(1_000_000_000), u64::MAX / 2);
    bench_try(&mut group, "pacer/rate_limiter_1e9ps_huge_burst", || {
        limiter.try_acquire(1).is_ok()
    });
    assert_eq!(limiter.stats().rejected, 0);

    let stagger = Stagger::new(usize::MAX, Duration::from_nanos(1));
    bench_try(&mut group, "pacer/stagger_max_1ns", || {
        stagger.try_acquire().is_ok()
    });
    let stagger = Stagger::new(usize::MAX, Duration::ZERO);
    bench_try(&mut group, "pacer/stagger_max_0", || {
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
// The limiters, never binding and binding

/// governor: a direct limiter with the largest burst, refilled at u32::MAX per second.
fn governor_free() -> Arc<DefaultDirectRateLimiter> {
    let quota = Quota::per_second(NonZeroU32::MAX).allow_burst(NonZeroU32::MAX);
    Arc::new(governor::RateLimiter::direct(quota))
}

/// leaky-bucket: the largest balance it supports (`isize::MAX`), full, refilled by as much
/// every 1 ms. Fair (its default) or not: a fair limiter skips the lock-free fast path.
fn leaky_free(fair: bool) -> Arc<leaky_bucket::RateLimiter> {
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

fn pacer_free() -> pacer::RateLimiter {
    pacer::RateLimiter::new(Rate::per_second(1_000_000_000), u64::MAX / 2)
}

fn pacer_bind() -> pacer::RateLimiter {
    pacer::RateLimiter::new(Rate::per_second(BIND_RATE), BIND_BURST)
}

fn governor_bind() -> Arc<DefaultDirectRateLimiter> {
    let rate = NonZeroU32::new(BIND_RATE as u32).expect("non-zero rate");
    let burst = NonZeroU32::new(BIND_BURST as u32).expect("non-zero burst");
    Arc::new(governor::RateLimiter::direct(
        Quota::per_second(rate).allow_burst(burst),
    ))
}

/// leaky-bucket refills in steps of its interval, so `BIND_RATE` is `BIND_RATE / 1000` tokens
/// every 1 ms (its finest interval).
fn leaky_bind(fair: bool) -> Arc<leaky_bucket::RateLimiter> {
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
}

impl Limiter for pacer::RateLimiter {
    fn acquire_one(&self) -> impl Future<Output = ()> + Send + '_ {
        self.acquire(1)
    }
}

impl Limiter for Arc<DefaultDirectRateLimiter> {
    fn acquire_one(&self) -> impl Future<Output = ()> + Send + '_ {
        self.until_ready()
    }
}

impl Limiter for Arc<leaky_bucket::RateLimiter> {
    fn acquire_one(&self) -> impl Future<Output = ()> + Send + '_ {
        self.acquire(1)
    }
}

/// What one contended run saw.
struct Run {
    /// From the barrier's release to the end of the last task.
    wall: Duration,
    /// Polls of the acquisition futures (probed runs only).
    polls: u64,
    /// When each grant was seen, sorted (probed runs only).
    stamps: Vec<Instant>,
}

/// `TASKS` tasks released together, each awaiting `per_task` acquisitions on `limiter`. A probed
/// run counts the polls of every acquisition and stamps every grant.
async fn run<L: Limiter>(limiter: &L, per_task: u64, probe: bool) -> Run {
    let barrier = Arc::new(Barrier::new(TASKS + 1));
    let ready = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
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
                    } else {
                        limiter.acquire_one().await;
                    }
                }
                (polls, stamps)
            })
        })
        .collect();
    // Arrive last, so that the clock starts at the release.
    while ready.load(Ordering::Acquire) < TASKS {
        tokio::task::yield_now().await;
    }
    let start = Instant::now();
    barrier.wait().await;
    let mut polls = 0;
    let mut stamps = Vec::new();
    for task in tasks {
        let (p, s) = task.await.expect("task panicked");
        polls += p;
        stamps.extend(s);
    }
    let wall = start.elapsed();
    stamps.sort_unstable();
    Run {
        wall,
        polls,
        stamps,
    }
}

/// The most grants seen in any window `[t_i, t_j]` beyond `burst + rate * (t_j - t_i)`, from
/// the sorted stamps. A stamp is read after its grant, so a grant can look later than it was:
/// at most one per task at any moment, hence up to `TASKS` grants of apparent excess.
fn window_excess(stamps: &[Instant], rate: u64, burst: u64) -> f64 {
    let Some(&t0) = stamps.first() else {
        return 0.0;
    };
    let per_ns = rate as f64 / 1e9;
    let at = |t: Instant| per_ns * t.duration_since(t0).as_nanos() as f64;
    // Grants in [t_i, t_j] = j - i + 1; the excess is max over i <= j of
    // (j + 1 - at(t_j)) - (i - at(t_i)) - burst.
    let mut min_start = f64::INFINITY;
    let mut excess = f64::NEG_INFINITY;
    for (j, &t) in stamps.iter().enumerate() {
        min_start = min_start.min(j as f64 - at(t));
        excess = excess.max((j + 1) as f64 - at(t) - min_start);
    }
    excess - burst as f64
}

/// Runs one probed untimed run and checks it: every acquisition granted, and, when `bound` is
/// given as `(rate, burst, slack)`, no more than `burst + rate * elapsed (+ slack)` granted;
/// without `bound`, no acquisition ever pending. Prints what it saw.
fn check<L: Limiter>(
    rt: &Runtime,
    name: &str,
    limiter: &L,
    per_task: u64,
    bound: Option<(u64, u64, u64)>,
) -> Run {
    let r = rt.block_on(run(limiter, per_task, true));
    let total = TASKS as u64 * per_task;
    assert_eq!(r.stamps.len() as u64, total, "{name}: grants missing");
    let polls_per = r.polls as f64 / total as f64;
    match bound {
        None => {
            assert_eq!(
                r.polls, total,
                "{name}: {} polls for {total} acquisitions, so some waited: the limit binds",
                r.polls
            );
            println!(
                "check {name}: {total} acquisitions in {:?}, none pending",
                r.wall
            );
        }
        Some((rate, burst, slack)) => {
            let allowed = burst as f64 + rate as f64 * r.wall.as_secs_f64();
            assert!(
                total as f64 <= allowed + slack as f64,
                "{name}: {total} granted in {:?}, more than burst + rate * elapsed = {allowed:.0}",
                r.wall
            );
            let excess = window_excess(&r.stamps, rate, burst);
            assert!(
                excess <= (TASKS as u64 + slack) as f64,
                "{name}: {excess:.0} grants beyond burst + rate * window in some window"
            );
            let min_wall = (total - burst) as f64 / rate as f64;
            println!(
                "check {name}: {total} granted in {:?} (bound allows >= {:.1} ms; {:.0}/s), \
                 {polls_per:.2} polls per acquisition, worst window excess {excess:.0} \
                 (stamping slack {TASKS})",
                r.wall,
                min_wall * 1e3,
                total as f64 / r.wall.as_secs_f64(),
            );
        }
    }
    r
}

/// Checks a contended case once, then times it: `iter_custom` with a fresh limiter per
/// iteration, timing only the run from the barrier's release.
fn bench_contended<L: Limiter>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    name: &str,
    make: impl Fn() -> L,
    per_task: u64,
    bound: Option<(u64, u64, u64)>,
) {
    let limiter = rt.block_on(async { make() });
    check(rt, name, &limiter, per_task, bound);
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut wall = Duration::ZERO;
            for _ in 0..iters {
                let limiter = rt.block_on(async { make() });
                wall += rt.block_on(run(&limiter, per_task, false)).wall;
            }
            wall
        });
    });
}

/// leaky-bucket adds `BIND_RATE / 1000` tokens at each 1 ms step, so it may grant up to one
/// step more than the continuous bound; pacer and governor are GCRAs and get no slack.
const LEAKY_SLACK: u64 = BIND_RATE / 1000;

fn contended(c: &mut Criterion) {
    let rt = two_workers();

    let mut group = c.benchmark_group("contended_nonbinding");
    group.throughput(Throughput::Elements(TASKS as u64 * PER_TASK_FREE));
    group.sampling_mode(SamplingMode::Flat).sample_size(20);
    let pacer_checked = rt.block_on(async { pacer_free() });
    check(&rt, "pacer", &pacer_checked, PER_TASK_FREE, None);
    let stats = pacer_checked.stats();
    assert_eq!(
        (stats.rejected, stats.waiting, stats.total_wait),
        (0, 0, Duration::ZERO),
        "pacer: non-binding run waited"
    );
    bench_contended(
        &mut group,
        &rt,
        "pacer/acquire",
        pacer_free,
        PER_TASK_FREE,
        None,
    );
    bench_contended(
        &mut group,
        &rt,
        "governor/until_ready",
        governor_free,
        PER_TASK_FREE,
        None,
    );
    bench_contended(
        &mut group,
        &rt,
        "leaky_bucket/acquire_fair",
        || leaky_free(true),
        PER_TASK_FREE,
        None,
    );
    bench_contended(
        &mut group,
        &rt,
        "leaky_bucket/acquire_unfair",
        || leaky_free(false),
        PER_TASK_FREE,
        None,
    );
    group.finish();

    let mut group = c.benchmark_group("contended_binding_1e6ps_burst1000");
    group.throughput(Throughput::Elements(TASKS as u64 * PER_TASK_BIND));
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    let pacer_checked = rt.block_on(async { pacer_bind() });
    check(
        &rt,
        "pacer (binding)",
        &pacer_checked,
        PER_TASK_BIND,
        Some((BIND_RATE, BIND_BURST, 0)),
    );
    let stats = pacer_checked.stats();
    assert_eq!(
        (stats.granted, stats.rejected, stats.waiting),
        (TASKS as u64 * PER_TASK_BIND, 0, 0),
        "pacer: counters after the binding run"
    );
    assert!(stats.total_wait > Duration::ZERO, "pacer: nobody waited");
    bench_contended(
        &mut group,
        &rt,
        "pacer/acquire",
        pacer_bind,
        PER_TASK_BIND,
        Some((BIND_RATE, BIND_BURST, 0)),
    );
    bench_contended(
        &mut group,
        &rt,
        "governor/until_ready",
        governor_bind,
        PER_TASK_BIND,
        Some((BIND_RATE, BIND_BURST, 0)),
    );
    bench_contended(
        &mut group,
        &rt,
        "leaky_bucket/acquire_fair",
        || leaky_bind(true),
        PER_TASK_BIND,
        Some((BIND_RATE, BIND_BURST, LEAKY_SLACK)),
    );
    bench_contended(
        &mut group,
        &rt,
        "leaky_bucket/acquire_unfair",
        || leaky_bind(false),
        PER_TASK_BIND,
        Some((BIND_RATE, BIND_BURST, LEAKY_SLACK)),
    );
    group.finish();
}

// ---------------------------------------------------------------------------------------------
// CPU time beside wall time, outside criterion

/// CPU time of all the process's threads so far, from `/proc/self/task/*/schedstat` (its first
/// field is nanoseconds on a CPU); `None` where that is not available.
fn cpu_time() -> Option<Duration> {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path().join("schedstat");
        let text = std::fs::read_to_string(path).ok()?;
        total += text.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(total))
}

/// Runs a contended case repeatedly for at least `at_least`, then prints acquisitions per
/// second of wall time and the CPU time spent beside it.
fn cpu_note<L: Limiter>(
    rt: &Runtime,
    name: &str,
    make: impl Fn() -> L,
    per_task: u64,
    at_least: Duration,
) {
    let total = TASKS as u64 * per_task;
    let mut runs = 0u64;
    let mut wall = Duration::ZERO;
    let cpu_before = cpu_time();
    let start = Instant::now();
    while start.elapsed() < at_least {
        let limiter = rt.block_on(async { make() });
        wall += rt.block_on(run(&limiter, per_task, false)).wall;
        runs += 1;
    }
    let outer = start.elapsed();
    let acquisitions = runs * total;
    let per_s = acquisitions as f64 / wall.as_secs_f64();
    match (cpu_before, cpu_time()) {
        (Some(before), Some(after)) => {
            let cpu = after.saturating_sub(before);
            println!(
                "cpu {name:<46} {per_s:>12.0} acq/s wall, {:>7.1} ns CPU per acquisition, \
                 {:.2} cores busy ({runs} runs, wall {outer:.2?}, CPU {cpu:.2?})",
                cpu.as_nanos() as f64 / acquisitions as f64,
                cpu.as_secs_f64() / outer.as_secs_f64(),
            );
        }
        _ => println!("cpu {name:<46} {per_s:>12.0} acq/s wall, CPU time not available"),
    }
}

fn cpu_notes(_: &mut Criterion) {
    let rt = two_workers();
    let long = Duration::from_secs(1);
    println!("CPU beside wall time, {TASKS} tasks on 2 worker threads:");
    let free = PER_TASK_FREE;
    cpu_note(&rt, "contended_nonbinding/pacer", pacer_free, free, long);
    cpu_note(
        &rt,
        "contended_nonbinding/governor",
        governor_free,
        free,
        long,
    );
    cpu_note(
        &rt,
        "contended_nonbinding/leaky_bucket_fair",
        || leaky_free(true),
        free,
        long,
    );
    cpu_note(
        &rt,
        "contended_nonbinding/leaky_bucket_unfair",
        || leaky_free(false),
        free,
        long,
    );
    let bind = PER_TASK_BIND;
    cpu_note(&rt, "contended_binding/pacer", pacer_bind, bind, long);
    cpu_note(&rt, "contended_binding/governor", governor_bind, bind, long);
    cpu_note(
        &rt,
        "contended_binding/leaky_bucket_fair",
        || leaky_bind(true),
        bind,
        long,
    );
    cpu_note(
        &rt,
        "contended_binding/leaky_bucket_unfair",
        || leaky_bind(false),
        bind,
        long,
    );
}

criterion_group!(benches, uncontended, contended, cpu_notes);
criterion_main!(benches);
