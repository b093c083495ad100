//! `KeyedRateLimiter`: one bucket per key, under paused time unless marked.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{nanos_since, within_an_hour, NaiveBucket, MS};
use paced::{ConfigError, KeyedRateLimiter, Rate};
use proptest::prelude::*;
use tokio::time::{sleep, Instant};

/// Spawns one task per `(key, cost)`, in order and each a moment after the previous one, so
/// that they queue in that order; returns `key:index@ms` in grant order.
async fn grants(limiter: &KeyedRateLimiter<&'static str>, asks: &[(&'static str, u64)]) -> String {
    let start = Instant::now();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, &(key, cost)) in asks.iter().enumerate() {
        let limiter = limiter.clone();
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            limiter.acquire(&key, cost).await;
            log.lock()
                .unwrap()
                .push(format!("{key}{i}@{}", nanos_since(start) / MS));
        }));
        tokio::task::yield_now().await;
    }
    for task in tasks {
        within_an_hour(task).await.unwrap();
    }
    log.lock().unwrap().join(" ")
}

#[tokio::test(start_paused = true)]
async fn each_key_has_its_own_bucket_and_queue() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(10), 1);
    let got = grants(
        &limiter,
        &[("a", 1), ("a", 1), ("b", 1), ("a", 1), ("b", 1), ("c", 1)],
    )
    .await;
    // b and c never wait for a's backlog; each key is FIFO on its own.
    assert_eq!(got, "a0@0 b2@0 c5@0 a1@100 b4@100 a3@200");
}

#[tokio::test(start_paused = true)]
async fn a_large_request_is_not_starved_within_its_key() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(10), 4);
    let got = grants(&limiter, &[("a", 4), ("a", 4), ("a", 1), ("b", 4)]).await;
    assert_eq!(got, "a0@0 b3@0 a1@400 a2@500");
}

#[tokio::test(start_paused = true)]
async fn cost_above_burst_pays_its_debt_and_zero_passes() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(10), 5);
    let got = grants(&limiter, &[("a", 5), ("a", 10), ("a", 1), ("a", 0)]).await;
    // Cost 0 goes at once, even with others of its key waiting.
    assert_eq!(got, "a0@0 a3@0 a1@1000 a2@1100");
    assert_eq!(
        limiter.try_acquire(&"a", 6).unwrap_err().retry_after(),
        Duration::MAX
    );
    assert!(limiter.try_acquire(&"z", 0).is_ok());
}

#[tokio::test(start_paused = true)]
async fn try_acquire_never_jumps_a_keys_queue() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(10), 1);
    limiter.try_acquire(&"a", 1).unwrap();
    let waiter = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.acquire(&"a", 1).await }
    });
    tokio::task::yield_now().await;
    sleep(Duration::from_millis(150)).await; // the waiter took the token at 100 ms
    within_an_hour(waiter).await.unwrap();
    let refused = limiter.try_acquire(&"a", 1).unwrap_err();
    assert_eq!(refused.retry_after(), Duration::from_millis(50));
    // Queue a waiter, and try while it waits: refused even once the token is back.
    let waiter = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.acquire(&"a", 1).await }
    });
    tokio::task::yield_now().await;
    assert_eq!(
        limiter.try_acquire(&"a", 1).unwrap_err().retry_after(),
        Duration::from_millis(150)
    );
    assert!(limiter.try_acquire(&"b", 1).is_ok());
    within_an_hour(waiter).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn acquire_timeout_refuses_at_once_and_takes_nothing() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(1), 1);
    limiter.acquire(&1u8, 1).await;
    let start = Instant::now();
    let refused = limiter
        .acquire_timeout(&1, 1, Duration::from_millis(999))
        .await;
    assert_eq!(refused.unwrap_err().retry_after(), Duration::from_secs(1));
    assert_eq!(nanos_since(start), 0);
    assert_eq!(limiter.stats().rejected, 1);
    limiter
        .acquire_timeout(&1, 1, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(nanos_since(start), 1_000 * MS);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_gives_its_place_back_and_takes_nothing() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(10), 1);
    limiter.try_acquire(&"a", 1).unwrap();
    let start = Instant::now();
    let quitter = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.acquire(&"a", 5).await }
    });
    tokio::task::yield_now().await;
    let stayer = tokio::spawn({
        let limiter = limiter.clone();
        async move {
            limiter.acquire(&"a", 1).await;
            nanos_since(start) / MS
        }
    });
    tokio::task::yield_now().await;
    assert_eq!(limiter.stats().waiting, 2);
    sleep(Duration::from_millis(50)).await;
    quitter.abort();
    // The stayer moves up and is served when its token is back, at 100 ms, not after the
    // quitter's five tokens.
    assert_eq!(within_an_hour(stayer).await.unwrap(), 100);
    assert_eq!(limiter.stats().waiting, 0);
    assert_eq!(limiter.stats().granted, 2);
}

#[tokio::test(start_paused = true)]
async fn an_acquire_dropped_after_its_first_poll_gives_its_place_back() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(10), 1);
    limiter.try_acquire(&"a", 1).unwrap();
    let start = Instant::now();
    // Heading the key's queue (its first poll arms its timer), then queued behind it: each
    // polled once only, its place taken in that poll.
    let mut head = tokio_test::task::spawn(limiter.acquire(&"a", 1));
    let mut behind = tokio_test::task::spawn(limiter.acquire(&"a", 1));
    assert!(head.poll().is_pending());
    assert!(behind.poll().is_pending());
    assert_eq!(limiter.stats().waiting, 2);
    drop(head);
    assert_eq!(limiter.stats().waiting, 1);
    // The one left heads the queue now and goes at 100 ms, when the token is back.
    assert!(behind.is_woken());
    assert!(behind.poll().is_pending());
    tokio::time::advance(Duration::from_millis(99)).await;
    assert!(behind.poll().is_pending());
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(behind.is_woken());
    assert!(behind.poll().is_ready());
    assert_eq!(nanos_since(start) / MS, 100);
    drop(behind);
    assert_eq!(limiter.stats().waiting, 0);
    assert_eq!(limiter.stats().granted, 2);
}

#[tokio::test(start_paused = true)]
async fn set_limit_takes_effect_at_once_for_waiters_and_keeps_the_level() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(1), 1);
    limiter.acquire(&"p", 1).await;
    let start = Instant::now();
    let waiter = tokio::spawn({
        let limiter = limiter.clone();
        async move {
            limiter.acquire(&"p", 1).await;
            nanos_since(start) / MS
        }
    });
    sleep(Duration::from_millis(100)).await;
    // 0.9 token missing at 1/s; at 100/s that is 9 ms.
    limiter.set_limit(&"p", Rate::per_second(100), 5);
    assert_eq!(within_an_hour(waiter).await.unwrap(), 109);
    assert_eq!(limiter.available(&"p"), 0);
    sleep(Duration::from_millis(50)).await;
    assert_eq!(limiter.available(&"p"), 5);
    // Back to the default: the level (5) is capped at the default burst (1).
    limiter.clear_limit(&"p");
    assert_eq!(limiter.available(&"p"), 1);
    limiter.try_acquire(&"p", 1).unwrap();
    assert_eq!(
        limiter.try_acquire(&"p", 1).unwrap_err().retry_after(),
        Duration::from_secs(1)
    );
    // A limit set for a key with no state is used when the key first shows up.
    limiter.set_limit(&"q", Rate::per_second(2), 3);
    assert_eq!(limiter.available(&"q"), 3);
    assert_eq!(limiter.tracked_keys(), 1); // only "p", which is not full
}

/// `set_limit` keeps the level at the extremes of `Rate`: a key emptied at the fastest rate
/// and given the slowest (one token per `Duration::MAX`) at once is empty, whatever its new
/// burst, and not a full bucket, nor a forgotten key that comes back full.
#[tokio::test(start_paused = true)]
async fn set_limit_keeps_the_level_at_the_extremes_of_rate() {
    let fastest = Rate::new(u64::MAX, Duration::from_nanos(1));
    let slowest = Rate::new(1, Duration::MAX);
    let limiter = KeyedRateLimiter::new(fastest, u64::MAX);
    for (key, burst) in [("same burst", u64::MAX), ("burst of one", 1)] {
        limiter.try_acquire(&key, u64::MAX).unwrap();
        limiter.set_limit(&key, slowest, burst);
        assert_eq!(limiter.available(&key), 0, "{key}");
        assert!(
            limiter.try_acquire(&key, 1).unwrap_err().is_never(),
            "{key}"
        );
    }
    limiter.set_limit(&"same burst", slowest, 1);
    assert_eq!(limiter.available(&"same burst"), 0);
    assert!(limiter
        .try_acquire(&"same burst", 1)
        .unwrap_err()
        .is_never());
    // A bucket of one, some time in.
    let limiter = KeyedRateLimiter::new(fastest, 1);
    tokio::time::advance(Duration::from_secs(1)).await;
    limiter.try_acquire(&"k", 1).unwrap();
    limiter.set_limit(&"k", slowest, 1);
    assert_eq!(limiter.available(&"k"), 0);
    let refused = limiter.try_acquire(&"k", 1).unwrap_err();
    assert!(refused.is_never(), "{refused:?}");
    assert_eq!(limiter.tracked_keys(), 1);
}

#[tokio::test(start_paused = true)]
async fn full_idle_keys_are_forgotten_without_any_call() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(10), 2);
    for key in 0..100_000u32 {
        limiter.try_acquire(&key, 1).unwrap();
    }
    assert_eq!(limiter.tracked_keys(), 100_000);
    // Half a token's time later nothing is full yet; a full refill period later all are.
    sleep(Duration::from_millis(99)).await;
    assert_eq!(limiter.tracked_keys(), 100_000);
    sleep(Duration::from_millis(1)).await;
    limiter.try_acquire(&7, 2).unwrap();
    limiter.try_acquire(&7, 1).unwrap_err();
    assert_eq!(limiter.tracked_keys(), 1);
    // Forgotten keys behave exactly as new ones: a full bucket.
    assert_eq!(limiter.available(&12_345), 2);
    assert_eq!(limiter.stats().granted, 100_001);
}

#[tokio::test(start_paused = true)]
async fn a_new_key_that_takes_nothing_is_not_kept() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(10), 2);
    limiter.try_acquire(&"zero", 0).unwrap();
    let refused = limiter.try_acquire(&"dear", 3).unwrap_err();
    assert_eq!(refused.retry_after(), Duration::MAX);
    assert_eq!(limiter.tracked_keys(), 0);
    // A key that took something is kept, and forgotten once full again.
    limiter.try_acquire(&"one", 1).unwrap();
    assert_eq!(limiter.tracked_keys(), 1);
    sleep(Duration::from_millis(100)).await;
    limiter.try_acquire(&"zero", 0).unwrap();
    assert_eq!(limiter.tracked_keys(), 0);
    assert_eq!(limiter.stats().granted, 3);
}

#[tokio::test(start_paused = true)]
async fn a_key_with_waiters_is_kept_even_when_its_bucket_would_be_full() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(10), 1);
    // A cost above the burst waits for a full bucket plus the rest: 1.9 s from empty.
    limiter.try_acquire(&"a", 1).unwrap();
    let waiter = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.acquire(&"a", 20).await }
    });
    sleep(Duration::from_millis(500)).await;
    assert_eq!(limiter.tracked_keys(), 1);
    within_an_hour(waiter).await.unwrap();
    sleep(Duration::from_millis(100)).await;
    assert_eq!(limiter.tracked_keys(), 0);
}

#[test]
fn bad_input_is_a_clear_error() {
    assert_eq!(
        KeyedRateLimiter::<u8>::try_new(Rate::per_second(1), 0).err(),
        Some(ConfigError::ZeroBurst)
    );
    // Rate extremes are valid limits.
    let slow = KeyedRateLimiter::new(Rate::new(1, Duration::MAX), 1);
    slow.try_acquire(&1, 1).unwrap();
    // Saturated: "about 584 years", never a panic.
    let wait = slow.try_acquire(&1, 1).unwrap_err().retry_after();
    assert!(wait > Duration::from_secs(500 * 365 * 86_400), "{wait:?}");
    let fast = KeyedRateLimiter::new(Rate::new(u64::MAX, Duration::from_nanos(1)), u64::MAX);
    fast.try_acquire(&1, u64::MAX).unwrap();
    fast.try_acquire(&1, u64::MAX).unwrap();
}

#[test]
#[should_panic(expected = "`burst` is 0")]
fn new_panics_on_zero_burst() {
    let _ = KeyedRateLimiter::<u8>::new(Rate::per_second(1), 0);
}

#[test]
#[should_panic(expected = "`burst` is 0")]
fn set_limit_panics_on_zero_burst() {
    KeyedRateLimiter::new(Rate::per_second(1), 1).set_limit(&1u8, Rate::per_second(1), 0);
}

#[tokio::test(start_paused = true)]
async fn a_cost_of_u64_max_waits_without_panicking_or_hanging() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(1_000), 10);
    let waited = tokio::time::timeout(Duration::from_secs(3600), limiter.acquire(&1u8, u64::MAX));
    assert!(waited.await.is_err());
    assert_eq!(limiter.stats().waiting, 0);
    assert!(limiter.try_acquire(&1, 10).is_ok());
}

#[test]
fn handles_are_send_sync_and_cheap_to_clone() {
    fn send_sync<T: Send + Sync + Clone>() {}
    send_sync::<KeyedRateLimiter<String>>();
    assert_eq!(
        std::mem::size_of::<KeyedRateLimiter<String>>(),
        std::mem::size_of::<usize>()
    );
}

#[test]
fn debug_shows_the_identity_of_either_shape() {
    let one = KeyedRateLimiter::<u8>::new(Rate::per_second(1), 1);
    let several = KeyedRateLimiter::<u8, [u64; 2]>::builder(["requests", "tokens"])
        .limit("tokens", paced::Limit::bucket(Rate::per_second(1), 1))
        .build()
        .unwrap();
    for shown in [format!("{one:?}"), format!("{several:?}")] {
        assert!(shown.starts_with("KeyedRateLimiter { id: "), "{shown}");
    }
    // Clones are the same limiter; another limiter is another.
    assert_eq!(format!("{one:?}"), format!("{:?}", one.clone()));
    assert_eq!(format!("{several:?}"), format!("{:?}", several.clone()));
    let other = KeyedRateLimiter::<u8>::new(Rate::per_second(1), 1);
    assert_ne!(format!("{one:?}"), format!("{other:?}"));
}

/// Many tasks on a multi-thread runtime in real time: the per-key bound holds across all.
#[test]
fn many_tasks_in_real_time_keep_each_keys_bound() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let (rate, burst) = (400u64, 5u64);
    let limiter = KeyedRateLimiter::new(Rate::per_second(rate), burst);
    let start = std::time::Instant::now();
    let counts = rt.block_on(async {
        let tasks: Vec<_> = (0..16)
            .map(|t| {
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    let key = t % 2;
                    let mut n = 0u64;
                    let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
                    while tokio::time::Instant::now() < deadline {
                        limiter.acquire(&key, 1).await;
                        n += 1;
                    }
                    (key, n)
                })
            })
            .collect();
        let mut counts = [0u64; 2];
        for task in tasks {
            let (key, n) = task.await.unwrap();
            counts[key] += n;
        }
        counts
    });
    let elapsed = start.elapsed().as_secs_f64();
    for (key, &n) in counts.iter().enumerate() {
        let allowed = burst as f64 + rate as f64 * elapsed;
        assert!(n as f64 <= allowed, "key {key}: {n} > {allowed:.0}");
        // And the quota was used: at least half of it.
        assert!(n as f64 >= 0.5 * rate as f64 * 0.3, "key {key}: only {n}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A long random run: after every operation, the keys kept are at most those not full or
    /// waited on (tighter than the goal of twice that plus 64), and grants follow each key's bucket.
    #[test]
    fn tracked_keys_follow_the_keys_in_use(
        ops in prop::collection::vec((0u64..40, 0u32..200, 0u64..4), 1..300),
    ) {
        common::paused(async move {
            let (rate, burst) = (Rate::per_second(20), 3);
            let limiter = KeyedRateLimiter::new(rate, burst);
            let mut model: std::collections::HashMap<u32, NaiveBucket> = Default::default();
            let start = Instant::now();
            for (gap_ms, key, cost) in ops {
                sleep(Duration::from_millis(gap_ms)).await;
                let now = nanos_since(start);
                let bucket = model
                    .entry(key)
                    .or_insert_with(|| NaiveBucket::new(20, Duration::from_secs(1), burst));
                let conforms = bucket.earliest(now, cost) <= now;
                let got = limiter.try_acquire(&key, cost);
                prop_assert_eq!(got.is_ok(), conforms, "key {} cost {} at {}", key, cost, now);
                if conforms {
                    bucket.emit(now, cost);
                }
                let active = model
                    .values()
                    .filter(|b| b.earliest(now, burst) > now)
                    .count();
                let tracked = limiter.tracked_keys();
                prop_assert!(tracked <= active, "{} tracked, {} not full", tracked, active);
                prop_assert!(tracked <= 2 * active + 64);
            }
            Ok(())
        })?;
    }
}

/// Twenty thousand keys fall due at once, which a sweep handles in one pass over the table:
/// exactly the keys still in use are kept and are forgotten in their turn.
#[tokio::test(start_paused = true)]
async fn a_mass_expiry_keeps_exactly_the_keys_in_use() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(10), 1);
    for key in 0..20_000u32 {
        limiter.try_acquire(&key, 1).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(90)).await;
    for key in 100_000..100_010u32 {
        limiter.try_acquire(&key, 1).unwrap();
    }
    limiter.try_acquire(&200_000, 1).unwrap();
    let waiter = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.acquire(&200_000, 1).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    // 110 ms: the twenty thousand are full again; ten keys are not, one has a waiter.
    assert_eq!(limiter.tracked_keys(), 11);
    assert_eq!(limiter.stats().waiting, 1);
    tokio::time::timeout(Duration::from_secs(1), waiter)
        .await
        .expect("the waiter is served")
        .unwrap();
    // 190 ms: the ten are full again; the waiter's key was charged now.
    assert_eq!(limiter.tracked_keys(), 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(limiter.tracked_keys(), 0);
    assert_eq!(limiter.available(&200_000), 1);
}

use crate::exact;

/// One step of a random run against one exact bucket per key.
#[derive(Clone, Debug)]
enum Step {
    Try { key: u8, cost: u64 },
    SetLimit { key: u8, rate: usize, burst: u64 },
    ClearLimit { key: u8 },
}

/// Rates whose state fits a packed word and rates whose state does not (a token of more than
/// 64 bits; time units that overflow 64 bits within nanoseconds).
fn model_rates() -> [Rate; 5] {
    [
        Rate::per_second(20),
        Rate::new(7, Duration::from_millis(1300)),
        Rate::new(3, Duration::from_secs(1)),
        Rate::new(u64::MAX, Duration::from_nanos(3)),
        Rate::new(1, Duration::MAX),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u8..6, 0u64..7).prop_map(|(key, cost)| Step::Try { key, cost }),
        1 => (0u8..6, 0usize..5, 1u64..6)
            .prop_map(|(key, rate, burst)| Step::SetLimit { key, rate, burst }),
        1 => (0u8..6).prop_map(|key| Step::ClearLimit { key }),
    ]
}

fn gap() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => Just(0u64),
        3 => 0u64..1_000_000,
        3 => 0u64..3_000_000_000,
        1 => Just(u64::from(u32::MAX)),
    ]
}

fn exact_bucket(rate: Rate, burst: u64) -> exact::ExactBucket {
    exact::ExactBucket::new(rate.tokens(), rate.per().as_nanos(), burst)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the default rate (a key's state packed in one word, or kept exactly in a lane),
    /// every answer is that of one exact bucket per key: grants, refusals and their waits,
    /// available tokens, and limits changed at run time keeping the level. The keys kept are
    /// exactly those not full: none forgotten early, none kept late.
    #[test]
    fn every_key_is_one_exact_bucket(
        default in 0usize..5,
        default_burst in 1u64..6,
        steps in prop::collection::vec((gap(), step()), 1..200),
    ) {
        common::paused(async move {
            let rates = model_rates();
            let limiter: KeyedRateLimiter<u8> =
                KeyedRateLimiter::new(rates[default], default_burst);
            let start = Instant::now();
            let mut model: std::collections::HashMap<u8, exact::ExactBucket> = Default::default();
            let mut limits: std::collections::HashMap<u8, (Rate, u64)> = Default::default();
            for (gap, step) in steps {
                tokio::time::advance(Duration::from_nanos(gap)).await;
                let now = nanos_since(start);
                for bucket in model.values_mut() {
                    bucket.advance(now);
                }
                match step {
                    Step::Try { key, cost } => {
                        let bucket = model.entry(key).or_insert_with(|| {
                            let (rate, burst) = limits.get(&key).copied()
                                .unwrap_or((rates[default], default_burst));
                            let mut b = exact_bucket(rate, burst);
                            b.advance(now);
                            b
                        });
                        let got = limiter.try_acquire(&key, cost);
                        if cost == 0 || bucket.holds(cost) {
                            prop_assert!(got.is_ok(), "key {} cost {} at {}: {:?}", key, cost, now, got);
                            bucket.take(cost);
                        } else {
                            let refused = got.expect_err("the model refuses");
                            let at = bucket.earliest(cost);
                            if refused.is_never() {
                                prop_assert!(bucket_never(bucket, cost, now), "{:?} at {}", refused, now);
                            } else {
                                prop_assert_eq!(refused.retry_after(), Duration::from_nanos(at - now));
                            }
                        }
                    }
                    Step::SetLimit { key, rate, burst } => {
                        let rate = rates[rate];
                        limiter.set_limit(&key, rate, burst);
                        limits.insert(key, (rate, burst));
                        // A full bucket is a key never seen: it starts afresh at its new limit.
                        model.retain(|_, b| b.full_at() > now);
                        if let Some(bucket) = model.get_mut(&key) {
                            bucket.set_rate(rate.tokens(), rate.per().as_nanos());
                            bucket.set_burst(burst);
                        }
                    }
                    Step::ClearLimit { key } => {
                        limiter.clear_limit(&key);
                        limits.remove(&key);
                        model.retain(|_, b| b.full_at() > now);
                        if let Some(bucket) = model.get_mut(&key) {
                            bucket.set_rate(rates[default].tokens(), rates[default].per().as_nanos());
                            bucket.set_burst(default_burst);
                        }
                    }
                }
                for key in 0..6u8 {
                    let expected = model.get(&key).map_or_else(|| {
                        limits.get(&key).map_or(default_burst, |l| l.1)
                    }, exact::ExactBucket::available);
                    prop_assert_eq!(limiter.available(&key), expected, "key {} at {}", key, now);
                }
                // A key the model has never touched, or full again, is a fresh key.
                let in_use = model.values().filter(|b| b.full_at() > now).count();
                prop_assert_eq!(limiter.tracked_keys(), in_use, "at {}", now);
            }
            Ok(())
        })?;
    }
}

/// Whether a refusal of `cost` "never" is right: a cost above the burst, or a wait beyond what
/// a `u64` of nanoseconds holds.
fn bucket_never(bucket: &exact::ExactBucket, cost: u64, now: u64) -> bool {
    !bucket.holds(cost)
        && (bucket.earliest(cost) == u64::MAX
            || bucket.earliest(cost) - now == u64::MAX
            || cost_above_burst(bucket, cost))
}

fn cost_above_burst(bucket: &exact::ExactBucket, cost: u64) -> bool {
    // A cost above the burst is never held, even by a full bucket.
    let mut full = bucket.clone();
    full.advance(u64::MAX);
    !full.holds(cost)
}
