//! What the Kafka tests share: the bound over a timeline of arrivals, waiting on a sink file,
//! and a fresh temporary path.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use paced_kafka::pipeline::{read_sink, Arrival};

/// tokio's timer tick: an arrival is stamped after its grant, at most this much later on an
/// unloaded machine.
pub const TICK_US: u64 = 1_000;

/// Checks the token-bucket bound on arrival times (µs): in any window `[t_i, t_j]`, the
/// arrivals number at most `burst + rate × (t_j − t_i + slack)`.
pub fn check_bound(micros: &[u64], rate: f64, burst: f64, slack_us: u64) -> Result<(), String> {
    let mut sorted = micros.to_vec();
    sorted.sort_unstable();
    for i in 0..sorted.len() {
        for j in i..sorted.len() {
            let count = (j - i + 1) as f64;
            let span = (sorted[j] - sorted[i] + slack_us) as f64 / 1e6;
            let allowed = burst + rate * span;
            if count > allowed + 1e-9 {
                return Err(format!(
                    "{count} arrivals within {:.3} ms (allowed {allowed:.2})",
                    (sorted[j] - sorted[i]) as f64 / 1e3
                ));
            }
        }
    }
    Ok(())
}

/// Polls the sink until `done` holds of its arrivals, or panics after `limit`.
pub fn wait_for(path: &Path, limit: Duration, what: &str, done: impl Fn(&[Arrival]) -> bool) {
    let deadline = Instant::now() + limit;
    loop {
        if done(&read_sink(path)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {limit:?} ({} arrivals)",
            read_sink(path).len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A path in the temporary directory, unique to this process and `name`.
pub fn temp_path(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("paced-kafka-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// The arrivals of one partition, in order of arrival.
pub fn of_partition(arrivals: &[Arrival], partition: i32) -> Vec<Arrival> {
    let mut of: Vec<_> = arrivals
        .iter()
        .filter(|a| a.partition == partition)
        .cloned()
        .collect();
    of.sort_by_key(|a| a.micros);
    of
}

/// The least slack (µs) with which `check_bound` would pass: how far the tightest window of
/// arrivals comes to the bound (negative: that much to spare).
pub fn needed_slack_us(micros: &[u64], rate: f64, burst: f64) -> i64 {
    let mut sorted = micros.to_vec();
    sorted.sort_unstable();
    let mut needed = i64::MIN;
    for i in 0..sorted.len() {
        for j in i..sorted.len() {
            let count = (j - i + 1) as f64;
            let span_us = (sorted[j] - sorted[i]) as f64;
            needed = needed.max(((count - burst) / rate * 1e6 - span_us).ceil() as i64);
        }
    }
    needed
}
