//! `throttle_by_key`: scenarios, manners and property tests, under paused time.

use crate::common;

use std::collections::HashMap;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{arriving, collect_timed, nanos_since, paused, tick_ceil, timeline, NaiveBucket, MS};
use futures_util::{stream, Stream, StreamExt};
use paced::{KeyedRateLimiter, PaceExt, Rate};
use proptest::prelude::*;
use tokio::time::{sleep, Instant};
use tokio_test::{assert_pending, assert_ready_eq};

/// Providers A (2/s), B (5/s) and C (a million per second), one message at a time each.
fn providers() -> KeyedRateLimiter<char> {
    let limiter = KeyedRateLimiter::new(Rate::per_second(2), 1);
    limiter.set_limit(&'B', Rate::per_second(5), 1);
    limiter.set_limit(&'C', Rate::per_second(1_000_000), 1_000);
    limiter
}

#[tokio::test(start_paused = true)]
async fn a_slow_provider_does_not_hold_up_the_others() {
    let limiter = providers();
    let messages = [
        "A1", "B1", "C1", "A2", "B2", "C2", "A3", "B3", "C3", "A4", "C4",
    ];
    let start = Instant::now();
    let key = |m: &&str| m.chars().next().unwrap();
    let out = collect_timed(
        start,
        stream::iter(messages).throttle_by_key(&limiter, key, |_| 1, 64),
    )
    .await;
    assert_eq!(
        timeline(&out),
        "0ms:A1 0ms:B1 0ms:C1 0ms:C2 0ms:C3 0ms:C4 200ms:B2 400ms:B3 500ms:A2 1000ms:A3 1500ms:A4"
    );
}

#[tokio::test(start_paused = true)]
async fn arrivals_spread_out_leave_as_their_keys_allow() {
    let limiter = providers();
    let start = Instant::now();
    let schedule = [
        (0, "A1"),
        (0, "A2"),
        (100, "B1"),
        (150, "B2"),
        (300, "A3"),
        (320, "C1"),
        (700, "B3"),
    ];
    let key = |m: &&str| m.chars().next().unwrap();
    let out = collect_timed(
        start,
        arriving(start, &schedule).throttle_by_key(&limiter, key, |_| 1, 64),
    )
    .await;
    assert_eq!(
        timeline(&out),
        "0ms:A1 100ms:B1 300ms:B2 320ms:C1 500ms:A2 700ms:B3 1000ms:A3"
    );
}

#[tokio::test(start_paused = true)]
async fn costs_and_debts_per_key() {
    // 10/s, burst 5: costs 5, 10, 1 leave at 0, 1000, 1100 ms, as with `throttle`.
    let limiter = KeyedRateLimiter::new(Rate::per_second(10), 5);
    let start = Instant::now();
    let items = [("x", 5), ("y", 5), ("x", 10), ("y", 0), ("x", 1)];
    let out = collect_timed(
        start,
        stream::iter(items)
            .throttle_by_key(&limiter, |i| i.0, |i| i.1, 8)
            .map(|i| format!("{}{}", i.0, i.1)),
    )
    .await;
    assert_eq!(timeline(&out), "0ms:x5 0ms:y5 0ms:y0 1000ms:x10 1100ms:x1");
}

#[tokio::test(start_paused = true)]
async fn with_capacity_items_held_nothing_more_is_pulled() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(1), 1);
    let pulled = Arc::new(AtomicUsize::new(0));
    let source = stream::iter(0..10).inspect({
        let pulled = pulled.clone();
        move |_| {
            pulled.fetch_add(1, Ordering::SeqCst);
        }
    });
    // Everything has the same key: one leaves, three are held, and then the adapter stops
    // pulling until one of them leaves.
    let mut paced = pin!(source.throttle_by_key(&limiter, |_| 0, |_| 1, 3));
    assert_eq!(paced.next().await, Some(0));
    let mut task = tokio_test::task::spawn(paced.next());
    assert_pending!(task.poll());
    drop(task);
    assert_eq!(pulled.load(Ordering::SeqCst), 4);
    assert_eq!(paced.held(), 3);
    assert_eq!(paced.next().await, Some(1));
    // One left: the next poll pulls one more, and holds three again.
    let mut task = tokio_test::task::spawn(paced.next());
    assert_pending!(task.poll());
    drop(task);
    assert_eq!(pulled.load(Ordering::SeqCst), 5);
    assert_eq!(paced.held(), 3);
}

#[tokio::test(start_paused = true)]
async fn held_items_leave_after_upstream_ends_then_none_forever() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(10), 1);
    let start = Instant::now();
    let mut paced = pin!(stream::iter([1, 1, 2]).throttle_by_key(&limiter, |n| *n, |_| 1, 8));
    let mut times = Vec::new();
    while let Some(n) = paced.next().await {
        times.push((n, nanos_since(start) / MS));
    }
    assert_eq!(times, [(1, 0), (2, 0), (1, 100)]);
    use futures_core::stream::FusedStream;
    assert!(paced.is_terminated());
    assert_eq!(paced.next().await, None);
    assert_eq!(paced.size_hint(), (0, Some(0)));
}

#[tokio::test(start_paused = true)]
async fn no_wake_ups_while_nothing_is_held() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(1), 1);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut paced = tokio_test::task::spawn(
        tokio_stream::wrappers::UnboundedReceiverStream::new(rx).throttle_by_key(
            &limiter,
            |k: &u8| *k,
            |_| 1,
            8,
        ),
    );
    tx.send(1).unwrap();
    assert_ready_eq!(paced.poll_next(), Some(1));
    assert_pending!(paced.poll_next());
    tokio::time::advance(Duration::from_secs(10)).await;
    assert!(!paced.is_woken(), "woken while idle");
    // One held item arms the timer; once it has left, nothing wakes the task again.
    tx.send(2).unwrap();
    tx.send(2).unwrap();
    assert!(paced.is_woken());
    assert_ready_eq!(paced.poll_next(), Some(2));
    assert_pending!(paced.poll_next());
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(paced.is_woken());
    assert_ready_eq!(paced.poll_next(), Some(2));
    assert_pending!(paced.poll_next());
    tokio::time::advance(Duration::from_secs(10)).await;
    assert!(!paced.is_woken(), "woken after the last held item left");
}

#[tokio::test(start_paused = true)]
async fn an_item_that_leaves_early_leaves_no_timer_behind() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(1), 1);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut paced = tokio_test::task::spawn(
        tokio_stream::wrappers::UnboundedReceiverStream::new(rx).throttle_by_key(
            &limiter,
            |k: &u8| *k,
            |_| 1,
            8,
        ),
    );
    tx.send(1).unwrap();
    tx.send(1).unwrap();
    assert_ready_eq!(paced.poll_next(), Some(1));
    assert_pending!(paced.poll_next()); // the second waits until 1 s
    tokio::time::advance(Duration::from_millis(100)).await;
    // A faster limit lets it go at once (it lacked 0.9 token; at 1000/s that is 0.9 ms).
    limiter.set_limit(&1, Rate::per_second(1_000), 1);
    assert!(paced.is_woken());
    assert_pending!(paced.poll_next());
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_ready_eq!(paced.poll_next(), Some(1));
    assert_pending!(paced.poll_next());
    // The timer armed for 1 s was taken back: nothing wakes the task there.
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(!paced.is_woken());
}

#[tokio::test(start_paused = true)]
async fn streams_and_tasks_share_each_keys_quota() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(10), 2);
    let start = Instant::now();
    let a = stream::iter(0..6).map(|i| ('k', format!("a{i}")));
    let b = stream::iter(0..6).map(|i| ('k', format!("b{i}")));
    let a = collect_timed(start, a.throttle_by_key(&limiter, |m| m.0, |_| 1, 4));
    let b = collect_timed(start, b.throttle_by_key(&limiter, |m| m.0, |_| 1, 4));
    let task = {
        let limiter = limiter.clone();
        async move {
            let mut times = Vec::new();
            for _ in 0..4 {
                limiter.acquire(&'k', 1).await;
                times.push(nanos_since(start));
            }
            times
        }
    };
    let (a, b, c) = tokio::join!(a, b, task);
    let mut all: Vec<u64> = a.iter().chain(&b).map(|(_, t)| *t).chain(c).collect();
    all.sort_unstable();
    assert_eq!(all.len(), 16);
    // 16 tokens at 10/s, burst 2: the last leaves at 1.4 s, and the merged timeline
    // conforms to the one bucket.
    assert_eq!(*all.last().unwrap(), 1_400 * MS);
    let mut bucket = NaiveBucket::new(10, Duration::from_secs(1), 2);
    for t in all {
        bucket.emit(t, 1);
    }
    // Each stream kept its own order.
    for out in [&a, &b] {
        let ids: Vec<_> = out.iter().map(|(m, _)| m.1.clone()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
    }
}

#[tokio::test(start_paused = true)]
async fn dropping_the_stream_gives_every_place_back() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(10), 1);
    let start = Instant::now();
    let mut paced =
        Box::pin(stream::iter([1u8, 1, 2, 2]).throttle_by_key(&limiter, |n| *n, |_| 1, 8));
    assert_eq!(paced.next().await, Some(1));
    assert_eq!(paced.next().await, Some(2));
    let mut task = tokio_test::task::spawn(paced.next());
    assert_pending!(task.poll()); // one of each key waits for its token
    drop(task);
    // A task queues behind the stream's waiting item of key 1.
    let waiter = tokio::spawn({
        let limiter = limiter.clone();
        async move {
            limiter.acquire(&1, 1).await;
            nanos_since(start) / MS
        }
    });
    tokio::task::yield_now().await;
    assert_eq!(limiter.stats().waiting, 3);
    drop(paced);
    assert_eq!(limiter.stats().waiting, 1);
    // The task is served when key 1's token is back, not one token later.
    assert_eq!(common::within_an_hour(waiter).await.unwrap(), 100);
    assert_eq!(limiter.stats().granted, 3);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_key_function_propagates_and_leaves_the_limiter_usable() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(10), 1);
    let driven = tokio::spawn({
        let limiter = limiter.clone();
        async move {
            stream::iter([1u8, 2, 3])
                .throttle_by_key(
                    &limiter,
                    |n| if *n == 2 { panic!("bad key") } else { *n },
                    |_| 1,
                    8,
                )
                .count()
                .await
        }
    });
    let err = driven.await.unwrap_err();
    assert!(err.is_panic());
    assert!(limiter.try_acquire(&3, 1).is_ok());
    let n = stream::iter([4u8, 5])
        .throttle_by_key(&limiter, |n| *n, |_| 1, 8)
        .count()
        .await;
    assert_eq!(n, 2);
}

#[test]
#[should_panic(expected = "`capacity` is 0")]
fn capacity_zero_panics() {
    let limiter = KeyedRateLimiter::<u8>::new(Rate::per_second(1), 1);
    let _ = stream::iter([1u8]).throttle_by_key(&limiter, |n| *n, |_| 1, 0);
}

#[test]
fn building_needs_no_runtime() {
    let limiter = KeyedRateLimiter::<u8>::new(Rate::per_second(1), 1);
    let paced = stream::iter([1u8]).throttle_by_key(&limiter, |n| *n, |_| 1, 1);
    assert_eq!(paced.size_hint(), (1, Some(1)));
    fn send<T: Send>(_: &T) {}
    send(&paced);
}

#[tokio::test(start_paused = true)]
async fn extreme_costs_and_rates_neither_panic_nor_hang() {
    let limiter = KeyedRateLimiter::new(Rate::new(1, Duration::MAX), 1);
    let mut paced = pin!(stream::iter([1u8, 1, 2]).throttle_by_key(
        &limiter,
        |n| *n,
        |&n| {
            if n == 2 {
                u64::MAX
            } else {
                1
            }
        },
        8
    ));
    assert_eq!(paced.next().await, Some(1));
    // Key 1's second item would wait about 584 years, and key 2's costs u64::MAX: both wait
    // without panicking, and auto-advance is not held up forever.
    let waited = tokio::time::timeout(Duration::from_secs(3600), paced.next()).await;
    assert!(waited.is_err());
}

/// Per-key limits of the property tests: (tokens per second, burst).
fn limits() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((1u64..30, 1u64..4), 3)
}

/// Arrivals: (gap before it in ms, key, cost within the key's burst as a fraction).
fn arrivals() -> impl Strategy<Value = Vec<(u64, usize, u64)>> {
    prop::collection::vec((0u64..200, 0usize..3, 0u64..4), 1..40)
}

struct Run {
    /// (index, key, cost, arrival ns, emission ns) of every item, in emission order.
    out: Vec<(usize, usize, u64, u64, u64)>,
    /// The most items held at once, from the pull count.
    most_held: usize,
}

async fn run(limits: &[(u64, u64)], arrivals: &[(u64, usize, u64)], capacity: usize) -> Run {
    let limiter = KeyedRateLimiter::new(Rate::per_second(1), 1);
    for (key, &(tokens, burst)) in limits.iter().enumerate() {
        limiter.set_limit(&key, Rate::per_second(tokens), burst);
    }
    let start = Instant::now();
    let mut at = 0;
    let schedule: Vec<_> = arrivals
        .iter()
        .enumerate()
        .map(|(i, &(gap, key, cost))| {
            at += gap;
            (at, (i, key, cost.min(limits[key].1), at * MS))
        })
        .collect();
    let pulled = Arc::new(AtomicUsize::new(0));
    let source = arriving(start, &schedule).inspect({
        let pulled = pulled.clone();
        move |_| {
            pulled.fetch_add(1, Ordering::SeqCst);
        }
    });
    let mut paced = pin!(source.throttle_by_key(&limiter, |i| i.1, |i| i.2, capacity));
    let mut out = Vec::new();
    let mut most_held = 0;
    while let Some((i, key, cost, arrived)) = common::within_an_hour(paced.next()).await {
        out.push((i, key, cost, arrived, nanos_since(start)));
        most_held = most_held.max(pulled.load(Ordering::SeqCst) - out.len());
    }
    Run { out, most_held }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Per key: the bucket's bound (every emission conforms to the key's naive bucket), upstream
    /// order; overall: nothing lost or duplicated, never more than `capacity` held.
    #[test]
    fn bound_order_no_loss_capacity(
        limits in limits(),
        arrivals in arrivals(),
        capacity in 1usize..6,
    ) {
        let Run { out, most_held } = paused(run(&limits, &arrivals, capacity));
        prop_assert!(most_held <= capacity, "{} held, capacity {}", most_held, capacity);
        let mut seen: Vec<_> = out.iter().map(|o| o.0).collect();
        seen.sort_unstable();
        prop_assert_eq!(seen, (0..arrivals.len()).collect::<Vec<_>>());
        let mut buckets: Vec<_> = limits
            .iter()
            .map(|&(t, b)| NaiveBucket::new(t, Duration::from_secs(1), b))
            .collect();
        let mut last = HashMap::new();
        for &(i, key, cost, arrived, left) in &out {
            prop_assert!(left >= arrived);
            buckets[key].emit(left, cost);
            if let Some(prev) = last.insert(key, i) {
                prop_assert!(prev < i, "key {} out of order: {} after {}", key, i, prev);
            }
        }
    }

    /// Below capacity, an item leaves when its key's bucket allows it (after the key's earlier
    /// items), within tokio's tick, whatever the other keys do.
    #[test]
    fn prompt_per_key_below_capacity(limits in limits(), arrivals in arrivals()) {
        let Run { out, .. } = paused(run(&limits, &arrivals, arrivals.len()));
        let mut by_index = out.clone();
        by_index.sort_unstable_by_key(|o| o.0);
        let mut buckets: Vec<_> = limits
            .iter()
            .map(|&(t, b)| NaiveBucket::new(t, Duration::from_secs(1), b))
            .collect();
        let mut prev_left: HashMap<usize, u64> = HashMap::new();
        for &(i, key, cost, arrived, left) in &by_index {
            let ready = arrived.max(prev_left.get(&key).copied().unwrap_or(0));
            let due = buckets[key].earliest(ready, cost);
            prop_assert!(left >= due, "item {} left at {} before {}", i, left, due);
            prop_assert!(
                left <= tick_ceil(due),
                "item {} (key {}) due at {} left at {}", i, key, due, left
            );
            buckets[key].emit(left, cost);
            prev_left.insert(key, left);
        }
    }
}

/// A consumer that dawdles: items leave when polled, still within each key's bound.
#[test]
fn a_dawdling_consumer_keeps_the_bound() {
    paused(async {
        let limiter = KeyedRateLimiter::new(Rate::per_second(10), 3);
        let start = Instant::now();
        let mut paced =
            pin!(stream::iter((0..40).map(|i| i % 2)).throttle_by_key(&limiter, |k| *k, |_| 1, 5));
        let mut buckets = [
            NaiveBucket::new(10, Duration::from_secs(1), 3),
            NaiveBucket::new(10, Duration::from_secs(1), 3),
        ];
        let mut n = 0;
        while let Some(key) = paced.next().await {
            buckets[key].emit(nanos_since(start), 1);
            n += 1;
            sleep(Duration::from_millis(37 * (n % 5))).await;
        }
        assert_eq!(n, 40);
    });
}

/// A limit changed while items are held applies to them at once, keeping the level: the held
/// item's deadline is asked again.
#[tokio::test(start_paused = true)]
async fn a_limit_changed_while_items_are_held_applies_at_once() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(1), 1);
    let start = Instant::now();
    let paced = stream::iter(["a1", "a2", "a3"]).throttle_by_key(
        &limiter,
        |m| m.chars().next().unwrap(),
        |_| 1,
        8,
    );
    let changer = tokio::spawn({
        let limiter = limiter.clone();
        async move {
            sleep(Duration::from_millis(200)).await;
            // a2 lacks 0.8 token, at 10/s that is 80 ms.
            limiter.set_limit(&'a', Rate::per_second(10), 1);
            sleep(Duration::from_millis(300)).await;
            limiter.clear_limit(&'a');
        }
    });
    let out = common::within_an_hour(collect_timed(start, paced)).await;
    changer.await.unwrap();
    assert_eq!(timeline(&out), "0ms:a1 280ms:a2 380ms:a3");
}
