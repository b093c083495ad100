//! paced's one Redis script (`src/redis/quota.lua`) against itself, on a real, private
//! `redis-server`: its table-free paths for the common grants (one bucket in the one-bucket
//! form; one or two buckets in the general form) give the same answer, the same stored state
//! (byte for byte) and the same expiry as its general path, on random operations, among
//! settles that leave debts. Both run with Redis's clock faked (`TIME` reads a hash the test
//! sets; a `SET … PX` records its TTL beside the key instead), so that both see the same
//! instants. The general path is forced by giving back zero tokens (a fifth argument), which
//! changes nothing else. Now and then the key holds a state that is not a quota (another
//! version, a byte short, a level NaN or infinite, a fractional time): both paths must refuse it.
//! Then, on the same faked clock, the cases a review of the merged script found: a grant given
//! back beside a fixed window, a whole lease that is never there or later than the longest
//! wait, and a new limit over a debt.
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
    assert!(SCRIPT.contains(time) && SCRIPT.matches(expiry).count() == 3);
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

/// One operation: a "try" or a reservation (with a longest wait or not) of `cost` (one amount
/// per bucket), or a settle that charges `cost` (leaving a debt where the bucket lacks it), after
/// the clock moved by `step_us` (backwards for a negative step, as Redis's clock may after a
/// failover), on the key's state spoilt by `spoil` (see [`spoil`]) if it is set.
#[derive(Clone, Debug)]
struct Op {
    spoil: Option<u8>,
    settle: bool,
    reserve: bool,
    max_wait_us: Option<f64>,
    cost: [f64; 2],
    step_us: i64,
}

fn amount() -> impl Strategy<Value = f64> {
    prop_oneof![0.0..12.0f64, Just(0.0), Just(1.0), 0.0..1e10f64].prop_map(f64::floor)
}

fn op() -> impl Strategy<Value = Op> {
    (
        prop::option::weighted(0.08, 0..6u8),
        prop::bool::weighted(0.15),
        any::<bool>(),
        prop_oneof![Just(None), (0.0..5e6f64).prop_map(|w| Some(w.floor()))],
        [amount(), amount()],
        prop_oneof![0i64..2_000, 0i64..5_000_000, -3_000i64..0, Just(0)],
    )
        .prop_map(|(spoil, settle, reserve, max_wait_us, cost, step_us)| Op {
            spoil,
            settle,
            reserve,
            max_wait_us,
            cost,
            step_us,
        })
}

fn interval() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(1.0),
        Just(7.5),
        Just(1_000.0),
        Just(86_400e6),
        0.001..1e6f64
    ]
}

fn burst() -> impl Strategy<Value = f64> {
    prop_oneof![Just(1.0), Just(5.0), Just(100.0), Just(1e9), 1.0..50.0f64].prop_map(f64::floor)
}

/// What a call answered (an error with the key's name taken out), what the key holds after it
/// and the expiry it was given.
type Outcome = (
    Result<redis::Value, String>,
    Option<Vec<u8>>,
    Option<String>,
);

/// A state that is not a paced quota, made from `state` (the key's, or a sound one of `len`
/// bytes for a key without one): `how` picks another version byte (two ways), a byte too few,
/// a level that is NaN or infinite, or a time that is not a whole microsecond. Every path of
/// the script must read each as not a quota.
fn spoil(state: Option<Vec<u8>>, len: usize, clock: i64, how: u8) -> Vec<u8> {
    let mut state = state.unwrap_or_else(|| {
        let mut fresh = vec![1];
        let values = if len == 17 {
            vec![1.0, clock as f64]
        } else {
            let mut v = vec![clock as f64];
            v.resize((len - 1) / 8, 1.0);
            v
        };
        fresh.extend(doubles(&values));
        fresh
    });
    // The one-bucket form holds its level first and its time second; the general form its
    // time first.
    let (level, time) = if state.len() == 17 { (1, 9) } else { (9, 1) };
    let mut put = |at: usize, v: f64| {
        if state.len() >= at + 8 {
            state[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
    };
    match how {
        0 => state[0] = 2,
        1 => state[0] = 0,
        2 => {
            state.pop();
        }
        3 => put(level, f64::NAN),
        4 => put(level, f64::INFINITY),
        _ => put(time, clock as f64 - 0.5),
    }
    state
}

fn call(
    conn: &mut redis::Connection,
    sha: &str,
    key: &str,
    limit: &[u8],
    op: &Op,
    buckets: usize,
    general: bool,
) -> Outcome {
    let _: () = redis::cmd("HDEL").arg(TTLS).arg(key).query(conn).unwrap();
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(1).arg(key);
    let mode = match (op.settle, op.reserve) {
        (true, _) => "settle",
        (false, true) => "reserve",
        (false, false) => "try",
    };
    cmd.arg(mode).arg(limit);
    let max_wait = match (op.reserve, op.max_wait_us) {
        (true, Some(w)) => doubles(&[w]),
        _ => Vec::new(),
    };
    if op.settle {
        // A charge, the same call on both keys: it always takes the general path.
    } else if general {
        let mut back = vec![0.0; buckets];
        back.push(-1.0);
        cmd.arg(max_wait).arg("").arg(doubles(&back));
    } else if !max_wait.is_empty() {
        cmd.arg(max_wait);
    }
    let reply = cmd
        .query::<redis::Value>(conn)
        .map_err(|e| e.to_string().replace(key, "KEY"));
    let state: Option<Vec<u8>> = redis::cmd("GET").arg(key).query(conn).unwrap();
    let ttl: Option<String> = redis::cmd("HGET").arg(TTLS).arg(key).query(conn).unwrap();
    (reply, state, ttl)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn the_grants_without_tables_are_the_general_paths(
        buckets in 1..=2usize,
        one_bucket_form in any::<bool>(),
        limits in [(interval(), burst()), (interval(), burst())],
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
                let mut limit = Vec::new();
                for (&(interval_us, burst), cost) in limits.iter().zip(op.cost).take(buckets) {
                    limit.extend(doubles(&[0.0, interval_us, burst, 0.0, cost]));
                }
                if buckets == 1 && one_bucket_form {
                    // The byte that asks for the one-bucket form.
                    limit.push(1);
                }
                if let Some(how) = op.spoil {
                    let len = if limit.len() == 41 { 17 } else { 9 + 16 * buckets };
                    let state: Option<Vec<u8>> =
                        redis::cmd("GET").arg("fast").query(&mut conn).unwrap();
                    let spoilt = spoil(state, len, clock, how);
                    for key in ["fast", "general"] {
                        let _: () = redis::cmd("SET").arg(key).arg(&spoilt).query(&mut conn).unwrap();
                    }
                }
                let fast = call(&mut conn, sha, "fast", &limit, op, buckets, false);
                let general = call(&mut conn, sha, "general", &limit, op, buckets, true);
                prop_assert_eq!(&fast, &general, "{:?} at {}", op, clock);
                if op.spoil.is_some() {
                    // Not a quota: every call fails until the key is deleted (as its error
                    // says); so that the next ones are grants again.
                    prop_assert!(fast.0.is_err(), "{:?}", fast);
                    let _: () = redis::cmd("DEL").arg("fast").arg("general").query(&mut conn).unwrap();
                }
            }
            Ok(())
        })?;
    }
}

/// The faked script on a private server, and a clock to move.
struct Fake {
    _server: Server,
    conn: redis::Connection,
    sha: String,
}

impl Fake {
    fn start() -> Fake {
        let server = Server::start();
        let mut conn = redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(faked())
            .query(&mut conn)
            .unwrap();
        Fake {
            _server: server,
            conn,
            sha,
        }
    }

    fn at(&mut self, us: u64) {
        let _: () = redis::cmd("HSET")
            .arg(CLOCK)
            .arg("s")
            .arg(us / 1_000_000)
            .arg("us")
            .arg(us % 1_000_000)
            .query(&mut self.conn)
            .unwrap();
    }

    /// The script's reply, as numbers.
    fn eval(&mut self, key: &str, args: &[&[u8]]) -> Vec<u64> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sha).arg(1).arg(key);
        for a in args {
            cmd.arg(*a);
        }
        cmd.query(&mut self.conn).unwrap()
    }

    /// The one-bucket form's stored level (with or without a limit of the key's own).
    fn level(&mut self, key: &str) -> f64 {
        let state: Vec<u8> = redis::cmd("GET").arg(key).query(&mut self.conn).unwrap();
        assert!(state.len() == 17 || state.len() == 33, "{state:?}");
        f64::from_le_bytes(state[1..9].try_into().unwrap())
    }
}

const T: u64 = 1_764_000_000_500_000;

/// One bucket of `interval_us` per token and `burst`, costing `cost`, in the one-bucket form.
fn one_bucket(interval_us: f64, burst: f64, cost: f64) -> Vec<u8> {
    let mut limit = doubles(&[0.0, interval_us, burst, 0.0, cost]);
    limit.push(1);
    limit
}

/// A bucket that never binds beside a window of 10 a second. The window is used up, then a
/// reservation is charged at the next window's start; given back (the latest grant), the
/// quota moves back, but never before that window starts: a request now is still refused, and
/// the next reservation still waits for the window.
#[test]
fn a_given_back_grant_never_lets_a_request_into_a_full_window() {
    let mut fake = Fake::start();
    fake.at(T);
    let limits = |cost: f64| doubles(&[0.0, 1e5, 100.0, 0.0, cost, 1.0, 1e6, 10.0, 0.0, cost]);
    assert_eq!(fake.eval("w", &[b"try", &limits(10.0)])[0], 1);
    let reserved = fake.eval("w", &[b"reserve", &limits(1.0)]);
    assert_eq!(reserved[..2], [1, 500_000]);
    let next_window = reserved[2];
    fake.at(T + 10);
    let back = doubles(&[next_window as f64]);
    assert_eq!(fake.eval("w", &[b"settle", &limits(-1.0), &back])[0], 1);
    let refused = fake.eval("w", &[b"try", &limits(1.0)]);
    assert_eq!(refused[0], 0, "the window running now is full: {refused:?}");
    let again = fake.eval("w", &[b"reserve", &limits(1.0)]);
    assert_eq!((again[0], again[2]), (1, next_window), "{again:?}");
}

/// A whole lease that would take 584 years or more is not waited for, and not lent either: a
/// reservation then takes its cost alone, from what the bucket holds.
#[test]
fn a_lease_that_is_never_there_is_not_lent() {
    let mut fake = Fake::start();
    fake.at(T);
    let bucket = |cost: f64| one_bucket(1e18, 10.0, cost);
    assert_eq!(fake.eval("l", &[b"try", &bucket(5.0)])[0], 1);
    takes_the_cost_alone(&mut fake, "l", &bucket(1.0), b"", 4.0);
}

/// A reservation of `limit` (a cost of 1), with `max_wait` and a whole lease of 9 more, is
/// granted at once with no lease, leaving `level` in the bucket.
fn takes_the_cost_alone(fake: &mut Fake, key: &str, limit: &[u8], max_wait: &[u8], level: f64) {
    let lease = doubles(&[0.0, 9.0, 1.0]);
    let granted = fake.eval(key, &[b"reserve", limit, max_wait, &lease]);
    assert_eq!(granted[..2], [1, 0], "{granted:?}");
    assert_eq!(granted.get(3).copied().unwrap_or(0), 0, "{granted:?}");
    assert!((fake.level(key) - level).abs() < 1e-9);
}

/// A reservation with a longest wait that the whole lease would exceed takes its cost alone,
/// as the one-limit script always did.
#[test]
fn a_lease_later_than_the_longest_wait_leaves_the_cost_alone() {
    let mut fake = Fake::start();
    fake.at(T);
    let bucket = |cost: f64| one_bucket(1_000.0, 5.0, cost);
    // 3 of 5 left: the whole lease (the burst) is 2 ms away, the cost is there now.
    assert_eq!(fake.eval("m", &[b"try", &bucket(2.0)])[0], 1);
    takes_the_cost_alone(&mut fake, "m", &bucket(1.0), &doubles(&[10.0]), 2.0);
}

/// A new limit keeps a debt in tokens in the one-bucket form: ten tokens owed at 1,000 µs a
/// token are still ten tokens owed at 10,000 µs a token.
#[test]
fn a_new_limit_keeps_a_debt_in_tokens() {
    let mut fake = Fake::start();
    fake.at(T);
    let bucket = |cost: f64| one_bucket(1_000.0, 10.0, cost);
    assert_eq!(
        fake.eval("d", &[b"reserve", &bucket(20.0)])[..2],
        [1, 10_000]
    );
    assert!((fake.level("d") + 10.0).abs() < 1e-9);
    let slower = doubles(&[1.0, 0.0, 10_000.0, 10.0, 0.0]);
    fake.eval("d", &[b"limit", &bucket(0.0), &slower]);
    let level = fake.level("d");
    assert!((level + 10.0).abs() < 1e-6, "level {level}");
    // The next token comes once the debt of ten and one more flow in at the new rate.
    let next = fake.eval("d", &[b"reserve", &bucket(1.0)]);
    assert_eq!(next[..2], [1, 110_000], "{next:?}");
}

/// A reservation under the whole-lease rule where a limit's cost is 0: no script error (that
/// limit waits for nothing), and the lease is taken where the cost is.
#[test]
fn a_whole_lease_beside_a_limit_of_cost_zero_is_granted() {
    let mut fake = Fake::start();
    fake.at(T);
    let limits = doubles(&[0.0, 1_000.0, 10.0, 0.0, 1.0, 0.0, 1_000.0, 10.0, 0.0, 0.0]);
    let lease = doubles(&[0.0, 4.0, 1.0, 4.0, 1.0]);
    let granted = fake.eval("z", &[b"reserve", &limits, b"", &lease]);
    assert_eq!(granted[..2], [1, 0], "{granted:?}");
    assert_eq!(granted[3..], [4, 4], "{granted:?}");
}
