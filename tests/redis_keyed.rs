//! `RedisKeyedRateLimiter` against a real, private `redis-server` that each test starts on a
//! free loopback port, without persistence, and stops at the end. Real time: Redis does not
//! run on tokio's paused clock.
#![cfg(feature = "redis")]

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use paced::redis::{FailurePolicy, RedisLimiterError, TryAcquireError};
use paced::{Rate, RedisKeyedRateLimiter};

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

/// A plain connection to `server`, to look at keys or break them behind the limiter's back.
fn admin(server: &Server) -> redis::Connection {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

fn dbsize(conn: &mut redis::Connection) -> u64 {
    redis::cmd("DBSIZE").query(conn).unwrap()
}

fn get(conn: &mut redis::Connection, key: &str) -> Option<Vec<u8>> {
    redis::cmd("GET").arg(key).query(conn).unwrap()
}

fn exists(conn: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<u64>(conn).unwrap() == 1
}

fn limiter<K: std::hash::Hash + Eq + Send + Sync + 'static>(
    server: &Server,
    prefix: &str,
    rate: Rate,
    burst: u64,
) -> RedisKeyedRateLimiter<K> {
    RedisKeyedRateLimiter::builder(server.url(), prefix, rate, burst)
        .build()
        .unwrap()
}

fn refusal(e: TryAcquireError) -> paced::NotUntil {
    e.not_until().expect("a refusal, not a reply error")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_independent_and_refusals_exact() {
    let server = Server::start();
    let quota = limiter::<String>(&server, "ind", Rate::per_second(10), 3);
    for _ in 0..3 {
        quota.try_acquire("a", 1).await.unwrap();
    }
    let refused = refusal(quota.try_acquire("a", 1).await.unwrap_err());
    assert!(!refused.is_never());
    assert!(
        refused.retry_after() > Duration::from_millis(80),
        "{refused:?}"
    );
    assert!(
        refused.retry_after() <= Duration::from_millis(100),
        "{refused:?}"
    );
    // "b" has its own full bucket.
    quota.try_acquire("b", 3).await.unwrap();
    assert!(quota.try_acquire("b", 1).await.is_err());
    // Above the burst: never without waiting.
    assert!(refusal(quota.try_acquire("c", 4).await.unwrap_err()).is_never());
    assert!(quota.try_acquire("c", 0).await.is_ok());
    let stats = quota.stats();
    assert_eq!(stats.granted, 5);
    assert_eq!(stats.rejected, 3);
    assert_eq!(stats.round_trips, 7);
    assert_eq!(stats.keys, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn string_keys_take_str_and_integer_keys_work() {
    let server = Server::start();
    let by_name = limiter::<String>(&server, "names", Rate::per_minute(1), 1);
    by_name.try_acquire("alice", 1).await.unwrap();
    let alice = String::from("alice");
    assert!(by_name.try_acquire(alice.as_str(), 1).await.is_err());
    assert!(by_name.try_acquire(&alice, 1).await.is_err());
    by_name.acquire("bob", 1).await.unwrap();
    let by_id = limiter::<u64>(&server, "ids", Rate::per_minute(1), 1);
    by_id.try_acquire(&7, 1).await.unwrap();
    assert!(by_id.try_acquire(&7, 1).await.is_err());
    by_id.acquire(&8, 1).await.unwrap();
    let mut conn = admin(&server);
    for key in ["{names:alice}", "{names:bob}", "{ids:7}", "{ids:8}"] {
        assert!(exists(&mut conn, key), "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_braces_colons_and_percents_are_escaped() {
    let server = Server::start();
    let quota = limiter::<String>(&server, "odd:{p}", Rate::per_minute(1), 1);
    let keys = ["a:b", "{a}", "a}b{", "%3A", ":", "a%3Ab", ""];
    for key in keys {
        quota.try_acquire(key, 1).await.unwrap();
    }
    // Each key had its own bucket, now empty.
    for key in keys {
        assert!(quota.try_acquire(key, 1).await.is_err(), "{key:?}");
    }
    let mut conn = admin(&server);
    assert_eq!(dbsize(&mut conn), keys.len() as u64);
    assert!(exists(&mut conn, "{odd%3A%7Bp%7D:a%3Ab}"));
    assert!(exists(&mut conn, "{odd%3A%7Bp%7D:%7Ba%7D}"));
    assert!(exists(&mut conn, "{odd%3A%7Bp%7D:%253A}"));
    assert!(exists(&mut conn, "{odd%3A%7Bp%7D:}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_try_acquire_writes_nothing() {
    let server = Server::start();
    let quota = limiter::<String>(&server, "ro", Rate::per_second(1), 2);
    let mut conn = admin(&server);
    quota.try_acquire("k", 2).await.unwrap();
    let before = get(&mut conn, "{ro:k}").expect("state after a grant");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(quota.try_acquire("k", 1).await.is_err());
    assert_eq!(get(&mut conn, "{ro:k}"), Some(before));
    // A refusal on a fresh key (a cost above the burst) creates nothing.
    assert!(quota.try_acquire("fresh", 3).await.is_err());
    assert!(!exists(&mut conn, "{ro:fresh}"));
    assert_eq!(dbsize(&mut conn), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keys_vanish_from_redis_and_from_the_process() {
    let server = Server::start();
    // 2 tokens at 20 per second: full again within 100 ms.
    let quota = limiter::<u64>(&server, "idle", Rate::per_second(20), 2);
    for key in 0..50u64 {
        quota.acquire(&key, 2).await.unwrap();
    }
    let mut conn = admin(&server);
    assert_eq!(dbsize(&mut conn), 50);
    assert_eq!(quota.stats().keys, 0);
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(dbsize(&mut conn), 0);
}

async fn waiting_is_a_reservation_and_a_timeout_takes_nothing() {
    let server = Server::start();
    let quota = limiter::<String>(&server, "wait", Rate::per_second(10), 1);
    let start = Instant::now();
    for _ in 0..4 {
        quota.acquire("k", 1).await.unwrap();
    }
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(290), "{took:?}");
    assert!(took <= Duration::from_millis(420), "{took:?}");
    // The next is due in about 100 ms: not within 30 ms, and refusing it took nothing.
    let start = Instant::now();
    let refused = quota
        .acquire_timeout("k", 1, Duration::from_millis(30))
        .await
        .unwrap_err();
    assert!(start.elapsed() < Duration::from_millis(30));
    let refused = refusal(refused);
    assert!(
        refused.retry_after() > Duration::from_millis(30),
        "{refused:?}"
    );
    let start = Instant::now();
    quota
        .acquire_timeout("k", 1, Duration::from_millis(200))
        .await
        .unwrap();
    let took = start.elapsed();
    assert!(took <= Duration::from_millis(150), "{took:?}");
    assert_eq!(quota.stats().rejected, 1);
    // Concurrent waiters of one key: each one round trip, spaced 100 ms apart.
    let quota2 = quota.clone();
    let start = Instant::now();
    let waiters: Vec<_> = (0..5)
        .map(|_| {
            let q = quota2.clone();
            tokio::spawn(async move {
                q.acquire("c", 1).await.unwrap();
                start.elapsed()
            })
        })
        .collect();
    let mut times = Vec::new();
    for w in waiters {
        times.push(w.await.unwrap());
    }
    times.sort();
    for (i, t) in times.iter().enumerate() {
        let due = Duration::from_millis(100 * i as u64);
        assert!(*t + Duration::from_millis(5) >= due, "{times:?}");
        assert!(*t <= due + Duration::from_millis(80), "{times:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_dropped_before_its_turn_gives_its_tokens_back() {
    let server = Server::start();
    let quota = limiter::<String>(&server, "drop", Rate::per_second(2), 1);
    quota.acquire("k", 1).await.unwrap();
    // Reserves 4 tokens (about 2 s), then gives up after 100 ms.
    let gave_up = tokio::time::timeout(Duration::from_millis(100), quota.acquire("k", 4)).await;
    assert!(gave_up.is_err());
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Only the first token's refill stands between us and the next grant.
    let start = Instant::now();
    quota.acquire("k", 1).await.unwrap();
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_is_a_reply_error_for_that_key_only() {
    let server = Server::start();
    let mut conn = admin(&server);
    redis::cmd("HSET")
        .arg("{bad:h}")
        .arg("f")
        .arg("v")
        .exec(&mut conn)
        .unwrap();
    redis::cmd("SET")
        .arg("{bad:s}")
        .arg("hello")
        .exec(&mut conn)
        .unwrap();
    // Strings of a quota's length (17 and 33 bytes) and format version (a first byte of 1) that
    // are not one: text, an infinite level, a limit with a NaN interval.
    let version_1 = |values: &[f64]| -> Vec<u8> {
        let doubles = values.iter().flat_map(|v| v.to_le_bytes());
        std::iter::once(1).chain(doubles).collect()
    };
    for (key, value) in [
        ("{bad:t17}", b"\x010123456789abcdef".to_vec()),
        (
            "{bad:t33}",
            b"\x01paced-quota-state-in-plain-text!".to_vec(),
        ),
        ("{bad:inf}", version_1(&[f64::INFINITY, 0.0])),
        ("{bad:nan}", version_1(&[1.0, 0.0, f64::NAN, 5.0])),
    ] {
        redis::cmd("SET")
            .arg(key)
            .arg(value)
            .exec(&mut conn)
            .unwrap();
    }
    for policy in [
        FailurePolicy::default(),
        FailurePolicy::FailOpen { share: 0.5 },
    ] {
        let quota: RedisKeyedRateLimiter<String> =
            RedisKeyedRateLimiter::builder(server.url(), "bad", Rate::per_second(10), 5)
                .failure_policy(policy)
                .build()
                .unwrap();
        for (key, expected) in [
            ("h", "WRONGTYPE"),
            ("s", "not a paced quota"),
            ("t17", "not a paced quota"),
            ("t33", "not a paced quota"),
            ("inf", "not a paced quota"),
            ("nan", "not a paced quota"),
        ] {
            let start = Instant::now();
            let err = quota.acquire(key, 1).await.unwrap_err();
            assert!(start.elapsed() < Duration::from_secs(1));
            assert!(matches!(err, RedisLimiterError::Reply(_)), "{key}: {err}");
            assert!(err.to_string().contains(expected), "{key}: {err}");
            let err = quota.try_acquire(key, 1).await.unwrap_err();
            assert!(matches!(err, TryAcquireError::Reply(_)), "{key}: {err}");
            let err = quota
                .acquire_timeout(key, 1, Duration::from_secs(1))
                .await
                .unwrap_err();
            assert!(matches!(err, TryAcquireError::Reply(_)), "{key}: {err}");
        }
        quota.try_acquire("fine", 1).await.unwrap();
        let stats = quota.stats();
        assert_eq!(stats.reply_errors, 18);
        assert_eq!((stats.errors, stats.fallback), (0, 0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_and_fail_open_without_redis() {
    let port = redis_server::free_port();
    let url = format!("redis://127.0.0.1:{port}/");
    let closed: RedisKeyedRateLimiter<String> =
        RedisKeyedRateLimiter::builder(&url, "x", Rate::per_second(10), 4)
            .failure_policy(FailurePolicy::FailClosed {
                max_backoff: Duration::from_millis(50),
                deadline: Duration::from_millis(300),
            })
            .build()
            .unwrap();
    let start = Instant::now();
    let err = closed.acquire("k", 1).await.unwrap_err();
    assert!(matches!(err, RedisLimiterError::Unavailable(_)), "{err}");
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert!(closed.try_acquire("k", 1).await.is_err());
    let err = closed
        .acquire_timeout("k", 1, Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(err.not_until().is_some(), "{err}");
    let open: RedisKeyedRateLimiter<String> =
        RedisKeyedRateLimiter::builder(&url, "x", Rate::per_second(10), 4)
            .failure_policy(FailurePolicy::FailOpen { share: 0.5 })
            .build()
            .unwrap();
    // Half the burst per key, locally.
    for key in ["a", "b"] {
        open.try_acquire(key, 1).await.unwrap();
        open.acquire(key, 1).await.unwrap();
        assert!(open.try_acquire(key, 1).await.is_err());
    }
    assert_eq!(open.stats().fallback, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builder_refuses_what_cannot_be() {
    let build = |burst, timeout| {
        RedisKeyedRateLimiter::<String>::builder(
            "redis://127.0.0.1/",
            "t",
            Rate::per_second(1),
            burst,
        )
        .response_timeout(timeout)
        .build()
    };
    assert!(matches!(
        build(0, Duration::from_secs(1)),
        Err(RedisLimiterError::Config(_))
    ));
    assert!(matches!(
        build(1, Duration::ZERO),
        Err(RedisLimiterError::Config(_))
    ));
    assert!(build(1, Duration::from_secs(1)).is_ok());
    let share =
        RedisKeyedRateLimiter::<u64>::builder("redis://127.0.0.1/", "t", Rate::per_second(1), 1)
            .failure_policy(FailurePolicy::FailOpen { share: 0.0 })
            .build();
    assert!(matches!(share, Err(RedisLimiterError::Config(_))));
    assert!(matches!(
        RedisKeyedRateLimiter::<u64>::builder("nonsense", "t", Rate::per_second(1), 1).build(),
        Err(RedisLimiterError::Client(_))
    ));
}

fn pttl(conn: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(conn).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_set_by_one_process_applies_to_every_process_and_keeps_the_level() {
    let server = Server::start();
    let mut conn = admin(&server);
    // Two processes: two limiters, two connections, one Redis. One token a minute: no refill
    // to speak of during the test.
    let one = limiter::<String>(&server, "lim", Rate::per_minute(1), 2);
    let two = limiter::<String>(&server, "lim", Rate::per_minute(1), 2);
    // A fresh key under its own limit starts full of it.
    one.set_limit("big", Rate::per_minute(1), 10).await.unwrap();
    two.try_acquire("big", 4).await.unwrap();
    // Another key keeps the default.
    assert!(refusal(two.try_acquire("small", 3).await.unwrap_err()).is_never());
    // A bigger burst keeps the level (6 tokens), it does not fill the bucket.
    one.set_limit("big", Rate::per_minute(1), 100)
        .await
        .unwrap();
    let refused = refusal(two.try_acquire("big", 7).await.unwrap_err());
    assert!(!refused.is_never());
    two.try_acquire("big", 6).await.unwrap();
    // The limit is configuration, kept with the key's bucket: no expiry.
    assert_eq!(pttl(&mut conn, "{lim:big}"), -1);
    // A smaller burst caps the level.
    one.set_limit("full", Rate::per_minute(1), 10)
        .await
        .unwrap();
    one.set_limit("full", Rate::per_minute(1), 3).await.unwrap();
    two.try_acquire("full", 3).await.unwrap();
    assert!(two.try_acquire("full", 1).await.is_err());
    // Back to the default, for both: the level stays (0), the burst is 2 again.
    two.clear_limit("big").await.unwrap();
    // Under the default limit again, the bucket expires once it would be full.
    assert!(pttl(&mut conn, "{lim:big}") > 0);
    assert!(one.try_acquire("big", 1).await.is_err());
    assert!(refusal(one.try_acquire("big", 3).await.unwrap_err()).is_never());
    // A faster rate set elsewhere is seen at once by the waiters' next request.
    one.set_limit("fast", Rate::per_second(20), 1)
        .await
        .unwrap();
    let start = Instant::now();
    for _ in 0..5 {
        two.acquire("fast", 1).await.unwrap();
    }
    assert!(
        start.elapsed() < Duration::from_millis(400),
        "{:?}",
        start.elapsed()
    );
    assert!(matches!(
        one.set_limit("x", Rate::per_second(1), 0).await,
        Err(RedisLimiterError::Config(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_outlive_idle_buckets() {
    let server = Server::start();
    let mut conn = admin(&server);
    let quota = limiter::<u64>(&server, "keep", Rate::per_second(20), 1);
    quota.set_limit(&1, Rate::per_second(20), 2).await.unwrap();
    quota.try_acquire(&1, 2).await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    // The bucket is full again, and the key stays: it holds the limit.
    assert!(exists(&mut conn, "{keep:1}"));
    assert_eq!(pttl(&mut conn, "{keep:1}"), -1);
    quota.try_acquire(&1, 2).await.unwrap();
    assert!(quota.try_acquire(&1, 1).await.is_err());
    assert_eq!(dbsize(&mut conn), 1);
    // Cleared, a full bucket is no key at all.
    tokio::time::sleep(Duration::from_millis(250)).await;
    quota.clear_limit(&1).await.unwrap();
    assert_eq!(dbsize(&mut conn), 0);
}

#[test]
fn three_processes_share_each_keys_quota() {
    let server = Server::start();
    let workers: Vec<Child> = (0..3)
        .map(|_| {
            redis_worker::command([&*server.url(), "fleet", "2", "100", "10", "keyed"])
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn a worker")
        })
        .collect();
    let mut per_key: std::collections::HashMap<String, Vec<(u128, u128)>> = Default::default();
    for worker in workers {
        let out = worker.wait_with_output().expect("worker output");
        assert!(out.status.success(), "a worker failed: {out:?}");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.first() == Some(&"grant") {
                let grant = (fields[1].parse().unwrap(), fields[2].parse().unwrap());
                per_key.entry(fields[3].to_owned()).or_default().push(grant);
            }
        }
    }
    assert_eq!(per_key.len(), 2);
    for (key, grants) in &per_key {
        // Each key's merged timeline keeps its bound in every window, to within one round trip.
        check_bound(grants, 100.0, 10).unwrap_or_else(|e| panic!("key {key}: {e}"));
        // And each key's quota is used on its own: rate × time + burst, within 3 %.
        let first = grants.iter().map(|g| g.1).min().unwrap();
        let last = grants.iter().map(|g| g.1).max().unwrap();
        let expected = 10.0 + 100.0 * (last - first) as f64 / 1e9;
        let total = grants.len() as f64;
        assert!(
            (total - expected).abs() <= 0.03 * expected,
            "key {key}: {total} grants, expected {expected:.0} ± 3 %"
        );
    }
}

fn level(conn: &mut redis::Connection, key: &str) -> f64 {
    // The level is the first of the state's little-endian doubles, after its version byte.
    let state = get(conn, key).expect("a bucket");
    f64::from_le_bytes(state[1..9].try_into().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_per_key_cut_round_trips_and_are_given_back_when_idle() {
    let server = Server::start();
    let mut conn = admin(&server);
    let quota: RedisKeyedRateLimiter<String> =
        RedisKeyedRateLimiter::builder(server.url(), "lease", Rate::per_second(2_000), 50)
            .lease(20, Duration::from_millis(50))
            .build()
            .unwrap();
    for _ in 0..200 {
        quota.acquire("busy", 1).await.unwrap();
    }
    let stats = quota.stats();
    assert_eq!(stats.granted, 200);
    assert!(stats.round_trips <= 20, "{stats:?}");
    assert!(stats.from_lease >= 180, "{stats:?}");
    // One slow key. Its first try takes its cost only; once granted, the key is in use and
    // a try takes the cost and a lease's worth more.
    let slow: RedisKeyedRateLimiter<String> =
        RedisKeyedRateLimiter::builder(server.url(), "slow", Rate::per_minute(1), 50)
            .lease(20, Duration::from_millis(50))
            .build()
            .unwrap();
    slow.try_acquire("k", 1).await.unwrap();
    slow.try_acquire("other", 1).await.unwrap();
    let first = level(&mut conn, "{slow:k}");
    assert!((first - 49.0).abs() < 0.01, "{first}");
    slow.try_acquire("k", 1).await.unwrap();
    let taken = level(&mut conn, "{slow:k}");
    assert!((taken - 29.0).abs() < 0.01, "{taken}");
    // Spent locally, per key.
    for _ in 0..19 {
        slow.try_acquire("k", 1).await.unwrap();
    }
    assert_eq!(slow.stats().from_lease, 19);
    slow.try_acquire("k", 1).await.unwrap();
    assert_eq!(slow.stats().from_lease, 19);
    assert_eq!(slow.stats().keys, 2);
    // Idle past their age: given back, and the local state dropped. "other" had no lease.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(slow.stats().keys, 0);
    let other = level(&mut conn, "{slow:other}");
    assert!((other - 49.0).abs() < 0.01, "{other}");
    let k = level(&mut conn, "{slow:k}");
    assert!((k - 28.0).abs() < 0.01, "{k}");
    // Four requests, and one lease given back in the background.
    // Three requests, and the two leases given back in the background.
    assert_eq!(slow.stats().round_trips, 5);
}

async fn a_lease_never_passes_an_earlier_waiter_of_this_process() {
    let server = Server::start();
    let mut conn = admin(&server);
    // 10/s (one every 100 ms), burst 10, leases of 5.
    let quota: RedisKeyedRateLimiter<String> =
        RedisKeyedRateLimiter::builder(server.url(), "fifo", Rate::per_second(10), 10)
            .lease(5, Duration::from_secs(60))
            .build()
            .unwrap();
    // The first try takes its cost only; the second, the key now in use, a lease of 5 (its
    // cost and 4 more, held locally).
    quota.try_acquire("k", 1).await.unwrap();
    quota.try_acquire("k", 1).await.unwrap();
    let l = level(&mut conn, "{fifo:k}");
    assert!((l - 4.0).abs() < 0.05, "{l}");
    // A waiter whose cost the lease cannot give (8 > 4) reserves in Redis: some 400 ms.
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let waiter = {
        let (quota, order) = (quota.clone(), order.clone());
        tokio::spawn(async move {
            quota.acquire("k", 8).await.unwrap();
            order.lock().unwrap().push("waiter");
        })
    };
    // Queued: its reservation is in Redis (the level went below zero).
    let started = Instant::now();
    while level(&mut conn, "{fifo:k}") > 0.0 {
        assert!(started.elapsed() < Duration::from_secs(5), "never reserved");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The lease holds 4, enough for 1, but a waiter of this process is ahead: a try goes to
    // Redis, which refuses it (the reservation is ahead there too)...
    let before = quota.stats();
    let tried = quota.try_acquire("k", 1).await;
    assert!(
        matches!(tried, Err(TryAcquireError::NotUntil(_))),
        "{tried:?} {before:?}"
    );
    assert_eq!(quota.stats().from_lease, before.from_lease);
    // ...and an acquire queues behind the waiter.
    let later = {
        let (quota, order) = (quota.clone(), order.clone());
        tokio::spawn(async move {
            quota.acquire("k", 1).await.unwrap();
            order.lock().unwrap().push("later");
        })
    };
    waiter.await.unwrap();
    later.await.unwrap();
    assert_eq!(*order.lock().unwrap(), ["waiter", "later"]);
    // Nobody queued: the lease grants again, without a round trip.
    let trips = quota.stats().round_trips;
    let from_lease = quota.stats().from_lease;
    quota.acquire("k", 1).await.unwrap();
    assert_eq!(quota.stats().round_trips, trips);
    assert_eq!(quota.stats().from_lease, from_lease + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_that_is_never_granted_holds_nobody_up() {
    let server = Server::start();
    let quota = limiter::<String>(&server, "never", Rate::per_minute(1), 2);
    // Under the key's own limit too, which only Redis knows.
    quota
        .set_limit("own", Rate::per_minute(1), 3)
        .await
        .unwrap();
    for key in ["k", "own"] {
        let waited =
            tokio::time::timeout(Duration::from_millis(100), quota.acquire(key, u64::MAX)).await;
        assert!(waited.is_err(), "{key}");
        let refused = quota
            .acquire_timeout(key, u64::MAX, Duration::MAX)
            .await
            .unwrap_err();
        assert!(refusal(refused).is_never(), "{key}");
        // Nothing was charged.
        quota.try_acquire(key, 2).await.unwrap();
    }
}

/// A dropped `acquire` whose cost can never be granted was not charged, so it gives nothing
/// back: an emptied key stays empty (at 1 an hour it refills one token in 12 minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_acquire_that_is_never_granted_gives_nothing_back() {
    let server = Server::start();
    let quota = limiter::<String>(&server, "never-back", Rate::per_hour(1), 5);
    quota.acquire("k", 5).await.unwrap();
    for cost in [u64::MAX, 2_000_000_000] {
        let waited =
            tokio::time::timeout(Duration::from_millis(100), quota.acquire("k", cost)).await;
        assert!(waited.is_err(), "{cost} is never granted");
        let refused = quota
            .acquire_timeout("k", cost, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(refusal(refused).is_never(), "{cost}");
    }
    // Whatever was given back reaches Redis in the background, within a round trip.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refused = refusal(quota.try_acquire("k", 1).await.unwrap_err());
    assert!(
        refused.retry_after() > Duration::from_secs(600),
        "{refused:?}"
    );
}

fn epoch_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

async fn two_instances_with_leases_keep_each_keys_bound() {
    let server = Server::start();
    let make = || -> RedisKeyedRateLimiter<u64> {
        RedisKeyedRateLimiter::builder(server.url(), "fleet", Rate::per_second(200), 10)
            .lease(5, Duration::from_millis(20))
            .build()
            .unwrap()
    };
    let instances = [make(), make()];
    let stop = tokio::time::Instant::now() + Duration::from_secs(1);
    let mut tasks = Vec::new();
    for quota in &instances {
        for key in [1u64, 1, 2, 2] {
            let quota = quota.clone();
            tasks.push(tokio::spawn(async move {
                let mut grants = Vec::new();
                loop {
                    let sent = epoch_nanos();
                    match tokio::time::timeout_at(stop, quota.acquire(&key, 1)).await {
                        Ok(granted) => granted.unwrap(),
                        Err(_) => return (key, grants),
                    }
                    grants.push((sent, epoch_nanos()));
                }
            }));
        }
    }
    let mut per_key: std::collections::HashMap<u64, Vec<(u128, u128)>> = Default::default();
    for task in tasks {
        let (key, grants) = task.await.unwrap();
        per_key.entry(key).or_default().extend(grants);
    }
    for (key, grants) in &per_key {
        // The bound to within a round trip and the lease age (20 ms of refill: 4 tokens).
        check_bound(grants, 200.0, 14).unwrap_or_else(|e| panic!("key {key}: {e}"));
        assert!(
            grants.len() >= 150,
            "key {key}: only {} grants",
            grants.len()
        );
    }
    let stats = instances[0].stats();
    assert!(stats.from_lease > 0, "{stats:?}");
}

async fn waiters_of_one_key_are_served_in_the_order_they_asked() {
    let server = Server::start();
    let quota = limiter::<String>(&server, "fifo", Rate::per_second(50), 1);
    // Load the script first: the order holds once Redis knows it.
    quota.acquire("warm", 1).await.unwrap();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..10u64 {
        let quota = quota.clone();
        tasks.push(tokio::spawn(async move {
            // Big and small costs alike: a large request is not overtaken.
            let cost = if i % 3 == 0 { 2 } else { 1 };
            quota.acquire("k", cost).await.unwrap();
            start.elapsed()
        }));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut times = Vec::new();
    for task in tasks {
        times.push(task.await.unwrap());
    }
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
}

/// Grants of `cost` 1 on `key` until the first refusal (at most 100).
async fn grants_until_refused(quota: &RedisKeyedRateLimiter<String>, key: &str) -> u64 {
    let mut granted = 0;
    while granted < 100 && quota.try_acquire(key, 1).await.is_ok() {
        granted += 1;
    }
    granted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_falls_back_to_a_share_of_the_limits_this_process_set() {
    let mut server = Server::start();
    // One token a minute by default: nothing refills during the test, so what the fallback
    // grants is its share of each key's burst.
    let quota: RedisKeyedRateLimiter<String> =
        RedisKeyedRateLimiter::builder(server.url(), "share", Rate::per_minute(1), 4)
            .failure_policy(FailurePolicy::FailOpen { share: 0.5 })
            .build()
            .unwrap();
    quota
        .set_limit("big", Rate::per_minute(1), 10)
        .await
        .unwrap();
    quota
        .set_limit("small", Rate::per_minute(1), 3)
        .await
        .unwrap();
    quota
        .set_limit("cleared", Rate::per_minute(1), 10)
        .await
        .unwrap();
    quota.clear_limit("cleared").await.unwrap();
    quota
        .set_limit("paced", Rate::per_second(20), 2)
        .await
        .unwrap();
    // A limit set by another process is in Redis only.
    let other = limiter::<String>(&server, "share", Rate::per_minute(1), 4);
    other
        .set_limit("elsewhere", Rate::per_minute(1), 10)
        .await
        .unwrap();
    server.kill();

    // Half of each key's burst, as this process knows its limit (rounded down, at least 1).
    for (key, share) in [
        ("big", 5),
        ("small", 1),
        ("cleared", 2),
        ("default", 2),
        ("elsewhere", 2),
    ] {
        assert_eq!(grants_until_refused(&quota, key).await, share, "{key}");
    }
    // Waiting goes through the same local limits: "paced" at half of 20/s, one at a time.
    let start = Instant::now();
    for _ in 0..3 {
        tokio::time::timeout(Duration::from_secs(2), quota.acquire("paced", 1))
            .await
            .expect("bounded")
            .unwrap();
    }
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(190), "{took:?}");
    assert!(took < Duration::from_millis(600), "{took:?}");
    let refused = quota
        .acquire_timeout("small", 1, Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(refused.not_until().is_some(), "{refused}");
    let stats = quota.stats();
    assert_eq!(stats.fallback, 5 + 1 + 2 + 2 + 2 + 3, "{stats:?}");
    assert!(stats.errors > 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_and_clear_limit_fail_at_once_while_redis_is_down_and_change_nothing() {
    for policy in [
        FailurePolicy::default(),
        FailurePolicy::FailOpen { share: 0.5 },
    ] {
        let mut server = Server::start();
        let quota: RedisKeyedRateLimiter<String> =
            RedisKeyedRateLimiter::builder(server.url(), "cfg", Rate::per_minute(1), 2)
                .failure_policy(policy)
                .build()
                .unwrap();
        quota.set_limit("k", Rate::per_minute(1), 8).await.unwrap();
        server.kill();
        let start = Instant::now();
        let err = quota
            .set_limit("k", Rate::per_minute(1), 100)
            .await
            .unwrap_err();
        assert!(matches!(err, RedisLimiterError::Unavailable(_)), "{err}");
        let err = quota.clear_limit("k").await.unwrap_err();
        assert!(matches!(err, RedisLimiterError::Unavailable(_)), "{err}");
        // At once: neither retried nor handed to a fallback, each one round trip.
        let took = start.elapsed();
        assert!(took < Duration::from_secs(1), "{policy:?}: {took:?}");
        let stats = quota.stats();
        assert_eq!(
            (stats.errors, stats.fallback),
            (2, 0),
            "{policy:?}: {stats:?}"
        );
        if let FailurePolicy::FailOpen { .. } = policy {
            // The failed changes changed nothing here: the fallback grants half of 8.
            assert_eq!(grants_until_refused(&quota, "k").await, 4);
            assert_eq!(quota.stats().fallback, 4);
        }
        // Back (empty: no persistence), a change succeeds, and ends the fail-open fallback at
        // once: the next request is Redis's, under the new limit.
        server.restart();
        // As soon as the connection is made again (it reconnects by itself).
        let back = Instant::now();
        while let Err(e) = quota.set_limit("k", Rate::per_minute(1), 6).await {
            assert!(matches!(e, RedisLimiterError::Unavailable(_)), "{e}");
            assert!(back.elapsed() < Duration::from_secs(5), "not back: {e}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let fallback = quota.stats().fallback;
        quota.try_acquire("k", 6).await.unwrap();
        assert!(quota.try_acquire("k", 1).await.is_err());
        assert_eq!(quota.stats().fallback, fallback, "{policy:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_asked_less_often_than_the_lease_age_never_takes_a_lease() {
    let server = Server::start();
    let mut conn = admin(&server);
    let quota: RedisKeyedRateLimiter<String> =
        RedisKeyedRateLimiter::builder(server.url(), "rare", Rate::per_minute(1), 50)
            .lease(20, Duration::from_millis(100))
            .build()
            .unwrap();
    for _ in 0..3 {
        quota.try_acquire("k", 1).await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // Each took its cost only: nothing held back, nothing to give back.
    let level = level(&mut conn, "{rare:k}");
    assert!((level - 47.0).abs() < 0.05, "{level}");
    tokio::time::sleep(Duration::from_millis(250)).await;
    let stats = quota.stats();
    assert_eq!((stats.round_trips, stats.from_lease, stats.keys), (3, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_key_gives_its_expired_lease_back_with_its_next_round_trip() {
    let server = Server::start();
    let mut conn = admin(&server);
    let quota: RedisKeyedRateLimiter<String> =
        RedisKeyedRateLimiter::builder(server.url(), "busy", Rate::per_minute(1), 50)
            .lease(20, Duration::from_millis(200))
            .build()
            .unwrap();
    // Its cost, then (in use) its cost and a lease of 19.
    quota.try_acquire("k", 1).await.unwrap();
    quota.try_acquire("k", 1).await.unwrap();
    let taken = level(&mut conn, "{busy:k}");
    assert!((taken - 29.0).abs() < 0.05, "{taken}");
    // From the lease, which keeps the key in use past the lease's age.
    tokio::time::sleep(Duration::from_millis(120)).await;
    quota.try_acquire("k", 1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(120)).await;
    // The lease has expired: its 18 tokens go back with the round trip that takes a new one.
    quota.try_acquire("k", 1).await.unwrap();
    let stats = quota.stats();
    assert_eq!((stats.round_trips, stats.from_lease), (3, 1), "{stats:?}");
    let now = level(&mut conn, "{busy:k}");
    assert!((now - 27.0).abs() < 0.05, "{now}");
    // Idle: the last lease goes back in the background, and the key's local state goes.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let stats = quota.stats();
    assert_eq!((stats.round_trips, stats.keys), (4, 0), "{stats:?}");
    let back = level(&mut conn, "{busy:k}");
    assert!((back - 46.0).abs() < 0.05, "{back}");
}

/// A task looping on `try_acquire` of a leased key whose limit never binds yields to the
/// runtime (a grant from the lease spends the task's cooperative budget): a 5 ms timer on the
/// same thread fires in time, where without the budget it waits for the loop to give up (3 s).
#[test]
fn a_task_looping_on_a_keys_lease_does_not_starve_a_timer() {
    let server = Server::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let quota: RedisKeyedRateLimiter<String> = RedisKeyedRateLimiter::builder(
            server.url(),
            "coop",
            Rate::per_second(1_000_000_000),
            1_000_000_000,
        )
        .lease(100_000_000, Duration::from_secs(60))
        .build()
        .unwrap();
        // The key's first round trip takes its cost; the second, a lease.
        quota.try_acquire("k", 1).await.unwrap();
        quota.try_acquire("k", 1).await.unwrap();
        let quota = &quota;
        let (fired, grants) =
            starve::timer_beside(move || async move { quota.try_acquire("k", 1).await.unwrap() })
                .await;
        assert!(
            fired < Duration::from_millis(200),
            "the timer fired after {fired:?}, {grants} grants"
        );
        assert_eq!(quota.stats().round_trips, 2, "all from the lease");
    });
}

/// Tries of a key this process holds nothing for, made together while Redis cannot be reached,
/// share the key's one fail-open fallback: `share × burst` in all (5), not that much per try.
async fn tries_of_a_new_key_during_an_outage_share_its_one_fallback() {
    // Nothing listens on port 1: every round trip fails at once.
    let quota: RedisKeyedRateLimiter<String> =
        RedisKeyedRateLimiter::builder("redis://127.0.0.1:1/", "outage", Rate::per_hour(1), 10)
            .failure_policy(FailurePolicy::FailOpen { share: 0.5 })
            .build()
            .unwrap();
    let tries = (0..20).map(|_| quota.try_acquire("k", 1));
    let answers = futures_util::future::join_all(tries).await;
    let granted = answers.iter().filter(|a| a.is_ok()).count();
    assert_eq!(granted, 5, "{answers:?}");
    let stats = quota.stats();
    assert_eq!((stats.granted, stats.fallback), (5, 5), "{stats:?}");
    // Another key has a fallback of its own.
    assert!(quota.try_acquire("other", 1).await.is_ok());
}

on_every_flavor!(
    tries_of_a_new_key_during_an_outage_share_its_one_fallback,
    waiting_is_a_reservation_and_a_timeout_takes_nothing,
    a_lease_never_passes_an_earlier_waiter_of_this_process,
    two_instances_with_leases_keep_each_keys_bound,
    waiters_of_one_key_are_served_in_the_order_they_asked,
);
