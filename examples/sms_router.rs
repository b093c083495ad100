//! One stream of SMS messages routed to three providers, each with its own limit.
//!
//! The router reads one stream (a Kafka topic, a channel) of messages already assigned to a
//! provider. Provider A allows 2 messages per second, B 5 per second, C 50 per second. One
//! `KeyedRateLimiter` holds a bucket per provider, and `throttle_by_key` paces the one stream
//! by it: each provider's messages leave in their order and at their provider's rate, and a
//! backlog at slow provider A holds up nobody else. With a plain `throttle_with` on one
//! limiter, every message behind A's backlog would wait for it (head-of-line blocking).
//!
//! The run takes about 4 seconds of virtual time and finishes at once: it runs under paused
//! time, as a user's own tests would.
//!
//! ```text
//! cargo run --example sms_router
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use paced::{KeyedRateLimiter, PaceExt, Rate};
use tokio::time::Instant;
use tokio_stream::{self as stream, StreamExt};

#[derive(Debug)]
struct Sms {
    provider: char,
    number: u32,
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    // Every provider: 2 per second, one at a time, unless it has a limit of its own.
    let providers = KeyedRateLimiter::new(Rate::per_second(2), 1);
    providers.set_limit(&'B', Rate::per_second(5), 1);
    providers.set_limit(&'C', Rate::per_second(50), 5);

    // 8 messages for A, 10 for B, 30 for C, interleaved as they come off the topic.
    let mut outbox = Vec::new();
    for number in 0..30 {
        for (provider, count) in [('A', 8), ('B', 10), ('C', 30)] {
            if number < count {
                outbox.push(Sms { provider, number });
            }
        }
    }

    let start = Instant::now();
    // At most 64 messages held while they wait for their provider.
    let sent: Vec<(Duration, Sms)> = stream::iter(outbox)
        .throttle_by_key(&providers, |sms| sms.provider, |_| 1, 64)
        .map(|sms| (start.elapsed(), sms))
        .collect()
        .await;

    // A timeline, one row per provider and one column per 100 ms: how many left in each.
    let columns = sent.last().map_or(0, |(at, _)| at.as_millis() / 100 + 1) as usize;
    let mut rows: BTreeMap<char, Vec<u32>> = BTreeMap::new();
    let mut last: BTreeMap<char, (u32, Duration)> = BTreeMap::new();
    for (at, sms) in &sent {
        rows.entry(sms.provider).or_insert_with(|| vec![0; columns])
            [(at.as_millis() / 100) as usize] += 1;
        if let Some((previous, _)) = last.insert(sms.provider, (sms.number, *at)) {
            assert!(
                previous < sms.number,
                "a provider's messages left out of order"
            );
        }
    }
    println!("messages sent per 100 ms (one column each), by provider:");
    for (provider, counts) in &rows {
        let cells: String = counts
            .iter()
            .map(|&n| match n {
                0 => '.',
                1..=9 => char::from(b'0' + n as u8),
                _ => '+',
            })
            .collect();
        let (count, done) = last[provider];
        println!(
            "  {provider} |{cells}| {} sent, last at {} ms",
            count + 1,
            done.as_millis()
        );
    }
    // C's 30 messages: 5 at once, then one per 20 ms; A's backlog (its last message leaves at
    // 3.5 s) never held them up.
    let c_done = last[&'C'].1;
    assert_eq!(c_done, Duration::from_millis(500));
    assert_eq!(last[&'B'].1, Duration::from_millis(1800));
    assert_eq!(last[&'A'].1, Duration::from_millis(3500));
    println!(
        "C finished at {} ms, B at 1800 ms, A at 3500 ms",
        c_done.as_millis()
    );
}
