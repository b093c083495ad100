//! Send SMS through a provider that accepts at most 5 messages per second.
//!
//! Two ways to stay under that limit:
//!
//! 1. `min_interval(200ms)`: one message per request, each at least 200 ms after the previous
//!    *send*. A message that arrives after a quiet spell goes out at once; the next one waits
//!    200 ms from it, not for a fixed 200 ms grid.
//! 2. `batched_interval(5, 1s)`: the provider takes a batch of up to 5 messages per request,
//!    one request per second.
//!
//! ```text
//! cargo run --example sms_gateway
//! ```

use std::time::Duration;

use paced::PaceExt;
use tokio::time::Instant;
use tokio_stream::{self as stream, StreamExt};

/// Prints a line prefixed with the time elapsed since `start`.
macro_rules! log {
    ($start:expr, $($arg:tt)*) => {
        println!("[{:>6.3}s] {}", $start.elapsed().as_secs_f64(), format_args!($($arg)*))
    };
}

#[tokio::main]
async fn main() {
    let start = Instant::now();

    log!(
        start,
        "-- one message per request, at least 200 ms apart --"
    );
    // Messages 1-5 are queued already; 6-8 come in 500 ms after message 5 was sent.
    let messages = stream::iter(1..=8).then(|n| async move {
        if n == 6 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        format!("sms #{n}")
    });
    let mut paced = std::pin::pin!(messages.min_interval(Duration::from_millis(200)));
    while let Some(sms) = paced.next().await {
        log!(start, "sent {sms}");
    }

    log!(
        start,
        "-- batches of up to 5 per request, one request per second --"
    );
    let start_batches = Instant::now();
    // Twelve messages queued at once: batches of 5, 5 and 2, a second apart.
    let mut batches = std::pin::pin!(stream::iter(1..=12)
        .map(|n| format!("sms #{n}"))
        .batched_interval(5, Duration::from_secs(1)));
    while let Some(batch) = batches.next().await {
        log!(start, "sent batch of {}: {}", batch.len(), batch.join(", "));
    }
    log!(
        start,
        "done: 12 messages in {:.1?} with 3 requests",
        start_batches.elapsed()
    );
}
