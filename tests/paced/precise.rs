//! `precise()`: waits below tokio's tick finished by yielding, under paused time.
//!
//! Under paused time the clock moves only when the test moves it, so these tests drive the
//! clock by hand between polls (as real time would between two yields) and check that an item
//! leaves at its exact time; and that when nobody moves the clock, the schedule is exactly
//! the plain timer's.

use crate::common;

use std::time::Duration;

use common::{arriving, collect_timed, nanos_since, paused, MS};
use futures_util::stream;
use paced::{PaceExt, Rate, Shaping};
use proptest::prelude::*;
use tokio::time::{advance, Instant};
use tokio_test::{assert_pending, assert_ready_eq, task};

#[tokio::test(start_paused = true)]
async fn an_item_leaves_at_its_sub_tick_time_when_the_clock_moves() {
    let start = Instant::now();
    let mut paced = task::spawn(
        stream::iter(1..=3)
            .min_interval(Duration::from_micros(100))
            .precise(),
    );
    assert_ready_eq!(paced.poll_next(), Some(1));
    // 100 µs to go: below a tick, so the task yields (wakes itself) instead of sleeping.
    assert_pending!(paced.poll_next());
    assert!(paced.is_woken());
    advance(Duration::from_micros(60)).await;
    assert_pending!(paced.poll_next());
    assert!(paced.is_woken());
    advance(Duration::from_micros(40)).await;
    assert_ready_eq!(paced.poll_next(), Some(2));
    assert_eq!(nanos_since(start), 100_000);
    // Clock moved past the deadline already: leaves at once.
    advance(Duration::from_micros(250)).await;
    assert_ready_eq!(paced.poll_next(), Some(3));
    assert_eq!(nanos_since(start), 350_000);
}

#[tokio::test(start_paused = true)]
async fn without_precise_a_sub_tick_wait_sleeps_to_the_tick() {
    let mut paced = task::spawn(stream::iter(1..=2).min_interval(Duration::from_micros(100)));
    assert_ready_eq!(paced.poll_next(), Some(1));
    assert_pending!(paced.poll_next());
    assert!(!paced.is_woken(), "a plain wait must not spin");
    advance(Duration::from_micros(100)).await;
    // The timer fires on the tick, not before it.
    assert_pending!(paced.poll_next());
    advance(Duration::from_micros(900)).await;
    assert!(paced.is_woken());
    assert_ready_eq!(paced.poll_next(), Some(2));
}

#[tokio::test(start_paused = true)]
async fn a_long_wait_sleeps_until_a_tick_before_the_deadline() {
    let start = Instant::now();
    let mut paced = task::spawn(
        stream::iter(1..=2)
            .throttle(
                Rate::new(1, Duration::from_micros(5_300)),
                |_| 1,
                1,
                Shaping,
            )
            .precise(),
    );
    assert_ready_eq!(paced.poll_next(), Some(1));
    // 5.3 ms to go: sleep, no spinning yet.
    assert_pending!(paced.poll_next());
    assert!(!paced.is_woken());
    advance(Duration::from_millis(4)).await;
    assert!(
        !paced.is_woken(),
        "woken before a tick ahead of the deadline"
    );
    advance(Duration::from_millis(1)).await;
    // 4.3 ms rounds up to the 5 ms tick: awake, 0.3 ms to go, spinning from here.
    assert!(paced.is_woken());
    assert_pending!(paced.poll_next());
    assert!(paced.is_woken());
    advance(Duration::from_micros(300)).await;
    assert_ready_eq!(paced.poll_next(), Some(2));
    assert_eq!(nanos_since(start), 5_300_000);
}

#[tokio::test(start_paused = true)]
async fn idle_precise_streams_do_not_spin() {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
    let mut paced = task::spawn(
        tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
            .min_interval(Duration::from_micros(100))
            .precise(),
    );
    assert_pending!(paced.poll_next());
    assert!(!paced.is_woken());
    tx.send(1).unwrap();
    assert!(paced.is_woken());
    assert_ready_eq!(paced.poll_next(), Some(1));
    // Nothing waits: no self-wake.
    assert_pending!(paced.poll_next());
    assert!(!paced.is_woken());
    advance(Duration::from_millis(5)).await;
    assert!(!paced.is_woken());
}

/// Arrivals (ms offsets) and costs for the same-schedule property.
fn schedule() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0u64..5, 1u64..3), 1..40)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Under paused time, nobody moves the clock across a yield: `precise` emits exactly when
    /// the plain operator does, for throttle and min_interval, at rates above and below a tick.
    #[test]
    fn paused_schedules_are_those_of_the_plain_timer(
        arrivals in schedule(),
        interval_us in 1u64..3_000,
        burst in 1u64..4,
    ) {
        let mut at = 0;
        let timed: Vec<(u64, (usize, u64))> = arrivals
            .iter()
            .enumerate()
            .map(|(i, &(gap, cost))| {
                at += gap;
                (at, (i, cost))
            })
            .collect();
        let rate = Rate::new(1, Duration::from_micros(interval_us));
        let run = |precise: bool, throttle: bool| {
            paused(async {
                let start = Instant::now();
                let source = arriving(start, &timed);
                if throttle {
                    let s = source.throttle(rate, |i| i.1, burst, Shaping);
                    let s = if precise { s.precise() } else { s };
                    collect_timed(start, s).await
                } else {
                    let s = source.min_interval(Duration::from_micros(interval_us));
                    let s = if precise { s.precise() } else { s };
                    collect_timed(start, s).await
                }
            })
        };
        for throttle in [true, false] {
            let plain = run(false, throttle);
            let precise = run(true, throttle);
            prop_assert_eq!(&plain, &precise);
            prop_assert_eq!(plain.len(), timed.len());
            for window in plain.windows(2) {
                prop_assert!(window[0].0 .0 < window[1].0 .0);
            }
            if !throttle {
                for window in plain.windows(2) {
                    prop_assert!(window[1].1 - window[0].1 >= interval_us * 1_000);
                }
            }
        }
    }
}

/// A precise stream drained under paused time never spins (a task that keeps waking itself
/// would stop paused time from moving, so this counts polls instead of waiting on a timeout)
/// and keeps the plain schedule, also with many items due within one tick.
#[tokio::test(start_paused = true)]
async fn paused_precise_drains_without_spinning() {
    let start = Instant::now();
    let mut paced = task::spawn(
        stream::iter(0..1_000)
            .throttle(Rate::per_second(10_000), |_| 1, 1, Shaping)
            .precise(),
    );
    let mut out = Vec::new();
    let mut polls = 0;
    loop {
        polls += 1;
        assert!(
            polls <= 4_000,
            "{polls} polls for {} items: spinning",
            out.len()
        );
        match paced.poll_next() {
            std::task::Poll::Ready(Some(item)) => out.push((item, nanos_since(start))),
            std::task::Poll::Ready(None) => break,
            // A yield: poll again at once, as the scheduler would.
            std::task::Poll::Pending if paced.is_woken() => {}
            // Asleep on the timer: move paused time to the next tick.
            std::task::Poll::Pending => advance(Duration::from_millis(1)).await,
        }
    }
    assert_eq!(out.len(), 1_000);
    // One item per tick, as the plain timer under paused time: item i at i ms.
    for (i, &(item, at)) in out.iter().enumerate() {
        assert_eq!(item, i);
        assert_eq!(at, i as u64 * MS);
    }
}
