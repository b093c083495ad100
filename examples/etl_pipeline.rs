//! An ETL pipeline capped in bytes per second, writing to its sink in batches.
//!
//! A producer task extracts records of varying size into a channel. The pipeline throttles
//! them by their size in bytes (a token bucket: `BURST` bytes may pass at once, then
//! `BYTES_PER_SEC`), and groups what passes into batched writes, at most one write every
//! `WRITE_EVERY`.
//!
//! ```text
//! cargo run --example etl_pipeline
//! ```

use std::time::Duration;

use paced::{PaceExt, Rate, Shaping};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

/// Prints a line prefixed with the time elapsed since `start`.
macro_rules! log {
    ($start:expr, $($arg:tt)*) => {
        println!("[{:>6.3}s] {}", $start.elapsed().as_secs_f64(), format_args!($($arg)*))
    };
}

const RECORDS: u32 = 40;
const BYTES_PER_SEC: u64 = 10_000;
const BURST: u64 = 4_000;
const MAX_BATCH: usize = 8;
const WRITE_EVERY: Duration = Duration::from_millis(500);

/// One extracted row, serialized.
struct Record {
    id: u32,
    payload: Vec<u8>,
}

impl Record {
    fn len(&self) -> usize {
        self.payload.len()
    }
}

#[tokio::main]
async fn main() {
    let start = Instant::now();

    // Extract: the producer runs as fast as the channel lets it; a full channel is
    // backpressure from the throttle.
    let (tx, rx) = mpsc::channel(16);
    let producer = tokio::spawn(async move {
        for id in 1..=RECORDS {
            // Sizes from 200 to 1,800 bytes, in a fixed but irregular order.
            let size = 200 + (id as usize * 733) % 1_600;
            let record = Record {
                id,
                payload: vec![b'x'; size],
            };
            if tx.send(record).await.is_err() {
                break; // the pipeline is gone
            }
        }
    });

    // Transform + load: cap the bytes, then write in batches. tokio-stream's `StreamExt` has a
    // `throttle` of its own, so paced's is called by its trait's name.
    let pipeline = PaceExt::throttle(
        ReceiverStream::new(rx),
        Rate::new(BYTES_PER_SEC, Duration::from_secs(1)),
        |rec: &Record| rec.len() as u64,
        BURST,
        Shaping,
    )
    .batched_interval(MAX_BATCH, WRITE_EVERY);
    let mut pipeline = std::pin::pin!(pipeline);

    let mut total_bytes = 0;
    let mut total_records = 0;
    while let Some(batch) = pipeline.next().await {
        let bytes: usize = batch.iter().map(Record::len).sum();
        write_to_sink(&batch).await;
        total_bytes += bytes;
        total_records += batch.len();
        let (first, last) = (batch[0].id, batch[batch.len() - 1].id);
        log!(
            start,
            "wrote batch of {:>2}, {bytes:>5} bytes (total {total_bytes:>5}): #{first}-#{last}",
            batch.len(),
        );
    }
    producer.await.expect("the producer panicked");

    let secs = start.elapsed().as_secs_f64();
    // The bucket's promise: at most BURST + BYTES_PER_SEC * t bytes in any window of t.
    let bound = BURST as f64 + BYTES_PER_SEC as f64 * secs;
    println!();
    println!("records written:  {total_records}");
    println!("bytes written:    {total_bytes} in {secs:.3}s");
    println!("achieved:         {:.0} bytes/s", total_bytes as f64 / secs);
    println!("configured cap:   {BYTES_PER_SEC} bytes/s, burst {BURST} bytes");
    // Over a short run the burst shows: the overall rate may sit a little above the cap.
    println!("allowed in {secs:.3}s: {bound:.0} bytes (burst + cap * t)");
}

/// A pretend sink: one round trip per batch, however large.
async fn write_to_sink(_batch: &[Record]) {
    tokio::time::sleep(Duration::from_millis(5)).await;
}
