//! What the contended benchmarks print beside their figures: the CPU time of the worker
//! threads, and the one-way latency of a cache line between the two cores (this VM's two
//! vCPUs are sometimes placed near each other, about 40 ns, and sometimes far apart, about
//! 170 ns: see BENCHMARKS.md, "What the slow mode is").

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// CPU time so far of every thread of the process but the main one (which only waits for the
/// tasks, and reads these files), from `/proc/self/task/*/schedstat`, whose first field is
/// nanoseconds on a CPU. `None` where that is not available.
pub fn workers_cpu() -> Option<Duration> {
    let main = std::process::id().to_string();
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let task = task.ok()?;
        if task.file_name().to_str() == Some(main.as_str()) {
            continue;
        }
        // A thread may end between the listing and the read.
        let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        total += text.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(total))
}

/// A word on a 128-byte line of its own.
#[repr(align(128))]
pub struct Padded(pub AtomicU64);

/// The one-way latency of a cache line between two threads, in ns: two threads hand a word
/// back and forth (each waits, spinning, for the other's value and writes the next), 40
/// batches of 100 round trips, and the fastest batch counts (a batch the scheduler interrupted
/// is slower, not faster). `None` if the two threads did not run at once within 20 ms.
pub fn line_latency() -> Option<f64> {
    const BATCH: u64 = 100;
    const ROUNDS: u64 = 2 * BATCH * 40;
    let word = Padded(AtomicU64::new(0));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let w = &word.0;
    let start = Instant::now();
    let give_up = Duration::from_millis(20);
    let mut best: Option<f64> = None;
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut v = 1;
            while v < ROUNDS {
                while w.load(Ordering::Acquire) != v {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    std::hint::spin_loop();
                }
                w.store(v + 1, Ordering::Release);
                v += 2;
            }
        });
        let mut v = 0;
        let mut batch = Instant::now();
        while v < ROUNDS {
            while w.load(Ordering::Acquire) != v {
                if start.elapsed() > give_up {
                    stop.store(true, Ordering::Relaxed);
                    return;
                }
                std::hint::spin_loop();
            }
            w.store(v + 1, Ordering::Release);
            v += 2;
            if v % (2 * BATCH) == 0 {
                let one_way = batch.elapsed().as_nanos() as f64 / (2 * BATCH) as f64;
                best = Some(best.map_or(one_way, |b: f64| b.min(one_way)));
                batch = Instant::now();
            }
        }
    });
    best
}

/// A line latency at or above this is the far placement of the two vCPUs (about 170 ns here,
/// against about 40 ns near).
pub const FAR_LINE: f64 = 90.0;

pub fn describe_line(before: Option<f64>, after: Option<f64>) -> String {
    let show = |l: Option<f64>| l.map_or("?".to_owned(), |l| format!("{l:.0}"));
    let far = [before, after].iter().flatten().any(|&l| l >= FAR_LINE);
    format!(
        "line {}/{} ns one way before/after{}",
        show(before),
        show(after),
        if far { ", far" } else { "" }
    )
}
