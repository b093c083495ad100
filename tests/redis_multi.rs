//! `RedisRateLimiter` against a real, private `redis-server`: all or nothing, one round
//! trip per grant, the latest wait, settling down and up as Redis holds it, the format version,
//! `set_limit` and `clear_limit` obeyed by other instances and processes, leases (taken by
//! `try_acquire` and reservations, given back when they expire, never passing an earlier
//! waiter), a fleet of processes held to every limit's bound (the workers are this test binary
//! started again, `worker_process`), and Redis killed under both failure policies (the
//! fail-open stand-in following this process's own limits). Real time: Redis does not run on
//! tokio's paused clock.
#![cfg(feature = "redis")]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use paced::redis::{
    FailurePolicy, RedisKeyedRateLimiter, RedisLimiterError, RedisRateLimiter, TryAcquireError,
};
use paced::{ConfigError, Limit, Rate};

#[macro_use]
#[path = "common/flavors.rs"]
mod flavors;
#[allow(dead_code)]
#[path = "common/redis_server.rs"]
mod redis_server;
use redis_server::Server;

/// Set in a worker process's environment: what it is to do, as its arguments, one a line.
const WORKER: &str = "PACED_MULTI_WORKER";

/// Requests and tokens, each so slow that no test refills a noticeable part of a token (one a
/// minute: under 0.05 in 3 s).
fn slow(url: &str, name: &str, requests: u64, tokens: u64) -> RedisRateLimiter<[u64; 2]> {
    RedisRateLimiter::dimensions(url, name, ["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_minute(1), requests))
        .limit("tokens", Limit::bucket(Rate::per_minute(1), tokens))
        .build()
        .unwrap()
}

fn admin(server: &Server) -> redis::Connection {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

/// The state under `key`, read: version byte 1, `at`, then two doubles per limit (a bucket's
/// level and 0; a window's number and use).
fn state(conn: &mut redis::Connection, key: &str) -> Vec<f64> {
    let state: Vec<u8> = redis::cmd("GET").arg(key).query(conn).unwrap();
    assert_eq!(state.first(), Some(&1), "the format version: {state:?}");
    assert_eq!(
        (state.len() - 9) % 16,
        0,
        "a state of {} bytes",
        state.len()
    );
    state[1..]
        .chunks(8)
        .map(|d| f64::from_le_bytes(d.try_into().unwrap()))
        .collect()
}

/// The levels of the buckets in the state under `key`.
fn levels(conn: &mut redis::Connection, key: &str) -> Vec<f64> {
    state(conn, key)[1..].iter().step_by(2).copied().collect()
}

fn assert_near(found: f64, expected: f64) {
    assert!((found - expected).abs() < 0.05, "{found} != {expected}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_charges_no_limit() {
    let server = Server::start();
    let mut conn = admin(&server);
    let llm = slow(&server.url(), "aon", 5, 100);
    let permit = llm.try_acquire([1, 90]).await.unwrap();
    assert_eq!(permit.charged(), [1, 90]);
    let before = levels(&mut conn, "{aon}");
    assert_near(before[0], 4.0);
    assert_near(before[1], 10.0);
    // Requests have room, tokens do not: neither is charged.
    for _ in 0..3 {
        match llm.try_acquire([1, 20]).await {
            Err(TryAcquireError::NotUntil(refused)) => assert!(!refused.is_never()),
            other => panic!("{other:?}"),
        }
        let refused = llm
            .acquire_timeout([1, 20], Duration::from_millis(50))
            .await;
        assert!(matches!(refused, Err(TryAcquireError::NotUntil(_))));
    }
    let after = levels(&mut conn, "{aon}");
    assert_near(after[0], 4.0);
    assert_near(after[1], 10.0);
    // And the reverse: tokens have room, requests do not.
    llm.try_acquire([4, 0]).await.unwrap();
    assert!(llm.try_acquire([1, 1]).await.is_err());
    let last = levels(&mut conn, "{aon}");
    assert_near(last[0], 0.0);
    assert_near(last[1], 10.0);
    let stats = llm.stats();
    assert_eq!((stats.granted, stats.rejected), (2, 7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_round_trip_per_grant() {
    let server = Server::start();
    let llm = slow(&server.url(), "trips", 1_000, 1_000_000);
    for i in 0..50 {
        llm.acquire([1, 100 + i]).await.unwrap();
    }
    for _ in 0..25 {
        llm.try_acquire([1, 7]).await.unwrap();
    }
    let stats = llm.stats();
    assert_eq!(stats.granted, 75);
    assert_eq!(stats.round_trips, 75, "{stats:?}");
}

async fn the_wait_is_the_latest_of_the_limits() {
    let server = Server::start();
    // Requests: one every 100 ms, burst 1. Tokens: 100/s (one every 10 ms), burst 100.
    let llm: RedisRateLimiter<[u64; 2]> =
        RedisRateLimiter::dimensions(&server.url(), "latest", ["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_second(10), 1))
            .limit("tokens", Limit::bucket(Rate::per_second(100), 100))
            .build()
            .unwrap();
    llm.acquire([1, 100]).await.unwrap();
    // Requests in 100 ms, 50 tokens in 500 ms: 500 ms.
    let Err(TryAcquireError::NotUntil(refused)) = llm.try_acquire([1, 50]).await else {
        panic!("granted at once");
    };
    let wait = refused.retry_after();
    assert!(
        wait > Duration::from_millis(480) && wait <= Duration::from_millis(500),
        "{wait:?}"
    );
    // Requests in 100 ms, 5 tokens in 50 ms: 100 ms.
    let Err(TryAcquireError::NotUntil(refused)) = llm.try_acquire([1, 5]).await else {
        panic!("granted at once");
    };
    let wait = refused.retry_after();
    assert!(
        wait > Duration::from_millis(80) && wait <= Duration::from_millis(100),
        "{wait:?}"
    );
    // Waited for in one round trip: the latest again (the tokens' 500 ms, less the time gone).
    let start = Instant::now();
    llm.acquire([1, 50]).await.unwrap();
    let waited = start.elapsed();
    assert!(
        waited > Duration::from_millis(440) && waited < Duration::from_millis(600),
        "{waited:?}"
    );
    assert_eq!(llm.stats().round_trips, 4);
    // Too long for a timeout: refused, in one round trip, charging nothing.
    let start = Instant::now();
    let refused = llm
        .acquire_timeout([1, 100], Duration::from_millis(100))
        .await;
    assert!(matches!(refused, Err(TryAcquireError::NotUntil(_))));
    assert!(start.elapsed() < Duration::from_millis(50));
    assert_eq!(llm.stats().round_trips, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settling_corrects_every_limit_in_redis() {
    let server = Server::start();
    let mut conn = admin(&server);
    let llm: RedisRateLimiter<[u64; 2]> =
        RedisRateLimiter::dimensions(&server.url(), "settle", ["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_minute(1), 10))
            .limit("tokens", Limit::bucket(Rate::per_minute(1), 1_000))
            // Two limits on one dimension: both corrected.
            .limit("tokens", Limit::bucket(Rate::per_minute(1), 300))
            .build()
            .unwrap();
    let permit = llm.acquire([1, 200]).await.unwrap();
    let state = levels(&mut conn, "{settle}");
    assert_near(state[0], 9.0);
    assert_near(state[1], 800.0);
    assert_near(state[2], 100.0);
    // Down: 150 given back to both token limits.
    permit.settle([1, 50]).await.unwrap();
    let state = levels(&mut conn, "{settle}");
    assert_near(state[0], 9.0);
    assert_near(state[1], 950.0);
    assert_near(state[2], 250.0);
    // A refund never lifts a bucket above its burst.
    let permit = llm.acquire([1, 10]).await.unwrap();
    permit.settle([0, 0]).await.unwrap();
    let state = levels(&mut conn, "{settle}");
    assert_near(state[0], 9.0);
    assert_near(state[1], 950.0);
    assert_near(state[2], 250.0);
    // Up: a debt, which later grants wait for.
    let permit = llm.acquire([1, 50]).await.unwrap();
    permit.settle([1, 600]).await.unwrap();
    let state = levels(&mut conn, "{settle}");
    assert_near(state[0], 8.0);
    assert_near(state[1], 350.0);
    assert_near(state[2], -350.0);
    assert!(matches!(
        llm.try_acquire([0, 1]).await,
        Err(TryAcquireError::NotUntil(_))
    ));
    // Unchanged: no round trip.
    let trips = llm.stats().round_trips;
    let permit = llm.try_acquire([1, 0]).await.unwrap();
    permit.settle([1, 0]).await.unwrap();
    assert_eq!(llm.stats().round_trips, trips + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_goes_away_gives_its_charge_back() {
    let server = Server::start();
    let mut conn = admin(&server);
    let llm: RedisRateLimiter<[u64; 2]> =
        RedisRateLimiter::dimensions(&server.url(), "gone", ["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_minute(1), 10))
            .limit("tokens", Limit::bucket(Rate::per_second(10), 100))
            .build()
            .unwrap();
    llm.acquire([1, 100]).await.unwrap();
    // Granted by Redis with a wait of 2 s (20 tokens at 10/s), then dropped after 100 ms.
    let waited = tokio::time::timeout(Duration::from_millis(100), llm.acquire([1, 20])).await;
    assert!(waited.is_err());
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Given back in full: it was the latest grant, so the state moves back from its instant,
    // 2 s ahead, to now, as if it had never been charged. Requests 9 again; tokens what
    // refilled since the first grant at 10/s (about 2; 0 had it been kept, until 2 s ahead).
    let s = state(&mut conn, "{gone}");
    let now_us: (u64, u64) = redis::cmd("TIME").query(&mut conn).unwrap();
    let now_us = (now_us.0 * 1_000_000 + now_us.1) as f64;
    assert!(
        s[0] <= now_us,
        "the state's instant {} is after now {now_us}",
        s[0]
    );
    assert_near(s[1], 9.0);
    assert!((0.5..5.0).contains(&s[3]), "tokens {}", s[3]);
    assert_eq!(llm.stats().round_trips, 3);
    // So a request of one token goes at once, rather than 2 s later behind the dropped grant.
    llm.try_acquire([1, 1]).await.unwrap();
}

/// A waiter that goes away gives its charge back before this process's next request is
/// charged: with that request's round trip, or, if none comes, in the background, with the
/// next request waiting for that round trip's answer. So the request after it never waits
/// behind the debt of a grant nobody will use.
async fn the_request_after_a_waiter_that_went_away_does_not_wait_for_it() {
    let server = Server::start();
    let llm: RedisRateLimiter<[u64; 2]> =
        RedisRateLimiter::dimensions(&server.url(), "after", ["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_minute(1), 10))
            .limit("tokens", Limit::bucket(Rate::per_second(10), 100))
            .build()
            .unwrap();
    for next in ["try", "acquire", "later"] {
        // 10 tokens left, then a grant of 30 with a wait of 2 s (20 tokens at 10/s), dropped.
        llm.acquire([1, 90]).await.unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(50), llm.acquire([1, 30])).await;
        assert!(waited.is_err());
        match next {
            // At once: with the try's round trip, or ahead of it.
            "try" => llm.try_acquire([1, 1]).await.map(|_| ()).unwrap(),
            "acquire" => {
                let started = Instant::now();
                llm.acquire([1, 1]).await.unwrap();
                assert!(started.elapsed() < Duration::from_millis(500), "{next}");
            }
            _ => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                llm.try_acquire([1, 1]).await.map(|_| ()).unwrap();
            }
        }
        // The next case starts from a full quota.
        let mut conn = admin(&server);
        let _: () = redis::cmd("DEL").arg("{after}").query(&mut conn).unwrap();
    }
}

/// A shaping stream over several limits on a broken key (a value of another type) holds its
/// items and asks again at a bounded backoff, whatever the policy, and goes on once the key is
/// repaired: nothing let through without Redis, nothing lost, no busy loop. As with one limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shaping_stream_on_a_broken_key_holds_its_items() {
    use futures_util::StreamExt;
    use paced::{PaceExt, Shaping};

    let server = Server::start();
    for (key, policy) in [
        ("broken-closed", FailurePolicy::default()),
        ("broken-open", FailurePolicy::FailOpen { share: 1.0 }),
    ] {
        let mut conn = admin(&server);
        let redis_key = format!("{{{key}}}");
        let _: () = redis::cmd("HSET")
            .arg(&redis_key)
            .arg("field")
            .arg("value")
            .query(&mut conn)
            .unwrap();
        let llm = RedisRateLimiter::dimensions(&server.url(), key, ["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_second(100), 5))
            .limit("tokens", Limit::bucket(Rate::per_second(1_000), 100))
            .failure_policy(policy)
            .build()
            .unwrap();
        let repair = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1_200)).await;
            let _: () = redis::cmd("DEL").arg(&redis_key).query(&mut conn).unwrap();
        });
        let start = Instant::now();
        let out: Vec<(u32, Duration)> = futures_util::stream::iter(0..3u32)
            .throttle_with(&llm, |_| [1, 1], Shaping)
            .map(|i| (i, start.elapsed()))
            .collect()
            .await;
        repair.await.unwrap();
        assert_eq!(out.iter().map(|o| o.0).collect::<Vec<_>>(), [0, 1, 2]);
        assert!(out[0].1 >= Duration::from_millis(1_200), "{key}: {out:?}");
        // Asked again at 0.1, 0.3, 0.7 and 1.5 s: the fourth retry finds it repaired.
        assert!(out[2].1 < Duration::from_millis(2_000), "{key}: {out:?}");
        let stats = llm.stats();
        assert!((3..=5).contains(&stats.reply_errors), "{key}: {stats:?}");
        assert_eq!(
            (stats.errors, stats.fallback, stats.granted),
            (0, 0, 3),
            "{key}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_of_an_unknown_version_is_a_reply_error_left_as_it_is() {
    let server = Server::start();
    let mut conn = admin(&server);
    let later: Vec<u8> = std::iter::once(2).chain([0u8; 24]).collect();
    let _: () = redis::cmd("SET")
        .arg("{later}")
        .arg(&later)
        .query(&mut conn)
        .unwrap();
    let llm = slow(&server.url(), "later", 5, 100);
    match llm.acquire([1, 1]).await {
        Err(RedisLimiterError::Reply(e)) => {
            assert!(e.to_string().contains("format version 2"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        llm.try_acquire([1, 1]).await,
        Err(TryAcquireError::Reply(_))
    ));
    assert!(matches!(
        llm.acquire_timeout([1, 1], Duration::from_secs(1)).await,
        Err(TryAcquireError::Reply(_))
    ));
    let kept: Vec<u8> = redis::cmd("GET").arg("{later}").query(&mut conn).unwrap();
    assert_eq!(kept, later);
    let stats = llm.stats();
    assert_eq!((stats.reply_errors, stats.errors, stats.granted), (3, 0, 0));
    // A state of another number of limits is not this quota's either.
    let other = slow(&server.url(), "shape", 5, 100);
    other.acquire([1, 1]).await.unwrap();
    let three: RedisRateLimiter<[u64; 1]> =
        RedisRateLimiter::dimensions(&server.url(), "shape", ["requests"])
            .limit("requests", Limit::bucket(Rate::per_minute(1), 5))
            .build()
            .unwrap();
    assert!(matches!(
        three.acquire([1]).await,
        Err(RedisLimiterError::Reply(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_window_resets_at_its_boundaries_on_redis_time() {
    let server = Server::start();
    let mut conn = admin(&server);
    // At most 3 requests per second, from the Unix epoch's seconds, and a slow token bucket.
    let llm: RedisRateLimiter<[u64; 2]> =
        RedisRateLimiter::dimensions(&server.url(), "window", ["requests", "tokens"])
            .limit("requests", Limit::window(3, Duration::from_secs(1)))
            .limit("tokens", Limit::bucket(Rate::per_minute(1), 1_000))
            .build()
            .unwrap();
    // Start early in a second, so that three grants fit in it.
    let into = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap();
    tokio::time::sleep(
        Duration::from_nanos(1_000_000_000 - u64::from(into.subsec_nanos()))
            + Duration::from_millis(5),
    )
    .await;
    for _ in 0..3 {
        llm.try_acquire([1, 10]).await.unwrap();
    }
    let Err(TryAcquireError::NotUntil(refused)) = llm.try_acquire([1, 10]).await else {
        panic!("a fourth in the window");
    };
    let wait = refused.retry_after();
    assert!(
        wait <= Duration::from_millis(1_000) && wait > Duration::from_millis(500),
        "{wait:?}"
    );
    // The refusal charged no tokens; the window's use is 3.
    let s = state(&mut conn, "{window}");
    assert_eq!(s[2], 3.0);
    assert_near(s[3], 970.0);
    // A settle down within the window gives back.
    let permit = llm.acquire_timeout([0, 10], Duration::ZERO).await.unwrap();
    permit.settle([0, 1]).await.unwrap();
    // The next request waits for the next second, on Redis's clock (this machine's too).
    llm.acquire([1, 1]).await.unwrap();
    let at = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap();
    assert!(at.subsec_millis() < 100, "{at:?}");
    let s = state(&mut conn, "{window}");
    assert_eq!(s[2], 1.0);
    assert_near(s[3], 968.0);
    // A cost above the quota waits for an unused window and carries its excess.
    let start = Instant::now();
    llm.acquire([5, 0]).await.unwrap();
    let waited = start.elapsed();
    assert!(
        waited > Duration::from_millis(850) && waited < Duration::from_millis(1_150),
        "{waited:?}"
    );
    let s = state(&mut conn, "{window}");
    assert_eq!(s[2], 5.0);
    assert!(matches!(
        llm.try_acquire([2, 0]).await,
        Err(TryAcquireError::NotUntil(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_limiter_keeps_each_keys_limits_under_its_own_hash_tag() {
    let server = Server::start();
    let mut conn = admin(&server);
    let tenants: RedisKeyedRateLimiter<String, [u64; 2]> =
        RedisKeyedRateLimiter::dimensions(&server.url(), "tenants", ["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_minute(1), 5))
            .limit("tokens", Limit::bucket(Rate::per_minute(1), 100))
            .build()
            .unwrap();
    let permit = tenants.try_acquire("a", [1, 90]).await.unwrap();
    // Another key is untouched by the first one's use.
    tenants.try_acquire("b:{x}", [1, 100]).await.unwrap();
    assert!(matches!(
        tenants.try_acquire("a", [1, 20]).await,
        Err(TryAcquireError::NotUntil(_))
    ));
    permit.settle([1, 60]).await.unwrap();
    tenants.acquire("a", [1, 40]).await.unwrap();
    let a = levels(&mut conn, "{tenants:a}");
    assert_near(a[0], 3.0);
    assert_near(a[1], 0.0);
    // Keys are escaped inside the one hash tag.
    let b = levels(&mut conn, "{tenants:b%3A%7Bx%7D}");
    assert_near(b[0], 4.0);
    assert_near(b[1], 0.0);
    // Nothing in flight and no leases: no key holds state here.
    let stats = tenants.stats();
    assert_eq!(
        (stats.granted, stats.rejected, stats.round_trips, stats.keys),
        (3, 1, 5, 0)
    );
    let timed = tenants
        .acquire_timeout("b:{x}", [1, 1], Duration::from_millis(10))
        .await;
    assert!(matches!(timed, Err(TryAcquireError::NotUntil(_))));
}

/// With leases, a key of a keyed limiter takes one only while it is in use (granted within
/// the lease's age), as with one limit: a key asked once holds no tokens it does not use, and
/// costs no round trip to give them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_limiter_leases_only_for_keys_in_use() {
    let server = Server::start();
    let mut conn = admin(&server);
    let age = Duration::from_millis(300);
    let tenants: RedisKeyedRateLimiter<String, [u64; 2]> =
        RedisKeyedRateLimiter::dimensions(&server.url(), "in-use", ["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_minute(1), 50))
            .limit("tokens", Limit::bucket(Rate::per_minute(1), 1_000))
            .lease([5, 100], age)
            .build()
            .unwrap();
    // Asked once: its cost only.
    tenants.acquire("once", [1, 10]).await.unwrap();
    assert_near(levels(&mut conn, "{in-use:once}")[0], 49.0);
    // Asked again within the age: in use, so its round trip takes a lease, and the next
    // grants come from it.
    tenants.try_acquire("busy", [1, 10]).await.unwrap();
    tenants.acquire("busy", [1, 10]).await.unwrap();
    assert_near(levels(&mut conn, "{in-use:busy}")[0], 43.0);
    tenants.acquire("busy", [1, 10]).await.unwrap();
    let stats = tenants.stats();
    // Both keys granted within the lease's age hold state here; "busy" a lease too.
    assert_eq!((stats.round_trips, stats.from_lease, stats.keys), (3, 1, 2));
    // Past the age: "busy" gives back its lease (one round trip), "once" had nothing to give.
    tokio::time::sleep(age + Duration::from_millis(200)).await;
    assert_eq!((tenants.stats().round_trips, tenants.stats().keys), (4, 0));
    assert_near(levels(&mut conn, "{in-use:busy}")[0], 47.0);
    assert_near(levels(&mut conn, "{in-use:once}")[0], 49.0);
    // Idle past the age, a key's next round trip takes only its cost again.
    tenants.acquire("busy", [1, 10]).await.unwrap();
    assert_near(levels(&mut conn, "{in-use:busy}")[0], 46.0);
    // A limiter of one quota asks for a lease with every round trip.
    let one = RedisRateLimiter::dimensions(&server.url(), "eager", ["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_minute(1), 50))
        .lease([5, 100], age)
        .build()
        .unwrap();
    one.acquire([1, 10]).await.unwrap();
    assert_near(levels(&mut conn, "{eager}")[0], 44.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_limit_is_kept_in_redis_for_every_instance_keeping_levels() {
    let server = Server::start();
    let mut conn = admin(&server);
    let build = || {
        RedisRateLimiter::dimensions(&server.url(), "set", ["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_minute(1), 5))
            .limit("tokens", Limit::bucket(Rate::per_minute(1), 100))
            .limit("tokens", Limit::window(200, Duration::from_secs(3_600)))
            .build()
            .unwrap()
    };
    // Two instances, two connections: one process's change, the other's next request.
    let (a, b) = (build(), build());
    a.try_acquire([2, 90]).await.unwrap();
    a.set_limit(0, Limit::bucket(Rate::per_minute(1), 2))
        .await
        .unwrap();
    a.set_limit(1, Limit::bucket(Rate::per_minute(1), 1_000))
        .await
        .unwrap();
    let pttl: i64 = redis::cmd("PTTL").arg("{set}").query(&mut conn).unwrap();
    assert_eq!(pttl, -1, "a quota with limits set is configuration");
    let levels = state(&mut conn, "{set}");
    // The requests' level, 3, is capped at the new burst; the tokens keep their 10.
    assert_near(levels[1], 2.0);
    assert_near(levels[3], 10.0);
    // The other instance obeys the new burst of requests...
    b.try_acquire([2, 0]).await.unwrap();
    assert!(matches!(
        b.try_acquire([1, 0]).await,
        Err(TryAcquireError::NotUntil(_))
    ));
    // ...and the tokens' level was kept, not raised to the new burst of 1000.
    a.set_limit(0, Limit::bucket(Rate::per_second(1_000), 100))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(matches!(
        b.try_acquire([1, 11]).await,
        Err(TryAcquireError::NotUntil(_))
    ));
    b.try_acquire([1, 10]).await.unwrap();
    // A window keeps what its current window used (100 of 200): a quota of 120 leaves 20.
    a.set_limit(1, Limit::bucket(Rate::per_second(1_000), 1_000))
        .await
        .unwrap();
    a.set_limit(2, Limit::window(120, Duration::from_secs(3_600)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(matches!(
        b.try_acquire([1, 21]).await,
        Err(TryAcquireError::NotUntil(_))
    ));
    b.try_acquire([1, 20]).await.unwrap();
    // Wrong kind, no such limit, invalid: nothing sent.
    for (index, limit, expected) in [
        (
            0,
            Limit::window(5, Duration::from_secs(1)),
            ConfigError::LimitKind,
        ),
        (
            2,
            Limit::bucket(Rate::per_second(1), 5),
            ConfigError::LimitKind,
        ),
        (
            3,
            Limit::bucket(Rate::per_second(1), 5),
            ConfigError::NoSuchLimit,
        ),
        (
            0,
            Limit::bucket(Rate::per_second(1), 0),
            ConfigError::ZeroBurst,
        ),
    ] {
        match a.set_limit(index, limit).await {
            Err(RedisLimiterError::Config(e)) => assert_eq!(e, expected),
            other => panic!("{other:?}"),
        }
    }
    // The keyed limiter sets one key's limit; the other keys keep the builder's.
    let keyed = RedisKeyedRateLimiter::<String, [u64; 1]>::dimensions(&server.url(), "ks", ["r"])
        .limit("r", Limit::bucket(Rate::per_minute(1), 3))
        .build()
        .unwrap();
    keyed
        .set_limit("one", 0, Limit::bucket(Rate::per_minute(1), 1))
        .await
        .unwrap();
    keyed.try_acquire("one", [1]).await.unwrap();
    assert!(keyed.try_acquire("one", [1]).await.is_err());
    keyed.try_acquire("two", [3]).await.unwrap();
}

/// A worker process's part of the test above: `obey <url> <name>` builds [`slow`] with the
/// builder's 5 requests and prints how many `[1, 0]` it is granted now (the limit set in Redis
/// by another process, 2 of its 3 left, decides).
fn obey(url: &str, name: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let granted = runtime.block_on(async {
        let llm = slow(url, name, 5, 100);
        let mut granted = 0;
        while llm.try_acquire([1, 0]).await.is_ok() {
            granted += 1;
            assert!(granted <= 5, "more than the builder's burst");
        }
        granted
    });
    println!("obeyed: {granted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_obeys_a_limit_set_in_redis() {
    let server = Server::start();
    let llm = slow(&server.url(), "obey", 5, 100);
    llm.try_acquire([2, 0]).await.unwrap();
    llm.set_limit(0, Limit::bucket(Rate::per_minute(1), 2))
        .await
        .unwrap();
    let exe = std::env::current_exe().expect("test binary path");
    let out = Command::new(&exe)
        .args(["worker_process", "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(WORKER, ["obey", &server.url(), "obey"].join("\n"))
        .output()
        .expect("run a worker process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "worker failed: {out:?}");
    assert!(stdout.contains("obeyed: 2"), "{stdout}");
}

/// Requests (bucket of 50) and tokens (bucket of 1000 and 600 an hour), each refilling
/// one a minute, under `name`, with a lease if given.
fn leased(
    url: &str,
    name: &str,
    lease: Option<([u64; 2], Duration)>,
) -> RedisRateLimiter<[u64; 2]> {
    let mut builder = RedisRateLimiter::dimensions(url, name, ["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_minute(1), 50))
        .limit("tokens", Limit::bucket(Rate::per_minute(1), 1_000))
        .limit("tokens", Limit::window(600, Duration::from_secs(3_600)));
    if let Some((max_tokens, max_age)) = lease {
        builder = builder.lease(max_tokens, max_age);
    }
    builder.build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_charged_in_redis_at_once_and_grants_locally() {
    let server = Server::start();
    let mut conn = admin(&server);
    let minute = Duration::from_secs(60);
    let a = leased(&server.url(), "lease", Some(([10, 100], minute)));
    let b = leased(&server.url(), "lease", None);
    // The first grant takes its cost and a lease of [10, 100] beyond it, charged at once.
    a.try_acquire([1, 5]).await.unwrap();
    let s = state(&mut conn, "{lease}");
    assert_near(s[1], 39.0);
    assert_near(s[3], 895.0);
    assert_near(s[6], 105.0);
    // Ten grants from the lease: no round trip, nothing more charged.
    for _ in 0..10 {
        a.try_acquire([1, 5]).await.unwrap();
    }
    let stats = a.stats();
    assert_eq!(
        (stats.round_trips, stats.from_lease, stats.granted),
        (1, 10, 11)
    );
    assert_near(state(&mut conn, "{lease}")[1], 39.0);
    // Its requests spent, the next grant takes a new lease; what was left of the old one (50
    // tokens) is given back in the background, in a round trip of its own.
    a.try_acquire([1, 5]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(a.stats().round_trips, 3);
    let s = state(&mut conn, "{lease}");
    assert_near(s[1], 28.0);
    assert_near(s[3], 840.0);
    assert_near(s[6], 160.0);
    // Another process sees every leased token charged.
    b.try_acquire([28, 0]).await.unwrap();
    assert!(matches!(
        b.try_acquire([1, 0]).await,
        Err(TryAcquireError::NotUntil(_))
    ));
    // A grant from the lease is settled in Redis.
    let permit = a.acquire([1, 5]).await.unwrap();
    assert_eq!(a.stats().round_trips, 3);
    permit.settle([1, 1]).await.unwrap();
    assert_eq!(a.stats().round_trips, 4);
    let s = state(&mut conn, "{lease}");
    assert_near(s[3], 844.0);
    assert_near(s[6], 156.0);
    // A lease takes, per dimension, the least room of its limits: 49 requests, and 595
    // tokens (the window's room, below the bucket's 995).
    let c = leased(&server.url(), "room", Some(([1_000, 1_000], minute)));
    c.try_acquire([1, 5]).await.unwrap();
    let s = state(&mut conn, "{room}");
    assert_near(s[1], 0.0);
    assert_near(s[3], 400.0);
    assert_near(s[6], 600.0);
    c.try_acquire([49, 595]).await.unwrap();
    assert!(c.try_acquire([1, 0]).await.is_err());
    assert_eq!(c.stats().round_trips, 2);
    // An expired lease grants nothing, and what it held is given back once it expires.
    let d = leased(
        &server.url(),
        "age",
        Some(([10, 10], Duration::from_millis(100))),
    );
    d.try_acquire([1, 1]).await.unwrap();
    d.try_acquire([1, 1]).await.unwrap();
    assert_eq!(d.stats().round_trips, 1);
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(d.stats().round_trips, 2, "the give-back's round trip");
    let s = state(&mut conn, "{age}");
    assert_near(s[1], 48.0);
    assert_near(s[3], 998.0);
    assert_near(s[6], 2.0);
    d.try_acquire([1, 1]).await.unwrap();
    assert_eq!(d.stats().round_trips, 3);
    // A lease of nothing is a configuration error.
    let zero = RedisRateLimiter::<[u64; 2]>::dimensions(&server.url(), "z", ["requests", "tokens"])
        .lease([0, 0], minute)
        .build();
    assert!(matches!(
        zero,
        Err(RedisLimiterError::Config(ConfigError::ZeroLease))
    ));
}

#[test]
fn the_configuration_is_checked() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let url = "redis://127.0.0.1:1/";
    let error = |built: Result<RedisRateLimiter<[u64; 2]>, RedisLimiterError>| match built {
        Err(RedisLimiterError::Config(e)) => e,
        other => panic!("{other:?}"),
    };
    let window = RedisRateLimiter::dimensions(url, "w", ["requests", "tokens"])
        .limit("requests", Limit::window(0, Duration::from_secs(60)))
        .build();
    assert_eq!(error(window), ConfigError::ZeroQuota);
    let unknown = RedisRateLimiter::dimensions(url, "u", ["requests", "tokens"])
        .limit("calls", Limit::bucket(Rate::per_second(1), 1))
        .build();
    assert_eq!(error(unknown), ConfigError::UnknownDimension);
    let twice = RedisRateLimiter::dimensions(url, "d", ["tokens", "tokens"]).build();
    assert_eq!(error(twice), ConfigError::DuplicateDimension);
    let empty = RedisRateLimiter::dimensions(url, "z", ["requests", "tokens"])
        .limit("tokens", Limit::bucket(Rate::per_second(1), 0))
        .build();
    assert_eq!(error(empty), ConfigError::ZeroBurst);
    let share = RedisRateLimiter::dimensions(url, "s", ["requests", "tokens"])
        .failure_policy(FailurePolicy::FailOpen { share: 0.0 })
        .build();
    assert_eq!(error(share), ConfigError::Share);
}

/// The fleet's buckets: requests 20/s burst 5, tokens 100/s burst 30.
const FLEET: [(f64, u64); 2] = [(20.0, 5), (100.0, 30)];

/// The fleet's fixed window: at most 12 requests in each 500 ms from the Unix epoch.
const WINDOW: (u64, Duration) = (12, Duration::from_millis(500));

fn fleet(url: &str, name: &str) -> RedisRateLimiter<[u64; 2]> {
    RedisRateLimiter::dimensions(url, name, ["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_second(20), FLEET[0].1))
        .limit("tokens", Limit::bucket(Rate::per_second(100), FLEET[1].1))
        .limit("requests", Limit::window(WINDOW.0, WINDOW.1))
        .build()
        .unwrap()
}

fn wall_ns() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// A worker process. `fleet <url> <name> <millis> <seed>`: acquires `[1, estimate]` (estimates
/// of 1 to 20 tokens) on [`fleet`] for `millis`, settles about one grant in four UP (1 to 10
/// tokens above its estimate: a cost already spent, paid back as debt) and the others to about
/// half their estimate, and prints on one line every charge and correction:
/// `granted_ns,1,estimate` for a grant (when its answer came), `settled_ns,0,actual - estimate,
/// sent_ns` for a correction (when its answer came, and when it was sent).
#[test]
#[ignore = "a worker process, which the tests of this file start with its arguments"]
fn worker_process() {
    let Ok(args) = std::env::var(WORKER) else {
        return;
    };
    let args: Vec<&str> = args.lines().collect();
    if let ["obey", url, name] = args[..] {
        return obey(url, name);
    }
    let ["fleet", url, name, millis, seed, lease] = args[..] else {
        panic!("unknown worker arguments: {args:?}");
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let grants = runtime.block_on(async {
        let leased = lease == "1";
        let llm = if leased {
            fleet_leased(url, name)
        } else {
            fleet(url, name)
        };
        let end = Instant::now() + Duration::from_millis(millis.parse().unwrap());
        let mut seed: u64 = seed.parse().unwrap();
        let mut grants = Vec::new();
        while Instant::now() < end {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let estimate = 1 + (seed >> 33) % 20;
            let permit = if leased {
                match llm.try_acquire([1, estimate]).await {
                    Ok(permit) => permit,
                    Err(TryAcquireError::NotUntil(_)) => {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        continue;
                    }
                    Err(e) => panic!("{e:?}"),
                }
            } else {
                llm.acquire([1, estimate]).await.unwrap()
            };
            grants.push(format!("{},1,{estimate}", wall_ns()));
            // With leases, only down (a debt replayed from grants would not be Redis's).
            let actual = if !leased && (seed >> 40) % 4 == 0 {
                estimate + 1 + (seed >> 45) % 10
            } else {
                estimate.div_ceil(2)
            };
            let sent = wall_ns();
            permit.settle([1, actual]).await.unwrap();
            let received = wall_ns();
            if actual != estimate {
                let delta = actual as i64 - estimate as i64;
                grants.push(format!("{received},0,{delta},{sent}"));
            }
        }
        let stats = llm.stats();
        // One round trip per grant and one per settle that changes anything: one per event.
        if !leased {
            assert_eq!(stats.round_trips, grants.len() as u64, "{stats:?}");
        }
        (grants, stats.from_lease)
    });
    println!("from leases: {}", grants.1);
    println!("worker: {}", grants.0.join(" "));
}

/// A charge or a correction of one worker, as it saw it: Redis made it between `sent` and
/// `at`, when its answer came (a grant's `sent` is `at`: an acquire's wait has no one send).
#[derive(Clone, Copy, Debug)]
struct Event {
    at: u128,
    /// Requests and tokens: a grant's estimate (requests 1), or a correction's difference
    /// (requests 0).
    cost: [i64; 2],
    sent: u128,
}

/// Every span of the merged timeline, from one charge's answer `t_i` to a later one's `t_j`,
/// holds at most `burst + (t_j - t_i + slack) * rate` of each bucket's charges (Redis made
/// charge i at most `slack`, a round trip and a late timer, before its answer), plus the upward
/// corrections within the span (a cost already spent at the provider, paid back by making later
/// grants wait), minus the downward corrections that Redis may have made within the span (sent
/// before `t_j`, answered after `t_i - slack`: a give-back that Redis made within it freed
/// tokens for it; one it did not make is counted all the same, which can only hide a breach,
/// never invent one). And every fixed window holds at most its quota of requests (counting the
/// charges seen from `slack` after its start to its end: an event is seen up to `slack` after
/// Redis made it). With leases of `leased` per process (`PROCESSES` of them), each bound plus
/// what the leases held: `PROCESSES * leased[d]`.
fn check_bounds(events: &[Event], slack: Duration, leased: [u64; 2]) -> Result<(), String> {
    let held = |d: usize| (PROCESSES as u64 * leased[d]) as i64;
    let slack_ns = slack.as_nanos();
    let (mut charges, mut give_backs): (Vec<Event>, Vec<Event>) =
        events.iter().partition(|e| e.cost.iter().all(|&c| c >= 0));
    charges.sort_by_key(|e| e.at);
    give_backs.sort_by_key(|e| e.sent);
    let len = WINDOW.1.as_nanos();
    let mut i = 0;
    while i < charges.len() {
        let k = charges[i].at / len;
        let (from, to) = (k * len + slack_ns, (k + 1) * len);
        let used: i64 = charges
            .iter()
            .filter(|e| e.at >= from && e.at < to)
            .map(|e| e.cost[0])
            .sum();
        if used > WINDOW.0 as i64 + held(0) {
            return Err(format!("{used} requests in the window from {k}"));
        }
        while i < charges.len() && charges[i].at / len == k {
            i += 1;
        }
    }
    for (dim, &(rate, burst)) in FLEET.iter().enumerate() {
        for i in 0..charges.len() {
            let (mut sum, mut ups) = (0, 0);
            let since = charges[i].at.saturating_sub(slack_ns);
            for j in i..charges.len() {
                sum += charges[j].cost[dim];
                // An upward correction in the span: a cost already spent at the provider.
                if charges[j].cost[0] == 0 {
                    ups += charges[j].cost[dim];
                }
                let freed: i64 = give_backs
                    .iter()
                    .take_while(|g| g.sent <= charges[j].at)
                    .filter(|g| g.at >= since)
                    .map(|g| g.cost[dim])
                    .sum();
                let span = (charges[j].at - charges[i].at) as f64 / 1e9;
                let allowed = burst as f64
                    + (span + slack.as_secs_f64()) * rate
                    + ups as f64
                    + held(dim) as f64;
                if (sum + freed) as f64 > allowed + 1e-9 {
                    return Err(format!(
                        "limit {dim}: {} within {span:.6} s (allowed {allowed:.2}, of which \
                         {ups} upward corrections; {freed} given back)",
                        sum + freed
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The check itself: a timeline over a bound fails it, a give-back Redis may have made within a
/// span counts, one it made after does not.
#[test]
fn the_fleet_check_finds_a_breach_and_counts_only_give_backs_that_may_be_within() {
    let ms = |n: u128| n * 1_000_000;
    let grant = |at: u128, tokens: i64| Event {
        at: ms(at),
        cost: [1, tokens],
        sent: ms(at),
    };
    let give_back = |sent: u128, at: u128, tokens: i64| Event {
        at: ms(at),
        cost: [0, -tokens],
        sent: ms(sent),
    };
    let slack = Duration::from_millis(1);
    let burst = FLEET[1].1 as i64;
    // The burst at once, then 10 tokens given back, then 10 more granted within 2 ms.
    let full = [grant(1_000, burst), grant(1_002, 10)];
    assert!(check_bounds(&full, slack, [0, 0]).is_err());
    // Answered before the first grant's window: Redis made it before the span. A breach.
    let earlier = [give_back(997, 998, 10), full[0], full[1]];
    assert!(check_bounds(&earlier, slack, [0, 0]).is_err());
    // The give-back answered at 1001 ms: it may have been made before the second grant.
    let before = [full[0], give_back(1_000, 1_001, 10), full[1]];
    assert_eq!(check_bounds(&before, slack, [0, 0]), Ok(()));
    // Answered before the second grant but sent after it: Redis made it after. A breach.
    let after = [full[0], give_back(1_003, 1_004, 10), full[1]];
    assert!(check_bounds(&after, slack, [0, 0]).is_err());
    // Sent before, answered after the second grant's answer: it may have been first.
    let straddles = [full[0], give_back(1_001, 1_003, 10), full[1]];
    assert_eq!(check_bounds(&straddles, slack, [0, 0]), Ok(()));
}

/// The fleet's processes.
const PROCESSES: usize = 4;

/// The lease of [`fleet_leased`]: 2 requests and 20 tokens, for 50 ms.
const LEASE: ([u64; 2], Duration) = ([2, 20], Duration::from_millis(50));

fn fleet_leased(url: &str, name: &str) -> RedisRateLimiter<[u64; 2]> {
    RedisRateLimiter::dimensions(url, name, ["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_second(20), FLEET[0].1))
        .limit("tokens", Limit::bucket(Rate::per_second(100), FLEET[1].1))
        .limit("requests", Limit::window(WINDOW.0, WINDOW.1))
        .lease(LEASE.0, LEASE.1)
        .build()
        .unwrap()
}

#[test]
fn four_processes_keep_every_limit() {
    run_fleet(false);
}

/// The same fleet granting with `try_acquire` from leases (settling down only): every bound
/// plus what the leases held.
#[test]
fn four_processes_with_leases_keep_every_limit_plus_the_leases() {
    run_fleet(true);
}

fn run_fleet(leased: bool) {
    let server = Server::start();
    let exe = std::env::current_exe().expect("test binary path");
    let lease = if leased { "1" } else { "0" };
    let workers: Vec<_> = (0..PROCESSES)
        .map(|seed| {
            let seed = seed.to_string();
            let args = ["fleet", &server.url(), "fleet", "2500", &seed, lease].join("\n");
            Command::new(&exe)
                .args(["worker_process", "--exact", "--ignored", "--nocapture"])
                .args(["--test-threads", "1"])
                .env(WORKER, args)
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a worker process")
        })
        .collect();
    let mut grants = Vec::new();
    let mut per_worker = Vec::new();
    let mut from_leases = 0;
    for worker in workers {
        let out = worker.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "worker failed: {out:?}");
        let line = stdout
            .lines()
            .find_map(|l| l.split_once("worker: ").map(|(_, a)| a.to_owned()))
            .unwrap_or_else(|| panic!("worker said nothing: {stdout}"));
        let mine: Vec<Event> = line
            .split_whitespace()
            .map(|g| {
                let v: Vec<&str> = g.split(',').collect();
                let at = v[0].parse().unwrap();
                Event {
                    at,
                    cost: [v[1].parse().unwrap(), v[2].parse().unwrap()],
                    sent: v.get(3).map_or(at, |sent| sent.parse().unwrap()),
                }
            })
            .collect();
        per_worker.push(mine.iter().filter(|e| e.cost[0] == 1).count());
        from_leases += stdout
            .lines()
            .find_map(|l| l.split_once("from leases: ").map(|(_, n)| n.to_owned()))
            .map_or(0, |n| n.parse::<u64>().unwrap());
        grants.extend(mine);
    }
    println!("grants per process: {per_worker:?}, {from_leases} from leases");
    assert_eq!(from_leases > 0, leased);
    // Every process was served, and the fleet used its quota: tokens bind (about 8 a grant with
    // the debts, 100/s for 2.5 s: some 30 grants), requests (20/s) do not.
    assert!(per_worker.iter().all(|&n| n > 0), "{per_worker:?}");
    let granted: usize = per_worker.iter().sum();
    assert!(granted >= 20, "{granted} grants");
    // Some grants settled up (without leases).
    assert_eq!(
        grants.iter().any(|e| e.cost[0] == 0 && e.cost[1] > 0),
        !leased
    );
    // Within one round trip and a late timer: 20 ms.
    let held = if leased { LEASE.0 } else { [0, 0] };
    check_bounds(&grants, Duration::from_millis(20), held).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_fail_closed_waits_and_fail_open_falls_back() {
    let mut server = Server::start();
    let closed: RedisRateLimiter<[u64; 2]> =
        RedisRateLimiter::dimensions(&server.url(), "kill", ["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_second(100), 10))
            .limit("tokens", Limit::bucket(Rate::per_second(1_000), 100))
            .failure_policy(FailurePolicy::FailClosed {
                max_backoff: Duration::from_millis(50),
                deadline: Duration::from_millis(300),
            })
            .response_timeout(Duration::from_millis(100))
            .build()
            .unwrap();
    let open: RedisRateLimiter<[u64; 2]> =
        RedisRateLimiter::dimensions(&server.url(), "kill", ["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_second(100), 10))
            .limit("tokens", Limit::bucket(Rate::per_second(1_000), 100))
            .failure_policy(FailurePolicy::FailOpen { share: 0.5 })
            .response_timeout(Duration::from_millis(100))
            .build()
            .unwrap();
    closed.acquire([1, 1]).await.unwrap();
    open.acquire([1, 1]).await.unwrap();
    server.kill();
    // Fail closed: gives up after its deadline, granting nothing.
    let start = Instant::now();
    match closed.acquire([1, 1]).await {
        Err(RedisLimiterError::Unavailable(_)) => {}
        other => panic!("{other:?}"),
    }
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert!(matches!(
        closed.try_acquire([1, 1]).await,
        Err(TryAcquireError::NotUntil(_))
    ));
    // Fail open: half of every limit, locally: 5 requests at once, then refusals.
    let mut granted = 0;
    for _ in 0..8 {
        if open.try_acquire([1, 1]).await.is_ok() {
            granted += 1;
        }
    }
    assert_eq!(granted, 5);
    let permit = open.acquire([0, 20]).await.unwrap();
    permit.settle([0, 10]).await.unwrap();
    let stats = open.stats();
    assert_eq!(stats.fallback, 6, "{stats:?}");
    // Back: Redis decides again.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if closed.try_acquire([1, 1]).await.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "Redis did not come back");
    }
    // The fallback's second over, the next grant comes from Redis (once it is reconnected).
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let before = open.stats();
        open.acquire([1, 1]).await.unwrap();
        let after = open.stats();
        if after.fallback == before.fallback {
            assert_eq!(after.round_trips, before.round_trips + 1);
            break;
        }
        assert!(Instant::now() < deadline, "still falling back: {after:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_limit_gives_back_the_builders_limits_keeping_levels() {
    let server = Server::start();
    let mut conn = admin(&server);
    let build = || {
        RedisRateLimiter::dimensions(&server.url(), "clear", ["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_minute(1), 5))
            .limit("tokens", Limit::bucket(Rate::per_minute(1), 100))
            .limit("tokens", Limit::window(200, Duration::from_secs(3_600)))
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    a.try_acquire([1, 90]).await.unwrap();
    // Raised far above the builder's, then full: 50 requests, 1,000 tokens, 150 of a window
    // of 1,000 left (90 used).
    a.set_limit(0, Limit::bucket(Rate::per_second(1_000), 50))
        .await
        .unwrap();
    a.set_limit(1, Limit::bucket(Rate::per_second(10_000), 1_000))
        .await
        .unwrap();
    a.set_limit(2, Limit::window(1_000, Duration::from_secs(3_600)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.try_acquire([10, 0]).await.unwrap();
    let pttl: i64 = redis::cmd("PTTL").arg("{clear}").query(&mut conn).unwrap();
    assert_eq!(pttl, -1);
    // Cleared by the other instance: every limit is the builder's again, each keeping its
    // level (a bucket at most the builder's burst; the window's 90 used of 200).
    b.clear_limit().await.unwrap();
    let raw: Vec<u8> = redis::cmd("GET").arg("{clear}").query(&mut conn).unwrap();
    assert_eq!(raw.len(), 9 + 16 * 3, "no limits kept in the state");
    let pttl: i64 = redis::cmd("PTTL").arg("{clear}").query(&mut conn).unwrap();
    assert!(pttl > 0, "a quota without limits set expires again: {pttl}");
    let s = state(&mut conn, "{clear}");
    assert_near(s[1], 5.0);
    assert_near(s[3], 100.0);
    assert_near(s[6], 90.0);
    // Obeyed by both instances: 5 requests, then none; 100 tokens, then none; the window's
    // 110 left are more than the bucket's 100.
    a.try_acquire([5, 100]).await.unwrap();
    assert!(b.try_acquire([1, 0]).await.is_err());
    assert!(a.try_acquire([0, 1]).await.is_err());
    // Clearing a quota with nothing set, or no state at all, changes nothing and succeeds.
    a.clear_limit().await.unwrap();
    slow(&server.url(), "none", 5, 100)
        .clear_limit()
        .await
        .unwrap();
    let exists: i64 = redis::cmd("EXISTS").arg("{none}").query(&mut conn).unwrap();
    assert_eq!(exists, 0);
    // Keyed: one key's limit cleared, back to the builder's 3.
    let keyed = RedisKeyedRateLimiter::<String, [u64; 1]>::dimensions(&server.url(), "kc", ["r"])
        .limit("r", Limit::bucket(Rate::per_minute(1), 3))
        .build()
        .unwrap();
    keyed
        .set_limit("one", 0, Limit::bucket(Rate::per_second(1_000), 50))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    keyed.clear_limit("one").await.unwrap();
    keyed.try_acquire("one", [3]).await.unwrap();
    assert!(keyed.try_acquire("one", [1]).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_obeys_a_limit_cleared_in_redis() {
    let server = Server::start();
    let llm = slow(&server.url(), "unobey", 5, 100);
    // 50 requests in the bucket after the raise; cleared: the builder's 5.
    llm.set_limit(0, Limit::bucket(Rate::per_second(1_000), 50))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    llm.clear_limit().await.unwrap();
    let exe = std::env::current_exe().expect("test binary path");
    let out = Command::new(&exe)
        .args(["worker_process", "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(WORKER, ["obey", &server.url(), "unobey"].join("\n"))
        .output()
        .expect("run a worker process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "worker failed: {out:?}");
    assert!(stdout.contains("obeyed: 5"), "{stdout}");
}

/// Requests (bucket of 10, 100/s) and tokens (bucket of 100, 1,000/s), failing open at half,
/// with a 100 ms response timeout.
fn failing_open(url: &str, name: &str) -> RedisRateLimiter<[u64; 2]> {
    RedisRateLimiter::dimensions(url, name, ["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_second(100), 10))
        .limit("tokens", Limit::bucket(Rate::per_second(1_000), 100))
        .failure_policy(FailurePolicy::FailOpen { share: 0.5 })
        .response_timeout(Duration::from_millis(100))
        .build()
        .unwrap()
}

/// How many `[1, 1]` the fail-open fallback grants at once (Redis down).
async fn fallback_grants(llm: &RedisRateLimiter<[u64; 2]>) -> u32 {
    let before = llm.stats().fallback;
    let mut granted = 0;
    for _ in 0..30 {
        if llm.try_acquire([1, 1]).await.is_ok() {
            granted += 1;
        }
    }
    assert_eq!(llm.stats().fallback - before, u64::from(granted));
    granted
}

/// Waits until `llm` is granted by Redis again, and its fallback's second is over.
async fn back_on_redis(llm: &RedisRateLimiter<[u64; 2]>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    loop {
        let before = llm.stats();
        let granted = llm.try_acquire([0, 1]).await.is_ok();
        let after = llm.stats();
        if granted && after.fallback == before.fallback {
            return;
        }
        assert!(Instant::now() < deadline, "still falling back: {after:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fail_open_fallback_follows_this_processs_set_and_clear_limit() {
    let mut server = Server::start();
    let llm = failing_open(&server.url(), "own");
    let other = failing_open(&server.url(), "own");
    llm.set_limit(0, Limit::bucket(Rate::per_second(100), 4))
        .await
        .unwrap();
    // The tokens' limit raised by the other instance (another process): in Redis only.
    other
        .set_limit(1, Limit::bucket(Rate::per_second(1_000), 1_000))
        .await
        .unwrap();
    server.kill();
    // Half of the requests' 4 it set (not of the builder's 10: that would be 5).
    assert_eq!(fallback_grants(&llm).await, 2);
    // The other instance knows only its own change: half of the builder's 10 requests.
    assert_eq!(fallback_grants(&other).await, 5);
    // Of the 1,000 tokens it set, half, less the 5 just granted.
    let tokens = other.try_acquire([0, 495]).await;
    assert!(
        tokens.is_ok(),
        "half of the 1,000 tokens it set: {tokens:?}"
    );
    assert!(
        llm.try_acquire([0, 60]).await.is_err(),
        "half of the builder's 100"
    );
    // While Redis is down, neither change is possible, and nothing changes here.
    assert!(matches!(
        llm.clear_limit().await,
        Err(RedisLimiterError::Unavailable(_))
    ));
    assert!(matches!(
        llm.set_limit(0, Limit::bucket(Rate::per_second(100), 8))
            .await,
        Err(RedisLimiterError::Unavailable(_))
    ));
    server.restart();
    back_on_redis(&llm).await;
    llm.clear_limit().await.unwrap();
    server.kill();
    // Cleared: half of the builder's 10 again.
    assert_eq!(fallback_grants(&llm).await, 5);
    // A window set by this process: half of its quota.
    server.restart();
    back_on_redis(&llm).await;
    let windowed = RedisRateLimiter::dimensions(&server.url(), "win", ["requests", "tokens"])
        .limit("requests", Limit::window(100, Duration::from_secs(3_600)))
        .failure_policy(FailurePolicy::FailOpen { share: 0.5 })
        .response_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    windowed
        .set_limit(0, Limit::window(6, Duration::from_secs(3_600)))
        .await
        .unwrap();
    server.kill();
    assert_eq!(fallback_grants(&windowed).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_given_back_never_above_a_burst() {
    let server = Server::start();
    let mut conn = admin(&server);
    // Requests refill fast (1,000/s, burst 50): full again before the lease expires, so its
    // give-back must leave the bucket at 50, not above. Tokens refill slowly: the bucket of
    // 1,000 and the hourly window of 600 get back what the lease did not grant.
    let llm = RedisRateLimiter::dimensions(&server.url(), "back", ["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_second(1_000), 50))
        .limit("tokens", Limit::bucket(Rate::per_minute(1), 1_000))
        .limit("tokens", Limit::window(600, Duration::from_secs(3_600)))
        .lease([10, 100], Duration::from_millis(200))
        .build()
        .unwrap();
    llm.try_acquire([1, 5]).await.unwrap();
    llm.try_acquire([1, 20]).await.unwrap();
    assert_eq!(llm.stats().from_lease, 1);
    let s = state(&mut conn, "{back}");
    assert_near(s[3], 895.0);
    assert_near(s[6], 105.0);
    tokio::time::sleep(Duration::from_millis(400)).await;
    // 80 tokens and 9 requests were left: given back, per dimension, to every limit.
    let s = state(&mut conn, "{back}");
    assert!(s[1] <= 50.0, "a bucket above its burst: {}", s[1]);
    assert_near(s[3], 975.0);
    assert_near(s[6], 25.0);
    assert_eq!(llm.stats().round_trips, 2);
    // What is given back is obeyed: 975 tokens in the bucket.
    llm.try_acquire([1, 575]).await.unwrap();
    // A lease that expires after its window is over gives nothing back to the new window
    // (nothing of it was charged there).
    let hourly = RedisRateLimiter::dimensions(&server.url(), "edge", ["requests"])
        .limit("requests", Limit::window(100, Duration::from_millis(300)))
        .lease([10], Duration::from_millis(400))
        .build()
        .unwrap();
    hourly.try_acquire([1]).await.unwrap();
    let used_in_first = state(&mut conn, "{edge}")[2];
    assert_near(used_in_first, 11.0);
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Given back (a round trip), but too late for the window the lease was charged in.
    assert_eq!(hourly.stats().round_trips, 2);
    hourly.try_acquire([100]).await.unwrap();
}

async fn a_lease_never_passes_an_earlier_waiter_of_this_process() {
    let server = Server::start();
    // Requests: 5/s (one every 200 ms), burst 3; tokens plenty.
    let llm = RedisRateLimiter::dimensions(&server.url(), "fifo", ["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_second(5), 3))
        .limit("tokens", Limit::bucket(Rate::per_minute(1), 10_000))
        .lease([2, 100], Duration::from_secs(60))
        .build()
        .unwrap();
    // A grant and a lease of [2, 100]: the requests' bucket is empty.
    llm.try_acquire([1, 1]).await.unwrap();
    assert_eq!(llm.stats().round_trips, 1);
    // A waiter whose tokens the lease cannot give reserves in Redis, for its cost and a whole
    // lease (every limit is a bucket): queued there, about 600 ms.
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let waiter = {
        let (llm, order) = (llm.clone(), order.clone());
        tokio::spawn(async move {
            llm.acquire([1, 500]).await.unwrap();
            order.lock().unwrap().push("waiter");
        })
    };
    // Queued: Redis holds the reservation (its state's instant is in the future).
    let mut conn = admin(&server);
    loop {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut conn).unwrap();
        if state(&mut conn, "{fifo}")[0] > (secs * 1_000_000 + micros) as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The lease holds [2, 99], enough for [1, 1], but a waiter of this process is queued:
    // try_acquire goes to Redis, which refuses (the waiter's reservation is ahead)...
    let before = llm.stats();
    assert_eq!(before.round_trips, 2);
    let tried = llm.try_acquire([1, 1]).await;
    assert!(
        matches!(tried, Err(TryAcquireError::NotUntil(_))),
        "{tried:?} {before:?}"
    );
    assert_eq!(llm.stats().from_lease, before.from_lease);
    // ...and acquire queues behind the waiter, then takes from the lease the waiter brought
    // back: no round trip of its own.
    let later = {
        let (llm, order) = (llm.clone(), order.clone());
        tokio::spawn(async move {
            llm.acquire([1, 1]).await.unwrap();
            order.lock().unwrap().push("later");
        })
    };
    waiter.await.unwrap();
    later.await.unwrap();
    assert_eq!(*order.lock().unwrap(), ["waiter", "later"]);
    let after = llm.stats();
    assert_eq!(after.from_lease, before.from_lease + 1);
    // The refused try, and the old lease given back in the background.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(llm.stats().round_trips, before.round_trips + 2);
    // Nobody queued: the lease grants again, without a round trip.
    let trips = llm.stats().round_trips;
    llm.acquire([1, 1]).await.unwrap();
    assert_eq!(llm.stats().round_trips, trips);
    assert_eq!(llm.stats().from_lease, before.from_lease + 2);
}

/// A reservation waits for a whole lease over buckets only: with a fixed window among the
/// limits it takes what room its instant has (a whole lease could take until the next window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_waits_for_a_whole_lease_only_over_buckets() {
    let server = Server::start();
    let hour = Duration::from_secs(3_600);
    for (name, window) in [("buckets", false), ("window", true)] {
        // Requests: 10/s, burst 5; tokens: a bucket, or a window of 1,000 an hour.
        let tokens = if window {
            Limit::window(1_000, hour)
        } else {
            Limit::bucket(Rate::per_second(1_000), 1_000)
        };
        let quota: RedisRateLimiter<[u64; 2]> =
            RedisRateLimiter::dimensions(&server.url(), name, ["requests", "tokens"])
                .limit("requests", Limit::bucket(Rate::per_second(10), 5))
                .limit("tokens", tokens)
                .lease([3, 10], Duration::from_secs(60))
                .build()
                .unwrap();
        // The requests' bucket emptied: no room for a lease of requests.
        quota.try_acquire([5, 1]).await.unwrap();
        let started = Instant::now();
        quota.acquire([1, 1]).await.unwrap();
        let waited = started.elapsed();
        if window {
            // Its cost alone: one request, 100 ms.
            assert!(waited < Duration::from_millis(300), "{name}: {waited:?}");
        } else {
            // Its cost and a lease of 3 requests: 400 ms; then the lease grants.
            assert!(waited >= Duration::from_millis(350), "{name}: {waited:?}");
            let trips = quota.stats().round_trips;
            quota.acquire([1, 1]).await.unwrap();
            assert_eq!(quota.stats().round_trips, trips, "{name}");
        }
    }
}

/// What a lease holds when the last handle goes is given back then, in the background, as with
/// one limit, not only once the lease expires: for a limiter of one quota, and for every key
/// of a keyed one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_handle_gives_the_lease_back() {
    let server = Server::start();
    let mut conn = admin(&server);
    let minute = Duration::from_secs(60);
    let one = leased(&server.url(), "last", Some(([10, 100], minute)));
    one.acquire([1, 5]).await.unwrap();
    let copy = one.clone();
    drop(one);
    tokio::time::sleep(Duration::from_millis(150)).await;
    // A handle is left: the lease is still held.
    assert_near(state(&mut conn, "{last}")[1], 39.0);
    drop(copy);
    tokio::time::sleep(Duration::from_millis(150)).await;
    // Back to every limit: requests 49, tokens 995, the hour's window 5.
    let s = state(&mut conn, "{last}");
    assert_near(s[1], 49.0);
    assert_near(s[3], 995.0);
    assert_near(s[6], 5.0);
    // A keyed limiter: each key's lease, once the limiter goes.
    let keyed: RedisKeyedRateLimiter<String, [u64; 2]> =
        RedisKeyedRateLimiter::dimensions(&server.url(), "last-keyed", ["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_minute(1), 50))
            .limit("tokens", Limit::bucket(Rate::per_minute(1), 1_000))
            .lease([10, 100], minute)
            .build()
            .unwrap();
    for key in ["a", "b"] {
        // The first grant takes its cost; the key in use, the second a lease.
        keyed.acquire(key, [1, 5]).await.unwrap();
        keyed.acquire(key, [1, 5]).await.unwrap();
        assert_near(levels(&mut conn, &format!("{{last-keyed:{key}}}"))[0], 38.0);
    }
    drop(keyed);
    tokio::time::sleep(Duration::from_millis(150)).await;
    for key in ["a", "b"] {
        let l = levels(&mut conn, &format!("{{last-keyed:{key}}}"));
        assert_near(l[0], 48.0);
        assert_near(l[1], 990.0);
    }
}

/// `return_lease` gives the lease back now, in one round trip, to every limit (a fixed window
/// within the window it was charged in), as the one-limit `return_lease` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn return_lease_gives_the_lease_back_now() {
    let server = Server::start();
    let mut conn = admin(&server);
    let a = leased(
        &server.url(),
        "back",
        Some(([10, 100], Duration::from_secs(60))),
    );
    // Nothing held: no round trip, and no state here.
    a.return_lease().await;
    assert_eq!((a.stats().round_trips, a.stats().keys), (0, 0));
    a.acquire([1, 5]).await.unwrap();
    a.acquire([1, 5]).await.unwrap();
    assert_eq!(a.stats().keys, 1);
    let s = state(&mut conn, "{back}");
    assert_near(s[1], 39.0);
    assert_near(s[3], 895.0);
    assert_near(s[6], 105.0);
    // The lease holds [9, 95]: back to every limit of each dimension.
    a.return_lease().await;
    assert_eq!(a.stats().round_trips, 2);
    let s = state(&mut conn, "{back}");
    assert_near(s[1], 48.0);
    assert_near(s[3], 990.0);
    assert_near(s[6], 10.0);
    // No lease left: the next grant goes to Redis.
    let from_lease = a.stats().from_lease;
    a.acquire([1, 5]).await.unwrap();
    assert_eq!(
        (a.stats().round_trips, a.stats().from_lease),
        (3, from_lease)
    );
}

/// An expired lease goes back once no round trip of the quota is on its way: a waiter that
/// sleeps out a long wait does not hold it back (with a fixed window, tokens held back past the
/// window would never come back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_waiter_does_not_hold_back_an_expired_lease() {
    let server = Server::start();
    let quota: RedisRateLimiter<[u64; 1]> =
        RedisRateLimiter::dimensions(&server.url(), "sleeper", ["requests"])
            .limit("requests", Limit::bucket(Rate::per_second(1), 10))
            .lease([3], Duration::from_millis(300))
            .build()
            .unwrap();
    // A try takes its cost and a lease of 3.
    quota.try_acquire([1]).await.unwrap();
    // A waiter the lease cannot serve: granted by Redis seconds ahead, it sleeps.
    let waiter = {
        let quota = quota.clone();
        tokio::spawn(async move { quota.acquire([9]).await.map(|_| ()) })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!waiter.is_finished());
    // The try, the waiter's reservation, and the lease given back once it expired.
    assert_eq!(quota.stats().round_trips, 3, "{:?}", quota.stats());
    waiter.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_takes_a_lease_too_when_every_dimension_has_room() {
    let server = Server::start();
    let mut conn = admin(&server);
    let minute = Duration::from_secs(60);
    // Requests: 50 at once, one a minute; tokens: 1,000 at once and 600 an hour.
    let a = leased(&server.url(), "acq", Some(([10, 100], minute)));
    // A reservation granted at once takes its cost and a lease of [10, 100], charged at once.
    a.acquire([1, 5]).await.unwrap();
    let s = state(&mut conn, "{acq}");
    assert_near(s[1], 39.0);
    assert_near(s[3], 895.0);
    assert_near(s[6], 105.0);
    // Later acquisitions are granted from it, without a round trip.
    for _ in 0..10 {
        a.acquire([1, 5]).await.unwrap();
    }
    assert_eq!((a.stats().round_trips, a.stats().from_lease), (1, 10));
    // A bucket of one request holds no room beyond a cost of one: a reservation takes no
    // lease at all, and charges only its cost (the tokens' room is not held back).
    let b = RedisRateLimiter::dimensions(&server.url(), "wait", ["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_second(10), 1))
        .limit("tokens", Limit::bucket(Rate::per_minute(1), 1_000))
        .lease([5, 100], minute)
        .build()
        .unwrap();
    b.try_acquire([1, 1]).await.unwrap();
    // The try found no room for requests beyond its cost: it leased no request.
    b.acquire([1, 1]).await.unwrap();
    let s = state(&mut conn, "{wait}");
    assert_eq!(b.stats().round_trips, 2);
    // Tokens: the two costs and the try's lease of 100 (its requests' lease was 0), not a
    // second lease.
    assert_near(s[3], 898.0);
    // What is left of the try's lease (100 tokens, no request) covers no [1, x] cost: the
    // next acquisition goes to Redis.
    tokio::time::sleep(Duration::from_millis(100)).await;
    b.acquire([1, 1]).await.unwrap();
    assert_eq!(b.stats().round_trips, 3);
}

/// A tower layer over several limits in Redis (a client of an LLM API across a fleet) charges
/// each request's estimate, then settles it in Redis from the answer, in the background.
#[cfg(feature = "tower")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tower_layer_settles_in_redis_from_the_answer() {
    use paced::tower::RateLimitLayer;
    use tower::{ServiceBuilder, ServiceExt};

    let server = Server::start();
    let mut conn = admin(&server);
    let llm = slow(&server.url(), "tower", 10, 1_000);
    let complete = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(&llm)
                .cost(|_: &&str| [1, 500]) // the estimate
                .settle(|used: &u64| [1, *used]),
        )
        .service_fn(|_: &str| async { Ok::<u64, std::convert::Infallible>(200) });
    assert_eq!(complete.clone().oneshot("hello").await.unwrap(), 200);
    // Charged the estimate; the answer's 200 tokens are settled in a round trip of its own.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let state = levels(&mut conn, "{tower}");
        assert_near(state[0], 9.0);
        if (state[1] - 800.0).abs() < 0.05 {
            break;
        }
        assert_near(state[1], 500.0);
        assert!(Instant::now() < deadline, "not settled: {state:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(llm.stats().granted, 1);

    // Keyed: the settle corrects the request's key only.
    let tenants: RedisKeyedRateLimiter<String, [u64; 2]> =
        RedisKeyedRateLimiter::dimensions(&server.url(), "tenants-tower", ["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_minute(1), 10))
            .limit("tokens", Limit::bucket(Rate::per_minute(1), 1_000))
            .build()
            .unwrap();
    let complete = ServiceBuilder::new()
        .layer(
            RateLimitLayer::keyed(&tenants, |tenant: &&str| tenant.to_string())
                .cost(|_: &&str| [1, 500])
                .settle(|used: &u64| [1, *used]),
        )
        .service_fn(|_: &str| async { Ok::<u64, std::convert::Infallible>(300) });
    complete.clone().oneshot("a").await.unwrap();
    complete.oneshot("b").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    for key in ["{tenants-tower:a}", "{tenants-tower:b}"] {
        loop {
            let state = levels(&mut conn, key);
            assert_near(state[0], 9.0);
            if (state[1] - 700.0).abs() < 0.05 {
                break;
            }
            assert_near(state[1], 500.0);
            assert!(Instant::now() < deadline, "{key} not settled: {state:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A stream that waits out an outage on a fail-closed limiter whose deadline is zero (each
/// `acquire` gives up at its first failed round trip) asks again at a backoff, not in a busy
/// loop, and its item goes once Redis is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_waits_out_an_outage_at_a_backoff() {
    use futures_util::StreamExt;
    use paced::{PaceExt, Shaping};

    let mut server = Server::start();
    let llm = RedisRateLimiter::dimensions(&server.url(), "backoff", ["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_second(1_000), 100))
        .limit("tokens", Limit::bucket(Rate::per_second(1_000), 100))
        .failure_policy(FailurePolicy::FailClosed {
            max_backoff: Duration::from_millis(100),
            deadline: Duration::ZERO,
        })
        .build()
        .unwrap();
    llm.acquire([1, 1]).await.unwrap();
    server.kill();
    let waiting = tokio::spawn({
        let llm = llm.clone();
        async move {
            futures_util::stream::iter([7u32])
                .throttle_with(&llm, |_| [1, 1], Shaping)
                .collect::<Vec<_>>()
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    // 700 ms at a backoff from 100 ms: a handful of round trips, not thousands.
    let errors = llm.stats().errors;
    assert!((1..=10).contains(&errors), "{errors} failed round trips");
    // Kept until the end: a server dropped is stopped.
    let _server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the item goes once Redis is back")
        .unwrap();
    assert_eq!(out, [7]);
}

/// Tokens 1,000/s with a bucket of 100, requests that never bind: at 50 tokens an item, two
/// items at once, then one every 50 ms.
fn fifty_ms_apart(url: &str, name: &str) -> RedisRateLimiter<[u64; 2]> {
    RedisRateLimiter::dimensions(url, name, ["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_second(1_000), 100))
        .limit("tokens", Limit::bucket(Rate::per_second(1_000), 100))
        .build()
        .unwrap()
}

/// Every item once and in order, item `i` (from the third on) no earlier than `i - 1` times
/// 50 ms after `start` (Redis's clock, on this machine: within a millisecond of ours).
fn assert_fifty_ms_apart(out: &[(u32, Duration)], n: u32) {
    let items: Vec<u32> = out.iter().map(|&(i, _)| i).collect();
    assert_eq!(items, (0..n).collect::<Vec<_>>(), "lost or reordered");
    for &(i, at) in out {
        let earliest = Duration::from_millis(50 * u64::from(i.saturating_sub(1)));
        assert!(
            at + Duration::from_millis(1) >= earliest,
            "item {i} at {at:?}, before {earliest:?}"
        );
    }
}

/// The several-limit limiters are `Limiter`s and `KeyedLimiter`s as the one-limit ones are: a
/// shaping stream, an enforcing stream, a keyed stream and a sink draw on every limit in Redis.
async fn streams_draw_on_every_limit() {
    use futures_util::StreamExt;
    use paced::{Enforcing, PaceExt, Shaping};

    let server = Server::start();
    let llm = fifty_ms_apart(&server.url(), "stream");
    let start = Instant::now();
    let out: Vec<(u32, Duration)> = futures_util::stream::iter(0..6u32)
        .throttle_with(&llm, |_| [1, 50], Shaping)
        .map(|i| (i, start.elapsed()))
        .collect()
        .await;
    assert_fifty_ms_apart(&out, 6);
    assert_eq!(llm.stats().granted, 6);

    // Enforcing: what does not conform now comes back, charging nothing.
    let strict = fifty_ms_apart(&server.url(), "enforcing");
    let out: Vec<_> = futures_util::stream::iter(0..3u32)
        .throttle_with(&strict, |_| [1, 50], Enforcing)
        .collect()
        .await;
    assert!(out[0].is_ok() && out[1].is_ok(), "{out:?}");
    let Err(refused) = &out[2] else {
        panic!("the third conformed: {out:?}");
    };
    assert!(
        refused.retry_after() > Duration::from_millis(30),
        "{refused:?}"
    );
    assert!(
        refused.retry_after() <= Duration::from_millis(50),
        "{refused:?}"
    );
    assert_eq!(strict.stats().granted, 2);

    // Keyed: each key its own limits, the keys side by side.
    let per_tenant: RedisKeyedRateLimiter<String, [u64; 2]> =
        RedisKeyedRateLimiter::dimensions(&server.url(), "keyed-stream", ["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_second(1_000), 100))
            .limit("tokens", Limit::bucket(Rate::per_second(1_000), 100))
            .build()
            .unwrap();
    let start = Instant::now();
    let out: Vec<(String, u32, Duration)> = futures_util::stream::iter(0..10u32)
        .map(|i| (if i % 2 == 0 { "a" } else { "b" }, i / 2))
        .throttle_by_key(&per_tenant, |&(key, _)| key.to_string(), |_| [1, 50], 16)
        .map(|(key, i)| (key.to_string(), i, start.elapsed()))
        .collect()
        .await;
    for key in ["a", "b"] {
        let of_key: Vec<(u32, Duration)> = out
            .iter()
            .filter(|(k, _, _)| k == key)
            .map(|&(_, i, at)| (i, at))
            .collect();
        assert_fifty_ms_apart(&of_key, 5);
    }
    // The keys do not wait for each other: both are done about when one alone would be (their
    // last items at 150 ms).
    let last = out.iter().map(|&(_, _, at)| at).max().unwrap();
    assert!(last < Duration::from_millis(290), "{last:?}");

    // A sink: each item is handed on once every limit has room.
    use futures_util::SinkExt;
    use paced::PaceSinkExt;
    let into = fifty_ms_apart(&server.url(), "sink");
    let (tx, rx) = futures_channel::mpsc::unbounded::<u32>();
    let mut sink = Box::pin(tx.throttle_with(&into, |_| [1, 50]));
    let start = Instant::now();
    let received = tokio::spawn(rx.map(move |i| (i, start.elapsed())).collect::<Vec<_>>());
    for i in 0..5u32 {
        sink.send(i).await.unwrap();
    }
    sink.close().await.unwrap();
    drop(sink);
    assert_fifty_ms_apart(&received.await.unwrap(), 5);
    assert_eq!(into.stats().granted, 5);
}

/// Over buckets only, a reservation of a saturated quota waits for its cost and a whole lease,
/// and one task at a time refills it: the others take from the lease it brings back. So a
/// process's round trips are about one per lease, not one per grant, and every bound holds with
/// at most one lease on top.
async fn a_saturated_quota_of_buckets_brings_back_a_whole_lease_per_round_trip() {
    let server = Server::start();
    // Requests: 100/s, burst 10; tokens: 2,000/s, burst 100. Leases of [5, 40].
    let llm = RedisRateLimiter::dimensions(&server.url(), "whole", ["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_second(100), 10))
        .limit("tokens", Limit::bucket(Rate::per_second(2_000), 100))
        .lease([5, 40], Duration::from_secs(60))
        .build()
        .unwrap();
    let start = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let llm = llm.clone();
            tokio::spawn(async move {
                let mut at = Vec::new();
                for _ in 0..20 {
                    llm.acquire([1, 8]).await.unwrap();
                    at.push(start.elapsed());
                }
                at
            })
        })
        .collect();
    let mut granted = Vec::new();
    for task in tasks {
        granted.extend(task.await.unwrap());
    }
    granted.sort();
    let stats = llm.stats();
    assert_eq!(stats.granted, 160);
    // 160 grants at [1, 8]: the tokens' lease of 40 holds five costs, the requests' of 5 as
    // many. So about one round trip in six grants, where a reservation that took only its
    // cost would make one per grant past the burst.
    println!("{stats:?}");
    assert!(stats.from_lease >= 100, "{stats:?}");
    assert!(stats.round_trips <= 160 / 3, "{stats:?}");
    // Every bound, plus one lease: in any span of d from the start, at most 10 + 5 + 100 d
    // requests, and 100 + 40 + 2,000 d tokens (8 a request), one millisecond of slack for the
    // clocks.
    for (n, at) in granted.iter().enumerate() {
        let d = at.as_secs_f64() + 0.001;
        let requests = (n + 1) as f64;
        assert!(requests <= 15.0 + 100.0 * d, "{n} by {at:?}");
        assert!(8.0 * requests <= 140.0 + 2_000.0 * d, "{n} by {at:?}");
    }
    // And it was saturated: 160 requests at 100/s after a burst of 10 take 1.5 s.
    assert!(
        granted[159] >= Duration::from_millis(1_400),
        "{:?}",
        granted[159]
    );
}

/// A lease is Redis's grant already: while an outage puts the fail-open fallback in charge, a
/// request that the lease holds is granted from it, not by the fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_spent_before_the_fallback() {
    let mut server = Server::start();
    let llm = RedisRateLimiter::dimensions(&server.url(), "first", ["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_minute(1), 50))
        .limit("tokens", Limit::bucket(Rate::per_minute(1), 1_000))
        .lease([10, 100], Duration::from_secs(60))
        .failure_policy(FailurePolicy::FailOpen { share: 0.5 })
        .response_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    // The first grant brings back a lease of [10, 100].
    llm.try_acquire([1, 5]).await.unwrap();
    server.kill();
    // More than the lease holds: a round trip, which fails, and the fallback grants.
    llm.try_acquire([1, 500]).await.unwrap();
    let before = llm.stats();
    assert_eq!(before.fallback, 1, "{before:?}");
    // What the lease holds comes from the lease, the fallback in charge or not.
    llm.try_acquire([1, 5]).await.unwrap();
    llm.acquire([1, 5]).await.unwrap();
    let after = llm.stats();
    assert_eq!(
        (after.fallback, after.from_lease, after.round_trips),
        (before.fallback, before.from_lease + 2, before.round_trips),
        "{after:?}"
    );
}

on_every_flavor!(
    the_request_after_a_waiter_that_went_away_does_not_wait_for_it,
    a_saturated_quota_of_buckets_brings_back_a_whole_lease_per_round_trip,
    streams_draw_on_every_limit,
    the_wait_is_the_latest_of_the_limits,
    a_lease_never_passes_an_earlier_waiter_of_this_process,
);

/// Several limits take a debt of centuries as one limit does: a reservation whose instant is
/// beyond 2^53 µs (about 285 years after 1970) is charged and waited for, not refused as never;
/// dropped, it is given back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debt_of_centuries_is_charged_and_given_back() {
    let server = Server::start();
    let mut conn = admin(&server);
    let per_day = Rate::new(1, Duration::from_secs(86_400));
    let quota: RedisRateLimiter<[u64; 2]> =
        RedisRateLimiter::dimensions(&server.url(), "centuries", ["requests", "tokens"])
            .limit("requests", Limit::bucket(per_day, 1))
            .limit("tokens", Limit::bucket(Rate::per_second(1_000), 1_000))
            .build()
            .unwrap();
    // 100,000 requests at one a day: 274 years of debt, inside the 584 of "never".
    let waiting = {
        let quota = quota.clone();
        tokio::spawn(async move { quota.acquire([100_000, 1]).await.map(|_| ()) })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished());
    // Charged: the key lives as long as the debt (100,000 days), and a request waits behind it.
    let ttl: i64 = redis::cmd("PTTL")
        .arg("{centuries}")
        .query(&mut conn)
        .unwrap();
    assert!(
        (8_639_000_000_000..=8_640_001_000_000).contains(&ttl),
        "PTTL {ttl}"
    );
    let refused = quota.try_acquire([1, 0]).await.unwrap_err();
    let after = refused.not_until().expect("a refusal").retry_after();
    assert!(
        after > Duration::from_secs(86_400 * 365 * 270),
        "behind the debt: {after:?}"
    );
    // Dropped, its requests are given back whole (it was the latest grant): the requests'
    // bucket holds its one token again. (The quota moves back in time only as far as every
    // bucket's level allows: the tokens' bucket, full a second of refill before that
    // instant, keeps it there.)
    assert_near(levels(&mut conn, "{centuries}")[0], 0.0);
    waiting.abort();
    let _ = waiting.await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_near(levels(&mut conn, "{centuries}")[0], 1.0);
}
