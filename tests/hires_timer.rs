//! Linux: waits that must end on time (burst 1, `precise()`) are woken by the process's timer
//! thread, in real time.
//!
//! The one place where tests run in real time: the timer thread sleeps on the kernel's clock,
//! which paused time cannot move. Nothing here asserts how fast or how late: the tests assert
//! that the timer thread really woke (its wake-ups show in `/proc/self/task`), that every item
//! comes out once and in order, and that no item leaves before the pacing bound allows, with
//! the bound checked on the real clock, for every entry point. Under paused time nothing
//! changes: the timer thread is not woken and the schedule is the plain timer's
//! (tests/paced/precise.rs runs the same checks).
#![cfg(target_os = "linux")]
// Each test has a runtime of its own and holds `serial()` for its whole run, awaits included:
// the lock orders tests on different threads, not tasks on one runtime.
#![allow(clippy::await_holding_lock)]

mod common;

use std::future::poll_fn;
use std::pin::pin;
use std::sync::{Mutex, MutexGuard};
use std::task::Poll;
use std::time::{Duration, Instant};

use common::{arriving, collect_timed, paused};
use futures_util::{stream, Stream, StreamExt};
use paced::{PaceExt, Rate, Shaping};
use proptest::prelude::*;

/// The tests watch the process's timer thread, so they run one at a time, each once the thread
/// has gone quiet (a wait of the test before may still be registered, for at most 16 ms).
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let start = Instant::now();
    loop {
        let before = timer_wakeups();
        std::thread::sleep(Duration::from_millis(30));
        if timer_wakeups() == before || start.elapsed() > Duration::from_secs(5) {
            break;
        }
    }
    guard
}

/// The threads named `paced-timer` in this process, by their ids.
fn timer_threads() -> Vec<std::path::PathBuf> {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|task| {
            std::fs::read_to_string(task.join("comm"))
                .is_ok_and(|comm| comm.trim() == "paced-timer")
        })
        .collect()
}

/// Asserts that the timer thread woke at least `least` times since `before` (a thread not yet
/// started counts as none).
fn assert_woke(before: Option<u64>, after: Option<u64>, least: u64) {
    let woke = after.unwrap_or(0).saturating_sub(before.unwrap_or(0));
    assert!(
        woke >= least,
        "the timer thread woke {woke} times, expected {least} or more"
    );
}

/// How many times the timer thread has slept and woken so far (its voluntary context
/// switches, from `/proc`); `None` before it is started.
fn timer_wakeups() -> Option<u64> {
    let thread = timer_threads().into_iter().next()?;
    let status = std::fs::read_to_string(thread.join("status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|count| count.trim().parse().ok())
}

#[derive(Debug, Clone, Copy)]
struct Emission {
    item: u64,
    before: Instant,
    after: Instant,
}

/// Drains `s` in real time, bracketing each emission's poll with clock reads, and reports the
/// timer thread's wake-ups at the end of the drain.
async fn drain<S: Stream<Item = u64>>(s: S) -> (Vec<Emission>, Option<u64>) {
    let mut s = pin!(s);
    let mut out = Vec::new();
    loop {
        let next = poll_fn(|cx| {
            let before = Instant::now();
            match s.as_mut().poll_next(cx) {
                Poll::Ready(item) => Poll::Ready(item.map(|item| Emission {
                    item,
                    before,
                    after: Instant::now(),
                })),
                Poll::Pending => Poll::Pending,
            }
        });
        // Generous: a stalled wait fails the test instead of hanging it.
        match tokio::time::timeout(Duration::from_secs(60), next).await {
            Ok(Some(emission)) => out.push(emission),
            Ok(None) => break,
            Err(_) => panic!("stalled after {} items", out.len()),
        }
    }
    (out, timer_wakeups())
}

/// Every item once, in order, and the `k`-th item after any item no earlier than `k` gaps
/// after it: the limiter's clock read for the later item (at most its `after`) is at least
/// `k × gap` past the earlier one's (at least its `before`). Only an item released early
/// can fail this, whatever the machine's load.
fn assert_paced(out: &[Emission], n: u64, gap: Duration) {
    let items: Vec<u64> = out.iter().map(|e| e.item).collect();
    assert_eq!(items, (0..n).collect::<Vec<_>>(), "items lost or reordered");
    for (i, earlier) in out.iter().enumerate() {
        // Pairs up to 50 apart: consecutive items and the schedule over longer stretches.
        for (k, later) in out[i + 1..].iter().take(50).enumerate() {
            let k = u32::try_from(k + 1).expect("small");
            let apart = later.after.duration_since(earlier.before);
            assert!(
                apart >= gap * k,
                "item {} left {apart:?} after item {}, less than {k} gaps of {gap:?}",
                later.item,
                earlier.item,
            );
        }
    }
}

/// 2,000/s: every gap (500 µs) is longer than the most a wait spends yielding after its wake-up,
/// so every wait is the timer thread's.
#[tokio::test]
async fn throttle_at_2_000_per_second_burst_1_is_woken_by_the_timer_thread() {
    let _serial = serial();
    let before = timer_wakeups();
    let n = 1_000;
    let paced = stream::iter(0..n)
        .throttle(Rate::per_second(2_000), |_| 1, 1, Shaping)
        .precise();
    let (out, open) = drain(paced).await;
    assert_woke(before, open, n / 2);
    assert_paced(&out, n, Duration::from_micros(500));
    // Its sleeps end on time: the kernel's timer slack (50 µs by default) is set to 1 ns.
    let thread = timer_threads()
        .into_iter()
        .next()
        .expect("the timer thread");
    let tid = thread.file_name().expect("a thread id");
    let slack = std::fs::read_to_string(
        std::path::Path::new("/proc")
            .join(tid)
            .join("timerslack_ns"),
    );
    match slack {
        Ok(slack) => assert_eq!(slack.trim(), "1"),
        // Reading another thread's slack needs CAP_SYS_NICE (Linux 4.18 and later); the
        // thread writes its own without it.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            println!("timer slack not checked: {e}")
        }
        Err(e) => panic!("timerslack_ns: {e}"),
    }
}

/// 10,000/s: every item once, in order, never early.
#[tokio::test]
async fn throttle_at_10_000_per_second_burst_1_is_never_early() {
    let _serial = serial();
    let n = 2_000;
    let paced = stream::iter(0..n)
        .throttle(Rate::per_second(10_000), |_| 1, 1, Shaping)
        .precise();
    let (out, _) = drain(paced).await;
    assert_paced(&out, n, Duration::from_micros(100));
}

/// Burst 1 by default, no `precise()`: every entry point ends its waits on the timer thread at an
/// everyday rate (400/s, 2.5 ms: not a whole number of ticks), and no item is early.
#[tokio::test]
async fn burst_1_waits_end_on_the_timer_thread_by_default_and_never_early() {
    use paced::{KeyedRateLimiter, Limit, RateLimiter};

    let _serial = serial();
    let before = timer_wakeups();
    let n = 60;
    let rate = Rate::per_second(400);
    let gap = Duration::from_micros(2_500);
    let (out, open) = drain(stream::iter(0..n).throttle(rate, |_| 1, 1, Shaping)).await;
    assert_woke(before, open, n / 2);
    let before = open;
    assert_paced(&out, n, gap);
    let (out, open) = drain(stream::iter(0..n).min_interval(gap)).await;
    assert_paced(&out, n, gap);
    assert_woke(before, open, n / 2);
    let before = open;
    let keyed = KeyedRateLimiter::<u32>::new(rate, 1);
    let (out, open) = drain(stream::iter(0..n).throttle_by_key(&keyed, |_| 7, |_| 1, 8)).await;
    assert_paced(&out, n, gap);
    assert_woke(before, open, n / 2);
    let before = open;

    // The shared limiters, one request at a time.
    let limiter = RateLimiter::new(rate, 1);
    let (out, open) = drain(stream::iter(0..n).then(|i| {
        let limiter = limiter.clone();
        async move {
            limiter.acquire(1).await;
            i
        }
    }))
    .await;
    assert_paced(&out, n, gap);
    assert_woke(before, open, n / 2);
    let before = open;
    let keyed = KeyedRateLimiter::<u32>::new(rate, 1);
    let keyed = &keyed;
    let (out, open) = drain(stream::iter(0..n).then(|i| async move {
        keyed.acquire(&3, 1).await;
        i
    }))
    .await;
    assert_paced(&out, n, gap);
    assert_woke(before, open, n / 2);
    let before = open;
    let multi = RateLimiter::builder(["requests", "tokens"])
        .limit("requests", Limit::bucket(rate, 1))
        .limit("tokens", Limit::bucket(Rate::per_second(400_000), 40_000))
        .build()
        .expect("limits");
    let multi = &multi;
    let (out, open) = drain(stream::iter(0..n).then(|i| async move {
        drop(multi.acquire([1, 100]).await);
        i
    }))
    .await;
    assert_paced(&out, n, gap);
    assert_woke(before, open, n / 2);
    assert_eq!(timer_threads().len(), 1, "one timer thread, whatever waits");
}

/// A thousand streams waiting at once share the one timer thread; and every one of
/// them keeps its gap.
#[tokio::test]
async fn a_thousand_waiting_streams_share_one_timer_thread() {
    let _serial = serial();
    let before = timer_wakeups();
    let streams = (0..1_000u64).map(|k| {
        stream::iter(0..3u64)
            .min_interval(Duration::from_micros(1_500 + k))
            .map(move |i| (k, i, Instant::now()))
    });
    let mut all = stream::select_all(streams.map(Box::pin));
    let mut seen: Vec<Vec<Instant>> = vec![Vec::new(); 1_000];
    let wait = async {
        while let Some((k, _, at)) = all.next().await {
            seen[usize::try_from(k).expect("small")].push(at);
        }
    };
    tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .expect("no stall");
    // At least once: on a loaded machine every wait may be due by the time the thread first
    // wakes, and it then wakes them all in one pass, without sleeping in between (seen once in
    // CI, with 2 asserted here).
    assert_woke(before, timer_wakeups(), 1);
    assert_eq!(timer_threads().len(), 1, "one timer thread for them all");
    for (k, times) in seen.iter().enumerate() {
        assert_eq!(times.len(), 3);
        let gap = Duration::from_micros(1_500 + k as u64);
        // Each item's instant is read after it left, so only the first pair's gap can look
        // short by the time the first read waited; the two gaps together cannot.
        assert!(times[2].duration_since(times[0]) + Duration::from_millis(1) >= gap * 2);
    }
}

#[tokio::test]
async fn min_interval_10_us_keeps_its_gap_exactly() {
    let _serial = serial();
    let n = 5_000;
    let (out, _) = drain(
        stream::iter(0..n)
            .min_interval(Duration::from_micros(10))
            .precise(),
    )
    .await;
    assert_paced(&out, n, Duration::from_micros(10));
}

/// A gap longer than a tick: the `Sleep` takes the wait to a tick before the item's time and
/// the timer thread the rest.
#[tokio::test]
async fn min_interval_above_a_tick_sleeps_then_waits_on_the_timer_thread() {
    let _serial = serial();
    let before = timer_wakeups();
    let n = 40;
    let (out, open) = drain(
        stream::iter(0..n)
            .min_interval(Duration::from_micros(2_300))
            .precise(),
    )
    .await;
    assert_woke(before, open, n / 2);
    assert_paced(&out, n, Duration::from_micros(2_300));
}

/// Throttle with a burst: any `burst + k + 1` items span at least `k + 1` intervals.
#[tokio::test]
async fn throttle_with_a_burst_never_exceeds_the_bucket() {
    let _serial = serial();
    let (n, burst) = (3_000u64, 5u64);
    let interval = Duration::from_micros(50);
    let (out, _) = drain(
        stream::iter(0..n)
            .throttle(Rate::per_second(20_000), |_| 1, burst, Shaping)
            .precise(),
    )
    .await;
    let items: Vec<u64> = out.iter().map(|e| e.item).collect();
    assert_eq!(items, (0..n).collect::<Vec<_>>());
    let burst = usize::try_from(burst).expect("small");
    for (i, earlier) in out.iter().enumerate() {
        let later = out.get(i + burst..).unwrap_or_default();
        for (k, later) in later.iter().take(50).enumerate() {
            // Items i ..= i + burst + k: burst + k + 1 of them need k + 1 intervals.
            let k = u32::try_from(k + 1).expect("small");
            assert!(
                later.after.duration_since(earlier.before) >= interval * k,
                "{} items within {k} intervals",
                burst + k as usize + 1
            );
        }
    }
}

/// The timer thread is woken only for a wait that needs it: a thousand precise streams with
/// nothing to wait for never wake it.
#[tokio::test]
async fn idle_precise_streams_wake_no_timer_thread() {
    let _serial = serial();
    let before = timer_wakeups();
    let mut senders = Vec::new();
    let mut streams = Vec::new();
    for _ in 0..1_000 {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
        senders.push(tx);
        streams.push(Box::pin(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
                .min_interval(Duration::from_micros(100))
                .precise(),
        ));
    }
    for (tx, s) in senders.iter().zip(&mut streams) {
        tx.send(1).expect("open");
        assert_eq!(s.next().await, Some(1));
        // Nothing more to send: pending, not waiting.
        assert!(poll_fn(|cx| Poll::Ready(s.as_mut().poll_next(cx).is_pending())).await);
    }
    assert_eq!(timer_wakeups(), before);
    // Burst 100 over 50 items: nothing ever waits.
    let (out, open) = drain(
        stream::iter(0..50)
            .throttle(Rate::per_second(1_000), |_| 1, 100, Shaping)
            .precise(),
    )
    .await;
    assert_eq!(out.len(), 50);
    assert_eq!(open, before);
}

/// A multi-thread runtime runs in real time too: the timer thread wakes the task wherever it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_thread_runtime_is_woken_by_the_timer_thread() {
    let _serial = serial();
    let n = 1_000;
    let paced = stream::iter(0..n)
        .throttle(Rate::per_second(10_000), |_| 1, 1, Shaping)
        .precise();
    let (out, _) = tokio::spawn(drain(paced)).await.expect("task");
    assert_paced(&out, n, Duration::from_micros(100));
}

/// Under paused time the timer thread is never woken: the schedule is tokio's timer's, exactly as
/// it always was.
#[tokio::test(start_paused = true)]
async fn paused_time_wakes_no_timer_thread_and_keeps_the_plain_schedule() {
    let _serial = serial();
    let before = timer_wakeups();
    let start = tokio::time::Instant::now();
    let precise = collect_timed(
        start,
        stream::iter(0..200u64)
            .throttle(Rate::per_second(10_000), |_| 1, 1, Shaping)
            .precise(),
    )
    .await;
    assert_eq!(timer_wakeups(), before);
    // One item per tick, as the plain timer: item i at i ms.
    for (i, &(item, at)) in precise.iter().enumerate() {
        assert_eq!(item, i as u64);
        assert_eq!(at, i as u64 * common::MS);
    }
}

/// With time paused, `precise()` emits exactly when the plain operator does, and wakes no
/// timer thread, for schedules of arrivals at rates above and below a tick. The test takes the
/// timer thread once for all its cases (`serial` waits for the thread to be quiet).
#[test]
fn paused_schedules_are_those_of_the_plain_timer() {
    let _serial = serial();
    proptest!(ProptestConfig::with_cases(64), |(
        arrivals in prop::collection::vec((0u64..4, 1u64..3), 1..30),
        interval_us in 1u64..2_500,
        burst in 1u64..3,
    )| {
        let before = timer_wakeups();
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
        let run = |precise: bool| {
            paused(async {
                let start = tokio::time::Instant::now();
                let s = arriving(start, &timed).throttle(rate, |i| i.1, burst, Shaping);
                if precise {
                    collect_timed(start, s.precise()).await
                } else {
                    collect_timed(start, s).await
                }
            })
        };
        prop_assert_eq!(run(false), run(true));
        prop_assert_eq!(timer_wakeups(), before);
    });
}

/// A wait armed on the timer thread when the test pauses tokio's clock (`tokio::time::pause`):
/// the thread's wake-up finds the clock paused, and the wait goes to a `Sleep`, which the paused
/// clock then advances to. (Armed on the thread again instead, it would be woken in real time
/// forever, its paused deadline never reached.)
#[test]
fn a_clock_paused_while_a_wait_is_armed_still_reaches_its_deadline() {
    let _serial = serial();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        let result = runtime.block_on(async {
            let start = tokio::time::Instant::now();
            let s = stream::iter(0..2u64).throttle(Rate::per_second(100), |_| 1, 1, Shaping);
            let mut s = pin!(s);
            assert_eq!(s.next().await, Some(0));
            let mut next = pin!(s.next());
            // Burst 1, 10 ms: armed on the timer thread.
            let first = poll_fn(|cx| Poll::Ready(next.as_mut().poll(cx))).await;
            assert!(first.is_pending());
            tokio::time::pause();
            let item = next.await;
            (item, start.elapsed())
        });
        let _ = done.send(result);
    });
    // Generous: only a wait that never ends fails here.
    let (item, elapsed) = finished
        .recv_timeout(Duration::from_secs(60))
        .expect("the wait never ended");
    assert_eq!(item, Some(1));
    assert!(
        elapsed >= Duration::from_millis(10),
        "left after {elapsed:?}"
    );
}
