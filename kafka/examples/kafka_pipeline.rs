//! A Kafka consumer in a group, paced: each partition to its own rate, the whole topic to a
//! global rate, both charged at the instant a message is delivered to the sink (a file), and an
//! offset stored only once the sink accepted its message. Prints each partition's delivered
//! rate beside its bound, and the topic's beside the global one.
//!
//!     KAFKA_BROKERS=127.0.0.1:9092 cargo run -p paced-kafka --example kafka_pipeline
//!
//! Without `KAFKA_BROKERS` it starts a tansu broker of its own (`$TANSU`, `tansu` on the PATH,
//! or the one `.ci/tansu-requirements.txt` installs). It creates the topic `paced-orders`
//! (4 partitions), produces 850 messages, consumes for 6 seconds and exits.

use std::time::Duration;

use paced::{Limit, Rate};
use paced_kafka::pipeline::{consume, produce, read_sink, subscribe, FileSink, Limits};
use paced_kafka::Broker;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;

const TOPIC: &str = "paced-orders";
const PARTITIONS: i32 = 4;
/// Messages produced to each partition: partition 0 has a backlog.
const PRODUCED: [usize; 4] = [400, 150, 150, 150];
/// Partition 0's own limit; the others have the default.
const BUSY: (u64, u64) = (60, 6);
const DEFAULT: (u64, u64) = (20, 2);
const GLOBAL: (u64, u64) = (100, 10);
const RUN: Duration = Duration::from_secs(6);

#[tokio::main]
async fn main() {
    let (_broker, brokers) = match std::env::var("KAFKA_BROKERS") {
        Ok(brokers) => (None, brokers),
        Err(_) => match Broker::start() {
            Ok(broker) => {
                let address = broker.address();
                println!("started tansu on {address}");
                (Some(broker), address)
            }
            Err(reason) => {
                eprintln!("set KAFKA_BROKERS, or install tansu: {reason}");
                std::process::exit(1);
            }
        },
    };
    create_topic(&brokers).await;
    let b = brokers.clone();
    tokio::task::spawn_blocking(move || {
        for (partition, count) in PRODUCED.iter().enumerate() {
            produce(&b, TOPIC, partition as i32, *count);
        }
    })
    .await
    .expect("produced");
    println!("produced {PRODUCED:?} messages to the partitions of {TOPIC}");

    // A bucket per partition and one for the topic: five dimensions of one limiter.
    let limits: Limits<5> = Limits::new(
        Limit::bucket(Rate::per_second(DEFAULT.0), DEFAULT.1),
        Limit::bucket(Rate::per_second(GLOBAL.0), GLOBAL.1),
    );
    limits.set_partition_limit(0, Limit::bucket(Rate::per_second(BUSY.0), BUSY.1));
    let path = std::env::temp_dir().join(format!("kafka_pipeline-{}", std::process::id()));
    let sink = FileSink::open(&path, "example").expect("the sink file");
    // A group of its own each run, so that it starts at the beginning of the topic.
    let group = format!("kafka_pipeline-{}", std::process::id());
    let consumer = subscribe(&brokers, &group, TOPIC);
    let stop = {
        let path = path.clone();
        async move {
            // Joining the group takes a few seconds: the run counts from the first delivery.
            while read_sink(&path).is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(RUN).await;
        }
    };
    consume(consumer, TOPIC, &limits, &sink, stop).await;

    let arrivals = read_sink(&path);
    let _ = std::fs::remove_file(&path);
    let first = arrivals.iter().map(|a| a.micros).min().unwrap_or(0);
    let last = arrivals.iter().map(|a| a.micros).max().unwrap_or(0);
    let seconds = (last - first) as f64 / 1e6;
    println!("\npartition  delivered  rate/s  bound/s (burst)");
    for partition in 0..PARTITIONS {
        let delivered = arrivals.iter().filter(|a| a.partition == partition).count();
        let (rate, burst) = if partition == 0 { BUSY } else { DEFAULT };
        println!(
            "{partition:>9}  {delivered:>9}  {:>6.1}  {rate:>7} ({burst})",
            delivered as f64 / seconds
        );
    }
    println!(
        "      all  {:>9}  {:>6.1}  {:>7} ({})",
        arrivals.len(),
        arrivals.len() as f64 / seconds,
        GLOBAL.0,
        GLOBAL.1
    );
    println!("over {seconds:.2} s; offsets stored for every delivery, committed on exit");
    // A bucket lets through at most `burst + rate * span` in a span: the first burst is on top.
    println!(
        "Without the first burst, all partitions delivered ({} - {}) / {seconds:.2} s = {:.1}/s, \
         the global rate (kafka/tests/per_partition.rs checks every window).",
        arrivals.len(),
        GLOBAL.1,
        (arrivals.len() as f64 - GLOBAL.1 as f64) / seconds
    );
    println!(
        "The partitions ask for {} a second in all, above the global {}: the topic's bucket \
         serves the partitions whose own bucket has room in turn, and partition 0 gets what \
         the others leave.",
        BUSY.0 + 3 * DEFAULT.0,
        GLOBAL.0
    );
}

/// Creates the topic; one that exists already is kept.
async fn create_topic(brokers: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("an admin client");
    let topic = NewTopic::new(TOPIC, PARTITIONS, TopicReplication::Fixed(1));
    match admin.create_topics([&topic], &AdminOptions::new()).await {
        Ok(results) => {
            for result in results {
                if let Err((name, e)) = result {
                    println!("topic {name}: {e}");
                }
            }
        }
        Err(e) => panic!("create topic {TOPIC}: {e}"),
    }
}
