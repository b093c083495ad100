//! Memory of the keyed limiters: `paced::KeyedRateLimiter` beside governor's keyed limiter
//! (`governor::RateLimiter::keyed`, a `DashMap`), the same quota for both: 10 per second, a
//! burst of 10, so an emptied bucket is full again after `REFILL` (1 s).
//!
//! `KEYS` distinct `u64` keys are touched once each (cost 1), then the clock moves on by
//! `REFILL`, every bucket is full again, and one more key is touched. Readings:
//! - after the touches: heap per key (the table's growth included: both tables double, so the
//!   figure moves with the key count by up to about 2x);
//! - after the idle period and the one more operation: what is still held;
//! - governor only: after `retain_recent()`, its own way to drop keys whose state is that of a
//!   fresh key, and after `shrink_to_fit()` too (`retain_recent` keeps the table's capacity).
//!
//! paced reads tokio's clock, so it runs on a paused current-thread runtime and the idle
//! period is `tokio::time::advance`; governor reads the clock it is given, here its
//! `FakeRelativeClock`, advanced by as much. Heap bytes are counted exactly by a counting
//! `#[global_allocator]` (live bytes), net of the reading taken just before the first touch;
//! RSS is read from `/proc/self/statm` (freed heap need not be given back to the system, so
//! RSS after forgetting says little). Each limiter runs in its own child process (this binary,
//! re-run with `PACED_KEYED_MEMORY_VARIANT` set), so that one cannot reuse the other's freed
//! memory. The wall time of the operation after the idle period is shown too: paced forgets
//! the expired keys inside the first operation that follows.
//!
//! Run: `cargo bench -p paced-benches --bench keyed_memory` (`PACED_KEYED_MEMORY_KEYS` changes the key count).

use std::num::NonZeroU32;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use governor::clock::FakeRelativeClock;
use governor::Quota;
use paced::{KeyedRateLimiter, Rate};

#[path = "common/counting.rs"]
mod counting;

use counting::{Counting, LIVE};

#[global_allocator]
static GLOBAL: Counting = Counting;

const PAGE: usize = 4096;
/// 10 per second with a burst of 10: a bucket emptied completely is full again after 1 s.
const RATE: u32 = 10;
const REFILL: Duration = Duration::from_secs(1);

/// Resident set size in bytes, from `/proc/self/statm` (0 where it does not exist).
fn rss() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
        .map_or(0, |pages| pages * PAGE)
}

/// One reading, net of the one before the first touch.
struct Reading {
    stage: &'static str,
    /// Keys the limiter holds state for (paced: `tracked_keys()`, governor: `len()`).
    keys: usize,
    heap: isize,
    rss: isize,
    /// Wall time of what led to this reading.
    took: Duration,
}

/// Heap and RSS now, relative to `base`.
fn read(base: (usize, usize)) -> (isize, isize) {
    (
        LIVE.load(Ordering::Relaxed) as isize - base.0 as isize,
        rss() as isize - base.1 as isize,
    )
}

fn base() -> (usize, usize) {
    (LIVE.load(Ordering::Relaxed), rss())
}

fn paced(keys: u64) -> Vec<Reading> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("current-thread runtime");
    rt.block_on(async {
        let limiter = KeyedRateLimiter::<u64>::new(Rate::per_second(RATE.into()), RATE.into());
        let base = base();
        let mut out = Vec::new();

        let start = Instant::now();
        for key in 0..keys {
            assert!(limiter.try_acquire(&key, 1).is_ok(), "key {key} refused");
        }
        let took = start.elapsed();
        let (heap, rss) = read(base);
        let tracked = limiter.tracked_keys();
        assert_eq!(tracked as u64, keys);
        out.push(Reading {
            stage: "touched once",
            keys: tracked,
            heap,
            rss,
            took,
        });

        tokio::time::advance(REFILL).await;
        let start = Instant::now();
        assert!(
            limiter.try_acquire(&keys, 1).is_ok(),
            "the last key refused"
        );
        let took = start.elapsed();
        let (heap, rss) = read(base);
        out.push(Reading {
            stage: "idle for the refill period, then one try_acquire",
            keys: limiter.tracked_keys(),
            heap,
            rss,
            took,
        });
        drop(limiter);
        out
    })
}

fn governor(keys: u64) -> Vec<Reading> {
    let clock = FakeRelativeClock::default();
    let quota = Quota::per_second(NonZeroU32::new(RATE).expect("non-zero rate"));
    let limiter = governor::RateLimiter::dashmap_with_clock(quota, clock.clone());
    let base = base();
    let mut out = Vec::new();

    let start = Instant::now();
    for key in 0..keys {
        assert!(limiter.check_key(&key).is_ok(), "key {key} refused");
    }
    let took = start.elapsed();
    let (heap, rss) = read(base);
    out.push(Reading {
        stage: "touched once",
        keys: limiter.len(),
        heap,
        rss,
        took,
    });

    clock.advance(REFILL);
    let start = Instant::now();
    assert!(limiter.check_key(&keys).is_ok(), "the last key refused");
    let took = start.elapsed();
    let (heap, rss) = read(base);
    out.push(Reading {
        stage: "idle for the refill period, then one check_key",
        keys: limiter.len(),
        heap,
        rss,
        took,
    });

    let start = Instant::now();
    limiter.retain_recent();
    let took = start.elapsed();
    let (heap, rss) = read(base);
    out.push(Reading {
        stage: "then retain_recent()",
        keys: limiter.len(),
        heap,
        rss,
        took,
    });

    let start = Instant::now();
    limiter.shrink_to_fit();
    let took = start.elapsed();
    let (heap, rss) = read(base);
    out.push(Reading {
        stage: "then shrink_to_fit()",
        keys: limiter.len(),
        heap,
        rss,
        took,
    });
    out
}

const VARIANTS: [&str; 2] = ["paced", "governor"];

fn main() {
    let keys: u64 = std::env::var("PACED_KEYED_MEMORY_KEYS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);

    // Child: measure one limiter, one line per reading.
    if let Ok(name) = std::env::var("PACED_KEYED_MEMORY_VARIANT") {
        let readings = match name.as_str() {
            "paced" => paced(keys),
            "governor" => governor(keys),
            other => panic!("unknown variant {other:?}"),
        };
        for r in readings {
            println!(
                "RESULT\t{}\t{}\t{}\t{}\t{}",
                r.stage,
                r.keys,
                r.heap,
                r.rss,
                r.took.as_nanos()
            );
        }
        return;
    }

    // Parent: criterion-style arguments are ignored; one child per limiter.
    let exe = std::env::current_exe().expect("path of this benchmark");
    println!();
    println!(
        "Keyed limiter memory: {keys} distinct u64 keys touched once (cost 1), quota {RATE}/s \
         with a burst of {RATE}; then {REFILL:?} later (every bucket full again) one more key. \
         Heap = live bytes from a counting allocator, RSS from /proc/self/statm, both net of \
         the reading before the first touch; one child process per limiter."
    );
    println!();
    println!(
        "| limiter | after | keys held | heap (B) | heap / touched key (B) | RSS (B) | took |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    for name in VARIANTS {
        let out = Command::new(&exe)
            .env("PACED_KEYED_MEMORY_VARIANT", name)
            .env("PACED_KEYED_MEMORY_KEYS", keys.to_string())
            .output()
            .expect("run a child process");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "variant {name:?} failed: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        for line in stdout.lines().filter_map(|l| l.strip_prefix("RESULT\t")) {
            let f: Vec<&str> = line.split('\t').collect();
            let number = |i: usize| -> i128 { f[i].parse().expect("a number") };
            let (held, heap, rss) = (number(1), number(2), number(3));
            let took = Duration::from_nanos(u64::try_from(number(4)).expect("a duration"));
            println!(
                "| {name} | {} | {held} | {heap} | {:.1} | {rss} | {took:.2?} |",
                f[0],
                heap as f64 / keys as f64,
            );
        }
    }
    println!();
}
