//! One of several processes sharing a quota in Redis: acquires one permit at a time, as fast
//! as the shared quota allows, for a while, and prints each grant.
//!
//! ```text
//! redis-server --port 6399 --save "" &
//! cargo run --features redis --example redis_worker -- redis://127.0.0.1:6399/ demo 3
//! ```
//!
//! Arguments: the Redis URL, the key, the seconds to run, and optionally the rate per second
//! (200), the burst (20) and `lease` to take up to 10 tokens per round trip, or `keyed` to use
//! a `RedisKeyedRateLimiter` under the key as prefix, with two tasks, one on key `a` and one on
//! key `b`. Each grant is printed as `grant <sent> <received>` (`grant <sent> <received> <key>`
//! when keyed): Unix-epoch nanoseconds when the request was sent and when the grant came back,
//! so that runs of several processes can be merged (the grant happened on Redis somewhere in
//! between). The last line is `stats <granted> <round trips>`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pacer::{Rate, RedisKeyedRateLimiter, RedisRateLimiter};

fn epoch_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.into());
    let url = arg(0, "redis://127.0.0.1:6379/");
    let key = arg(1, "pacer-demo");
    let seconds: f64 = arg(2, "3").parse()?;
    let rate: u64 = arg(3, "200").parse()?;
    let burst: u64 = arg(4, "20").parse()?;
    let stop = tokio::time::Instant::now() + Duration::from_secs_f64(seconds);
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
        print!("{out}");
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
    print!("{out}");
    Ok(())
}
