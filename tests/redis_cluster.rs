//! Both Redis limiters on a real, private Redis Cluster: six `redis-server`s (three masters,
//! three replicas) on free loopback ports, without persistence, joined by `redis-cli --cluster
//! create` and killed at the end. Real time. Skipped, with a message, if `redis-server` or
//! `redis-cli` is not installed.
#![cfg(feature = "redis")]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use paced::redis::{FailurePolicy, RedisLimiterError, TryAcquireError};
use paced::{Limit, Rate, RedisKeyedRateLimiter, RedisRateLimiter};

#[path = "common/ports.rs"]
mod ports;

/// A private Redis Cluster: every node is killed (SIGKILL) on drop.
struct Cluster {
    dir: PathBuf,
    ports: Vec<u16>,
    children: Vec<Option<Child>>,
}

fn installed(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// A loopback port from 10000 to 19999 whose cluster bus port (+10000) is free too, given
/// once in this process (see [`ports::free_port_in`]).
fn free_port() -> u16 {
    ports::free_port_in(10_000..20_000, &[10_000]).expect("a free loopback port and its bus port")
}

/// The process id of the redis-server answering on `port`, if one answers.
fn process_id(port: u16) -> Option<u32> {
    let info = query(port, &["INFO", "server"]).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
}

/// A connection to `port` that gives up on a reply after a second.
fn conn(port: u16) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let conn = client.get_connection_with_timeout(Duration::from_secs(1))?;
    conn.set_read_timeout(Some(Duration::from_secs(1)))?;
    conn.set_write_timeout(Some(Duration::from_secs(1)))?;
    Ok(conn)
}

fn query(port: u16, args: &[&str]) -> redis::RedisResult<String> {
    let mut conn = conn(port)?;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let value: redis::Value = cmd.query(&mut conn)?;
    Ok(match value {
        redis::Value::Int(n) => n.to_string(),
        other => redis::from_redis_value::<String>(other)?,
    })
}

impl Cluster {
    /// Starts the cluster and waits (at most 20 s) until every node says `cluster_state:ok`
    /// and every replica is in sync; `None` if redis-server or redis-cli is missing.
    fn start() -> Option<Cluster> {
        if !installed("redis-server") || !installed("redis-cli") {
            eprintln!("redis-server or redis-cli not installed: skipping the Redis Cluster test");
            return None;
        }
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir =
            std::env::temp_dir().join(format!("paced-cluster-{}-{stamp}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut ports = Vec::new();
        for _ in 0..6 {
            ports.push(free_port());
        }
        let mut cluster = Cluster {
            dir,
            ports: ports.clone(),
            children: Vec::new(),
        };
        for &port in &ports {
            let config = cluster.dir.join(format!("nodes-{port}.conf"));
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes", "--cluster-config-file"])
                .arg(&config)
                .args(["--cluster-node-timeout", "1000"])
                .args(["--save", "", "--appendonly", "no"])
                .current_dir(&cluster.dir)
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-server");
            cluster.children.push(Some(child));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        // Each node answering is the one started here (by its process id), not another
        // process's server on its port.
        for (&port, child) in ports.iter().zip(&cluster.children) {
            let pid = child.as_ref().map(Child::id);
            while process_id(port) != pid || query(port, &["PING"]).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "redis-server did not come up on {port}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let status = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(ports.iter().map(|p| format!("127.0.0.1:{p}")))
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli");
        assert!(status.success(), "redis-cli --cluster create failed");
        loop {
            let ready = ports.iter().all(|&port| {
                let ok = query(port, &["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.contains("cluster_state:ok"));
                let synced = query(port, &["INFO", "replication"]).is_ok_and(|info| {
                    info.contains("connected_slaves:1") || info.contains("master_link_status:up")
                });
                ok && synced
            });
            if ready {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not become ok in 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(cluster)
    }

    fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// A node that is up, to ask about the cluster.
    fn any_port(&self) -> u16 {
        let i = self.children.iter().position(Option::is_some).unwrap();
        self.ports[i]
    }

    /// The ports of the masters, with their slot ranges.
    fn masters(&self) -> Vec<(u16, Vec<(u16, u16)>)> {
        let nodes = query(self.any_port(), &["CLUSTER", "NODES"]).unwrap();
        nodes
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                if !f[2].contains("master") || f[2].contains("fail") {
                    return None;
                }
                let port = f[1].split(['@', ':']).nth(1)?.parse().ok()?;
                let slots = f[8..]
                    .iter()
                    .filter(|s| !s.starts_with('['))
                    .map(|s| match s.split_once('-') {
                        Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                        None => (s.parse().unwrap(), s.parse().unwrap()),
                    })
                    .collect();
                Some((port, slots))
            })
            .collect()
    }

    /// The master serving `key`, as a node that is up sees it.
    fn master_of(&self, key: &str) -> Option<u16> {
        let slot: u16 = query(self.any_port(), &["CLUSTER", "KEYSLOT", key])
            .unwrap()
            .parse()
            .unwrap();
        self.masters()
            .into_iter()
            .find(|(_, ranges)| ranges.iter().any(|&(a, b)| a <= slot && slot <= b))
            .map(|(port, _)| port)
    }

    /// SIGKILL to the node on `port`.
    fn kill(&mut self, port: u16) {
        let i = self.ports.iter().position(|&p| p == port).unwrap();
        if let Some(mut child) = self.children[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.children.iter_mut().filter_map(Option::take) {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn nodes(urls: &[String]) -> Vec<&str> {
    urls.iter().map(String::as_str).collect()
}

/// A refill too slow to matter within a test: grants are counted against the burst alone.
fn slow() -> Rate {
    Rate::per_hour(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_limiters_grant_and_refuse_exactly_and_keys_spread_over_the_masters() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let urls = cluster.urls();
    let nodes = nodes(&urls);

    // One quota, from two instances (two connections): exactly the burst, then refusals.
    let a = RedisRateLimiter::cluster_builder(&nodes, "one", slow(), 7)
        .build()
        .unwrap();
    let b = RedisRateLimiter::cluster_builder(&nodes[3..], "one", slow(), 7)
        .build()
        .unwrap();
    let mut granted = 0;
    for i in 0..20 {
        let quota = if i % 2 == 0 { &a } else { &b };
        match quota.try_acquire(1).await {
            Ok(()) => granted += 1,
            Err(TryAcquireError::NotUntil(n)) => assert!(!n.is_never()),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(granted, 7);
    assert_eq!(a.stats().errors + b.stats().errors, 0);
    a.acquire(0).await.unwrap();

    // Per key, from two instances: exactly the burst of each key.
    let ka: RedisKeyedRateLimiter<String> =
        RedisKeyedRateLimiter::cluster_builder(&nodes, "k", slow(), 3)
            .build()
            .unwrap();
    let kb: RedisKeyedRateLimiter<String> =
        RedisKeyedRateLimiter::cluster_builder(&nodes[..1], "k", slow(), 3)
            .build()
            .unwrap();
    for key in ["alpha", "beta", "gamma", "delta"] {
        let mut granted = 0;
        for i in 0..8 {
            let quota = if i % 2 == 0 { &ka } else { &kb };
            if quota.try_acquire(key, 1).await.is_ok() {
                granted += 1;
            }
        }
        assert_eq!(granted, 3, "key {key}");
    }

    // 300 keys spread over every master: each holds some, and together all of them.
    let spread: RedisKeyedRateLimiter<u32> =
        RedisKeyedRateLimiter::cluster_builder(&nodes, "spread", slow(), 2)
            .build()
            .unwrap();
    for key in 0..300u32 {
        spread.try_acquire(&key, 1).await.unwrap();
    }
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    let mut total = 0;
    for (port, _) in &masters {
        let keys: u64 = query(
            *port,
            &[
                "EVAL",
                "return #redis.call('KEYS', ARGV[1])",
                "0",
                "{spread:*",
            ],
        )
        .unwrap()
        .parse()
        .unwrap();
        println!("master 127.0.0.1:{port}: {keys} of the 300 keys");
        assert!(keys > 30, "master {port} holds only {keys} keys");
        total += keys;
    }
    assert_eq!(total, 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_limit_quota_lives_in_one_slot_and_is_exact_from_two_instances() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let urls = cluster.urls();
    let nodes = nodes(&urls);
    let multi = |nodes: &[&str]| -> RedisRateLimiter<[u64; 2]> {
        RedisRateLimiter::cluster_dimensions(nodes, "llm", ["requests", "tokens"])
            .limit("requests", Limit::bucket(slow(), 5))
            .limit("tokens", Limit::bucket(slow(), 100))
            .limit("tokens", Limit::window(1_000, Duration::from_secs(86_400)))
            .build()
            .unwrap()
    };
    let (a, b) = (multi(&nodes), multi(&nodes[3..]));
    // Tokens bind first (30 each: 3 grants), then requests would (5).
    let mut granted = 0;
    for i in 0..10 {
        let quota = if i % 2 == 0 { &a } else { &b };
        match quota.try_acquire([1, 30]).await {
            Ok(permit) => {
                granted += 1;
                permit.settle([1, 30]).await.unwrap();
            }
            Err(TryAcquireError::NotUntil(n)) => assert!(!n.is_never()),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(granted, 3);
    assert_eq!(a.stats().errors + b.stats().errors, 0);
    // Per key, each key's limits in its own slot.
    let keyed: RedisKeyedRateLimiter<String, [u64; 2]> =
        RedisKeyedRateLimiter::cluster_dimensions(&nodes, "tenants", ["requests", "tokens"])
            .limit("requests", Limit::bucket(slow(), 2))
            .limit("tokens", Limit::bucket(slow(), 100))
            .build()
            .unwrap();
    for key in ["alpha", "beta", "gamma", "delta"] {
        let mut granted = 0;
        for _ in 0..4 {
            if keyed.try_acquire(key, [1, 10]).await.is_ok() {
                granted += 1;
            }
        }
        assert_eq!(granted, 2, "key {key}");
    }
    assert_eq!(keyed.stats().errors + keyed.stats().reply_errors, 0);
}

/// The most grants whose times (seconds) fall in any window, against `burst + span × rate`
/// plus `slack` tokens.
fn excess(grants: &[f64], rate: f64, burst: f64) -> f64 {
    let mut worst = f64::NEG_INFINITY;
    for i in 0..grants.len() {
        for j in i..grants.len() {
            let count = (j - i + 1) as f64;
            let allowed = burst + (grants[j] - grants[i]) * rate;
            worst = worst.max(count - allowed);
        }
    }
    worst
}

/// Kills the master of `{fo}`'s slot while one process acquires on `{fo}quota` and a probe
/// on `{fo}probe` measures when the slot answers again. Returns the grant times (s since
/// the start), the time of the kill and of the recovery, and whether every acquire succeeded
/// (none hung, none gave up: the fail-closed deadline is longer than the failover).
async fn failover_run(
    policy: FailurePolicy,
    rate: u64,
    burst: u64,
) -> Option<(Vec<f64>, f64, f64, bool)> {
    let mut cluster = Cluster::start()?;
    let urls = cluster.urls();
    let nodes = nodes(&urls);
    let quota =
        RedisRateLimiter::cluster_builder(&nodes, "{fo}quota", Rate::per_second(rate), burst)
            .failure_policy(policy)
            .response_timeout(Duration::from_millis(200))
            .build()
            .unwrap();
    let probe =
        RedisRateLimiter::cluster_builder(&nodes, "{fo}probe", Rate::per_second(1), 1_000_000)
            .failure_policy(FailurePolicy::FailClosed {
                max_backoff: Duration::from_millis(50),
                deadline: Duration::from_secs(20),
            })
            .response_timeout(Duration::from_millis(200))
            .build()
            .unwrap();
    probe.try_acquire(1).await.unwrap();
    let victim = cluster
        .master_of("{fo}quota")
        .expect("a master for the slot");
    // A keyed limiter, on a key of the same master.
    let keyed: RedisKeyedRateLimiter<u32> =
        RedisKeyedRateLimiter::cluster_builder(&nodes, "kfo", Rate::per_second(rate), burst)
            .failure_policy(policy)
            .response_timeout(Duration::from_millis(200))
            .build()
            .unwrap();
    let key = (0..)
        .find(|n| cluster.master_of(&format!("{{kfo:{n}}}")) == Some(victim))
        .unwrap();
    keyed.try_acquire(&key, 1).await.unwrap();

    let start = Instant::now();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let worker = {
        let (quota, stop) = (quota.clone(), stop.clone());
        tokio::spawn(async move {
            let mut grants = Vec::new();
            let (mut all_ok, mut unavailable) = (true, 0);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match tokio::time::timeout(Duration::from_secs(25), quota.acquire(1)).await {
                    Ok(Ok(())) => grants.push(start.elapsed().as_secs_f64()),
                    Ok(Err(RedisLimiterError::Unavailable(_))) => unavailable += 1,
                    Ok(Err(e)) => panic!("{e}"),
                    Err(_) => {
                        all_ok = false;
                        break;
                    }
                }
            }
            (grants, all_ok && unavailable == 0)
        })
    };
    // A key of the keyed limiter on another master.
    let healthy = (0..)
        .find(|n| {
            cluster
                .master_of(&format!("{{kfo:{n}}}"))
                .is_some_and(|m| m != victim)
        })
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let killed_at = start.elapsed().as_secs_f64();
    cluster.kill(victim);
    // The outage is the failed master's keys' alone: the keyed limiter's key there finds it
    // (under `FailOpen`, its fallback grants), and its key on a healthy master goes on in
    // Redis, neither refused nor granted by a fallback.
    let _ = keyed.try_acquire(&key, 1).await;
    let found = keyed.stats();
    assert!(found.errors > 0, "the failed master answered: {found:?}");
    if matches!(policy, FailurePolicy::FailOpen { .. }) {
        assert!(found.fallback > 0, "{found:?}");
    }
    keyed.try_acquire(&healthy, 1).await.unwrap();
    let after = keyed.stats();
    assert_eq!(
        (after.fallback, after.errors),
        (found.fallback, found.errors),
        "a key on a healthy master went to the fallback"
    );
    let recovered_at = loop {
        if probe.try_acquire(1).await.is_ok() {
            break start.elapsed().as_secs_f64();
        }
        assert!(
            start.elapsed() < Duration::from_secs(25),
            "no recovery in 25 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(probe.stats().errors > 0, "the probe saw no outage");
    // The nodes learn of the new master within a moment.
    while cluster.master_of("{fo}quota").is_none_or(|m| m == victim) {
        assert!(start.elapsed() < Duration::from_secs(30), "no failover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Run on a while after the recovery.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (grants, all_ok) = worker.await.unwrap();
    // The keyed limiter recovers too, without a restart.
    let keyed_errors = keyed.stats().errors;
    tokio::time::timeout(Duration::from_secs(5), keyed.acquire(&key, 1))
        .await
        .expect("the keyed limiter hung")
        .unwrap();
    assert_eq!(
        keyed.stats().errors,
        keyed_errors,
        "the keyed limiter did not recover"
    );
    let after = grants.iter().filter(|&&t| t > recovered_at).count();
    assert!(after > 0, "the limiter did not recover");
    println!(
        "{policy:?}: master 127.0.0.1:{victim} killed at {killed_at:.2} s, slot answers again at {recovered_at:.2} s: time to recover {:.2} s; {} grants, {after} after the recovery; stats {:?}",
        recovered_at - killed_at,
        grants.len(),
        quota.stats()
    );
    Some((grants, killed_at, recovered_at, all_ok))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_fail_closed_grants_nothing_beyond_the_bound_and_loses_nothing() {
    let (rate, burst) = (20, 5);
    let policy = FailurePolicy::FailClosed {
        max_backoff: Duration::from_millis(100),
        deadline: Duration::from_secs(20),
    };
    let Some((grants, _, _, all_ok)) = failover_run(policy, rate, burst).await else {
        return;
    };
    assert!(all_ok, "an acquire hung");
    let excess = excess(&grants, rate as f64, burst as f64);
    println!(
        "FailClosed: grants beyond the bound: {:.2} (one round trip's worth of slack allowed)",
        excess.max(0.0)
    );
    // Within one grant: a grant's time is when its answer came back, not when Redis made it.
    assert!(excess <= 1.0, "{excess} grants beyond the bound");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_fail_open_stays_within_the_documented_allowance() {
    let (rate, burst, share) = (20, 10, 0.5);
    let Some((grants, killed_at, recovered_at, all_ok)) =
        failover_run(FailurePolicy::FailOpen { share }, rate, burst).await
    else {
        return;
    };
    assert!(all_ok, "an acquire hung");
    let excess = excess(&grants, rate as f64, burst as f64);
    // One outage's fallback: a full bucket of share × burst, refilled at share × rate for the
    // outage and up to a second more (the fallback tries Redis again once a second).
    let outage = recovered_at - killed_at + 1.0;
    let allowance = (burst as f64 * share).floor() + share * rate as f64 * outage;
    println!(
        "FailOpen {{ share: {share} }}: grants beyond the bound: {:.2}; allowance {allowance:.2} (share × burst + share × rate × (outage + 1 s) = {outage:.2} s)",
        excess.max(0.0)
    );
    assert!(
        excess <= allowance + 1.0,
        "{excess} grants beyond the bound"
    );
}

#[tokio::test]
async fn an_unreachable_node_list_is_an_outage_not_a_hang() {
    let nodes = ["redis://127.0.0.1:1"];
    let timeout = Duration::from_millis(200);

    let closed = RedisRateLimiter::cluster_builder(&nodes, "q", Rate::per_second(5), 5)
        .failure_policy(FailurePolicy::FailClosed {
            max_backoff: Duration::from_millis(100),
            deadline: Duration::from_secs(1),
        })
        .response_timeout(timeout)
        .build()
        .unwrap();
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(5), closed.acquire(1))
        .await
        .expect("acquire hung");
    assert!(
        matches!(result, Err(RedisLimiterError::Unavailable(_))),
        "{result:?}"
    );
    println!(
        "FailClosed on no cluster: {:?} after {:?}",
        result.unwrap_err().to_string(),
        started.elapsed()
    );
    let refused = tokio::time::timeout(Duration::from_secs(2), closed.try_acquire(1))
        .await
        .expect("try_acquire hung");
    assert!(refused.unwrap_err().not_until().is_some());

    let open: RedisKeyedRateLimiter<String> =
        RedisKeyedRateLimiter::cluster_builder(&nodes, "k", Rate::per_second(5), 4)
            .failure_policy(FailurePolicy::FailOpen { share: 0.5 })
            .response_timeout(timeout)
            .build()
            .unwrap();
    tokio::time::timeout(Duration::from_secs(2), open.acquire("a", 1))
        .await
        .expect("acquire hung")
        .unwrap();

    let none = RedisRateLimiter::cluster_builder(&[], "q", Rate::per_second(5), 5).build();
    assert!(matches!(none, Err(RedisLimiterError::Client(_))));
}
