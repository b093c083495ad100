//! A paced consumer process, for the tests that kill one or move partitions between several:
//!
//!     paced-consumer BROKERS TOPIC PARTITIONS GROUP SINK TAG RATE BURST GLOBAL_RATE GLOBAL_BURST
//!     paced-consumer BROKERS TOPIC PARTITIONS GROUP SINK TAG RATE BURST REDIS_URL
//!
//! Each partition is paced to RATE per second (bucket BURST). In the first form the limits
//! live in this process, and all partitions together are paced to GLOBAL_RATE per second
//! (bucket GLOBAL_BURST), charged with the partition's at one instant (up to 8 partitions).
//! In the second, each partition's bucket lives in Redis at REDIS_URL, shared by every process
//! of the group, and there is no global limit: a limit in this process could not be charged
//! in the same step as one in Redis. Deliveries are appended to the file SINK, tagged TAG.
//! SIGTERM stops it cleanly: it commits what it stored and leaves the group. SIGKILL leaves
//! what it held to the next owner.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use paced::{Limit, Rate, RedisKeyedRateLimiter};
use paced_kafka::pipeline::{consume, consume_keyed, subscribe, FileSink, Limits, PacedConsumer};
use tokio::signal::unix::{signal, SignalKind};

const USAGE: &str = "usage: paced-consumer BROKERS TOPIC PARTITIONS GROUP SINK TAG RATE BURST \
                     (GLOBAL_RATE GLOBAL_BURST | REDIS_URL)";

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 9 {
        eprintln!("{USAGE}");
        std::process::exit(2);
    }
    let number = |i: usize| -> u64 { args[i].parse().expect("a number") };
    let (brokers, topic, group) = (&args[0], &args[1], &args[3]);
    let partitions = number(2) as i32;
    let sink = FileSink::open(Path::new(&args[4]), &args[5]).expect("the sink file");
    let (rate, burst) = (Rate::per_second(number(6)), number(7));
    let consumer = subscribe(brokers, group, topic);
    let mut term = signal(SignalKind::terminate()).expect("a SIGTERM handler");
    let stop = async move {
        term.recv().await;
    };
    if args.len() == 9 {
        let per_partition: RedisKeyedRateLimiter<i32> =
            RedisKeyedRateLimiter::builder(args[8].as_str(), topic.as_str(), rate, burst)
                .build()
                .expect("a Redis limiter");
        consume_keyed(consumer, topic, partitions, &per_partition, &sink, stop).await;
    } else {
        let per_partition = Limit::bucket(rate, burst);
        let global = Limit::bucket(Rate::per_second(number(8)), number(9));
        let run = In {
            consumer,
            topic,
            per_partition,
            global,
            sink: &sink,
        };
        // The number of partitions is a type parameter of the limits: one per dimension, and
        // one for the topic.
        match partitions {
            1 => run.consume::<2>(stop).await,
            2 => run.consume::<3>(stop).await,
            3 => run.consume::<4>(stop).await,
            4 => run.consume::<5>(stop).await,
            5 => run.consume::<6>(stop).await,
            6 => run.consume::<7>(stop).await,
            7 => run.consume::<8>(stop).await,
            8 => run.consume::<9>(stop).await,
            _ => {
                eprintln!("{USAGE}: 1 to 8 partitions without Redis");
                std::process::exit(2);
            }
        }
    }
    eprintln!(
        "{} pid {} stopped",
        paced_kafka::pipeline::now_micros(),
        std::process::id()
    );
}

/// A run with its limits in this process.
struct In<'a> {
    consumer: Arc<PacedConsumer>,
    topic: &'a str,
    per_partition: Limit,
    global: Limit,
    sink: &'a FileSink,
}

impl In<'_> {
    async fn consume<const N: usize>(self, stop: impl Future<Output = ()>) {
        let limits = Limits::<N>::new(self.per_partition, self.global);
        consume(self.consumer, self.topic, &limits, self.sink, stop).await;
    }
}
