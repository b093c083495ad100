//! `batched_interval`: its scenarios and edge cases, under paused time.

use crate::common;

use std::time::Duration;

use common::{arriving, collect_timed, MS};
use futures_util::{stream, StreamExt};
use paced::PaceExt;
use tokio::time::Instant;

fn render(batches: &[(Vec<u32>, u64)]) -> String {
    batches
        .iter()
        .map(|(batch, at)| format!("{batch:?}@{}", at / MS))
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test(start_paused = true)]
async fn ready_items_fill_batches_one_per_interval() {
    let start = Instant::now();
    let s = stream::iter(0..10).batched_interval(3, Duration::from_millis(100));
    let got = collect_timed(start, s).await;
    assert_eq!(
        render(&got),
        "[0, 1, 2]@0 [3, 4, 5]@100 [6, 7, 8]@200 [9]@300"
    );
}

#[tokio::test(start_paused = true)]
async fn a_batch_holds_what_arrived_by_the_time_it_leaves() {
    let start = Instant::now();
    let schedule = [(0, 0), (30, 1), (60, 2), (90, 3), (120, 4), (250, 5)];
    let s = arriving(start, &schedule).batched_interval(10, Duration::from_millis(100));
    let got = collect_timed(start, s).await;
    assert_eq!(render(&got), "[0]@0 [1, 2, 3]@100 [4]@200 [5]@300");
}

#[tokio::test(start_paused = true)]
async fn holds_at_most_max_batch_items() {
    // A full batch stops pulling: upstream is polled for no more than n items per batch.
    let pulled = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = pulled.clone();
    let source = stream::iter(0..100).inspect(move |_| {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    let s = source.batched_interval(4, Duration::from_secs(1));
    let mut s = std::pin::pin!(s);
    assert_eq!(s.next().await, Some(vec![0, 1, 2, 3]));
    // Waiting for the next interval, with a full batch held and nothing more pulled.
    let next = tokio::time::timeout(Duration::from_millis(500), s.next()).await;
    assert!(next.is_err());
    assert_eq!(pulled.load(std::sync::atomic::Ordering::Relaxed), 8);
    assert_eq!(s.next().await, Some(vec![4, 5, 6, 7]));
}

#[tokio::test(start_paused = true)]
async fn late_item_after_an_idle_interval_leaves_at_once() {
    let start = Instant::now();
    let schedule = [(0, 0), (1_000, 1), (1_010, 2)];
    let s = arriving(start, &schedule).batched_interval(5, Duration::from_millis(100));
    let got = collect_timed(start, s).await;
    assert_eq!(render(&got), "[0]@0 [1]@1000 [2]@1100");
}

#[tokio::test(start_paused = true)]
async fn zero_interval_batches_whatever_is_ready() {
    let start = Instant::now();
    let s = stream::iter(0..7).batched_interval(3, Duration::ZERO);
    let got = collect_timed(start, s).await;
    assert_eq!(render(&got), "[0, 1, 2]@0 [3, 4, 5]@0 [6]@0");
}

#[tokio::test(start_paused = true)]
async fn held_batch_leaves_after_upstream_ends_then_none_forever() {
    let start = Instant::now();
    let s = stream::iter(0..5).batched_interval(2, Duration::from_secs(1));
    let mut s = std::pin::pin!(s);
    assert_eq!(s.next().await, Some(vec![0, 1]));
    assert_eq!(s.next().await, Some(vec![2, 3]));
    assert_eq!(s.next().await, Some(vec![4]));
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(s.next().await, None);
    assert_eq!(s.next().await, None);
}

#[tokio::test(start_paused = true)]
async fn huge_max_batch_does_not_preallocate() {
    let s = stream::iter(0..3).batched_interval(usize::MAX, Duration::from_millis(1));
    let got: Vec<_> = s.collect().await;
    assert_eq!(got, [vec![0, 1, 2]]);
}

#[test]
#[should_panic(expected = "PaceExt::batched_interval: invalid batch: `max_batch` is 0")]
fn zero_max_batch_panics_at_construction() {
    let _ = stream::iter([1]).batched_interval(0, Duration::from_secs(1));
}
