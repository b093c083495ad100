//! `RedisRateLimiter<[u64; 2]>` (two limits of one quota in one key, one script call) against the
//! one-limit `RedisRateLimiter`, on one private `redis-server` on loopback: what a grant
//! costs when a request is checked against two limits at once.
//!
//! `TASKS` tasks on a current-thread runtime share one limiter (one multiplexed connection)
//! and each calls `try_acquire` `CALLS / TASKS` times, with limits that never bind (1e6/s,
//! bucket 1e9 on every limit; see `benches/redis.rs` on why not faster): the one-limit
//! limiter's `try_acquire(1)`, no lease (the script's one-bucket form); the same one limit in
//! the script's general form (`RedisRateLimiter<[u64; 1]>::try_acquire([1])`, a bucket on
//! "requests"); the two-limit limiter's `try_acquire([1, 1])` (a bucket on
//! "requests" and one on "tokens"); and the same with `.lease([100, 100], 5 ms)` (one round
//! trip per 101 grants while the lease lasts). Each row runs `ROUNDS` times, alternating, after
//! `WARM_UP` untimed calls; the run fails unless every call was granted and the limiter's own
//! counters show no refusal and no error. Printed: grants/s (median and best round), round
//! trips per grant (`stats().round_trips / stats().granted`; the goal is 1), and Redis's own
//! cost over the measured rounds (`INFO commandstats` and `cpu` before and after each round):
//! the microseconds Redis spent in `EVALSHA` per call (the script's CPU: Redis runs one script
//! at a time, so this bounds the throughput) and its whole CPU time per call (with the network
//! I/O), per grant; and this process's CPU time per grant (the client's side).
//!
//! Skipped (with a message) when `redis-server` is not installed.
//!
//! Run: `cargo bench -p paced-benches --features redis --bench redis_multi`

use std::time::{Duration, Instant};

use paced::redis::RedisStats;
use paced::{Limit, Rate, RedisRateLimiter};

#[allow(dead_code)]
#[path = "common/redis_servers.rs"]
mod servers;
use servers::{installed, Server};

/// Tasks sharing one limiter.
const TASKS: usize = 32;
/// Calls per measured round, over all tasks.
const CALLS: usize = 64_000;
/// Untimed calls before the first round of each row.
const WARM_UP: usize = 4_000;
/// Measured rounds of each row, alternating between the rows.
const ROUNDS: usize = 5;
/// The limit that never binds: 1e6 tokens per second, a bucket of 1e9.
const FREE_RATE: u64 = 1_000_000;
const FREE_BURST: u64 = 1_000_000_000;
/// The longest any one round may take before the run is declared hung.
const HANG: Duration = Duration::from_secs(60);

#[derive(Clone)]
enum Contender {
    One(RedisRateLimiter),
    OneDim(RedisRateLimiter<[u64; 1]>),
    Two(RedisRateLimiter<[u64; 2]>),
    Leased(RedisRateLimiter<[u64; 2]>),
}

impl Contender {
    fn name(&self) -> &'static str {
        match self {
            Contender::One(_) => "RedisRateLimiter::try_acquire(1), one limit",
            Contender::OneDim(_) => "RedisRateLimiter<[u64; 1]>::try_acquire([1]), one limit",
            Contender::Two(_) => "RedisRateLimiter<[u64; 2]>::try_acquire([1, 1]), two limits",
            Contender::Leased(_) => "the same, lease([100, 100], 5 ms)",
        }
    }

    async fn try_acquire(&self) -> bool {
        match self {
            Contender::One(l) => l.try_acquire(1).await.is_ok(),
            Contender::OneDim(l) => l.try_acquire([1]).await.is_ok(),
            Contender::Two(l) | Contender::Leased(l) => l.try_acquire([1, 1]).await.is_ok(),
        }
    }

    fn stats(&self) -> RedisStats {
        match self {
            Contender::One(l) => l.stats(),
            Contender::OneDim(l) => l.stats(),
            Contender::Two(l) | Contender::Leased(l) => l.stats(),
        }
    }
}

/// Redis's running totals: `EVALSHA` calls and microseconds, and its CPU time in seconds; and
/// this process's CPU time in seconds.
#[derive(Clone, Copy, Default)]
struct Totals {
    calls: u64,
    usec: u64,
    cpu: f64,
    client_cpu: f64,
}

impl Totals {
    fn read(conn: &mut redis::Connection) -> Totals {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .arg("cpu")
            .query(conn)
            .expect("INFO");
        let mut totals = Totals {
            client_cpu: process_cpu(),
            ..Totals::default()
        };
        for line in info.lines() {
            if let Some(list) = line.strip_prefix("cmdstat_evalsha:") {
                totals.calls = info_field(list, "calls");
                totals.usec = info_field(list, "usec");
            } else if let Some(secs) = line
                .strip_prefix("used_cpu_sys:")
                .or_else(|| line.strip_prefix("used_cpu_user:"))
            {
                totals.cpu += secs.trim().parse::<f64>().unwrap_or(0.0);
            }
        }
        totals
    }

    fn since(self, before: Totals) -> Totals {
        Totals {
            calls: self.calls - before.calls,
            usec: self.usec - before.usec,
            cpu: self.cpu - before.cpu,
            client_cpu: self.client_cpu - before.client_cpu,
        }
    }

    fn add(&mut self, other: Totals) {
        self.calls += other.calls;
        self.usec += other.usec;
        self.cpu += other.cpu;
        self.client_cpu += other.client_cpu;
    }
}

/// This process's CPU time, user and system, in seconds, from `/proc/self/stat` (in ticks of
/// 10 ms); 0 where there is no such file.
fn process_cpu() -> f64 {
    let ticks = || -> Option<u64> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let after_name = stat.get(stat.rfind(')')? + 1..)?;
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        // Fields 14 and 15 of the file (utime, stime); this list starts at field 3.
        Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
    };
    ticks().map_or(0.0, |t| t as f64 / 100.0)
}

fn info_field(list: &str, key: &str) -> u64 {
    list.split(',')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `calls` calls over `TASKS` tasks; the number granted and the elapsed time.
async fn round(limiter: &Contender, calls: usize) -> (u64, Duration) {
    let start = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let mut granted = 0u64;
                for _ in 0..calls / TASKS {
                    granted += u64::from(limiter.try_acquire().await);
                }
                granted
            })
        })
        .collect();
    let mut granted = 0;
    for task in tasks {
        granted += task.await.expect("a task");
    }
    (granted, start.elapsed())
}

fn main() {
    if !installed("redis-server") {
        println!("redis-server is not installed: skipping the multi-limit Redis benchmark");
        return;
    }
    let server = Server::start();
    let url = server.url();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("current-thread runtime");
    let rate = Rate::per_second(FREE_RATE);
    let one = rt.block_on(async {
        RedisRateLimiter::builder(&url, "one", rate, FREE_BURST)
            .build()
            .expect("a valid configuration")
    });
    let one_dim = rt.block_on(async {
        RedisRateLimiter::dimensions(&url, "one-dim", ["requests"])
            .limit("requests", Limit::bucket(rate, FREE_BURST))
            .build()
            .expect("a valid configuration")
    });
    let two = rt.block_on(async {
        RedisRateLimiter::dimensions(&url, "two", ["requests", "tokens"])
            .limit("requests", Limit::bucket(rate, FREE_BURST))
            .limit("tokens", Limit::bucket(rate, FREE_BURST))
            .build()
            .expect("a valid configuration")
    });
    let leased = rt.block_on(async {
        RedisRateLimiter::dimensions(&url, "leased", ["requests", "tokens"])
            .limit("requests", Limit::bucket(rate, FREE_BURST))
            .limit("tokens", Limit::bucket(rate, FREE_BURST))
            .lease([100, 100], Duration::from_millis(5))
            .build()
            .expect("a valid configuration")
    });
    let rows = [
        Contender::One(one),
        Contender::OneDim(one_dim),
        Contender::Two(two),
        Contender::Leased(leased),
    ];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut redis_cost = vec![Totals::default(); rows.len()];
    let mut probe = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .expect("a connection to read Redis's counters");
    rt.block_on(async {
        for row in &rows {
            let (granted, _) = round(row, WARM_UP).await;
            assert_eq!(
                granted as usize,
                WARM_UP,
                "{}: a warm-up call refused",
                row.name()
            );
        }
        for _ in 0..ROUNDS {
            for (i, row) in rows.iter().enumerate() {
                let before = Totals::read(&mut probe);
                let (granted, elapsed) = tokio::time::timeout(HANG, round(row, CALLS))
                    .await
                    .unwrap_or_else(|_| panic!("{}: hung", row.name()));
                assert_eq!(granted as usize, CALLS, "{}: a call refused", row.name());
                rates[i].push(granted as f64 / elapsed.as_secs_f64());
                redis_cost[i].add(Totals::read(&mut probe).since(before));
            }
        }
    });
    println!(
        "{TASKS} tasks, {CALLS} calls a round, {ROUNDS} rounds a row, limits that never bind \
         ({FREE_RATE}/s, bucket {FREE_BURST}), one private redis-server on loopback"
    );
    println!(
        "{:<58} {:>14} {:>14} {:>18} {:>16} {:>19} {:>20}",
        "row",
        "grants/s med",
        "grants/s best",
        "round trips/grant",
        "EVALSHA us/call",
        "Redis CPU us/grant",
        "client CPU us/grant"
    );
    for ((row, rates), cost) in rows.iter().zip(&mut rates).zip(&redis_cost) {
        let stats = row.stats();
        let calls = (WARM_UP + ROUNDS * CALLS) as u64;
        assert_eq!(stats.granted, calls, "{}: {stats:?}", row.name());
        assert_eq!(
            stats.rejected + stats.errors,
            0,
            "{}: {stats:?}",
            row.name()
        );
        rates.sort_by(f64::total_cmp);
        let calls = cost.calls.max(1) as f64;
        let grants = (ROUNDS * CALLS) as f64;
        println!(
            "{:<58} {:>14.0} {:>14.0} {:>18.3} {:>16.2} {:>19.2} {:>20.2}",
            row.name(),
            rates[rates.len() / 2],
            rates[rates.len() - 1],
            stats.round_trips as f64 / stats.granted as f64,
            cost.usec as f64 / calls,
            cost.cpu * 1e6 / grants,
            cost.client_cpu * 1e6 / grants
        );
    }
}
