//! Soak of the keyed limiter under a steady load: does memory stay flat, and
//! does RSS stay near the live heap, when keys come and go for minutes?
//!
//! `TASKS` tasks on a multi-thread tokio runtime with 2 workers share one
//! `paced::KeyedRateLimiter<u64>` (std's default hasher). Each task loops: a key drawn uniformly
//! at random from `0..keys` (a xorshift generator per task), then
//! `acquire_timeout(&key, 1, timeout)`, granted at once, granted after a wait, or refused at
//! once because its wait would exceed the timeout. A refused task then sleeps for the timeout,
//! as a caller that had waited that long and given up would: without it, a refusal costs
//! nothing, refused tasks spin, and the refused share flips between a few % and over 90 % from
//! one run to the next. A granted task goes on with `tokio::task::coop::consume_budget()`, so
//! that one whose keys never make it wait still yields to the others (and to the timer), as a
//! task doing real I/O would. The quota is the same for every key (`RATE` per second, a burst
//! of `BURST`); the timeout, by key count (`default_timeout`), is tuned so that about 15 % of
//! the acquisitions are refused (the measured share is printed, from `stats()`).
//!
//! Every 10 s one row: grants per second and the refused share over those 10 s, the keys the
//! limiter tracks (`tracked_keys()`, which also forgets every full key: called at these marks
//! only), the live heap (exact, from a counting `#[global_allocator]`: everything the process
//! holds, runtime and tasks included), the RSS (`/proc/self/statm`, resident pages × 4 KiB), and
//! RSS / live heap, and the same with the RSS the process had before the runtime and the
//! limiter were made left out (the binary's and its libraries' own resident pages, about
//! 2.5 MB: at 10,000 keys, more than the live heap). Then a summary: the largest live heap and
//! RSS, the largest of both ratios after the first 10 s (the rows from 20 s on), whether the
//! live heap at the end is within 10 % of its value at 60 s, and the live heap left once the
//! tasks, the limiter and the runtime are dropped, net of the reading before they were made
//! (40 B with tokio 1.54: an allocation tokio makes once per process, which a runtime built
//! and dropped before that reading takes instead).
//!
//! Without `PACED_SOAK_KEYS`, the binary runs itself once per key count of `KEY_COUNTS`, each in
//! its own child process (so that neither inherits the other's freed memory).
//!
//! Run: `cargo bench -p paced-benches --bench keyed_soak` (3 minutes per key count). Environment:
//! `PACED_SOAK_SECS` (default 180), `PACED_SOAK_KEYS` (one key count, in this process),
//! `PACED_SOAK_RATE`, `PACED_SOAK_BURST`, `PACED_SOAK_TIMEOUT_MS` (the quota and timeout).

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paced::{KeyedRateLimiter, Rate};

#[path = "common/counting.rs"]
mod counting;

use counting::{Counting, LIVE};

#[global_allocator]
static GLOBAL: Counting = Counting;

const PAGE: usize = 4096;
const TASKS: u64 = 1_000;
const WORKERS: usize = 2;
const KEY_COUNTS: [u64; 2] = [10_000, 100_000];
/// Per key: `RATE` per second with a burst of `BURST`.
const RATE: u64 = 10;
const BURST: u64 = 5;
/// The longest an acquisition may wait before it is refused, by key count: tuned by hand so
/// that about 15 % of the acquisitions are refused with this quota, 1,000 tasks and 2 workers.
/// At 10,000 keys the quota allows 100,000 grants per second in all and the tasks ask for more;
/// at 100,000 keys it allows 1,000,000, and the tasks, bound by their waits and their sleeps
/// after a refusal more than by the CPU (about half a core of the two), ask for a little more:
/// a shorter timeout for as many refusals.
fn default_timeout(keys: u64) -> Duration {
    if keys <= 10_000 {
        Duration::from_millis(40)
    } else {
        Duration::from_millis(4)
    }
}
/// One row every `TICK`.
const TICK: Duration = Duration::from_secs(10);
/// The reading the end is compared with.
const FLAT_FROM: Duration = Duration::from_secs(60);

/// Resident set size in bytes, from `/proc/self/statm` (0 where it does not exist).
fn rss() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
        .map_or(0, |pages| pages * PAGE)
}

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a valid value")),
    )
}

/// xorshift64* (Vigna): enough to spread keys uniformly, no dependency.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> XorShift {
        // splitmix64 of the seed: distinct, non-zero states for consecutive seeds.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        XorShift((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (multiply-high: no modulo bias worth the name at these sizes).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

/// One row, taken at a mark.
#[derive(Clone, Copy)]
struct Row {
    at: Duration,
    grants_per_sec: f64,
    refused_pct: f64,
    tracked: usize,
    live: usize,
    rss: usize,
}

impl Row {
    fn ratio(&self) -> f64 {
        self.rss as f64 / self.live as f64
    }

    /// The RSS gained since the start (the binary's own pages left out), over the live heap.
    fn grown_ratio(&self, rss_before: usize) -> f64 {
        self.rss.saturating_sub(rss_before) as f64 / self.live as f64
    }
}

fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn soak(keys: u64, secs: u64) {
    let rate: u64 = env("PACED_SOAK_RATE").unwrap_or(RATE);
    let burst: u64 = env("PACED_SOAK_BURST").unwrap_or(BURST);
    let timeout = env("PACED_SOAK_TIMEOUT_MS").map_or(default_timeout(keys), Duration::from_millis);
    let run = Duration::from_secs(secs);

    println!();
    println!(
        "Keyed soak: {TASKS} tasks on {WORKERS} workers, `acquire_timeout(key, 1, {timeout:?})` \
         over {keys} u64 keys drawn uniformly (a refused task sleeps {timeout:?} before its next \
         key), quota {rate}/s with a burst of {burst} per key, {secs} s. Live heap = every live \
         byte of the process (counting allocator); RSS from /proc/self/statm."
    );
    println!();
    println!(
        "| elapsed | grants/s | refused | tracked keys | live heap (B) | RSS (B) | RSS / live | \
         (RSS − RSS at start) / live |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");

    let (before, rss_before) = (live(), rss());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_time()
        .build()
        .expect("multi-thread runtime");
    let limiter = KeyedRateLimiter::<u64>::new(Rate::per_second(rate), burst);
    let stop = Arc::new(AtomicBool::new(false));

    let rows = rt.block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let limiter = limiter.clone();
                let stop = stop.clone();
                tokio::spawn(async move {
                    let mut rng = XorShift::new(t);
                    while !stop.load(Ordering::Relaxed) {
                        let key = rng.below(keys);
                        if limiter.acquire_timeout(&key, 1, timeout).await.is_err() {
                            // Refused at once: the caller gives up after the timeout, as if
                            // it had waited for it.
                            tokio::time::sleep(timeout).await;
                        } else {
                            tokio::task::coop::consume_budget().await;
                        }
                    }
                })
            })
            .collect();

        // This future runs on the main thread (`block_on`), beside the two workers.
        let start = Instant::now();
        let mut last = (start, limiter.stats());
        let mut rows = Vec::new();
        let mut mark = Duration::ZERO;
        while mark < run {
            mark = (mark + TICK).min(run);
            tokio::time::sleep_until(tokio::time::Instant::from_std(start + mark)).await;
            let now = Instant::now();
            let stats = limiter.stats();
            let tracked = limiter.tracked_keys();
            let (granted, rejected) = (
                stats.granted - last.1.granted,
                stats.rejected - last.1.rejected,
            );
            let row = Row {
                at: now - start,
                grants_per_sec: granted as f64 / (now - last.0).as_secs_f64(),
                refused_pct: 100.0 * rejected as f64 / (granted + rejected).max(1) as f64,
                tracked,
                live: live(),
                rss: rss(),
            };
            println!(
                "| {:.0} s | {:.0} | {:.1} % | {} | {} | {} | {:.2} | {:.2} |",
                row.at.as_secs_f64(),
                row.grants_per_sec,
                row.refused_pct,
                row.tracked,
                row.live,
                row.rss,
                row.ratio(),
                row.grown_ratio(rss_before)
            );
            rows.push(row);
            last = (now, stats);
        }

        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            task.await.expect("a soak task panicked");
        }
        let stats = limiter.stats();
        (rows, stats)
    });
    let (rows, total) = rows;
    drop(limiter);
    drop(rt);
    drop(stop);

    let max_live = rows.iter().map(|r| r.live).max().unwrap_or(0);
    let max_rss = rows.iter().map(|r| r.rss).max().unwrap_or(0);
    let max_ratio = rows
        .iter()
        .filter(|r| r.at > TICK + TICK / 2)
        .map(Row::ratio)
        .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))));
    let max_grown = rows
        .iter()
        .filter(|r| r.at > TICK + TICK / 2)
        .map(|r| r.grown_ratio(rss_before))
        .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))));
    let at_60 = rows.iter().find(|r| r.at >= FLAT_FROM - TICK / 2).copied();
    let end = rows.last().copied();
    // The rows too are heap: gone before the last reading.
    drop(rows);
    let left = live() as isize - before as isize;

    let flat = match (at_60, end) {
        (Some(a), Some(e)) if e.at > a.at => {
            let change = 100.0 * (e.live as f64 - a.live as f64) / a.live as f64;
            format!(
                "{} ({} at {:.0} s → {} at {:.0} s, {change:+.1} %)",
                if change.abs() <= 10.0 { "yes" } else { "no" },
                a.live,
                a.at.as_secs_f64(),
                e.live,
                e.at.as_secs_f64()
            )
        }
        _ => "n/a (run not past 60 s)".to_owned(),
    };
    let all = total.granted + total.rejected;
    println!();
    println!("| {keys} keys, {secs} s | |");
    println!("|---|---:|");
    println!(
        "| acquisitions (granted + refused) | {all} ({:.0}/s) |",
        all as f64 / run.as_secs_f64()
    );
    println!(
        "| granted | {} ({:.0}/s) |",
        total.granted,
        total.granted as f64 / run.as_secs_f64()
    );
    println!(
        "| refused by the timeout | {} ({:.1} %) |",
        total.rejected,
        100.0 * total.rejected as f64 / all.max(1) as f64
    );
    println!("| max live heap (B) | {max_live} ({}) |", mib(max_live));
    println!("| max RSS (B) | {max_rss} ({}) |", mib(max_rss));
    println!(
        "| max RSS / live heap, from 20 s on | {} |",
        max_ratio.map_or("n/a".to_owned(), |r| format!("{r:.2}"))
    );
    println!(
        "| max (RSS − RSS at start) / live heap, from 20 s on | {} |",
        max_grown.map_or("n/a".to_owned(), |r| format!("{r:.2}"))
    );
    println!("| live heap at the end within 10 % of 60 s | {flat} |");
    println!(
        "| before the runtime and the limiter: live heap, RSS (B) | {before} ({}), \
         {rss_before} ({}) |",
        mib(before),
        mib(rss_before)
    );
    println!("| live heap after everything is dropped, net of before (B) | {left} |");
    println!();
}

fn main() {
    let secs: u64 = env("PACED_SOAK_SECS").unwrap_or(180);

    // One key count: run it here.
    if let Some(keys) = env::<u64>("PACED_SOAK_KEYS") {
        soak(keys, secs);
        return;
    }

    // Parent: criterion-style arguments are ignored; one child per key count, its output
    // passed through as it comes.
    let exe = std::env::current_exe().expect("path of this benchmark");
    for keys in KEY_COUNTS {
        let status = Command::new(&exe)
            .env("PACED_SOAK_KEYS", keys.to_string())
            .env("PACED_SOAK_SECS", secs.to_string())
            .status()
            .expect("run a child process");
        assert!(status.success(), "the soak at {keys} keys failed: {status}");
    }
}
