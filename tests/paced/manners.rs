//! What every adapter owes its users beyond its schedule: no runtime to build, no wake-ups
//! while idle, clean drops, fused ends, honest size hints, auto traits, multi-thread use.

use std::time::Duration;

use futures_util::stream::{self, FusedStream};
use futures_util::{Stream, StreamExt};
use paced::stream::{BatchedInterval, MinInterval, StaggeredStart, Throttle};
use paced::{Enforcing, PaceExt, Rate, Shaping};
use tokio_test::{assert_pending, assert_ready_eq, task};

type Src = stream::Iter<std::ops::Range<u32>>;

fn src() -> Src {
    stream::iter(0..4)
}

#[test]
fn building_needs_no_runtime() {
    // tokio #5036: a `Sleep` created at construction panics outside a runtime.
    let a = src().throttle(Rate::per_second(1), |_| 1, 1, Shaping);
    let b = src().throttle(Rate::per_second(1), |_| 1, 1, Enforcing);
    let c = src().min_interval(Duration::from_secs(1));
    let d = src().batched_interval(2, Duration::from_secs(1));
    let e = src().staggered_start(1, Duration::from_secs(1));
    // ...and the adapters built outside still work inside one.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        assert_eq!(a.collect::<Vec<_>>().await.len(), 4);
        assert_eq!(b.collect::<Vec<_>>().await.len(), 4);
        assert_eq!(c.collect::<Vec<_>>().await.len(), 4);
        assert_eq!(d.collect::<Vec<_>>().await.len(), 2);
        assert_eq!(e.collect::<Vec<_>>().await.len(), 4);
    });
}

/// An adapter over a source that never yields must not wake itself up, ever: no timer is armed
/// while nothing waits, so paused time has nothing to advance to.
async fn stays_idle<S: Stream>(s: S)
where
    S::Item: std::fmt::Debug,
{
    let mut t = task::spawn(s);
    assert_pending!(t.poll_next());
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(!t.is_woken(), "an idle adapter woke up");
    assert_pending!(t.poll_next());
}

#[tokio::test(start_paused = true)]
async fn idle_adapters_do_not_wake() {
    let never = || stream::pending::<u32>();
    stays_idle(never().throttle(Rate::per_second(1), |_| 1, 1, Shaping)).await;
    stays_idle(never().throttle(Rate::per_second(1), |_| 1, 1, Enforcing)).await;
    stays_idle(never().min_interval(Duration::from_millis(1))).await;
    stays_idle(never().batched_interval(3, Duration::from_millis(1))).await;
    stays_idle(never().staggered_start(1, Duration::from_millis(1))).await;
}

#[tokio::test(start_paused = true)]
async fn idle_after_traffic_does_not_wake() {
    // After an item has left and the source went quiet, the timer is no longer armed.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
    let s = tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
        .min_interval(Duration::from_millis(10));
    let mut t = task::spawn(s);
    tx.send(1).unwrap();
    tx.send(2).unwrap();
    assert_ready_eq!(t.poll_next(), Some(1));
    assert_pending!(t.poll_next());
    tokio::time::advance(Duration::from_millis(10)).await;
    assert!(t.is_woken());
    assert_ready_eq!(t.poll_next(), Some(2));
    assert_pending!(t.poll_next());
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(!t.is_woken(), "woke up with nothing to do");
}

#[tokio::test(start_paused = true)]
async fn batched_interval_idle_after_traffic_does_not_wake() {
    // A batch that leaves at once must not leave a timer armed behind it.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
    let s = tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
        .batched_interval(3, Duration::from_millis(10));
    let mut t = task::spawn(s);
    tx.send(1).unwrap();
    assert_ready_eq!(t.poll_next(), Some(vec![1]));
    assert_pending!(t.poll_next());
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(!t.is_woken(), "woke up with nothing to do");
    // And one that waited for its interval neither.
    tx.send(2).unwrap();
    tx.send(3).unwrap();
    assert_ready_eq!(t.poll_next(), Some(vec![2, 3]));
    tx.send(4).unwrap();
    assert_pending!(t.poll_next());
    tokio::time::advance(Duration::from_millis(10)).await;
    assert_ready_eq!(t.poll_next(), Some(vec![4]));
    assert_pending!(t.poll_next());
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(!t.is_woken(), "woke up with nothing to do");
}

#[tokio::test(start_paused = true)]
async fn not_terminated_while_something_is_held() {
    use futures_util::poll;
    use std::task::Poll;
    let mut b = Box::pin(src().batched_interval(3, Duration::from_secs(1)));
    assert_eq!(poll!(b.next()), Poll::Ready(Some(vec![0, 1, 2])));
    assert!(poll!(b.next()).is_pending()); // [3] held, upstream done
    assert!(!b.is_terminated());
    let mut m = Box::pin(stream::iter(0..2).min_interval(Duration::from_secs(1)));
    assert_eq!(poll!(m.next()), Poll::Ready(Some(0)));
    assert!(poll!(m.next()).is_pending()); // 1 held
    assert!(!m.is_terminated());
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(poll!(m.next()), Poll::Ready(Some(1)));
    assert_eq!(poll!(m.next()), Poll::Ready(None));
    assert!(m.is_terminated());
}

#[tokio::test(start_paused = true)]
async fn waiting_adapter_wakes_once_at_its_time() {
    let s = src().throttle(Rate::per_second(1), |_| 1, 1, Shaping);
    let mut t = task::spawn(s);
    assert_ready_eq!(t.poll_next(), Some(0));
    assert_pending!(t.poll_next());
    tokio::time::advance(Duration::from_millis(999)).await;
    assert!(!t.is_woken(), "woke before the deadline");
    assert_pending!(t.poll_next());
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(t.is_woken());
    assert_ready_eq!(t.poll_next(), Some(1));
}

#[tokio::test(start_paused = true)]
async fn dropping_a_waiting_stream_is_fine() {
    let dropped = std::sync::Arc::new(());
    let guard = dropped.clone();
    let source = stream::iter(0..3).map(move |i| (i, guard.clone()));
    let mut t = task::spawn(source.min_interval(Duration::from_secs(10)));
    assert!(matches!(t.poll_next(), std::task::Poll::Ready(Some(_))));
    assert_pending!(t.poll_next());
    drop(t);
    assert_eq!(
        std::sync::Arc::strong_count(&dropped),
        1,
        "held item leaked"
    );
    tokio::time::advance(Duration::from_secs(60)).await;
}

#[tokio::test(start_paused = true)]
async fn ends_are_fused() {
    async fn check<S: FusedStream>(s: S) {
        let mut s = std::pin::pin!(s);
        assert!(!s.is_terminated());
        while s.next().await.is_some() {}
        assert!(s.is_terminated());
        assert!(s.next().await.is_none());
        assert!(s.next().await.is_none());
    }
    check(src().throttle(Rate::per_second(1), |_| 1, 1, Shaping)).await;
    check(src().throttle(Rate::per_second(1), |_| 1, 1, Enforcing)).await;
    check(src().min_interval(Duration::from_secs(1))).await;
    check(src().batched_interval(3, Duration::from_secs(1))).await;
    check(src().staggered_start(1, Duration::from_secs(1))).await;
}

#[tokio::test(start_paused = true)]
async fn upstream_is_not_polled_after_it_ended() {
    // A source that panics if polled after `None` (futures' `Iter` is fine with it, so guard).
    let mut ended = false;
    let strict = stream::poll_fn(move |_| {
        assert!(!ended, "polled after it ended");
        ended = true;
        std::task::Poll::Ready(None::<u32>)
    });
    let mut s = std::pin::pin!(strict.min_interval(Duration::from_secs(1)));
    assert_eq!(s.next().await, None);
    assert_eq!(s.next().await, None);
}

#[tokio::test(start_paused = true)]
async fn size_hints_are_honest() {
    let mut s = std::pin::pin!(src().throttle(Rate::per_second(1), |_| 1, 1, Shaping));
    assert_eq!(s.size_hint(), (4, Some(4)));
    s.next().await;
    assert_eq!(s.size_hint(), (3, Some(3)));
    let mut t = task::spawn(src().min_interval(Duration::from_secs(1)));
    assert_ready_eq!(t.poll_next(), Some(0));
    assert_pending!(t.poll_next()); // item 1 is now held
    assert_eq!(t.size_hint(), (3, Some(3)));

    let b = stream::iter(0..10).batched_interval(3, Duration::from_secs(1));
    assert_eq!(b.size_hint(), (4, Some(10)));
    let e = src().throttle(Rate::per_second(1), |_| 1, 1, Enforcing);
    assert_eq!(e.size_hint(), (4, Some(4)));
    let st = src().staggered_start(2, Duration::from_secs(1));
    assert_eq!(st.size_hint(), (4, Some(4)));
}

#[test]
fn adapters_are_send_sync_debug_when_their_parts_are() {
    fn send_sync<T: Send + Sync + 'static>() {}
    fn cost(_: &u32) -> u64 {
        1
    }
    send_sync::<Throttle<Src, fn(&u32) -> u64, Shaping>>();
    send_sync::<Throttle<Src, fn(&u32) -> u64, Enforcing>>();
    send_sync::<MinInterval<Src>>();
    send_sync::<BatchedInterval<Src>>();
    send_sync::<StaggeredStart<Src>>();
    let t = src().throttle(Rate::per_second(1), cost as fn(&u32) -> u64, 1, Shaping);
    assert!(format!("{t:?}").starts_with("Throttle"));
    assert!(format!("{:?}", src().min_interval(Duration::ZERO)).starts_with("MinInterval"));
    let b = src().batched_interval(1, Duration::ZERO);
    assert!(format!("{b:?}").starts_with("BatchedInterval"));
    let s = src().staggered_start(1, Duration::ZERO);
    assert!(format!("{s:?}").starts_with("StaggeredStart"));
}

#[test]
fn idle_adapters_stay_small() {
    use std::mem::{align_of, size_of};
    // Thousands of idle streams should cost what tokio-stream's `throttle` costs: a task that
    // holds one and waits fits tokio's 256-byte allocation step when the adapter takes at most
    // 136 bytes beside tokio's `Sleep` over an 8-byte stream (the timerfd is the thread's, not
    // the adapter's), and is 8-byte aligned (an adapter aligned to 16 would be padded to a
    // multiple of 16 and its task moved to the 384-byte step; see BENCHMARKS.md, memory).
    let room = size_of::<tokio::time::Sleep>() + 136;
    let sizes = [
        (
            "min_interval",
            size_of::<MinInterval<Src>>(),
            align_of::<MinInterval<Src>>(),
        ),
        (
            "throttle",
            size_of::<Throttle<Src, fn(&u32) -> u64, Shaping>>() - size_of::<fn(&u32) -> u64>(),
            align_of::<Throttle<Src, fn(&u32) -> u64, Shaping>>(),
        ),
        (
            "staggered_start",
            size_of::<StaggeredStart<Src>>(),
            align_of::<StaggeredStart<Src>>(),
        ),
        (
            "batched_interval",
            size_of::<BatchedInterval<Src>>(),
            align_of::<BatchedInterval<Src>>(),
        ),
    ];
    for (name, size, align) in sizes {
        assert!(size <= room, "{name}: {size} bytes, more than {room}");
        assert_eq!(align, 8, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_thread_runtime_with_a_channel_source() {
    // Real time here: a multi-thread runtime cannot be paused. Bounds only, no exact times.
    let (tx, rx) = tokio::sync::mpsc::channel::<u32>(16);
    let producer = tokio::spawn(async move {
        for i in 0..40 {
            tx.send(i).await.unwrap();
        }
    });
    let start = std::time::Instant::now();
    let s = tokio_stream::wrappers::ReceiverStream::new(rx).throttle(
        Rate::per_second(1000),
        |_| 1,
        10,
        Shaping,
    );
    let consumer = tokio::spawn(async move {
        let mut s = std::pin::pin!(s);
        let mut got = Vec::new();
        while let Some(i) = s.next().await {
            got.push((i, start.elapsed()));
        }
        got
    });
    producer.await.unwrap();
    let got = consumer.await.unwrap();
    let items: Vec<u32> = got.iter().map(|&(i, _)| i).collect();
    assert_eq!(items, (0..40).collect::<Vec<_>>());
    // 40 items, 10 at once, then one per ms: at least 30 ms.
    let last = got.last().unwrap().1;
    assert!(last >= Duration::from_millis(30), "too fast: {last:?}");
    for (i, &(_, at)) in got.iter().enumerate() {
        // Item i needs (i + 1 - 10) ms of refill.
        let need = Duration::from_millis((i as u64 + 1).saturating_sub(10));
        assert!(at >= need, "item {i} at {at:?}, before {need:?}");
    }
}
