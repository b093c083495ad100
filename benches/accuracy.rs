//! Achieved against configured rate, in real time, for an always-ready source: paced's
//! `throttle` (Shaping) and the peers, side by side in one run.
//!
//! For each rate in 1,000 / 10,000 / 100,000 / 1,000,000 items/s, with `burst = rate × 2 ms`
//! (at least 1), each limiter drains `stream::repeat(())` for a fixed wall time (1 s, or
//! `PACED_BENCH_SECS`) on its own current-thread runtime, and every emission time is recorded
//! with `std::time::Instant` into a preallocated `Vec`. Reported per run:
//!
//! - **steady rate**: `(count - burst) / (last - first)`: the items beyond the initial burst
//!   over the time between the first and the last emission. A limiter that honours
//!   "at most `burst + rate × t` in any `t`" and keeps up gets a ratio of 1.00.
//! - **max in 10 ms**: the most emissions in any closed window `[t, t + 10 ms]`, against the
//!   bound `burst + rate × 10 ms`. Times are read by the consumer right after each item, which
//!   can shift an emission towards the next one but never earlier: one item above the bound
//!   can be measurement, more cannot.
//! - **CPU**: user + system time of the whole process (every thread) over wall time, at 10 ms
//!   resolution.
//!
//! Peers, with the same rate and burst where they have one:
//! - governor `ratelimit_stream` on `Quota::per_second(rate).allow_burst(burst)` (its timer is
//!   futures-timer's own thread, its clock quanta);
//! - leaky-bucket, `max(burst).initial(burst).refill(rate / 1000).interval(1 ms)` (1 ms is its
//!   smallest interval), one `acquire_one()` per item;
//! - tokio-stream `throttle(1 s / rate)`: no burst (one item per timer wake-up), shown with
//!   burst 1.
//!
//! One extra row runs paced at 1,000/s with a burst of 3 (one token above `rate × 2 ms`).
//!
//! Sub-millisecond rows: 10,000/s and 100,000/s with a burst of 1, `throttle` and
//! `min_interval(100 µs / 10 µs)`, plain and with `precise()`, beside governor and leaky-bucket
//! with a burst of 1 (`PACED_BENCH_ONLY=sub-ms` runs only these). On Linux both are woken by
//! paced's timer thread; elsewhere `precise()` yields through its waits. The table's last column is the process's CPU time per item emitted.
//!
//! `PACED_BENCH_VERBOSE=1` adds a table of timer wake-ups: emissions more than 200 µs after
//! the previous one start a new wake-up; percentiles of the intervals between wake-ups.
//!
//! **Burst 1** (`PACED_BENCH_ONLY=burst-1` runs only this): every entry point one item at a
//! time at 100, 250, 400, 500, 700 and 1,000/s (`throttle` and `min_interval`, plain and
//! `precise()`, `RateLimiter::acquire(1)`, `KeyedRateLimiter::acquire` and `throttle_by_key` on
//! one key, `RateLimiter::acquire` with a burst-1 limit), beside governor's `until_ready`
//! (`Quota::per_second(rate).allow_burst(1)`) and tokio-stream's `throttle(1 s / rate)`; then
//! `precise()` at 1,500 to 10,000/s beside governor. Reported: `(count - 1) / (last - first)`
//! over the rate asked, and the CPU time of every thread of the process (`schedstat`, in
//! nanoseconds; governor's timer thread included) per item.
//!
//! Run: `cargo bench -p paced-benches --bench accuracy` (about 109 × `PACED_BENCH_SECS` seconds).

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::pin;
use std::time::{Duration, Instant};

use futures_util::{Stream, StreamExt};
use governor::prelude::StreamRateLimitExt;
use governor::{Quota, RateLimiter};
use paced::{PaceExt, Rate, Shaping};

const RATES: [u64; 4] = [1_000, 10_000, 100_000, 1_000_000];
const WINDOW: Duration = Duration::from_millis(10);

struct Row {
    limiter: &'static str,
    rate: u64,
    burst: u64,
    /// Emission times in nanoseconds since the run started.
    times: Vec<u64>,
    /// The limiter stalled: no emission after the run's end time.
    timed_out: bool,
    /// Process CPU time (all threads) during the run, as a fraction of its wall time.
    cpu: f64,
    /// Process CPU time (all threads) during the run, in seconds.
    cpu_seconds: f64,
}

/// Drains `stream` for `secs` of wall time, recording each emission's time.
async fn drive<S: Stream>(stream: S, secs: Duration, capacity: usize) -> (Vec<u64>, bool) {
    let mut times = Vec::with_capacity(capacity);
    let end = u64::try_from(secs.as_nanos()).expect("run length fits in u64 ns");
    let run = async {
        let mut s = pin!(stream);
        let start = Instant::now();
        while s.next().await.is_some() {
            let t = u64::try_from(start.elapsed().as_nanos()).expect("fits");
            times.push(t);
            if t >= end {
                break;
            }
        }
    };
    // A limiter that stalls must not hang the benchmark.
    let timed_out = tokio::time::timeout(secs + Duration::from_secs(1), run)
        .await
        .is_err();
    (times, timed_out)
}

/// User + system CPU time of the whole process (every thread), from `/proc/self/stat`, in
/// seconds at clock-tick (10 ms) resolution; 0 where that file does not exist.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// A fresh current-thread runtime with IO and time, as `#[tokio::main]` builds.
fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("current-thread runtime")
}

/// Runs one limiter on a fresh current-thread runtime and records its row.
fn run<F>(limiter: &'static str, rate: u64, burst: u64, drive: F) -> Row
where
    F: Future<Output = (Vec<u64>, bool)>,
{
    let rt = current_thread();
    let cpu = cpu_seconds();
    let wall = Instant::now();
    let (times, timed_out) = rt.block_on(drive);
    let cpu_seconds = cpu_seconds() - cpu;
    let cpu = cpu_seconds / wall.elapsed().as_secs_f64();
    Row {
        limiter,
        rate,
        burst,
        times,
        timed_out,
        cpu,
        cpu_seconds,
    }
}

/// The most emissions in any closed window `[t, t + w]`.
fn max_in_window(times: &[u64], w: Duration) -> usize {
    let w = u64::try_from(w.as_nanos()).expect("fits");
    let mut best = 0;
    let mut hi = 0;
    for (lo, &t) in times.iter().enumerate() {
        while hi < times.len() && times[hi] <= t + w {
            hi += 1;
        }
        best = best.max(hi - lo);
    }
    best
}

/// `(count - burst) / (last - first)`, in items per second.
fn steady_rate(times: &[u64], burst: u64) -> Option<f64> {
    let (&first, &last) = (times.first()?, times.last()?);
    let count = times.len() as u64;
    if count <= burst || last <= first {
        return None;
    }
    Some((count - burst) as f64 / ((last - first) as f64 / 1e9))
}

fn main() {
    // Criterion-style arguments (`--bench`, filters) are passed to every bench; ignore them.
    let secs: f64 = std::env::var("PACED_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let secs = Duration::from_secs_f64(secs.max(0.05));

    let mut rows = Vec::new();
    // (rate, burst, paced only): the burst asked for, rate × 2 ms, and for 1,000/s one token
    // more, to show what the timer's rounding costs there.
    let configs = RATES
        .iter()
        .map(|&rate| (rate, (rate * 2 / 1_000).max(1), false))
        .chain([(1_000, 3, true)]);
    // `PACED_BENCH_ONLY=sub-ms` runs only the sub-millisecond rows below.
    let only = std::env::var("PACED_BENCH_ONLY").unwrap_or_default();
    if only == "burst-1" {
        burst_one(secs);
        return;
    }
    let only_sub_ms = only == "sub-ms";
    let configs = configs.filter(|_| !only_sub_ms);
    for (rate, burst, paced_only) in configs {
        let capacity = (rate as f64 * secs.as_secs_f64() * 1.25) as usize + burst as usize + 4096;
        let rate32 = NonZeroU32::new(u32::try_from(rate).expect("rate fits in u32")).expect("> 0");
        let burst32 = NonZeroU32::new(u32::try_from(burst).expect("fits")).expect("> 0");

        rows.push(run("paced throttle (Shaping)", rate, burst, async {
            let stream = PaceExt::throttle(
                futures_util::stream::repeat(()),
                Rate::per_second(rate),
                |_| 1,
                burst,
                Shaping,
            );
            drive(stream, secs, capacity).await
        }));
        if paced_only {
            continue;
        }

        let limiter = RateLimiter::direct(Quota::per_second(rate32).allow_burst(burst32));
        rows.push(run("governor ratelimit_stream", rate, burst, async {
            let stream = futures_util::stream::repeat(()).ratelimit_stream(&limiter);
            drive(stream, secs, capacity).await
        }));

        rows.push(run("leaky-bucket acquire_one", rate, burst, async {
            let bucket = leaky_bucket::RateLimiter::builder()
                .max(burst as usize)
                .initial(burst as usize)
                .refill((rate / 1_000).max(1) as usize)
                .interval(Duration::from_millis(1))
                .build();
            let stream = futures_util::stream::repeat(()).then(|()| bucket.acquire_one());
            drive(stream, secs, capacity).await
        }));

        rows.push(run("tokio-stream throttle", rate, 1, async {
            let stream = tokio_stream::StreamExt::throttle(
                futures_util::stream::repeat(()),
                Duration::from_nanos(1_000_000_000 / rate),
            );
            drive(stream, secs, capacity).await
        }));
    }

    sub_millisecond(&mut rows, secs);

    println!();
    println!(
        "Accuracy: always-ready source, real time, {:.2} s per run, a current-thread runtime per run.",
        secs.as_secs_f64()
    );
    println!("steady rate = (count - burst) / (last - first); bound = burst + rate x 10 ms.");
    println!();
    println!(
        "| limiter | rate/s | burst | items | steady rate/s | steady / rate \
         | max in 10 ms | bound | max / bound | CPU | CPU us/item |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in &rows {
        let steady = steady_rate(&row.times, row.burst);
        let max10 = max_in_window(&row.times, WINDOW);
        let bound = row.burst as f64 + row.rate as f64 * WINDOW.as_secs_f64();
        let over = if max10 as f64 > bound + 1.0 {
            " OVER"
        } else {
            ""
        };
        println!(
            "| {}{} | {} | {} | {} | {} | {} | {} | {} | {:.3}{} | {:.0}% | {:.1} |",
            row.limiter,
            if row.timed_out { " (stalled)" } else { "" },
            row.rate,
            row.burst,
            row.times.len(),
            steady.map_or("-".to_string(), |s| format!("{s:.0}")),
            steady.map_or("-".to_string(), |s| format!("{:.3}", s / row.rate as f64)),
            max10,
            bound,
            max10 as f64 / bound,
            over,
            row.cpu * 100.0,
            row.cpu_seconds * 1e6 / row.times.len().max(1) as f64,
        );
    }
    println!();

    if std::env::var_os("PACED_BENCH_VERBOSE").is_some() {
        print_wake_ups(&rows, secs);
    }
    if !only_sub_ms {
        burst_one(secs);
    }
}

/// The rates of the burst-1 table: whole milliseconds and not (2.5 ms, 1.43 ms).
const BURST_ONE_RATES: [u64; 6] = [100, 250, 400, 500, 700, 1_000];
/// The rates of the `precise()` table, above 1,000/s: intervals of 667, 400, 250, 143 and
/// 100 µs.
const PRECISE_RATES: [u64; 5] = [1_500, 2_500, 4_000, 7_000, 10_000];

/// One burst-1 run: items per second over the rate asked, and CPU per item.
struct Kept {
    entry: &'static str,
    rate: u64,
    ratio: Option<f64>,
    cpu_us: f64,
    stalled: bool,
}

/// CPU time so far of every thread of the process (the runtime's, futures-timer's), in
/// nanoseconds, from `/proc/self/task/*/schedstat`; 0 where that is not available.
fn process_cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|task| {
            let text = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            text.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// Runs `f` on a fresh current-thread runtime (IO and time enabled, as `#[tokio::main]`) and
/// measures the rate it kept against `rate`, at burst 1: `(count - 1) / (last - first)`.
fn keep<F>(entry: &'static str, rate: u64, interval: Duration, f: F) -> Kept
where
    F: Future<Output = (Vec<u64>, bool)>,
{
    let rt = current_thread();
    let cpu = process_cpu_ns();
    let (times, stalled) = rt.block_on(f);
    let cpu = process_cpu_ns().saturating_sub(cpu);
    let ratio = match (times.first(), times.last()) {
        (Some(&first), Some(&last)) if last > first && times.len() > 1 => {
            let kept = (times.len() - 1) as f64 / ((last - first) as f64 / 1e9);
            Some(kept * interval.as_secs_f64())
        }
        _ => None,
    };
    Kept {
        entry,
        rate,
        ratio,
        cpu_us: cpu as f64 / 1e3 / times.len().max(1) as f64,
        stalled,
    }
}

/// Calls `next` for `secs` of wall time, one call at a time, recording the time each call
/// returned.
async fn drive_calls<F, Fut>(next: F, secs: Duration, capacity: usize) -> (Vec<u64>, bool)
where
    F: FnMut(()) -> Fut,
    Fut: Future,
{
    drive(futures_util::stream::repeat(()).then(next), secs, capacity).await
}

/// The entry points of the burst-1 tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    Throttle,
    ThrottlePrecise,
    MinInterval,
    MinIntervalPrecise,
    Acquire,
    KeyedAcquire,
    ThrottleByKey,
    MultiAcquire,
    Governor,
    TokioStream,
}

impl Entry {
    const EVERY: [Entry; 10] = [
        Entry::Throttle,
        Entry::ThrottlePrecise,
        Entry::MinInterval,
        Entry::MinIntervalPrecise,
        Entry::Acquire,
        Entry::KeyedAcquire,
        Entry::ThrottleByKey,
        Entry::MultiAcquire,
        Entry::Governor,
        Entry::TokioStream,
    ];
    /// Above 1,000/s: what `precise()` is for, the default beside it, and governor.
    const SUB_MS: [Entry; 4] = [
        Entry::Throttle,
        Entry::ThrottlePrecise,
        Entry::MinIntervalPrecise,
        Entry::Governor,
    ];

    fn name(self) -> &'static str {
        match self {
            Entry::Throttle => "paced throttle",
            Entry::ThrottlePrecise => "paced throttle .precise()",
            Entry::MinInterval => "paced min_interval",
            Entry::MinIntervalPrecise => "paced min_interval .precise()",
            Entry::Acquire => "paced RateLimiter::acquire",
            Entry::KeyedAcquire => "paced KeyedRateLimiter::acquire",
            Entry::ThrottleByKey => "paced throttle_by_key",
            Entry::MultiAcquire => "paced RateLimiter<[u64; 2]>::acquire",
            Entry::Governor => "governor until_ready",
            Entry::TokioStream => "tokio-stream throttle",
        }
    }

    /// One run at `rate`, burst 1.
    fn run(self, rate: u64, secs: Duration) -> Kept {
        use paced::{KeyedRateLimiter, Limit, RateLimiter};

        let repeat = futures_util::stream::repeat;
        let capacity = (rate as f64 * secs.as_secs_f64() * 1.25) as usize + 64;
        let paced_rate = Rate::per_second(rate);
        // `min_interval` and tokio-stream take a whole number of nanoseconds.
        let gap = Duration::from_nanos(1_000_000_000 / rate);
        let per_item = match self {
            Entry::MinInterval | Entry::MinIntervalPrecise | Entry::TokioStream => gap,
            _ => Duration::from_secs(1) / u32::try_from(rate).expect("fits"),
        };
        let throttle = || PaceExt::throttle(repeat(()), paced_rate, |_| 1, 1, Shaping);
        let keyed = || KeyedRateLimiter::<u32>::new(paced_rate, 1);
        keep(self.name(), rate, per_item, async {
            match self {
                Entry::Throttle => drive(throttle(), secs, capacity).await,
                Entry::ThrottlePrecise => drive(throttle().precise(), secs, capacity).await,
                Entry::MinInterval => drive(repeat(()).min_interval(gap), secs, capacity).await,
                Entry::MinIntervalPrecise => {
                    drive(repeat(()).min_interval(gap).precise(), secs, capacity).await
                }
                Entry::Acquire => {
                    let limiter = paced::RateLimiter::new(paced_rate, 1);
                    drive_calls(|()| limiter.acquire(1), secs, capacity).await
                }
                Entry::KeyedAcquire => {
                    let limiter = keyed();
                    drive_calls(|()| limiter.acquire(&7, 1), secs, capacity).await
                }
                Entry::ThrottleByKey => {
                    let limiter = keyed();
                    let s = repeat(()).throttle_by_key(&limiter, |_| 7, |_| 1, 64);
                    drive(s, secs, capacity).await
                }
                Entry::MultiAcquire => {
                    // Requests at burst 1 bind; tokens (100 a request, plenty) do not.
                    let limiter = RateLimiter::builder(["requests", "tokens"])
                        .limit("requests", Limit::bucket(paced_rate, 1))
                        .limit(
                            "tokens",
                            Limit::bucket(Rate::per_second(rate * 1_000), rate * 100),
                        )
                        .build()
                        .expect("limits");
                    drive_calls(|()| limiter.acquire([1, 100]), secs, capacity).await
                }
                Entry::Governor => {
                    let rate = NonZeroU32::new(u32::try_from(rate).expect("fits")).expect("> 0");
                    let quota = Quota::per_second(rate).allow_burst(NonZeroU32::MIN);
                    let limiter = governor::RateLimiter::direct(quota);
                    drive_calls(|()| limiter.until_ready(), secs, capacity).await
                }
                Entry::TokioStream => {
                    let s = tokio_stream::StreamExt::throttle(repeat(()), gap);
                    drive(s, secs, capacity).await
                }
            }
        })
    }
}

/// Every entry point at burst 1, one item at a time, beside governor's `until_ready` and
/// tokio-stream's `throttle`, at everyday rates; then `precise()` above 1,000/s.
fn burst_one(secs: Duration) {
    let mut kept = Vec::new();
    for &rate in &BURST_ONE_RATES {
        kept.extend(Entry::EVERY.iter().map(|entry| entry.run(rate, secs)));
    }
    for &rate in &PRECISE_RATES {
        kept.extend(Entry::SUB_MS.iter().map(|entry| entry.run(rate, secs)));
    }
    print_kept(&kept, secs);
}

/// The burst-1 runs as two tables, an entry point a row and a rate a column: the rate kept,
/// then CPU per item.
fn print_kept(kept: &[Kept], secs: Duration) {
    println!(
        "Burst 1: items per second kept over the rate asked ({:.2} s per run, real time, a \
         current-thread runtime per run); then CPU per item (us, every thread of the process).",
        secs.as_secs_f64()
    );
    for rates in [&BURST_ONE_RATES[..], &PRECISE_RATES[..]] {
        let mut entries: Vec<&'static str> = Vec::new();
        for k in kept.iter().filter(|k| rates.contains(&k.rate)) {
            if !entries.contains(&k.entry) {
                entries.push(k.entry);
            }
        }
        for cpu in [false, true] {
            println!();
            let head: Vec<String> = rates.iter().map(|r| format!("{r}/s")).collect();
            let what = if cpu { "CPU us/item" } else { "kept / asked" };
            println!("| {what} | {} |", head.join(" | "));
            println!("|---|{}", "---:|".repeat(rates.len()));
            for entry in &entries {
                let cells: Vec<String> = rates
                    .iter()
                    .map(|&rate| {
                        let Some(k) = kept.iter().find(|k| k.entry == *entry && k.rate == rate)
                        else {
                            return "-".to_string();
                        };
                        let stalled = if k.stalled { " (stalled)" } else { "" };
                        if cpu {
                            format!("{:.1}{stalled}", k.cpu_us)
                        } else {
                            k.ratio
                                .map_or("-".to_string(), |r| format!("{r:.3}{stalled}"))
                        }
                    })
                    .collect();
                println!("| {entry} | {} |", cells.join(" | "));
            }
        }
    }
    println!();
}

/// Even pacing below tokio's 1 ms tick: 10,000/s and 100,000/s with a burst of 1 (every item
/// 100 µs or 10 µs after the previous one), `throttle` and `min_interval`, plain and
/// `precise()`, beside governor and leaky-bucket with a burst of 1. On Linux both wait on paced's
/// timer thread; elsewhere `precise()` yields.
fn sub_millisecond(rows: &mut Vec<Row>, secs: Duration) {
    let precise = "precise()";
    let name = |what: &str| -> &'static str { Box::leak(what.to_string().into_boxed_str()) };
    for rate in [10_000u64, 100_000] {
        let capacity = (rate as f64 * secs.as_secs_f64() * 1.25) as usize + 4096;
        let gap = Duration::from_nanos(1_000_000_000 / rate);
        let repeat = || futures_util::stream::repeat(());
        rows.push(run("paced throttle, burst 1", rate, 1, async {
            let stream = PaceExt::throttle(repeat(), Rate::per_second(rate), |_| 1, 1, Shaping);
            drive(stream, secs, capacity).await
        }));
        rows.push(run(
            name(&format!("paced throttle, burst 1, {precise}")),
            rate,
            1,
            async {
                let stream = PaceExt::throttle(repeat(), Rate::per_second(rate), |_| 1, 1, Shaping)
                    .precise();
                drive(stream, secs, capacity).await
            },
        ));
        rows.push(run(
            name(&format!("paced min_interval({gap:?})")),
            rate,
            1,
            async { drive(repeat().min_interval(gap), secs, capacity).await },
        ));
        rows.push(run(
            name(&format!("paced min_interval({gap:?}), {precise}")),
            rate,
            1,
            async { drive(repeat().min_interval(gap).precise(), secs, capacity).await },
        ));
        let one = NonZeroU32::MIN;
        let rate32 = NonZeroU32::new(rate as u32).expect("> 0");
        let limiter = RateLimiter::direct(Quota::per_second(rate32).allow_burst(one));
        rows.push(run("governor ratelimit_stream, burst 1", rate, 1, async {
            drive(repeat().ratelimit_stream(&limiter), secs, capacity).await
        }));
        rows.push(run("leaky-bucket acquire_one, burst 1", rate, 1, async {
            let bucket = leaky_bucket::RateLimiter::builder()
                .max(1)
                .initial(1)
                .refill((rate / 1_000) as usize)
                .interval(Duration::from_millis(1))
                .build();
            drive(repeat().then(|()| bucket.acquire_one()), secs, capacity).await
        }));
    }
}

/// Emissions more than 200 µs after the previous one start a new wake-up.
fn print_wake_ups(rows: &[Row], secs: Duration) {
    println!("Timer wake-ups (an emission more than 200 us after the previous one starts one):");
    println!();
    println!("| limiter | rate/s | burst | wake-ups/s | p50 ms | p90 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let mut starts = Vec::new();
        let mut prev: Option<u64> = None;
        for &t in &row.times {
            if prev.is_none_or(|p| t - p > 200_000) {
                starts.push(t);
            }
            prev = Some(t);
        }
        let mut gaps: Vec<u64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
        gaps.sort_unstable();
        let pct = |p: f64| {
            let i = ((gaps.len() as f64 - 1.0) * p) as usize;
            gaps.get(i).map_or(0.0, |&g| g as f64 / 1e6)
        };
        println!(
            "| {} | {} | {} | {:.0} | {:.3} | {:.3} | {:.3} | {:.3} |",
            row.limiter,
            row.rate,
            row.burst,
            starts.len() as f64 / secs.as_secs_f64(),
            pct(0.5),
            pct(0.9),
            pct(0.99),
            pct(1.0),
        );
    }
    println!();
}
