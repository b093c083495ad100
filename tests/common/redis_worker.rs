//! A worker process for the multi-process Redis tests: the test binary runs itself again
//! ([`command`]) with the worker's arguments in `PACED_REDIS_WORKER`, and the [`worker`] test,
//! which does nothing without that variable, acts on them: it acquires one permit at a time,
//! as fast as the shared quota allows, for a while, and prints each grant.
//!
//! Arguments: the Redis URL, the key, the seconds to run, and optionally the rate per second
//! (200), the burst (20) and `lease` to take up to 10 tokens per round trip, or `keyed` to use
//! a `RedisKeyedRateLimiter` under the key as prefix, with two tasks, one on key `a` and one on
//! key `b`. Each grant is printed as `grant <sent> <received>` (`grant <sent> <received> <key>`
//! when keyed): Unix-epoch nanoseconds when the request was sent and when the grant came back,
//! so that runs of several processes can be merged (the grant happened on Redis somewhere in
//! between). The last line is `stats <granted> <round trips>`. (The test harness prints lines
//! of its own around them: read only the lines that start with these words.)
//!
//! `tenants <keys> <change>` instead uses a `RedisKeyedRateLimiter<u64>` over keys
//! `0..keys` (rate and burst are then the default limit; per-key limits are whatever is in
//! Redis), with one task per key, or three for every key `k` with `k % 50 == 1`: keys with
//! `k % 8 == 0` are polled with `try_acquire` (after a refusal, a sleep of its `retry_after`,
//! at most 200 ms), the others waited for with `acquire`. Each grant is printed as
//! `grant <sent> <received> <key> <asked> <served>`, where `asked` and `served` number this
//! process's requests of the key in the order they were made and in the order they were
//! granted. With `change` above 0, halfway through the run this process lowers the limit of
//! keys `0..change` to 1 per second, burst 1, printing `limit <sent> <received> <key>` for each.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use paced::redis::TryAcquireError;
use paced::{Rate, RedisKeyedRateLimiter, RedisRateLimiter};

fn epoch_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// The variable that holds a worker's arguments, one per line.
const ARGS: &str = "PACED_REDIS_WORKER";

/// This test binary, to be run again as a worker with `args`.
pub fn command<S: AsRef<str>>(args: impl IntoIterator<Item = S>) -> Command {
    let args: Vec<String> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = Command::new(exe);
    command
        .args([
            "--exact",
            "redis_worker::worker",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ARGS, args.join("\n"));
    command
}

/// A worker, when this binary was run as one; nothing otherwise.
#[test]
fn worker() {
    let Ok(args) = std::env::var(ARGS) else {
        return;
    };
    let args: Vec<String> = args.lines().map(str::to_owned).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    if let Err(e) = runtime.block_on(run(args)) {
        panic!("the worker failed: {e}");
    }
}

async fn run(args: Vec<String>) -> Result<(), Box<dyn std::error::Error>> {
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.into());
    let url = arg(0, "redis://127.0.0.1:6379/");
    let key = arg(1, "paced-demo");
    let seconds: f64 = arg(2, "3").parse()?;
    let rate: u64 = arg(3, "200").parse()?;
    let burst: u64 = arg(4, "20").parse()?;
    let start = tokio::time::Instant::now();
    let stop = start + Duration::from_secs_f64(seconds);
    if arg(5, "") == "tenants" {
        let keys: u64 = arg(6, "1000").parse()?;
        let change: u64 = arg(7, "0").parse()?;
        // A thousand tasks share one connection: give a round trip time to queue behind them.
        let quota: RedisKeyedRateLimiter<u64> =
            RedisKeyedRateLimiter::builder(&url, &key, Rate::per_second(rate), burst)
                .response_timeout(Duration::from_secs(2))
                .build()?;
        return tenants(quota, keys, change, start, stop).await;
    }
    if arg(5, "") == "keyed" {
        let quota: RedisKeyedRateLimiter<String> =
            RedisKeyedRateLimiter::builder(&url, &key, Rate::per_second(rate), burst).build()?;
        let tasks: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|key| {
                let quota = quota.clone();
                tokio::spawn(async move {
                    let mut out = String::new();
                    while tokio::time::Instant::now() < stop {
                        let sent = epoch_nanos();
                        match tokio::time::timeout_at(stop, quota.acquire(key, 1)).await {
                            Ok(Ok(())) => {
                                out.push_str(&format!("grant {sent} {} {key}\n", epoch_nanos()));
                            }
                            Ok(Err(e)) => return Err(e),
                            Err(_) => break,
                        }
                    }
                    Ok(out)
                })
            })
            .collect();
        let mut out = String::new();
        for task in tasks {
            out.push_str(&task.await??);
        }
        let stats = quota.stats();
        out.push_str(&format!("stats {} {}\n", stats.granted, stats.round_trips));
        // On a line of its own, after the harness's "test ... ".
        print!("\n{out}");
        return Ok(());
    }
    let mut builder = RedisRateLimiter::builder(url, key, Rate::per_second(rate), burst);
    if arg(5, "") == "lease" {
        builder = builder.lease(10, Duration::from_millis(2));
    }
    let quota = builder.build()?;

    let mut out = String::new();
    while tokio::time::Instant::now() < stop {
        let sent = epoch_nanos();
        let acquired = tokio::time::timeout_at(stop, quota.acquire(1)).await;
        match acquired {
            Ok(Ok(())) => out.push_str(&format!("grant {sent} {}\n", epoch_nanos())),
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => break,
        }
    }
    quota.return_lease().await;
    let stats = quota.stats();
    out.push_str(&format!("stats {} {}\n", stats.granted, stats.round_trips));
    // On a line of its own, after the harness's "test ... ".
    print!("\n{out}");
    Ok(())
}

/// The `tenants` mode: many tasks over many keys, each key under its own limit.
async fn tenants(
    quota: RedisKeyedRateLimiter<u64>,
    keys: u64,
    change: u64,
    start: tokio::time::Instant,
    stop: tokio::time::Instant,
) -> Result<(), Box<dyn std::error::Error>> {
    // One round trip (on a key outside the range) before the tasks start: the connection is
    // made, so that the first key's first request does not wait for it.
    if let Err(TryAcquireError::Reply(e)) = quota.try_acquire(&keys, 1).await {
        return Err(e.into());
    }
    // Per key: the next request number, and the next grant number, in this process.
    let numbers: Arc<Vec<(AtomicU64, AtomicU64)>> = Arc::new(
        (0..keys)
            .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
            .collect(),
    );
    let mut tasks = Vec::new();
    for key in 0..keys {
        let copies = if key % 50 == 1 { 3 } else { 1 };
        for _ in 0..copies {
            let (quota, numbers) = (quota.clone(), numbers.clone());
            tasks.push(tokio::spawn(async move {
                let mut out = String::new();
                let (asks, serves) = &numbers[usize::try_from(key)?];
                while tokio::time::Instant::now() < stop {
                    let sent = epoch_nanos();
                    let asked = asks.fetch_add(1, Ordering::Relaxed);
                    if key % 8 == 0 {
                        match quota.try_acquire(&key, 1).await {
                            Ok(()) => {}
                            Err(TryAcquireError::NotUntil(refused)) => {
                                let pause = refused.retry_after().min(Duration::from_millis(200));
                                let at = tokio::time::Instant::now() + pause;
                                tokio::time::sleep_until(at.min(stop)).await;
                                continue;
                            }
                            Err(e) => {
                                return Err(Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
                            }
                        }
                    } else {
                        match tokio::time::timeout_at(stop, quota.acquire(&key, 1)).await {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => return Err(Box::new(e) as _),
                            Err(_) => break,
                        }
                    }
                    let received = epoch_nanos();
                    let served = serves.fetch_add(1, Ordering::Relaxed);
                    out.push_str(&format!("grant {sent} {received} {key} {asked} {served}\n"));
                }
                Ok(out)
            }));
        }
    }
    let mut out = String::new();
    if change > 0 {
        tokio::time::sleep_until(start + (stop - start) / 2).await;
        // All at once, each printed with its own round trip.
        let changes = (0..change).map(|key| {
            let quota = quota.clone();
            async move {
                let sent = epoch_nanos();
                quota.set_limit(&key, Rate::per_second(1), 1).await?;
                Ok::<_, paced::redis::RedisLimiterError>(format!(
                    "limit {sent} {} {key}\n",
                    epoch_nanos()
                ))
            }
        });
        for line in futures_util::future::try_join_all(changes).await? {
            out.push_str(&line);
        }
    }
    for task in tasks {
        out.push_str(&task.await?.map_err(|e| e.to_string())?);
    }
    let stats = quota.stats();
    out.push_str(&format!(
        "stats {} {} {}\n",
        stats.granted, stats.round_trips, stats.errors
    ));
    // On a line of its own, after the harness's "test ... ".
    print!("\n{out}");
    Ok(())
}
