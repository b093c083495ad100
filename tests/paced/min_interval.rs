//! `min_interval`: its scenarios and edge cases, under paused time.

use crate::common;

use std::time::Duration;

use common::{arriving, collect_timed, timeline};
use futures_util::{stream, StreamExt};
use paced::PaceExt;
use tokio::time::{timeout, Instant};

#[tokio::test(start_paused = true)]
async fn gaps_count_from_the_previous_emission() {
    let start = Instant::now();
    let schedule = [(0, 0), (10, 1), (20, 2), (500, 3), (510, 4)];
    let s = arriving(start, &schedule).min_interval(Duration::from_millis(100));
    let got = collect_timed(start, s).await;
    assert_eq!(timeline(&got), "0ms:0 100ms:1 200ms:2 500ms:3 600ms:4");
}

#[tokio::test(start_paused = true)]
async fn a_late_consumer_only_lengthens_gaps() {
    // The consumer takes item 1 150 ms late; item 2 then waits a full interval from the
    // actual emission of item 1, not from where a fixed tick grid would put it.
    let start = Instant::now();
    let s = stream::iter(0..3).min_interval(Duration::from_millis(100));
    let mut s = std::pin::pin!(s);
    let mut got = Vec::new();
    got.push((s.next().await.unwrap(), common::nanos_since(start)));
    tokio::time::sleep(Duration::from_millis(250)).await;
    got.push((s.next().await.unwrap(), common::nanos_since(start)));
    got.push((s.next().await.unwrap(), common::nanos_since(start)));
    assert_eq!(timeline(&got), "0ms:0 250ms:1 350ms:2");
}

#[tokio::test(start_paused = true)]
async fn sub_millisecond_interval_is_never_shorter() {
    // 1.5 ms: the timer rounds up to whole ms ticks, so gaps are 2 ms (tick) or more.
    let start = Instant::now();
    let s = stream::iter(0..5).min_interval(Duration::from_micros(1_500));
    let got = collect_timed(start, s).await;
    for pair in got.windows(2) {
        let gap = pair[1].1 - pair[0].1;
        assert!(
            (1_500_000..=2_500_000).contains(&gap),
            "gap {gap} ns in {}",
            timeline(&got)
        );
    }
}

#[tokio::test(start_paused = true)]
async fn zero_interval_passes_everything_through() {
    let start = Instant::now();
    let got = collect_timed(start, stream::iter(0..100).min_interval(Duration::ZERO)).await;
    assert_eq!(got.len(), 100);
    assert!(got.iter().all(|&(_, at)| at == 0));
}

#[tokio::test(start_paused = true)]
async fn max_interval_waits_forever_without_panicking() {
    let s = stream::iter([1, 2]).min_interval(Duration::MAX);
    let mut s = std::pin::pin!(s);
    assert_eq!(s.next().await, Some(1));
    assert!(timeout(Duration::from_secs(86_400 * 365 * 100), s.next())
        .await
        .is_err());
}

#[tokio::test(start_paused = true)]
async fn held_item_still_leaves_after_upstream_ends() {
    let start = Instant::now();
    let s = stream::iter(0..2).min_interval(Duration::from_secs(1));
    let mut s = std::pin::pin!(s);
    assert_eq!(s.next().await, Some(0));
    assert_eq!(s.next().await, Some(1));
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(s.next().await, None);
    assert_eq!(s.next().await, None);
}
