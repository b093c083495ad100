//! Arrivals off tokio's millisecond grid: the paused clock moved by nanoseconds, as
//! `tokio::time::advance` can. Deadlines must still be met exactly (never early) and no later
//! than the next timer tick.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{nanos_since, paused, tick_ceil, NaiveBucket, MS};
use futures_util::StreamExt;
use paced::{PaceExt, Rate, Shaping};
use proptest::prelude::*;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;

/// Moves the paused clock to `target` nanoseconds after `start`, stopping at every tick on the
/// way and letting the other tasks run there, as auto-advance would. While `idle` says that no
/// item is held by the adapter (every item sent has been emitted), no timer is armed, and the
/// clock moves there in one step.
async fn advance_to(start: Instant, target: u64, idle: impl Fn() -> bool) {
    loop {
        let now = nanos_since(start);
        if now >= target {
            return;
        }
        let next_tick = if idle() { target } else { (now / MS + 1) * MS };
        tokio::time::advance(Duration::from_nanos(next_tick.min(target) - now)).await;
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
    }
}

/// Sends item i at `arrivals[i]` nanoseconds through `make`'s adapter; returns (arrival,
/// emission) per item, in emission order.
fn run_off_grid<F, S>(arrivals: &[u64], make: F) -> Vec<(usize, u64)>
where
    F: FnOnce(UnboundedReceiverStream<usize>) -> S,
    S: futures_util::Stream<Item = usize> + Send + 'static,
{
    paused(async {
        let start = Instant::now();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let s = make(UnboundedReceiverStream::new(rx));
        let emitted = Arc::new(AtomicUsize::new(0));
        let counted = emitted.clone();
        let consumer = tokio::spawn(async move {
            let mut s = std::pin::pin!(s);
            let mut out = Vec::new();
            while let Some(i) = s.next().await {
                out.push((i, nanos_since(start)));
                counted.fetch_add(1, Ordering::Relaxed);
            }
            out
        });
        for (i, &at) in arrivals.iter().enumerate() {
            advance_to(start, at, || emitted.load(Ordering::Relaxed) == i).await;
            tx.send(i).unwrap();
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
        }
        drop(tx);
        // Back onto the tick grid before leaving the rest to auto-advance: from an off-grid
        // instant tokio's auto-advance moves by whole milliseconds and keeps the offset, so a
        // timer would appear up to 2 ms late (tokio's behaviour, not the adapter's).
        advance_to(start, tick_ceil(nanos_since(start)), || false).await;
        common::within_an_hour(consumer).await.unwrap()
    })
}

fn arrivals() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(prop_oneof![Just(0u64), 0u64..3 * MS, 0u64..400 * MS], 1..40).prop_map(
        |gaps| {
            let mut at = 0;
            gaps.into_iter()
                .map(|gap| {
                    at += gap;
                    at
                })
                .collect()
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    #[test]
    fn min_interval_off_grid(interval_ns in 1u64..50 * MS, arrivals in arrivals()) {
        let out = run_off_grid(&arrivals, |s| s.min_interval(Duration::from_nanos(interval_ns)));
        let order: Vec<usize> = out.iter().map(|&(i, _)| i).collect();
        prop_assert_eq!(order, (0..arrivals.len()).collect::<Vec<_>>());
        for k in 0..out.len() {
            let (i, at) = out[k];
            let due = if k == 0 { arrivals[i] } else { out[k - 1].1 + interval_ns };
            prop_assert!(at >= due.max(arrivals[i]), "item {} at {} before {}", i, at, due);
            prop_assert!(
                at <= arrivals[i].max(tick_ceil(due)),
                "item {} at {} ns; due {} ns, arrived {} ns", i, at, due, arrivals[i]
            );
        }
    }

    #[test]
    fn throttle_off_grid(
        tokens in 1u64..20,
        per_ns in MS..1_000 * MS,
        burst in 1u64..5,
        arrivals in arrivals(),
    ) {
        let per = Duration::from_nanos(per_ns);
        let out = run_off_grid(&arrivals, |s| s.throttle(Rate::new(tokens, per), |_| 1, burst, Shaping));
        let order: Vec<usize> = out.iter().map(|&(i, _)| i).collect();
        prop_assert_eq!(order, (0..arrivals.len()).collect::<Vec<_>>());
        let mut model = NaiveBucket::new(tokens, per, burst);
        let mut prev = 0;
        for &(i, at) in &out {
            let offered = arrivals[i].max(prev);
            let due = model.earliest(offered, 1);
            prop_assert!(at >= due, "item {} at {} before {}", i, at, due);
            prop_assert!(
                at <= offered.max(tick_ceil(due)),
                "item {} at {} ns; due {} ns, offered {} ns", i, at, due, offered
            );
            model.emit(at, 1);
            prev = at;
        }
    }
}
