//! Four processes (this test binary run again as `tenants` workers, see
//! `tests/common/redis_worker.rs`) with many tasks over 1,000 keys, each key under its own
//! limit, against a real, private `redis-server`: every key's bound in every window of the
//! merged timeline, FIFO per key within a process, and a limit lowered by one process obeyed
//! by the others at once. In a file of its own, so that its
//! load does not run beside the other Redis tests. Real time, a few seconds.
#![cfg(feature = "redis")]

use std::collections::HashMap;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use paced::{Rate, RedisKeyedRateLimiter};

#[path = "common/redis_server.rs"]
mod redis_server;
#[path = "common/redis_worker.rs"]
mod redis_worker;
use redis_server::{check_bound, Server};

/// The 1,000-key test: keys `0..CHANGED` start at 20/s, burst 5, and are lowered to 1/s,
/// burst 1, halfway through by one process; the others have limits of various sizes, or
/// (every seventh) the default; the keys `k % 50 == 1` checked for FIFO have 10/s, burst 2.
const TENANTS: u64 = 1_000;
const CHANGED: u64 = 40;
const TENANT_DEFAULT: (u64, u64) = (3, 3);

/// The limit the test gives key `k` before the run (rate per second, burst), if any.
fn tenant_limit(k: u64) -> Option<(u64, u64)> {
    if k < CHANGED {
        return Some((20, 5));
    }
    if k % 50 == 1 {
        // Twelve tasks on each of these (three per process): enough tokens for all.
        return Some((10, 2));
    }
    if k % 7 == 3 {
        return None;
    }
    let rate = [1, 2, 3, 5][(k / 4 % 4) as usize];
    let burst = [1, 2, 4, 8][(k / 16 % 4) as usize];
    Some((rate, burst))
}

/// One grant of the 1,000-key test, as a worker printed it.
#[derive(Clone, Copy, Debug)]
struct TenantGrant {
    sent: u128,
    received: u128,
    process: usize,
    asked: u64,
    served: u64,
}

#[test]
fn four_processes_share_a_thousand_keys_each_under_its_own_limit() {
    let server = Server::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (rate, burst) = TENANT_DEFAULT;
        let quota: RedisKeyedRateLimiter<u64> =
            RedisKeyedRateLimiter::builder(server.url(), "tenants", Rate::per_second(rate), burst)
                .build()
                .unwrap();
        let limits = (0..TENANTS).filter_map(|k| tenant_limit(k).map(|l| (k, l)));
        let sets = limits.map(|(k, (rate, burst))| {
            let quota = quota.clone();
            async move { quota.set_limit(&k, Rate::per_second(rate), burst).await }
        });
        futures_util::future::try_join_all(sets).await.unwrap();
    });
    let started = Instant::now();
    let workers: Vec<Child> = (0..4)
        .map(|i| {
            let change = if i == 0 { CHANGED } else { 0 };
            let (rate, burst) = TENANT_DEFAULT;
            let (url, tenants) = (server.url(), TENANTS.to_string());
            let (rate, burst, change) = (rate.to_string(), burst.to_string(), change.to_string());
            redis_worker::command([
                &*url, "tenants", "4", &rate, &burst, "tenants", &tenants, &change,
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn a worker")
        })
        .collect();
    let mut grants: HashMap<u64, Vec<TenantGrant>> = Default::default();
    let mut changes: HashMap<u64, (u128, u128)> = Default::default();
    let (mut round_trips, mut errors) = (0, 0);
    for (process, worker) in workers.into_iter().enumerate() {
        let out = worker.wait_with_output().expect("worker output");
        assert!(out.status.success(), "a worker failed: {out:?}");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.first() {
                Some(&"grant") => {
                    grants
                        .entry(f[3].parse().unwrap())
                        .or_default()
                        .push(TenantGrant {
                            sent: f[1].parse().unwrap(),
                            received: f[2].parse().unwrap(),
                            process,
                            asked: f[4].parse().unwrap(),
                            served: f[5].parse().unwrap(),
                        })
                }
                Some(&"limit") => {
                    let change = (f[1].parse().unwrap(), f[2].parse().unwrap());
                    changes.insert(f[3].parse().unwrap(), change);
                }
                Some(&"stats") => {
                    round_trips += f[2].parse::<u64>().unwrap();
                    errors += f[3].parse::<u64>().unwrap();
                }
                _ => {}
            }
        }
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(15), "{took:?}");
    assert_eq!(changes.len() as u64, CHANGED);
    let all = || grants.values().flatten();
    let first = all().map(|g| g.sent).min().unwrap();
    let end = all().map(|g| g.received).max().unwrap();
    let span = (end - first) as f64 / 1e9;
    let pairs = |gs: &mut dyn Iterator<Item = &TenantGrant>| -> Vec<(u128, u128)> {
        gs.map(|g| (g.sent, g.received)).collect()
    };
    let (mut granted, mut capacity, mut followers_after) = (0.0, 0.0, 0);
    for key in 0..TENANTS {
        let mine = grants.get(&key).map(Vec::as_slice).unwrap_or(&[]);
        let (rate, burst) = tenant_limit(key).unwrap_or(TENANT_DEFAULT);
        if let Some(&(change_sent, change_received)) = changes.get(&key) {
            // Before the change, its first limit, used beyond what the new one would allow.
            let before = pairs(&mut mine.iter().filter(|g| g.received < change_sent));
            check_bound(&before, rate as f64, burst)
                .unwrap_or_else(|e| panic!("key {key} before its change: {e}"));
            let at = |t: u128| (t as i128 - first as i128) / 1_000_000;
            assert!(
                before.len() as u64 >= burst,
                "key {key}: {} grants before its change at {} ms: {:?}",
                before.len(),
                at(change_sent),
                mine.iter()
                    .map(|g| (at(g.sent), at(g.received), g.process))
                    .collect::<Vec<_>>()
            );
            // Every request made after the change, by any process, obeys the new limit at
            // once: at most 1 + (end - change) × 1/s, plus one for the round trip.
            let after: Vec<&TenantGrant> =
                mine.iter().filter(|g| g.sent > change_received).collect();
            let allowed = 1.0 + (end - change_received) as f64 / 1e9 + 1.0;
            assert!(
                after.len() as f64 <= allowed,
                "key {key}: {} grants after its change (allowed {allowed:.1})",
                after.len()
            );
            check_bound(&pairs(&mut after.iter().copied()), 1.0, 1)
                .unwrap_or_else(|e| panic!("key {key} after its change: {e}"));
            followers_after += after.iter().filter(|g| g.process != 0).count();
            continue;
        }
        // Each key's merged timeline keeps its own bound in every window, to within one round
        // trip (of waiting, for the keys waited for with `acquire`).
        check_bound(&pairs(&mut mine.iter()), rate as f64, burst)
            .unwrap_or_else(|e| panic!("key {key} ({rate}/s, burst {burst}): {e}"));
        granted += mine.len() as f64;
        capacity += burst as f64 + span * rate as f64;
    }
    // The four processes use the keys' limits: far more than if every key had the smallest
    // limit (1/s, burst 1: about a third of these), short of all of it only by the round
    // trips of 4,000 tasks on two shared cores (80 to 90 % on a quiet machine).
    let used = granted / capacity;
    println!(
        "{} grants over {TENANTS} keys in {took:?} ({round_trips} round trips, {errors} failed): {:.1} % of the per-key limits; {followers_after} grants to the other processes after the changes",
        all().count(),
        used * 100.0
    );
    assert!(used > 0.6, "only {:.1} % of the limits used", used * 100.0);
    assert!(used <= 1.0, "{:.1} % of the limits used", used * 100.0);
    // The other processes did ask after the changes, and were held to the new limits (the
    // keys polled with `try_acquire` among them have no reservations queued from before).
    assert!(
        followers_after > 0,
        "no other process was granted anything after the changes"
    );
    // FIFO per key within a process: three tasks on every key k % 50 == 1 are served in the
    // order they asked.
    for key in (1..TENANTS).step_by(50) {
        for process in 0..4 {
            let mut mine: Vec<&TenantGrant> = grants[&key]
                .iter()
                .filter(|g| g.process == process)
                .collect();
            assert!(mine.len() >= 3, "key {key}, process {process}: {mine:?}");
            mine.sort_by_key(|g| g.served);
            assert!(
                mine.windows(2).all(|w| w[0].asked < w[1].asked),
                "key {key}, process {process}: served out of order: {mine:?}"
            );
        }
    }
}
