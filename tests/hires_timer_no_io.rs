//! Linux, a runtime without its IO driver: tokio's `AsyncFd` would panic there, so the
//! thread's timerfd cannot be had and `precise()` must fall back to yielding, deliver every
//! item in order, and keep the pacing bound. Its own test binary: the fallback is remembered
//! for the whole process.
#![cfg(target_os = "linux")]

use std::time::{Duration, Instant};

use futures_util::{stream, StreamExt};
use paced::{PaceExt, Rate, Shaping};

#[test]
fn a_runtime_without_io_falls_back_to_yielding() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    let items = 200u64;
    let (start, out): (Instant, Vec<(u64, Instant)>) = rt.block_on(async {
        let start = Instant::now();
        let out = stream::iter(0..items)
            .throttle(Rate::per_second(10_000), |_: &u64| 1, 1, Shaping)
            .precise()
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
}
