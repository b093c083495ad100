//! `Adaptive`: its promises under paused time. How it converges against the simulated
//! provider is in `integration/tests/adaptive_convergence.rs`.
//!
//! Simulated runs at high rates cost real CPU (5,000 calls/s for 80 s is 400,000 calls), so
//! rates above 500/s are checked in a few fixed scenarios and the property tests draw `L`
//! from 5 to 500 per second.

use crate::common;
#[path = "../common/provider.rs"]
mod provider;

use std::sync::Arc;
use std::time::Duration;

use paced::{Adaptive, ConfigError, Rate, RateLimiter};
use tokio::time::Instant;

use common::{nanos_since, paused, MS};
use provider::{per_second, rate_of};

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
