//! A consumer process killed with SIGKILL while its pacing stage holds messages, then another
//! in the same group: every message reaches the sink, and the only duplicates are what was
//! delivered after the last commit.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use common::{temp_path, wait_for};
use paced_kafka::pipeline::{consumer_config, produce, read_sink};
use paced_kafka::Broker;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

const PER_PARTITION: usize = 150;
const PARTITIONS: i32 = 4;

/// A `paced-consumer` process: 40/s per partition (bucket 4), 100/s in all (bucket 10).
fn consumer(brokers: &str, topic: &str, group: &str, sink: &Path, tag: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_paced-consumer"))
        .args([brokers, topic, &PARTITIONS.to_string(), group])
        .arg(sink)
        .args([tag, "40", "4", "100", "10"])
        .spawn()
        .unwrap()
}

/// The group's committed offset of each partition (`None`: nothing committed).
fn committed(brokers: &str, group: &str, topic: &str) -> Vec<Option<i64>> {
    // It reads the offsets and joins no group.
    let reader: BaseConsumer = consumer_config(brokers, group).create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition(topic, p);
    }
    let offsets = reader
        .committed_offsets(tpl, Duration::from_secs(10))
        .unwrap();
    (0..PARTITIONS)
        .map(
            |p| match offsets.find_partition(topic, p).unwrap().offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            },
        )
        .collect()
}

#[test]
fn a_killed_consumer_loses_nothing() {
    let Some(broker) = Broker::for_test() else {
        return;
    };
    let brokers = broker.address();
    broker.create_topic("kill", PARTITIONS as u32).unwrap();
    for p in 0..PARTITIONS {
        produce(&brokers, "kill", p, PER_PARTITION);
    }
    let total = PER_PARTITION * PARTITIONS as usize;
    let path = temp_path("kill");

    let mut first = consumer(&brokers, "kill", "kill-group", &path, "first");
    wait_for(&path, Duration::from_secs(30), "a third delivered", |a| {
        a.len() >= total / 3
    });
    first.kill().unwrap(); // SIGKILL
    first.wait().unwrap();
    let before = read_sink(&path);
    let mut last_delivered: BTreeMap<i32, i64> = BTreeMap::new();
    for a in &before {
        let last = last_delivered.entry(a.partition).or_insert(-1);
        *last = (*last).max(a.offset);
    }
    let commits = committed(&brokers, "kill-group", "kill");
    eprintln!(
        "killed with {} of {total} delivered; last delivered {last_delivered:?}; committed {commits:?}",
        before.len()
    );
    // An offset is never committed past what the sink accepted.
    for p in 0..PARTITIONS {
        let delivered = last_delivered.get(&p).copied().unwrap_or(-1);
        if let Some(c) = commits[p as usize] {
            assert!(
                c <= delivered + 1,
                "partition {p}: committed {c}, delivered to {delivered}"
            );
        }
    }

    let restarted = std::time::Instant::now();
    let mut second = consumer(&brokers, "kill", "kill-group", &path, "second");
    let unique = |a: &[paced_kafka::pipeline::Arrival]| {
        a.iter()
            .map(|a| (a.partition, a.offset))
            .collect::<BTreeSet<_>>()
            .len()
    };
    wait_for(&path, Duration::from_secs(90), "every message", |a| {
        unique(a) >= total
    });
    eprintln!(
        "the second consumer finished {:?} after its start",
        restarted.elapsed()
    );
    second.kill().unwrap();
    second.wait().unwrap();

    let arrivals = read_sink(&path);
    let _ = std::fs::remove_file(&path);
    let seen: BTreeSet<(i32, i64)> = arrivals.iter().map(|a| (a.partition, a.offset)).collect();
    for p in 0..PARTITIONS {
        for o in 0..PER_PARTITION as i64 {
            assert!(seen.contains(&(p, o)), "lost {p}:{o}");
        }
    }
    // The duplicates are exactly what was delivered but not yet committed at the kill.
    let mut duplicates = 0;
    for p in 0..PARTITIONS {
        let delivered = last_delivered.get(&p).copied().unwrap_or(-1);
        let from = commits[p as usize].unwrap_or(0);
        let expected = (delivered + 1 - from).max(0) as usize;
        let count = arrivals.iter().filter(|a| a.partition == p).count();
        let dups = count - PER_PARTITION;
        eprintln!("partition {p}: {dups} duplicates (delivered to {delivered}, committed {from})");
        assert_eq!(dups, expected, "partition {p}");
        duplicates += dups;
    }
    eprintln!(
        "{duplicates} duplicates in {} deliveries of {total} messages",
        arrivals.len()
    );
}
