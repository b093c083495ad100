//! The paced consumer: its settings, a stream per partition paced by a keyed limiter and a
//! global one, a sink that appends to a file, and offsets stored only for what it accepted.

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use futures_util::StreamExt;
use paced::{KeyedLimiter, PaceExt, RateLimiter, Shaping};
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;
use rdkafka::{ClientContext, TopicPartitionList};

/// The consumer's settings for pacing, on top of the address and the group:
///
/// - `enable.auto.offset.store=false`: rdkafka would otherwise store a message's offset when
///   it hands the message to the application, before the pacing stage has delivered it, and a
///   crash would skip what the stage held. The pipeline stores each offset itself, after the
///   sink accepted the message.
/// - `enable.auto.commit=true`: the stored offsets are committed in the background, every
///   `auto.commit.interval.ms`. What was delivered after the last commit is delivered again
///   after a crash: at least once.
/// - `auto.offset.reset=earliest`: a new group starts at the beginning of each partition.
/// - `session.timeout.ms=6000`: a member that died is replaced after 6 s, not 45.
pub fn consumer_config(brokers: &str, group: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.offset.store", "false")
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "200")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500");
    config
}

/// A consumer context that logs each rebalance to stderr, with the wall-clock time in µs.
#[derive(Debug, Default)]
pub struct Logged;

impl ClientContext for Logged {}

impl ConsumerContext for Logged {
    fn post_rebalance(&self, _consumer: &BaseConsumer<Logged>, rebalance: &Rebalance<'_>) {
        let what = match rebalance {
            Rebalance::Assign(tpl) => format!("assigned {:?}", partitions(tpl)),
            Rebalance::Revoke(tpl) => format!("revoked {:?}", partitions(tpl)),
            Rebalance::Error(e) => format!("rebalance error {e}"),
        };
        eprintln!("{} pid {} {what}", now_micros(), std::process::id());
    }
}

fn partitions(tpl: &TopicPartitionList) -> Vec<i32> {
    tpl.elements().iter().map(|e| e.partition()).collect()
}

/// The consumer this crate builds.
pub type PacedConsumer = StreamConsumer<Logged>;

/// Creates a consumer and subscribes it to `topic`.
pub fn subscribe(brokers: &str, group: &str, topic: &str) -> Arc<PacedConsumer> {
    let consumer: PacedConsumer = consumer_config(brokers, group)
        .create_with_context(Logged)
        .expect("a consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    Arc::new(consumer)
}

/// Microseconds since the Unix epoch: one clock for every process on the machine.
pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64
}

/// The sink: a file of lines `partition offset micros tag`, appended to by one or more
/// processes. A line is written with one `write` call on a file opened to append, so lines
/// from several processes do not interleave. The write returning is the sink accepting.
#[derive(Debug)]
pub struct FileSink {
    file: Mutex<File>,
    tag: String,
}

impl FileSink {
    /// Opens (or creates) `path` to append, tagging each line with `tag`.
    pub fn open(path: &Path, tag: &str) -> std::io::Result<FileSink> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(FileSink {
            file: Mutex::new(file),
            tag: tag.to_owned(),
        })
    }

    /// Appends one delivery, stamped `micros`.
    pub fn deliver(&self, partition: i32, offset: i64, micros: u64) -> std::io::Result<()> {
        let line = format!("{partition} {offset} {micros} {}\n", self.tag);
        let mut file = self.file.lock().expect("sink lock");
        file.write_all(line.as_bytes())?;
        file.flush()
    }
}

/// One line of a sink file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// The message's partition.
    pub partition: i32,
    /// The message's offset.
    pub offset: i64,
    /// When it reached the sink, in µs since the Unix epoch.
    pub micros: u64,
    /// Which consumer delivered it.
    pub tag: String,
}

/// Reads a sink file. A missing file is no arrival.
pub fn read_sink(path: &Path) -> Vec<Arrival> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            Some(Arrival {
                partition: fields.next()?.parse().ok()?,
                offset: fields.next()?.parse().ok()?,
                micros: fields.next()?.parse().ok()?,
                tag: fields.next()?.to_owned(),
            })
        })
        .collect()
}

/// Produces `count` messages to `partition` of `topic` and waits until the broker has them.
pub fn produce(brokers: &str, topic: &str, partition: i32, count: usize) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "5")
        .create()
        .expect("a producer");
    for i in 0..count {
        let payload = format!("{partition}-{i}");
        let mut record = BaseRecord::<(), _>::to(topic)
            .partition(partition)
            .payload(&payload);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    // The local queue is full: let it drain.
                    record = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }
    producer
        .flush(Duration::from_secs(60))
        .expect("the broker took every message");
}

/// The limits of one consumer: `per_partition`, a keyed limiter keyed by partition (in this
/// process, or in Redis for a group across machines), and `global`, one bucket for all.
#[derive(Debug)]
pub struct Limits<K> {
    /// One bucket per partition.
    pub per_partition: K,
    /// One bucket for the whole topic.
    pub global: RateLimiter,
}

/// Consumes `partitions` partitions of `topic` until `stop` resolves: a stream per partition
/// (`split_partition_queue`), paced by the global limiter, then by its partition's, delivered
/// to `sink`; each offset is stored only once the sink accepted its message. Then commits what
/// was stored.
///
/// The partition's limiter is the stage nearest the sink, so its bound holds exactly at the
/// sink. The global bound holds where the global limiter grants; the partition stage after it
/// holds at most one item per partition, so at the sink the global bound can be exceeded by
/// at most one item per partition.
pub async fn consume<K>(
    consumer: Arc<PacedConsumer>,
    topic: &str,
    partitions: i32,
    limits: &Limits<K>,
    sink: &FileSink,
    stop: impl Future<Output = ()>,
) where
    K: KeyedLimiter<Key = i32, Cost = u64>,
{
    // Split before the first poll, so that no message of these partitions reaches the main
    // queue. A queue whose partition is not assigned here stays empty.
    let queues: Vec<_> = (0..partitions)
        .map(|p| {
            consumer
                .split_partition_queue(topic, p)
                .expect("a partition queue")
        })
        .collect();
    // The main queue carries the rebalances and errors; polling it keeps this member in the
    // group (`max.poll.interval.ms`) however slowly the partitions are paced.
    let main = {
        let consumer = consumer.clone();
        async move {
            loop {
                match consumer.recv().await {
                    Ok(m) => eprintln!("unexpected message on the main queue: {}", m.partition()),
                    Err(e) => eprintln!("consumer error: {e}"),
                }
            }
        }
    };
    let lanes = queues.iter().enumerate().map(|(p, queue)| {
        let p = p as i32;
        let consumer = &consumer;
        queue
            .stream()
            .throttle_with(&limits.global, |_| 1, Shaping)
            .throttle_by_key(&limits.per_partition, move |_| p, |_| 1, 1)
            .for_each(move |message| {
                let micros = now_micros();
                match message {
                    Ok(m) => match sink.deliver(m.partition(), m.offset(), micros) {
                        // Stored only now: the next commit covers it. After a rebalance took
                        // the partition away, storing fails and the new owner delivers it
                        // again.
                        Ok(()) => {
                            if let Err(e) = consumer.store_offset_from_message(&m) {
                                eprintln!("offset of {p}:{} not stored: {e}", m.offset());
                            }
                        }
                        Err(e) => eprintln!("sink refused {p}:{}: {e}", m.offset()),
                    },
                    Err(e) => eprintln!("partition {p}: {e}"),
                }
                async {}
            })
    });
    tokio::select! {
        _ = join_all(lanes) => {}
        _ = main => {}
        _ = stop => {}
    }
    if let Err(e) = consumer.commit_consumer_state(CommitMode::Sync) {
        eprintln!("final commit: {e}");
    }
}
