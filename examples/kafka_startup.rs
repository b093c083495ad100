//! Start 2,000 Kafka consumers without stampeding the brokers: at most 500 connect per second.
//!
//! After a deploy every consumer task wants to connect at once, and a cluster hit by 2,000
//! simultaneous connections (and the rebalance they trigger) can fall over. One shared
//! `Stagger::new(500, 1s)` lets at most 500 tasks through in *any* one-second window, sliding,
//! not per calendar second: start `i` happens no earlier than start `i - 500` plus a second.
//! Each task waits for its token, connects, and consumes until shutdown.
//!
//! The program records every start, prints how many started in each second, and checks the
//! promise itself: no sliding one-second window may hold more than 500 starts.
//!
//! ```text
//! cargo run --example kafka_startup
//! ```

use std::future::{poll_fn, Future};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use paced::Stagger;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Prints a line prefixed with the time elapsed since `start`.
macro_rules! log {
    ($start:expr, $($arg:tt)*) => {
        println!("[{:>6.3}s] {}", $start.elapsed().as_secs_f64(), format_args!($($arg)*))
    };
}

const CONSUMERS: usize = 2_000;
const PER_PERIOD: usize = 500;
const PERIOD: Duration = Duration::from_secs(1);

/// When a consumer's start token was granted, as time since `start`. A task cannot see the
/// instant of its grant, only that it fell within the poll that returned it, so we keep both
/// ends. On a busy machine they can be milliseconds apart (the OS deschedules the thread
/// mid-poll): a check on either end alone could blame the stagger for the scheduler.
#[derive(Clone, Copy)]
struct Granted {
    not_before: Duration,
    not_after: Duration,
}

type Starts = Arc<Mutex<Vec<Granted>>>;

#[tokio::main]
async fn main() {
    let start = Instant::now();
    let stagger = Stagger::new(PER_PERIOD, PERIOD);
    // Sending on `stop` tells every consumer to stop.
    let (stop, shutdown) = watch::channel(());
    let started: Starts = Arc::new(Mutex::new(Vec::with_capacity(CONSUMERS)));

    log!(
        start,
        "spawning {CONSUMERS} consumers, at most {PER_PERIOD} connecting per {PERIOD:?}"
    );
    let mut consumers = JoinSet::new();
    for id in 0..CONSUMERS {
        consumers.spawn(consume(
            id,
            stagger.clone(),
            shutdown.clone(),
            start,
            started.clone(),
        ));
    }

    // Once a second, report the starts of the second that just ended, and when the first and
    // last of them came: each second's starts follow the previous second's a second later.
    let mut report = tokio::time::interval_at(start + PERIOD, PERIOD);
    let mut reported = 0;
    let mut second = 0;
    while reported < CONSUMERS {
        report.tick().await;
        let in_second: Vec<Duration> = started
            .lock()
            .unwrap()
            .iter()
            .map(|g| g.not_after)
            .filter(|t| t.as_secs() == second)
            .collect();
        reported += in_second.len();
        let first = in_second.iter().min().copied().unwrap_or_default();
        let last = in_second.iter().max().copied().unwrap_or_default();
        log!(
            start,
            "second {second}: {:>3} started, from {:.3}s to {:.3}s ({reported:>4}/{CONSUMERS} in total)",
            in_second.len(),
            first.as_secs_f64(),
            last.as_secs_f64(),
        );
        second += 1;
    }

    log!(start, "all {CONSUMERS} consumers started; shutting down");
    stop.send(()).expect("the consumers are listening");
    let mut stopped = 0;
    while let Some(result) = consumers.join_next().await {
        result.expect("a consumer panicked");
        stopped += 1;
    }
    log!(start, "{stopped} consumers stopped");

    let stats = stagger.stats();
    println!();
    println!("stagger granted:    {}", stats.granted);
    println!("still waiting:      {}", stats.waiting);
    println!(
        "mean wait to start: {:.3?}",
        stats.total_wait / u32::try_from(stats.granted).unwrap()
    );

    // The promise, checked on the recorded starts: for each start's earliest possible grant
    // `t`, count the starts surely granted in [t, t + PERIOD) (not before `t`, not after the
    // window's end). At most PER_PERIOD.
    let mut starts = started.lock().unwrap().clone();
    assert_eq!(starts.len(), CONSUMERS, "every consumer started once");
    starts.sort_by_key(|g| g.not_before);
    let mut busiest = 0;
    for (i, g) in starts.iter().enumerate() {
        let end = g.not_before + PERIOD;
        let within = starts[i..]
            .iter()
            .take_while(|h| h.not_before < end)
            .filter(|h| h.not_after < end)
            .count();
        busiest = busiest.max(within);
    }
    let blur = starts.iter().map(|g| g.not_after - g.not_before).max();
    println!("most starts in any sliding {PERIOD:?}: {busiest} (limit {PER_PERIOD})");
    println!(
        "  (a start is timed by the poll that granted it, which took at most {:.1?}; a start",
        blur.unwrap_or_default()
    );
    println!("  counts in a window only if that whole poll lies inside the window)");
    assert!(
        busiest <= PER_PERIOD,
        "{busiest} starts within one {PERIOD:?} window, limit {PER_PERIOD}"
    );
}

/// One consumer: wait for a start token, connect, then consume until `shutdown`.
async fn consume(
    id: usize,
    stagger: Stagger,
    mut shutdown: watch::Receiver<()>,
    start: Instant,
    started: Starts,
) {
    // Racing the wait against shutdown is safe: a dropped `acquire` leaves the queue having
    // taken nothing, so a consumer told to stop before it started costs the others nothing.
    tokio::select! {
        not_before = acquire_timed(&stagger, start) => {
            // Read the clock under the lock: a report that has closed a second then never
            // misses a start that belongs to it.
            let mut started = started.lock().unwrap();
            let not_after = start.elapsed();
            started.push(Granted { not_before, not_after });
        }
        _ = shutdown.changed() => return,
    }
    connect(id).await;
    // A real consumer would poll its partitions here; this one just waits to be stopped.
    let _ = shutdown.changed().await;
}

/// `stagger.acquire()`, returning the time just before the poll that was granted.
async fn acquire_timed(stagger: &Stagger, start: Instant) -> Duration {
    let mut acquire = std::pin::pin!(stagger.acquire());
    let mut polled_at = Duration::ZERO;
    poll_fn(|cx| {
        polled_at = start.elapsed();
        acquire.as_mut().poll(cx)
    })
    .await;
    polled_at
}

/// A pretend connection handshake with the brokers.
async fn connect(_id: usize) {
    tokio::time::sleep(Duration::from_millis(20)).await;
}
