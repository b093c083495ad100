//! `throttle`: its scenarios and edge cases, under paused time.

use crate::common;

use std::time::Duration;

use common::{arriving, collect_timed, timeline};
use futures_util::{stream, StreamExt};
use paced::{Enforcing, PaceExt, Rate, Shaping};
use tokio::time::{timeout, Instant};

#[tokio::test(start_paused = true)]
async fn one_per_second_burst_one() {
    let start = Instant::now();
    let s = stream::iter(0..5).throttle(Rate::per_second(1), |_| 1, 1, Shaping);
    let got = collect_timed(start, s).await;
    assert_eq!(timeline(&got), "0ms:0 1000ms:1 2000ms:2 3000ms:3 4000ms:4");
}

#[tokio::test(start_paused = true)]
async fn burst_of_five_then_one_per_100ms() {
    let start = Instant::now();
    let s = stream::iter(0..12).throttle(Rate::per_second(10), |_| 1, 5, Shaping);
    let got = collect_timed(start, s).await;
    assert_eq!(
        timeline(&got),
        "0ms:0 0ms:1 0ms:2 0ms:3 0ms:4 100ms:5 200ms:6 300ms:7 400ms:8 500ms:9 600ms:10 700ms:11"
    );
}

#[tokio::test(start_paused = true)]
async fn item_dearer_than_bucket_pays_its_debt_first() {
    let start = Instant::now();
    let s = stream::iter([5u64, 10, 1]).throttle(Rate::per_second(10), |&c| c, 5, Shaping);
    let got = collect_timed(start, s).await;
    assert_eq!(timeline(&got), "0ms:5 1000ms:10 1100ms:1");
}

#[tokio::test(start_paused = true)]
async fn tokens_are_charged_at_emission_not_when_pulled() {
    // 3/s: item 1 is pulled at 0 ms and may leave at 333.33 ms, which the 1 ms timer turns
    // into 334 ms. Charged at its pull (or at its deadline), item 2 could leave at 667 ms,
    // only 333 ms after item 1: two items within 1/3 s, one more than the bound allows.
    let start = Instant::now();
    let s = stream::iter(0..3).throttle(Rate::per_second(3), |_| 1, 1, Shaping);
    let got = collect_timed(start, s).await;
    assert_eq!(timeline(&got), "0ms:0 334ms:1 668ms:2");
}

#[tokio::test(start_paused = true)]
async fn an_item_arriving_after_its_tokens_leaves_at_once() {
    let start = Instant::now();
    let source = arriving(start, &[(0, 'a'), (0, 'b'), (1000, 'c'), (1001, 'd')]);
    let s = source.throttle(Rate::per_second(2), |_| 1, 1, Shaping);
    let got = collect_timed(start, s).await;
    assert_eq!(timeline(&got), "0ms:a 500ms:b 1000ms:c 1500ms:d");
}

/// Three items empty a bucket of 3 at 0 ms; seven more arrive after `idle_ms`.
async fn after_idle(idle_ms: u64) -> String {
    let start = Instant::now();
    let mut schedule: Vec<(u64, u32)> = (0..3).map(|i| (0, i)).collect();
    schedule.extend((3..8).map(|i| (idle_ms, i)));
    let s = arriving(start, &schedule).throttle(Rate::per_second(10), |_| 1, 3, Shaping);
    timeline(&collect_timed(start, s).await)
}

#[tokio::test(start_paused = true)]
async fn idle_gap_refills_exactly_the_burst() {
    // governor #107 / #249: an idle gap of burst + 1 intervals must not admit an extra item.
    let head = "0ms:0 0ms:1 0ms:2";
    assert_eq!(
        after_idle(250).await,
        format!("{head} 250ms:3 250ms:4 300ms:5 400ms:6 500ms:7")
    );
    assert_eq!(
        after_idle(300).await,
        format!("{head} 300ms:3 300ms:4 300ms:5 400ms:6 500ms:7")
    );
    assert_eq!(
        after_idle(400).await,
        format!("{head} 400ms:3 400ms:4 400ms:5 500ms:6 600ms:7")
    );
    assert_eq!(
        after_idle(10_000).await,
        format!("{head} 10000ms:3 10000ms:4 10000ms:5 10100ms:6 10200ms:7")
    );
}

#[tokio::test(start_paused = true)]
async fn enforcing_hands_back_what_does_not_conform() {
    let start = Instant::now();
    let s = stream::iter(0..4).throttle(Rate::per_second(10), |_| 1, 2, Enforcing);
    let got = collect_timed(start, s).await;
    assert!(got.iter().all(|&(_, at)| at == 0), "enforcing never delays");
    let oks: Vec<_> = got.iter().filter_map(|(r, _)| r.as_ref().ok()).collect();
    assert_eq!(oks, [&0, &1]);
    let refused: Vec<_> = got.iter().filter_map(|(r, _)| r.as_ref().err()).collect();
    assert_eq!(refused.len(), 2);
    assert_eq!(*refused[0].get_ref(), 2);
    assert_eq!(refused[0].retry_after(), Duration::from_millis(100));
    // A refused item takes no tokens: the next one is told the same wait.
    assert_eq!(refused[1].retry_after(), Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn enforcing_retry_after_is_exact_and_then_conforms() {
    let start = Instant::now();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let s = tokio_stream::wrappers::UnboundedReceiverStream::new(rx).throttle(
        Rate::per_second(3),
        |_| 1,
        1,
        Enforcing,
    );
    let mut s = std::pin::pin!(s);
    tx.send(1).unwrap();
    tx.send(2).unwrap();
    assert_eq!(s.next().await.unwrap().unwrap(), 1);
    let refused = s.next().await.unwrap().unwrap_err();
    assert_eq!(refused.retry_after(), Duration::from_nanos(333_333_334));
    // A nanosecond before that, it is still refused; at that time it conforms. (`advance`
    // moves the paused clock exactly; a sleep would round up to the next millisecond.)
    tokio::time::advance(refused.retry_after() - Duration::from_nanos(1)).await;
    tx.send(refused.into_inner()).unwrap();
    let again = s.next().await.unwrap().unwrap_err();
    assert_eq!(again.retry_after(), Duration::from_nanos(1));
    tokio::time::advance(Duration::from_nanos(1)).await;
    assert_eq!(start.elapsed(), Duration::from_nanos(333_333_334));
    tx.send(again.into_inner()).unwrap();
    assert_eq!(s.next().await.unwrap().unwrap(), 2);
}

#[tokio::test(start_paused = true)]
async fn enforcing_item_dearer_than_burst_never_conforms() {
    let s = stream::iter([3u64, 6, 1]).throttle(Rate::per_second(10), |&c| c, 5, Enforcing);
    let got: Vec<_> = s.collect().await;
    assert_eq!(got[0].as_ref().ok(), Some(&3));
    let dear = got[1].as_ref().unwrap_err();
    assert_eq!(dear.retry_after(), Duration::MAX);
    assert_eq!(*dear.get_ref(), 6);
    assert!(dear.to_string().contains("never"), "{dear}");
    // The dear item took nothing: two tokens are left for the cost-1 item.
    assert_eq!(got[2].as_ref().ok(), Some(&1));
}

#[tokio::test(start_paused = true)]
async fn zero_cost_items_pass_at_once() {
    let start = Instant::now();
    let s = stream::iter([1u64, 0, 0, 1]).throttle(Rate::per_second(1), |&c| c, 1, Shaping);
    let got = collect_timed(start, s).await;
    assert_eq!(timeline(&got), "0ms:1 0ms:0 0ms:0 1000ms:1");
}

#[tokio::test(start_paused = true)]
async fn huge_cost_waits_forever_without_panicking() {
    let s = stream::iter([1u64, u64::MAX]).throttle(Rate::per_second(1), |&c| c, 1, Shaping);
    let mut s = std::pin::pin!(s);
    assert_eq!(s.next().await, Some(1));
    assert!(timeout(Duration::from_secs(86_400 * 365), s.next())
        .await
        .is_err());
}

#[tokio::test(start_paused = true)]
async fn huge_period_waits_forever_without_panicking() {
    let s = stream::iter([1, 2]).throttle(Rate::new(1, Duration::MAX), |_| 1, 1, Shaping);
    let mut s = std::pin::pin!(s);
    assert_eq!(s.next().await, Some(1));
    assert!(timeout(Duration::from_secs(86_400 * 365 * 100), s.next())
        .await
        .is_err());
}

#[tokio::test(start_paused = true)]
async fn huge_rate_and_burst_never_bind() {
    let start = Instant::now();
    let s = stream::iter(0..1000).throttle(Rate::per_second(u64::MAX), |_| 1, u64::MAX, Shaping);
    let got = collect_timed(start, s).await;
    assert_eq!(got.len(), 1000);
    assert!(got.iter().all(|&(_, at)| at == 0));
}

#[test]
#[should_panic(expected = "PaceExt::throttle: invalid burst: `burst` is 0")]
fn zero_burst_panics_at_construction() {
    let _ = stream::iter([1]).throttle(Rate::per_second(1), |_| 1, 0, Shaping);
}

#[test]
fn rate_errors_name_the_value() {
    let err = Rate::try_new(0, Duration::from_secs(1)).unwrap_err();
    assert!(err.to_string().contains("`tokens` is 0"), "{err}");
    let err = Rate::try_new(1, Duration::ZERO).unwrap_err();
    assert!(err.to_string().contains("`per` is zero"), "{err}");
    let _: &dyn std::error::Error = &err;
}
