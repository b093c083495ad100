//! Eight Kafka partitions share one SMS provider's account quota, and the quota is raised live.
//!
//! The provider allows `N` messages per second for the whole account, however many consumers
//! send. Each partition's consumer throttles its own stream with `throttle_with` on one shared
//! `RateLimiter`, so together they never exceed the quota. The limiter serves waiters in
//! arrival order and each partition waits with one message at a time, so a busy partition
//! cannot crowd out a quiet one: quiet partitions get all they ask for, busy ones share the
//! rest equally.
//!
//! Messages arrive faster (about 355/s in all, unevenly spread) than the quota allows, so the
//! busy partitions build up lag. After two seconds the provider upgrades the account from
//! 100/s to 200/s and `set_rate` takes effect at once, also for those already waiting.
//!
//! ```text
//! cargo run --example sms_provider
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use paced::{PaceExt, Rate, RateLimiter, Shaping};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{Stream, StreamExt};

/// Prints a line prefixed with the time elapsed since `start`.
macro_rules! log {
    ($start:expr, $($arg:tt)*) => {
        println!("[{:>6.3}s] {}", $start.elapsed().as_secs_f64(), format_args!($($arg)*))
    };
}

const PARTITIONS: usize = 8;
/// Messages per second produced to each partition, on average.
const PRODUCED_PER_SEC: [u64; PARTITIONS] = [5, 10, 20, 30, 50, 60, 80, 100];
const QUOTA: u64 = 100;
const UPGRADED_QUOTA: u64 = 200;
/// What the provider lets through at one instant. Above 1 so that a timer waking a
/// millisecond late loses no quota (see `throttle`'s notes on exactness).
const BURST: u64 = 5;
const UPGRADE_AFTER_SECS: usize = 2;
const RUN_SECS: usize = 5;

/// Messages sent in each second, per partition.
type Sent = Arc<Mutex<Vec<[u64; PARTITIONS]>>>;

#[tokio::main]
async fn main() {
    let start = Instant::now();
    let provider = RateLimiter::new(Rate::per_second(QUOTA), BURST);
    // Sending on `stop` tells every producer and consumer to stop.
    let (stop, shutdown) = watch::channel(());
    let sent: Sent = Arc::new(Mutex::new(vec![[0; PARTITIONS]; RUN_SECS + 1]));

    let mut producers = JoinSet::new();
    let mut consumers = JoinSet::new();
    for p in 0..PARTITIONS {
        // The partition's log: a producer appends at its own pace, the consumer reads it.
        let (tx, rx) = mpsc::unbounded_channel();
        producers.spawn(produce(p, tx, shutdown.clone()));
        let messages = UnboundedReceiverStream::new(rx).throttle_with(&provider, |_| 1, Shaping);
        consumers.spawn(consume(p, messages, shutdown.clone(), start, sent.clone()));
    }

    log!(
        start,
        "{PARTITIONS} partitions share {QUOTA} SMS/s (burst {BURST}); about {} produced/s",
        PRODUCED_PER_SEC.iter().sum::<u64>()
    );
    let mut report =
        tokio::time::interval_at(start + Duration::from_secs(1), Duration::from_secs(1));
    let mut quota = QUOTA;
    for second in 0..RUN_SECS {
        report.tick().await;
        let counts = sent.lock().unwrap()[second];
        let total: u64 = counts.iter().sum();
        let per_partition: Vec<String> = counts.iter().map(|n| format!("{n:>3}")).collect();
        log!(
            start,
            "second {second}: {total:>3} sent (at most {:>3}: the quota and the burst) | per partition {}",
            quota + BURST,
            per_partition.join(" ")
        );
        // The bucket's bound over one second: the quota plus what the bucket held.
        assert!(
            total <= quota + BURST,
            "second {second}: {total} > {quota} + {BURST}"
        );
        assert!(
            counts.iter().all(|&n| n > 0),
            "a partition starved: {counts:?}"
        );

        if second + 1 == UPGRADE_AFTER_SECS {
            quota = UPGRADED_QUOTA;
            provider.set_rate(Rate::per_second(quota));
            log!(start, "provider upgraded the account to {quota} SMS/s");
        }
    }

    stop.send(()).expect("the tasks are listening");
    let mut produced = [0u64; PARTITIONS];
    let mut delivered = [0u64; PARTITIONS];
    while let Some(result) = producers.join_next().await {
        let (p, n) = result.expect("a producer panicked");
        produced[p] = n;
    }
    while let Some(result) = consumers.join_next().await {
        let (p, n) = result.expect("a consumer panicked");
        delivered[p] = n;
    }
    log!(start, "shut down");

    let lag: Vec<u64> = (0..PARTITIONS)
        .map(|p| produced[p] - delivered[p])
        .collect();
    let stats = provider.stats();
    println!();
    println!("produced per partition: {produced:?}");
    println!("sent per partition:     {delivered:?}");
    println!("lag per partition:      {lag:?}");
    println!(
        "provider: {} granted, {} waiting, mean wait {:.1?}",
        stats.granted,
        stats.waiting,
        stats.total_wait / u32::try_from(stats.granted).unwrap()
    );
}

/// Appends messages to partition `p` at its own irregular pace until `shutdown`; returns
/// `(p, messages produced)`.
async fn produce(
    p: usize,
    tx: mpsc::UnboundedSender<u64>,
    mut shutdown: watch::Receiver<()>,
) -> (usize, u64) {
    let mean = Duration::from_secs(1) / PRODUCED_PER_SEC[p] as u32;
    // A tiny xorshift, so each partition has its own reproducible jitter without a `rand`
    // dependency: gaps between 0.5 and 1.5 times the mean.
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64 ^ (p as u64 + 1);
    let mut n = 0;
    loop {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let gap = mean.mul_f64(0.5 + (seed % 1000) as f64 / 1000.0);
        tokio::select! {
            _ = shutdown.changed() => return (p, n),
            () = tokio::time::sleep(gap) => {}
        }
        n += 1;
        // Fails only once the consumer has stopped, at shutdown.
        let _ = tx.send(n);
    }
}

/// Sends partition `p`'s throttled messages until `shutdown`, leaving the lag behind; returns
/// `(p, messages sent)`.
async fn consume(
    p: usize,
    messages: impl Stream<Item = u64>,
    mut shutdown: watch::Receiver<()>,
    start: Instant,
    sent: Sent,
) -> (usize, u64) {
    let mut messages = std::pin::pin!(messages);
    let mut total = 0;
    // A message still waiting for its turn is dropped with the stream, having taken nothing.
    while let Some(n) = tokio::select! {
        n = messages.next() => n,
        _ = shutdown.changed() => None,
    } {
        {
            // Count the message in the second it was granted. The clock is read under the
            // lock, so a report that has closed a second never misses a message of it.
            let mut sent = sent.lock().unwrap();
            let second = start.elapsed().as_secs() as usize;
            if let Some(counts) = sent.get_mut(second) {
                counts[p] += 1;
            }
        }
        send_sms(n).await;
        total += 1;
    }
    (p, total)
}

/// A pretend call to the provider's HTTP API.
async fn send_sms(_n: u64) {
    tokio::time::sleep(Duration::from_millis(2)).await;
}
