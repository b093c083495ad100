//! A fleet of webhook workers sharing per-tenant quotas kept in Redis.
//!
//! Three workers (three connections, as three machines would have) each consume their share
//! of a topic of events for three tenants and deliver them through `throttle_by_key` over one
//! `RedisKeyedRateLimiter`: every tenant's quota is shared by the whole fleet, each tenant's
//! events leave in order, and a tenant over its quota holds up nobody else. Tenants get
//! 20 deliveries per second (5 at once) unless their plan says otherwise: "acme" has 100/s
//! (20 at once), "initech" 5/s (2 at once), set once by one worker and obeyed by all. Every
//! tenant's events arrive faster than its quota allows, so the quotas bind; after 2.5 s the
//! run stops and prints, per tenant, what the fleet delivered beside the bound
//! `burst + rate × elapsed`, and how the workers shared it.
//!
//! The example starts a private `redis-server` on a free loopback port (no persistence) and
//! stops it at the end; without `redis-server` on `PATH` it says so and exits successfully.
//!
//! ```text
//! cargo run --example fleet_tenants --features redis
//! ```

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use paced::{PaceExt, Rate, RedisKeyedRateLimiter};
use tokio::time::Instant;
use tokio_stream::{self as stream, StreamExt};

/// The tenants: name, quota per second, burst, and events per second arriving for it across
/// the fleet (each above its quota).
const TENANTS: [(&str, u64, u64, u64); 3] = [
    ("acme", 100, 20, 150),
    ("globex", 20, 5, 30),
    ("initech", 5, 2, 10),
];
const WORKERS: usize = 3;
const RUN: Duration = Duration::from_millis(2_500);

/// A private redis-server, stopped when dropped.
struct RedisServer {
    child: Child,
    url: String,
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a private redis-server on a free loopback port and waits until it answers; `None`
/// if `redis-server` is not installed.
fn start_redis() -> Result<Option<RedisServer>, Box<dyn std::error::Error>> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let spawned = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn();
    let child = match spawned {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let server = RedisServer {
        child,
        url: format!("redis://127.0.0.1:{port}/"),
    };
    let client = redis::Client::open(server.url.as_str())?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let pong = client
            .get_connection()
            .and_then(|mut conn| redis::cmd("PING").query::<String>(&mut conn));
        match pong {
            Ok(_) => return Ok(Some(server)),
            Err(e) if std::time::Instant::now() >= deadline => {
                return Err(format!("redis-server did not come up: {e}").into());
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// One worker's share of the topic: events for each tenant at a third of the fleet's
/// arrival rate, each ready at its arrival time.
fn topic(start: Instant) -> impl tokio_stream::Stream<Item = &'static str> {
    let mut events: Vec<(Duration, &'static str)> = Vec::new();
    for (tenant, _, _, per_second) in TENANTS {
        let every = Duration::from_secs(1) * WORKERS as u32 / per_second as u32;
        let count = RUN.as_nanos() / every.as_nanos();
        for i in 0..count as u32 {
            events.push((every * i, tenant));
        }
    }
    events.sort();
    stream::iter(events).then(move |(at, tenant)| async move {
        tokio::time::sleep_until(start + at).await;
        tenant
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(server) = start_redis()? else {
        println!("fleet_tenants: `redis-server` is not installed (Debian: `apt-get install redis-server`); nothing to run.");
        return Ok(());
    };
    println!(
        "{WORKERS} webhook workers share per-tenant quotas on a private redis-server ({})",
        server.url
    );
    // One limiter per worker: its own connection, as on its own machine.
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let quota: RedisKeyedRateLimiter<String> =
            RedisKeyedRateLimiter::builder(&server.url, "webhooks", Rate::per_second(20), 5)
                .build()?;
        workers.push(quota);
    }
    // The plans, set once by one worker, for the whole fleet.
    for (tenant, rate, burst, _) in TENANTS {
        if (rate, burst) != (20, 5) {
            workers[0]
                .set_limit(tenant, Rate::per_second(rate), burst)
                .await?;
        }
    }

    let start = Instant::now();
    let runs: Vec<_> = workers
        .iter()
        .cloned()
        .map(|quota| {
            tokio::spawn(async move {
                let mut delivered: Vec<(&'static str, Duration)> = Vec::new();
                let deliveries =
                    topic(start).throttle_by_key(&quota, |tenant| tenant.to_string(), |_| 1, 256);
                let mut deliveries = std::pin::pin!(deliveries);
                // Deliver until the run's end; what is still held is dropped, its reservation
                // given back.
                while let Ok(Some(tenant)) =
                    tokio::time::timeout_at(start + RUN, deliveries.next()).await
                {
                    // An HTTP POST to the tenant's endpoint would go here.
                    delivered.push((tenant, start.elapsed()));
                }
                delivered
            })
        })
        .collect();
    let mut per_tenant: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let mut last = Duration::ZERO;
    for (worker, run) in runs.into_iter().enumerate() {
        for (tenant, at) in run.await? {
            per_tenant.entry(tenant).or_insert_with(|| vec![0; WORKERS])[worker] += 1;
            last = last.max(at);
        }
    }
    // Every grant happened after `start` and before the last delivery.
    let elapsed = last.as_secs_f64();
    println!(
        "\n{:<9} {:>16} {:>10} {:>17} {:>16}",
        "tenant", "quota", "delivered", "bound", "per worker"
    );
    let mut over = false;
    for (tenant, rate, burst, _) in TENANTS {
        let split = per_tenant.get(tenant).cloned().unwrap_or_default();
        let delivered: usize = split.iter().sum();
        let bound = burst as f64 + rate as f64 * elapsed;
        over |= delivered as f64 > bound;
        let split: Vec<String> = split.iter().map(usize::to_string).collect();
        println!(
            "{tenant:<9} {:>16} {delivered:>10} {:>17} {:>16}",
            format!("{rate}/s, burst {burst}"),
            format!("{bound:.0} in {elapsed:.2} s"),
            split.join(" + "),
        );
    }
    let (mut round_trips, mut granted) = (0, 0);
    for quota in &workers {
        let stats = quota.stats();
        round_trips += stats.round_trips;
        granted += stats.granted;
    }
    println!("\nbound: the most the quota allows in the run, burst + rate × elapsed.");
    println!(
        "{granted} grants in {round_trips} Redis round trips across the fleet: one per grant;"
    );
    println!("the rest set two plans, or reserved for deliveries still waiting at the end, then");
    println!("gave those tokens back.");
    drop(server);
    if over {
        return Err("a tenant got more than its quota".into());
    }
    Ok(())
}
