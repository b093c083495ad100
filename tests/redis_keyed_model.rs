//! `RedisKeyedRateLimiter` against a model of its buckets, on random schedules of requests and
//! limit changes, through a real, private `redis-server`.
//!
//! The rates are so slow (one token an hour or two) that no run of a case refills a hundredth
//! of a token: every grant, refusal and level is then known exactly from the requests alone,
//! whatever Redis's clock says. After every step the test reads the key's state in Redis and
//! checks it against the model: its level, whether it holds its own limit, and that a full
//! bucket under the default limit is no key at all.
#![cfg(feature = "redis")]

use std::time::Duration;

use paced::redis::TryAcquireError;
use paced::{Rate, RedisKeyedRateLimiter};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

// Its bound checker is for the multi-process tests.
#[allow(dead_code)]
#[path = "common/redis_server.rs"]
mod redis_server;
use redis_server::Server;

const KEYS: [&str; 3] = ["a", "b:{c}", "d%"];
const DEFAULT_BURST: u64 = 10;
const HOUR: Duration = Duration::from_secs(3_600);

#[derive(Clone, Debug)]
enum Op {
    /// `try_acquire(key, cost)`.
    Try(usize, u64),
    /// `acquire_timeout(key, cost, 50 ms)`: at these rates, granted only from what is there.
    Timeout(usize, u64),
    /// `set_limit(key, one token per two hours, burst)`.
    SetLimit(usize, u64),
    /// `clear_limit(key)`.
    Clear(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS.len();
    prop_oneof![
        4 => (key.clone(), 0..=13u64).prop_map(|(k, c)| Op::Try(k, c)),
        2 => (key.clone(), 0..=13u64).prop_map(|(k, c)| Op::Timeout(k, c)),
        1 => (key.clone(), 1..=12u64).prop_map(|(k, b)| Op::SetLimit(k, b)),
        1 => key.prop_map(Op::Clear),
    ]
}

/// One key as the model sees it: its level in tokens and its own limit's burst, if any.
#[derive(Clone, Copy, Debug)]
struct Model {
    level: u64,
    own_burst: Option<u64>,
}

impl Model {
    fn burst(&self) -> u64 {
        self.own_burst.unwrap_or(DEFAULT_BURST)
    }

    fn interval(&self) -> Duration {
        if self.own_burst.is_some() {
            2 * HOUR
        } else {
            HOUR
        }
    }
}

/// The key's state in Redis: the level and, for a key with its own limit, the burst.
fn stored(conn: &mut redis::Connection, key: &str) -> Option<(f64, Option<f64>)> {
    let state: Option<Vec<u8>> = redis::cmd("GET").arg(key).query(conn).unwrap();
    let state = state?;
    assert_eq!(state.first(), Some(&1), "{key}: the format version");
    let double = |i: usize| f64::from_le_bytes(state[1 + 8 * i..9 + 8 * i].try_into().unwrap());
    match state.len() {
        17 => Some((double(0), None)),
        33 => Some((double(0), Some(double(3)))),
        n => panic!("{key}: a state of {n} bytes"),
    }
}

/// The Redis key of `key` under the prefix "m": escaped, hash-tagged.
fn redis_key(key: &str) -> String {
    let escaped = key
        .replace('%', "%25")
        .replace('{', "%7B")
        .replace('}', "%7D")
        .replace(':', "%3A");
    format!("{{m:{escaped}}}")
}

fn check(
    quota: &RedisKeyedRateLimiter<String>,
    conn: &mut redis::Connection,
    rt: &tokio::runtime::Runtime,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    redis::cmd("FLUSHALL").exec(conn).unwrap();
    let mut model = [Model {
        level: DEFAULT_BURST,
        own_burst: None,
    }; KEYS.len()];
    for (step, op) in ops.iter().enumerate() {
        let at = format!("step {step}: {op:?}");
        match *op {
            Op::Try(k, cost) => {
                let m = &mut model[k];
                let answer = rt.block_on(quota.try_acquire(KEYS[k], cost));
                if cost <= m.level {
                    prop_assert!(answer.is_ok(), "{at}: refused, model {m:?}: {answer:?}");
                    m.level -= cost;
                } else {
                    let refused = match answer {
                        Err(TryAcquireError::NotUntil(n)) => n,
                        other => return Err(TestCaseError::fail(format!("{at}: {other:?}"))),
                    };
                    if cost > m.burst() {
                        prop_assert!(refused.is_never(), "{at}: {refused:?}");
                    } else {
                        // The tokens missing, at the key's interval, less what flowed in since
                        // (under a hundredth of a token), rounded up to whole microseconds.
                        let due = m.interval() * u32::try_from(cost - m.level).unwrap();
                        let wait = refused.retry_after();
                        prop_assert!(
                            wait <= due + Duration::from_micros(1)
                                && wait >= due - m.interval() / 100,
                            "{at}: retry after {wait:?}, due {due:?}"
                        );
                    }
                }
            }
            Op::Timeout(k, cost) => {
                let m = &mut model[k];
                let answer =
                    rt.block_on(quota.acquire_timeout(KEYS[k], cost, Duration::from_millis(50)));
                if cost <= m.level {
                    prop_assert!(answer.is_ok(), "{at}: refused, model {m:?}: {answer:?}");
                    m.level -= cost;
                } else {
                    // It would wait an hour or more: refused, and not charged.
                    prop_assert!(
                        matches!(answer, Err(TryAcquireError::NotUntil(_))),
                        "{at}: {answer:?}"
                    );
                }
            }
            Op::SetLimit(k, burst) => {
                let m = &mut model[k];
                rt.block_on(quota.set_limit(KEYS[k], Rate::new(1, 2 * HOUR), burst))
                    .unwrap();
                // A full bucket stays full; otherwise the level is kept, at most the burst.
                m.level = if m.level >= m.burst() {
                    burst
                } else {
                    m.level.min(burst)
                };
                m.own_burst = Some(burst);
            }
            Op::Clear(k) => {
                let m = &mut model[k];
                rt.block_on(quota.clear_limit(KEYS[k])).unwrap();
                m.level = if m.level >= m.burst() {
                    DEFAULT_BURST
                } else {
                    m.level.min(DEFAULT_BURST)
                };
                m.own_burst = None;
            }
        }
        for (k, m) in model.iter().enumerate() {
            let state = stored(conn, &redis_key(KEYS[k]));
            match (state, m.own_burst) {
                // Full under the default limit: no key.
                (None, None) => prop_assert_eq!(m.level, DEFAULT_BURST, "{}: key {}", at, k),
                (Some((level, own)), _) => {
                    prop_assert!(
                        (level - m.level as f64).abs() < 0.01,
                        "{at}: key {k} holds {level}, model {m:?}"
                    );
                    prop_assert_eq!(own, m.own_burst.map(|b| b as f64), "{}: key {}", at, k);
                    if own.is_none() {
                        prop_assert!(m.level < DEFAULT_BURST, "{at}: key {k} full, yet kept");
                    }
                }
                (None, Some(_)) => {
                    return Err(TestCaseError::fail(format!(
                        "{at}: key {k} lost its own limit"
                    )))
                }
            }
        }
    }
    Ok(())
}

#[test]
fn every_key_is_the_model_bucket_in_redis() {
    let server = Server::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let quota: RedisKeyedRateLimiter<String> = rt.block_on(async {
        RedisKeyedRateLimiter::builder(server.url(), "m", Rate::new(1, HOUR), DEFAULT_BURST)
            .build()
            .unwrap()
    });
    let conn = std::cell::RefCell::new(
        redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap(),
    );
    let mut runner = TestRunner::new(Config {
        cases: 256,
        ..Config::default()
    });
    runner
        .run(&proptest::collection::vec(op(), 1..40), |ops| {
            check(&quota, &mut conn.borrow_mut(), &rt, &ops)
        })
        .unwrap();
}
