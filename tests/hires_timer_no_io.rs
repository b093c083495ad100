//! Linux, a runtime without its IO driver (`enable_time` alone): the timer thread needs
//! nothing of the runtime, so burst 1 at 10,000/s is still woken by it, delivers every item in
//! order, and keeps the pacing bound. A test binary of its own: the timer thread it watches is
//! the process's.
#![cfg(target_os = "linux")]

use std::time::{Duration, Instant};

use futures_util::{stream, StreamExt};
use paced::{PaceExt, Rate, Shaping};

#[test]
fn a_runtime_without_io_is_woken_by_the_timer_thread() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    let items = 200u64;
    let (start, out): (Instant, Vec<(u64, Instant)>) = rt.block_on(async {
        let start = Instant::now();
        let out = stream::iter(0..items)
            .throttle(Rate::per_second(10_000), |_: &u64| 1, 1, Shaping)
            .map(|i| (i, Instant::now()))
            .collect()
            .await;
        (start, out)
    });
    // Every item, once, in order.
    let order: Vec<u64> = out.iter().map(|&(i, _)| i).collect();
    assert_eq!(order, (0..items).collect::<Vec<_>>());
    // Never early, exactly: item k leaves at least k gaps of 100 µs after item 0 (burst 1),
    // which left no earlier than `start`; its instant is read after it left.
    let gap = Duration::from_micros(100);
    for &(k, at) in &out {
        let k = u32::try_from(k).expect("small");
        assert!(
            at.duration_since(start) >= gap * k,
            "item {k} at {:?}: before its time",
            at.duration_since(start)
        );
    }
    // The timer thread was started and woke the waits (its wake-ups show in /proc).
    let woke = std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|entry| entry.ok())
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|comm| comm.trim() == "paced-timer")
        })
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .filter_map(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|count| count.trim().parse::<u64>().ok())
        })
        .sum::<u64>();
    // Ten or more: more than the thread's first sleep, whatever the lead it learned.
    assert!(woke >= 10, "the timer thread woke {woke} times");
}
