//! Pacing slower than `max.poll.interval.ms`: pacing the consumer's own stream stops polling
//! it, and the member is evicted; pacing partition queues while a task polls the main queue
//! keeps the member in the group.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use paced::{PaceExt, Rate, Shaping};
use paced_kafka::pipeline::produce;
use paced_kafka::Broker;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::ClientContext;

/// librdkafka's floor: `max.poll.interval.ms` may not be below `session.timeout.ms`.
const MAX_POLL_MS: u64 = 1_000;
/// One message every 2.5 s: longer than the poll interval.
const SLOW: Rate = Rate::per_minute(24);
const MESSAGES: usize = 4;

/// Counts the partitions revoked and the poll-interval errors.
#[derive(Default)]
struct Counting {
    revoked: AtomicUsize,
}

impl ClientContext for Counting {}

impl ConsumerContext for Counting {
    fn post_rebalance(&self, _: &BaseConsumer<Counting>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            self.revoked.fetch_add(tpl.count(), Ordering::SeqCst);
        }
    }
}

fn slow_consumer(brokers: &str, group: &str, topic: &str) -> Arc<StreamConsumer<Counting>> {
    let consumer: StreamConsumer<Counting> = paced_kafka::pipeline::consumer_config(brokers, group)
        .set("session.timeout.ms", MAX_POLL_MS.to_string())
        .set("heartbeat.interval.ms", "300")
        .set("max.poll.interval.ms", MAX_POLL_MS.to_string())
        .create_with_context(Counting::default())
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    Arc::new(consumer)
}

fn setup(topic: &str) -> Option<(Broker, String)> {
    let broker = Broker::for_test()?;
    broker.create_topic(topic, 1).unwrap();
    let brokers = broker.address();
    produce(&brokers, topic, 0, MESSAGES);
    Some((broker, brokers))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pacing_the_consumer_stream_itself_gets_the_member_evicted() {
    let Some((_broker, brokers)) = setup("slow-trap") else {
        return;
    };
    let consumer = slow_consumer(&brokers, "slow-trap", "slow-trap");
    let mut exceeded = 0;
    let mut delivered = 0;
    let mut stream = std::pin::pin!(consumer.stream().throttle(SLOW, |_| 1, 1, Shaping));
    let run = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(item) = stream.next().await {
            match item {
                Ok(m) => {
                    delivered += 1;
                    let _ = consumer.store_offset_from_message(&m);
                    if delivered == MESSAGES {
                        break;
                    }
                }
                Err(KafkaError::MessageConsumption(e)) => {
                    eprintln!("consumer error: {e}");
                    exceeded += 1;
                }
                Err(e) => eprintln!("consumer error: {e}"),
            }
        }
    });
    let _ = run.await;
    let revoked = consumer.context().revoked.load(Ordering::SeqCst);
    eprintln!("trap: {delivered} delivered, {exceeded} poll errors, {revoked} revoked");
    assert!(
        exceeded + revoked > 0,
        "a stream paced below max.poll.interval.ms kept its member"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pacing_a_partition_queue_keeps_the_member() {
    let Some((_broker, brokers)) = setup("slow-split") else {
        return;
    };
    let consumer = slow_consumer(&brokers, "slow-split", "slow-split");
    let queue = consumer.split_partition_queue("slow-split", 0).unwrap();
    let main = {
        let consumer = consumer.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = consumer.recv().await {
                    eprintln!("main queue: {e}");
                }
            }
        })
    };
    let mut offsets = Vec::new();
    let started = std::time::Instant::now();
    let mut stream = std::pin::pin!(queue.stream().throttle(SLOW, |_| 1, 1, Shaping));
    while offsets.len() < MESSAGES {
        let m = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("a message within 30 s")
            .unwrap()
            .unwrap();
        offsets.push(m.offset());
        consumer.store_offset_from_message(&m).unwrap();
    }
    main.abort();
    // Wait until the task is gone: it holds a handle of the consumer, and a consumer closed
    // after the broker (dropped at the end of this function, or when the runtime shuts down)
    // waits for it forever.
    let _ = main.await;
    let revoked = consumer.context().revoked.load(Ordering::SeqCst);
    eprintln!(
        "split: offsets {offsets:?} in {:?}, {revoked} revoked",
        started.elapsed()
    );
    assert_eq!(offsets, (0..MESSAGES as i64).collect::<Vec<_>>());
    assert_eq!(revoked, 0, "the member lost its partition");
}
