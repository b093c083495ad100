//! Start five long-running consumers at most two per second, then shut them all down.
//!
//! Starting many consumers at once can overwhelm whatever they connect to (a broker
//! rebalancing, a database filling its connection pool). `staggered_start(2, 1s)` lets at most
//! two starts through in any one-second window.
//!
//! ```text
//! cargo run --example stagger_tasks
//! ```

use std::time::Duration;

use futures_util::StreamExt;
use paced::PaceExt;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Prints a line prefixed with the time elapsed since `start`.
macro_rules! log {
    ($start:expr, $($arg:tt)*) => {
        println!("[{:>6.3}s] {}", $start.elapsed().as_secs_f64(), format_args!($($arg)*))
    };
}

#[tokio::main]
async fn main() {
    let start = Instant::now();
    let shutdown = CancellationToken::new();
    let mut consumers = JoinSet::new();

    // Each id leaves the stream when its consumer may start: 1 and 2 at once, 3 and 4 a
    // second later, 5 a second after that.
    let mut ids = std::pin::pin!(
        futures_util::stream::iter(1..=5).staggered_start(2, Duration::from_secs(1))
    );
    while let Some(id) = ids.next().await {
        log!(start, "consumer {id} started");
        consumers.spawn(consume(id, start, shutdown.clone()));
    }

    // Let the last one run a moment, then ask every consumer to stop.
    tokio::time::sleep(Duration::from_millis(500)).await;
    log!(start, "shutting down");
    shutdown.cancel();

    while let Some(result) = consumers.join_next().await {
        result.expect("a consumer panicked");
    }
    log!(start, "all consumers stopped");
}

/// A consumer that polls its partition every 300 ms, forever, until `shutdown` is cancelled.
async fn consume(id: u32, start: Instant, shutdown: CancellationToken) {
    let mut poll = tokio::time::interval(Duration::from_millis(300));
    let mut polls = 0u32;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => {
                log!(start, "consumer {id} cancelled after {polls} polls");
                return;
            }
            _ = poll.tick() => {
                // A real consumer would fetch and process a batch from partition `id` here.
                polls += 1;
            }
        }
    }
}
