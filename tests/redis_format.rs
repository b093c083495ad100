//! The format version of a quota's state in Redis, across processes, against a real, private
//! `redis-server`: the version byte leads every state written; a state written by one process
//! is read by another; a state of a version this paced does not read, written by another
//! process (`redis-cli`, as a later paced or a stranger would), is a reply error for every
//! process and is left as it is. The worker processes are this test binary started again
//! (`worker_process`). Real time: Redis does not run on tokio's paused clock.
#![cfg(feature = "redis")]

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use paced::redis::{FailurePolicy, RedisLimiterError, TryAcquireError};
use paced::{Rate, RedisKeyedRateLimiter, RedisRateLimiter};

// Its bound checker is for the multi-process tests of the bound.
#[allow(dead_code)]
#[path = "common/redis_server.rs"]
mod redis_server;
use redis_server::Server;

/// Set in a worker process's environment: what it is to do, as its arguments, one a line.
const WORKER: &str = "PACED_FORMAT_WORKER";

/// What every process of these tests holds, unless it says otherwise: one token a minute,
/// burst 10, so that no run refills more than a small fraction of a token.
const SLOW: (Rate, u64) = (Rate::per_minute(1), 10);

/// One token a minute, in microseconds per token, as the state stores it.
const MINUTE_US: f64 = 60e6;

/// A worker process: does one thing on a private Redis and prints what came of it on a line
/// `worker: ...`, for [`worker`] to read. Without [`WORKER`] set (a plain `cargo test --
/// --ignored`), nothing.
///
/// `take <url> <key> <cost>`: `try_acquire(cost)` on a `RedisRateLimiter` under [`SLOW`].
/// `own-limit <url> <prefix> <key>`: on a `RedisKeyedRateLimiter` under 100/s, burst 50,
/// gives `key` a limit of one a minute, burst 4, then `try_acquire(key, 1)`.
#[test]
#[ignore = "a worker process, which the tests of this file start with its arguments"]
fn worker_process() {
    let Ok(args) = std::env::var(WORKER) else {
        return;
    };
    let args: Vec<&str> = args.lines().collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let answer = runtime.block_on(async {
        match args[..] {
            ["take", url, key, cost] => {
                let quota = RedisRateLimiter::builder(url, key, SLOW.0, SLOW.1)
                    .build()
                    .unwrap();
                quota.try_acquire(cost.parse().unwrap()).await
            }
            ["own-limit", url, prefix, key] => {
                let quota: RedisKeyedRateLimiter<String> =
                    RedisKeyedRateLimiter::builder(url, prefix, Rate::per_second(100), 50)
                        .build()
                        .unwrap();
                match quota.set_limit(key, Rate::per_minute(1), 4).await {
                    Ok(()) => quota.try_acquire(key, 1).await,
                    Err(RedisLimiterError::Reply(e)) => Err(TryAcquireError::Reply(e)),
                    Err(e) => panic!("set_limit: {e}"),
                }
            }
            _ => panic!("unknown worker arguments: {args:?}"),
        }
    });
    match answer {
        Ok(()) => println!("worker: granted"),
        Err(TryAcquireError::NotUntil(refused)) => {
            println!("worker: refused {}", refused.retry_after().as_millis());
        }
        Err(e) => println!("worker: reply {e}"),
    }
}

/// Runs a worker process with `args` and returns what it printed after `worker: `.
fn worker(args: &[&str]) -> String {
    let exe = std::env::current_exe().expect("test binary path");
    let out = Command::new(exe)
        .args(["worker_process", "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(WORKER, args.join("\n"))
        .output()
        .expect("start a worker process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "worker {args:?} failed: {out:?}");
    // (After libtest's "test worker_process ... ", on the same line.)
    let answer = stdout
        .lines()
        .find_map(|l| l.split_once("worker: ").map(|(_, a)| a));
    answer
        .unwrap_or_else(|| panic!("worker {args:?} said nothing: {stdout}"))
        .to_string()
}

/// Stores `value` under `key` from another process, `redis-cli`, as another writer would.
fn redis_cli_set(server: &Server, key: &str, value: &[u8]) {
    let mut cli = Command::new("redis-cli")
        .args(["-u", &server.url(), "-x", "SET", key])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli must be installed for `cargo test --features redis`");
    cli.stdin.take().unwrap().write_all(value).unwrap();
    let out = cli.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK", "{out:?}");
}

/// A plain connection to `server`, to look at keys behind the limiters' backs.
fn admin(server: &Server) -> redis::Connection {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

fn get(conn: &mut redis::Connection, key: &str) -> Option<Vec<u8>> {
    redis::cmd("GET").arg(key).query(conn).unwrap()
}

fn pttl(conn: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(conn).unwrap()
}

/// Redis's clock in whole microseconds, as the script reads it.
fn redis_now_us(conn: &mut redis::Connection) -> f64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(conn).unwrap();
    (secs * 1_000_000 + micros) as f64
}

/// A state of version 1 as the script writes it: the version byte, then little-endian doubles.
fn version_1(doubles: &[f64]) -> Vec<u8> {
    let bytes = doubles.iter().flat_map(|d| d.to_le_bytes());
    std::iter::once(1).chain(bytes).collect()
}

/// A stored state of version 1, read: its doubles (level, at, and the key's own interval and
/// burst if it has a limit of its own).
fn decode(state: &[u8]) -> Vec<f64> {
    assert_eq!(state.first(), Some(&1), "the format version: {state:?}");
    assert!(
        state.len() == 17 || state.len() == 33,
        "a state of {} bytes",
        state.len()
    );
    state[1..]
        .chunks(8)
        .map(|d| f64::from_le_bytes(d.try_into().unwrap()))
        .collect()
}

/// How long ago, in Redis's time, a state was written: its `at` against `TIME`.
fn age_us(conn: &mut redis::Connection, at: f64) -> f64 {
    redis_now_us(conn) - at
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_state_written_leads_with_version_1() {
    let server = Server::start();
    let mut conn = admin(&server);

    // A quota under the default limit: <1, level, at>, 17 bytes, expiring when full again.
    let quota = RedisRateLimiter::builder(server.url(), "single", Rate::per_second(10), 5)
        .build()
        .unwrap();
    quota.acquire(2).await.unwrap();
    let state = get(&mut conn, "single").expect("a state");
    assert_eq!(state.len(), 17, "{state:?}");
    let [level, at] = decode(&state)[..] else {
        unreachable!()
    };
    assert!((3.0..3.1).contains(&level), "{level}");
    assert!((0.0..1e6).contains(&age_us(&mut conn, at)), "{at}");
    assert!(pttl(&mut conn, "single") > 0);
    // A reservation in debt is stored the same way, its level negative.
    quota.try_acquire(3).await.unwrap();
    let waiting = tokio::spawn({
        let quota = quota.clone();
        async move { quota.acquire(2).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let state = get(&mut conn, "single").expect("a state");
    assert_eq!(state.len(), 17, "{state:?}");
    assert!(decode(&state)[0] < -1.0, "{state:?}");
    waiting.await.unwrap().unwrap();

    // A key with its own limit: <1, level, at, interval, burst>, 33 bytes, no expiry; back to
    // the default limit, 17 bytes again.
    let keyed: RedisKeyedRateLimiter<String> =
        RedisKeyedRateLimiter::builder(server.url(), "keyed", Rate::per_second(10), 5)
            .build()
            .unwrap();
    keyed.set_limit("k", Rate::per_minute(1), 4).await.unwrap();
    keyed.try_acquire("k", 1).await.unwrap();
    let state = get(&mut conn, "{keyed:k}").expect("a state");
    assert_eq!(state.len(), 33, "{state:?}");
    let [level, at, interval, burst] = decode(&state)[..] else {
        unreachable!()
    };
    assert!((3.0..3.001).contains(&level), "{level}");
    assert!((0.0..1e6).contains(&age_us(&mut conn, at)), "{at}");
    assert_eq!((interval, burst), (MINUTE_US, 4.0));
    assert_eq!(pttl(&mut conn, "{keyed:k}"), -1);
    keyed.clear_limit("k").await.unwrap();
    let state = get(&mut conn, "{keyed:k}").expect("a state");
    assert_eq!(state.len(), 17, "{state:?}");
    assert!((3.0..3.001).contains(&decode(&state)[0]), "{state:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_written_by_one_process_is_read_by_another() {
    let server = Server::start();
    let mut conn = admin(&server);

    // Another process takes 3 of 10: it writes <1, 7, at>.
    assert_eq!(worker(&["take", &server.url(), "shared", "3"]), "granted");
    let state = get(&mut conn, "shared").expect("the worker's state");
    assert_eq!(state.len(), 17, "{state:?}");
    let [level, at] = decode(&state)[..] else {
        unreachable!()
    };
    assert!((7.0..7.001).contains(&level), "{level}");
    assert!((0.0..10e6).contains(&age_us(&mut conn, at)), "{at}");

    // This process reads it: 7 tokens there, not 10 (a full bucket), nor 0.
    let (rate, burst) = SLOW;
    let quota = RedisRateLimiter::builder(server.url(), "shared", rate, burst)
        .build()
        .unwrap();
    quota.try_acquire(7).await.unwrap();
    let wait = quota.try_acquire(1).await.unwrap_err();
    let wait = wait.not_until().expect("a refusal").retry_after();
    assert!(
        wait > Duration::from_secs(50) && wait <= Duration::from_secs(60),
        "{wait:?}"
    );
    // And another process reads what this one wrote: nothing left, a minute to the next.
    let answer = worker(&["take", &server.url(), "shared", "1"]);
    let wait: u64 = answer
        .strip_prefix("refused ")
        .unwrap_or_else(|| panic!("{answer}"))
        .parse()
        .unwrap();
    assert!((50_000..=60_000).contains(&wait), "{answer}");

    // A key's own limit, set by another process, is read here with its level: one a minute,
    // burst 4, one token taken; this process's default limit (100/s, burst 50) does not apply.
    assert_eq!(worker(&["own-limit", &server.url(), "own", "k"]), "granted");
    let state = get(&mut conn, "{own:k}").expect("the worker's state");
    let [level, _, interval, burst] = decode(&state)[..] else {
        panic!("{state:?}")
    };
    assert!((3.0..3.001).contains(&level), "{level}");
    assert_eq!((interval, burst), (MINUTE_US, 4.0));
    let keyed: RedisKeyedRateLimiter<String> =
        RedisKeyedRateLimiter::builder(server.url(), "own", Rate::per_second(100), 50)
            .build()
            .unwrap();
    keyed.try_acquire("k", 3).await.unwrap();
    let refused = keyed.try_acquire("k", 1).await.unwrap_err();
    let wait = refused.not_until().expect("a refusal").retry_after();
    assert!(
        wait > Duration::from_secs(50) && wait <= Duration::from_secs(60),
        "{wait:?}"
    );
    assert!(keyed
        .try_acquire("k", 5)
        .await
        .unwrap_err()
        .not_until()
        .unwrap()
        .is_never());
}

/// Asks `key` everything a `RedisRateLimiter` and a `RedisKeyedRateLimiter` can ask, failing
/// open (so that a fallback would show), and checks that each is a reply error whose message
/// contains each of `expected`, that nothing was granted or fell back, and that the key still
/// holds `value`, untouched.
async fn refused_and_left_as_it_is(
    server: &Server,
    conn: &mut redis::Connection,
    (prefix, key): (&str, &str),
    value: &[u8],
    expected: &[&str],
) {
    let redis_key = format!("{{{prefix}:{key}}}");
    let check = |what: &str, message: String| {
        for part in expected {
            assert!(message.contains(part), "{redis_key}, {what}: {message}");
        }
    };
    let fail_open = FailurePolicy::FailOpen { share: 0.5 };

    let quota = RedisRateLimiter::builder(server.url(), &redis_key, SLOW.0, SLOW.1)
        .failure_policy(fail_open)
        .build()
        .unwrap();
    let err = quota.acquire(1).await.unwrap_err();
    assert!(matches!(err, RedisLimiterError::Reply(_)), "{err}");
    check("acquire", err.to_string());
    let err = quota.try_acquire(1).await.unwrap_err();
    assert!(matches!(err, TryAcquireError::Reply(_)), "{err}");
    check("try_acquire", err.to_string());
    let stats = quota.stats();
    assert_eq!(
        (
            stats.reply_errors,
            stats.errors,
            stats.fallback,
            stats.granted
        ),
        (2, 0, 0, 0),
        "{redis_key}: {stats:?}"
    );

    let keyed: RedisKeyedRateLimiter<String> =
        RedisKeyedRateLimiter::builder(server.url(), prefix, SLOW.0, SLOW.1)
            .failure_policy(fail_open)
            .build()
            .unwrap();
    let err = keyed.acquire(key, 1).await.unwrap_err();
    assert!(matches!(err, RedisLimiterError::Reply(_)), "{err}");
    check("keyed acquire", err.to_string());
    let err = keyed.try_acquire(key, 1).await.unwrap_err();
    assert!(matches!(err, TryAcquireError::Reply(_)), "{err}");
    let err = keyed
        .acquire_timeout(key, 1, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(err, TryAcquireError::Reply(_)), "{err}");
    let err = keyed.set_limit(key, Rate::per_second(1), 1).await;
    assert!(matches!(err, Err(RedisLimiterError::Reply(_))), "{err:?}");
    let err = keyed.clear_limit(key).await;
    assert!(matches!(err, Err(RedisLimiterError::Reply(_))), "{err:?}");
    let stats = keyed.stats();
    assert_eq!(
        (
            stats.reply_errors,
            stats.errors,
            stats.fallback,
            stats.granted
        ),
        (5, 0, 0, 0),
        "{redis_key}: {stats:?}"
    );

    // Not read as something else, not reset, not overwritten, its expiry (none) unchanged.
    assert_eq!(get(conn, &redis_key).as_deref(), Some(value), "{redis_key}");
    assert_eq!(pttl(conn, &redis_key), -1, "{redis_key}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_of_a_version_this_paced_does_not_read_is_a_reply_error_left_as_it_is() {
    let server = Server::start();
    let mut conn = admin(&server);
    let now = redis_now_us(&mut conn);
    // Version 2 as a later paced might write it: a full bucket, if it were misread as version 1;
    // the highest version; the text `<level>:<at>` of an unreleased earlier paced (first byte
    // '2', 50); and its binary form without a version (first byte 0, of the level 2.0).
    let mut v2 = version_1(&[10.0, now]);
    v2[0] = 2;
    let mut unversioned = 2.0f64.to_le_bytes().to_vec();
    unversioned.extend(now.to_le_bytes());
    let cases: [(&str, Vec<u8>, u8); 4] = [
        ("v2", v2, 2),
        ("v255", [255; 41].to_vec(), 255),
        ("text", format!("2.5:{now}").into_bytes(), b'2'),
        ("unversioned", unversioned, 0),
    ];
    for (key, value, version) in cases {
        redis_cli_set(&server, &format!("{{fmt:{key}}}"), &value);
        let found = format!("holds format version {version}, which this paced does not read");
        let expected = [found.as_str(), "it reads version 1", "a later paced"];
        refused_and_left_as_it_is(&server, &mut conn, ("fmt", key), &value, &expected).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_version_written_by_another_process_stops_every_process_of_this_version() {
    let server = Server::start();
    let mut conn = admin(&server);
    let url = server.url();
    // One process of this version writes version 1...
    assert_eq!(worker(&["take", &url, "{up:k}", "3"]), "granted");
    let state = get(&mut conn, "{up:k}").unwrap();
    assert!((7.0..7.001).contains(&decode(&state)[0]), "{state:?}");
    // ... then a process of a later paced writes its version 2 over it (here `redis-cli`).
    let mut v2 = state.clone();
    v2[0] = 2;
    redis_cli_set(&server, "{up:k}", &v2);
    // Every process of this version answers a reply error, naming both versions, and writes
    // nothing; so does this one, for every request.
    let answer = worker(&["take", &url, "{up:k}", "1"]);
    assert!(
        answer.starts_with("reply ")
            && answer.contains("holds format version 2")
            && answer.contains("it reads version 1"),
        "{answer}"
    );
    let expected = ["holds format version 2", "it reads version 1"];
    refused_and_left_as_it_is(&server, &mut conn, ("up", "k"), &v2, &expected).await;
    // Deleted (or written in version 1 again), the key is a quota again for everyone.
    redis::cmd("DEL").arg("{up:k}").exec(&mut conn).unwrap();
    assert_eq!(worker(&["take", &url, "{up:k}", "10"]), "granted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_string_of_version_1_that_is_not_a_quota_is_a_reply_error_left_as_it_is() {
    let server = Server::start();
    let mut conn = admin(&server);
    let now = redis_now_us(&mut conn);
    // The unversioned binary forms whose level's low byte happens to be 1 (16 and 32 bytes);
    // a version byte alone; an empty string; a time in the future beyond 2^53 µs.
    let level = f64::from_bits(2.0f64.to_bits() | 1);
    let mut v1_16 = level.to_le_bytes().to_vec();
    v1_16.extend(now.to_le_bytes());
    let mut v1_32 = v1_16.clone();
    v1_32.extend(MINUTE_US.to_le_bytes());
    v1_32.extend(4.0f64.to_le_bytes());
    let cases: [(&str, Vec<u8>); 5] = [
        ("16", v1_16),
        ("32", v1_32),
        ("byte", vec![1]),
        ("empty", Vec::new()),
        ("late", version_1(&[1.0, 2f64.powi(60)])),
    ];
    for (key, value) in cases {
        redis_cli_set(&server, &format!("{{junk:{key}}}"), &value);
        let expected = ["holds a string that is not a paced quota"];
        refused_and_left_as_it_is(&server, &mut conn, ("junk", key), &value, &expected).await;
    }
}
