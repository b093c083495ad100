//! What the Redis tests share: a private `redis-server` (started on a free loopback port
//! without persistence, waited for, restartable on the same port, stopped when dropped), and
//! the check of the bound over a merged timeline of grants.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "ports.rs"]
mod ports;

/// A private redis-server.
pub struct Server {
    port: u16,
    child: Option<Child>,
    /// With persistence: the directory of its append-only file, written and synced before
    /// every reply, so that a `kill -9` loses nothing it answered.
    dir: Option<std::path::PathBuf>,
}

impl Server {
    pub fn start() -> Server {
        Server::start_with(None)
    }

    /// A server that keeps its data across a `kill -9` and a restart.
    #[allow(dead_code)]
    pub fn start_persistent() -> Server {
        let dir = std::env::temp_dir().join(format!(
            "paced-redis-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).expect("a directory for the append-only file");
        Server::start_with(Some(dir))
    }

    fn start_with(dir: Option<std::path::PathBuf>) -> Server {
        let mut server = Server {
            port: 0,
            child: None,
            dir,
        };
        // A port free when chosen can be taken before redis-server binds it (by a server of
        // another process): then this one exits, and it tries another.
        let mut why = String::new();
        for _ in 0..10 {
            server.port = free_port();
            match server.spawn_and_wait() {
                Ok(()) => return server,
                Err(e) => why = e,
            }
        }
        panic!("redis-server did not come up on any of ten free ports; the last: {why}");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Starts again on the same port, and waits until it answers.
    #[allow(dead_code)] // for the tests that stop Redis and bring it back
    pub fn restart(&mut self) {
        if let Err(why) = self.spawn_and_wait() {
            panic!(
                "redis-server did not come back on port {}: {why}",
                self.port
            );
        }
    }

    /// Spawns redis-server on `self.port` and waits until it answers, checking by its process
    /// id that the server answering is this child, not another one on the same port.
    fn spawn_and_wait(&mut self) -> Result<(), String> {
        self.kill();
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", ""]);
        match &self.dir {
            Some(dir) => command
                .args(["--appendonly", "yes", "--appendfsync", "always", "--dir"])
                .arg(dir),
            None => command.args(["--appendonly", "no"]),
        };
        let child = command
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed for `cargo test --features redis`");
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(child) = &mut self.child {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!("redis-server exited ({status})"));
                }
            }
            // `INFO` is answered while an append-only file loads, `PING` only once it has.
            if process_id(self.port) == Some(pid) && ping(self.port) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err("redis-server did not answer within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A connection to `port` that gives up on a reply after a second: whatever listens there may
/// never answer.
fn connect(port: u16) -> Option<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let conn = client
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    conn.set_write_timeout(Some(Duration::from_secs(1))).ok()?;
    Some(conn)
}

/// The process id of the redis-server answering on `port`, if one answers.
fn process_id(port: u16) -> Option<u32> {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut connect(port)?)
        .ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
}

/// Whether the server on `port` runs commands (not still loading its data).
fn ping(port: u16) -> bool {
    connect(port).is_some_and(|mut conn| redis::cmd("PING").query::<String>(&mut conn).is_ok())
}

/// A loopback port for a server, or for an address where none listens: from 20000 to 31999,
/// given once in this process (see [`ports::free_port_in`]).
pub fn free_port() -> u16 {
    ports::free_port_in(20_000..32_000, &[]).expect("a free loopback port from 20000 to 31999")
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The most grants whose windows could overlap: sorted by when they were *received*, grants
/// i..=j happened on Redis within [sent_i, received_j], so count them against that span.
pub fn check_bound(grants: &[(u128, u128)], rate: f64, burst: u64) -> Result<(), String> {
    let mut sorted = grants.to_vec();
    sorted.sort_by_key(|&(_, received)| received);
    let round_trip = sorted.iter().map(|&(s, r)| r - s).max().unwrap_or(0);
    for i in 0..sorted.len() {
        for j in i..sorted.len() {
            let count = (j - i + 1) as f64;
            // Grant i happened no earlier than it was sent, grant j no later than received.
            let span = sorted[j].1.saturating_sub(sorted[i].1) as f64 / 1e9;
            let slack = round_trip as f64 / 1e9;
            let allowed = burst as f64 + (span + slack) * rate;
            if count > allowed + 1e-9 {
                return Err(format!(
                    "{count} grants within {span:.6} s (allowed {allowed:.2})"
                ));
            }
        }
    }
    Ok(())
}
