//! `Adaptive::on_quota`: clients pace to the quota a provider announces (the simulated provider
//! of `common/provider.rs`, under paused time): no refusal at all, and goodput at least 0.98 of
//! `L` in every second from the first, at 5 to 5,000 calls per second, for a token bucket and a
//! fixed window, also when `L` changes mid-run.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/provider.rs"]
mod provider;

use std::time::Duration;

use paced::limiter::Announced;
use paced::{Adaptive, Rate, RateLimiter};

use common::paused;
use provider::{per_second, rate_of, simulate, Announce, Run, Scenario};

/// A scenario whose provider announces its quota; the client starts at 1/s (it knows nothing
/// until the first answer) with `max = 10 × L`.
fn announcing(limit: f64, announce: Announce) -> Scenario {
    let latency = if limit > 1000.0 { 2 } else { 10 };
    let mut s = Scenario::new(limit, latency, 32, true);
    s.announce = announce;
    s.start = Some(Rate::per_second(1));
    s.duration = Duration::from_secs(40);
    s
}

/// Goodput in every 10 s window `[t, t + 10)` with `t` from `from` to `to - 10`, at least
/// `share × limit` per second, less one call (a window that does not start on the provider's
/// may miss one call of phase at a fractional rate: 24 of 25 at 2.5/s).
fn check(run: &Run, from: usize, to: usize, limit: f64, share: f64) -> Result<(), String> {
    for t in from..=to - 10 {
        let ok: u64 = run.ok[t..t + 10].iter().sum();
        if (ok as f64) < share * limit * 10.0 - 1.0 {
            return Err(format!(
                "[{t} s, {} s): {ok} calls (need {:.1}); ok {:?}; rates {:?}",
                t + 10,
                share * limit * 10.0,
                &run.ok[t..t + 10],
                &run.rate[t..t + 10]
            ));
        }
    }
    Ok(())
}

fn assert_paces(limit: f64, announce: Announce, change: Option<f64>) {
    let mut s = announcing(limit, announce);
    if let Some(to) = change {
        s.changes = vec![(Duration::from_secs(15), to)];
    }
    let run = paused(simulate(&s));
    let stats = run.stats.expect("stats");
    let what = format!("L = {limit}, {announce:?}, change {change:?}");
    let refused: u64 = run.refused.iter().sum();
    // A token bucket that lowers its limit unannounced between two calls may refuse the
    // calls sent at the old limit before the first answer at the new one: one round trip.
    let allowed = match (announce, change) {
        (Announce::Bucket, Some(to)) if to < limit => {
            (limit * s.latency.as_secs_f64()).ceil() as u64
        }
        _ => 0,
    };
    assert!(refused <= allowed, "{what}: refused {:?}", run.refused);
    assert!(
        run.lowest >= per_second(s.min) && run.highest <= per_second(s.max),
        "{what}"
    );
    let result = match change {
        None => check(&run, 0, 40, limit, 0.98),
        // A fixed window's new limit applies from its next window, at 20 s.
        Some(to) => check(&run, 0, 15, limit, 0.98).and_then(|()| check(&run, 20, 40, to, 0.98)),
    };
    if let Err(e) = result {
        panic!("{what}: {e} ({stats:?})");
    }
}

#[test]
fn a_token_bucket_that_announces_its_quota_is_never_refused() {
    for limit in [5.0, 50.0, 500.0, 5000.0] {
        assert_paces(limit, Announce::Bucket, None);
    }
}

#[test]
fn a_fixed_window_that_announces_its_quota_is_never_refused() {
    for limit in [5.0, 50.0, 500.0, 5000.0] {
        assert_paces(limit, Announce::FixedWindow(10.0), None);
    }
}

#[test]
fn a_change_of_limit_is_followed_at_once() {
    for limit in [5.0, 50.0, 500.0, 5000.0] {
        for to in [limit / 2.0, limit * 2.0] {
            assert_paces(limit, Announce::Bucket, Some(to));
            assert_paces(limit, Announce::FixedWindow(10.0), Some(to));
        }
    }
}

#[test]
fn the_remaining_quota_is_spread_until_reset() {
    paused(async {
        let limiter = RateLimiter::new(Rate::per_second(100), 10);
        let adaptive = Adaptive::new(
            limiter,
            Rate::new(1, Duration::from_secs(100)),
            Rate::per_second(100),
        );
        adaptive.on_quota(Announced::new(4000, Duration::from_secs(1800)));
        assert_eq!(adaptive.rate(), rate_of(4001.0 / 1800.0));
        // More left than the policy's pace: spent faster.
        let quota = Announced::new(4000, Duration::from_secs(1800))
            .with_policy(5000, Duration::from_secs(3600));
        adaptive.on_quota(quota);
        assert_eq!(adaptive.rate(), rate_of(4001.0 / 1800.0));
        // A token bucket drained: its refill rate.
        let quota =
            Announced::new(0, Duration::from_secs(60)).with_policy(600, Duration::from_secs(60));
        adaptive.on_quota(quota);
        assert_eq!(adaptive.rate(), Rate::per_second(10));
        // Never above max, never below min.
        adaptive.on_quota(Announced::new(u64::MAX, Duration::ZERO));
        assert_eq!(adaptive.rate(), Rate::per_second(100));
        adaptive.on_quota(Announced::new(1, Duration::MAX));
        assert_eq!(adaptive.rate(), Rate::new(1, Duration::from_secs(100)));
        let quota = Announced::new(0, Duration::from_secs(1))
            .with_policy(u64::MAX, Duration::from_nanos(1));
        adaptive.on_quota(quota);
        assert_eq!(adaptive.rate(), Rate::per_second(100));
        assert_eq!(adaptive.stats().successes, 6);
    });
}

#[test]
fn an_exhausted_quota_pauses_until_reset() {
    paused(async {
        let limiter = RateLimiter::new(Rate::per_second(100), 10);
        let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(100));
        let start = tokio::time::Instant::now();
        adaptive.on_quota(Announced::new(0, Duration::from_secs(3)));
        assert_eq!(adaptive.rate(), Rate::per_second(100));
        adaptive.limiter().acquire(1).await;
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        // A reset of centuries pauses a day at most.
        adaptive.on_quota(Announced::new(0, Duration::MAX));
        adaptive.limiter().acquire(1).await;
        assert_eq!(start.elapsed(), Duration::from_secs(3 + 86_400));
    });
}

#[test]
fn announcements_hold_the_rate_and_probing_resumes_when_they_stop() {
    paused(async {
        let limiter = RateLimiter::new(Rate::per_second(100), 10);
        let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(1000));
        adaptive.on_quota(
            Announced::new(0, Duration::from_secs(1)).with_policy(100, Duration::from_secs(1)),
        );
        for _ in 0..100 {
            tokio::time::advance(Duration::from_millis(10)).await;
            adaptive.on_success();
        }
        // 1 s after the announcement: held.
        assert_eq!(adaptive.rate(), Rate::per_second(100));
        for _ in 0..400 {
            tokio::time::advance(Duration::from_millis(10)).await;
            adaptive.on_success();
        }
        // 5 s after: probing resumed from the announced rate (the curve's plateau, then up).
        let r = per_second(adaptive.rate());
        assert!((100.0..200.0).contains(&r), "{r}");
        assert!(r > 100.0, "{r}");
    });
}
