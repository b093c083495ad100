//! `RedisRateLimiter` against a real, private `redis-server` that each test starts on a free
//! loopback port, without persistence, and stops at the end. Real time: Redis does not run
//! on tokio's paused clock.
#![cfg(feature = "redis")]

use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use paced::redis::{FailurePolicy, RedisLimiterError, TryAcquireError};
use paced::{PaceExt, Rate, RateLimiter, RedisKeyedRateLimiter, RedisRateLimiter, Shaping};

#[macro_use]
#[path = "common/flavors.rs"]
mod flavors;
#[path = "common/redis_server.rs"]
mod redis_server;
#[path = "common/redis_worker.rs"]
mod redis_worker;
#[path = "common/starve.rs"]
mod starve;
use redis_server::{check_bound, Server};

#[test]
fn four_processes_share_one_quota() {
    let server = Server::start();
    let workers: Vec<Child> = (0..4)
        .map(|_| {
            redis_worker::command([&*server.url(), "four", "3", "200", "20"])
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn a worker")
        })
        .collect();
    let mut grants = Vec::new();
    let mut per_process = Vec::new();
    for worker in workers {
        let out = worker.wait_with_output().expect("worker output");
        assert!(out.status.success(), "a worker failed: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut mine = 0;
        for line in text.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.first() == Some(&"grant") {
                grants.push((fields[1].parse().unwrap(), fields[2].parse().unwrap()));
                mine += 1;
            }
        }
        per_process.push(mine);
    }
    // The merged timeline keeps the bound in every window, to within one round trip.
    check_bound(&grants, 200.0, 20).unwrap();
    // And the quota is used: rate × time + burst, within 2 %.
    let first = grants.iter().map(|g| g.1).min().unwrap();
    let last = grants.iter().map(|g| g.1).max().unwrap();
    let expected = 20.0 + 200.0 * (last - first) as f64 / 1e9;
    let total = grants.len() as f64;
    assert!(
        (total - expected).abs() <= 0.02 * expected,
        "{total} grants, expected {expected:.0} ± 2 % ({per_process:?} per process)"
    );
    assert!(
        per_process.iter().all(|&n| n > 0),
        "a process starved: {per_process:?}"
    );
}

async fn same_semantics_as_the_local_bucket() {
    let server = Server::start();
    let quota = RedisRateLimiter::builder(server.url(), "local", Rate::per_second(10), 5)
        .build()
        .unwrap();
    let start = Instant::now();
    let mut times = Vec::new();
    for _ in 0..8 {
        quota.acquire(1).await.unwrap();
        times.push(start.elapsed());
    }
    // Five at once (the burst), then one per 100 ms.
    assert!(times[4] < Duration::from_millis(50), "{times:?}");
    for (i, t) in times.iter().enumerate().skip(5) {
        let due = Duration::from_millis(100 * (i as u64 - 4));
        assert!(
            *t >= due - Duration::from_millis(5),
            "item {i} at {t:?}, due {due:?}"
        );
        assert!(
            *t <= due + Duration::from_millis(60),
            "item {i} at {t:?}, due {due:?}"
        );
    }
    // try_acquire never waits; a cost above the burst can never be had without waiting.
    assert!(quota.try_acquire(1).await.is_err());
    assert_eq!(
        quota
            .try_acquire(6)
            .await
            .unwrap_err()
            .not_until()
            .unwrap()
            .retry_after(),
        Duration::MAX
    );
    assert!(quota.try_acquire(0).await.is_ok());
    // A cost above the burst pays its debt: full bucket (500 ms) + 5 more tokens (500 ms).
    let start = Instant::now();
    quota.acquire(10).await.unwrap();
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(950), "{took:?}");
    assert!(took <= Duration::from_millis(1_150), "{took:?}");
}

/// Runs 60 items through a stream on `quota` while Redis is killed after 300 ms and
/// restarted a second later; returns each item with when it came out.
async fn through_an_outage(server: Server, quota: RedisRateLimiter) -> Vec<(u32, Duration)> {
    let server = Arc::new(Mutex::new(server));
    let outage = {
        let server = server.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            server.lock().unwrap().kill();
            tokio::time::sleep(Duration::from_secs(1)).await;
            let server = server.clone();
            tokio::task::spawn_blocking(move || server.lock().unwrap().restart())
                .await
                .unwrap();
        })
    };
    let start = Instant::now();
    let out: Vec<(u32, Duration)> = futures_util::stream::iter(0..60u32)
        .throttle_with(&quota, |_| 1, Shaping)
        .map(|i| (i, start.elapsed()))
        .collect()
        .await;
    outage.await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_waits_out_an_outage_and_loses_nothing() {
    let server = Server::start();
    let quota = RedisRateLimiter::builder(server.url(), "closed", Rate::per_second(30), 5)
        .failure_policy(FailurePolicy::FailClosed {
            max_backoff: Duration::from_millis(200),
            deadline: Duration::from_secs(30),
        })
        .build()
        .unwrap();
    let out = through_an_outage(server, quota.clone()).await;
    let items: Vec<u32> = out.iter().map(|&(i, _)| i).collect();
    assert_eq!(
        items,
        (0..60).collect::<Vec<_>>(),
        "lost, duplicated or reordered"
    );
    // Nothing was granted while Redis was down: a gap of most of the outage.
    let gap = out.windows(2).map(|w| w[1].1 - w[0].1).max().unwrap();
    assert!(gap >= Duration::from_millis(800), "largest gap {gap:?}");
    assert!(quota.stats().errors > 0);
    assert_eq!(quota.stats().fallback, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_keeps_going_at_its_share_and_loses_nothing() {
    let server = Server::start();
    let quota = RedisRateLimiter::builder(server.url(), "open", Rate::per_second(30), 5)
        .failure_policy(FailurePolicy::FailOpen { share: 0.5 })
        .build()
        .unwrap();
    let out = through_an_outage(server, quota.clone()).await;
    let items: Vec<u32> = out.iter().map(|&(i, _)| i).collect();
    assert_eq!(
        items,
        (0..60).collect::<Vec<_>>(),
        "lost, duplicated or reordered"
    );
    // The local fallback at 15/s kept items flowing through the outage.
    let gap = out.windows(2).map(|w| w[1].1 - w[0].1).max().unwrap();
    assert!(gap < Duration::from_millis(400), "largest gap {gap:?}");
    let stats = quota.stats();
    assert!(stats.fallback > 0, "{stats:?}");
    // ...at its share: 15/s with a burst of 2 while Redis is surely down (0.4 s to 1.25 s).
    let during = out
        .iter()
        .filter(|&&(_, at)| at >= Duration::from_millis(400) && at <= Duration::from_millis(1_250))
        .count();
    assert!(
        (5..=2 + 13 + 1).contains(&during),
        "{during} items in 0.85 s of outage"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_acquire_gives_up_after_its_deadline() {
    let mut server = Server::start();
    let quota = RedisRateLimiter::builder(server.url(), "deadline", Rate::per_second(10), 1)
        .failure_policy(FailurePolicy::FailClosed {
            max_backoff: Duration::from_millis(50),
            deadline: Duration::from_millis(300),
        })
        .build()
        .unwrap();
    quota.acquire(1).await.unwrap();
    server.kill();
    let start = Instant::now();
    let err = quota.acquire(1).await.unwrap_err();
    assert!(
        matches!(err, paced::redis::RedisLimiterError::Unavailable(_)),
        "{err}"
    );
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert!(start.elapsed() < Duration::from_secs(3));
}

/// Drains 1,000 items through `quota` as fast as it allows; returns the grants (sent,
/// received) in epoch-free nanoseconds.
async fn thousand(quota: &RedisRateLimiter) -> Vec<(u128, u128)> {
    let start = Instant::now();
    let mut grants = Vec::new();
    for _ in 0..1_000 {
        let sent = start.elapsed().as_nanos();
        quota.acquire(1).await.unwrap();
        grants.push((sent, start.elapsed().as_nanos()));
    }
    grants
}

async fn leases_cut_round_trips_tenfold_and_keep_the_bound() {
    let server = Server::start();
    let rate = Rate::per_second(20_000);
    let plain = RedisRateLimiter::builder(server.url(), "plain", rate, 100)
        .build()
        .unwrap();
    let grants = thousand(&plain).await;
    check_bound(&grants, 20_000.0, 100).unwrap();
    let without = plain.stats().round_trips;

    let max_age = Duration::from_millis(5);
    let leased = RedisRateLimiter::builder(server.url(), "leased", rate, 100)
        .lease(50, max_age)
        .build()
        .unwrap();
    let grants = thousand(&leased).await;
    // A leased token is charged when leased and may be spent up to `max_age` later.
    let slack_tokens = (20_000.0 * max_age.as_secs_f64()).ceil() as u64;
    check_bound(&grants, 20_000.0, 100 + slack_tokens).unwrap();
    let with = leased.stats().round_trips;
    assert!(
        with * 10 <= without,
        "{with} round trips with leases, {without} without"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_quota_vanishes_from_redis() {
    let server = Server::start();
    let quota = RedisRateLimiter::builder(server.url(), "idle", Rate::per_second(20), 4)
        .build()
        .unwrap();
    quota.acquire(2).await.unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_connection().unwrap();
    // Two tokens short: the key lives as long as the bucket takes to refill, 100 ms.
    let ttl: i64 = redis::cmd("PTTL").arg("idle").query(&mut conn).unwrap();
    assert!((1..=102).contains(&ttl), "PTTL {ttl}");
    tokio::time::sleep(Duration::from_millis(150)).await;
    let exists: bool = redis::cmd("EXISTS").arg("idle").query(&mut conn).unwrap();
    assert!(!exists, "an idle, full quota stayed in Redis");
    // And a full bucket is what comes back: the burst at once.
    let start = Instant::now();
    quota.acquire(4).await.unwrap();
    assert!(start.elapsed() < Duration::from_millis(50));
}

/// A URL where nothing listens: Redis is down from the start.
fn nowhere() -> String {
    let port = redis_server::free_port();
    format!("redis://127.0.0.1:{port}/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_fallback_keeps_its_exact_share_across_probes() {
    // 1/s with a share of 0.1 is one per 10 s (not 1/s rounded up), burst 1; and probing Redis
    // every second must not hand out a fresh, full fallback each time.
    let quota = RedisRateLimiter::builder(nowhere(), "down", Rate::per_second(1), 10)
        .failure_policy(FailurePolicy::FailOpen { share: 0.1 })
        .build()
        .unwrap();
    let granted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = granted.clone();
    let run = tokio::spawn(async move {
        loop {
            quota.acquire(1).await.unwrap();
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    run.abort();
    let granted = granted.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        granted, 1,
        "the fallback's burst of 1, and nothing more in 3.5 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_outage_gets_its_own_deadline() {
    let mut server = Server::start();
    let quota = RedisRateLimiter::builder(server.url(), "twice", Rate::per_second(100), 5)
        .failure_policy(FailurePolicy::FailClosed {
            max_backoff: Duration::from_millis(50),
            deadline: Duration::from_millis(500),
        })
        .build()
        .unwrap();
    quota.acquire(1).await.unwrap();
    server.kill();
    assert!(quota.try_acquire(1).await.is_err(), "a refusal while down");
    server.restart();
    tokio::time::sleep(Duration::from_millis(700)).await;
    server.kill();
    let start = Instant::now();
    assert!(quota.acquire(1).await.is_err());
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(500),
        "gave up after {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(1_500),
        "gave up after {waited:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_with_leases_takes_what_is_there() {
    let server = Server::start();
    let rate = Rate::new(1, Duration::from_secs(60));
    let plain = RedisRateLimiter::builder(server.url(), "shared", rate, 10)
        .build()
        .unwrap();
    let leased = RedisRateLimiter::builder(server.url(), "shared", rate, 10)
        .lease(5, Duration::from_secs(1))
        .build()
        .unwrap();
    for _ in 0..6 {
        plain.try_acquire(1).await.unwrap();
    }
    // Four tokens left: less than a lease, enough for one. The try takes it, and the three
    // others as a (partial) lease, without waiting for a whole one.
    assert!(leased.try_acquire(1).await.is_ok());
    assert_eq!(leased.stats().round_trips, 1);
    assert!(leased.try_acquire(3).await.is_ok(), "served from the lease");
    assert_eq!(leased.stats().round_trips, 1);
    assert_eq!(leased.stats().from_lease, 1);
    assert!(
        plain.try_acquire(1).await.is_err(),
        "the lease holds the rest"
    );
}

async fn large_requests_are_not_starved_and_waiters_cost_one_round_trip() {
    let server = Server::start();
    let quota = RedisRateLimiter::builder(server.url(), "fair", Rate::per_second(50), 5)
        .build()
        .unwrap();
    let stop = Instant::now() + Duration::from_secs(2);
    let small: Vec<_> = (0..3)
        .map(|_| {
            let quota = quota.clone();
            tokio::spawn(async move {
                while Instant::now() < stop {
                    quota.acquire(1).await.unwrap();
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = Instant::now();
    quota.acquire(8).await.unwrap();
    // Eight tokens at 50/s behind whatever the small ones had reserved: well under a second.
    assert!(
        start.elapsed() < Duration::from_millis(700),
        "{:?}",
        start.elapsed()
    );
    for task in small {
        task.await.unwrap();
    }
    let stats = quota.stats();
    // A reservation never asks twice.
    assert_eq!(stats.round_trips, stats.granted, "{stats:?}");
}

async fn a_waiter_dropped_before_its_turn_gives_its_tokens_back() {
    let server = Server::start();
    let quota = RedisRateLimiter::builder(server.url(), "drop", Rate::per_second(10), 1)
        .build()
        .unwrap();
    quota.acquire(1).await.unwrap();
    // Reserves 5 tokens (half a second of debt), then is dropped.
    let dropped = tokio::time::timeout(Duration::from_millis(50), quota.acquire(5)).await;
    assert!(dropped.is_err());
    // The next request returns them: it waits for its own token, not behind the 5.
    let start = Instant::now();
    quota.acquire(1).await.unwrap();
    assert!(
        start.elapsed() < Duration::from_millis(200),
        "{:?}",
        start.elapsed()
    );
}

/// A plain connection to `server`, to break or repair keys behind the limiter's back.
fn admin(server: &Server) -> redis::Connection {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

/// Puts a value of the wrong kind under `key`: a string that is not a quota, or a hash.
fn break_key(conn: &mut redis::Connection, key: &str, hash: bool) {
    if hash {
        redis::cmd("HSET")
            .arg(key)
            .arg("field")
            .arg("value")
            .exec(conn)
            .unwrap();
    } else {
        redis::cmd("SET").arg(key).arg("hello").exec(conn).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_is_a_reply_error_at_once() {
    let server = Server::start();
    let mut conn = admin(&server);
    let policies = [
        FailurePolicy::default(),
        FailurePolicy::FailOpen { share: 0.5 },
    ];
    for (i, policy) in policies.into_iter().enumerate() {
        for hash in [false, true] {
            let key = format!("broken-{i}-{hash}");
            break_key(&mut conn, &key, hash);
            let quota = RedisRateLimiter::builder(server.url(), &key, Rate::per_second(10), 5)
                .failure_policy(policy)
                .build()
                .unwrap();
            let start = Instant::now();
            let err = quota.acquire(1).await.unwrap_err();
            assert!(
                start.elapsed() < Duration::from_secs(1),
                "{key}: took {:?}",
                start.elapsed()
            );
            let RedisLimiterError::Reply(e) = &err else {
                panic!("{key}: not a reply error: {err}");
            };
            let expected = if hash {
                "WRONGTYPE"
            } else {
                "not a paced quota"
            };
            assert!(err.to_string().contains(expected), "{key}: {err}");
            assert!(e.to_string().contains(expected), "{key}: {e}");

            let failed = quota.try_acquire(1).await.unwrap_err();
            assert!(
                matches!(failed, TryAcquireError::Reply(_)),
                "{key}: {failed}"
            );
            assert!(failed.not_until().is_none());
            // A cost above the burst asks Redis too (any process may have raised the limit
            // with `set_limit`): the same reply error.
            let failed = quota.try_acquire(6).await.unwrap_err();
            assert!(
                matches!(failed, TryAcquireError::Reply(_)),
                "{key}: {failed}"
            );

            let stats = quota.stats();
            assert_eq!(stats.reply_errors, 3, "{key}: {stats:?}");
            assert_eq!(stats.errors, 0, "{key}: not an outage: {stats:?}");
            assert_eq!(stats.fallback, 0, "{key}: no fallback: {stats:?}");
            assert_eq!(stats.granted, 0, "{key}: {stats:?}");

            // Repaired, the quota works at once: no outage, no fallback to leave.
            redis::cmd("DEL").arg(&key).exec(&mut conn).unwrap();
            quota.acquire(5).await.unwrap();
            assert!(quota
                .try_acquire(1)
                .await
                .unwrap_err()
                .not_until()
                .is_some());
            assert_eq!(quota.stats().fallback, 0);
        }
    }
}

/// Runs three items through a shaping stream on a broken key, repaired after 1.2 s.
async fn a_stream_on_a_broken_key(policy: FailurePolicy, hash: bool) {
    let server = Server::start();
    let mut conn = admin(&server);
    let key = "broken-stream";
    break_key(&mut conn, key, hash);
    let quota = RedisRateLimiter::builder(server.url(), key, Rate::per_second(100), 5)
        .failure_policy(policy)
        .build()
        .unwrap();
    let repair = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        redis::cmd("DEL").arg(key).exec(&mut conn).unwrap();
    });
    let start = Instant::now();
    let out: Vec<(u32, Duration)> = futures_util::stream::iter(0..3u32)
        .throttle_with(&quota, |_| 1, Shaping)
        .map(|i| (i, start.elapsed()))
        .collect()
        .await;
    repair.await.unwrap();
    // Nothing let through while the key was broken; nothing lost once it was repaired.
    assert_eq!(out.iter().map(|o| o.0).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(out[0].1 >= Duration::from_millis(1_200), "{out:?}");
    // Asked again at 0.1, 0.3, 0.7 and 1.5 s: the fourth retry finds it repaired.
    assert!(out[2].1 < Duration::from_millis(2_000), "{out:?}");
    let stats = quota.stats();
    assert!(
        (3..=5).contains(&stats.reply_errors),
        "a bounded backoff, not a spin: {stats:?}"
    );
    assert_eq!(stats.errors, 0, "{stats:?}");
    assert_eq!(stats.fallback, 0, "{stats:?}");
    assert_eq!(stats.granted, 3, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shaping_stream_on_a_broken_key_holds_its_items_fail_closed() {
    a_stream_on_a_broken_key(FailurePolicy::default(), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shaping_stream_on_a_broken_key_holds_its_items_fail_open() {
    a_stream_on_a_broken_key(FailurePolicy::FailOpen { share: 1.0 }, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enforcing_stream_on_a_broken_key_hands_its_items_back() {
    let server = Server::start();
    let mut conn = admin(&server);
    for policy in [
        FailurePolicy::default(),
        FailurePolicy::FailOpen { share: 1.0 },
    ] {
        break_key(&mut conn, "broken-enforcing", true);
        let quota =
            RedisRateLimiter::builder(server.url(), "broken-enforcing", Rate::per_second(100), 5)
                .failure_policy(policy)
                .build()
                .unwrap();
        let out: Vec<_> = futures_util::stream::iter(0..4u32)
            .throttle_with(&quota, |_| 1, paced::Enforcing)
            .collect()
            .await;
        for (i, item) in out.into_iter().enumerate() {
            let refused = item.unwrap_err();
            assert_eq!(refused.retry_after(), Duration::from_secs(1));
            assert_eq!(refused.into_inner(), i as u32);
        }
        let stats = quota.stats();
        assert_eq!(stats.reply_errors, 4, "{stats:?}");
        assert_eq!((stats.errors, stats.fallback, stats.granted), (0, 0, 0));
        redis::cmd("DEL")
            .arg("broken-enforcing")
            .exec(&mut conn)
            .unwrap();
    }
}

/// Counts error-level events, to see that a reply error is logged.
#[cfg(feature = "tracing")]
struct CountErrors(Arc<std::sync::atomic::AtomicUsize>);

#[cfg(feature = "tracing")]
impl tracing::Subscriber for CountErrors {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() == tracing::Level::ERROR {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[cfg(feature = "tracing")]
#[tokio::test(flavor = "current_thread")]
async fn a_reply_error_is_logged_at_error_level() {
    let server = Server::start();
    break_key(&mut admin(&server), "logged", false);
    let quota = RedisRateLimiter::builder(server.url(), "logged", Rate::per_second(10), 5)
        .build()
        .unwrap();
    let errors = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let _guard = tracing::subscriber::set_default(CountErrors(errors.clone()));
    assert!(quota.acquire(1).await.is_err());
    assert!(quota.try_acquire(1).await.is_err());
    assert_eq!(errors.load(std::sync::atomic::Ordering::Relaxed), 2);
}

/// A Redis limiter under `FailOpen` (so that an error taken for an outage would show as a
/// fallback grant) and the in-process limiter with the same bucket.
fn both(server: &Server, key: &str, rate: Rate, burst: u64) -> (RedisRateLimiter, RateLimiter) {
    let quota = RedisRateLimiter::builder(server.url(), key, rate, burst)
        .failure_policy(FailurePolicy::FailOpen { share: 1.0 })
        .build()
        .unwrap();
    (quota, RateLimiter::new(rate, burst))
}

/// No reply error, no outage, no fallback: every answer came from the script.
fn clean(quota: &RedisRateLimiter) {
    let stats = quota.stats();
    assert_eq!(
        (stats.reply_errors, stats.errors, stats.fallback),
        (0, 0, 0),
        "{stats:?}"
    );
}

/// Whether `acquire` is still waiting after 200 ms, for both limiters (it must agree).
async fn still_waiting(quota: &RedisRateLimiter, local: &RateLimiter, cost: u64) -> bool {
    let wait = Duration::from_millis(200);
    let remote = tokio::time::timeout(wait, quota.acquire(cost)).await;
    let here = tokio::time::timeout(wait, local.acquire(cost)).await;
    assert_eq!(remote.is_err(), here.is_err(), "cost {cost}: {remote:?}");
    match remote {
        Ok(answer) => {
            answer.unwrap();
            false
        }
        Err(_) => true,
    }
}

fn pttl(server: &Server, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut admin(server))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_costs_are_never_granted_without_waiting_and_never_a_reply_error() {
    let server = Server::start();
    let per_day = Rate::new(1, Duration::from_secs(86_400));
    for (key, rate, burst, cost) in [
        ("max", Rate::per_second(10), 5, u64::MAX),
        ("day", per_day, 1, 2_000_000_000),
    ] {
        let (quota, local) = both(&server, key, rate, burst);
        // Above the burst: never without waiting, as in process.
        let refused = quota.try_acquire(cost).await.unwrap_err();
        assert!(refused.not_until().unwrap().is_never(), "{key}: {refused}");
        assert!(local.try_acquire(cost).unwrap_err().is_never());
        // Its debt takes longer than 584 years: acquire waits (forever), as in process...
        assert!(still_waiting(&quota, &local, cost).await, "{key}");
        // ...without charging the quota for it: the burst is still there.
        let start = Instant::now();
        quota.acquire(burst).await.unwrap();
        assert!(start.elapsed() < Duration::from_millis(100), "{key}");
        clean(&quota);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debt_of_centuries_is_charged_kept_and_given_back() {
    let server = Server::start();
    let per_day = Rate::new(1, Duration::from_secs(86_400));
    // 100,000 tokens at one a day: 274 years of debt, well inside 584.
    let (quota, local) = both(&server, "centuries", per_day, 1);
    let waiting = {
        let quota = quota.clone();
        tokio::spawn(async move { quota.acquire(100_000).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The key lives as long as the debt: 100,000 days (8.64e12 ms; the old script's TTL in
    // exponent notation from about 1e14 ms).
    let ttl = pttl(&server, "centuries");
    assert!(
        (8_639_000_000_000..=8_640_001_000_000).contains(&ttl),
        "PTTL {ttl}"
    );
    assert!(
        quota
            .try_acquire(1)
            .await
            .unwrap_err()
            .not_until()
            .is_some(),
        "behind the debt"
    );
    assert!(!waiting.is_finished());
    waiting.abort();
    let _ = waiting.await;
    // The abandoned reservation is given back with the next round trip: the bucket is full.
    quota.acquire(1).await.unwrap();
    local.acquire(1).await;
    assert!(quota.try_acquire(1).await.is_err() && local.try_acquire(1).is_err());
    clean(&quota);
}

/// A hundred reservations abandoned behind debts of centuries, each its own key and debt:
/// every one is taken back whole, so the next request of its key finds the bucket full. (The
/// script reads the last grant's instant back from doubles, which beyond 2^53 µs are more than
/// a microsecond apart: allowing only a microsecond, it refused about one give-back in forty.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_abandoned_behind_debts_of_centuries_are_all_taken_back() {
    let server = Server::start();
    let per_day = Rate::new(1, Duration::from_secs(86_400));
    let quota: RedisKeyedRateLimiter<u32> =
        RedisKeyedRateLimiter::builder(server.url(), "debts", per_day, 1)
            .build()
            .unwrap();
    let waiting: Vec<_> = (0..100u32)
        .map(|key| {
            // 100,000 to 199,000 tokens at one a day: 274 to 545 years of debt, below the
            // 584 years beyond which a reservation is never charged.
            let cost = 100_000 + u64::from(key) * 1_000;
            let quota = quota.clone();
            tokio::spawn(async move { quota.acquire(&key, cost).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for task in &waiting {
        assert!(!task.is_finished(), "behind its debt");
    }
    for task in waiting {
        task.abort();
        let _ = task.await;
    }
    let mut refused = Vec::new();
    for key in 0..100u32 {
        if quota.try_acquire(&key, 1).await.is_err() {
            refused.push(key);
        }
    }
    assert_eq!(refused, Vec::<u32>::new(), "keys whose debt stayed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_billion_token_burst_at_one_a_day_keeps_its_key_without_expiry() {
    let server = Server::start();
    let per_day = Rate::new(1, Duration::from_secs(86_400));
    let (quota, local) = both(&server, "billions", per_day, 3_000_000_000);
    quota.try_acquire(2_000_000_000).await.unwrap();
    local.try_acquire(2_000_000_000).unwrap();
    // Two billion days to be full again: beyond what a TTL can say, so no expiry at all.
    assert_eq!(pttl(&server, "billions"), -1);
    // One token short: a day, as in process.
    let remote = quota.try_acquire(1_000_000_001).await.unwrap_err();
    let here = local.try_acquire(1_000_000_001).unwrap_err();
    let (remote, here) = (
        remote.not_until().unwrap().retry_after(),
        here.retry_after(),
    );
    assert!(
        remote.abs_diff(here) < Duration::from_secs(1),
        "{remote:?} vs {here:?}"
    );
    assert!(remote > Duration::from_secs(86_399), "{remote:?}");
    quota.try_acquire(1_000_000_000).await.unwrap();
    local.try_acquire(1_000_000_000).unwrap();
    // Empty, and a token a day: acquire waits (longer than the test), as in process.
    assert!(still_waiting(&quota, &local, 1).await);
    clean(&quota);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slowest_rate_grants_its_burst_then_never() {
    let server = Server::start();
    let (quota, local) = both(&server, "slowest", Rate::new(1, Duration::MAX), 2);
    quota.acquire(1).await.unwrap();
    local.acquire(1).await;
    quota.try_acquire(1).await.unwrap();
    local.try_acquire(1).unwrap();
    // 584 billion years per token: never, and the key never expires. (The in-process limiter
    // says so as its saturated deadline, 584 years from its origin, less the time since.)
    let refused = quota.try_acquire(1).await.unwrap_err();
    assert!(refused.not_until().unwrap().is_never(), "{refused}");
    let here = local.try_acquire(1).unwrap_err().retry_after();
    assert!(here > Duration::from_secs(584 * 365 * 86_400), "{here:?}");
    assert_eq!(pttl(&server, "slowest"), -1);
    assert!(still_waiting(&quota, &local, 1).await);
    assert!(still_waiting(&quota, &local, u64::MAX).await);
    clean(&quota);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fastest_rate_never_binds_past_a_microsecond() {
    let server = Server::start();
    let (quota, local) = both(
        &server,
        "fastest",
        Rate::new(u64::MAX, Duration::from_nanos(1)),
        10,
    );
    for _ in 0..20 {
        quota.acquire(10).await.unwrap();
        local.acquire(10).await;
    }
    // Even the largest cost is a debt of about a nanosecond: granted at once.
    let start = Instant::now();
    quota.acquire(u64::MAX).await.unwrap();
    local.acquire(u64::MAX).await;
    quota.acquire(10).await.unwrap();
    assert!(start.elapsed() < Duration::from_millis(100));
    // A try still refuses what is above the burst.
    assert!(quota
        .try_acquire(11)
        .await
        .unwrap_err()
        .not_until()
        .unwrap()
        .is_never());
    assert!(local.try_acquire(11).unwrap_err().is_never());
    // And the key, if any, expires within milliseconds.
    assert!(pttl(&server, "fastest") <= 2);
    clean(&quota);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_response_timeout_is_a_config_error() {
    let zero = RedisRateLimiter::builder(nowhere(), "t", Rate::per_second(1), 1)
        .response_timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(
        matches!(
            zero,
            RedisLimiterError::Config(paced::ConfigError::ZeroTimeout)
        ),
        "{zero}"
    );
    assert!(zero.to_string().contains("response timeout"), "{zero}");
    // The longest is accepted, and works.
    let server = Server::start();
    let longest = RedisRateLimiter::builder(server.url(), "t", Rate::per_second(1), 1)
        .response_timeout(Duration::MAX)
        .build()
        .unwrap();
    longest.acquire(1).await.unwrap();
    assert!(longest.try_acquire(1).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_starts_each_outage_with_a_full_share_of_the_burst() {
    let mut server = Server::start();
    // A fallback of 0.25 × 20 = 5 tokens, refilled at one per 4 minutes: none in this test.
    let quota = RedisRateLimiter::builder(server.url(), "outages", Rate::per_minute(1), 20)
        .failure_policy(FailurePolicy::FailOpen { share: 0.25 })
        .build()
        .unwrap();
    quota.acquire(1).await.unwrap();
    for outage in 1..=2u64 {
        server.kill();
        for _ in 0..5 {
            quota.try_acquire(1).await.unwrap();
        }
        let refused = quota.try_acquire(1).await.unwrap_err();
        assert!(refused.not_until().is_some(), "outage {outage}: {refused}");
        assert_eq!(quota.stats().fallback, 5 * outage);
        server.restart();
        // Back to Redis (a fresh one: a full bucket) once the fallback's second is over.
        let mut back = false;
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(1_100)).await;
            if quota.try_acquire(1).await.is_ok() {
                back = true;
                break;
            }
        }
        assert!(back, "outage {outage}: Redis never answered again");
        assert_eq!(quota.stats().fallback, 5 * outage, "served by Redis");
    }
}

async fn waiters_are_served_in_the_order_they_asked() {
    use futures_util::stream::FuturesUnordered;

    let server = Server::start();
    // Two tokens a millisecond: several waiters fall due within each tick of tokio's timer,
    // where the timer wakes them in an order of its own.
    let quota = RedisRateLimiter::builder(server.url(), "fifo", Rate::per_second(2_000), 1)
        .build()
        .unwrap();
    let waiters: FuturesUnordered<_> = (0..200)
        .map(|i| {
            let quota = &quota;
            async move {
                quota.acquire(1).await.unwrap();
                i
            }
        })
        .collect();
    // Polled in the order they were pushed: each sends its reservation with its first poll.
    let served: Vec<u32> = waiters.collect().await;
    assert_eq!(served, (0..200).collect::<Vec<_>>());
}

async fn acquire_timeout_waits_within_its_timeout_and_takes_nothing_beyond() {
    let server = Server::start();
    let quota = RedisRateLimiter::builder(server.url(), "timeout", Rate::per_second(10), 1)
        .build()
        .unwrap();
    quota.acquire(1).await.unwrap();
    // The next token is 100 ms away: not within 10 ms, and nothing is charged.
    let refused = quota
        .acquire_timeout(1, Duration::from_millis(10))
        .await
        .unwrap_err()
        .not_until()
        .expect("a refusal");
    assert!(!refused.is_never());
    assert!(
        refused.retry_after() > Duration::from_millis(10),
        "{refused:?}"
    );
    // Within 500 ms: waited for, about 100 ms after the first grant, not 200.
    let start = Instant::now();
    quota
        .acquire_timeout(1, Duration::from_millis(500))
        .await
        .unwrap();
    assert!(
        start.elapsed() < Duration::from_millis(150),
        "{:?}",
        start.elapsed()
    );
    // Never within any timeout.
    let never = quota
        .acquire_timeout(u64::MAX, Duration::MAX)
        .await
        .unwrap_err();
    assert!(never.not_until().expect("a refusal").is_never());
    assert_eq!(quota.stats().rejected, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_set_by_one_process_applies_to_every_process_and_clears() {
    let server = Server::start();
    let build = || {
        RedisRateLimiter::builder(server.url(), "partner", Rate::per_hour(1), 2)
            .build()
            .unwrap()
    };
    let (one, other) = (build(), build());
    // Raised by one: the full bucket stays full, at the new burst, for the other too.
    one.set_limit(Rate::per_hour(1), 5).await.unwrap();
    other.try_acquire(5).await.unwrap();
    assert!(other.try_acquire(1).await.is_err());
    // Cleared: the built limit again, for every process (a cost of 3 is above its burst).
    one.clear_limit().await.unwrap();
    let refused = other.try_acquire(3).await.unwrap_err();
    assert!(refused.not_until().expect("a refusal").is_never());
    // A zero burst is a configuration error, and changes nothing.
    let zero = one.set_limit(Rate::per_second(1), 0).await.unwrap_err();
    assert!(matches!(zero, RedisLimiterError::Config(_)), "{zero}");
    // While Redis is down: at once, whatever the policy.
    let down = RedisRateLimiter::builder(nowhere(), "partner", Rate::per_hour(1), 2)
        .failure_policy(FailurePolicy::FailOpen { share: 0.5 })
        .build()
        .unwrap();
    let failed = down.set_limit(Rate::per_hour(2), 4).await.unwrap_err();
    assert!(
        matches!(failed, RedisLimiterError::Unavailable(_)),
        "{failed}"
    );
    assert!(matches!(
        down.clear_limit().await.unwrap_err(),
        RedisLimiterError::Unavailable(_)
    ));
}

/// A task looping on a leased quota whose limit never binds yields to the runtime, as on a
/// tokio `Semaphore` (a grant from the lease spends the task's cooperative budget): a 5 ms
/// timer on the same thread fires in time. Without the budget the loop never yields until
/// its lease of 100 million tokens runs out, and the timer fires when the loop gives up (3 s).
#[test]
fn a_task_looping_on_a_lease_does_not_starve_a_timer() {
    let server = Server::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let quota = RedisRateLimiter::builder(
            server.url(),
            "coop",
            Rate::per_second(1_000_000_000),
            1_000_000_000,
        )
        .lease(100_000_000, Duration::from_secs(60))
        .build()
        .unwrap();
        // The first round trip brings the lease.
        quota.acquire(1).await.unwrap();
        let quota = &quota;
        let (fired, grants) =
            starve::timer_beside(move || async move { quota.acquire(1).await.unwrap() }).await;
        assert!(
            fired < Duration::from_millis(200),
            "the timer fired after {fired:?}, {grants} grants"
        );
        assert_eq!(quota.stats().round_trips, 1, "all from the lease");
    });
}

on_every_flavor!(
    same_semantics_as_the_local_bucket,
    leases_cut_round_trips_tenfold_and_keep_the_bound,
    large_requests_are_not_starved_and_waiters_cost_one_round_trip,
    waiters_are_served_in_the_order_they_asked,
    acquire_timeout_waits_within_its_timeout_and_takes_nothing_beyond,
    a_waiter_dropped_before_its_turn_gives_its_tokens_back,
);
