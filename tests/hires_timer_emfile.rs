//! Linux: with no file descriptor left for the thread's timerfd, `precise()` falls back to
//! yielding.
//!
//! A binary of its own: it lowers the process's descriptor limit and fills the table, which
//! would starve any test running beside it.
#![cfg(target_os = "linux")]

use std::fs::File;
use std::pin::pin;
use std::time::{Duration, Instant};

use futures_util::{stream, StreamExt};
use paced::PaceExt;
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

#[test]
fn without_descriptors_precise_waits_yield_instead() {
    // The runtime's own descriptors (epoll, its waker) first.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let limit = getrlimit(Resource::Nofile);
    let open = std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count() as u64;
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(open + 16),
            maximum: limit.maximum,
        },
    )
    .expect("lower the descriptor limit");
    // Fill what is left, so that the timerfd cannot be created (EMFILE).
    let mut filler = Vec::new();
    while let Ok(file) = File::open("/dev/null") {
        filler.push(file);
    }
    assert!(File::open("/dev/null").is_err(), "the table is full");

    let n = 300u64;
    let gap = Duration::from_micros(100);
    let out = runtime.block_on(async {
        let mut s = pin!(stream::iter(0..n).min_interval(gap).precise());
        let mut out = Vec::new();
        let wait = async {
            while let Some(item) = s.next().await {
                out.push((item, Instant::now()));
            }
        };
        tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .expect("no stall");
        out
    });
    drop(filler);
    setrlimit(Resource::Nofile, limit).expect("restore the limit");

    let items: Vec<u64> = out.iter().map(|&(item, _)| item).collect();
    assert_eq!(items, (0..n).collect::<Vec<_>>());
    // Clock reads after each item: an item that left at its time can only be read later,
    // so consecutive reads are at least a gap apart only up to that read's delay; the total
    // over the run still cannot beat the schedule by more than the first read's delay.
    let first = out.first().expect("items").1;
    let last = out.last().expect("items").1;
    assert!(last.duration_since(first) + Duration::from_millis(1) >= gap * (n as u32 - 1));
}
