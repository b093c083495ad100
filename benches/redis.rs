//! `RedisRateLimiter` against a real, private `redis-server` on loopback, beside the in-process
//! `RateLimiter`: what a grant costs, and what a binding shared quota achieves.
//!
//! 1. `try_acquire(1)` with a limit that never binds (1e6/s, burst 1e9), on a current-thread
//!    runtime: `SAMPLES` calls, each timed on its own with `std::time::Instant` around the await,
//!    after `WARM_UP` untimed calls; p50/p90/p99/p99.9/max/mean come from those samples. Grants/s
//!    comes from a second loop of `SAMPLES` calls with no per-call clock reads. Every call of both
//!    loops is counted, and the run fails unless all of them were granted (and, for Redis, the
//!    limiter's own counters show no refusal and no error), so a refusal is never measured as a
//!    grant. Rows: a bare `PING` on the same kind of connection (the floor of one round trip);
//!    Redis without leases (one script call per grant); Redis with `.lease(100, 5 ms)` (one
//!    round trip per 100 grants, the rest local); the in-process `RateLimiter`.
//! 2. `acquire(1)` in a loop for `BINDING_RUN` with a binding limit (`BIND_RATE`/s, burst
//!    `BIND_BURST`), without and with `.lease(50, 5 ms)`, from one task and from `TASKS` tasks
//!    sharing the limiter (one task without a lease makes one round trip per grant, which may
//!    be too slow for the limit to bind; a note is printed when no round trip was refused): grants/s
//!    achieved, round trips per 1,000 grants (from `stats()`). Every grant is stamped (sent,
//!    received) and the run fails if any window of grants exceeds
//!    `burst + rate * (span + lease age)`; the worst window is printed.
//!
//! The server is started on a free loopback port without persistence, as in `tests/redis.rs`,
//! and killed at the end, also on a panic (`Drop`). Every phase runs under a timeout, so a hang
//! fails the run instead of stalling it.
//!
//! Run: `cargo bench -p paced-benches --features redis --bench redis`

use std::hint::black_box;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use paced::redis::RedisStats;
use paced::{Rate, RateLimiter, RedisRateLimiter};
use tokio::runtime::Runtime;

/// Untimed calls before each measured case.
const WARM_UP: usize = 2_000;
/// Calls per measured loop.
const SAMPLES: usize = 20_000;
/// The limit that never binds: 1e6 tokens per second, a bucket of 1e9 (no run comes near
/// draining it). Not 1e9/s: the script keeps microseconds in doubles (Lua numbers), whose step
/// near today's Redis `TIME` (~1.8e15 µs) is 0.25 µs, so a 0.001 µs token would round to no
/// charge at all and every call would take the script's `DEL` path instead of the `SET` a real
/// quota pays for. 1 µs per token is exact, and each grant stores the key as it would under load.
const FREE_RATE: u64 = 1_000_000;
const FREE_BURST: u64 = 1_000_000_000;
/// Lease of the non-binding case: 100 tokens, 5 ms.
const FREE_LEASE: u64 = 100;
/// The binding limit: 20,000 per second, a bucket of 100, for about a second.
const BIND_RATE: u64 = 20_000;
const BIND_BURST: u64 = 100;
const BIND_LEASE: u64 = 50;
const BINDING_RUN: Duration = Duration::from_secs(1);
/// Tasks sharing the limiter in the concurrent binding runs.
const TASKS: usize = 8;
const LEASE_AGE: Duration = Duration::from_millis(5);
/// The longest any one phase may take before the run is declared hung.
const HANG: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// The private redis-server

/// A private redis-server on a free loopback port; killed when dropped.
struct Server {
    port: u16,
    child: Child,
}

impl Server {
    fn start() -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed for this benchmark");
        let server = Server { port, child };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let client = redis::Client::open(server.url()).expect("url");
            if let Ok(mut conn) = client.get_connection() {
                if redis::cmd("PING").query::<String>(&mut conn).is_ok() {
                    return server;
                }
            }
            assert!(Instant::now() < deadline, "redis-server did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// Part 1: the cost of a grant

/// One row of the latency table.
struct Row {
    name: String,
    /// Per-call latencies in nanoseconds, sorted.
    sorted: Vec<u64>,
    /// Grants per second of the loop without per-call clock reads.
    grants_per_s: f64,
    /// Round trips per 1,000 grants, for the Redis rows.
    round_trips_per_1000: Option<f64>,
}

/// The nearest-rank percentile `p` (0 < p <= 100) of sorted samples.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn micros(nanos: f64) -> String {
    format!("{:.2}", nanos / 1_000.0)
}

/// Runs `WARM_UP` untimed calls, then `SAMPLES` calls timed one by one, then `SAMPLES` calls
/// timed as a whole; every call must return `true` (granted).
async fn measure<F, Fut>(name: &str, mut call: F) -> (Vec<u64>, f64)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut ok = 0;
    for _ in 0..WARM_UP {
        ok += usize::from(call().await);
    }
    assert_eq!(
        ok, WARM_UP,
        "{name}: {ok} of {WARM_UP} warm-up calls granted"
    );

    let mut samples = Vec::with_capacity(SAMPLES);
    let mut ok = 0;
    for _ in 0..SAMPLES {
        let start = Instant::now();
        let granted = call().await;
        samples.push(start.elapsed().as_nanos() as u64);
        ok += usize::from(granted);
    }
    assert_eq!(ok, SAMPLES, "{name}: {ok} of {SAMPLES} timed calls granted");
    samples.sort_unstable();

    let mut ok = 0;
    let start = Instant::now();
    for _ in 0..SAMPLES {
        ok += usize::from(black_box(call().await));
    }
    let took = start.elapsed();
    assert_eq!(
        ok, SAMPLES,
        "{name}: {ok} of {SAMPLES} throughput calls granted"
    );
    (samples, SAMPLES as f64 / took.as_secs_f64())
}

/// Checks a Redis limiter's own counters after `calls` calls of `try_acquire(1)`: all granted,
/// none refused, no error, and `from_lease` as expected.
fn check_counters(name: &str, stats: RedisStats, calls: u64, leased: bool) {
    assert_eq!(stats.granted, calls, "{name}: {stats:?}");
    assert_eq!(stats.rejected, 0, "{name}: refusals: {stats:?}");
    assert_eq!(stats.errors, 0, "{name}: errors: {stats:?}");
    assert_eq!(stats.fallback, 0, "{name}: fallback grants: {stats:?}");
    if leased {
        assert_eq!(
            stats.from_lease + stats.round_trips,
            calls,
            "{name}: every grant is from a lease or a round trip: {stats:?}"
        );
    } else {
        assert_eq!(stats.from_lease, 0, "{name}: {stats:?}");
        assert_eq!(stats.round_trips, calls, "{name}: {stats:?}");
    }
}

async fn redis_row(url: &str, key: &str, lease: Option<u64>) -> Row {
    let mut builder = RedisRateLimiter::builder(url, key, Rate::per_second(FREE_RATE), FREE_BURST);
    if let Some(tokens) = lease {
        builder = builder.lease(tokens, LEASE_AGE);
    }
    let quota = builder.build().expect("a valid configuration");
    let name = match lease {
        None => "paced RedisRateLimiter::try_acquire(1), no lease".to_owned(),
        Some(n) => format!(
            "paced RedisRateLimiter::try_acquire(1), lease({n}, {} ms)",
            LEASE_AGE.as_millis()
        ),
    };
    let (sorted, grants_per_s) =
        measure(&name, || async { quota.try_acquire(1).await.is_ok() }).await;
    let calls = (WARM_UP + 2 * SAMPLES) as u64;
    let stats = quota.stats();
    check_counters(&name, stats, calls, lease.is_some());
    Row {
        name,
        sorted,
        grants_per_s,
        round_trips_per_1000: Some(stats.round_trips as f64 * 1_000.0 / calls as f64),
    }
}

async fn ping_row(url: &str) -> Row {
    let client = redis::Client::open(url).expect("url");
    let conn = client
        .get_connection_manager()
        .await
        .expect("a connection to the private server");
    let name = "baseline: redis PING (ConnectionManager), one round trip".to_owned();
    let (sorted, grants_per_s) = measure(&name, || {
        let mut conn = conn.clone();
        async move {
            let pong: Result<String, _> = redis::cmd("PING").query_async(&mut conn).await;
            pong.as_deref() == Ok("PONG")
        }
    })
    .await;
    Row {
        name,
        sorted,
        grants_per_s,
        round_trips_per_1000: Some(1_000.0),
    }
}

async fn local_row() -> Row {
    let limiter = RateLimiter::new(Rate::per_second(FREE_RATE), FREE_BURST);
    let name = "paced RateLimiter::try_acquire(1), in-process".to_owned();
    let (sorted, grants_per_s) = measure(&name, || {
        let granted = limiter.try_acquire(1).is_ok();
        async move { granted }
    })
    .await;
    let stats = limiter.stats();
    let calls = (WARM_UP + 2 * SAMPLES) as u64;
    assert_eq!(stats.granted, calls, "{name}: {stats:?}");
    assert_eq!(stats.rejected, 0, "{name}: {stats:?}");
    Row {
        name,
        sorted,
        grants_per_s,
        round_trips_per_1000: None,
    }
}

fn print_latency_table(rows: &[Row]) {
    println!(
        "\n### try_acquire(1), limit never binding ({FREE_RATE}/s, burst {FREE_BURST}), \
         current-thread runtime, {SAMPLES} timed calls after {WARM_UP} warm-up\n"
    );
    println!(
        "| case | grants/s | mean µs | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs | round trips / 1000 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let s = &row.sorted;
        let mean = s.iter().sum::<u64>() as f64 / s.len() as f64;
        let rt = row
            .round_trips_per_1000
            .map_or_else(|| "–".to_owned(), |r| format!("{r:.1}"));
        println!(
            "| {} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
            row.name,
            row.grants_per_s,
            micros(mean),
            micros(percentile(s, 50.0) as f64),
            micros(percentile(s, 90.0) as f64),
            micros(percentile(s, 99.0) as f64),
            micros(percentile(s, 99.9) as f64),
            micros(*s.last().expect("samples") as f64),
            rt,
        );
    }
    println!(
        "\nLatency is `Instant::now()` around each await (the two clock reads, ~20-40 ns, are \
         included); grants/s is a separate loop of {SAMPLES} calls without them. With a lease of \
         {FREE_LEASE}, one call in {FREE_LEASE} makes the round trip, so p99 sits on the boundary \
         between local and remote calls; p99.9 and max show the round trips."
    );
}

// ---------------------------------------------------------------------------------------------
// Part 2: a binding limit

struct Binding {
    name: String,
    grants: u64,
    elapsed: Duration,
    /// Round trips during the run.
    round_trips: u64,
    /// Grants served from a lease during the run.
    from_lease: u64,
    /// The largest (grants in a window) - rate * (window span) over all windows.
    worst_excess: f64,
    allowed_excess: f64,
}

/// The largest `count(i..=j) - rate * (received_j - start_i)` over all windows `i..=j` of
/// `stamps` (sent, received) sorted by receipt, where `start_i` is the earliest send among
/// `i..`: every grant of the window happened on Redis after its own send, hence after
/// `start_i`, and before its receipt, hence before `received_j`. O(n): for each `j`, the best
/// `i` maximises `rate * start_i - i`.
fn worst_excess(stamps: &[(f64, f64)], rate: f64) -> f64 {
    let mut starts: Vec<f64> = stamps.iter().map(|&(sent, _)| sent).collect();
    for i in (0..starts.len().saturating_sub(1)).rev() {
        starts[i] = starts[i].min(starts[i + 1]);
    }
    let mut best_start = f64::NEG_INFINITY;
    let mut worst = f64::NEG_INFINITY;
    for (j, &(_, received)) in stamps.iter().enumerate() {
        best_start = best_start.max(rate * starts[j] - j as f64);
        worst = worst.max((j + 1) as f64 - rate * received + best_start);
    }
    worst
}

/// `tasks` tasks on one limiter, each calling `acquire(1)` in a loop for `BINDING_RUN`.
async fn binding_run(url: &str, key: &str, tasks: usize, lease: Option<u64>) -> Binding {
    let mut builder = RedisRateLimiter::builder(url, key, Rate::per_second(BIND_RATE), BIND_BURST);
    if let Some(tokens) = lease {
        builder = builder.lease(tokens, LEASE_AGE);
    }
    let quota = builder.build().expect("a valid configuration");
    let lease_name = match lease {
        None => "no lease".to_owned(),
        Some(n) => format!("lease({n}, {} ms)", LEASE_AGE.as_millis()),
    };
    let name = format!(
        "acquire(1), {lease_name}, {tasks} task{}",
        if tasks == 1 { "" } else { "s" }
    );
    // Connect and load the script with one grant, give back any lease and let the bucket
    // refill (100 tokens at 20,000/s take 5 ms), so that the run starts with a warm connection
    // and a full bucket; the counters are read relative to this point.
    quota.acquire(1).await.expect("warm-up grant");
    quota.return_lease().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = quota.stats();

    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let quota = quota.clone();
            let name = name.clone();
            tokio::spawn(async move {
                let mut stamps = Vec::new();
                while start.elapsed() < BINDING_RUN {
                    let sent = start.elapsed().as_secs_f64();
                    quota
                        .acquire(1)
                        .await
                        .unwrap_or_else(|e| panic!("{name}: acquire failed: {e}"));
                    stamps.push((sent, start.elapsed().as_secs_f64()));
                }
                stamps
            })
        })
        .collect();
    let mut stamps = Vec::new();
    for handle in handles {
        stamps.extend(handle.await.expect("a binding task panicked"));
    }
    let elapsed = start.elapsed();
    stamps.sort_by(|a, b| a.1.total_cmp(&b.1));
    let stats = quota.stats();
    let grants = stamps.len() as u64;
    assert_eq!(stats.granted - before.granted, grants, "{name}: {stats:?}");
    assert_eq!(stats.errors, 0, "{name}: {stats:?}");
    assert_eq!(stats.fallback, 0, "{name}: {stats:?}");

    let rate = BIND_RATE as f64;
    let age = if lease.is_some() {
        LEASE_AGE.as_secs_f64()
    } else {
        0.0
    };
    let worst = worst_excess(&stamps, rate);
    let allowed = BIND_BURST as f64 + rate * age;
    assert!(
        worst <= allowed + 1e-6,
        "{name}: a window holds {worst:.1} grants beyond rate × span, allowed {allowed:.1}"
    );
    Binding {
        name,
        grants,
        elapsed,
        round_trips: stats.round_trips - before.round_trips,
        from_lease: stats.from_lease - before.from_lease,
        worst_excess: worst,
        allowed_excess: allowed,
    }
}

fn print_binding_table(runs: &[Binding]) {
    println!(
        "\n### acquire(1) in a loop for {BINDING_RUN:?}, binding limit {BIND_RATE}/s, burst \
         {BIND_BURST}, current-thread runtime\n"
    );
    println!(
        "| case | grants | elapsed s | grants/s | of rate | bound burst+rate·t | round trips | refused round trips | round trips / 1000 grants | from lease | worst window excess (allowed) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for run in runs {
        let secs = run.elapsed.as_secs_f64();
        let per_s = run.grants as f64 / secs;
        let bound = BIND_BURST as f64 + BIND_RATE as f64 * secs;
        // Every round trip either granted (one grant not from a lease) or was refused.
        let refused = run.round_trips - (run.grants - run.from_lease);
        println!(
            "| {} | {} | {:.3} | {:.0} | {:.1} % | {:.0} | {} | {} | {:.1} | {} | {:.1} ({:.0}) |",
            run.name,
            run.grants,
            secs,
            per_s,
            100.0 * per_s / BIND_RATE as f64,
            bound,
            run.round_trips,
            refused,
            run.round_trips as f64 * 1_000.0 / run.grants as f64,
            run.from_lease,
            run.worst_excess,
            run.allowed_excess,
        );
    }
    println!(
        "\n\"worst window excess\" is the largest (grants in a window) − rate × (window span, \
         earliest send to last receipt) over all windows: at most the burst, plus rate × lease \
         age with leases (a leased token is charged up to that long before it is spent)."
    );
    for run in runs {
        let per_s = run.grants as f64 / run.elapsed.as_secs_f64();
        let refused = run.round_trips - (run.grants - run.from_lease);
        if refused == 0 {
            println!(
                "\nnote: {}: no round trip was refused, so the limit never bound: {per_s:.0} \
                 grants/s is what {} round trips in {:.3} s ({:.1} µs each on average) allow.",
                run.name,
                run.round_trips,
                run.elapsed.as_secs_f64(),
                run.elapsed.as_secs_f64() * 1e6 / run.round_trips as f64,
            );
        }
    }
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
        .unwrap_or_else(|_| panic!("{phase}: no answer within {HANG:?}, the limiter hangs"))
}

fn main() {
    let server = Server::start();
    let url = server.url();
    let rt = runtime();
    let total = Instant::now();

    let rows = rt.block_on(async {
        vec![
            within("PING", ping_row(&url)).await,
            within("no lease", redis_row(&url, "free-plain", None)).await,
            within("lease", redis_row(&url, "free-leased", Some(FREE_LEASE))).await,
            within("local", local_row()).await,
        ]
    });
    print_latency_table(&rows);

    let runs = rt.block_on(async {
        let mut runs = Vec::new();
        for (tasks, lease) in [
            (1, None),
            (1, Some(BIND_LEASE)),
            (TASKS, None),
            (TASKS, Some(BIND_LEASE)),
        ] {
            let key = format!("bind-{tasks}-{}", lease.unwrap_or(0));
            runs.push(within(&key, binding_run(&url, &key, tasks, lease)).await);
        }
        runs
    });
    print_binding_table(&runs);

    // Stop the runtime, and whatever lease return it still holds, before the server.
    drop(rt);
    drop(server);
    println!("\ntotal run time {:.1} s", total.elapsed().as_secs_f64());
}
