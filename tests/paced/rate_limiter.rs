//! `RateLimiter`: its scenarios and edge cases, under paused time unless marked.

use crate::common;
use crate::exact;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{nanos_since, within_an_hour, MS};
use exact::{any_count, any_period, ExactBucket};
use paced::{Rate, RateLimiter};
use proptest::prelude::*;
use tokio::time::{advance, sleep, Instant};

/// Spawns one task per cost, in order and each a moment after the previous one, so that they
/// queue in that order; returns (index, grant time in ms) in grant order.
async fn grants(limiter: &RateLimiter, costs: &[u64]) -> Vec<(usize, u64)> {
    let start = Instant::now();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, &cost) in costs.iter().enumerate() {
        let limiter = limiter.clone();
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            limiter.acquire(cost).await;
            log.lock().unwrap().push((i, nanos_since(start) / MS));
        }));
        tokio::task::yield_now().await;
    }
    for task in tasks {
        within_an_hour(task).await.unwrap();
    }
    log.lock().unwrap().clone()
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_arrival_order() {
    let limiter = RateLimiter::new(Rate::per_second(10), 2);
    let got = grants(&limiter, &[1; 6]).await;
    assert_eq!(
        got,
        [(0, 0), (1, 0), (2, 100), (3, 200), (4, 300), (5, 400)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_large_request_is_not_starved_by_small_ones() {
    // The cost-4 request queues second; the small ones behind it wait for it, even though
    // each of them alone would fit earlier.
    let limiter = RateLimiter::new(Rate::per_second(10), 4);
    let got = grants(&limiter, &[4, 4, 1, 1, 1]).await;
    assert_eq!(got, [(0, 0), (1, 400), (2, 500), (3, 600), (4, 700)]);
}

#[tokio::test(start_paused = true)]
async fn cost_above_burst_pays_its_debt_and_zero_cost_passes() {
    let limiter = RateLimiter::new(Rate::per_second(10), 5);
    let got = grants(&limiter, &[5, 10, 1]).await;
    assert_eq!(got, [(0, 0), (1, 1000), (2, 1100)]);
    // Cost 0 goes at once, even with others waiting.
    let waiting = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.acquire(1).await }
    });
    tokio::task::yield_now().await;
    assert_eq!(limiter.stats().waiting, 1);
    let start = Instant::now();
    limiter.acquire(0).await;
    assert_eq!(limiter.try_acquire(0), Ok(()));
    assert_eq!(start.elapsed(), Duration::ZERO);
    within_an_hour(waiting).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn try_acquire_never_jumps_the_queue() {
    let limiter = RateLimiter::new(Rate::per_second(10), 3);
    limiter.try_acquire(2).unwrap();
    // One token left; a request for 3 queues.
    let big = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.acquire(3).await }
    });
    tokio::task::yield_now().await;
    // A cost of 1 would fit now, but someone is waiting.
    let refused = limiter.try_acquire(1).unwrap_err();
    // The big one leaves at 200 ms and empties the bucket; one more token at 300 ms.
    assert_eq!(refused.retry_after(), Duration::from_millis(300));
    within_an_hour(big).await.unwrap();
    assert_eq!(Instant::now().elapsed(), Duration::ZERO);
    assert_eq!(limiter.stats().rejected, 1);
}

#[tokio::test(start_paused = true)]
async fn try_acquire_above_burst_is_never_possible() {
    let limiter = RateLimiter::new(Rate::per_second(10), 5);
    assert_eq!(
        limiter.try_acquire(6).unwrap_err().retry_after(),
        Duration::MAX
    );
    assert_eq!(limiter.available(), 5, "a refusal takes nothing");
}

#[tokio::test(start_paused = true)]
async fn acquire_timeout_takes_nothing_when_it_gives_up() {
    let limiter = RateLimiter::new(Rate::per_second(10), 1);
    limiter.acquire(1).await;
    let start = Instant::now();
    let refused = limiter.acquire_timeout(1, Duration::from_millis(99)).await;
    assert_eq!(
        refused.unwrap_err().retry_after(),
        Duration::from_millis(100)
    );
    assert_eq!(start.elapsed(), Duration::ZERO, "refused at once");
    assert!(limiter
        .acquire_timeout(1, Duration::from_millis(100))
        .await
        .is_ok());
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    // With someone queued, the projection counts them.
    let queued = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.acquire(1).await }
    });
    tokio::task::yield_now().await;
    let refused = limiter.acquire_timeout(1, Duration::from_millis(150)).await;
    assert_eq!(
        refused.unwrap_err().retry_after(),
        Duration::from_millis(200)
    );
    within_an_hour(queued).await.unwrap();
    assert_eq!(limiter.stats().waiting, 0);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_gives_its_place_back() {
    // 1/s: A takes the token at 0; B and C queue. B is cancelled at 500 ms: C is served at
    // 1 s, as if B had never been there.
    let limiter = RateLimiter::new(Rate::per_second(1), 1);
    let start = Instant::now();
    limiter.acquire(1).await;
    let b = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.acquire(1).await }
    });
    tokio::task::yield_now().await;
    let c = tokio::spawn({
        let limiter = limiter.clone();
        async move {
            limiter.acquire(1).await;
            start.elapsed()
        }
    });
    tokio::task::yield_now().await;
    assert_eq!(limiter.stats().waiting, 2);
    sleep(Duration::from_millis(500)).await;
    b.abort();
    assert!(b.await.unwrap_err().is_cancelled());
    assert_eq!(within_an_hour(c).await.unwrap(), Duration::from_secs(1));
    assert_eq!(limiter.stats().waiting, 0);
    assert_eq!(limiter.stats().granted, 2);
}

#[tokio::test(start_paused = true)]
async fn raising_the_rate_serves_a_waiter_early() {
    let limiter = RateLimiter::new(Rate::per_second(1), 1);
    limiter.acquire(1).await;
    let start = Instant::now();
    let waiter = tokio::spawn({
        let limiter = limiter.clone();
        async move {
            limiter.acquire(1).await;
            start.elapsed()
        }
    });
    sleep(Duration::from_millis(100)).await;
    limiter.set_rate(Rate::per_second(100));
    assert_eq!(
        within_an_hour(waiter).await.unwrap(),
        Duration::from_millis(109)
    );
}

#[tokio::test(start_paused = true)]
async fn halving_the_rate_halves_the_observed_rate() {
    let limiter = RateLimiter::new(Rate::per_second(10), 1);
    let start = Instant::now();
    let mut times = Vec::new();
    for i in 0..20 {
        if i == 10 {
            limiter.set_rate(Rate::per_second(5));
        }
        limiter.acquire(1).await;
        times.push(start.elapsed().as_millis());
    }
    let gaps: Vec<u128> = times.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps[..9].iter().all(|&g| g == 100), "{times:?}");
    assert!(gaps[10..].iter().all(|&g| g == 200), "{times:?}");
}

#[tokio::test(start_paused = true)]
async fn set_burst_keeps_the_level_and_wakes_waiters() {
    let limiter = RateLimiter::new(Rate::per_second(10), 2);
    limiter.acquire(2).await;
    let start = Instant::now();
    let big = tokio::spawn({
        let limiter = limiter.clone();
        async move {
            limiter.acquire(4).await;
            start.elapsed()
        }
    });
    tokio::task::yield_now().await;
    // A cost of 4 above a burst of 2 pays its debt: full at 200 ms, then 2 more: 400 ms.
    // With a burst of 4 it waits for 4 tokens: 400 ms too, but now within the bucket.
    limiter.set_burst(4);
    assert_eq!(
        within_an_hour(big).await.unwrap(),
        Duration::from_millis(400)
    );
    assert_eq!(limiter.available(), 0);
    sleep(Duration::from_secs(1)).await;
    assert_eq!(limiter.available(), 4);
}

/// Counts how often the wrapped future is polled.
struct Polls<F> {
    inner: std::pin::Pin<Box<F>>,
    polls: Arc<AtomicUsize>,
}

impl<F: Future> Future for Polls<F> {
    type Output = F::Output;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.inner.as_mut().poll(cx)
    }
}

#[tokio::test(start_paused = true)]
async fn a_grant_wakes_only_the_next_waiter() {
    let limiter = RateLimiter::new(Rate::per_second(100), 1);
    limiter.acquire(1).await;
    let polls = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let limiter = limiter.clone();
        let fut = async move { limiter.acquire(1).await };
        tasks.push(tokio::spawn(Polls {
            inner: Box::pin(fut),
            polls: polls.clone(),
        }));
    }
    for task in tasks {
        within_an_hour(task).await.unwrap();
    }
    // Each waiter is polled when spawned, when it becomes the head, and when its timer
    // fires: three times at most, never once per grant of another.
    let polls = polls.load(Ordering::Relaxed);
    assert!(
        polls <= 300,
        "{polls} polls for 100 waiters: a thundering herd"
    );
    assert_eq!(limiter.stats().granted, 101);
}

#[tokio::test(start_paused = true)]
async fn guava_warm_up_schedule() {
    // Guava's RateLimiterTest.testWarmUp, acquire by acquire.
    let limiter = RateLimiter::warming_up(Rate::per_second(2), Duration::from_secs(4), 3.0);
    async fn eight(limiter: &RateLimiter) -> Vec<u128> {
        let mut waits = Vec::new();
        for _ in 0..8 {
            let start = Instant::now();
            limiter.acquire(1).await;
            waits.push(start.elapsed().as_millis());
        }
        waits
    }
    let cold = [0, 1375, 1125, 875, 625, 500, 500, 500];
    assert_eq!(eight(&limiter).await, cold);
    sleep(Duration::from_millis(500 + 4_000)).await;
    assert_eq!(eight(&limiter).await, cold);
    sleep(Duration::from_millis(500 + 2_000)).await;
    assert_eq!(
        eight(&limiter).await,
        [0, 500, 500, 500, 500, 500, 500, 500]
    );
}

#[tokio::test(start_paused = true)]
async fn guava_warm_up_with_another_cold_factor() {
    // testWarmUpWithColdFactor: 5/s, 4 s, cold factor 10 (cool-down 293 ms, not 200 ms).
    // Guava's waits (0.00, 1.75, 1.26, 0.76, 0.30, 0.20...) are 1752.5 ms, 1257.5 ms, ...:
    // not whole milliseconds, so each grant comes out on the next tick, and the next wait
    // is measured from there.
    let limiter = RateLimiter::warming_up(Rate::per_second(5), Duration::from_secs(4), 10.0);
    let guava_ms = [0.0, 1752.5, 1257.5, 762.5, 300.1, 200.0, 200.0, 200.0];
    let start = Instant::now();
    let mut ideal = 0.0;
    for expected in guava_ms {
        limiter.acquire(1).await;
        ideal += expected;
        let at = start.elapsed().as_secs_f64() * 1e3;
        assert!(
            at >= ideal - 0.01 && at <= ideal + 1.0,
            "granted at {at} ms, Guava's schedule says {ideal} ms"
        );
    }
}

#[test]
fn bad_configuration_is_a_typed_error() {
    use paced::ConfigError;
    let rate = Rate::per_second(1);
    assert_eq!(
        RateLimiter::try_new(rate, 0).err(),
        Some(ConfigError::ZeroBurst)
    );
    let four = Duration::from_secs(4);
    for bad in [0.0, 0.99, f64::NAN, f64::INFINITY, -3.0] {
        let err = RateLimiter::try_warming_up(rate, four, bad).err();
        assert_eq!(err, Some(ConfigError::ColdFactor), "{bad}");
    }
    let err = RateLimiter::try_warming_up(rate, Duration::ZERO, 3.0).err();
    assert_eq!(err, Some(ConfigError::ZeroWarmup));
    assert!(ConfigError::ColdFactor.to_string().contains("cold_factor"));
}

#[test]
#[should_panic(expected = "`cold_factor` must be a finite number of at least 1")]
fn warming_up_panics_on_a_bad_cold_factor() {
    let _ = RateLimiter::warming_up(Rate::per_second(1), Duration::from_secs(1), 0.5);
}

#[test]
#[should_panic(expected = "`burst` is 0")]
fn new_panics_on_zero_burst() {
    let _ = RateLimiter::new(Rate::per_second(1), 0);
}

#[test]
fn handles_are_send_sync_and_cheap_to_clone() {
    fn send_sync<T: Send + Sync + Clone + 'static>() {}
    send_sync::<RateLimiter>();
    send_sync::<paced::Stagger>();
    fn send<T: Send>(_: T) {}
    let limiter = RateLimiter::new(Rate::per_second(1), 1);
    send(limiter.acquire(1));
    send(limiter.acquire_timeout(1, Duration::ZERO));
    assert!(format!("{limiter:?}").starts_with("RateLimiter"));
}

#[test]
fn rate_and_burst_say_what_is_in_force() {
    let limiter = RateLimiter::new(Rate::new(3, Duration::from_secs(2)), 4);
    assert_eq!(limiter.rate(), Rate::new(3, Duration::from_secs(2)));
    assert_eq!(limiter.burst(), Some(4));
    limiter.set_rate(Rate::per_second(50));
    limiter.set_burst(9);
    assert_eq!(limiter.rate(), Rate::per_second(50));
    assert_eq!(limiter.burst(), Some(9));
    let warming = RateLimiter::warming_up(Rate::per_second(2), Duration::from_secs(4), 3.0);
    assert_eq!(warming.rate(), Rate::per_second(2));
    assert_eq!(warming.burst(), None);
}

#[tokio::test(start_paused = true)]
async fn pause_for_holds_everyone_back_and_keeps_the_order() {
    let limiter = RateLimiter::new(Rate::per_second(10), 3);
    limiter.try_acquire(1).unwrap();
    let start = Instant::now();
    // Three waiters queue behind a pause of 500 ms (the bucket refills meanwhile: 3 tokens).
    limiter.pause_for(Duration::from_millis(500));
    assert_eq!(limiter.available(), 0);
    let refused = limiter.try_acquire(1).unwrap_err();
    assert_eq!(refused.retry_after(), Duration::from_millis(500));
    let got = grants(&limiter, &[1, 2, 1]).await;
    // 0 and 1 take the three tokens the pause let accumulate; 2 waits for the next one.
    assert_eq!(got, [(0, 500), (1, 500), (2, 600)]);
    assert_eq!(nanos_since(start) / MS, 600);
}

#[tokio::test(start_paused = true)]
async fn a_shorter_pause_does_not_shorten_a_longer_one() {
    let limiter = RateLimiter::new(Rate::per_second(1000), 10);
    let start = Instant::now();
    limiter.pause_for(Duration::from_secs(2));
    sleep(Duration::from_millis(100)).await;
    limiter.pause_for(Duration::from_millis(10));
    limiter.acquire(1).await;
    assert_eq!(nanos_since(start), 2_000 * MS);
    // A longer one extends it.
    limiter.pause_for(Duration::from_secs(1));
    limiter.pause_for(Duration::from_secs(3));
    limiter.acquire(1).await;
    assert_eq!(nanos_since(start), 5_000 * MS);
}

#[tokio::test(start_paused = true)]
async fn pausing_wakes_nobody_early_and_a_waiter_already_asleep_rereads_its_deadline() {
    let limiter = RateLimiter::new(Rate::per_second(10), 1);
    limiter.try_acquire(1).unwrap();
    let start = Instant::now();
    let waiter = tokio::spawn({
        let limiter = limiter.clone();
        async move {
            limiter.acquire(1).await;
            nanos_since(start) / MS
        }
    });
    sleep(Duration::from_millis(50)).await;
    // The waiter sleeps until 100 ms; the pause moves it to 50 + 300 ms.
    limiter.pause_for(Duration::from_millis(300));
    assert_eq!(within_an_hour(waiter).await.unwrap(), 350);
}

#[tokio::test(start_paused = true)]
async fn pause_for_saturates() {
    let limiter = RateLimiter::new(Rate::per_second(10), 1);
    limiter.pause_for(Duration::MAX);
    assert_eq!(
        limiter.try_acquire(1).unwrap_err().retry_after(),
        Duration::MAX
    );
    // A waiter waits "forever" without hanging the runtime or panicking.
    let waited = tokio::time::timeout(Duration::from_secs(3600), limiter.acquire(1)).await;
    assert!(waited.is_err());
    assert_eq!(limiter.stats().waiting, 0);
}

const FASTEST: Rate = Rate::new(u64::MAX, Duration::from_nanos(1));
const SLOWEST: Rate = Rate::new(1, Duration::MAX);

/// Emptied at the fastest rate, then switched at once to the slowest: u64::MAX tokens are
/// missing, more than 128 bits of the new rate's time units, and one token takes 1.8e28 ns.
/// The bucket is empty and stays so; it does not read as (nearly) full.
#[tokio::test(start_paused = true)]
async fn an_emptied_bucket_switched_to_the_slowest_rate_stays_empty() {
    let limiter = RateLimiter::new(FASTEST, u64::MAX);
    limiter.try_acquire(u64::MAX).unwrap();
    limiter.set_rate(SLOWEST);
    assert_eq!(limiter.available(), 0);
    assert!(limiter.try_acquire(1).unwrap_err().is_never());
    // A burst of 1 keeps the level, 0: no token that never flowed in.
    limiter.set_burst(1);
    assert_eq!(limiter.available(), 0);
    assert!(limiter.try_acquire(1).unwrap_err().is_never());
    advance(Duration::from_secs(3600)).await;
    assert_eq!(limiter.available(), 0);
    assert!(limiter.try_acquire(1).unwrap_err().is_never());
    // Back to the fastest rate: the missing token flows in within a nanosecond.
    limiter.set_rate(FASTEST);
    assert_eq!(limiter.available(), 0);
    advance(Duration::from_nanos(1)).await;
    assert_eq!(limiter.available(), 1);
    assert!(limiter.try_acquire(1).is_ok());
}

#[tokio::test(start_paused = true)]
async fn an_emptied_bucket_of_one_switched_to_the_slowest_rate_stays_empty() {
    let limiter = RateLimiter::new(FASTEST, 1);
    // Some time in, so that a wait for never is not "never less the time so far".
    advance(Duration::from_secs(1)).await;
    limiter.try_acquire(1).unwrap();
    limiter.set_rate(SLOWEST);
    assert_eq!(limiter.available(), 0);
    let refused = limiter.try_acquire(1).unwrap_err();
    assert!(refused.is_never(), "{refused:?}");
    assert_eq!(refused.retry_after(), Duration::MAX);
}

/// u64::MAX tokens per `Duration::MAX`: one every 1 s + 5.4e-11 ns. Emptied, the bucket lacks
/// u64::MAX tokens of about 2^94 time units each, yet its level is kept to the unit: the first
/// token comes 1 s + 1 ns later.
#[tokio::test(start_paused = true)]
async fn a_huge_burst_at_a_slow_rate_refills_token_by_token() {
    let limiter = RateLimiter::new(Rate::new(u64::MAX, Duration::MAX), u64::MAX);
    limiter.try_acquire(u64::MAX).unwrap();
    advance(Duration::from_secs(1)).await;
    assert_eq!(limiter.available(), 0);
    let refused = limiter.try_acquire(1).unwrap_err();
    assert_eq!(refused.retry_after(), Duration::from_nanos(1));
    advance(Duration::from_nanos(1)).await;
    assert_eq!(limiter.available(), 1);
    advance(Duration::from_secs(9)).await;
    assert_eq!(limiter.available(), 10);
    limiter.try_acquire(10).unwrap();
    assert_eq!(limiter.available(), 0);
}

/// One step of a run against the exact model.
#[derive(Clone, Debug)]
enum Step {
    Wait(u64),
    /// The whole tokens held, less 1, as is, or plus 1.
    TakeHeld(u8),
    Take(u64),
    SetRate(u64, u128),
    SetBurst(u64),
}

fn any_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => prop_oneof![Just(0u64), 1u64..1_000, 1u64..1 << 40].prop_map(Step::Wait),
        3 => (0u8..3).prop_map(Step::TakeHeld),
        1 => prop_oneof![0u64..4, any_count()].prop_map(Step::Take),
        2 => (any_count(), any_period()).prop_map(|(t, p)| Step::SetRate(t, p)),
        1 => any_count().prop_map(Step::SetBurst),
    ]
}

fn rate(tokens: u64, per_nanos: u128) -> Rate {
    let per = Duration::new(
        (per_nanos / 1_000_000_000) as u64,
        (per_nanos % 1_000_000_000) as u32,
    );
    Rate::new(tokens, per)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Through the public API, over the whole range of `Rate` and bursts: after every step
    /// `available` is the exact model's whole tokens, `try_acquire` is granted exactly when
    /// the model holds the cost, and a refusal says the model's wait (never when not within
    /// time, or for a cost above the burst).
    #[test]
    fn the_level_is_kept_over_the_whole_range_of_rates(
        tokens in any_count(),
        per in any_period(),
        burst in any_count(),
        steps in prop::collection::vec(any_step(), 1..30),
    ) {
        common::paused(async move {
            let limiter = RateLimiter::new(rate(tokens, per), burst);
            let mut exact = ExactBucket::new(tokens, per, burst);
            let (mut now, mut burst) = (0u64, burst);
            for step in &steps {
                match *step {
                    Step::Wait(gap) => {
                        advance(Duration::from_nanos(gap)).await;
                        now += gap;
                        exact.advance(now);
                    }
                    Step::TakeHeld(_) | Step::Take(_) => {
                        let cost = match *step {
                            Step::TakeHeld(0) => exact.available().saturating_sub(1),
                            Step::TakeHeld(1) => exact.available(),
                            Step::TakeHeld(_) => exact.available().saturating_add(1),
                            Step::Take(cost) => cost,
                            _ => unreachable!(),
                        };
                        match limiter.try_acquire(cost) {
                            Ok(()) => {
                                prop_assert!(exact.holds(cost), "granted {} at {}", cost, now);
                                exact.take(cost);
                            }
                            Err(refused) => {
                                prop_assert!(!exact.holds(cost), "refused {} at {}", cost, now);
                                let at = exact.earliest(cost);
                                if cost > burst || at == u64::MAX {
                                    prop_assert!(refused.is_never(), "{:?}", refused);
                                } else {
                                    prop_assert_eq!(
                                        refused.retry_after(),
                                        Duration::from_nanos(at - now)
                                    );
                                }
                            }
                        }
                    }
                    Step::SetRate(tokens, per) => {
                        limiter.set_rate(rate(tokens, per));
                        exact.set_rate(tokens, per);
                    }
                    Step::SetBurst(new) => {
                        limiter.set_burst(new);
                        exact.set_burst(new);
                        burst = new;
                    }
                }
                prop_assert_eq!(limiter.available(), exact.available(), "after {:?}", step);
            }
            Ok(())
        })?;
    }
}
