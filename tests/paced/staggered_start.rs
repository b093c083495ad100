//! `staggered_start`: its scenarios and edge cases, under paused time.

use crate::common;

use std::time::Duration;

use common::{arriving, collect_timed, timeline};
use futures_util::stream;
use paced::PaceExt;
use tokio::time::{timeout, Instant};

#[tokio::test(start_paused = true)]
async fn two_per_second() {
    let start = Instant::now();
    let s = stream::iter(0..5).staggered_start(2, Duration::from_secs(1));
    let got = collect_timed(start, s).await;
    assert_eq!(timeline(&got), "0ms:0 0ms:1 1000ms:2 1000ms:3 2000ms:4");
}

#[tokio::test(start_paused = true)]
async fn three_per_second() {
    let start = Instant::now();
    let s = stream::iter(0..7).staggered_start(3, Duration::from_secs(1));
    let got = collect_timed(start, s).await;
    assert_eq!(
        timeline(&got),
        "0ms:0 0ms:1 0ms:2 1000ms:3 1000ms:4 1000ms:5 2000ms:6"
    );
}

#[tokio::test(start_paused = true)]
async fn a_permit_comes_back_period_after_it_was_taken() {
    // Sliding, not fixed windows: item 2 waits for item 0's permit (taken at 0 ms), item 3
    // for item 1's (taken at 600 ms).
    let start = Instant::now();
    let schedule = [(0, 0), (600, 1), (700, 2), (800, 3)];
    let s = arriving(start, &schedule).staggered_start(2, Duration::from_secs(1));
    let got = collect_timed(start, s).await;
    assert_eq!(timeline(&got), "0ms:0 600ms:1 1000ms:2 1600ms:3");
}

#[tokio::test(start_paused = true)]
async fn zero_period_passes_everything_through() {
    let start = Instant::now();
    let got = collect_timed(
        start,
        stream::iter(0..50).staggered_start(1, Duration::ZERO),
    )
    .await;
    assert_eq!(got.len(), 50);
    assert!(got.iter().all(|&(_, at)| at == 0));
}

#[tokio::test(start_paused = true)]
async fn max_period_waits_forever_without_panicking() {
    let s = stream::iter([1, 2]).staggered_start(1, Duration::MAX);
    let mut s = std::pin::pin!(s);
    assert_eq!(futures_util::StreamExt::next(&mut s).await, Some(1));
    let second = timeout(
        Duration::from_secs(86_400 * 365 * 100),
        futures_util::StreamExt::next(&mut s),
    );
    assert!(second.await.is_err());
}

#[tokio::test(start_paused = true)]
async fn huge_k_does_not_preallocate() {
    let start = Instant::now();
    let s = stream::iter(0..1000).staggered_start(usize::MAX, Duration::from_secs(1));
    let got = collect_timed(start, s).await;
    assert_eq!(got.len(), 1000);
    assert!(got.iter().all(|&(_, at)| at == 0));
}

#[test]
#[should_panic(expected = "PaceExt::staggered_start: invalid stagger: `k` is 0")]
fn zero_k_panics_at_construction() {
    let _ = stream::iter([1]).staggered_start(0, Duration::from_secs(1));
}
