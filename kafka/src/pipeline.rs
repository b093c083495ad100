//! The paced consumer: its settings, a stream per partition paced on its partition's bucket
//! and the topic's at once, a sink that appends to a file, and offsets stored only for what it
//! accepted.

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::Write;
use std::path::Path;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use futures_util::StreamExt;
use paced::limiter::KeyedLimiter;
use paced::{Limit, PaceExt, RateLimiter};
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::KafkaResult;
use rdkafka::message::{BorrowedMessage, Message};
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

/// The limits of one consumer over `N - 1` partitions: a bucket per partition and one for the
/// whole topic, as the dimensions of one [`RateLimiter`]. Partition `p` is dimension `p`;
/// the topic is the last.
///
/// A message is charged on both at one instant, the instant it is delivered. Two chained
/// stages (`throttle_with` on a global limiter, then `throttle_by_key` on a keyed one) would
/// not do: each stage charges its limiter when it emits into the next, and the next can hold
/// the item. Only the stage nearest the sink keeps its bound exactly at the sink; the other's
/// is exceeded there by up to one held item per partition.
#[derive(Clone, Debug)]
pub struct Limits<const N: usize> {
    limiter: RateLimiter<[u64; N]>,
}

impl<const N: usize> Limits<N> {
    /// Every partition to `per_partition`, all of them together to `global`.
    ///
    /// # Panics
    ///
    /// If `N` is below 2 (no partition), or a limit cannot be (a burst of 0).
    #[track_caller]
    pub fn new(per_partition: Limit, global: Limit) -> Limits<N> {
        assert!(N >= 2, "Limits::new: N counts the partitions and the topic");
        let names: [String; N] = std::array::from_fn(|d| {
            if d == N - 1 {
                "topic".to_owned()
            } else {
                format!("partition {d}")
            }
        });
        let mut builder = RateLimiter::builder(std::array::from_fn(|d| names[d].as_str()));
        for name in &names[..N - 1] {
            builder = builder.limit(name, per_partition);
        }
        let limiter = builder
            .limit(&names[N - 1], global)
            .build()
            .unwrap_or_else(|e| panic!("Limits::new: {e}"));
        Limits { limiter }
    }

    /// Gives `partition` a limit of its own.
    ///
    /// # Panics
    ///
    /// If there is no such partition, or the limit cannot be.
    #[track_caller]
    pub fn set_partition_limit(&self, partition: i32, limit: Limit) {
        let index = usize::try_from(partition).expect("a partition");
        assert!(
            index < N - 1,
            "Limits::set_partition_limit: no partition {partition}"
        );
        // The limits were added in the order of the dimensions: partition p's is limit p.
        self.limiter.set_limit(index, limit);
    }

    /// The number of partitions.
    pub const fn partitions(&self) -> i32 {
        N as i32 - 1
    }

    /// Waits until one message of `partition` is granted on its bucket and the topic's, both
    /// charged at the instant of the grant.
    ///
    /// A message whose partition's bucket has room joins the limiter's queue (first come, first
    /// served), where it waits only for the topic's bucket: only this partition's stream charges
    /// its bucket, so the room stays. A message whose bucket is empty stays out of the queue
    /// and sleeps until it could be granted: it never holds up another partition.
    async fn grant(&self, partition: usize) {
        let mut cost = [0; N];
        cost[partition] = 1;
        cost[N - 1] = 1;
        loop {
            if self.limiter.available()[partition] >= 1 {
                self.limiter.acquire(cost).await;
                return;
            }
            match self.limiter.try_acquire(cost) {
                Ok(_) => return,
                Err(refused) if refused.is_never() => {
                    self.limiter.acquire(cost).await;
                    return;
                }
                Err(refused) => tokio::time::sleep(refused.retry_after()).await,
            }
        }
    }
}

/// Consumes the `N - 1` partitions of `topic` until `stop` resolves: a stream per partition
/// (`split_partition_queue`), each message granted on its partition's bucket and the topic's
/// at once ([`Limits`]), then delivered to `sink` at once; each offset is stored only once the
/// sink accepted its message. Then commits what was stored.
///
/// The grant and the delivery are one step, with no stage between them, so both bounds hold
/// at the sink, up to the time a delivery takes.
pub async fn consume<const N: usize>(
    consumer: Arc<PacedConsumer>,
    topic: &str,
    limits: &Limits<N>,
    sink: &FileSink,
    stop: impl Future<Output = ()>,
) {
    let queues = split(&consumer, topic, limits.partitions());
    let lanes = queues.iter().enumerate().map(|(p, queue)| {
        let consumer = &consumer;
        async move {
            let mut messages = pin!(queue.stream());
            while let Some(message) = messages.next().await {
                limits.grant(p).await;
                deliver(consumer, sink, p as i32, message);
            }
        }
    });
    drive(&consumer, join_all(lanes), stop).await;
}

/// Consumes `partitions` partitions of `topic` as [`consume`] does, each paced by
/// `per_partition`, a keyed limiter keyed by partition (in Redis for a group across machines),
/// with no limit over the topic: one stage, the one nearest the sink, so its bound holds
/// there.
pub async fn consume_keyed<K>(
    consumer: Arc<PacedConsumer>,
    topic: &str,
    partitions: i32,
    per_partition: &K,
    sink: &FileSink,
    stop: impl Future<Output = ()>,
) where
    K: KeyedLimiter<Key = i32, Cost = u64>,
{
    let queues = split(&consumer, topic, partitions);
    let lanes = queues.iter().zip(0..).map(|(queue, p)| {
        let consumer = &consumer;
        queue
            .stream()
            .throttle_by_key(per_partition, move |_| p, |_| 1, 1)
            .for_each(move |message| {
                deliver(consumer, sink, p, message);
                async {}
            })
    });
    drive(&consumer, join_all(lanes), stop).await;
}

/// A queue per partition, split before the first poll, so that no message of these partitions
/// reaches the main queue. A queue whose partition is not assigned here stays empty.
fn split(
    consumer: &Arc<PacedConsumer>,
    topic: &str,
    partitions: i32,
) -> Vec<StreamPartitionQueue<Logged>> {
    (0..partitions)
        .map(|p| {
            consumer
                .split_partition_queue(topic, p)
                .expect("a partition queue")
        })
        .collect()
}

/// Delivers a message to `sink`, stamped now, and stores its offset once the sink accepted it.
fn deliver(
    consumer: &PacedConsumer,
    sink: &FileSink,
    p: i32,
    message: KafkaResult<BorrowedMessage<'_>>,
) {
    let micros = now_micros();
    match message {
        Ok(m) => match sink.deliver(m.partition(), m.offset(), micros) {
            // Stored only now: the next commit covers it. After a rebalance took the partition
            // away, storing fails and the new owner delivers it again.
            Ok(()) => {
                if let Err(e) = consumer.store_offset_from_message(&m) {
                    eprintln!("offset of {p}:{} not stored: {e}", m.offset());
                }
            }
            Err(e) => eprintln!("sink refused {p}:{}: {e}", m.offset()),
        },
        Err(e) => eprintln!("partition {p}: {e}"),
    }
}

/// Runs `lanes` until they end or `stop` resolves, polling the main queue all along, then
/// commits what was stored.
async fn drive(
    consumer: &Arc<PacedConsumer>,
    lanes: impl Future<Output = Vec<()>>,
    stop: impl Future<Output = ()>,
) {
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
    tokio::select! {
        _ = lanes => {}
        _ = main => {}
        _ = stop => {}
    }
    if let Err(e) = consumer.commit_consumer_state(CommitMode::Sync) {
        eprintln!("final commit: {e}");
    }
}
