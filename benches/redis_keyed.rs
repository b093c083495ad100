//! `RedisKeyedRateLimiter::try_acquire` beside its peers, redis-rate 0.1.1 and throttle-kit
//! 2.1.2's Redis backend, on the same private servers with the same workload.
//!
//! 1. Throughput: `TASKS` tasks on a current-thread runtime call `try_acquire` (redis-rate:
//!    `allow`, a blocking call, through `spawn_blocking`; throttle-kit: `check`) in a loop, task
//!    `t` on keys `t, t + TASKS, t + 2 × TASKS, ...` modulo the number of active keys (1, 1,000,
//!    10,000, 100,000), with a limit that never binds (`FREE_RATE` per second and per key, a
//!    bucket of `FREE_BURST`): `WARM_UP` untimed, then `MEASURE` timed. Every call must be
//!    granted and Redis must answer no error (throttle-kit grants when Redis errors, so its
//!    grants alone would not show one). paced runs without and with `.lease(LEASE_TOKENS,
//!    LEASE_AGE)` and `.lease(LONG_LEASE_TOKENS, LONG_LEASE_AGE)`, and with a response timeout of `RESPONSE_TIMEOUT` (the default 250 ms took a
//!    stall of the busy 2-core machine for an outage, which under `FailClosed` refuses); on one
//!    `redis-server` and on a local Redis Cluster (three masters, three replicas). The peers
//!    have no cluster client; the in-process `KeyedRateLimiter` runs beside them for scale.
//!    Round trips, commands and CPU are Redis's own counts (`INFO commandstats`, `errorstats`,
//!    `cpu`, on every master, before and after the timed loop), so they include whatever a
//!    limiter sends in the background; client CPU is this process's `/proc/self/stat`.
//! 2. Refusals: one key whose bucket of 1 is spent (1 per hour), then `REFUSALS` calls, one at
//!    a time, each refused: the Redis commands and writes each costs.
//! 3. The bound across processes: `PROCESSES` copies of this binary (started again with
//!    `PACED_BENCH_WORKER` set), `WORKER_TASKS` tasks each, call `try_acquire` on one shared key
//!    at `SHARED_RATE`/s, burst `SHARED_BURST`, for `WORKER_RUN`, sleeping 1 ms after each
//!    refusal; each grant is stamped when its call was sent and when its answer arrived. The
//!    merged timeline's most grants in any `WINDOW` is compared with `burst + rate × window`
//!    (with a lease, `+ rate × age`), counted by answer time and counting only the grants both
//!    sent and answered within the window (those certainly happened on Redis within it).
//!
//! Every server is started on free loopback ports without persistence and killed at the end,
//! also on a panic; each case starts on a flushed server. Skipped, with a message, when
//! `redis-server` is not installed (and the cluster rows when `redis-cli` is not).
//!
//! Run: `cargo bench -p paced-benches --features redis --bench redis_keyed`
//! (`PACED_BENCH_KEYS=10000` before it: only the one-server throughput rows, at those key
//! counts; `PACED_BENCH_ONLY=paced,throttle-kit`: only those contenders' throughput rows;
//! `PACED_BENCH_DEFAULT_TIMEOUT=1`: paced with its default response timeout of 250 ms).

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use paced::redis::{RedisStats, TryAcquireError};
use paced::{Rate, RedisKeyedRateLimiter};
use tokio::runtime::Runtime;

#[path = "common/redis_servers.rs"]
mod servers;
use servers::{installed, Cluster, Server};

/// Concurrent callers in the throughput runs.
const TASKS: usize = 32;
/// Active keys in the throughput runs.
const KEY_COUNTS: [usize; 4] = [1, 1_000, 10_000, 100_000];
/// Long enough for the leased runs to reach their steady state: at 10,000 keys each key takes
/// one round trip for its cost, then one for its first lease, at about 40 k round trips per
/// second (0.5 s); the slowest call of the timed loop shows what is left.
const WARM_UP: Duration = Duration::from_secs(1);
const MEASURE: Duration = Duration::from_millis(1_500);
/// The limit that never binds, per key: 1,000 per second (throttle-kit keeps its interval in
/// whole milliseconds, so 1 ms is its finest), a bucket of 10^9 that no run comes near
/// draining. Every grant stores the key, as under a real quota.
const FREE_RATE: u64 = 1_000;
const FREE_BURST: u64 = 1_000_000_000;
/// paced's lease: up to 100 tokens per round trip, spent within 100 ms.
const LEASE_TOKENS: u64 = 100;
const LEASE_AGE: Duration = Duration::from_millis(100);
/// A lease for busy keys, of 1,000 tokens (what takes one key to millions of grants per
/// second), spent within 1 s: long enough that at 10,000 keys each key is asked again before
/// its lease expires.
const LONG_LEASE_TOKENS: u64 = 1_000;
const LONG_LEASE_AGE: Duration = Duration::from_secs(1);
/// Refused calls measured one by one.
const REFUSALS: usize = 2_000;
/// The bound across processes: 4 processes of 4 tasks on one key at 200/s, burst 20.
const PROCESSES: usize = 4;
const WORKER_TASKS: usize = 4;
const SHARED_RATE: u64 = 200;
const SHARED_BURST: u64 = 20;
const WORKER_RUN: Duration = Duration::from_secs(2);
const WINDOW: Duration = Duration::from_millis(100);
/// paced's response timeout: see `Client::connect`.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest any one phase may take before the run is declared hung.
const HANG: Duration = Duration::from_secs(60);
/// The environment variable that makes this binary a worker of part 3.
const WORKER_ENV: &str = "PACED_BENCH_WORKER";
/// The environment variable that runs only the one-server throughput rows, at its key counts.
const QUICK_ENV: &str = "PACED_BENCH_KEYS";
/// Runs only the contenders it lists in the throughput rows (see `selected`).
const ONLY_ENV: &str = "PACED_BENCH_ONLY";
/// Set: paced keeps its default response timeout (250 ms) rather than `RESPONSE_TIMEOUT`.
const DEFAULT_TIMEOUT_ENV: &str = "PACED_BENCH_DEFAULT_TIMEOUT";

// ---------------------------------------------------------------------------------------------
// The contenders

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Contender {
    Paced,
    PacedLeased,
    PacedLeasedLong,
    ThrottleKit,
    RedisRate,
    /// The same limit as `Paced`, as the one limit of a several-limit
    /// `RedisKeyedRateLimiter<String, [u64; 1]>` (throughput only): the path that the
    /// one-limit handles would take as the case of one dimension.
    PacedSeveral,
    /// The in-process `KeyedRateLimiter`, for scale (throughput only).
    Local,
}

impl Contender {
    /// The limiters kept in Redis.
    const REDIS: [Contender; 5] = [
        Contender::Paced,
        Contender::PacedLeased,
        Contender::PacedLeasedLong,
        Contender::ThrottleKit,
        Contender::RedisRate,
    ];

    fn name(self) -> String {
        match self {
            Contender::Paced => "paced `try_acquire`".to_owned(),
            Contender::PacedLeased => format!(
                "paced `try_acquire`, `lease({LEASE_TOKENS}, {} ms)`",
                LEASE_AGE.as_millis()
            ),
            Contender::PacedLeasedLong => format!(
                "paced `try_acquire`, `lease({LONG_LEASE_TOKENS}, {} ms)`",
                LONG_LEASE_AGE.as_millis()
            ),
            Contender::ThrottleKit => "throttle-kit 2.1.2 `RedisBackend`".to_owned(),
            Contender::RedisRate => "redis-rate 0.1.1 `allow`".to_owned(),
            Contender::PacedSeveral => {
                "paced `[u64; 1]` `try_acquire` (several-limit path)".to_owned()
            }
            Contender::Local => "paced `KeyedRateLimiter::try_acquire` (in process)".to_owned(),
        }
    }

    fn arg(self) -> &'static str {
        match self {
            Contender::Paced => "paced",
            Contender::PacedLeased => "paced-leased",
            Contender::PacedLeasedLong => "paced-leased-long",
            Contender::ThrottleKit => "throttle-kit",
            Contender::RedisRate => "redis-rate",
            Contender::PacedSeveral => "paced-several",
            Contender::Local => "local",
        }
    }

    fn from_arg(arg: &str) -> Option<Contender> {
        Contender::REDIS.into_iter().find(|c| c.arg() == arg)
    }

    /// The burst it runs with when asked for `burst` tokens refilled at `tokens` per `period`:
    /// redis-rate refuses a burst below the tokens of one period.
    fn burst(self, quota: Quota) -> u64 {
        match self {
            Contender::RedisRate => quota.burst.max(quota.tokens),
            _ => quota.burst,
        }
    }
}

/// `tokens` per `period_s` seconds, a bucket of `burst`.
#[derive(Clone, Copy)]
struct Quota {
    tokens: u64,
    period_s: u64,
    burst: u64,
}

const FREE: Quota = Quota {
    tokens: FREE_RATE,
    period_s: 1,
    burst: FREE_BURST,
};
const HOURLY_ONE: Quota = Quota {
    tokens: 1,
    period_s: 3_600,
    burst: 1,
};
const SHARED: Quota = Quota {
    tokens: SHARED_RATE,
    period_s: 1,
    burst: SHARED_BURST,
};

/// Where the servers are.
struct Topology {
    name: &'static str,
    urls: Vec<String>,
    cluster: bool,
    /// The masters, whose counters are read.
    masters: Vec<u16>,
}

enum Client {
    Paced(RedisKeyedRateLimiter<String>),
    PacedSeveral(RedisKeyedRateLimiter<String, [u64; 1]>),
    ThrottleKit(throttle_kit::RateLimiter<throttle_kit::RedisBackend>),
    RedisRate(Arc<(redis_rate::Limiter, redis_rate::Limit)>),
    Local(paced::KeyedRateLimiter<String>),
}

impl Client {
    /// A client of `contender` for `quota`; `None` for a peer on a cluster (it has no cluster
    /// client), and for the in-process limiter there.
    async fn connect(contender: Contender, topology: &Topology, quota: Quota) -> Option<Client> {
        let url = topology.urls[0].as_str();
        let burst = contender.burst(quota);
        let rate = Rate::new(quota.tokens, Duration::from_secs(quota.period_s));
        match contender {
            Contender::Paced | Contender::PacedLeased | Contender::PacedLeasedLong => {
                let mut builder = if topology.cluster {
                    let nodes: Vec<&str> = topology.urls.iter().map(String::as_str).collect();
                    RedisKeyedRateLimiter::cluster_builder(&nodes, "bench", rate, burst)
                } else {
                    RedisKeyedRateLimiter::builder(url, "bench", rate, burst)
                };
                match contender {
                    Contender::PacedLeased => builder = builder.lease(LEASE_TOKENS, LEASE_AGE),
                    Contender::PacedLeasedLong => {
                        builder = builder.lease(LONG_LEASE_TOKENS, LONG_LEASE_AGE);
                    }
                    _ => {}
                }
                // The default (250 ms) took a stall of the shared machine for an outage, and
                // under `FailClosed` an outage refuses. `PACED_BENCH_DEFAULT_TIMEOUT` keeps the
                // default, to see whether it still does.
                if std::env::var_os(DEFAULT_TIMEOUT_ENV).is_none() {
                    builder = builder.response_timeout(RESPONSE_TIMEOUT);
                }
                Some(Client::Paced(
                    builder.build().expect("a valid configuration"),
                ))
            }
            Contender::PacedSeveral if !topology.cluster => {
                let quota = RedisKeyedRateLimiter::dimensions(url, "bench-several", ["tokens"])
                    .limit("tokens", paced::Limit::bucket(rate, burst))
                    .response_timeout(RESPONSE_TIMEOUT)
                    .build()
                    .expect("a valid configuration");
                Some(Client::PacedSeveral(quota))
            }
            Contender::ThrottleKit if !topology.cluster => {
                let backend = throttle_kit::RedisBackend::connect(url)
                    .await
                    .expect("throttle-kit connects");
                let interval = Duration::from_secs(quota.period_s) / quota.tokens as u32;
                let quota = throttle_kit::Quota::from_parts(
                    interval,
                    u32::try_from(burst).expect("a burst within u32"),
                );
                Some(Client::ThrottleKit(throttle_kit::RateLimiter::new(
                    quota, backend,
                )))
            }
            Contender::RedisRate if !topology.cluster => {
                let client = redis_for_redis_rate::Client::open(url).expect("a valid URL");
                let limit = redis_rate::Limit::new(
                    quota.tokens as usize,
                    burst as usize,
                    quota.period_s as usize,
                );
                Some(Client::RedisRate(Arc::new((
                    redis_rate::Limiter::new(client),
                    limit,
                ))))
            }
            Contender::Local if !topology.cluster => {
                Some(Client::Local(paced::KeyedRateLimiter::new(rate, burst)))
            }
            Contender::ThrottleKit
            | Contender::RedisRate
            | Contender::PacedSeveral
            | Contender::Local => None,
        }
    }

    /// One call for one token of `key`: granted or refused, or Redis's error.
    async fn try_once(&self, key: &str) -> Result<bool, String> {
        match self {
            Client::Paced(quota) => match quota.try_acquire(key, 1).await {
                Ok(()) => Ok(true),
                Err(TryAcquireError::NotUntil(_)) => Ok(false),
                Err(e) => Err(e.to_string()),
            },
            Client::PacedSeveral(quota) => match quota.try_acquire(key, [1]).await {
                Ok(_) => Ok(true),
                Err(TryAcquireError::NotUntil(_)) => Ok(false),
                Err(e) => Err(e.to_string()),
            },
            Client::ThrottleKit(limiter) => Ok(limiter.check(key).await.allowed),
            Client::RedisRate(both) => {
                let both = both.clone();
                let key = key.to_owned();
                tokio::task::spawn_blocking(move || both.0.allow(&key, &both.1))
                    .await
                    .map_err(|e| e.to_string())?
                    .map(|result| !result.limited)
                    .map_err(|e| e.to_string())
            }
            Client::Local(keyed) => Ok(keyed.try_acquire(key, 1).is_ok()),
        }
    }

    fn paced_stats(&self) -> Option<RedisStats> {
        match self {
            Client::Paced(quota) => Some(quota.stats()),
            Client::PacedSeveral(quota) => Some(quota.stats()),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Redis's own counters

/// Totals over the masters read.
#[derive(Clone, Copy, Default, Debug)]
struct Counts {
    /// Commands executed, those run by scripts included, `INFO` excluded.
    commands: u64,
    /// Script calls (`EVAL`, `EVALSHA` and their read-only forms): one per round trip of a
    /// limiter.
    scripts: u64,
    /// Writes: `SET`, `DEL`, `HSET`, expiries and the like.
    writes: u64,
    /// Commands that failed or were rejected, but for `NOSCRIPT` (the normal first `EVALSHA`
    /// of a script).
    errors: u64,
    /// Error replies of every kind but `NOSCRIPT`: also those to commands Redis does not know
    /// (`CLIENT SETINFO`, which Redis 7.0 predates and the `redis` crate sends, ignoring the
    /// error, on every new connection), which `errors` does not count.
    error_replies: u64,
    /// CPU seconds, user and system.
    cpu: f64,
}

impl std::ops::Sub for Counts {
    type Output = Counts;
    fn sub(self, before: Counts) -> Counts {
        Counts {
            commands: self.commands - before.commands,
            scripts: self.scripts - before.scripts,
            writes: self.writes - before.writes,
            errors: self.errors - before.errors,
            error_replies: self.error_replies - before.error_replies,
            cpu: self.cpu - before.cpu,
        }
    }
}

const SCRIPT_COMMANDS: [&str; 4] = ["eval", "evalsha", "eval_ro", "evalsha_ro"];
const WRITE_COMMANDS: [&str; 14] = [
    "set",
    "setex",
    "psetex",
    "del",
    "unlink",
    "hset",
    "hmset",
    "hdel",
    "expire",
    "pexpire",
    "incr",
    "incrby",
    "incrbyfloat",
    "getdel",
];

/// One `key=value` of an `INFO` line's `a=1,b=2` list.
fn info_field(list: &str, key: &str) -> u64 {
    list.split(',')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// One connection per master, kept open so that reading the counters adds no connection.
struct Probe {
    conns: Vec<redis::Connection>,
}

impl Probe {
    fn new(ports: &[u16]) -> Probe {
        let conns = ports
            .iter()
            .map(|port| {
                redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                    .and_then(|c| c.get_connection())
                    .expect("a connection to read the counters")
            })
            .collect();
        Probe { conns }
    }

    fn counts(&mut self) -> Counts {
        let mut counts = Counts::default();
        let mut noscript = 0;
        for conn in &mut self.conns {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .arg("errorstats")
                .arg("cpu")
                .query(conn)
                .expect("INFO");
            for line in info.lines() {
                if let Some((name, list)) = line
                    .strip_prefix("cmdstat_")
                    .and_then(|rest| rest.split_once(':'))
                {
                    let calls = info_field(list, "calls");
                    if name == "info" {
                        continue;
                    }
                    counts.commands += calls;
                    counts.errors +=
                        info_field(list, "failed_calls") + info_field(list, "rejected_calls");
                    if SCRIPT_COMMANDS.contains(&name) {
                        counts.scripts += calls;
                    }
                    if WRITE_COMMANDS.contains(&name) {
                        counts.writes += calls;
                    }
                } else if let Some((name, list)) = line
                    .strip_prefix("errorstat_")
                    .and_then(|rest| rest.split_once(':'))
                {
                    let count = info_field(list, "count");
                    if name == "NOSCRIPT" {
                        noscript += count;
                    } else {
                        counts.error_replies += count;
                    }
                } else if let Some(secs) = line
                    .strip_prefix("used_cpu_sys:")
                    .or_else(|| line.strip_prefix("used_cpu_user:"))
                {
                    counts.cpu += secs.trim().parse::<f64>().unwrap_or(0.0);
                }
            }
        }
        counts.errors -= noscript.min(counts.errors);
        counts
    }

    /// Empties every master (keys only: loaded scripts stay).
    fn flush(&mut self) {
        for conn in &mut self.conns {
            redis::cmd("FLUSHALL").query::<()>(conn).expect("FLUSHALL");
        }
    }
}

/// This process's CPU time, user and system, from `/proc/self/stat` (in ticks of 10 ms);
/// `None` where there is no such file.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after_name = stat.get(stat.rfind(')')? + 1..)?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of the file (utime, stime); this list starts at field 3.
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

// ---------------------------------------------------------------------------------------------
// Part 1: throughput

struct Case {
    contender: Contender,
    topology: &'static str,
    keys: usize,
    calls: u64,
    elapsed: Duration,
    /// The longest call of the timed loop.
    slowest: Duration,
    redis: Counts,
    client_cpu: Option<Duration>,
    /// paced's own round trips during the timed loop.
    paced_round_trips: Option<u64>,
}

/// `TASKS` tasks calling `try_once` for `run`, each on its own stride through `keys`; every
/// call must be granted. Returns the calls made, the time until the last one returned, and
/// the slowest call.
async fn run_tasks(
    client: &Arc<Client>,
    keys: &Arc<Vec<String>>,
    run: Duration,
    label: &str,
) -> (u64, Duration, Duration) {
    let start = Instant::now();
    let stop = start + run;
    let calls = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (client, keys, calls) = (client.clone(), keys.clone(), calls.clone());
            let label = label.to_owned();
            tokio::spawn(async move {
                let mut i = task;
                let mut made = 0;
                let mut slowest = Duration::ZERO;
                let mut now = Instant::now();
                while now < stop {
                    let granted = client
                        .try_once(&keys[i % keys.len()])
                        .await
                        .unwrap_or_else(|e| panic!("{label}: a call failed: {e}"));
                    assert!(
                        granted,
                        "{label}: a call was refused under a limit that never binds ({:?})",
                        client.paced_stats()
                    );
                    made += 1;
                    i += TASKS;
                    let then = std::mem::replace(&mut now, Instant::now());
                    slowest = slowest.max(now - then);
                }
                calls.fetch_add(made, Ordering::Relaxed);
                slowest
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for task in tasks {
        slowest = slowest.max(task.await.expect("a calling task panicked"));
    }
    (calls.load(Ordering::Relaxed), start.elapsed(), slowest)
}

async fn throughput(
    contender: Contender,
    topology: &Topology,
    probe: &mut Probe,
    keys: &Arc<Vec<String>>,
) -> Option<Case> {
    probe.flush();
    let client = Arc::new(Client::connect(contender, topology, FREE).await?);
    let label = format!(
        "{}, {}, {} keys",
        contender.name(),
        topology.name,
        keys.len()
    );
    run_tasks(&client, keys, WARM_UP, &label).await;
    let (before, stats_before, cpu_before) = (probe.counts(), client.paced_stats(), process_cpu());
    let (calls, elapsed, slowest) = run_tasks(&client, keys, MEASURE, &label).await;
    let (after, stats_after, cpu_after) = (probe.counts(), client.paced_stats(), process_cpu());
    let redis = after - before;
    if let Some(stats) = client.paced_stats() {
        // Over warm-up and measure: any round trip that failed (an outage under the response
        // timeout, a reply error) and any grant by the fallback.
        println!(
            "{label}: paced stats: {} round trips, {} outages, {} reply errors, {} fallback \
             grants, {} refused",
            stats.round_trips, stats.errors, stats.reply_errors, stats.fallback, stats.rejected
        );
    }
    assert_eq!(redis.errors, 0, "{label}: Redis answered with errors");
    Some(Case {
        contender,
        topology: topology.name,
        keys: keys.len(),
        calls,
        elapsed,
        slowest,
        redis,
        client_cpu: cpu_after.zip(cpu_before).map(|(a, b)| a - b),
        paced_round_trips: stats_after
            .zip(stats_before)
            .map(|(a, b)| a.round_trips - b.round_trips),
    })
}

/// A ratio with as many decimals as a small one needs.
fn ratio(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.1}")
    } else if x >= 0.1 {
        format!("{x:.2}")
    } else {
        format!("{x:.4}")
    }
}

/// `n` with thousands separators.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn print_throughput(cases: &[Case]) {
    println!(
        "\n### `try_acquire` from {TASKS} tasks, limit never binding ({FREE_RATE}/s per key, \
         burst {FREE_BURST}), current-thread runtime, {} ms timed after {} ms warm-up\n",
        MEASURE.as_millis(),
        WARM_UP.as_millis()
    );
    println!(
        "| limiter | Redis | active keys | grants/s | round trips / grant | Redis commands / call | Redis CPU µs / call | client CPU µs / call | slowest call ms |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for case in cases {
        let calls = case.calls as f64;
        let local = case.contender == Contender::Local;
        let redis = |x: String| if local { "–".to_owned() } else { x };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |",
            case.contender.name(),
            if local { "–" } else { case.topology },
            thousands(case.keys as u64),
            thousands((calls / case.elapsed.as_secs_f64()).round() as u64),
            redis(ratio(case.redis.scripts as f64 / calls)),
            redis(ratio(case.redis.commands as f64 / calls)),
            redis(format!("{:.2}", case.redis.cpu * 1e6 / calls)),
            case.client_cpu.map_or_else(
                || "–".to_owned(),
                |d| format!("{:.2}", d.as_secs_f64() * 1e6 / calls)
            ),
            case.slowest.as_secs_f64() * 1e3,
        );
    }
    println!(
        "\nRound trips are the script calls Redis counted; redis-rate also opens a TCP connection \
         for every call. Commands include those a script runs. Redis CPU is the servers' (the \
         masters' on the cluster) user + system time over the calls made."
    );
    let unknown: Vec<String> = cases
        .iter()
        .filter(|case| case.redis.error_replies > 0)
        .map(|case| {
            format!(
                "{} ({}, {} keys): {}",
                case.contender.name(),
                case.topology,
                thousands(case.keys as u64),
                ratio(case.redis.error_replies as f64 / case.calls as f64)
            )
        })
        .collect();
    if !unknown.is_empty() {
        println!(
            "\nnote: error replies per call to a command Redis does not know (`CLIENT SETINFO`, \
             which a `redis` crate sends on every new connection and Redis 7.0 predates), beside \
             the commands counted: {}.",
            unknown.join("; ")
        );
    }
    for case in cases {
        if let Some(own) = case.paced_round_trips {
            if own != case.redis.scripts {
                println!(
                    "\nnote: {}, {}, {} keys: Redis ran {} script calls, paced's `stats()` counted \
                     {} round trips (the difference: leases given back in the background).",
                    case.contender.name(),
                    case.topology,
                    thousands(case.keys as u64),
                    thousands(case.redis.scripts),
                    thousands(own),
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Part 2: refusals

struct Refusals {
    contender: Contender,
    redis: Counts,
}

async fn refusals(contender: Contender, topology: &Topology, probe: &mut Probe) -> Refusals {
    probe.flush();
    let client = Client::connect(contender, topology, HOURLY_ONE)
        .await
        .expect("every contender runs on one server");
    let name = contender.name();
    let granted = |answer: Result<bool, String>| {
        answer.unwrap_or_else(|e| panic!("{name}: a call failed: {e}"))
    };
    assert!(
        granted(client.try_once("spent").await),
        "{name}: first call refused"
    );
    assert!(
        !granted(client.try_once("spent").await),
        "{name}: second call granted"
    );
    let before = probe.counts();
    for _ in 0..REFUSALS {
        assert!(
            !granted(client.try_once("spent").await),
            "{name}: a call granted"
        );
    }
    let redis = probe.counts() - before;
    assert_eq!(redis.errors, 0, "{name}: Redis answered with errors");
    Refusals { contender, redis }
}

fn print_refusals(rows: &[Refusals]) {
    println!(
        "\n### A refused call: {REFUSALS} calls on a key whose bucket (1 token, 1 per hour) is \
         spent, one at a time, one server\n"
    );
    println!("| limiter | round trips / refusal | Redis commands / refusal | writes / refusal | Redis CPU µs / refusal |");
    println!("|---|---:|---:|---:|---:|");
    for row in rows {
        let n = REFUSALS as f64;
        println!(
            "| {} | {} | {} | {} | {:.2} |",
            row.contender.name(),
            ratio(row.redis.scripts as f64 / n),
            ratio(row.redis.commands as f64 / n),
            ratio(row.redis.writes as f64 / n),
            row.redis.cpu * 1e6 / n,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Part 3: the bound across processes

struct Bound {
    contender: Contender,
    tries: u64,
    grants: usize,
    errors: u64,
    /// The most grants answered within any `WINDOW`.
    by_answer: usize,
    /// The most grants both sent and answered within any `WINDOW`: each of them happened on
    /// Redis within it, so this is at least a real window's count.
    proven: usize,
    bound: f64,
    /// Tokens the quota can give in the run: burst + rate × run.
    quota: f64,
}

fn epoch_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// The most of the sorted `times` (ns) within any half-open window of `width`.
fn max_in_window(times: &[u128], width: Duration) -> usize {
    let mut most = 0;
    let mut first = 0;
    for (last, &t) in times.iter().enumerate() {
        while times[first] + width.as_nanos() <= t {
            first += 1;
        }
        most = most.max(last - first + 1);
    }
    most
}

/// The most grants (sent, answered; ns) whose whole round trip lies within one half-open
/// window of `width`, over the windows starting at a send.
fn max_within_window(grants: &[(u128, u128)], width: Duration) -> usize {
    grants
        .iter()
        .map(|&(start, _)| {
            let end = start + width.as_nanos();
            grants
                .iter()
                .filter(|&&(sent, answered)| sent >= start && answered < end)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// One worker process of part 3: connect, wait for the common start, call for `WORKER_RUN`,
/// print `grant <sent ns> <answered ns>` per grant and `tries <n> errors <n>`.
fn worker(contender: Contender) {
    let url = std::env::var("PACED_BENCH_URL").expect("PACED_BENCH_URL");
    let start_ns: u128 = std::env::var("PACED_BENCH_START")
        .ok()
        .and_then(|s| s.parse().ok())
        .expect("PACED_BENCH_START");
    let topology = Topology {
        name: "one server",
        urls: vec![url],
        cluster: false,
        masters: Vec::new(),
    };
    let out = runtime().block_on(async {
        let client = Arc::new(
            Client::connect(contender, &topology, SHARED)
                .await
                .expect("every contender runs on one server"),
        );
        client.try_once("warm-up").await.expect("a warm-up call");
        let wait = start_ns.saturating_sub(epoch_nanos());
        tokio::time::sleep(Duration::from_nanos(wait as u64)).await;
        let stop = Instant::now() + WORKER_RUN;
        let tasks: Vec<_> = (0..WORKER_TASKS)
            .map(|_| {
                let client = client.clone();
                tokio::spawn(async move {
                    let (mut grants, mut tries, mut errors) = (Vec::new(), 0u64, 0u64);
                    while Instant::now() < stop {
                        tries += 1;
                        let sent = epoch_nanos();
                        match client.try_once("shared").await {
                            Ok(true) => grants.push((sent, epoch_nanos())),
                            Ok(false) => tokio::time::sleep(Duration::from_millis(1)).await,
                            Err(_) => {
                                errors += 1;
                                tokio::time::sleep(Duration::from_millis(1)).await;
                            }
                        }
                    }
                    (grants, tries, errors)
                })
            })
            .collect();
        let mut out = String::new();
        let (mut tries, mut errors) = (0, 0);
        for task in tasks {
            let (grants, t, e) = task.await.expect("a worker task panicked");
            for (sent, answered) in grants {
                out.push_str(&format!("grant {sent} {answered}\n"));
            }
            tries += t;
            errors += e;
        }
        out.push_str(&format!("tries {tries} errors {errors}\n"));
        out
    });
    print!("{out}");
}

fn bound(contender: Contender, server: &Server, probe: &mut Probe) -> Bound {
    probe.flush();
    let exe = std::env::current_exe().expect("this benchmark's path");
    // Time for the workers to start and connect.
    let start = epoch_nanos() + 1_500_000_000;
    let workers: Vec<_> = (0..PROCESSES)
        .map(|_| {
            let child = Command::new(&exe)
                .env(WORKER_ENV, contender.arg())
                .env("PACED_BENCH_URL", server.url())
                .env("PACED_BENCH_START", start.to_string())
                .stdout(Stdio::piped())
                .spawn()
                .expect("a worker starts");
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(child.wait_with_output());
            });
            rx
        })
        .collect();
    let (mut grants, mut tries, mut errors) = (Vec::new(), 0, 0);
    for rx in workers {
        let out = rx
            .recv_timeout(HANG)
            .expect("a worker hangs")
            .expect("a worker's output");
        assert!(out.status.success(), "a worker failed: {out:?}");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields.as_slice() {
                ["grant", sent, answered] => grants.push((
                    sent.parse::<u128>().expect("a time"),
                    answered.parse::<u128>().expect("a time"),
                )),
                ["tries", t, "errors", e] => {
                    tries += t.parse::<u64>().expect("a count");
                    errors += e.parse::<u64>().expect("a count");
                }
                _ => panic!("a worker printed {line:?}"),
            }
        }
    }
    let mut answers: Vec<u128> = grants.iter().map(|&(_, answered)| answered).collect();
    answers.sort_unstable();
    let rate = SHARED_RATE as f64;
    let burst = contender.burst(SHARED) as f64;
    let age = match contender {
        Contender::PacedLeased => LEASE_AGE.as_secs_f64(),
        Contender::PacedLeasedLong => LONG_LEASE_AGE.as_secs_f64(),
        _ => 0.0,
    };
    Bound {
        contender,
        tries,
        grants: grants.len(),
        errors,
        by_answer: max_in_window(&answers, WINDOW),
        proven: max_within_window(&grants, WINDOW),
        bound: burst + rate * (WINDOW.as_secs_f64() + age),
        quota: burst + rate * WORKER_RUN.as_secs_f64(),
    }
}

fn print_bounds(rows: &[Bound]) {
    println!(
        "\n### {PROCESSES} processes × {WORKER_TASKS} tasks on one key at {SHARED_RATE}/s, burst \
         {SHARED_BURST}, `try_acquire` for {} s (1 ms pause after a refusal), one server\n",
        WORKER_RUN.as_secs()
    );
    let ms = WINDOW.as_millis();
    println!(
        "| limiter | burst | calls | grants (burst + rate × run) | most grants answered in any {ms} ms | most sent and answered in any {ms} ms | bound | kept |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    for row in rows {
        let kept = if row.errors > 0 {
            format!("{} errors", row.errors)
        } else if row.proven as f64 > row.bound {
            "**no**".to_owned()
        } else if row.by_answer as f64 > row.bound {
            "no window proven over".to_owned()
        } else {
            "yes".to_owned()
        };
        println!(
            "| {} | {} | {} | {} ({:.0}) | {} | {} | {:.0} | {} |",
            row.contender.name(),
            row.contender.burst(SHARED),
            thousands(row.tries),
            thousands(row.grants as u64),
            row.quota,
            row.by_answer,
            row.proven,
            row.bound,
            kept,
        );
    }
    println!(
        "\nA grant happened on Redis between its call's send and its answer: a window's count by \
         answer time may include grants made up to a round trip before it; the grants both sent \
         and answered within a window all happened in it (a lower bound of its real count, so a \
         count above the bound there proves a breach). The bound is burst + rate × {ms} ms, plus \
         rate × lease age with a lease. redis-rate cannot take a burst below the tokens of one \
         period: it runs at burst {SHARED_RATE}."
    );
}

// ---------------------------------------------------------------------------------------------

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("current-thread runtime")
}

async fn within<F: std::future::Future>(phase: &str, future: F) -> F::Output {
    tokio::time::timeout(HANG, future)
        .await
        .unwrap_or_else(|_| panic!("{phase}: no answer within {HANG:?}, it hangs"))
}

fn throughput_rows(rt: &Runtime, topology: &Topology, cases: &mut Vec<Case>) {
    let mut probe = Probe::new(&topology.masters);
    for keys in key_counts() {
        let names = Arc::new((0..keys).map(|i| format!("tenant-{i}")).collect::<Vec<_>>());
        let others = [Contender::PacedSeveral, Contender::Local];
        for contender in Contender::REDIS.into_iter().chain(others) {
            if !selected(contender) {
                continue;
            }
            let phase = format!("{contender:?} {} {keys}", topology.name);
            let case = rt.block_on(within(
                &phase,
                throughput(contender, topology, &mut probe, &names),
            ));
            cases.extend(case);
        }
    }
}

/// Whether the throughput rows run `contender`: all, or those listed (comma separated, by
/// their command-line names: `paced`, `paced-several`, `throttle-kit`, ...) in
/// `PACED_BENCH_ONLY`.
fn selected(contender: Contender) -> bool {
    std::env::var(ONLY_ENV).map_or(true, |list| {
        list.split(',').any(|a| a.trim() == contender.arg())
    })
}

/// The active key counts of the throughput rows: `KEY_COUNTS`, or those listed (comma
/// separated) in `PACED_BENCH_KEYS`, which also leaves out the cluster, refusal and bound parts
/// (a quick run of the one-server rows).
fn key_counts() -> Vec<usize> {
    match std::env::var(QUICK_ENV) {
        Ok(list) => list
            .split(',')
            .map(|n| n.trim().parse().expect("PACED_BENCH_KEYS: key counts"))
            .collect(),
        Err(_) => KEY_COUNTS.to_vec(),
    }
}

fn main() {
    if let Ok(which) = std::env::var(WORKER_ENV) {
        worker(Contender::from_arg(&which).expect("a known contender"));
        return;
    }
    if !installed("redis-server") {
        println!("redis-server is not installed: skipping the keyed Redis benchmark");
        return;
    }
    let total = Instant::now();
    println!("load average at the start: {}", load_average());
    let rt = runtime();

    let server = Server::start();
    let node = Topology {
        name: "one server",
        urls: vec![server.url()],
        cluster: false,
        masters: vec![server.port],
    };
    let mut cases = Vec::new();
    throughput_rows(&rt, &node, &mut cases);
    if std::env::var_os(QUICK_ENV).is_some() {
        print_throughput(&cases);
        return;
    }

    if installed("redis-cli") {
        let cluster = Cluster::start();
        let topology = Topology {
            name: "cluster, 3 masters",
            urls: cluster.urls(),
            cluster: true,
            masters: cluster.masters(),
        };
        assert_eq!(topology.masters.len(), 3, "three masters");
        throughput_rows(&rt, &topology, &mut cases);
    } else {
        println!("redis-cli is not installed: skipping the Redis Cluster rows");
    }
    print_throughput(&cases);

    let mut probe = Probe::new(&node.masters);
    let rows: Vec<_> = Contender::REDIS
        .into_iter()
        .map(|c| rt.block_on(within("refusals", refusals(c, &node, &mut probe))))
        .collect();
    print_refusals(&rows);

    let rows: Vec<_> = Contender::REDIS
        .into_iter()
        .map(|c| bound(c, &server, &mut probe))
        .collect();
    print_bounds(&rows);

    drop(rt);
    drop(server);
    println!(
        "\nload average at the end: {}; total run time {:.1} s",
        load_average(),
        total.elapsed().as_secs_f64()
    );
}
