//! `PaceSinkExt`: pacing where items are written, through real sinks (tokio's mpsc behind
//! `PollSender`, a `FramedWrite` over an in-memory socket, `futures::channel::mpsc`), under
//! paused time.

use crate::common;

use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use common::{nanos_since, paused, tick_ceil, timeline, within_an_hour, NaiveBucket, MS};
use futures_util::{future, Sink, SinkExt, StreamExt};
use paced::sink::ThrottleWith as SinkThrottleWith;
use paced::{PaceExt, PaceSinkExt, Rate, RateLimiter, Shaping, Stagger};
use proptest::prelude::*;
use tokio::io::duplex;
use tokio::time::{advance, sleep, sleep_until, Instant};
use tokio_test::{assert_pending, assert_ready_ok, task};
use tokio_util::codec::{Framed, FramedRead, FramedWrite, LinesCodec};
use tokio_util::sync::{PollSendError, PollSender};

/// Receives everything from a tokio channel, stamping each item with its arrival.
fn receive_timed<T: Send + 'static>(
    start: Instant,
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> tokio::task::JoinHandle<Vec<(T, u64)>> {
    tokio::spawn(async move {
        let mut got = Vec::new();
        while let Some(item) = rx.recv().await {
            got.push((item, nanos_since(start)));
        }
        got
    })
}

/// Sends `items` one by one through `pace(PollSender)` into a tokio channel, then closes the
/// sink; returns the timeline of the items as the channel's reader received them.
async fn through_poll_sender<T, Si>(
    items: impl IntoIterator<Item = T>,
    pace: impl FnOnce(PollSender<T>) -> Si,
) -> String
where
    T: Send + std::fmt::Debug + std::fmt::Display + 'static,
    Si: Sink<T, Error = PollSendError<T>>,
{
    let start = Instant::now();
    let (tx, rx) = tokio::sync::mpsc::channel(32);
    let received = receive_timed(start, rx);
    let mut sink = pin!(pace(PollSender::new(tx)));
    for item in items {
        within_an_hour(sink.send(item)).await.unwrap();
    }
    within_an_hour(sink.close()).await.unwrap();
    timeline(&received.await.unwrap())
}

/// Reads lines from the far end of an in-memory socket, stamping each with its arrival.
fn read_lines_timed(
    start: Instant,
    theirs: tokio::io::DuplexStream,
) -> tokio::task::JoinHandle<Vec<(String, u64)>> {
    tokio::spawn(async move {
        let mut lines = FramedRead::new(theirs, LinesCodec::new());
        let mut got = Vec::new();
        while let Some(line) = lines.next().await {
            got.push((line.unwrap(), nanos_since(start)));
        }
        got
    })
}

#[tokio::test(start_paused = true)]
async fn poll_sender_burst_of_five_then_one_per_100ms() {
    let got = through_poll_sender(0..12, |tx| tx.throttle(Rate::per_second(10), |_| 1, 5)).await;
    assert_eq!(
        got,
        "0ms:0 0ms:1 0ms:2 0ms:3 0ms:4 100ms:5 200ms:6 300ms:7 400ms:8 500ms:9 600ms:10 700ms:11"
    );
}

#[tokio::test(start_paused = true)]
async fn an_item_dearer_than_the_bucket_pays_its_debt_first() {
    let costs = [5u64, 10, 1];
    let got = through_poll_sender(costs, |tx| tx.throttle(Rate::per_second(10), |&c| c, 5)).await;
    assert_eq!(got, "0ms:5 1000ms:10 1100ms:1");
}

#[tokio::test(start_paused = true)]
async fn framed_write_min_interval_counts_from_the_last_line_written() {
    let start = Instant::now();
    let (ours, theirs) = duplex(1 << 16);
    let reader = read_lines_timed(start, theirs);
    let framed = FramedWrite::new(ours, LinesCodec::new());
    let mut sink = pin!(framed.min_interval(Duration::from_millis(100)));
    for (at, line) in [(0, "a"), (10, "b"), (20, "c"), (500, "d"), (510, "e")] {
        sleep_until(start + Duration::from_millis(at)).await;
        within_an_hour(sink.send(line)).await.unwrap();
    }
    within_an_hour(sink.close()).await.unwrap();
    assert_eq!(
        timeline(&reader.await.unwrap()),
        "0ms:a 100ms:b 200ms:c 500ms:d 600ms:e"
    );
}

#[tokio::test(start_paused = true)]
async fn close_hands_the_held_line_on_first_at_its_time() {
    let start = Instant::now();
    let (ours, theirs) = duplex(1 << 16);
    let reader = read_lines_timed(start, theirs);
    let framed = FramedWrite::new(ours, LinesCodec::new());
    let mut sink = pin!(framed.min_interval(Duration::from_millis(100)));
    within_an_hour(sink.send("a")).await.unwrap();
    within_an_hour(sink.feed("b")).await.unwrap();
    within_an_hour(sink.close()).await.unwrap();
    assert_eq!(timeline(&reader.await.unwrap()), "0ms:a 100ms:b");
}

#[tokio::test(start_paused = true)]
async fn futures_mpsc_sinks_share_one_limiter_in_arrival_order() {
    let start = Instant::now();
    let limiter = RateLimiter::new(Rate::per_second(10), 1);
    let (tx, rx) = futures_channel::mpsc::unbounded::<String>();
    let writer = |name: char, limiter: &RateLimiter| {
        let mut sink = Box::pin(tx.clone().throttle_with(limiter, |_| 1));
        async move {
            for n in 0..3 {
                within_an_hour(sink.send(format!("{name}{n}")))
                    .await
                    .unwrap();
            }
        }
    };
    let reader = tokio::spawn(rx.map(move |m| (m, nanos_since(start))).collect::<Vec<_>>());
    tokio::join!(writer('a', &limiter), writer('b', &limiter));
    drop(tx);
    // One per 100 ms between both, each in the order it asked the limiter: `a` is polled
    // first, a0 leaves at once and a1 queues before b0 does.
    assert_eq!(
        timeline(&reader.await.unwrap()),
        "0ms:a0 100ms:a1 200ms:b0 300ms:a2 400ms:b1 500ms:b2"
    );
    assert_eq!(limiter.stats().granted, 6);
}

#[tokio::test(start_paused = true)]
async fn a_stagger_lets_k_items_per_period_into_the_sink() {
    let stagger = Stagger::new(2, Duration::from_secs(1));
    // Every item takes one place in the window, whatever its cost.
    let got = through_poll_sender(0..5, |tx| tx.throttle_with(&stagger, |_| 99)).await;
    assert_eq!(got, "0ms:0 0ms:1 1000ms:2 1000ms:3 2000ms:4");
}

#[tokio::test(start_paused = true)]
async fn a_framed_socket_paces_its_writes_and_still_reads() {
    let start = Instant::now();
    let (ours, theirs) = duplex(1 << 16);
    let peer = tokio::spawn(async move {
        let mut peer = Framed::new(theirs, LinesCodec::new());
        peer.send("hello").await.unwrap();
        let mut got = Vec::new();
        while let Some(line) = peer.next().await {
            got.push((line.unwrap(), nanos_since(start)));
        }
        got
    });
    let framed = Framed::new(ours, LinesCodec::new());
    // `Framed` is both a Stream and a Sink, and both traits are in scope: name the trait.
    let mut paced = pin!(PaceSinkExt::throttle(
        framed,
        Rate::per_second(2),
        |_: &String| 1,
        1
    ));
    // The reading side passes through, unpaced.
    let greeting = within_an_hour(paced.next()).await.unwrap().unwrap();
    assert_eq!(greeting, "hello");
    for n in 0..3 {
        within_an_hour(paced.send(format!("line{n}")))
            .await
            .unwrap();
    }
    within_an_hour(paced.close()).await.unwrap();
    assert_eq!(
        timeline(&peer.await.unwrap()),
        "0ms:line0 500ms:line1 1000ms:line2"
    );
    // And the reading side can still be paced as a stream, naming that trait.
    let lines = futures_util::stream::iter([1, 2]);
    let _ = PaceExt::throttle(lines, Rate::per_second(1), |_| 1, 1, Shaping);
}

/// A sink that is ready only while its gate is open, and can be told to fail once: the
/// readiness and errors that the real sinks above never show on cue.
#[derive(Clone, Default)]
struct Valve {
    state: Arc<Mutex<ValveState>>,
}

#[derive(Default)]
struct ValveState {
    closed: bool,
    fail_next: Option<&'static str>,
    waker: Option<Waker>,
    sent: Vec<(u32, u64)>,
}

impl Valve {
    fn set_closed(&self, closed: bool) {
        let mut st = self.state.lock().unwrap();
        st.closed = closed;
        if let Some(waker) = st.waker.take() {
            waker.wake();
        }
    }

    fn fail_next(&self, error: &'static str) {
        self.state.lock().unwrap().fail_next = Some(error);
    }

    fn sent(&self) -> Vec<(u32, u64)> {
        self.state.lock().unwrap().sent.clone()
    }
}

/// The valve's sink half; times are nanoseconds since `start`.
struct ValveSink {
    valve: Valve,
    start: Instant,
}

impl Sink<u32> for ValveSink {
    type Error = &'static str;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), &'static str>> {
        let mut st = self.valve.state.lock().unwrap();
        if let Some(error) = st.fail_next.take() {
            return Poll::Ready(Err(error));
        }
        if st.closed {
            st.waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        Poll::Ready(Ok(()))
    }

    fn start_send(self: Pin<&mut Self>, item: u32) -> Result<(), &'static str> {
        let at = nanos_since(self.start);
        self.valve.state.lock().unwrap().sent.push((item, at));
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), &'static str>> {
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), &'static str>> {
        Poll::Ready(Ok(()))
    }
}

fn valve(start: Instant) -> (Valve, ValveSink) {
    let valve = Valve::default();
    let sink = ValveSink {
        valve: valve.clone(),
        start,
    };
    (valve, sink)
}

type SharedValve = SinkThrottleWith<ValveSink, u32, fn(&u32) -> u64>;

/// A valve paced by a `RateLimiter` of 1/s and burst 1, after item 0 went at 0 ms and item 1
/// was given to `start_send`, held.
async fn shared_valve_holding_one() -> (RateLimiter, Valve, Pin<Box<SharedValve>>) {
    let limiter = RateLimiter::new(Rate::per_second(1), 1);
    let (valve, inner) = valve(Instant::now());
    let mut sink: Pin<Box<SharedValve>> = Box::pin(inner.throttle_with(&limiter, |_| 1));
    within_an_hour(sink.send(0)).await.unwrap();
    within_an_hour(sink.feed(1)).await.unwrap();
    (limiter, valve, sink)
}

#[tokio::test(start_paused = true)]
async fn poll_ready_is_pending_while_an_item_is_held() {
    let (_valve, inner) = valve(Instant::now());
    let mut sink = pin!(inner.min_interval(Duration::from_millis(100)));
    within_an_hour(sink.send(1)).await.unwrap();
    within_an_hour(sink.feed(2)).await.unwrap();
    assert_eq!(sink.held(), Some(&2));
    let mut ready = task::spawn(());
    assert_pending!(ready.enter(|cx, _| sink.as_mut().poll_ready(cx)));
    advance(Duration::from_millis(100)).await;
    assert!(ready.is_woken());
    assert_ready_ok!(ready.enter(|cx, _| sink.as_mut().poll_ready(cx)));
    assert_eq!(sink.held(), None);
}

#[tokio::test(start_paused = true)]
async fn tokens_are_charged_at_hand_over_not_at_the_deadline() {
    // 1/s, burst 1: item 1 may go at 1 s, but the inner sink is not ready until 5 s. Charged
    // at its deadline, item 2 could follow at 5 s; charged at hand-over, it waits until 6 s.
    let start = Instant::now();
    let (valve, inner) = valve(start);
    let mut sink = pin!(inner.throttle(Rate::per_second(1), |_| 1, 1));
    within_an_hour(sink.send(0)).await.unwrap();
    within_an_hour(sink.feed(1)).await.unwrap();
    valve.set_closed(true);
    let reopen = async {
        sleep(Duration::from_secs(5)).await;
        valve.set_closed(false);
    };
    let send_all = async {
        within_an_hour(sink.flush()).await.unwrap();
        within_an_hour(sink.send(2)).await.unwrap();
    };
    tokio::join!(reopen, send_all);
    assert_eq!(timeline(&valve.sent()), "0ms:0 5000ms:1 6000ms:2");
}

#[tokio::test(start_paused = true)]
async fn a_shared_quota_is_not_asked_while_the_inner_sink_is_not_ready() {
    let (limiter, valve, mut sink) = shared_valve_holding_one().await;
    valve.set_closed(true);
    let mut flush = task::spawn(());
    assert_pending!(flush.enter(|cx, _| sink.as_mut().poll_flush(cx)));
    assert_eq!(
        limiter.stats().waiting,
        0,
        "queued for a sink that cannot take the item"
    );
    sleep(Duration::from_secs(5)).await;
    assert_eq!(limiter.stats().granted, 1);
    // The token that flowed in meanwhile is there for someone else.
    assert!(limiter.try_acquire(1).is_ok());
    valve.set_closed(false);
    assert!(flush.is_woken());
    drop(flush);
    within_an_hour(sink.flush()).await.unwrap();
    assert_eq!(timeline(&valve.sent()), "0ms:0 6000ms:1");
}

#[tokio::test(start_paused = true)]
async fn an_inner_error_comes_out_unchanged_and_the_held_item_is_retried() {
    let (limiter, valve, mut sink) = shared_valve_holding_one().await;
    valve.fail_next("broken pipe");
    assert_eq!(within_an_hour(sink.flush()).await, Err("broken pipe"));
    // Not lost, not charged.
    assert_eq!(sink.held(), Some(&1));
    assert_eq!(limiter.stats().granted, 1);
    // The inner sink recovered: the next flush hands the item on, at its time.
    within_an_hour(sink.flush()).await.unwrap();
    assert_eq!(timeline(&valve.sent()), "0ms:0 1000ms:1");
    assert_eq!(limiter.stats().granted, 2);
}

#[tokio::test(start_paused = true)]
async fn a_closed_channel_errors_and_the_held_item_can_be_taken_back() {
    let limiter = RateLimiter::new(Rate::per_second(1), 1);
    let (tx, mut rx) = futures_channel::mpsc::channel::<&str>(4);
    let mut sink = pin!(tx.throttle_with(&limiter, |_| 1));
    within_an_hour(sink.send("sent")).await.unwrap();
    within_an_hour(sink.feed("held")).await.unwrap();
    rx.close();
    let error = within_an_hour(sink.flush()).await.unwrap_err();
    assert!(error.is_disconnected());
    // Still held, every time: the error does not swallow it.
    assert!(within_an_hour(sink.close())
        .await
        .unwrap_err()
        .is_disconnected());
    assert_eq!(sink.as_mut().take_held(), Some("held"));
    assert_eq!(sink.held(), None);
    let stats = limiter.stats();
    assert_eq!((stats.granted, stats.waiting), (1, 0));
    assert_eq!(rx.next().await, Some("sent"));
    assert_eq!(rx.next().await, None);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_sink_that_holds_an_item_charges_nothing() {
    let start = Instant::now();
    let limiter = RateLimiter::new(Rate::per_second(1), 1);
    let (tx, mut rx) = futures_channel::mpsc::channel::<u32>(4);
    {
        let mut sink = pin!(tx.throttle_with(&limiter, |_| 1));
        within_an_hour(sink.send(0)).await.unwrap();
        within_an_hour(sink.feed(1)).await.unwrap();
        let mut flush = task::spawn(());
        assert_pending!(flush.enter(|cx, _| sink.as_mut().poll_flush(cx)));
        assert_eq!(limiter.stats().waiting, 1);
        sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        limiter.stats().waiting,
        0,
        "the dropped sink kept its place"
    );
    assert_eq!(limiter.stats().granted, 1);
    sleep_until(start + Duration::from_secs(1)).await;
    // The token item 1 would have taken is there, at the time it would have been taken.
    assert_eq!(limiter.available(), 1);
    assert_eq!(rx.next().await, Some(0));
    assert_eq!(rx.next().await, None);
}

#[tokio::test(start_paused = true)]
async fn no_wake_ups_while_idle_nor_after_taking_the_held_item_back() {
    let (valve, inner) = valve(Instant::now());
    let mut sink = pin!(inner.throttle(Rate::per_second(10), |_| 1, 1));
    within_an_hour(sink.send(0)).await.unwrap();
    within_an_hour(sink.feed(1)).await.unwrap();
    let mut flush = task::spawn(());
    assert_pending!(flush.enter(|cx, _| sink.as_mut().poll_flush(cx)));
    advance(Duration::from_millis(99)).await;
    assert!(!flush.is_woken());
    advance(Duration::from_millis(1)).await;
    assert!(flush.is_woken());
    assert_ready_ok!(flush.enter(|cx, _| sink.as_mut().poll_flush(cx)));
    // Idle: nothing held, no timer armed.
    let mut idle = task::spawn(());
    assert_ready_ok!(idle.enter(|cx, _| sink.as_mut().poll_ready(cx)));
    advance(Duration::from_secs(3600)).await;
    assert!(!idle.is_woken());
    // An item taken back before its time leaves no timer behind either.
    let mut taken = task::spawn(());
    assert_ready_ok!(taken.enter(|cx, _| sink.as_mut().poll_ready(cx)));
    // After an idle hour item 2 conforms and goes at once; item 3 is held for 100 ms.
    sink.as_mut().start_send(2).unwrap();
    assert_ready_ok!(taken.enter(|cx, _| sink.as_mut().poll_ready(cx)));
    sink.as_mut().start_send(3).unwrap();
    assert_pending!(taken.enter(|cx, _| sink.as_mut().poll_flush(cx)));
    assert_eq!(sink.as_mut().take_held(), Some(3));
    advance(Duration::from_secs(1)).await;
    assert!(!taken.is_woken());
    let sent: Vec<u32> = valve.sent().iter().map(|&(item, _)| item).collect();
    assert_eq!(sent, [0, 1, 2]);
}

/// A quota across machines paces a sink like any other (compiled only: the Redis tests need
/// a server).
#[cfg(feature = "redis")]
#[allow(dead_code)]
fn a_redis_quota_paces_a_sink_too(quota: &paced::RedisRateLimiter) -> impl Sink<u32> + use<> {
    Vec::new().throttle_with(quota, |_| 1)
}

#[test]
fn building_needs_no_runtime() {
    // tokio #5036: a `Sleep` created at construction panics outside a runtime.
    let limiter = RateLimiter::new(Rate::per_second(1), 1);
    let (tx, _rx) = tokio::sync::mpsc::channel::<u32>(1);
    let a = PollSender::new(tx).throttle(Rate::per_second(1), |_| 1, 1);
    let b = Vec::<u32>::new().throttle_with(&limiter, |_| 1);
    let c = Vec::<u32>::new().min_interval(Duration::from_secs(1));
    assert!(format!("{a:?}").starts_with("Throttle"));
    assert!(format!("{b:?}").starts_with("ThrottleWith"));
    assert!(format!("{c:?}").starts_with("MinInterval"));
}

#[test]
#[should_panic(expected = "`burst` is 0")]
fn zero_burst_panics_at_construction() {
    let _ = Vec::<u32>::new().throttle(Rate::per_second(1), |_| 1, 0);
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "still holds an item")]
async fn start_send_without_poll_ready_while_holding_panics() {
    let mut sink = pin!(Vec::<u32>::new().min_interval(Duration::from_secs(1)));
    sink.as_mut().start_send(0).unwrap();
    sink.as_mut().start_send(1).unwrap();
    sink.as_mut().start_send(2).unwrap();
}

// ---- Properties over random schedules ----

/// One item to write: how long after the previous one the writer has it, and its cost.
#[derive(Clone, Copy, Debug)]
struct Step {
    gap_ms: u64,
    cost: u64,
}

fn steps(max_cost: u64) -> impl Strategy<Value = Vec<Step>> {
    let gap = prop_oneof![3 => Just(0u64), 2 => 0u64..50, 1 => 0u64..2_000];
    prop::collection::vec(
        (gap, 0..=max_cost).prop_map(|(gap_ms, cost)| Step { gap_ms, cost }),
        1..30,
    )
}

fn rate_strategy() -> impl Strategy<Value = (u64, Duration)> {
    (1u64..20, 1u64..1_000, 0u64..1_000_000)
        .prop_map(|(tokens, ms, ns)| (tokens, Duration::from_nanos(ms * MS + ns)))
}

/// What became of one item: when the writer had given it to `start_send`, when the paced
/// sink handed it to the channel, when the reader took it.
#[derive(Clone, Copy, Debug, Default)]
struct Trace {
    offered: u64,
    handed: u64,
    received: u64,
}

/// Writes `steps` through `pace(PollSender)` into a channel of `capacity`, read by a task that
/// dawdles `think_ms[i]` after item `i`. The writer feeds each item and flushes only when it
/// would otherwise stop polling (before a gap, and at the end), so every held item is driven.
/// Returns the items in the order received, with their traces.
fn run_poll_sender<P, Si>(
    steps: &[Step],
    capacity: usize,
    think_ms: &[u64],
    pace: P,
) -> (Vec<usize>, Vec<Trace>)
where
    P: FnOnce(Box<dyn Sink<usize, Error = PollSendError<usize>> + Send + Unpin>) -> Si,
    Si: Sink<usize, Error = PollSendError<usize>>,
{
    paused(async {
        let start = Instant::now();
        let traces = Arc::new(Mutex::new(vec![Trace::default(); steps.len()]));
        let (tx, mut rx) = tokio::sync::mpsc::channel::<usize>(capacity);
        let think = think_ms.to_vec();
        let read = traces.clone();
        let reader = tokio::spawn(async move {
            let mut order = Vec::new();
            while let Some(i) = rx.recv().await {
                read.lock().unwrap()[i].received = nanos_since(start);
                order.push(i);
                sleep(Duration::from_millis(think[i % think.len()])).await;
            }
            order
        });
        // Stamps the moment the paced sink hands an item on: `with` runs its closure inside
        // its own `start_send`.
        let handed = traces.clone();
        let stamped = PollSender::new(tx).with(move |i: usize| {
            handed.lock().unwrap()[i].handed = nanos_since(start);
            future::ready(Ok::<_, PollSendError<usize>>(i))
        });
        let mut sink = pin!(pace(Box::new(stamped)));
        let mut at = 0;
        for (i, step) in steps.iter().enumerate() {
            at += step.gap_ms;
            sleep_until(start + Duration::from_millis(at)).await;
            within_an_hour(sink.feed(i)).await.unwrap();
            traces.lock().unwrap()[i].offered = nanos_since(start);
            if steps.get(i + 1).is_none_or(|next| next.gap_ms > 0) {
                within_an_hour(sink.flush()).await.unwrap();
            }
        }
        within_an_hour(sink.close()).await.unwrap();
        let order = within_an_hour(reader).await.unwrap();
        let traces = traces.lock().unwrap().clone();
        (order, traces)
    })
}

/// Each item handed on no earlier than the ideal bucket allows, given when it was offered and
/// when the items before it were handed on, and no later than that rounded up to the timer's
/// tick (at once if it conformed when offered); the bucket replayed over the hand-overs.
fn check_bucket(
    traces: &[Trace],
    costs: &[u64],
    tokens: u64,
    per: Duration,
    burst: u64,
) -> Result<(), TestCaseError> {
    let mut model = NaiveBucket::new(tokens, per, burst);
    for (i, (t, &cost)) in traces.iter().zip(costs).enumerate() {
        let earliest = model.earliest(t.offered, cost);
        let due = if earliest <= t.offered {
            t.offered
        } else {
            tick_ceil(earliest)
        };
        prop_assert!(
            t.handed >= earliest,
            "item {i} handed at {} before {earliest}",
            t.handed
        );
        prop_assert!(
            t.handed <= due,
            "item {i} handed at {} ns, due at {due} ns: {t:?}",
            t.handed
        );
        prop_assert!(t.received >= t.handed);
        model.emit(t.handed, cost);
    }
    Ok(())
}

/// The bound, directly: the cost handed on within any [t_i, t_j] is at most
/// `burst + (t_j - t_i) * rate`.
fn check_window_bound(
    handed: &[(u64, u64)],
    tokens: u64,
    per: Duration,
    burst: u64,
) -> Result<(), TestCaseError> {
    let mut sorted = handed.to_vec();
    sorted.sort_unstable();
    let per = per.as_nanos();
    for i in 0..sorted.len() {
        let mut sum = 0u128;
        for j in i..sorted.len() {
            sum += u128::from(sorted[j].1);
            let span = u128::from(sorted[j].0 - sorted[i].0);
            prop_assert!(
                sum * per <= u128::from(burst) * per + span * u128::from(tokens),
                "cost {sum} within {span} ns from {} ns",
                sorted[i].0
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// `throttle` into a tokio channel of random capacity whose reader dawdles, and the same
    /// through a `RateLimiter` that this sink alone uses (which must give the same schedule):
    /// order, no loss, each item exactly on time (never early, at most a tick late), charged
    /// when it is handed on, and the window bound.
    #[test]
    fn throttle_into_poll_sender_is_exact(
        (tokens, per) in rate_strategy(),
        burst in 1u64..6,
        steps in steps(8),
        capacity in 1usize..4,
        think_ms in prop::collection::vec(prop_oneof![3 => Just(0u64), 1 => 0u64..400], 1..8),
        shared in any::<bool>(),
    ) {
        let costs: Vec<u64> = steps.iter().map(|s| s.cost).collect();
        let cost_of = costs.clone();
        let cost = move |&i: &usize| cost_of[i];
        let rate = Rate::new(tokens, per);
        let limiter = RateLimiter::new(rate, burst);
        let (order, traces) = if shared {
            run_poll_sender(&steps, capacity, &think_ms, |inner| inner.throttle_with(&limiter, cost))
        } else {
            run_poll_sender(&steps, capacity, &think_ms, |inner| inner.throttle(rate, cost, burst))
        };
        prop_assert_eq!(order, (0..steps.len()).collect::<Vec<_>>());
        check_bucket(&traces, &costs, tokens, per, burst)?;
        if costs.iter().all(|&c| c <= burst) {
            let handed: Vec<_> = traces.iter().zip(&costs).map(|(t, &c)| (t.handed, c)).collect();
            check_window_bound(&handed, tokens, per, burst)?;
        }
        let stats = limiter.stats();
        let granted = if shared { steps.len() as u64 } else { 0 };
        prop_assert_eq!((stats.granted, stats.waiting), (granted, 0));
    }

    /// Several `futures::channel::mpsc` senders share one limiter: the bound holds across all
    /// of them, each keeps its order, nothing is lost, and every grant reached a sink.
    #[test]
    fn sinks_sharing_a_limiter_keep_the_global_bound(
        (tokens, per) in rate_strategy(),
        burst in 1u64..6,
        writers in prop::collection::vec(steps(5), 1..6),
        buffer in 0usize..3,
    ) {
        let (handed, received, stats) = paused(async {
            let start = Instant::now();
            let limiter = RateLimiter::new(Rate::new(tokens, per), burst);
            let handed = Arc::new(Mutex::new(Vec::new()));
            let mut tasks = Vec::new();
            let mut readers = Vec::new();
            for (w, steps) in writers.iter().cloned().enumerate() {
                let (tx, rx) = futures_channel::mpsc::channel::<(usize, usize, u64)>(buffer);
                let log = handed.clone();
                let stamped = tx.with(move |item: (usize, usize, u64)| {
                    log.lock().unwrap().push((nanos_since(start), item.2));
                    future::ready(Ok::<_, futures_channel::mpsc::SendError>(item))
                });
                let mut sink = Box::pin(stamped.throttle_with(&limiter, |item| item.2));
                tasks.push(tokio::spawn(async move {
                    let mut at = 0;
                    for (i, step) in steps.iter().enumerate() {
                        at += step.gap_ms;
                        sleep_until(start + Duration::from_millis(at)).await;
                        within_an_hour(sink.send((w, i, step.cost.min(burst)))).await.unwrap();
                    }
                    within_an_hour(sink.close()).await.unwrap();
                }));
                readers.push(tokio::spawn(async move {
                    // A reader that takes its time, so that the channel is often full.
                    let mut rx = rx;
                    let mut got = Vec::new();
                    while let Some((_, i, _)) = rx.next().await {
                        got.push(i);
                        sleep(Duration::from_millis(7)).await;
                    }
                    got
                }));
            }
            for task in tasks {
                within_an_hour(task).await.unwrap();
            }
            let mut received = Vec::new();
            for reader in readers {
                received.push(within_an_hour(reader).await.unwrap());
            }
            let handed = handed.lock().unwrap().clone();
            (handed, received, limiter.stats())
        });
        for (got, steps) in received.iter().zip(&writers) {
            prop_assert_eq!(got, &(0..steps.len()).collect::<Vec<_>>());
        }
        let total: usize = writers.iter().map(Vec::len).sum();
        prop_assert_eq!(handed.len(), total);
        prop_assert_eq!((stats.granted, stats.waiting), (total as u64, 0));
        check_window_bound(&handed, tokens, per, burst)?;
    }

    /// `min_interval` into a `FramedWrite` over an in-memory socket: each line written at the
    /// later of its arrival and the previous line plus the interval (rounded up to the tick),
    /// in order, none lost.
    #[test]
    fn min_interval_into_framed_write_is_exact(
        interval_us in 1u64..300_000,
        steps in steps(0),
    ) {
        let interval = Duration::from_micros(interval_us);
        let (arrivals, got) = paused(async {
            let start = Instant::now();
            let (ours, theirs) = duplex(1 << 16);
            let reader = read_lines_timed(start, theirs);
            let mut sink = pin!(FramedWrite::new(ours, LinesCodec::new()).min_interval(interval));
            let mut arrivals = Vec::new();
            let mut at = 0;
            for (i, step) in steps.iter().enumerate() {
                at += step.gap_ms;
                sleep_until(start + Duration::from_millis(at)).await;
                arrivals.push(nanos_since(start));
                within_an_hour(sink.send(i.to_string())).await.unwrap();
            }
            within_an_hour(sink.close()).await.unwrap();
            (arrivals, within_an_hour(reader).await.unwrap())
        });
        let order: Vec<String> = got.iter().map(|(line, _)| line.clone()).collect();
        prop_assert_eq!(order, (0..steps.len()).map(|i| i.to_string()).collect::<Vec<_>>());
        let gap = u64::try_from(interval.as_nanos()).unwrap();
        let mut prev: Option<u64> = None;
        for (i, (&arrival, &(_, at))) in arrivals.iter().zip(&got).enumerate() {
            // Sent with `send`, each line is offered once the previous one is written.
            let offered = arrival.max(prev.unwrap_or(0));
            let earliest = prev.map_or(offered, |p| offered.max(p + gap));
            let due = if earliest <= offered { offered } else { tick_ceil(earliest) };
            prop_assert!(at >= earliest && at <= due, "line {i} at {at}, due in [{earliest}, {due}]");
            prev = Some(at);
        }
    }
}

/// `send_all` from an always-ready stream flushes only at the end; the paced sink flushes the
/// inner sink while its held item waits, so a buffering `FramedWrite` puts each line on the
/// socket at its time, not all of them at the end.
#[tokio::test(start_paused = true)]
async fn send_all_into_a_buffering_sink_reaches_the_socket_paced() {
    let start = Instant::now();
    let (ours, theirs) = duplex(1 << 16);
    let reader = tokio::spawn(async move {
        let mut lines = FramedRead::new(theirs, LinesCodec::new());
        let mut got = Vec::new();
        while let Some(line) = lines.next().await {
            got.push((line.unwrap(), nanos_since(start)));
        }
        got
    });
    let mut sink =
        pin!(FramedWrite::new(ours, LinesCodec::new()).min_interval(Duration::from_millis(100)));
    let mut lines =
        futures_util::stream::iter(["a", "b", "c", "d", "e"].map(|s| Ok(s.to_string())));
    within_an_hour(sink.send_all(&mut lines)).await.unwrap();
    within_an_hour(sink.close()).await.unwrap();
    let got = within_an_hour(reader).await.unwrap();
    assert_eq!(timeline(&got), "0ms:a 100ms:b 200ms:c 300ms:d 400ms:e");
}

/// An inner sink that is open or shut by hand, counting what it is given.
#[derive(Clone, Default)]
struct Sluice(Arc<Mutex<SluiceState>>);

/// Shut or not, the waker of a writer waiting for it to open, and what it was given.
type SluiceState = (bool, Option<Waker>, Vec<u32>);

impl Sluice {
    fn shut(&self, shut: bool) {
        let mut v = self.0.lock().unwrap();
        v.0 = shut;
        if let Some(waker) = v.1.take() {
            waker.wake();
        }
    }
}

impl Sink<u32> for Sluice {
    type Error = ();
    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), ()>> {
        let mut v = self.0.lock().unwrap();
        if v.0 {
            v.1 = Some(cx.waker().clone());
            Poll::Pending
        } else {
            Poll::Ready(Ok(()))
        }
    }
    fn start_send(self: Pin<&mut Self>, item: u32) -> Result<(), ()> {
        self.0.lock().unwrap().2.push(item);
        Ok(())
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), ()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), ()>> {
        Poll::Ready(Ok(()))
    }
}

/// A sink whose inner sink stops taking items gives up its place in the shared queue, so the
/// quota's other users go on; once the inner sink is ready again it joins at the back.
#[tokio::test(start_paused = true)]
async fn a_stuck_inner_sink_does_not_hold_up_the_quota() {
    let start = Instant::now();
    let limiter = RateLimiter::new(Rate::per_second(10), 1);
    let sluice = Sluice::default();
    let mut sink = task::spawn(sluice.clone().throttle_with(&limiter, |_: &u32| 1));
    assert_ready_ok!(sink.enter(|cx, s| s.poll_ready(cx)));
    sink.enter(|_, s| s.start_send(0)).unwrap();
    assert_ready_ok!(sink.enter(|cx, s| s.poll_flush(cx)));
    assert_ready_ok!(sink.enter(|cx, s| s.poll_ready(cx)));
    sink.enter(|_, s| s.start_send(1)).unwrap();
    // Item 1 heads the queue, due at 100 ms.
    assert_pending!(sink.enter(|cx, s| s.poll_flush(cx)));
    assert_eq!(limiter.stats().waiting, 1);
    sluice.shut(true);
    let other = tokio::spawn({
        let limiter = limiter.clone();
        async move {
            limiter.acquire(1).await;
            nanos_since(start)
        }
    });
    sleep(Duration::from_millis(50)).await;
    // Polled with its inner sink shut: it leaves the queue, taking nothing.
    assert_pending!(sink.enter(|cx, s| s.poll_flush(cx)));
    let granted = within_an_hour(other).await.unwrap();
    assert_eq!(
        granted,
        100 * MS,
        "the other user waited only for the bucket"
    );
    sluice.shut(false);
    assert!(sink.is_woken());
    // Back at the end of the queue: 100 ms after the other user's grant.
    assert_pending!(sink.enter(|cx, s| s.poll_flush(cx)));
    sleep_until(start + Duration::from_millis(200)).await;
    assert!(sink.is_woken());
    assert_ready_ok!(sink.enter(|cx, s| s.poll_flush(cx)));
    assert_eq!(nanos_since(start), 200 * MS);
    assert_eq!(sluice.0.lock().unwrap().2, [0, 1]);
    assert_eq!(limiter.stats().granted, 3);
}

/// A sink that records each item with the nanoseconds since `start` at which it arrived.
fn recording_sink<T>(
    start: Instant,
    log: &Arc<Mutex<Vec<(T, u64)>>>,
) -> impl Sink<T, Error = std::convert::Infallible> + use<T> {
    let log = log.clone();
    futures_util::sink::unfold((), move |(), item| {
        log.lock().unwrap().push((item, nanos_since(start)));
        future::ready(Ok(()))
    })
}

/// 2 requests per second (bursts of 2), 1,000 tokens per second (bursts of 1,000).
fn llm() -> paced::RateLimiter<[u64; 2]> {
    paced::RateLimiter::builder(["requests", "tokens"])
        .limit("requests", paced::Limit::bucket(Rate::per_second(2), 2))
        .limit(
            "tokens",
            paced::Limit::bucket(Rate::per_second(1_000), 1_000),
        )
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn llm_requests_reach_the_sink_when_every_limit_has_room_in_order() {
    let llm = llm();
    let start = Instant::now();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut sink =
        pin!(recording_sink(start, &log).throttle_with(&llm, |tokens: &u64| [1, *tokens]));
    for tokens in [600, 300, 500, 300, 1_000] {
        within_an_hour(sink.send(tokens)).await.unwrap();
    }
    // 600 and 300 at once; 500 waits for a request (500 ms); 300 for the next (1,000 ms);
    // 1,000 for the 700 tokens it lacks at 1,000 ms (1,700 ms).
    assert_eq!(
        timeline(&log.lock().unwrap()),
        "0ms:600 0ms:300 500ms:500 1000ms:300 1700ms:1000"
    );
}

#[tokio::test(start_paused = true)]
async fn a_held_llm_request_taken_back_is_charged_nothing() {
    let llm = llm();
    let start = Instant::now();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut sink = task::spawn(Box::pin(
        recording_sink(start, &log).throttle_with(&llm, |tokens: &u64| [1, *tokens]),
    ));
    assert_ready_ok!(sink.enter(|cx, s| s.poll_ready(cx)));
    sink.enter(|_, s| s.start_send(900)).unwrap();
    assert_ready_ok!(sink.enter(|cx, s| s.poll_ready(cx))); // went at once: tokens to spare
    sink.enter(|_, s| s.start_send(500)).unwrap();
    assert_pending!(sink.enter(|cx, s| s.poll_ready(cx))); // 400 tokens short
    let held = sink.enter(|_, s| s.get_mut().as_mut().take_held());
    assert_eq!(held, Some(500));
    assert_eq!(llm.available(), [1, 100]);
    assert_eq!(timeline(&log.lock().unwrap()), "0ms:900");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any requests written to the sink: every one arrives, in order, when both limits (each
    /// replayed by a naive bucket) have room, and within tokio's tick of the latest of their
    /// ready times, so each limit's bound holds.
    #[test]
    fn a_multi_limit_sink_keeps_every_bound_and_the_order(
        req_rate in 1u64..20,
        req_burst in 1u64..5,
        tok_rate in 100u64..5_000,
        tok_burst in 100u64..2_000,
        tokens in proptest::collection::vec(0u64..100, 1..30),
    ) {
        let tokens: Vec<u64> = tokens.iter().map(|t| t * tok_burst / 100).collect();
        let sent = paused(async {
            let llm = paced::RateLimiter::builder(["requests", "tokens"])
                .limit("requests", paced::Limit::bucket(Rate::per_second(req_rate), req_burst))
                .limit("tokens", paced::Limit::bucket(Rate::per_second(tok_rate), tok_burst))
                .build()
                .unwrap();
            let start = Instant::now();
            let log = Arc::new(Mutex::new(Vec::new()));
            let mut sink = pin!(recording_sink(start, &log).throttle_with(&llm, |t: &(usize, u64)| [1, t.1]));
            for (i, &t) in tokens.iter().enumerate() {
                within_an_hour(sink.send((i, t))).await.unwrap();
            }
            log.lock().unwrap().clone()
        });
        prop_assert_eq!(sent.len(), tokens.len());
        let mut requests = NaiveBucket::new(req_rate, Duration::from_secs(1), req_burst);
        let mut tokens_bucket = NaiveBucket::new(tok_rate, Duration::from_secs(1), tok_burst);
        let mut offered = 0;
        for (i, &((index, cost), at)) in sent.iter().enumerate() {
            prop_assert_eq!(index, i);
            let due = requests.earliest(offered, 1).max(tokens_bucket.earliest(offered, cost));
            prop_assert!(at >= due && at <= tick_ceil(due), "item {} at {} ns, due {} ns", i, at, due);
            requests.emit(at, 1);
            tokens_bucket.emit(at, cost);
            offered = at;
        }
    }
}
