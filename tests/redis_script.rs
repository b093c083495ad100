//! paced's one Redis script (`src/redis/quota.lua`) against itself, on a real, private
//! `redis-server`: its table-free path for the common one-bucket grant gives the same answer,
//! the same stored state (byte for byte) and the same expiry as its general path, on random
//! operations. Both run with Redis's clock faked (`TIME` reads a hash the test sets; a `SET … PX`
//! records its TTL beside the key instead), so that both see the same instants. The general
//! path is forced by giving back zero tokens (a fifth argument), which changes nothing else.
#![cfg(feature = "redis")]

use proptest::prelude::*;

// Its bound checker is for the multi-process tests of the bound.
#[allow(dead_code)]
#[path = "common/redis_server.rs"]
mod redis_server;
use redis_server::Server;

const SCRIPT: &str = include_str!("../src/redis/quota.lua");
const CLOCK: &str = "paced-test-clock";
const TTLS: &str = "paced-test-ttl";

/// The script with `TIME` read from [`CLOCK`] and each expiry recorded in [`TTLS`].
fn faked() -> String {
    let time = "redis.call('TIME')";
    let expiry = ", 'PX', string.format('%d', ttl_ms))";
    assert!(SCRIPT.contains(time) && SCRIPT.matches(expiry).count() == 2);
    SCRIPT
        .replace(time, &format!("redis.call('HMGET', '{CLOCK}', 's', 'us')"))
        .replace(
            expiry,
            &format!(") redis.call('HSET', '{TTLS}', key, string.format('%d', ttl_ms))"),
        )
}

fn doubles(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// One operation: a "try" or a reservation (with a longest wait or not) of `cost` on one
/// bucket of `interval_us` per token and `burst`, after the clock moved by `step_us` (backwards
/// for a negative step, as Redis's clock may after a failover).
#[derive(Clone, Debug)]
struct Op {
    reserve: bool,
    max_wait_us: Option<f64>,
    cost: f64,
    step_us: i64,
}

fn op() -> impl Strategy<Value = Op> {
    (
        any::<bool>(),
        prop_oneof![Just(None), (0.0..5e6f64).prop_map(|w| Some(w.floor()))],
        prop_oneof![0.0..12.0f64, Just(0.0), Just(1.0), 0.0..1e10f64].prop_map(f64::floor),
        prop_oneof![0i64..2_000, 0i64..5_000_000, -3_000i64..0, Just(0)],
    )
        .prop_map(|(reserve, max_wait_us, cost, step_us)| Op {
            reserve,
            max_wait_us,
            cost,
            step_us,
        })
}

/// What a call answered, what the key holds after it and the expiry it was given.
type Outcome = (redis::Value, Option<Vec<u8>>, Option<String>);

fn call(
    conn: &mut redis::Connection,
    sha: &str,
    key: &str,
    limit: &[u8],
    op: &Op,
    general: bool,
) -> Outcome {
    let _: () = redis::cmd("HDEL").arg(TTLS).arg(key).query(conn).unwrap();
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(1).arg(key);
    cmd.arg(if op.reserve { "reserve" } else { "try" })
        .arg(limit);
    let max_wait = match (op.reserve, op.max_wait_us) {
        (true, Some(w)) => doubles(&[w]),
        _ => Vec::new(),
    };
    if general {
        cmd.arg(max_wait).arg("").arg(doubles(&[0.0, -1.0]));
    } else if !max_wait.is_empty() {
        cmd.arg(max_wait);
    }
    let reply: redis::Value = cmd.query(conn).unwrap();
    let state: Option<Vec<u8>> = redis::cmd("GET").arg(key).query(conn).unwrap();
    let ttl: Option<String> = redis::cmd("HGET").arg(TTLS).arg(key).query(conn).unwrap();
    (reply, state, ttl)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn the_one_bucket_grant_without_tables_is_the_general_paths(
        interval_us in prop_oneof![Just(1.0), Just(7.5), Just(1_000.0), Just(86_400e6), 0.001..1e6f64],
        burst in prop_oneof![Just(1.0), Just(5.0), Just(100.0), Just(1e9), 1.0..50.0f64].prop_map(f64::floor),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        thread_local! {
            static SERVER: (Server, String) = {
                let server = Server::start();
                let mut conn = redis::Client::open(server.url()).unwrap().get_connection().unwrap();
                let sha: String = redis::cmd("SCRIPT").arg("LOAD").arg(faked()).query(&mut conn).unwrap();
                (server, sha)
            };
        }
        SERVER.with(|(server, sha)| {
            let mut conn = redis::Client::open(server.url()).unwrap().get_connection().unwrap();
            let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
            // One bucket, with the byte that asks for the one-bucket form.
            let mut limit = doubles(&[0.0, interval_us, burst, 0.0, 0.0]);
            limit.push(1);
            let mut clock: i64 = 1_764_000_000_000_000;
            for op in &ops {
                clock = (clock + op.step_us).max(0);
                let _: () = redis::cmd("HSET")
                    .arg(CLOCK)
                    .arg("s")
                    .arg(clock / 1_000_000)
                    .arg("us")
                    .arg(clock % 1_000_000)
                    .query(&mut conn)
                    .unwrap();
                limit[32..40].copy_from_slice(&op.cost.to_le_bytes());
                let fast = call(&mut conn, sha, "fast", &limit, op, false);
                let general = call(&mut conn, sha, "general", &limit, op, true);
                prop_assert_eq!(&fast, &general, "{:?} at {}", op, clock);
            }
            Ok(())
        })?;
    }
}
