//! Whether a task looping on grants that need no wait lets a timer on its thread fire.

use std::future::Future;
use std::time::{Duration, Instant};

/// Spawns a 5 ms timer, then awaits `grant` in a loop until the timer has fired (or for 3 s),
/// on the caller's task. Returns when the timer fired, counted from its start, and the grants.
/// On a current-thread runtime the timer fires in time only if the grants yield now and then.
pub async fn timer_beside<F: Future<Output = ()>>(mut grant: impl FnMut() -> F) -> (Duration, u64) {
    let start = Instant::now();
    let timer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        start.elapsed()
    });
    let mut grants = 0;
    while !timer.is_finished() && start.elapsed() < Duration::from_secs(3) {
        grant().await;
        grants += 1;
    }
    (timer.await.expect("the timer task"), grants)
}
