//! `KeyedRateLimiter`: several limits per key, under paused time, with exact times; and a
//! proptest against a naive model of each key's queue and limits that never forgets a key.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use paced::limiter::KeyedPermit;
use paced::{ConfigError, KeyedRateLimiter, Limit, Rate};
use tokio::time::{sleep, timeout, Instant};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Requests: 1 per 100 ms (burst `requests`); tokens: 1 per 10 ms (burst 100).
fn llm(requests: u64) -> KeyedRateLimiter<&'static str, [u64; 2]> {
    KeyedRateLimiter::builder(["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_second(10), requests))
        .limit("tokens", Limit::bucket(Rate::per_second(100), 100))
        .build()
        .unwrap()
}

type Log = Arc<Mutex<Vec<String>>>;

/// Spawns a task that acquires `cost` of `key` and logs `name` at its grant, as
/// "<ms>ms:<name>".
fn spawn_logged(
    limiter: &KeyedRateLimiter<&'static str, [u64; 2]>,
    log: &Log,
    start: Instant,
    (key, name): (&'static str, &'static str),
    cost: [u64; 2],
) -> tokio::task::JoinHandle<KeyedPermit<&'static str, 2>> {
    let (limiter, log) = (limiter.clone(), log.clone());
    tokio::spawn(async move {
        let permit = limiter.acquire(&key, cost).await;
        let at = start.elapsed().as_millis();
        log.lock().unwrap().push(format!("{at}ms:{name}"));
        permit
    })
}

fn timeline(log: &Log) -> String {
    log.lock().unwrap().join(" ")
}

#[tokio::test(start_paused = true)]
async fn each_keys_wait_is_the_latest_of_its_limits_waits() {
    // Requests: 1 per 500 ms, burst 1; tokens: 1 per 10 ms, burst 100.
    let limiter: KeyedRateLimiter<u32, [u64; 2]> =
        KeyedRateLimiter::builder(["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_second(2), 1))
            .limit("tokens", Limit::bucket(Rate::per_second(100), 100))
            .build()
            .unwrap();
    let start = Instant::now();
    let mut at = Vec::new();
    // Requests ready at 0, 500, 1000, 1600; tokens at 0, 200, 1100, 1100 (the latest wins).
    for cost in [[1, 100], [1, 20], [1, 90], [1, 0]] {
        limiter.acquire(&1, cost).await;
        at.push(start.elapsed().as_millis());
    }
    assert_eq!(at, [0, 500, 1100, 1600]);
    // Key 2 never waited for key 1: its own limits are full.
    limiter.acquire(&2, [1, 100]).await;
    assert_eq!(start.elapsed(), ms(1_600));
    assert_eq!(limiter.available(&2), [0, 0]);
    assert_eq!(limiter.available(&3), [1, 100]);
}

#[tokio::test(start_paused = true)]
async fn a_keys_dear_head_is_not_overtaken_by_its_cheap_requests() {
    let limiter = llm(100);
    let start = Instant::now();
    let log = Log::default();
    limiter.acquire(&"a", [1, 100]).await; // a's tokens empty
    let big = spawn_logged(&limiter, &log, start, ("a", "big"), [1, 100]);
    tokio::task::yield_now().await;
    let mut cheap = Vec::new();
    for name in ["a1", "a2"] {
        cheap.push(spawn_logged(&limiter, &log, start, ("a", name), [1, 1]));
        tokio::task::yield_now().await;
    }
    // Another key goes at once, whatever waits on "a".
    cheap.push(spawn_logged(&limiter, &log, start, ("b", "b"), [1, 100]));
    assert!(
        limiter.try_acquire(&"a", [0, 1]).is_err(),
        "try_acquire jumps the queue"
    );
    timeout(ms(5_000), big).await.unwrap().unwrap();
    for task in cheap {
        timeout(ms(5_000), task).await.unwrap().unwrap();
    }
    assert_eq!(timeline(&log), "0ms:b 1000ms:big 1010ms:a1 1020ms:a2");
}

#[tokio::test(start_paused = true)]
async fn try_acquire_charges_nothing_when_any_limit_refuses() {
    let limiter = llm(1);
    limiter.try_acquire(&"a", [1, 30]).unwrap();
    assert_eq!(limiter.available(&"a"), [0, 70]);
    // Requests refuse (100 ms), tokens would grant: nothing is charged anywhere.
    let refused = limiter.try_acquire(&"a", [1, 10]).unwrap_err();
    assert_eq!(refused.retry_after(), ms(100));
    assert_eq!(limiter.available(&"a"), [0, 70]);
    // Both refuse: the latest wait (tokens 200 ms, requests 100 ms).
    assert_eq!(
        limiter
            .try_acquire(&"a", [1, 90])
            .unwrap_err()
            .retry_after(),
        ms(200)
    );
    assert_eq!(limiter.available(&"a"), [0, 70]);
    // A cost above a burst can never be had without waiting.
    assert!(limiter.try_acquire(&"a", [0, 101]).unwrap_err().is_never());
    assert!(limiter.try_acquire(&"b", [2, 0]).unwrap_err().is_never());
    // A refused new key holds no state.
    assert_eq!(limiter.tracked_keys(), 1);
    assert_eq!((limiter.stats().granted, limiter.stats().rejected), (1, 4));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_takes_nothing() {
    let limiter = llm(100);
    let start = Instant::now();
    limiter.acquire(&"a", [1, 100]).await;
    let waiter = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.acquire(&"a", [1, 50]).await }
    });
    sleep(ms(300)).await;
    waiter.abort();
    let _ = waiter.await;
    assert_eq!(limiter.stats().waiting, 0);
    // The bucket refilled 30 tokens and lost none to the dropped waiter.
    assert_eq!(limiter.available(&"a")[1], 30);
    limiter.acquire(&"a", [1, 100]).await;
    assert_eq!(start.elapsed(), ms(1_000));
}

#[tokio::test(start_paused = true)]
async fn settling_corrects_one_key_only() {
    let limiter = llm(100);
    let start = Instant::now();
    let log = Log::default();
    let permit = limiter.acquire(&"a", [1, 100]).await;
    let b = limiter.acquire(&"b", [1, 100]).await;
    let waiter = spawn_logged(&limiter, &log, start, ("a", "a"), [1, 60]);
    sleep(ms(200)).await; // a holds 20 tokens, its waiter lacks 40
                          // The answer used 30: 70 come back at once, and the waiter goes now.
    permit.settle([1, 30]);
    timeout(ms(1), waiter).await.unwrap().unwrap();
    assert_eq!(timeline(&log), "200ms:a");
    assert_eq!(limiter.available(&"a"), [99, 30]);
    // b used 300: 200 of debt on b alone.
    b.settle([1, 300]);
    assert_eq!(limiter.available(&"a"), [99, 30]);
    assert_eq!(limiter.available(&"b"), [100, 0]);
    let before = Instant::now();
    limiter.acquire(&"b", [0, 10]).await;
    // At 200 ms b's bucket was back to 20 before its debt: 180 more, then 10.
    assert_eq!(before.elapsed(), ms(1_900));
}

#[tokio::test(start_paused = true)]
async fn a_key_is_forgotten_once_every_limit_is_as_new() {
    let start = Instant::now();
    let limiter: KeyedRateLimiter<u32, [u64; 2]> =
        KeyedRateLimiter::builder(["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_second(10), 1))
            .limit(
                "tokens",
                Limit::window(100, ms(1_000)).aligned_to_instant(start),
            )
            .build()
            .unwrap();
    limiter.try_acquire(&1, [1, 0]).unwrap();
    limiter.try_acquire(&2, [0, 10]).unwrap();
    let permit = limiter.try_acquire(&3, [0, 10]).unwrap();
    assert_eq!(limiter.tracked_keys(), 3);
    sleep(ms(100)).await;
    // Key 1's bucket is full; keys 2 and 3 have used their window.
    assert_eq!(limiter.tracked_keys(), 2);
    // Key 3 used nothing after all: given back in the same window, it is as new.
    permit.settle([0, 0]);
    assert_eq!(limiter.tracked_keys(), 1);
    // Key 2's window ends at 1_000 ms.
    sleep(ms(899)).await;
    assert_eq!(limiter.tracked_keys(), 1);
    sleep(ms(1)).await;
    assert_eq!(limiter.tracked_keys(), 0);
    assert_eq!(limiter.available(&2), [1, 100]);
    // A cost above the quota carries into the next windows: kept until the carry is gone.
    limiter.acquire(&4, [0, 250]).await;
    sleep(ms(2_999)).await;
    assert_eq!(limiter.tracked_keys(), 1);
    sleep(ms(1)).await;
    assert_eq!(limiter.tracked_keys(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_keys_own_limit_keeps_the_level_and_clears() {
    let limiter = llm(2);
    limiter.try_acquire(&"a", [2, 50]).unwrap();
    // A bigger plan for "a": 10 requests; the level is kept (0 of them held).
    limiter.set_limit(&"a", 0, Limit::bucket(Rate::per_second(10), 10));
    assert_eq!(limiter.available(&"a"), [0, 50]);
    assert_eq!(limiter.available(&"b"), [2, 100]);
    sleep(ms(1_000)).await;
    assert_eq!(limiter.available(&"a"), [10, 100]);
    // Its own limit is configuration: kept while the key has no state.
    assert_eq!(limiter.tracked_keys(), 0);
    assert_eq!(limiter.available(&"a"), [10, 100]);
    limiter.clear_limit(&"a");
    assert_eq!(limiter.available(&"a"), [2, 100]);
    // Bad changes change nothing.
    let window = Limit::window(5, ms(60_000));
    assert_eq!(
        limiter.try_set_limit(&"a", 0, window),
        Err(ConfigError::LimitKind)
    );
    assert_eq!(
        limiter.try_set_limit(&"a", 2, window),
        Err(ConfigError::NoSuchLimit)
    );
    assert_eq!(
        limiter.try_set_limit(&"a", 1, Limit::bucket(Rate::per_second(1), 0)),
        Err(ConfigError::ZeroBurst)
    );
    assert_eq!(limiter.available(&"a"), [2, 100]);
}

#[tokio::test(start_paused = true)]
async fn acquire_timeout_refuses_at_once_and_takes_nothing() {
    let limiter = llm(1);
    limiter.acquire(&"a", [1, 100]).await;
    let start = Instant::now();
    let refused = limiter
        .acquire_timeout(&"a", [1, 50], ms(400))
        .await
        .unwrap_err();
    assert_eq!(refused.retry_after(), ms(500));
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(limiter.available(&"a"), [0, 0]);
    let permit = limiter
        .acquire_timeout(&"a", [1, 50], ms(500))
        .await
        .unwrap();
    assert_eq!(permit.charged(), [1, 50]);
    assert_eq!(start.elapsed(), ms(500));
}

#[tokio::test(start_paused = true)]
async fn throttle_by_key_waits_for_each_keys_latest_limit_in_order() {
    use futures_util::StreamExt;
    use paced::PaceExt;

    // Requests: 1 per 500 ms, burst 1; tokens: 100 per second, burst 100.
    let tenants: KeyedRateLimiter<&str, [u64; 2]> =
        KeyedRateLimiter::builder(["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_second(2), 1))
            .limit("tokens", Limit::bucket(Rate::per_second(100), 100))
            .build()
            .unwrap();
    let start = Instant::now();
    let calls = [("a", 100), ("a", 10), ("b", 100), ("a", 50), ("b", 20)];
    let sent: Vec<_> = futures_util::stream::iter(calls)
        .throttle_by_key(&tenants, |c| c.0, |c| [1, c.1], 8)
        .map(|c| (c.0, c.1, start.elapsed().as_millis()))
        .collect()
        .await;
    // a: 0; then 10 tokens at 100 ms but a request at 500 ms; then 50 tokens at 600 ms (40
    // left at 500 ms) but a request at 1,000 ms. b: 0; 20 tokens at 200 ms but a request at
    // 500 ms.
    assert_eq!(
        sent,
        [
            ("a", 100, 0),
            ("b", 100, 0),
            ("a", 10, 500),
            ("b", 20, 500),
            ("a", 50, 1_000),
        ]
    );
    assert_eq!(tenants.stats().granted, 5);
}

#[cfg(feature = "tower")]
#[tokio::test(start_paused = true)]
async fn a_keyed_tower_layer_charges_each_keys_limits() {
    use paced::tower::RateLimitLayer;
    use tower::{Layer, ServiceExt};

    let tenants: KeyedRateLimiter<u32, [u64; 2]> =
        KeyedRateLimiter::builder(["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_second(10), 10))
            .limit("tokens", Limit::bucket(Rate::per_second(100), 100))
            .build()
            .unwrap();
    // A request: (tenant, estimated tokens).
    let service = RateLimitLayer::keyed(&tenants, |r: &(u32, u64)| r.0)
        .cost(|r: &(u32, u64)| [1, r.1])
        .layer(tower::service_fn(|r: (u32, u64)| async move {
            Ok::<_, std::convert::Infallible>(r)
        }));
    let start = Instant::now();
    service.clone().oneshot((1, 100)).await.unwrap();
    service.clone().oneshot((2, 100)).await.unwrap(); // another tenant
    assert_eq!(start.elapsed(), Duration::ZERO);
    service.clone().oneshot((1, 30)).await.unwrap(); // 30 tokens: 300 ms
    assert_eq!(start.elapsed(), ms(300));
    assert_eq!(tenants.available(&1), [9, 0]);
    assert_eq!(tenants.available(&2), [10, 30]);
    // Enforcing: refused with the latest of the key's waits, nothing charged.
    let enforcing = RateLimitLayer::keyed(&tenants, |r: &(u32, u64)| r.0)
        .cost(|r: &(u32, u64)| [1, r.1])
        .enforcing()
        .layer(tower::service_fn(|r: (u32, u64)| async move {
            Ok::<_, std::convert::Infallible>(r)
        }));
    let refused = enforcing.clone().oneshot((2, 50)).await.unwrap_err();
    let refused = refused.downcast_ref::<paced::tower::RateLimited>().unwrap();
    assert_eq!(refused.retry_after(), ms(200));
    assert_eq!(tenants.available(&2), [10, 30]);
    enforcing.oneshot((2, 30)).await.unwrap();
    assert_eq!(tenants.available(&2), [9, 0]);
}

#[test]
fn handles_and_permits_cross_threads() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    let limiter = llm(1);
    send_sync(&limiter);
    send(&limiter.acquire(&"a", [1, 1]));
    send(&limiter.try_acquire(&"a", [0, 1]).unwrap());
}

#[test]
fn names_are_checked() {
    let twice = KeyedRateLimiter::<u8, [u64; 2]>::builder(["tokens", "tokens"]).build();
    assert_eq!(twice.err(), Some(ConfigError::DuplicateDimension));
    let zero = KeyedRateLimiter::<u8, [u64; 1]>::builder(["tokens"])
        .limit("tokens", Limit::window(0, ms(1)))
        .build();
    assert_eq!(zero.err(), Some(ConfigError::ZeroQuota));
}

use crate::multi_model as model;

mod exact {

    use paced::limiter::KeyedPermit;
    use paced::{KeyedRateLimiter, Limit, Rate};
    use proptest::prelude::*;
    use tokio::sync::mpsc;
    use tokio::time::{sleep, Instant};

    use super::model::{Queue, Rule};
    use super::ms;

    const KEYS: u8 = 3;

    #[derive(Clone, Debug)]
    enum Op {
        Arrive(u8, [u64; 2]),
        TryAcquire(u8, [u64; 2]),
        Advance(u64),
        /// The waiter at this place (modulo their number, over all keys) gives up.
        Cancel(usize),
        /// The permit at this place (modulo their number) is settled to this share (in %) of
        /// its charge, or above it.
        Settle(usize, u64),
        /// The key gets its own limit at this index: the requests' burst `to`, the tokens'
        /// burst `5 × to`, or the window's quota `10 × to` (rates and window length kept).
        SetLimit(u8, usize, u64),
        /// The key gets the builder's limits again.
        ClearLimit(u8),
    }

    /// The value a key's own limit at `index` is set to by `SetLimit(_, index, to)`.
    fn own_value(index: usize, to: u64) -> u64 {
        [to, 5 * to, 10 * to][index]
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        let cost = (0u64..=2, 0u64..=25).prop_map(|(r, t)| [r, t]);
        prop::collection::vec(
            prop_oneof![
                6 => (0..KEYS, cost.clone()).prop_map(|(k, c)| Op::Arrive(k, c)),
                2 => (0..KEYS, cost).prop_map(|(k, c)| Op::TryAcquire(k, c)),
                4 => prop_oneof![Just(0u64), 1u64..20, 1u64..400].prop_map(Op::Advance),
                1 => any::<usize>().prop_map(Op::Cancel),
                3 => (any::<usize>(), 0u64..=200).prop_map(|(i, p)| Op::Settle(i, p)),
                2 => (0..KEYS, 0usize..3, 1u64..=6).prop_map(|(k, i, to)| Op::SetLimit(k, i, to)),
                1 => (0..KEYS).prop_map(Op::ClearLimit),
            ],
            1..50,
        )
    }

    type Granted = (usize, u64, KeyedPermit<u8, 2>);

    /// A grant not settled yet: its key, when, what it charged, and its permit.
    type Open = (u8, u64, [u64; 2], Option<KeyedPermit<u8, 2>>);

    /// Lets every task woken at this instant run.
    async fn settle_down(n: usize) {
        for _ in 0..n + 4 {
            tokio::task::yield_now().await;
        }
    }

    /// Changes a key's limits from `was` to `will` (requests' burst, tokens' burst, window's
    /// quota) at `now`, as `set_limit` and `clear_limit` do: a key as new (full, nothing
    /// used, nobody waiting) is a key never seen, which starts afresh, full at its new
    /// limits; any other keeps the level of each limit that changes (`Rule::set`, as for
    /// `RateLimiter::set_limit`), and its head re-reads its deadline now.
    fn reconfigure(
        key: &mut Queue,
        was: [u64; 3],
        will: [u64; 3],
        now: u64,
        fresh: impl Fn([u64; 3]) -> Queue,
    ) {
        if key.is_new_at(now) {
            *key = fresh(will);
            return;
        }
        for (index, (&was, &will)) in was.iter().zip(&will).enumerate() {
            if was != will {
                key.limits[index].1.set(now, will);
            }
        }
        key.floor = now;
    }

    #[allow(clippy::too_many_lines)]
    async fn replay(
        (per_r, burst_r, per_t, burst_t, quota, len, offset): (u64, u64, u64, u64, u64, u64, u64),
        ops: Vec<Op>,
    ) -> Result<(), TestCaseError> {
        let start = Instant::now();
        let limiter: KeyedRateLimiter<u8, [u64; 2]> =
            KeyedRateLimiter::builder(["requests", "tokens"])
                .limit("requests", Limit::bucket(Rate::new(1, ms(per_r)), burst_r))
                .limit("tokens", Limit::bucket(Rate::new(1, ms(per_t)), burst_t))
                .limit(
                    "tokens",
                    Limit::window(quota, ms(len)).aligned_to_instant(start + ms(offset)),
                )
                .build()
                .unwrap();
        // The limits of a key whose own limits (requests' burst, tokens' burst, window's
        // quota) are `own`, the builder's where it has none.
        let defaults = [burst_r, burst_t, quota];
        let effective = |own: [Option<u64>; 3]| [0, 1, 2].map(|i| own[i].unwrap_or(defaults[i]));
        let fresh = |[burst_r, burst_t, quota]: [u64; 3]| {
            Queue::new(vec![
                (0, Rule::bucket(per_r, burst_r)),
                (1, Rule::bucket(per_t, burst_t)),
                (1, Rule::window(quota, len, offset % len)),
            ])
        };
        // One queue per key, never forgotten, and each key's own limits.
        let mut keys = vec![fresh(defaults); usize::from(KEYS)];
        let mut own = vec![[None; 3]; usize::from(KEYS)];
        // The largest bursts ever set, for the final wait.
        let (mut most_r, mut most_t) = (burst_r, burst_t);
        let mut grants: Vec<(usize, u64)> = Vec::new();
        let (tx, mut rx) = mpsc::unbounded_channel::<Granted>();
        let mut tasks: Vec<(usize, tokio::task::JoinHandle<()>)> = Vec::new();
        let mut seen: Vec<(usize, u64)> = Vec::new();
        // Granted, unsettled: (key, at, charged, permit).
        let mut permits: Vec<Open> = Vec::new();
        // Which key each request is of.
        let mut key_of: Vec<u8> = Vec::new();
        let mut now = 0u64;
        for op in ops {
            match op {
                Op::Arrive(k, cost) => {
                    let id = key_of.len();
                    key_of.push(k);
                    let key = &mut keys[usize::from(k)];
                    if cost == [0, 0] {
                        grants.push((id, now));
                    } else if key.queue.is_empty() && key.earliest(now, cost) <= now {
                        key.commit(now, cost);
                        grants.push((id, now));
                    } else {
                        key.queue.push_back((id, cost, now));
                    }
                    let (limiter, tx) = (limiter.clone(), tx.clone());
                    let task = tokio::spawn(async move {
                        let permit = limiter.acquire(&k, cost).await;
                        let at = u64::try_from(start.elapsed().as_millis()).unwrap();
                        let _ = tx.send((id, at, permit));
                    });
                    tasks.push((id, task));
                }
                Op::TryAcquire(k, cost) => {
                    let key = &mut keys[usize::from(k)];
                    let expected = cost == [0, 0]
                        || (!key.limits.iter().any(|(d, r)| r.is_above_burst(cost[*d]))
                            && key.queue.is_empty()
                            && key.earliest(now, cost) <= now);
                    let got = limiter.try_acquire(&k, cost);
                    prop_assert_eq!(got.is_ok(), expected, "try_acquire {:?} at {}", cost, now);
                    if let Ok(permit) = got {
                        if cost != [0, 0] {
                            key.commit(now, cost);
                        }
                        permits.push((k, now, cost, Some(permit)));
                    }
                }
                Op::Advance(d) => {
                    for key in &mut keys {
                        key.advance_to(now + d, &mut grants);
                    }
                    now += d;
                    sleep(ms(d)).await;
                }
                Op::Cancel(i) => {
                    let waiting: Vec<(usize, usize)> = keys
                        .iter()
                        .enumerate()
                        .flat_map(|(k, key)| (0..key.queue.len()).map(move |j| (k, j)))
                        .collect();
                    if !waiting.is_empty() {
                        let (k, j) = waiting[i % waiting.len()];
                        let key = &mut keys[k];
                        let (id, _, _) = key.queue.remove(j).unwrap();
                        if j == 0 {
                            if let Some(next) = key.queue.front_mut() {
                                next.2 = now;
                            }
                        }
                        let task = tasks.iter().find(|t| t.0 == id).unwrap();
                        task.1.abort();
                    }
                }
                Op::Settle(i, share) => {
                    let open: Vec<usize> = (0..permits.len())
                        .filter(|&j| permits[j].3.is_some())
                        .collect();
                    if !open.is_empty() {
                        let j = open[i % open.len()];
                        let (k, at, charged, permit) = &mut permits[j];
                        let key = &mut keys[usize::from(*k)];
                        let actual = charged.map(|c| c * share / 100);
                        let mut returned = false;
                        for (dim, rule) in &mut key.limits {
                            let (c, a) = (charged[*dim], actual[*dim]);
                            if a < c {
                                returned = true;
                                rule.refund(now, *at, c, a);
                            } else if a > c {
                                rule.charge(now, a - c, true);
                            }
                        }
                        if returned {
                            key.floor = now;
                        }
                        permit.take().unwrap().settle(actual);
                    }
                }
                Op::SetLimit(k, index, to) => {
                    let limit = match index {
                        0 => Limit::bucket(Rate::new(1, ms(per_r)), to),
                        1 => Limit::bucket(Rate::new(1, ms(per_t)), 5 * to),
                        _ => Limit::window(10 * to, ms(len)).aligned_to_instant(start + ms(offset)),
                    };
                    limiter.set_limit(&k, index, limit);
                    (most_r, most_t) = (most_r.max(to), most_t.max(5 * to));
                    let k = usize::from(k);
                    let mut next = own[k];
                    next[index] = Some(own_value(index, to));
                    reconfigure(&mut keys[k], effective(own[k]), effective(next), now, fresh);
                    own[k] = next;
                }
                Op::ClearLimit(k) => {
                    limiter.clear_limit(&k);
                    let k = usize::from(k);
                    // A key without limits of its own is not changed at all.
                    if own[k] != [None; 3] {
                        let builder = effective([None; 3]);
                        reconfigure(&mut keys[k], effective(own[k]), builder, now, fresh);
                    }
                    own[k] = [None; 3];
                }
            }
            for key in &mut keys {
                key.advance_to(now, &mut grants);
            }
            settle_down(tasks.len()).await;
            while let Ok((id, at, permit)) = rx.try_recv() {
                seen.push((id, at));
                permits.push((key_of[id], at, permit.charged(), Some(permit)));
            }
            // Each key's grants by acquire, in order (those of try_acquire are in neither
            // list); keys granted at one instant may be seen in any order.
            for k in 0..KEYS {
                let of = |g: &&(usize, u64)| key_of[g.0] == k;
                let seen: Vec<_> = seen.iter().filter(of).collect();
                let expected: Vec<_> = grants.iter().filter(of).collect();
                prop_assert_eq!(seen, expected, "key {} at {} ms", k, now);
            }
            // The limiter holds state for exactly the keys not as new: a key forgotten is
            // one the model, which forgets nothing, finds as good as new. A key's own limits
            // are configuration, kept whether or not it holds state: a key forgotten comes
            // back under them (the model's limits are the key's own throughout).
            // Every key's limits, its own or the builder's, whether or not it holds state.
            for (k, key) in (0..KEYS).zip(&keys) {
                let available = key.available(now);
                prop_assert_eq!(limiter.available(&k), available, "key {} at {} ms", k, now);
            }
            let held = keys.iter().filter(|k| !k.is_new_at(now)).count();
            prop_assert_eq!(limiter.tracked_keys(), held, "tracked at {} ms", now);
        }
        for (_, task) in tasks {
            task.abort();
        }
        settle_down(0).await;
        // Long after: every window rolled over, every bucket full, nobody waiting.
        sleep(ms(100 * (len + per_r * most_r + per_t * most_t) + 100_000)).await;
        prop_assert_eq!(limiter.tracked_keys(), 0);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        #[test]
        fn the_keyed_limiter_is_the_naive_model_of_each_key(
            limits in (1u64..50, 1u64..4, 1u64..10, 5u64..30, 10u64..60, 50u64..500, 0u64..500),
            ops in ops(),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(replay(limits, ops))?;
        }
    }
}
