//! tokio's cooperative budget: a task that loops on a limiter whose limit never binds still
//! lets the other tasks of its thread run, as it would looping on a tokio `Semaphore`.
//!
//! Under paused time the clock cannot move while a task is always ready, so the paused tests
//! measure how many grants the looping task made before another ready task got its turn
//! (at most one budget's worth, 128, with the budget; all of them without). The one test in
//! real time shows the effect users see: a 5 ms timer fires on time, not after the loop.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{stream, SinkExt, StreamExt};
use paced::{
    Enforcing, KeyedRateLimiter, Limit, PaceExt, PaceSinkExt, Rate, RateLimiter, Shaping, Stagger,
};

/// Grants in the loop: far more than one budget (tokio's is 128 units per poll).
const N: usize = 10_000;

/// A limiter whose limit never binds at any speed a test reaches.
fn nonbinding() -> RateLimiter {
    RateLimiter::new(Rate::per_second(1_000_000_000), u64::MAX / 2)
}

/// Awaits `step()` `N` times on this task while a spawned task waits for its first poll;
/// returns how many steps were done when that task ran.
async fn steps_before_the_other_task_runs(mut step: impl AsyncFnMut()) -> usize {
    let done = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(AtomicUsize::new(usize::MAX));
    let other = tokio::spawn({
        let (done, seen) = (done.clone(), seen.clone());
        async move { seen.store(done.load(Ordering::Relaxed), Ordering::Relaxed) }
    });
    for _ in 0..N {
        step().await;
        done.fetch_add(1, Ordering::Relaxed);
    }
    other.await.expect("the other task");
    seen.load(Ordering::Relaxed)
}

/// Loops `step` as [`steps_before_the_other_task_runs`] does and asserts that the other task
/// ran within a budget's worth of grants, not after the loop.
async fn assert_yields(step: impl AsyncFnMut()) {
    let seen = steps_before_the_other_task_runs(step).await;
    assert!(
        seen <= 128,
        "the other task ran only after {seen} of {N} grants made without a wait"
    );
}

#[tokio::test(start_paused = true)]
async fn multi_rate_limiter_acquire_spends_the_budget() {
    let free = Limit::bucket(Rate::per_second(1_000_000_000), u64::MAX / 2);
    let limiter: RateLimiter<[u64; 2]> = RateLimiter::builder(["requests", "tokens"])
        .limit("requests", free)
        .limit("tokens", free)
        .build()
        .unwrap();
    assert_yields(async || drop(limiter.acquire([1, 10]).await)).await;
    assert_yields(async || {
        let _ = limiter
            .acquire_timeout([1, 10], Duration::from_secs(1))
            .await;
    })
    .await;
    assert_eq!(limiter.stats().granted, 2 * N as u64);
}

#[tokio::test(start_paused = true)]
async fn rate_limiter_acquire_spends_the_budget() {
    let limiter = nonbinding();
    assert_yields(async || limiter.acquire(1).await).await;
    assert_eq!(limiter.stats().granted, N as u64);
}

#[tokio::test(start_paused = true)]
async fn rate_limiter_acquire_timeout_spends_the_budget() {
    let limiter = nonbinding();
    assert_yields(async || {
        let granted = limiter.acquire_timeout(1, Duration::ZERO).await;
        assert!(granted.is_ok());
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn keyed_acquire_spends_the_budget() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(1_000_000_000), u64::MAX / 2);
    assert_yields(async || limiter.acquire(&"key", 1).await).await;
    assert_eq!(limiter.stats().granted, N as u64);
}

#[tokio::test(start_paused = true)]
async fn stagger_acquire_spends_the_budget() {
    let stagger = Stagger::new(usize::MAX, Duration::ZERO);
    assert_yields(async || stagger.acquire().await).await;
    assert_eq!(stagger.stats().granted, N as u64);
}

#[tokio::test(start_paused = true)]
async fn a_throttle_with_stream_spends_the_budget() {
    let limiter = nonbinding();
    let mut paced = std::pin::pin!(stream::repeat(()).throttle_with(&limiter, |_| 1, Shaping));
    assert_yields(async || assert_eq!(paced.next().await, Some(()))).await;
}

#[tokio::test(start_paused = true)]
async fn an_enforcing_throttle_with_stream_spends_the_budget() {
    let limiter = nonbinding();
    let mut paced = std::pin::pin!(stream::repeat(()).throttle_with(&limiter, |_| 1, Enforcing));
    assert_yields(async || assert!(matches!(paced.next().await, Some(Ok(()))))).await;
}

#[tokio::test(start_paused = true)]
async fn a_throttle_with_sink_spends_the_budget() {
    let limiter = nonbinding();
    let mut sink = std::pin::pin!(futures_util::sink::drain().throttle_with(&limiter, |_: &()| 1));
    assert_yields(async || sink.send(()).await.expect("drain")).await;
}

#[tokio::test(start_paused = true)]
async fn a_throttle_with_stream_over_a_multi_rate_limiter_spends_the_budget() {
    let llm = paced::RateLimiter::builder(["requests", "tokens"])
        .limit(
            "tokens",
            paced::Limit::bucket(Rate::per_second(1_000_000_000), u64::MAX / 2),
        )
        .build()
        .unwrap();
    let mut paced = std::pin::pin!(stream::repeat(()).throttle_with(&llm, |_| [1, 10], Shaping));
    assert_yields(async || assert_eq!(paced.next().await, Some(()))).await;
    let mut sink = std::pin::pin!(futures_util::sink::drain().throttle_with(&llm, |_: &()| [1, 1]));
    assert_yields(async || sink.send(()).await.expect("drain")).await;
}

#[tokio::test(start_paused = true)]
async fn a_throttle_by_key_stream_spends_the_budget() {
    let limiter = KeyedRateLimiter::new(Rate::per_second(1_000_000_000), u64::MAX / 2);
    let mut paced = std::pin::pin!(stream::repeat(7u8).throttle_by_key(&limiter, |k| *k, |_| 1, 8));
    assert_yields(async || assert_eq!(paced.next().await, Some(7))).await;
}

#[tokio::test(start_paused = true)]
async fn try_acquire_spends_no_budget() {
    let limiter = nonbinding();
    let stagger = Stagger::new(usize::MAX, Duration::ZERO);
    let keyed = KeyedRateLimiter::new(Rate::per_second(1_000_000_000), u64::MAX / 2);
    for _ in 0..1_000 {
        limiter.try_acquire(1).expect("free");
        stagger.try_acquire().expect("free");
        keyed.try_acquire(&1, 1).expect("free");
    }
    assert!(tokio::task::coop::has_budget_remaining());
}

/// In real time: a 5 ms timer on the same thread fires about on time while a task loops on
/// grants that need no wait, rather than after the loop (which runs for 200 ms).
#[test]
fn a_timer_fires_on_time_beside_a_busy_acquirer() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let looping = Arc::new(AtomicBool::new(true));
        let start = std::time::Instant::now();
        let timer = tokio::spawn({
            let looping = looping.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                (start.elapsed(), looping.load(Ordering::Relaxed))
            }
        });
        let limiter = nonbinding();
        let mut grants = 0u64;
        while start.elapsed() < Duration::from_millis(200) {
            for _ in 0..100 {
                limiter.acquire(1).await;
            }
            grants += 100;
        }
        looping.store(false, Ordering::Relaxed);
        let (fired, during_the_loop) = timer.await.expect("timer task");
        assert!(
            during_the_loop,
            "the 5 ms timer fired only after the loop ({fired:?}, {grants} grants)"
        );
        assert!(fired < Duration::from_millis(100), "fired at {fired:?}");
    });
}

#[cfg(feature = "tower")]
mod tower_layer {
    use std::convert::Infallible;

    use paced::tower::RateLimitLayer;
    use tower::{Layer, Service, ServiceExt};

    use super::*;

    /// Calls `service` `N` times, asserting that the other task runs within a budget.
    async fn assert_calls_yield<S>(mut service: S)
    where
        S: Service<(), Response = ()>,
        S::Error: std::fmt::Debug,
    {
        assert_yields(async || {
            let ready = service.ready().await.expect("ready");
            ready.call(()).await.expect("granted");
        })
        .await;
    }

    fn inner() -> impl Service<(), Response = (), Error = Infallible> + Clone {
        tower::service_fn(|()| async { Ok::<_, Infallible>(()) })
    }

    #[tokio::test(start_paused = true)]
    async fn a_shaping_layer_spends_the_budget() {
        let limiter = nonbinding();
        let service = RateLimitLayer::new(&limiter).layer(inner());
        assert_calls_yield(service).await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_enforcing_layer_spends_the_budget() {
        let limiter = nonbinding();
        let service = RateLimitLayer::new(&limiter).enforcing().layer(inner());
        assert_calls_yield(service).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_keyed_layer_spends_the_budget() {
        let limiter = KeyedRateLimiter::<u8>::new(Rate::per_second(1_000_000_000), u64::MAX / 2);
        let service = RateLimitLayer::keyed(&limiter, |_: &()| 0u8).layer(inner());
        assert_calls_yield(service).await;
    }
}
