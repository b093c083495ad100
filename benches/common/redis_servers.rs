//! Private Redis servers for the Redis benchmarks (`#[path]`-included: each bench is its own
//! binary): one `redis-server`, or a Redis Cluster of three masters and three replicas, on free
//! loopback ports without persistence, killed when dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Whether `program --version` runs.
pub fn installed(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// A free loopback port, not in `taken`, whose cluster bus port (+10000) is free too.
fn free_port(taken: &[u16]) -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        if port < 55_000
            && !taken.contains(&port)
            && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
        {
            return port;
        }
    }
}

/// One command to the server on `port`, on a connection of its own; the reply as text.
pub fn query(port: u16, args: &[&str]) -> redis::RedisResult<String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    Ok(match cmd.query::<redis::Value>(&mut conn)? {
        redis::Value::Int(n) => n.to_string(),
        other => redis::from_redis_value::<String>(other)?,
    })
}

/// A redis-server on `port`, working in `dir` (a replica writes the data it receives from its
/// master there, as `dump.rdb`, even without persistence).
fn spawn(port: u16, dir: &Path, extra: &[&str]) -> Child {
    Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(extra)
        .current_dir(dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server starts")
}

fn wait_up(port: u16, deadline: Instant) {
    while query(port, &["PING"]).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A private redis-server.
pub struct Server {
    pub port: u16,
    child: Child,
}

impl Server {
    pub fn start() -> Server {
        let port = free_port(&[]);
        let server = Server {
            port,
            child: spawn(port, &std::env::temp_dir(), &[]),
        };
        wait_up(port, Instant::now() + Duration::from_secs(10));
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A private Redis Cluster: three masters, three replicas.
pub struct Cluster {
    dir: PathBuf,
    pub ports: Vec<u16>,
    children: Vec<Child>,
}

impl Cluster {
    /// Starts six nodes, joins them with `redis-cli --cluster create`, and waits (at most
    /// 30 s) until every node says `cluster_state:ok`.
    pub fn start() -> Cluster {
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!(
            "paced-bench-cluster-{}-{stamp}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("a directory for the cluster's node files");
        let mut ports = Vec::new();
        for _ in 0..6 {
            ports.push(free_port(&ports));
        }
        let mut cluster = Cluster {
            dir,
            ports: ports.clone(),
            children: Vec::new(),
        };
        for &port in &ports {
            let config = cluster.dir.join(format!("nodes-{port}.conf"));
            let config = config.to_str().expect("a UTF-8 temporary directory");
            cluster.children.push(spawn(
                port,
                &cluster.dir,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    config,
                    "--cluster-node-timeout",
                    "1000",
                ],
            ));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for &port in &ports {
            wait_up(port, deadline);
        }
        let status = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(ports.iter().map(|p| format!("127.0.0.1:{p}")))
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli runs");
        assert!(status.success(), "redis-cli --cluster create failed");
        while !ports.iter().all(|&port| {
            query(port, &["CLUSTER", "INFO"]).is_ok_and(|info| info.contains("cluster_state:ok"))
        }) {
            assert!(Instant::now() < deadline, "the cluster did not become ok");
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// The ports of the masters.
    pub fn masters(&self) -> Vec<u16> {
        let nodes = query(self.ports[0], &["CLUSTER", "NODES"]).expect("CLUSTER NODES");
        nodes
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                if !fields.get(2)?.contains("master") {
                    return None;
                }
                fields.get(1)?.split(['@', ':']).nth(1)?.parse().ok()
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
