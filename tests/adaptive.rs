//! `Adaptive`: its promises against the simulated provider (`common/provider.rs`),
//! under paused time.
//!
//! Simulated runs at high rates cost real CPU (5,000 calls/s for 80 s is 400,000 calls), so
//! rates above 500/s are checked in a few fixed scenarios and the property tests draw `L`
//! from 5 to 500 per second.

mod common;
#[path = "common/provider.rs"]
mod provider;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{stream, StreamExt};
use paced::{Adaptive, ConfigError, PaceExt, Rate, RateLimiter, Shaping};
use proptest::prelude::*;
use tokio::time::Instant;

use common::{nanos_since, paused, within_an_hour, MS};
use provider::{check_windows_allowing, per_second, rate_of, simulate, window, Scenario};

/// The convergence goals: goodput at least this share of `L`, refusals at most this share of
/// the calls, with and without `Retry-After`.
fn figures(retry_after: bool) -> (f64, f64) {
    if retry_after {
        (0.9, 0.05)
    } else {
        (0.85, 0.10)
    }
}

/// What happens to the provider's limit at 60 s.
#[derive(Clone, Copy, Debug)]
enum Change {
    None,
    Halved,
    Doubled,
}

/// Runs one scenario and checks every promise that applies to it: from 20 s on, every 10 s
/// window meets the figures (its refusals at most the share, or two probes' worth); after a
/// halving at 60 s, from 70 s on for the new limit; after a doubling, the window ending at
/// 90 s reaches 0.85 of the new limit.
fn holds(mut s: Scenario, change: Change) -> Result<(), String> {
    let limit = s.limit;
    let (goodput, refused) = figures(s.retry_after);
    let new_limit = match change {
        Change::None => limit,
        Change::Halved => limit / 2.0,
        Change::Doubled => limit * 2.0,
    };
    s.duration = Duration::from_secs(match change {
        Change::None => 80,
        Change::Halved | Change::Doubled => 90,
    });
    if !matches!(change, Change::None) {
        s.changes = vec![(Duration::from_secs(60), new_limit)];
    }
    let run = paused(simulate(&s));
    let (min, max) = (per_second(s.min), per_second(s.max));
    if run.lowest < min || run.highest > max {
        return Err(format!(
            "rates {}..{} outside [{min}, {max}]",
            run.lowest, run.highest
        ));
    }
    // Settled, the law probes above the limit once a cycle (about 9 s at a few calls per
    // second), and a probe costs a refusal: a 10 s window can catch two, which at 2.5/s is 2
    // of 25 calls (8 %), above the share. A window may hold two whatever their share.
    let check =
        |from, to, limit| check_windows_allowing(&run, from, to, limit, goodput, refused, 2);
    match change {
        Change::None => check(20, 80, limit),
        Change::Halved => {
            check(20, 60, limit)?;
            check(70, 90, new_limit)
        }
        Change::Doubled => {
            check(20, 60, limit)?;
            let (ok, _) = window(&run, 80, 90);
            let got = ok as f64 / 10.0;
            if got < 0.85 * new_limit {
                return Err(format!(
                    "30 s after the limit doubled to {new_limit}/s: {got}/s in [80 s, 90 s); \
                     rates {:?}",
                    &run.rate[60..90]
                ));
            }
            Ok(())
        }
    }
}

fn assert_holds(s: Scenario, change: Change) {
    let what = format!("{s:?} {change:?}");
    if let Err(e) = holds(s, change) {
        panic!("{what}: {e}");
    }
}

#[test]
fn converges_at_five_per_second_with_one_call_in_flight() {
    assert_holds(Scenario::new(5.0, 50, 1, true), Change::None);
    assert_holds(Scenario::new(5.0, 50, 1, false), Change::None);
}

#[test]
fn converges_at_fifty_per_second_with_no_latency() {
    assert_holds(Scenario::new(50.0, 0, 32, true), Change::None);
    assert_holds(Scenario::new(50.0, 0, 1, false), Change::None);
}

#[test]
fn converges_at_five_thousand_per_second() {
    // 32 calls in flight at 2 ms: the client could send 16,000/s.
    assert_holds(Scenario::new(5000.0, 2, 32, true), Change::None);
}

#[test]
fn converges_at_five_thousand_per_second_without_retry_after() {
    assert_holds(Scenario::new(5000.0, 0, 8, false), Change::None);
}

#[test]
fn tracks_a_halving_at_one_thousand_per_second() {
    assert_holds(Scenario::new(1000.0, 10, 32, true), Change::Halved);
}

#[test]
fn probes_up_after_a_doubling_at_one_thousand_per_second() {
    // Up to 2,000/s: 32 calls in flight at 8 ms can send 4,000/s.
    assert_holds(Scenario::new(1000.0, 8, 32, false), Change::Doubled);
}

#[test]
fn tracks_a_halving_and_a_doubling_at_five_per_second() {
    assert_holds(Scenario::new(5.0, 50, 1, true), Change::Doubled);
    assert_holds(Scenario::new(5.0, 20, 4, false), Change::Halved);
    // Down to 2.5/s: a 10 s window holds 25 calls, so at most one may be refused.
    assert_holds(Scenario::new(5.0, 10, 32, true), Change::Halved);
}

#[test]
fn several_streams_and_tasks_share_one_account() {
    for retry_after in [true, false] {
        let mut s = Scenario::new(200.0, 20, 4, retry_after);
        s.streams = 3;
        s.tasks = 4;
        assert_holds(s.clone(), Change::None);
        assert_holds(s, Change::Halved);
    }
}

#[test]
fn a_limit_far_above_max_runs_at_max_and_never_decreases() {
    let mut s = Scenario::new(1000.0, 10, 8, true);
    s.max = Rate::per_second(50);
    s.client_burst = 1;
    let run = paused(simulate(&s));
    let stats = run.stats.expect("stats");
    assert_eq!((stats.throttled, stats.decreases), (0, 0));
    assert_eq!(stats.rate, Rate::per_second(50));
    assert_eq!((run.lowest, run.highest), (50.0, 50.0));
    // 50/s from the first call on (the first at 0, the last just before 80 s).
    assert_eq!(window(&run, 0, 80), (80 * 50, 0));
}

#[test]
fn identical_runs_are_identical() {
    let s = Scenario::new(80.0, 13, 3, true);
    let (a, b) = (paused(simulate(&s)), paused(simulate(&s)));
    assert_eq!((&a.ok, &a.refused, &a.rate), (&b.ok, &b.refused, &b.rate));
    assert_eq!(a.stats, b.stats);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Random limits, latencies, concurrency (wherever each stream could reach twice the
    /// limit), one or two streams and up to two tasks, with and without `Retry-After`, steady,
    /// halved or doubled at 60 s.
    #[test]
    fn converges_and_tracks(
        exponent in 0.0..2.0f64,
        concurrency in 1usize..=32,
        latency_share in 0.0..=1.0f64,
        retry_after in any::<bool>(),
        change in 0..3u8,
        streams in 1usize..3,
        tasks in 0usize..3,
    ) {
        let limit = (5.0 * 10f64.powf(exponent)).round();
        // A doubled limit must still be reachable: c / latency >= 2 × the highest limit.
        let highest = if change == 2 { 2.0 * limit } else { limit };
        let latency_max = (1000.0 * concurrency as f64 / (2.0 * highest)).floor().min(50.0);
        let latency_ms = (latency_share * latency_max).floor() as u64;
        let change = [Change::None, Change::Halved, Change::Doubled][usize::from(change)];
        let mut s = Scenario::new(limit, latency_ms, concurrency, retry_after);
        // Several streams and tasks on one account.
        s.streams = streams;
        s.tasks = tasks;
        let what = format!("{s:?} {change:?}");
        let result = holds(s, change);
        prop_assert!(result.is_ok(), "{}: {:?}", what, result);
    }

    /// Whatever is reported, in whatever order and at whatever times, the rate stays within
    /// `[min, max]`, and a `Retry-After` of any length never panics.
    #[test]
    fn rates_stay_within_min_and_max(
        min in 1u64..1_000_000,
        span in 1u64..1_000_000,
        start in 1u64..10_000_000,
        reports in prop::collection::vec((0u64..300, 0u8..4), 1..200),
    ) {
        paused(async move {
            let (min, max) = (rate_of(min as f64 / 1000.0), rate_of((min + span) as f64 / 1000.0));
            let limiter = RateLimiter::new(rate_of(start as f64 / 1000.0), 5);
            let adaptive = Adaptive::new(limiter, min, max);
            let within = |r: Rate| per_second(r) >= per_second(min) && per_second(r) <= per_second(max);
            assert!(within(adaptive.rate()), "start {}", adaptive.rate());
            for (gap_ms, what) in reports {
                tokio::time::advance(Duration::from_millis(gap_ms)).await;
                match what {
                    0 | 1 => adaptive.on_success(),
                    2 => adaptive.on_throttled(None),
                    _ => adaptive.on_throttled(Some(Duration::from_millis(gap_ms * 7))),
                }
                assert!(within(adaptive.rate()), "{} outside [{min}, {max}]", adaptive.rate());
            }
        });
    }

    /// The refusals of one overload count once: the calls in flight when the first refusal
    /// comes back, and those whose tokens are already in the bucket, lower the rate once,
    /// however many of them are refused and in whatever order; the next refused call after
    /// them is a new overload.
    #[test]
    fn one_overload_lowers_the_rate_once(
        burst in 1u64..10,
        in_flight in 1usize..20,
        outcomes in prop::collection::vec(any::<bool>(), 20),
    ) {
        paused(async move {
            let limiter = RateLimiter::new(Rate::per_second(1000), burst);
            let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(1000));
            for _ in 0..in_flight {
                adaptive.limiter().acquire(1).await;
            }
            let stored = adaptive.limiter().available();
            adaptive.on_throttled(None);
            assert_eq!(adaptive.stats().decreases, 1);
            let after_first = adaptive.rate();
            // The others in flight come back, refused or not.
            for &refused in &outcomes[..in_flight - 1] {
                if refused {
                    adaptive.on_throttled(None);
                } else {
                    adaptive.on_success();
                }
            }
            assert_eq!(adaptive.stats().decreases, 1);
            // The calls on the tokens already stored are refused too: the same overload.
            for _ in 0..stored {
                adaptive.limiter().acquire(1).await;
                adaptive.on_throttled(None);
            }
            assert_eq!(adaptive.stats().decreases, 1);
            assert!(per_second(adaptive.rate()) <= per_second(after_first) * 1.01);
            // A call that had to wait for a token sent at the new rate: a new overload.
            adaptive.limiter().acquire(1).await;
            adaptive.on_throttled(None);
            assert_eq!(adaptive.stats().decreases, 2);
        });
    }

    /// After `on_throttled(Some(d))` at `t`, nothing is granted before `t + d` to any stream
    /// or task on the limiter; afterwards they go on.
    #[test]
    fn retry_after_holds_back_every_stream_and_task(
        rate in 5u64..2000,
        burst in 1u64..20,
        streams in 1usize..4,
        tasks in 0usize..4,
        at_us in 0u64..2_000_000,
        pause_us in 1u64..3_000_000,
    ) {
        paused(async move {
            let limiter = RateLimiter::new(Rate::per_second(rate), burst);
            let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(rate));
            let start = Instant::now();
            let grants = Arc::new(Mutex::new(Vec::new()));
            let end = start + Duration::from_micros(at_us + pause_us) + Duration::from_secs(1);
            let mut handles = Vec::new();
            for _ in 0..streams {
                let (limiter, grants) = (adaptive.limiter().clone(), grants.clone());
                handles.push(tokio::spawn(async move {
                    stream::repeat(())
                        .take_until(tokio::time::sleep_until(end))
                        .throttle_with(&limiter, |_| 1, Shaping)
                        .for_each(|()| {
                            grants.lock().unwrap().push(nanos_since(start));
                            async {}
                        })
                        .await;
                }));
            }
            for _ in 0..tasks {
                let (limiter, grants) = (adaptive.limiter().clone(), grants.clone());
                handles.push(tokio::spawn(async move {
                    while Instant::now() < end
                        && tokio::time::timeout_at(end, limiter.acquire(1)).await.is_ok()
                    {
                        grants.lock().unwrap().push(nanos_since(start));
                    }
                }));
            }
            tokio::time::sleep_until(start + Duration::from_micros(at_us)).await;
            let t = nanos_since(start);
            let before = grants.lock().unwrap().len();
            adaptive.on_throttled(Some(Duration::from_micros(pause_us)));
            // One token's time at the lowered rate: a grant leaves at most a burst missing, so
            // a token is there again within it.
            let lowered = adaptive.rate();
            let token_ns = u64::try_from(lowered.per().as_nanos().div_ceil(u128::from(lowered.tokens()))).unwrap();
            for handle in handles {
                within_an_hour(handle).await.unwrap();
            }
            let grants = grants.lock().unwrap();
            let after = &grants[before..];
            let resume = t + pause_us * 1000;
            assert!(after.iter().all(|&g| g >= resume), "granted before {resume} ns: {:?}", &after[..after.len().min(5)]);
            // They go on: the first grant comes at the end of the pause, or once the bucket
            // has a token again if it had none left then (a short pause right after a grant
            // at burst 1), on tokio's tick.
            assert!(!after.is_empty());
            let first_by = resume.max(t + token_ns);
            assert!(after[0] <= first_by.div_ceil(MS) * MS, "first grant at {} ns, pause ended {resume}, a token by {first_by}", after[0]);
        });
    }
}

#[test]
fn a_short_retry_after_right_after_a_grant_ends_when_the_bucket_has_a_token_again() {
    // The case the proptest above found: at burst 1 the bucket is empty after a grant, so
    // after a pause of 1 µs the next grant waits for a token at the lowered rate.
    paused(async {
        let limiter = RateLimiter::new(Rate::per_second(5), 1);
        let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(5));
        let start = Instant::now();
        adaptive.limiter().acquire(1).await;
        adaptive.on_throttled(Some(Duration::from_micros(1)));
        let lowered = adaptive.rate();
        assert!(per_second(lowered) < 5.0);
        let token_ns = u64::try_from(
            lowered
                .per()
                .as_nanos()
                .div_ceil(u128::from(lowered.tokens())),
        )
        .unwrap();
        adaptive.limiter().acquire(1).await;
        assert_eq!(nanos_since(start), token_ns.div_ceil(MS) * MS);
    });
}

#[test]
fn the_refusals_of_one_overload_count_once() {
    paused(async {
        let limiter = RateLimiter::new(Rate::per_second(100), 1);
        let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(100));
        // Five calls in flight (granted, not reported).
        for _ in 0..5 {
            adaptive.limiter().acquire(1).await;
        }
        for _ in 0..5 {
            adaptive.on_throttled(None);
        }
        let stats = adaptive.stats();
        assert_eq!((stats.throttled, stats.decreases), (5, 1));
        assert_eq!(stats.rate, Rate::new(80_000, Duration::from_secs(1000)));
        // A call granted after the first refusal came back is refused: a new overload.
        adaptive.limiter().acquire(1).await;
        adaptive.on_throttled(None);
        assert_eq!(adaptive.stats().decreases, 2);
        assert_eq!(
            adaptive.rate(),
            Rate::new(64_000, Duration::from_secs(1000))
        );
    });
}

#[test]
fn decreases_stop_at_min_and_probing_stops_at_max() {
    paused(async {
        let limiter = RateLimiter::new(Rate::per_second(10), 1);
        let adaptive = Adaptive::new(limiter, Rate::per_second(4), Rate::per_second(10));
        for _ in 0..10 {
            adaptive.limiter().acquire(1).await;
            adaptive.on_throttled(None);
        }
        assert_eq!(adaptive.rate(), Rate::per_second(4));
        for _ in 0..2000 {
            adaptive.limiter().acquire(1).await;
            adaptive.on_success();
        }
        assert_eq!(adaptive.rate(), Rate::per_second(10));
    });
}

#[test]
fn retry_after_of_duration_max_saturates() {
    paused(async {
        let limiter = RateLimiter::new(Rate::per_second(10), 1);
        let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(10));
        adaptive.on_throttled(Some(Duration::MAX));
        adaptive.on_throttled(Some(Duration::MAX));
        let refused = adaptive.limiter().try_acquire(1).unwrap_err();
        assert!(refused.retry_after() > Duration::from_secs(100 * 365 * 24 * 3600));
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(adaptive.limiter().try_acquire(1).is_err());
        adaptive.on_success();
    });
}

#[test]
fn bad_ranges_are_refused() {
    let limiter = RateLimiter::new(Rate::per_second(10), 1);
    let err = Adaptive::try_new(limiter.clone(), Rate::per_second(11), Rate::per_second(10));
    assert_eq!(err.err(), Some(ConfigError::MinAboveMax));
    // Compared as fractions: 60 per minute is 1 per second.
    assert!(Adaptive::try_new(
        limiter.clone(),
        Rate::new(60, Duration::from_secs(60)),
        Rate::per_second(1)
    )
    .is_ok());
    assert_eq!(
        Adaptive::try_new(
            limiter,
            Rate::new(61, Duration::from_secs(60)),
            Rate::per_second(1)
        )
        .err(),
        Some(ConfigError::MinAboveMax)
    );
    // A zero `min` cannot even be built.
    assert_eq!(
        Rate::try_new(0, Duration::from_secs(1)),
        Err(ConfigError::ZeroTokens)
    );
}

/// Rates at the ends of what `Rate` can hold compare exactly, without overflow.
#[test]
fn extreme_rates_compare_exactly() {
    paused(async {
        let slowest = Rate::new(1, Duration::MAX);
        let fastest = Rate::new(u64::MAX, Duration::from_nanos(1));
        let limiter = RateLimiter::new(Rate::per_second(10), 1);
        assert_eq!(
            Adaptive::try_new(limiter.clone(), fastest, slowest).err(),
            Some(ConfigError::MinAboveMax)
        );
        let adaptive = Adaptive::new(limiter.clone(), slowest, fastest);
        assert_eq!(adaptive.rate(), Rate::per_second(10));
        adaptive.on_throttled(None);
        adaptive.on_success();
        let same = Rate::new(u64::MAX, Duration::MAX);
        assert!(Adaptive::try_new(limiter, same, same).is_ok());
    });
}

#[test]
#[should_panic(expected = "invalid adaptive range: `min` is above `max`")]
fn new_panics_on_min_above_max() {
    let limiter = RateLimiter::new(Rate::per_second(10), 1);
    let _ = Adaptive::new(limiter, Rate::per_second(11), Rate::per_second(10));
}

#[test]
fn the_start_is_clamped_into_the_range() {
    let low = RateLimiter::new(Rate::per_second(1), 1);
    let adaptive = Adaptive::new(low.clone(), Rate::per_second(5), Rate::per_second(10));
    assert_eq!(low.rate(), Rate::per_second(5));
    assert_eq!(adaptive.rate(), Rate::per_second(5));
    let inside = RateLimiter::new(Rate::new(7, Duration::from_secs(1)), 1);
    let adaptive = Adaptive::new(inside, Rate::per_second(5), Rate::per_second(10));
    assert_eq!(adaptive.rate(), Rate::per_second(7));
}

#[test]
fn a_rate_set_by_hand_is_the_new_starting_point() {
    paused(async {
        let limiter = RateLimiter::new(Rate::per_second(100), 10);
        let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(1000));
        adaptive.on_throttled(None);
        assert_eq!(per_second(adaptive.rate()), 80.0);
        // Set by hand to 20/s: the next report starts from there, not from the 80/s curve.
        adaptive.limiter().set_rate(Rate::per_second(20));
        adaptive.on_success();
        assert_eq!(adaptive.rate(), Rate::per_second(20));
        tokio::time::advance(Duration::from_secs(1)).await;
        adaptive.on_success();
        let r = per_second(adaptive.rate());
        assert!((20.0..25.0).contains(&r), "{r}");
        // A refusal decreases from it.
        adaptive.limiter().set_rate(Rate::per_second(40));
        adaptive.on_throttled(None);
        assert_eq!(per_second(adaptive.rate()), 32.0);
        // Set by hand outside the range: clamped at the next report.
        adaptive.limiter().set_rate(Rate::per_second(5000));
        adaptive.on_success();
        assert_eq!(adaptive.rate(), Rate::per_second(1000));
        assert_eq!(adaptive.stats().decreases, 2);
    });
}

#[test]
fn it_is_a_cheap_shared_handle() {
    fn send_sync<T: Send + Sync + Clone>() {}
    send_sync::<Adaptive>();
    let limiter = RateLimiter::new(Rate::per_second(10), 1);
    let a = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(10));
    let b = a.clone();
    b.on_throttled(None);
    assert_eq!(a.stats().decreases, 1);
    assert_eq!(a.rate(), b.rate());
    assert!(format!("{a:?}").contains("Adaptive"));
}

/// Time paused by a `Retry-After` is neither probing time nor sending time: a success right
/// after a 1 s pause finds the curve where the refusal left it, and a bucket of calls spanning
/// the pause measures the rate they were sent at, not a fraction of it.
#[test]
fn paused_time_counts_as_neither_probing_nor_sending() {
    paused(async {
        let limiter = RateLimiter::new(Rate::per_second(100), 10);
        let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(100));
        adaptive.on_throttled(Some(Duration::from_secs(1)));
        assert_eq!(adaptive.rate(), rate_of(80.0));
        tokio::time::advance(Duration::from_secs(1)).await;
        adaptive.on_success();
        // Still at the bottom of the curve (it would be at 97.5/s had the pause counted).
        assert_eq!(adaptive.rate(), rate_of(80.0));

        // 30 calls at 40/s, a 3 s pause after the 11th, then an overload: the cut is from
        // about the rate they were sent at (80 % of 40/s, or of the curve's rate if lower),
        // not from 30 calls over 3.75 s (8/s, a cut to 6.4/s).
        let limiter = RateLimiter::new(Rate::per_second(40), 10);
        let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(100));
        for i in 0..30 {
            tokio::time::advance(Duration::from_millis(25)).await;
            if i == 10 {
                adaptive.on_throttled(Some(Duration::from_secs(3)));
                tokio::time::advance(Duration::from_secs(3)).await;
            } else {
                adaptive.on_success();
            }
        }
        tokio::time::advance(Duration::from_millis(25)).await;
        adaptive.on_throttled(None);
        let r = per_second(adaptive.rate());
        assert!((25.6..=32.0).contains(&r), "cut to {r}/s");
    });
}

/// A waker that, woken, asks the controller for its counters at once, as a task woken inline
/// could (an executor that polls in `wake`, a `block_on`, a waker that logs): the controller
/// must not wake the limiter's waiters while it holds its own lock.
struct CallsBack {
    adaptive: Adaptive,
    woken: std::sync::atomic::AtomicUsize,
}

impl std::task::Wake for CallsBack {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let _ = self.adaptive.stats();
        self.woken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn a_waiter_woken_by_a_rate_change_may_call_back_at_once() {
    use std::future::Future;
    use std::sync::atomic::Ordering::SeqCst;
    use std::task::{Context, Waker};

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let _guard = rt.enter();
    let limiter = RateLimiter::new(Rate::per_second(10), 1);
    let adaptive = Adaptive::new(limiter.clone(), Rate::per_second(1), Rate::per_second(10));
    let calls_back = Arc::new(CallsBack {
        adaptive: adaptive.clone(),
        woken: 0.into(),
    });
    let waker = Waker::from(calls_back.clone());
    let mut cx = Context::from_waker(&waker);
    assert!(limiter.try_acquire(1).is_ok());
    // The head of the queue: a rate change wakes it to re-read its deadline.
    let mut waiter = Box::pin(limiter.acquire(1));
    assert!(waiter.as_mut().poll(&mut cx).is_pending());

    // Reports on a thread of their own, given up on after a while rather than left to hang
    // the test if they deadlock.
    let report = |report: fn(&Adaptive)| {
        let (done, finished) = std::sync::mpsc::channel();
        let adaptive = adaptive.clone();
        let handle = rt.handle().clone();
        std::thread::spawn(move || {
            let _guard = handle.enter();
            report(&adaptive);
            let _ = done.send(());
        });
        finished
            .recv_timeout(Duration::from_secs(10))
            .expect("the report never returned: it woke a waiter under its own lock");
    };

    // A decrease.
    report(|a| a.on_throttled(None));
    assert_eq!(calls_back.woken.load(SeqCst), 1);
    assert_eq!(adaptive.rate(), Rate::per_second(8));

    // A rate set by hand outside the range, clamped back by the next report.
    limiter.set_rate(Rate::per_second(50));
    assert!(waiter.as_mut().poll(&mut cx).is_pending());
    report(|a| a.on_success());
    assert_eq!(calls_back.woken.load(SeqCst), 2);
    assert_eq!(adaptive.rate(), Rate::per_second(10));
    drop(waiter);
}

// ----- Adaptive<[u64; N]>: each limit of a RateLimiter learned on its own -----

mod multi {
    use std::time::Duration;

    use paced::limiter::Announced;
    use paced::{Adaptive, ConfigError, Limit, Rate, RateLimiter};
    use proptest::prelude::*;
    use tokio::time::Instant;

    use super::paused;

    const REQUESTS: usize = 0;
    const TOKENS: usize = 1;

    /// Requests 10/s (burst 10) in [1/s, 10/s], tokens 1,000/s (burst 1,000) in
    /// [100/s, 1,000/s].
    fn llm() -> Adaptive<[u64; 2]> {
        let limiter = RateLimiter::builder(["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_second(10), 10))
            .limit("tokens", Limit::bucket(Rate::per_second(1_000), 1_000))
            .build()
            .unwrap();
        Adaptive::builder(limiter)
            .adapt(REQUESTS, Rate::per_second(1), Rate::per_second(10))
            .adapt(TOKENS, Rate::per_second(100), Rate::per_second(1_000))
            .build()
            .unwrap()
    }

    fn rates(a: &Adaptive<[u64; 2]>) -> (Rate, Rate) {
        (a.rate(REQUESTS).unwrap(), a.rate(TOKENS).unwrap())
    }

    /// One name for one limit or several: the shape is the cost's, the methods are the same,
    /// `limiter()` is the `RateLimiter` of that shape, and both show as an `Adaptive`.
    #[test]
    fn one_type_for_one_limit_or_several() {
        let one: Adaptive = Adaptive::new(
            RateLimiter::new(Rate::per_second(10), 2),
            Rate::per_second(1),
            Rate::per_second(10),
        );
        let several: Adaptive<[u64; 2]> = llm();
        let _: &RateLimiter = one.limiter();
        let _: &RateLimiter<[u64; 2]> = several.limiter();
        one.on_throttled(None);
        several.on_throttled(None);
        assert_eq!(one.stats().decreases, 1);
        assert_eq!(several.stats(REQUESTS).map(|s| s.decreases), Some(1));
        assert_eq!(several.stats(TOKENS).map(|s| s.decreases), Some(1));
        assert!(format!("{one:?}").starts_with("Adaptive {"), "{one:?}");
        assert!(
            format!("{several:?}").starts_with("Adaptive {"),
            "{several:?}"
        );
    }

    #[test]
    fn announcements_set_each_limit_independently_and_exactly() {
        paused(async {
            let a = llm();
            let start = Instant::now();
            // 119 requests left for 60 s: 2/s; tokens untouched.
            a.on_quota("requests", Announced::new(119, Duration::from_secs(60)));
            assert_eq!(rates(&a), (Rate::per_second(2), Rate::per_second(1_000)));
            // 1,199 tokens left for 6 s: 200/s; requests untouched.
            a.on_quota("tokens", Announced::new(1_199, Duration::from_secs(6)));
            assert_eq!(rates(&a), (Rate::per_second(2), Rate::per_second(200)));
            // Successes while announcements hold (2 s): no probing above them.
            a.on_success();
            assert_eq!(rates(&a), (Rate::per_second(2), Rate::per_second(200)));
            // The levels were kept (full buckets), and the rates are the limiter's.
            assert_eq!(a.available(), [10, 1_000]);
            a.acquire([0, 1_000]).await;
            a.acquire([0, 200]).await; // 200 tokens at 200/s: 1 s
            assert_eq!(start.elapsed(), Duration::from_secs(1));
            a.acquire([10, 0]).await;
            a.acquire([2, 0]).await; // 2 requests at 2/s: 1 s more
            assert_eq!(start.elapsed(), Duration::from_secs(2));
            let (r, t) = (a.stats(REQUESTS).unwrap(), a.stats(TOKENS).unwrap());
            assert_eq!((r.successes, r.throttled, r.decreases), (2, 0, 0));
            assert_eq!((t.successes, t.throttled, t.decreases), (2, 0, 0));
        });
    }

    #[test]
    fn a_refusal_naming_tokens_lowers_tokens_only() {
        paused(async {
            let a = llm();
            a.acquire([1, 500]).await;
            a.on_throttled_dimension("tokens", None);
            assert_eq!(rates(&a), (Rate::per_second(10), Rate::per_second(800)));
            a.on_throttled_limit(TOKENS, None); // the same overload: no second decrease
            assert_eq!(rates(&a), (Rate::per_second(10), Rate::per_second(800)));
            let (r, t) = (a.stats(REQUESTS).unwrap(), a.stats(TOKENS).unwrap());
            assert_eq!((r.throttled, r.decreases), (0, 0));
            assert_eq!((t.throttled, t.decreases), (2, 1));
        });
    }

    #[test]
    fn a_refusal_naming_no_limit_lowers_every_adapted_limit() {
        paused(async {
            let a = llm();
            let start = Instant::now();
            a.on_throttled(Some(Duration::from_secs(2)));
            assert_eq!(rates(&a), (Rate::per_second(8), Rate::per_second(800)));
            assert_eq!(
                a.try_acquire([1, 1]).unwrap_err().retry_after(),
                Duration::from_secs(2)
            );
            a.acquire([1, 1]).await;
            assert_eq!(start.elapsed(), Duration::from_secs(2));
        });
    }

    #[test]
    fn an_exhausted_announcement_pauses_the_limiter_and_keeps_the_rates() {
        paused(async {
            let a = llm();
            let start = Instant::now();
            a.on_quota("tokens", Announced::new(0, Duration::from_secs(3)));
            assert_eq!(rates(&a), (Rate::per_second(10), Rate::per_second(1_000)));
            // A call of requests only waits too: the provider refuses every call until then.
            a.acquire([1, 0]).await;
            assert_eq!(start.elapsed(), Duration::from_secs(3));
        });
    }

    #[test]
    fn routes_send_announcements_elsewhere_and_unadapted_limits_stay() {
        paused(async {
            let limiter = RateLimiter::builder(["calls", "input"])
                .limit("calls", Limit::bucket(Rate::per_second(10), 10))
                .limit("calls", Limit::window(1_000, Duration::from_secs(86_400)))
                .limit("input", Limit::bucket(Rate::per_second(1_000), 1_000))
                .build()
                .unwrap();
            let a = Adaptive::builder(limiter)
                .adapt(0, Rate::per_second(1), Rate::per_second(10))
                .adapt(2, Rate::per_second(10), Rate::per_second(1_000))
                .route("requests", 0)
                .route("input-tokens", 2)
                .build()
                .unwrap();
            a.on_quota("requests", Announced::new(4, Duration::from_secs(1)));
            a.on_quota("input-tokens", Announced::new(499, Duration::from_secs(1)));
            // Routed nowhere: no limit, no pause.
            a.on_quota("output-tokens", Announced::new(0, Duration::from_secs(1)));
            assert_eq!(a.rate(0), Some(Rate::per_second(5)));
            assert_eq!(a.rate(1), None); // a window is not adapted
            assert_eq!(a.rate(2), Some(Rate::per_second(500)));
            assert!(a.try_acquire([1, 1]).is_ok()); // nothing paused
        });
    }

    #[test]
    fn building_checks_the_limits_and_ranges() {
        let limiter = RateLimiter::builder(["requests"])
            .limit("requests", Limit::bucket(Rate::per_second(10), 10))
            .limit("requests", Limit::window(100, Duration::from_secs(60)))
            .build()
            .unwrap();
        let range = (Rate::per_second(1), Rate::per_second(2));
        let build = |index, route: Option<usize>| {
            let b = Adaptive::builder(limiter.clone()).adapt(index, range.0, range.1);
            match route {
                Some(i) => b.route("x", i).build().err(),
                None => b.build().err(),
            }
        };
        assert_eq!(build(0, None), None);
        assert_eq!(build(1, None), Some(ConfigError::LimitKind));
        assert_eq!(build(2, None), Some(ConfigError::NoSuchLimit));
        assert_eq!(build(0, Some(1)), Some(ConfigError::NoSuchLimit));
        let reversed = Adaptive::builder(limiter)
            .adapt(0, range.1, range.0)
            .build()
            .err();
        assert_eq!(reversed, Some(ConfigError::MinAboveMax));
    }

    #[derive(Clone, Debug)]
    enum Op {
        Success,
        Throttled(Option<u64>),
        ThrottledLimit(usize),
        Quota {
            name: &'static str,
            remaining: u64,
            reset_ms: u64,
            policy: Option<(u64, u64)>,
        },
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            Just(Op::Success),
            proptest::option::of(0..3_000u64).prop_map(Op::Throttled),
            (0..2usize).prop_map(Op::ThrottledLimit),
            (
                prop_oneof![Just("requests"), Just("tokens")],
                prop_oneof![Just(0u64), 0..100u64, 0..10_000_000u64, Just(u64::MAX)],
                prop_oneof![Just(0u64), 0..120_000u64],
                proptest::option::of((0..1_000_000u64, 0..120_000u64)),
            )
                .prop_map(|(name, remaining, reset_ms, policy)| Op::Quota {
                    name,
                    remaining,
                    reset_ms,
                    policy,
                }),
            (0..5_000u64).prop_map(Op::Advance),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Whatever is reported, each limit's rate stays within its own range.
        #[test]
        fn rates_never_leave_their_ranges(ops in proptest::collection::vec(op(), 1..60)) {
            paused(async {
                let a = llm();
                let within = |a: &Adaptive<[u64; 2]>| {
                    let (r, t) = rates(a);
                    assert!(Rate::per_second(1) <= r && r <= Rate::per_second(10), "{r:?}");
                    assert!(Rate::per_second(100) <= t && t <= Rate::per_second(1_000), "{t:?}");
                };
                for op in ops {
                    match op {
                        Op::Success => a.on_success(),
                        Op::Throttled(ms) => a.on_throttled(ms.map(Duration::from_millis)),
                        Op::ThrottledLimit(i) => a.on_throttled_limit(i, None),
                        Op::Quota { name, remaining, reset_ms, policy } => {
                            let mut q = Announced::new(remaining, Duration::from_millis(reset_ms));
                            if let Some((limit, window_ms)) = policy {
                                q = q.with_policy(limit, Duration::from_millis(window_ms));
                            }
                            a.on_quota(name, q);
                        }
                        Op::Advance(ms) => tokio::time::advance(Duration::from_millis(ms)).await,
                    }
                    within(&a);
                }
            });
        }
    }
}
