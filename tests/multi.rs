//! `MultiRateLimiter`: several limits at once, under paused time, with exact times; and a
//! proptest against a naive model of the queue and of every limit.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use paced::{ConfigError, Limit, MultiRateLimiter, Permit, Rate};
use tokio::time::{advance, sleep, timeout, Instant};

const MS: Duration = Duration::from_millis(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Requests: 1 per 100 ms (burst `requests`); tokens: 1 per 10 ms (burst 100).
fn llm(requests: u64) -> MultiRateLimiter<2> {
    MultiRateLimiter::builder(["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_second(10), requests))
        .limit("tokens", Limit::bucket(Rate::per_second(100), 100))
        .build()
        .unwrap()
}

/// Spawns a task that acquires `cost` and logs `name` at its grant, as "<ms>ms:<name>".
fn spawn_logged(
    limiter: &MultiRateLimiter<2>,
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
    let limiter = MultiRateLimiter::builder(["requests", "tokens"])
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
    let limiter = MultiRateLimiter::builder(["requests", "tokens"])
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
    let limiter: MultiRateLimiter<1> = MultiRateLimiter::builder(["requests"])
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
    let bucket: MultiRateLimiter<1> = MultiRateLimiter::builder(["tokens"])
        .limit("tokens", Limit::bucket(Rate::new(q, day), q))
        .build()
        .unwrap();
    let window: MultiRateLimiter<1> = MultiRateLimiter::builder(["tokens"])
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

#[tokio::test(start_paused = true)]
async fn names_are_checked() {
    let unknown = MultiRateLimiter::builder(["requests", "tokens"])
        .limit("token", Limit::bucket(Rate::per_second(1), 1))
        .build();
    assert_eq!(unknown.err(), Some(ConfigError::UnknownDimension));
    let twice = MultiRateLimiter::builder(["a", "a"]).build();
    assert_eq!(twice.err(), Some(ConfigError::DuplicateDimension));
    let zero = MultiRateLimiter::builder(["a"])
        .limit("a", Limit::window(0, MS))
        .build();
    assert_eq!(zero.err(), Some(ConfigError::ZeroQuota));
    let zero = MultiRateLimiter::builder(["a"])
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
