//! A partner API that does not publish its limit and answers `429 Too Many Requests` with a
//! `Retry-After` when called too fast: an `Adaptive` finds the limit, and follows it when the
//! partner, under load from its other clients, halves it.
//!
//! The partner is simulated in-process (the test bed of `tests/common/provider.rs`): a token
//! bucket of 200 calls per second, 30 ms round trip, lowered to 100/s at 40 s. The client
//! starts at its `max` of 1,000/s with 16 calls in flight, paced by
//! `throttle_with(adaptive.limiter(), ..)`, and reports every answer. It all runs in paused
//! time, so 80 s of traffic take a moment; the output is the rate over time, as a text plot:
//!
//! ```text
//! cargo run -p paced-integration --example adaptive_partner
//! ```

#[path = "../../tests/common/provider.rs"]
mod provider;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{stream, StreamExt};
use paced::{Adaptive, PaceExt, Rate, RateLimiter, Shaping};
use provider::{per_second, Answer, Provider};
use tokio::time::Instant;

const SECONDS: u64 = 80;

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    let partner = Arc::new(Provider::new(200.0, 10.0, true));
    // A burst of a few calls: tokio's timer ticks every millisecond.
    let limiter = RateLimiter::new(Rate::per_second(1000), 2);
    let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(1000));

    let start = Instant::now();
    let end = start + Duration::from_secs(SECONDS);
    // When each successful call came back.
    let ok = Arc::new(Mutex::new(Vec::new()));

    let client = {
        let (partner, adaptive, ok) = (partner.clone(), adaptive.clone(), ok.clone());
        tokio::spawn(async move {
            let limiter = adaptive.limiter().clone();
            stream::repeat(())
                .take_until(tokio::time::sleep_until(end))
                .throttle_with(&limiter, |_| 1, Shaping)
                .map(|()| async {
                    // Half the round trip there, the partner's answer, half back.
                    tokio::time::sleep(Duration::from_millis(15)).await;
                    let answer = partner.call();
                    tokio::time::sleep(Duration::from_millis(15)).await;
                    match answer {
                        Answer::Ok => {
                            adaptive.on_success();
                            ok.lock().unwrap().push(start.elapsed());
                        }
                        // A refused call would be retried: it goes back through the limiter.
                        Answer::Refused(retry_after) => adaptive.on_throttled(retry_after),
                    }
                })
                .buffer_unordered(16)
                .for_each(|()| async {})
                .await;
        })
    };

    // The rate at these times (ms): the first second closely, then every few seconds, and
    // around the partner's change at 40 s.
    let times: [u64; 20] = [
        0, 20, 40, 60, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 30_000, 39_900, 41_000,
        42_000, 45_000, 50_000, 60_000, 79_000,
    ];
    let mut rates = Vec::new();
    for &ms in &times {
        if ms > 40_000 && rates.len() == times.iter().filter(|&&t| t < 40_000).count() {
            tokio::time::sleep_until(start + Duration::from_secs(40)).await;
            partner.set_rate(100.0);
        }
        tokio::time::sleep_until(start + Duration::from_millis(ms)).await;
        rates.push(per_second(adaptive.rate()));
    }
    client.await.unwrap();

    println!("the controller's rate (█, 10/s per character), the partner's limit (│),");
    println!("and how many calls succeeded in the second before each time");
    let ok = ok.lock().unwrap();
    for (&ms, &rate) in times.iter().zip(&rates) {
        let limit = if ms < 40_000 { 200.0 } else { 100.0 };
        let bar = (rate / 10.0).round() as usize;
        let mut line: Vec<char> = std::iter::repeat_n('█', bar.min(60)).collect();
        line.resize(61, ' ');
        if bar > 60 {
            line[60] = '»';
        }
        line[(limit / 10.0) as usize] = '│';
        let line: String = line.into_iter().collect();
        // Successes in (at - 1 s, at]: fewer than the rate in the first second.
        let at = Duration::from_millis(ms);
        let last_second = ok
            .iter()
            .filter(|&&t| t <= at && t + Duration::from_secs(1) > at)
            .count();
        println!(
            "{:>6.2} s {line} {rate:>6.1}/s  {last_second:>3} ok",
            ms as f64 / 1000.0,
        );
    }
    let stats = adaptive.stats();
    println!(
        "{} calls succeeded, {} refused ({:.1} %), rate lowered {} times",
        stats.successes,
        stats.throttled,
        100.0 * stats.throttled as f64 / (stats.successes + stats.throttled) as f64,
        stats.decreases
    );
}
