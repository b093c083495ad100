//! Memory per waiting stream: 100,000 tasks on a current-thread runtime, each owning a paced
//! stream that has emitted its first item and waits an hour for its second.
//!
//! Heap bytes are counted exactly by a counting `#[global_allocator]` (live bytes); RSS is read
//! from `/proc/self/statm`. Each variant runs in its own child process (this binary, re-run with
//! `PACED_MEMORY_VARIANT` set), so that memory freed by one variant cannot be reused by the next
//! and hide its RSS. Per-task figures are net of a baseline task that only awaits
//! `std::future::pending()`: what remains is the stream, inline in the task and on the heap,
//! plus the task allocation's 128-byte rounding. `size_of` of each adapter is printed too, for
//! differences finer than that rounding.
//!
//! Run: `cargo bench -p paced-benches --bench memory` (`PACED_MEMORY_TASKS` changes the task count).

use std::future::Future;
use std::mem::size_of_val;
use std::num::NonZeroU32;
use std::pin::pin;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::{Stream, StreamExt};
use governor::prelude::StreamRateLimitExt;
use paced::{Enforcing, PaceExt, Rate, Shaping};

#[path = "common/counting.rs"]
mod counting;

use counting::{Counting, LIVE};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Tasks that have taken their first item and are waiting for the second.
static READY: AtomicUsize = AtomicUsize::new(0);
/// Tasks whose second item came: must stay 0, everything waits an hour.
static DONE: AtomicUsize = AtomicUsize::new(0);

const HOUR: Duration = Duration::from_secs(3600);
const PAGE: usize = 4096;

/// Resident set size in bytes, from `/proc/self/statm` (0 where it does not exist).
fn rss() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
        .map_or(0, |pages| pages * PAGE)
}

fn source() -> futures_util::stream::Iter<std::ops::Range<u32>> {
    futures_util::stream::iter(0..2)
}

/// Builds the stream inside the task, takes the first item, then waits for the second.
///
/// The stream is built in the task (from a zero-sized closure) rather than passed in, so that
/// the future does not hold it twice: once as the argument and once pinned.
async fn hold<S: Stream>(make: impl FnOnce() -> S) {
    let mut s = pin!(make());
    assert!(s.next().await.is_some(), "the first item leaves at once");
    READY.fetch_add(1, Ordering::Relaxed);
    s.next().await;
    DONE.fetch_add(1, Ordering::Relaxed);
}

async fn baseline() {
    READY.fetch_add(1, Ordering::Relaxed);
    std::future::pending::<()>().await;
}

const VARIANTS: [&str; 7] = [
    "baseline: pending()",
    "paced min_interval(1h)",
    "paced throttle(1/h, burst 1, Shaping)",
    "paced staggered_start(1, 1h)",
    "paced batched_interval(1, 1h)",
    "tokio-stream throttle(1h)",
    "governor ratelimit_stream (1/h, shared limiter)",
];

/// What one child process measured.
struct Measured {
    future_size: usize,
    heap: isize,
    rss: isize,
    millis: u128,
}

/// Spawns `tasks` copies of `make()`, waits until every one has reached its wait, and measures.
fn measure<F, M>(tasks: usize, make: M) -> Measured
where
    M: Fn() -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("current-thread runtime");
    let start = Instant::now();
    rt.block_on(async {
        // Let the runtime make its one-time allocations before the first reading.
        tokio::spawn(async {}).await.expect("warm-up task");
        let future_size = size_of_val(&make());
        let (heap0, rss0) = (LIVE.load(Ordering::Relaxed), rss());
        for _ in 0..tasks {
            drop(tokio::spawn(make()));
        }
        while READY.load(Ordering::Relaxed) < tasks {
            tokio::task::yield_now().await;
        }
        // One more turn, so that the last tasks have parked on their timers.
        tokio::task::yield_now().await;
        let (heap1, rss1) = (LIVE.load(Ordering::Relaxed), rss());
        assert_eq!(DONE.load(Ordering::Relaxed), 0, "a task stopped waiting");
        Measured {
            future_size,
            heap: heap1 as isize - heap0 as isize,
            rss: rss1 as isize - rss0 as isize,
            millis: start.elapsed().as_millis(),
        }
    })
}

fn run_variant(name: &str, tasks: usize) -> Measured {
    match name {
        "baseline: pending()" => measure(tasks, baseline),
        "paced min_interval(1h)" => measure(tasks, || hold(|| source().min_interval(HOUR))),
        "paced throttle(1/h, burst 1, Shaping)" => measure(tasks, || {
            hold(|| PaceExt::throttle(source(), Rate::new(1, HOUR), |_| 1, 1, Shaping))
        }),
        "paced staggered_start(1, 1h)" => {
            measure(tasks, || hold(|| source().staggered_start(1, HOUR)))
        }
        "paced batched_interval(1, 1h)" => {
            measure(tasks, || hold(|| source().batched_interval(1, HOUR)))
        }
        "tokio-stream throttle(1h)" => measure(tasks, || {
            hold(|| tokio_stream::StreamExt::throttle(source(), HOUR))
        }),
        "governor ratelimit_stream (1/h, shared limiter)" => {
            // One limiter for all tasks (governor's limiter is shared state by design): the
            // first task takes the only cell, every other one waits for its first item. So
            // here a task counts as waiting once it has polled its stream once.
            let quota = governor::Quota::with_period(HOUR)
                .expect("non-zero period")
                .allow_burst(NonZeroU32::MIN);
            let limiter: &'static _ = Box::leak(Box::new(governor::RateLimiter::direct(quota)));
            measure(tasks, move || async move {
                let mut s = pin!(source().ratelimit_stream(limiter));
                let first = futures_util::poll!(s.next());
                READY.fetch_add(1, Ordering::Relaxed);
                if first.is_pending() {
                    s.next().await;
                }
                s.next().await;
                DONE.fetch_add(1, Ordering::Relaxed);
            })
        }
        other => panic!("unknown variant {other:?}"),
    }
}

/// `size_of` of each adapter over `Iter<Range<u32>>` (built inside a runtime, because
/// tokio-stream's `throttle` creates its timer at once).
fn print_sizes() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("current-thread runtime");
    let _guard = rt.enter();
    let limiter = governor::RateLimiter::direct(governor::Quota::per_second(NonZeroU32::MIN));
    let rows: [(&str, usize); 10] = [
        (
            "futures_util::stream::Iter<Range<u32>> (the inner stream)",
            size_of_val(&source()),
        ),
        (
            "tokio::time::Sleep",
            std::mem::size_of::<tokio::time::Sleep>(),
        ),
        (
            "paced::MinInterval<_>",
            size_of_val(&source().min_interval(HOUR)),
        ),
        (
            "paced::stream::Throttle<_, closure, Shaping>",
            size_of_val(&PaceExt::throttle(
                source(),
                Rate::new(1, HOUR),
                |_| 1,
                1,
                Shaping,
            )),
        ),
        (
            "paced::stream::Throttle<_, closure, Enforcing>",
            size_of_val(&PaceExt::throttle(
                source(),
                Rate::new(1, HOUR),
                |_| 1,
                1,
                Enforcing,
            )),
        ),
        (
            "paced::stream::Throttle<_, fn(&u32) -> u64, Shaping>",
            std::mem::size_of::<
                paced::stream::Throttle<
                    futures_util::stream::Iter<std::ops::Range<u32>>,
                    fn(&u32) -> u64,
                    Shaping,
                >,
            >(),
        ),
        (
            "paced::StaggeredStart<_>",
            size_of_val(&source().staggered_start(1, HOUR)),
        ),
        (
            "paced::BatchedInterval<_>",
            size_of_val(&source().batched_interval(1, HOUR)),
        ),
        (
            "tokio_stream Throttle<_>",
            size_of_val(&tokio_stream::StreamExt::throttle(source(), HOUR)),
        ),
        (
            "governor RatelimitedStream<'_, _, ..> (default direct limiter)",
            size_of_val(&source().ratelimit_stream(&limiter)),
        ),
    ];
    println!("| type | size_of (bytes) |");
    println!("|---|---:|");
    for (name, size) in rows {
        println!("| {name} | {size} |");
    }
    println!();
}

fn main() {
    let tasks: usize = std::env::var("PACED_MEMORY_TASKS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);

    // Child: measure one variant and report it on one line.
    if let Ok(name) = std::env::var("PACED_MEMORY_VARIANT") {
        let m = run_variant(&name, tasks);
        println!(
            "RESULT\t{}\t{}\t{}\t{}",
            m.future_size, m.heap, m.rss, m.millis
        );
        return;
    }

    // Parent: criterion-style arguments are ignored; one child per variant.
    let exe = std::env::current_exe().expect("path of this benchmark");
    let mut results = Vec::new();
    for name in VARIANTS {
        let out = Command::new(&exe)
            .env("PACED_MEMORY_VARIANT", name)
            .env("PACED_MEMORY_TASKS", tasks.to_string())
            .output()
            .expect("run a child process");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout.lines().find_map(|l| l.strip_prefix("RESULT\t"));
        let Some(line) = line.filter(|_| out.status.success()) else {
            panic!(
                "variant {name:?} failed: {}\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let f: Vec<i128> = line
            .split('\t')
            .map(|x| x.parse().expect("a number"))
            .collect();
        results.push((name, f[0], f[1], f[2], f[3]));
    }

    let per = |bytes: i128| bytes as f64 / tasks as f64;
    let (_, base_future, base_heap, base_rss, _) = results[0];
    println!();
    println!(
        "Memory per waiting task: {tasks} tasks on a current-thread runtime, each stream has \
         emitted its first item and waits 1 h for its second. Heap = live bytes from a counting \
         allocator; RSS from /proc/self/statm; one child process per row."
    );
    println!();
    println!(
        "| task | future size (B) | heap / task (B) | heap / task net of baseline (B) \
         | RSS / task (B) | RSS / task net of baseline (B) | spawn + settle (ms) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, future, heap, rss, millis) in &results {
        println!(
            "| {name} | {future} (+{}) | {:.1} | {:.1} | {:.1} | {:.1} | {millis} |",
            future - base_future,
            per(*heap),
            per(heap - base_heap),
            per(*rss),
            per(rss - base_rss),
        );
    }
    println!();
    print_sizes();
}
