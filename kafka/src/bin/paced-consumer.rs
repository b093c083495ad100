//! A paced consumer process, for the tests that kill one or move partitions between several:
//!
//!     paced-consumer BROKERS TOPIC PARTITIONS GROUP SINK TAG RATE BURST GLOBAL_RATE GLOBAL_BURST [REDIS_URL]
//!
//! Each partition is paced to RATE per second (bucket BURST), on a limiter in this process, or
//! in Redis at REDIS_URL (shared by every process of the group); all partitions together to
//! GLOBAL_RATE per second (bucket GLOBAL_BURST) in this process. Deliveries are appended to the
//! file SINK, tagged TAG. SIGTERM stops it cleanly: it commits what it stored and leaves the
//! group. SIGKILL leaves what it held to the next owner.

use std::path::Path;

use paced::{KeyedRateLimiter, Rate, RateLimiter, RedisKeyedRateLimiter};
use paced_kafka::pipeline::{consume, subscribe, FileSink, Limits};
use tokio::signal::unix::{signal, SignalKind};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 10 {
        eprintln!(
            "usage: paced-consumer BROKERS TOPIC PARTITIONS GROUP SINK TAG RATE BURST \
             GLOBAL_RATE GLOBAL_BURST [REDIS_URL]"
        );
        std::process::exit(2);
    }
    let number = |i: usize| -> u64 { args[i].parse().expect("a number") };
    let (brokers, topic, group) = (&args[0], &args[1], &args[3]);
    let partitions = number(2) as i32;
    let sink = FileSink::open(Path::new(&args[4]), &args[5]).expect("the sink file");
    let (rate, burst) = (Rate::per_second(number(6)), number(7));
    let global = RateLimiter::new(Rate::per_second(number(8)), number(9));
    let consumer = subscribe(brokers, group, topic);
    let mut term = signal(SignalKind::terminate()).expect("a SIGTERM handler");
    let stop = async move {
        term.recv().await;
    };
    match args.get(10) {
        Some(url) => {
            let per_partition: RedisKeyedRateLimiter<i32> =
                RedisKeyedRateLimiter::builder(url.as_str(), topic.as_str(), rate, burst)
                    .build()
                    .expect("a Redis limiter");
            let limits = Limits {
                per_partition,
                global,
            };
            consume(consumer, topic, partitions, &limits, &sink, stop).await;
        }
        None => {
            let limits = Limits {
                per_partition: KeyedRateLimiter::new(rate, burst),
                global,
            };
            consume(consumer, topic, partitions, &limits, &sink, stop).await;
        }
    }
    eprintln!(
        "{} pid {} stopped",
        paced_kafka::pipeline::now_micros(),
        std::process::id()
    );
}
