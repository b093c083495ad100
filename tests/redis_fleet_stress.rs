//! A fleet under stress on real servers: 4 processes, each on a multi-thread runtime of 8
//! workers with 64 tasks on one `RedisRateLimiter` handle, acquiring random costs on a
//! two-limit quota (requests and tokens) and settling them up and down; mid-run the test
//! `kill -9`s `redis-server` and starts it again. The server keeps an append-only file synced
//! before every reply, so the restart keeps every charge it answered: one without its data would
//! forget the reservations it had scheduled (see the guide's "Faults"). Under each policy
//! the merged timeline keeps every limit's documented bound in every window, with an allowance
//! of one round trip plus the tick.
#![cfg(feature = "redis")]

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use paced::redis::{FailurePolicy, RedisRateLimiter};
use paced::{Limit, Rate};

#[allow(dead_code)]
#[path = "common/redis_server.rs"]
mod redis_server;
use redis_server::Server;

const WORKER: &str = "PACED_STRESS_WORKER";
const PROCESSES: usize = 4;
const TASKS: usize = 64;
const WORKERS: usize = 8;
/// How long each process acquires.
const RUN: Duration = Duration::from_millis(3_000);
/// When the harness kills Redis, and for how long it stays down.
const KILL_AFTER: Duration = Duration::from_millis(1_200);
const DOWN_FOR: Duration = Duration::from_millis(300);
/// The buckets: requests 80/s, 10 at once; tokens 1,500/s, 200 at once.
const LIMITS: [(f64, u64); 2] = [(80.0, 10), (1_500.0, 200)];
/// Each process's fail-open share.
const SHARE: f64 = 0.25;
/// A round trip plus tokio's tick and a busy machine's scheduling: a grant is stamped when its
/// task runs again, and 4 processes of 8 workers on the 2-core CI machine have been seen to
/// stamp one 26 ms after the bound allowed it (25 ms was this allowance before).
const SLACK: Duration = Duration::from_millis(30);

fn wall_ns() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn policy(open: bool) -> FailurePolicy {
    if open {
        FailurePolicy::FailOpen { share: SHARE }
    } else {
        FailurePolicy::FailClosed {
            max_backoff: Duration::from_millis(50),
            deadline: Duration::from_secs(30),
        }
    }
}

/// A worker process: `<url> <fail-open 0|1> <seed>`. Prints one line of events, each
/// `ns,task,grant,tokens`: a grant charges its estimate, a settle its signed correction.
#[test]
#[ignore = "a worker process, which the tests of this file start with its arguments"]
fn worker_process() {
    let Ok(args) = std::env::var(WORKER) else {
        return;
    };
    let args: Vec<&str> = args.lines().collect();
    let [url, open, seed] = args[..] else {
        panic!("unknown worker arguments: {args:?}");
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
        .unwrap();
    let events = runtime.block_on(async {
        let quota = RedisRateLimiter::dimensions(url, "stress", ["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_second(80), LIMITS[0].1))
            .limit(
                "tokens",
                Limit::bucket(Rate::per_second(1_500), LIMITS[1].1),
            )
            .failure_policy(policy(open == "1"))
            .build()
            .unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let end = Instant::now() + RUN;
        let seed: u64 = seed.parse().unwrap();
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let (quota, events) = (quota.clone(), events.clone());
                let mut seed = seed * 1_000 + task as u64;
                tokio::spawn(async move {
                    while Instant::now() < end {
                        seed = seed
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1_442_695_040_888_963_407);
                        let estimate = 1 + (seed >> 33) % 40;
                        let permit = quota.acquire([1, estimate]).await.unwrap();
                        let granted = wall_ns();
                        // Up (a cost already spent) one time in four, else down to about half.
                        let actual = if (seed >> 40) % 4 == 0 {
                            estimate + 1 + (seed >> 45) % 10
                        } else {
                            estimate.div_ceil(2)
                        };
                        let settled = permit.settle([1, actual]).await;
                        let mut events = events.lock().unwrap();
                        events.push(format!("{granted},{task},1,{estimate}"));
                        // A settle that failed (Redis down) corrected nothing.
                        if settled.is_ok() {
                            let delta = actual as i64 - estimate as i64;
                            events.push(format!("{},{task},0,{delta}", wall_ns()));
                        }
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let mut events = events.lock().unwrap();
        std::mem::take(&mut *events)
    });
    println!("worker: {}", events.join(" "));
}

/// One event of the merged timeline: at `ns`, by `process`, `cost` per limit
/// (a grant charges, a settle corrects, signed).
#[derive(Clone, Copy, Debug)]
struct Event {
    ns: u128,
    process: usize,
    grant: bool,
    cost: [i64; 2],
}

fn run_fleet(open: bool) -> (Vec<Event>, u128, u128) {
    let mut server = Server::start_persistent();
    let exe = std::env::current_exe().expect("test binary path");
    let workers: Vec<_> = (0..PROCESSES)
        .map(|seed| {
            let args = [server.url(), u8::from(open).to_string(), seed.to_string()].join("\n");
            Command::new(&exe)
                .args(["worker_process", "--exact", "--ignored", "--nocapture"])
                .args(["--test-threads", "1"])
                .env(WORKER, args)
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a worker process")
        })
        .collect();
    std::thread::sleep(KILL_AFTER);
    let killed = wall_ns();
    server.kill();
    std::thread::sleep(DOWN_FOR);
    server.restart();
    let restarted = wall_ns();
    let mut events = Vec::new();
    for (process, worker) in workers.into_iter().enumerate() {
        let out = worker.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "worker failed: {out:?}");
        let line = stdout
            .lines()
            .find_map(|l| l.split_once("worker: ").map(|(_, a)| a.to_owned()))
            .unwrap_or_else(|| panic!("worker said nothing: {stdout}"));
        for e in line.split_whitespace() {
            let v: Vec<&str> = e.split(',').collect();
            let grant = v[2] == "1";
            let amount: i64 = v[3].parse().unwrap();
            events.push(Event {
                ns: v[0].parse().unwrap(),
                process,
                grant,
                cost: if grant { [1, amount] } else { [0, amount] },
            });
        }
    }
    events.sort_by_key(|e| e.ns);
    (events, killed, restarted)
}

/// Every span `[t, t + w]` of the merged timeline holds at most, per bucket, `burst + (w +
/// SLACK) × rate`, plus the upward corrections within it (a cost already spent at the
/// provider, paid back by making later grants wait), plus under
/// `FailOpen`, for a span that overlaps the outage, each process's fallback at `SHARE` of the
/// burst and of the rate for as long as it was in charge (the outage, until the connection is
/// made again, and a second more until it probes Redis again).
fn check(events: &[Event], killed: u128, restarted: u128, open: bool) -> Result<(), String> {
    // A fallback is in charge for a second after a process's last failed round trip, and
    // round trips fail until the connection is made again: the client retries at a backoff of
    // up to 500 ms, and a round trip fails after the 250 ms response timeout.
    let reconnected = restarted + Duration::from_millis(500 + 250).as_nanos();
    let fallback_until = reconnected + Duration::from_millis(1_000).as_nanos() + SLACK.as_nanos();
    for (dim, &(rate, burst)) in LIMITS.iter().enumerate() {
        for i in 0..events.len() {
            let (mut sum, mut ups) = (0, 0);
            for j in i..events.len() {
                sum += events[j].cost[dim];
                if !events[j].grant && events[j].cost[dim] > 0 {
                    ups += events[j].cost[dim];
                }
                let (from, to) = (events[i].ns, events[j].ns);
                let span = (to - from) as f64 / 1e9;
                let mut allowed = burst as f64 + (span + SLACK.as_secs_f64()) * rate + ups as f64;
                if open && from <= fallback_until && to + SLACK.as_nanos() >= killed {
                    let overlap = to.min(fallback_until).saturating_sub(from.max(killed));
                    let local = SHARE * (burst as f64 + overlap as f64 / 1e9 * rate);
                    allowed += PROCESSES as f64 * local.max(1.0).ceil();
                }
                if sum as f64 > allowed + 1e-9 {
                    return Err(format!(
                        "limit {dim}: {sum} within {span:.6} s from {:.3} s (allowed \
                         {allowed:.1}; killed at {:.3} s, restarted at {:.3} s)",
                        (from - events[0].ns) as f64 / 1e9,
                        (killed - events[0].ns) as f64 / 1e9,
                        (restarted - events[0].ns) as f64 / 1e9,
                    ));
                }
            }
        }
    }
    Ok(())
}

/// One fleet at a time: 8 processes of 8 workers on a 2-core machine would measure the
/// machine's scheduling more than the limiter.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn stress(open: bool) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (events, killed, restarted) = run_fleet(open);
    let grants: Vec<&Event> = events.iter().filter(|e| e.grant).collect();
    // Every process and every task was served, before and after the outage.
    let mut per_process = [0; PROCESSES];
    for g in &grants {
        per_process[g.process] += 1;
    }
    assert!(per_process.iter().all(|&n| n > 0), "{per_process:?}");
    assert!(grants.iter().any(|g| g.ns < killed));
    assert!(grants.iter().any(|g| g.ns > restarted));
    // Both directions of correction happened.
    assert!(events.iter().any(|e| !e.grant && e.cost[1] > 0));
    assert!(events.iter().any(|e| !e.grant && e.cost[1] < 0));
    println!(
        "{} grants, {} events, per process {per_process:?}",
        grants.len(),
        events.len()
    );
    check(&events, killed, restarted, open).unwrap();
}

#[test]
fn a_fleet_under_stress_keeps_every_bound_failing_closed() {
    stress(false);
}

#[test]
fn a_fleet_under_stress_keeps_every_bound_failing_open() {
    stress(true);
}
