//! Enforce a rate on a burst of requests: refuse what does not conform, and retry it later.
//!
//! `throttle(..., Enforcing)` never delays. A request that conforms comes out as `Ok` and is
//! handled at once; one that does not comes out as `Err(RateExceeded)`, which hands the request
//! back with `retry_after()`, how long until it would have conformed. Here a refused request
//! is sent again through the same channel after that delay, until every request has been
//! handled exactly once.
//!
//! `retry_after()` is the wait *if nothing else takes tokens meanwhile*. Requests refused at
//! the same moment all get the same hint, so they come back together and race again: one
//! wins, the rest are refused anew. The timeline shows this herd; a real client would add
//! jitter or queue its retries.
//!
//! ```text
//! cargo run --example enforcing
//! ```

use paced::{Enforcing, PaceExt, Rate};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;

/// Prints a line prefixed with the time elapsed since `start`.
macro_rules! log {
    ($start:expr, $($arg:tt)*) => {
        println!("[{:>6.3}s] {}", $start.elapsed().as_secs_f64(), format_args!($($arg)*))
    };
}

const REQUESTS: usize = 8;

#[derive(Debug)]
struct Request {
    id: usize,
    attempt: u32,
}

#[tokio::main]
async fn main() {
    let start = Instant::now();

    // New requests and retries share one channel, so both go through the same bucket.
    let (tx, rx) = mpsc::unbounded_channel();
    for id in 1..=REQUESTS {
        tx.send(Request { id, attempt: 1 })
            .expect("the receiver is alive");
    }
    log!(start, "{REQUESTS} requests arrive at once");

    // 5 requests per second, at most 3 at once. tokio-stream's `StreamExt` has a `throttle` of
    // its own, so paced's is called by its trait's name.
    let requests = PaceExt::throttle(
        UnboundedReceiverStream::new(rx),
        Rate::per_second(5),
        |_| 1,
        3,
        Enforcing,
    );
    let mut requests = std::pin::pin!(requests);

    let mut handled = [0u32; REQUESTS + 1]; // times each request id was handled
    let mut unhandled = REQUESTS;
    let mut refusals = 0;
    // `tx` stays alive for the retries, so the stream never ends on its own: stop once every
    // request has been handled.
    while unhandled > 0 {
        let next = requests.next().await;
        match next.expect("we hold a sender, so the channel stays open") {
            Ok(req) => {
                handled[req.id] += 1;
                unhandled -= 1;
                log!(
                    start,
                    "request {} handled (attempt {})",
                    req.id,
                    req.attempt
                );
            }
            Err(refused) => {
                refusals += 1;
                // With a cost of 1 and a burst of 3 this is never `Duration::MAX` (the value
                // for an item that can never fit the bucket).
                let wait = refused.retry_after();
                let mut req = refused.into_inner();
                log!(start, "request {} refused, retry in {wait:.1?}", req.id);
                req.attempt += 1;
                let tx = tx.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(wait).await;
                    // Fails only if the loop above has finished, which it cannot while this
                    // request is unhandled.
                    let _ = tx.send(req);
                });
            }
        }
    }

    assert!(handled[1..].iter().all(|&n| n == 1), "handled: {handled:?}");
    log!(
        start,
        "all {REQUESTS} requests handled exactly once, after {refusals} refusals"
    );
}
