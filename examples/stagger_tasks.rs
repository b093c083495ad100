//! Start five long-running consumers at most two per second, then shut them all down.
//!
//! Starting many consumers at once can overwhelm whatever they connect to (a broker
//! rebalancing, a database filling its connection pool). `staggered_start(2, 1s)` lets at most
//! two starts through in any one-second window.
//!
//! The run takes 2.5 seconds of virtual time and finishes at once: it runs under paused time
//! (`start_paused = true`), as a user's own tests would, and prints the timeline real time
//! would show. Without `start_paused = true` it runs in real time.
//!
//! ```text
//! cargo run --example stagger_tasks
//! ```

use std::time::Duration;

use paced::PaceExt;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_stream::StreamExt;

/// Prints a line prefixed with the time elapsed since `start`.
macro_rules! log {
    ($start:expr, $($arg:tt)*) => {
        println!("[{:>6.3}s] {}", $start.elapsed().as_secs_f64(), format_args!($($arg)*))
    };
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    let start = Instant::now();
    // Sending on `stop` tells every consumer to stop.
    let (stop, shutdown) = watch::channel(());
    let mut consumers = JoinSet::new();

    // Each id leaves the stream when its consumer may start: 1 and 2 at once, 3 and 4 a
    // second later, 5 a second after that.
    let mut ids =
        std::pin::pin!(tokio_stream::iter(1..=5).staggered_start(2, Duration::from_secs(1)));
    while let Some(id) = ids.next().await {
        log!(start, "consumer {id} started");
        consumers.spawn(consume(id, start, shutdown.clone()));
    }

    // Let the last one run a moment, then ask every consumer to stop.
    tokio::time::sleep(Duration::from_millis(500)).await;
    log!(start, "shutting down");
    stop.send(()).expect("the consumers are listening");

    while let Some(result) = consumers.join_next().await {
        result.expect("a consumer panicked");
    }
    log!(start, "all consumers stopped");
}

/// A consumer that polls its partition every 300 ms, forever, until told to stop.
async fn consume(id: u32, start: Instant, mut shutdown: watch::Receiver<()>) {
    let mut poll = tokio::time::interval(Duration::from_millis(300));
    let mut polls = 0u32;
    loop {
        tokio::select! {
            _ = shutdown.changed() => {
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
