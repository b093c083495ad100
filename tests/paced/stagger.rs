//! `Stagger` and the stream adapters over shared limiters.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{collect_timed, nanos_since, timeline, within_an_hour, MS};
use futures_util::{stream, StreamExt};
use paced::{Enforcing, PaceExt, Rate, RateLimiter, Shaping, Stagger};
use tokio::time::{sleep, Instant};

/// The most grants in any window `[t, t + width)`, from sorted grant times.
fn most_in_window(sorted: &[u64], width: u64) -> usize {
    let mut most = 0;
    let mut lo = 0;
    for hi in 0..sorted.len() {
        while sorted[hi] - sorted[lo] >= width {
            lo += 1;
        }
        most = most.max(hi - lo + 1);
    }
    most
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_tasks_at_a_hundred_per_second() {
    let stagger = Stagger::new(100, Duration::from_secs(1));
    let start = Instant::now();
    let tasks: Vec<_> = (0..10_000)
        .map(|_| {
            let stagger = stagger.clone();
            tokio::spawn(async move {
                stagger.acquire().await;
                nanos_since(start)
            })
        })
        .collect();
    let mut starts = Vec::with_capacity(10_000);
    for task in tasks {
        starts.push(within_an_hour(task).await.unwrap());
    }
    starts.sort_unstable();
    assert_eq!(starts.len(), 10_000, "every task starts");
    assert_eq!(most_in_window(&starts, 1_000 * MS), 100);
    assert_eq!(*starts.last().unwrap(), 99_000 * MS, "all within 100 s");
    assert_eq!(stagger.stats().granted, 10_000);
    assert_eq!(stagger.stats().waiting, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_tasks_at_a_thousand_per_second_in_real_time() {
    // Real time: 100 per 100 ms. A start is recorded just after its grant, which on a loaded
    // machine can be a few milliseconds late, so windows are checked 10 ms narrower than
    // the period.
    let stagger = Stagger::new(100, Duration::from_millis(100));
    let start = std::time::Instant::now();
    let tasks: Vec<_> = (0..1_000)
        .map(|_| {
            let stagger = stagger.clone();
            tokio::spawn(async move {
                stagger.acquire().await;
                start.elapsed().as_nanos() as u64
            })
        })
        .collect();
    let mut starts = Vec::new();
    for task in tasks {
        starts.push(within_an_hour(task).await.unwrap());
    }
    starts.sort_unstable();
    assert_eq!(starts.len(), 1_000);
    let most = most_in_window(&starts, 90 * MS);
    assert!(most <= 100, "{most} starts within 90 ms");
    // 1,000 starts at 100 per 100 ms take at least 900 ms.
    assert!(*starts.last().unwrap() >= 900 * MS);
    assert_eq!(stagger.stats().granted, 1_000);
}

#[tokio::test(start_paused = true)]
async fn try_acquire_and_available() {
    let stagger = Stagger::new(2, Duration::from_secs(1));
    assert_eq!(stagger.available(), 2);
    stagger.try_acquire().unwrap();
    stagger.try_acquire().unwrap();
    assert_eq!(stagger.available(), 0);
    let refused = stagger.try_acquire().unwrap_err();
    assert_eq!(refused.retry_after(), Duration::from_secs(1));
    sleep(Duration::from_secs(1)).await;
    assert_eq!(stagger.available(), 2);
    // With someone waiting, try_acquire fails even if a token is free.
    stagger.try_acquire().unwrap();
    stagger.try_acquire().unwrap();
    let waiter = tokio::spawn({
        let stagger = stagger.clone();
        async move { stagger.acquire().await }
    });
    tokio::task::yield_now().await;
    sleep(Duration::from_secs(1)).await;
    // At 2 s both permits came back; the waiter takes one, one is free, no one waits.
    within_an_hour(waiter).await.unwrap();
    assert_eq!(stagger.available(), 1);
    assert_eq!(stagger.stats().rejected, 1);
}

#[tokio::test(start_paused = true)]
async fn set_limit_applies_at_once_and_keeps_past_grants() {
    let stagger = Stagger::new(1, Duration::from_secs(10));
    let start = Instant::now();
    stagger.acquire().await;
    let waiter = tokio::spawn({
        let stagger = stagger.clone();
        async move {
            stagger.acquire().await;
            start.elapsed()
        }
    });
    sleep(Duration::from_secs(1)).await;
    // Two per 10 s: the grant at 0 s still counts, and there is room for one more now.
    stagger.set_limit(2, Duration::from_secs(10));
    assert_eq!(
        within_an_hour(waiter).await.unwrap(),
        Duration::from_secs(1)
    );
    assert_eq!(stagger.available(), 0);
    stagger.set_limit(1, Duration::from_secs(2));
    // Only the most recent grant (1 s) counts now: next at 3 s.
    stagger.acquire().await;
    assert_eq!(start.elapsed(), Duration::from_secs(3));
}

/// `acquire` then the work (what `run_when_token_available` did): each task's work runs in turn.
#[tokio::test(start_paused = true)]
async fn acquire_then_work_runs_in_turn() {
    let stagger = Stagger::new(1, Duration::from_millis(100));
    let start = Instant::now();
    let order = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..3)
        .map(|i| {
            let stagger = stagger.clone();
            let order = order.clone();
            tokio::spawn(async move {
                stagger.acquire().await;
                order.lock().unwrap().push((i, start.elapsed().as_millis()));
                i * 10
            })
        })
        .collect();
    let mut outputs = Vec::new();
    for task in tasks {
        outputs.push(within_an_hour(task).await.unwrap());
    }
    assert_eq!(outputs, [0, 10, 20]);
    assert_eq!(*order.lock().unwrap(), [(0, 0), (1, 100), (2, 200)]);
}

#[tokio::test(start_paused = true)]
async fn staggered_start_with_shares_one_window_between_streams() {
    let stagger = Stagger::new(2, Duration::from_secs(1));
    let start = Instant::now();
    let a = stream::iter(["a0", "a1", "a2"]).staggered_start_with(&stagger);
    let b = stream::iter(["b0", "b1", "b2"]).staggered_start_with(&stagger);
    let (a, b) = tokio::join!(collect_timed(start, a), collect_timed(start, b));
    let mut all: Vec<u64> = a.iter().chain(&b).map(|&(_, at)| at).collect();
    all.sort_unstable();
    assert_eq!(all, [0, 0, 1000, 1000, 2000, 2000].map(|ms| ms * MS));
    // Each stream keeps its own order.
    assert_eq!(
        a.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        ["a0", "a1", "a2"]
    );
    assert_eq!(
        b.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        ["b0", "b1", "b2"]
    );
}

#[tokio::test(start_paused = true)]
async fn throttle_with_is_fair_between_streams() {
    let limiter = RateLimiter::new(Rate::per_second(10), 1);
    let start = Instant::now();
    let a = stream::iter(0..5).throttle_with(&limiter, |_| 1, Shaping);
    let b = stream::iter(5..10).throttle_with(&limiter, |_| 1, Shaping);
    let (a, b) = tokio::join!(collect_timed(start, a), collect_timed(start, b));
    // `join!` polls `a` first: its item 0 goes at once and item 1 queues before `b`'s first.
    // From then on each stream's next item queues behind the other's: strict alternation.
    assert_eq!(timeline(&a), "0ms:0 100ms:1 300ms:2 500ms:3 700ms:4");
    assert_eq!(timeline(&b), "200ms:5 400ms:6 600ms:7 800ms:8 900ms:9");
}

#[tokio::test(start_paused = true)]
async fn throttle_with_enforcing_refuses_without_taking() {
    let limiter = RateLimiter::new(Rate::per_second(10), 2);
    let out: Vec<_> = stream::iter(0..4)
        .throttle_with(&limiter, |_| 1, Enforcing)
        .collect()
        .await;
    assert!(out[0].is_ok() && out[1].is_ok());
    let refused = out[2].as_ref().unwrap_err();
    assert_eq!(*refused.get_ref(), 2);
    assert_eq!(refused.retry_after(), Duration::from_millis(100));
    assert_eq!(
        out[3].as_ref().unwrap_err().retry_after(),
        Duration::from_millis(100)
    );
    assert_eq!(limiter.stats().rejected, 2);
    assert_eq!(limiter.stats().granted, 2);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_waiting_stream_gives_its_place_back() {
    let limiter = RateLimiter::new(Rate::per_second(1), 1);
    let start = Instant::now();
    limiter.acquire(1).await;
    let mut dropped = Box::pin(stream::iter(0..3).throttle_with(&limiter, |_| 1, Shaping));
    let pending = futures_util::poll!(dropped.next());
    assert!(pending.is_pending());
    assert_eq!(limiter.stats().waiting, 1);
    drop(dropped);
    assert_eq!(limiter.stats().waiting, 0);
    limiter.acquire(1).await;
    assert_eq!(start.elapsed(), Duration::from_secs(1));
}

#[test]
#[should_panic(expected = "Stagger::new: invalid stagger: `k` is 0")]
fn zero_k_panics() {
    let _ = Stagger::new(0, Duration::from_secs(1));
}
