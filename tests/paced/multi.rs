//! `RateLimiter`: several limits at once, under paused time, with exact times; and a
//! proptest against a naive model of the queue and of every limit.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use paced::limiter::Permit;
use paced::{ConfigError, Limit, Rate, RateLimiter};
use tokio::time::{advance, sleep, timeout, Instant};

const MS: Duration = Duration::from_millis(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Requests: 1 per 100 ms (burst `requests`); tokens: 1 per 10 ms (burst 100).
fn llm(requests: u64) -> RateLimiter<[u64; 2]> {
    RateLimiter::builder(["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_second(10), requests))
        .limit("tokens", Limit::bucket(Rate::per_second(100), 100))
        .build()
        .unwrap()
}

/// Spawns a task that acquires `cost` and logs `name` at its grant, as "<ms>ms:<name>".
fn spawn_logged(
    limiter: &RateLimiter<[u64; 2]>,
    log: &Arc<Mutex<Vec<String>>>,
    start: Instant,
    name: &'static str,
    cost: [u64; 2],
) -> tokio::task::JoinHandle<Permit<2>> {
    let (limiter, log) = (limiter.clone(), log.clone());
    tokio::spawn(async move {
        let permit = limiter.acquire(cost).await;
        let at = start.elapsed().as_millis();
        log.lock().unwrap().push(format!("{at}ms:{name}"));
        permit
    })
}

fn timeline(log: &Arc<Mutex<Vec<String>>>) -> String {
    log.lock().unwrap().join(" ")
}

#[tokio::test(start_paused = true)]
async fn a_dear_head_is_not_overtaken_by_cheap_requests() {
    let limiter = llm(100);
    let start = Instant::now();
    let log = Arc::new(Mutex::new(Vec::new()));
    limiter.acquire([1, 100]).await; // tokens empty
    let big = spawn_logged(&limiter, &log, start, "big", [1, 100]);
    tokio::task::yield_now().await;
    let mut cheap = Vec::new();
    for name in ["a", "b", "c"] {
        cheap.push(spawn_logged(&limiter, &log, start, name, [1, 1]));
        tokio::task::yield_now().await;
    }
    // The cheap ones could go at 10 ms, but the big one heads the queue.
    assert!(
        limiter.try_acquire([0, 1]).is_err(),
        "try_acquire jumps the queue"
    );
    timeout(ms(5_000), big).await.unwrap().unwrap();
    for task in cheap {
        timeout(ms(5_000), task).await.unwrap().unwrap();
    }
    assert_eq!(timeline(&log), "1000ms:big 1010ms:a 1020ms:b 1030ms:c");
}

#[tokio::test(start_paused = true)]
async fn every_wait_is_the_latest_of_the_limits_waits() {
    // Requests: 1 per 500 ms, burst 1; tokens: 1 per 10 ms, burst 100.
    let limiter = RateLimiter::builder(["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_second(2), 1))
        .limit("tokens", Limit::bucket(Rate::per_second(100), 100))
        .build()
        .unwrap();
    let start = Instant::now();
    let mut at = Vec::new();
    // Requests ready at 0, 500, 1000, 1600; tokens at 0, 200, 1100, 1100 (the latest wins).
    for cost in [[1, 100], [1, 20], [1, 90], [1, 0]] {
        limiter.acquire(cost).await;
        at.push(start.elapsed().as_millis());
    }
    assert_eq!(at, [0, 500, 1100, 1600]);
    // Tokens bind alone: 100 tokens after 1_100 ms of 10 ms each -> ...
    let before = Instant::now();
    limiter.acquire([0, 100]).await;
    // At 1600 the bucket holds 50 (full at 2100): 50 more take 500 ms.
    assert_eq!(before.elapsed(), ms(500));
}

#[tokio::test(start_paused = true)]
async fn try_acquire_charges_nothing_when_any_limit_refuses() {
    let limiter = llm(1);
    limiter.try_acquire([1, 30]).unwrap();
    assert_eq!(limiter.available(), [0, 70]);
    // Requests refuse (100 ms), tokens would grant: nothing is charged anywhere.
    let refused = limiter.try_acquire([1, 10]).unwrap_err();
    assert_eq!(refused.retry_after(), ms(100));
    assert_eq!(limiter.available(), [0, 70]);
    // Both refuse: the latest wait (tokens: 80 - 70 = 10 more at 10 ms each, 100 ms; requests
    // 100 ms; then 90: 200 ms).
    assert_eq!(
        limiter.try_acquire([1, 90]).unwrap_err().retry_after(),
        ms(200)
    );
    assert_eq!(limiter.available(), [0, 70]);
    // A cost above a burst can never be had without waiting.
    assert!(limiter.try_acquire([0, 101]).unwrap_err().is_never());
    assert!(limiter.try_acquire([2, 0]).unwrap_err().is_never());
    assert_eq!(limiter.stats().rejected, 4);
    assert_eq!(limiter.stats().granted, 1);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_takes_nothing() {
    let limiter = llm(100);
    let start = Instant::now();
    limiter.acquire([1, 100]).await;
    let waiter = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.acquire([1, 50]).await }
    });
    sleep(ms(300)).await;
    waiter.abort();
    let _ = waiter.await;
    assert_eq!(limiter.stats().waiting, 0);
    // The bucket refilled 30 tokens and lost none to the dropped waiter.
    assert_eq!(limiter.available()[1], 30);
    limiter.acquire([1, 100]).await;
    assert_eq!(start.elapsed(), ms(1_000));
}

#[tokio::test(start_paused = true)]
async fn set_limit_keeps_the_level() {
    let limiter = RateLimiter::builder(["requests", "tokens"])
        .limit("tokens", Limit::bucket(Rate::per_second(100), 100))
        .limit(
            "tokens",
            Limit::window(500, ms(10_000)).aligned_to_instant(Instant::now()),
        )
        .build()
        .unwrap();
    let start = Instant::now();
    limiter.acquire([0, 80]).await;
    assert_eq!(limiter.available(), [u64::MAX, 20]);
    limiter.set_limit(0, Limit::bucket(Rate::per_second(10), 50));
    assert_eq!(limiter.available(), [u64::MAX, 20]);
    limiter.set_limit(1, Limit::window(110, ms(10_000)).aligned_to_instant(start));
    assert_eq!(limiter.available(), [u64::MAX, 20]); // the bucket's 20; the window's 30
                                                     // The bucket lacks 10 at 10 tokens/s: 1 s; then the window is spent until 10 s.
    limiter.acquire([0, 30]).await;
    assert_eq!(start.elapsed(), ms(1_000));
    limiter.acquire([0, 20]).await;
    assert_eq!(start.elapsed(), ms(10_000));
    assert_eq!(
        limiter.try_set_limit(1, Limit::bucket(Rate::per_second(1), 1)),
        Err(ConfigError::LimitKind)
    );
    assert_eq!(
        limiter.try_set_limit(2, Limit::bucket(Rate::per_second(1), 1)),
        Err(ConfigError::NoSuchLimit)
    );
    assert_eq!(
        limiter.try_set_limit(0, Limit::bucket(Rate::per_second(1), 0)),
        Err(ConfigError::ZeroBurst)
    );
}

#[tokio::test(start_paused = true)]
async fn settling_down_returns_the_difference_and_wakes_who_it_admits() {
    let limiter = llm(100);
    let start = Instant::now();
    let log = Arc::new(Mutex::new(Vec::new()));
    let permit = limiter.acquire([1, 100]).await;
    let a = spawn_logged(&limiter, &log, start, "a", [1, 40]);
    tokio::task::yield_now().await;
    let b = spawn_logged(&limiter, &log, start, "b", [1, 30]);
    tokio::task::yield_now().await;
    sleep(ms(50)).await; // 5 tokens back (and half a request)
    assert_eq!(limiter.available(), [99, 5]);
    permit.settle([1, 30]); // 70 back at once: 75, both waiters go now
    timeout(ms(1), a).await.unwrap().unwrap();
    timeout(ms(1), b).await.unwrap().unwrap();
    assert_eq!(timeline(&log), "50ms:a 50ms:b");
    assert_eq!(limiter.available(), [97, 5]);
    // Never above the burst.
    let permit = limiter.acquire([0, 5]).await;
    sleep(ms(10_000)).await;
    permit.settle([0, 0]);
    assert_eq!(limiter.available(), [100, 100]);
}

#[tokio::test(start_paused = true)]
async fn settling_up_charges_debt() {
    let limiter = llm(100);
    let start = Instant::now();
    limiter.acquire([1, 50]).await.settle([1, 250]);
    // 150 owed beyond an empty bucket: the level is -150.
    assert_eq!(limiter.available(), [99, 0]);
    limiter.acquire([0, 10]).await;
    assert_eq!(start.elapsed(), ms(1_600));
}

#[tokio::test(start_paused = true)]
async fn a_fixed_window_resets_at_aligned_instants() {
    let day = Duration::from_secs(86_400);
    let start = Instant::now();
    // Days start 6 h before the test's start.
    let midnight = start - Duration::from_secs(6 * 3_600);
    let limiter: RateLimiter<[u64; 1]> = RateLimiter::builder(["requests"])
        .limit(
            "requests",
            Limit::window(3, day).aligned_to_instant(midnight),
        )
        .build()
        .unwrap();
    for _ in 0..3 {
        limiter.acquire([1]).await;
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
    let refused = limiter.try_acquire([1]).unwrap_err();
    assert_eq!(refused.retry_after(), Duration::from_secs(18 * 3_600));
    limiter.acquire([1]).await;
    assert_eq!(start.elapsed(), Duration::from_secs(18 * 3_600));
    // A cost above the quota waits for an unused window and carries: 7 = this day's 3 of
    // the next, and 1 of the one after.
    limiter.acquire([7]).await;
    assert_eq!(start.elapsed(), Duration::from_secs(18 * 3_600) + day);
    assert_eq!(limiter.available(), [0]);
    advance(day).await;
    assert_eq!(limiter.available(), [0]);
    advance(day).await;
    assert_eq!(limiter.available(), [2]);
}

#[tokio::test(start_paused = true)]
async fn a_bucket_of_q_per_day_lets_2q_through_in_a_day_a_window_q() {
    let day = Duration::from_secs(86_400);
    let q = 100;
    let midnight = Instant::now();
    let bucket: RateLimiter<[u64; 1]> = RateLimiter::builder(["tokens"])
        .limit("tokens", Limit::bucket(Rate::new(q, day), q))
        .build()
        .unwrap();
    let window: RateLimiter<[u64; 1]> = RateLimiter::builder(["tokens"])
        .limit("tokens", Limit::window(q, day).aligned_to_instant(midnight))
        .build()
        .unwrap();
    let mut through = [0u64; 2];
    // One token a minute is asked of each, all day.
    while midnight.elapsed() < day {
        for (i, limiter) in [&bucket, &window].into_iter().enumerate() {
            if limiter.try_acquire([1]).is_ok() {
                through[i] += 1;
            }
        }
        advance(Duration::from_secs(60)).await;
    }
    // The bucket: full at midnight (q) and q refilled by the end of the day (the last one at
    // 23:59 minus the refill's rounding).
    assert!(
        through[0] >= 2 * q - 1 && through[0] <= 2 * q,
        "{through:?}"
    );
    assert_eq!(through[1], q);
}

#[test]
fn handles_and_futures_cross_threads() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    let limiter = llm(1);
    send_sync(&limiter);
    send(&limiter.acquire([1, 1]));
    send(&limiter.acquire_timeout([1, 1], MS));
    send_sync(&limiter.try_acquire([1, 1]).unwrap());
}

#[tokio::test(start_paused = true)]
async fn names_are_checked() {
    let unknown = RateLimiter::builder(["requests", "tokens"])
        .limit("token", Limit::bucket(Rate::per_second(1), 1))
        .build();
    assert_eq!(unknown.err(), Some(ConfigError::UnknownDimension));
    let twice = RateLimiter::builder(["a", "a"]).build();
    assert_eq!(twice.err(), Some(ConfigError::DuplicateDimension));
    let zero = RateLimiter::builder(["a"])
        .limit("a", Limit::window(0, MS))
        .build();
    assert_eq!(zero.err(), Some(ConfigError::ZeroQuota));
    let zero = RateLimiter::builder(["a"])
        .limit("a", Limit::window(1, Duration::ZERO))
        .build();
    assert_eq!(zero.err(), Some(ConfigError::ZeroWindow));
}

#[tokio::test(start_paused = true)]
async fn acquire_timeout_refuses_at_once_and_takes_nothing() {
    let limiter = llm(100);
    let start = Instant::now();
    limiter.acquire([1, 100]).await;
    let refused = limiter.acquire_timeout([1, 50], ms(400)).await.unwrap_err();
    assert_eq!(refused.retry_after(), ms(500));
    assert_eq!(start.elapsed(), Duration::ZERO);
    let permit = limiter.acquire_timeout([1, 50], ms(500)).await.unwrap();
    assert_eq!(permit.charged(), [1, 50]);
    assert_eq!(start.elapsed(), ms(500));
}

use crate::multi_model as model;

mod exact {

    use paced::limiter::Permit;
    use paced::{Limit, Rate, RateLimiter};
    use proptest::prelude::*;
    use tokio::sync::mpsc;
    use tokio::time::{sleep, Instant};

    use super::model::{Queue, Rule};
    use super::ms;

    #[derive(Clone, Debug)]
    enum Op {
        Arrive([u64; 2]),
        TryAcquire([u64; 2]),
        Advance(u64),
        /// The waiter at this place (modulo the queue's length) gives up.
        Cancel(usize),
        /// The permit at this place (modulo their number) is settled to this share (in %) of
        /// its charge, or above it.
        Settle(usize, u64),
        /// Limit 0 (requests) gets this burst, or limit 2 (the window) this quota.
        Set(bool, u64),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        let cost = (0u64..=2, 0u64..=25).prop_map(|(r, t)| [r, t]);
        prop::collection::vec(
            prop_oneof![
                6 => cost.clone().prop_map(Op::Arrive),
                2 => cost.prop_map(Op::TryAcquire),
                4 => prop_oneof![Just(0u64), 1u64..20, 1u64..400].prop_map(Op::Advance),
                1 => any::<usize>().prop_map(Op::Cancel),
                3 => (any::<usize>(), 0u64..=200).prop_map(|(i, p)| Op::Settle(i, p)),
                1 => (any::<bool>(), 1u64..6).prop_map(|(w, to)| Op::Set(w, to)),
            ],
            1..50,
        )
    }

    /// The queue and its limits, and the grants made, in order: (id, at).
    struct Model {
        key: Queue,
        grants: Vec<(usize, u64)>,
    }

    impl std::ops::Deref for Model {
        type Target = Queue;
        fn deref(&self) -> &Queue {
            &self.key
        }
    }

    impl std::ops::DerefMut for Model {
        fn deref_mut(&mut self) -> &mut Queue {
            &mut self.key
        }
    }

    impl Model {
        fn advance_to(&mut self, t: u64) {
            self.key.advance_to(t, &mut self.grants);
        }
    }

    type Granted = (usize, u64, Permit<2>);

    /// A grant of `cost` at `at`, as the bound counts it.
    fn charge(at: u64, cost: [u64; 2]) -> (u64, [i128; 2], i128) {
        (at, cost.map(i128::from), i128::from(cost[1]))
    }

    /// Lets every task woken at this instant run (a grant wakes the next waiter, one link a
    /// yield).
    async fn settle_down(n: usize) {
        for _ in 0..n + 4 {
            tokio::task::yield_now().await;
        }
    }

    #[allow(clippy::too_many_lines)]
    async fn replay(
        (per_r, burst_r, per_t, burst_t, quota, len, offset): (u64, u64, u64, u64, u64, u64, u64),
        ops: Vec<Op>,
    ) -> Result<(), TestCaseError> {
        let start = Instant::now();
        let limiter: RateLimiter<[u64; 2]> = RateLimiter::builder(["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::new(1, ms(per_r)), burst_r))
            .limit("tokens", Limit::bucket(Rate::new(1, ms(per_t)), burst_t))
            .limit(
                "tokens",
                Limit::window(quota, ms(len)).aligned_to_instant(start + ms(offset)),
            )
            .build()
            .unwrap();
        let mut model = Model {
            key: Queue::new(vec![
                (0, Rule::bucket(per_r, burst_r)),
                (1, Rule::bucket(per_t, burst_t)),
                (1, Rule::window(quota, len, offset % len)),
            ]),
            grants: Vec::new(),
        };
        let (tx, mut rx) = mpsc::unbounded_channel::<Granted>();
        let mut tasks: Vec<(usize, tokio::task::JoinHandle<()>)> = Vec::new();
        let mut seen: Vec<(usize, u64)> = Vec::new();
        // Granted, unsettled: (id, at, charged, permit).
        let mut permits: Vec<(usize, u64, [u64; 2], Option<Permit<2>>)> = Vec::new();
        // Every charge and correction, counted at its instant, as the bound counts them:
        // (at, amounts, and for the window's dimension only what it applied).
        let mut used: Vec<(u64, [i128; 2], i128)> = Vec::new();
        let mut upward = false;
        // Whether no cost charged was above a burst or a quota (as the bound asks).
        let mut charged_small = true;
        let mut bursts = burst_r;
        let mut quotas = quota;
        let mut now = 0u64;
        let mut next_id = 0usize;
        for op in ops {
            match op {
                Op::Arrive(cost) => {
                    let id = next_id;
                    next_id += 1;
                    if cost == [0, 0] {
                        model.grants.push((id, now));
                    } else if model.queue.is_empty() && model.earliest(now, cost) <= now {
                        model.commit(now, cost);
                        model.grants.push((id, now));
                    } else {
                        model.queue.push_back((id, cost, now));
                    }
                    let (limiter, tx) = (limiter.clone(), tx.clone());
                    let task = tokio::spawn(async move {
                        let permit = limiter.acquire(cost).await;
                        let at = u64::try_from(start.elapsed().as_millis()).unwrap();
                        let _ = tx.send((id, at, permit));
                    });
                    tasks.push((id, task));
                }
                Op::TryAcquire(cost) => {
                    let expected = cost == [0, 0]
                        || (!model.limits.iter().any(|(d, r)| r.is_above_burst(cost[*d]))
                            && model.queue.is_empty()
                            && model.earliest(now, cost) <= now);
                    charged_small &= cost[0] <= burst_r && cost[1] <= burst_t.min(quota);
                    let got = limiter.try_acquire(cost);
                    prop_assert_eq!(got.is_ok(), expected, "try_acquire {:?} at {}", cost, now);
                    if let Ok(permit) = got {
                        if cost != [0, 0] {
                            model.commit(now, cost);
                        }
                        let id = next_id;
                        next_id += 1;
                        permits.push((id, now, cost, Some(permit)));
                        used.push(charge(now, cost));
                    }
                }
                Op::Advance(d) => {
                    model.advance_to(now + d);
                    now += d;
                    sleep(ms(d)).await;
                }
                Op::Cancel(i) => {
                    if !model.queue.is_empty() {
                        let i = i % model.queue.len();
                        let (id, _, _) = model.queue.remove(i).unwrap();
                        if i == 0 {
                            if let Some(next) = model.queue.front_mut() {
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
                        let (_, at, charged, permit) = &mut permits[j];
                        let actual = charged.map(|c| c * share / 100);
                        let mut returned = false;
                        for (dim, rule) in &mut model.limits {
                            let (c, a) = (charged[*dim], actual[*dim]);
                            if a < c {
                                returned = true;
                                rule.refund(now, *at, c, a);
                            } else if a > c {
                                upward = true;
                                rule.charge(now, a - c, true);
                            }
                        }
                        if returned {
                            model.floor = now;
                        }
                        permit.take().unwrap().settle(actual);
                        let delta = [0, 1].map(|d| i128::from(actual[d]) - i128::from(charged[d]));
                        // A fixed window gives back only within the window charged.
                        let same =
                            (now + len - offset % len) / len == (*at + len - offset % len) / len;
                        let window = if delta[1] < 0 && !same { 0 } else { delta[1] };
                        used.push((now, delta, window));
                    }
                }
                Op::Set(window, to) => {
                    if window {
                        let q = to * 10;
                        quotas = quotas.max(q);
                        model.limits[2].1.set(now, q);
                        let origin = start + ms(offset);
                        limiter.set_limit(2, Limit::window(q, ms(len)).aligned_to_instant(origin));
                    } else {
                        bursts = bursts.max(to);
                        model.limits[0].1.set(now, to);
                        limiter.set_limit(0, Limit::bucket(Rate::new(1, ms(per_r)), to));
                    }
                    model.floor = now;
                }
            }
            model.advance_to(now);
            settle_down(model.queue.len() + tasks.len()).await;
            while let Ok((id, at, permit)) = rx.try_recv() {
                seen.push((id, at));
                let charged = permit.charged();
                charged_small &= charged[0] <= burst_r && charged[1] <= burst_t.min(quota);
                permits.push((id, at, charged, Some(permit)));
                used.push(charge(at, charged));
            }
            // Grants by try_acquire are not in either list; those by acquire, in order.
            prop_assert_eq!(&seen, &model.grants, "at {} ms", now);
        }
        for (_, task) in tasks {
            task.abort();
        }
        // The bound, with downward corrections only: a bucket grants at most burst + w * rate
        // in any span of w, a fixed window at most its quota in each window.
        if !upward && charged_small {
            for &(a, ..) in &used {
                for &(b, ..) in used.iter().filter(|u| u.0 >= a) {
                    let within = used.iter().filter(|u| (a..=b).contains(&u.0));
                    let (r, t) = within.fold((0, 0), |s, u| (s.0 + u.1[0], s.1 + u.1[1]));
                    let span = i128::from(b - a);
                    let (per_r, per_t) = (i128::from(per_r), i128::from(per_t));
                    let (bursts, burst_t) = (i128::from(bursts), i128::from(burst_t));
                    prop_assert!(r * per_r <= bursts * per_r + span, "requests {a}..{b}");
                    prop_assert!(t * per_t <= burst_t * per_t + span, "tokens {a}..{b}");
                }
            }
            let phase = offset % len;
            let mut windows: std::collections::BTreeMap<u64, i128> = Default::default();
            for u in &used {
                *windows.entry((u.0 + len - phase) / len).or_default() += u.2;
            }
            for (k, sum) in windows {
                prop_assert!(sum <= i128::from(quotas), "window {k}: {sum} > {quotas}");
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        #[test]
        fn the_limiter_is_the_naive_model(
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
