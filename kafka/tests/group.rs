//! Three consumer processes in one group, each partition paced on Redis: a member joins and
//! another leaves mid-run, each partition keeps its bound on the merged timeline of arrivals
//! across the moves, and nothing is lost.

mod common;
#[path = "../../tests/common/redis_server.rs"]
// `check_bound` times grants; this test times arrivals (`common::check_bound`). The helper is
// written for the root's Rust 1.85, before let chains: this member's 1.88 would collapse its ifs.
#[allow(dead_code, clippy::collapsible_if)]
mod redis_server;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::{check_bound, needed_slack_us, of_partition, temp_path, wait_for, TICK_US};
use paced_kafka::pipeline::{produce, read_sink, Arrival};
use paced_kafka::Broker;

const PER_PARTITION: usize = 250;
const PARTITIONS: i32 = 4;
const RATE: u64 = 20;
const BURST: u64 = 2;
/// Redis charges a message on its own clock; the process emits it after the reply came back
/// (a loopback round trip, budgeted 1 ms) and its wait ended on tokio's timer (up to two ticks
/// late). A stamp can trail its charge by that much, so windows of stamps get that slack.
const SLACK_US: u64 = 2 * TICK_US + 1_000;

/// A `paced-consumer` process: RATE per partition (bucket BURST) on Redis.
fn consumer(brokers: &str, sink: &Path, tag: &str, redis: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_paced-consumer"))
        .args([brokers, "group", &PARTITIONS.to_string(), "group-group"])
        .arg(sink)
        .args([tag, &RATE.to_string(), &BURST.to_string(), redis])
        .spawn()
        .unwrap()
}

fn unique(arrivals: &[Arrival]) -> usize {
    arrivals
        .iter()
        .map(|a| (a.partition, a.offset))
        .collect::<BTreeSet<_>>()
        .len()
}

#[test]
fn each_partition_keeps_its_bound_across_the_group() {
    let Some(broker) = Broker::for_test() else {
        return;
    };
    let found = std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok();
    if !found && std::env::var("CI").as_deref() != Ok("true") {
        eprintln!("skipped: no redis-server (apt-get install redis-server)");
        return;
    }
    let redis = redis_server::Server::start();
    let brokers = broker.address();
    broker.create_topic("group", PARTITIONS as u32).unwrap();
    for p in 0..PARTITIONS {
        produce(&brokers, "group", p, PER_PARTITION);
    }
    let total = PER_PARTITION * PARTITIONS as usize;
    let path = temp_path("group");
    let started = Instant::now();

    let mut a = consumer(&brokers, &path, "a", &redis.url());
    let mut b = consumer(&brokers, &path, "b", &redis.url());
    wait_for(&path, Duration::from_secs(30), "deliveries", |a| {
        a.len() >= 150
    });
    eprintln!("{:?}: c joins", started.elapsed());
    let mut c = consumer(&brokers, &path, "c", &redis.url());
    wait_for(&path, Duration::from_secs(60), "c's deliveries", |all| {
        all.iter().filter(|x| x.tag == "c").count() >= 20
    });
    eprintln!("{:?}: a leaves (SIGTERM)", started.elapsed());
    let status = Command::new("kill")
        .args(["-TERM", &a.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    a.wait().unwrap();
    wait_for(&path, Duration::from_secs(120), "every message", |a| {
        unique(a) >= total
    });
    eprintln!("{:?}: every message delivered", started.elapsed());
    for child in [&mut b, &mut c] {
        child.kill().unwrap();
        child.wait().unwrap();
    }

    let arrivals = read_sink(&path);
    let _ = std::fs::remove_file(&path);
    assert_eq!(unique(&arrivals), total, "lost messages");
    let mut moved = 0;
    for p in 0..PARTITIONS {
        let of = of_partition(&arrivals, p);
        let micros: Vec<u64> = of.iter().map(|a| a.micros).collect();
        // One bound for the partition, whichever process delivered.
        check_bound(&micros, RATE as f64, BURST as f64, SLACK_US)
            .unwrap_or_else(|e| panic!("partition {p}: {e}"));
        let mut by: BTreeMap<&str, usize> = BTreeMap::new();
        for a in &of {
            *by.entry(a.tag.as_str()).or_default() += 1;
        }
        let span = (micros[micros.len() - 1] - micros[0]) as f64 / 1e6;
        eprintln!(
            "partition {p}: {} deliveries ({} duplicates) in {span:.2} s, {:.1}/s \
             (bound {RATE}/s), tightest window needs {} µs of slack, by {by:?}",
            of.len(),
            of.len() - PER_PARTITION,
            (of.len() - 1) as f64 / span,
            needed_slack_us(&micros, RATE as f64, BURST as f64),
        );
        if by.len() > 1 {
            moved += 1;
        }
    }
    assert!(moved > 0, "no partition moved between processes");
    assert!(
        arrivals.iter().any(|a| a.tag == "c"),
        "the member that joined delivered nothing"
    );
}
