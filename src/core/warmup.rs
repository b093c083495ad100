//! Guava's `SmoothWarmingUp`: after an idle spell, permits start slow and speed up to the
//! stable rate as the stored permits are spent.
//!
//! This follows Guava's `SmoothRateLimiter` step by step, in nanoseconds where Guava counts
//! microseconds, and in `f64` where Guava uses `double`: the warm-up curve is a trapezoid whose
//! area is a wait, and nothing about it is exact in integers anyway. As in Guava, a request
//! waits for the *previous* one's cost to be paid ("pay later"): the first request after an idle
//! spell goes at once, whatever it costs, and the next one waits for it.
//!
//! The shape, for a stable interval `s`, a cold factor `c` and a warm-up period `w`:
//! - `threshold = 0.5 * w / s` stored permits cost the stable interval each;
//! - above it, up to `max = threshold + 2 * w / (s + c * s)`, the interval rises linearly to
//!   `c * s`, so spending all stored permits from cold takes `w` longer than at the stable rate;
//! - an idle limiter stores one permit per `w / max` (the cool-down interval), up to `max`.

use super::nanos::Nanos;

/// The state of a warming-up limiter.
#[derive(Clone, Debug)]
pub(crate) struct WarmingUp {
    /// Nanoseconds per permit at the stable rate.
    stable: f64,
    /// The warm-up period, in nanoseconds.
    warmup: f64,
    cold_factor: f64,
    threshold: f64,
    max_permits: f64,
    /// How much the interval grows per stored permit above the threshold.
    slope: f64,
    stored: f64,
    /// When the next request may go: the previous requests' cost, paid.
    next_free: Nanos,
}

impl WarmingUp {
    /// A cold limiter: `tokens` per `per_nanos` once warm, warming up over `warmup`.
    pub(crate) fn new(tokens: u64, per_nanos: u128, warmup: Nanos, cold_factor: f64) -> WarmingUp {
        let mut limiter = WarmingUp {
            stable: 0.0,
            warmup: warmup.0 as f64,
            cold_factor,
            threshold: 0.0,
            max_permits: 0.0,
            slope: 0.0,
            stored: 0.0,
            next_free: Nanos::ZERO,
        };
        limiter.set_stable(per_nanos as f64 / tokens as f64);
        limiter
    }

    fn set_stable(&mut self, stable: f64) {
        let old_max = self.max_permits;
        let cold = stable * self.cold_factor;
        self.stable = stable;
        self.threshold = 0.5 * self.warmup / stable;
        self.max_permits = self.threshold + 2.0 * self.warmup / (stable + cold);
        self.slope = (cold - stable) / (self.max_permits - self.threshold);
        // A new limiter starts cold; a changed one keeps its stored share.
        self.stored = if old_max == 0.0 {
            self.max_permits
        } else {
            self.stored * self.max_permits / old_max
        };
    }

    /// Stores the permits an idle spell up to `now` earned.
    fn resync(&mut self, now: Nanos) {
        if now > self.next_free {
            let idle = (now.0 - self.next_free.0) as f64;
            let cool_down = self.warmup / self.max_permits;
            self.stored = self.max_permits.min(self.stored + idle / cool_down);
            self.next_free = now;
        }
    }

    /// When a request may go: once the previous ones are paid for, whatever it costs.
    pub(crate) fn earliest(&self) -> Nanos {
        self.next_free
    }

    /// Grants `cost` permits at `now`: the next request waits for their price.
    pub(crate) fn commit(&mut self, now: Nanos, cost: u64) {
        self.resync(now);
        let cost = cost as f64;
        let spent = cost.min(self.stored);
        let fresh = cost - spent;
        let wait = self
            .stored_wait(spent)
            .saturating_add((fresh * self.stable) as u64);
        self.next_free = self.next_free.saturating_add(Nanos(wait));
        self.stored -= spent;
    }

    /// The price of spending `take` stored permits: the area under the interval curve.
    fn stored_wait(&self, mut take: f64) -> u64 {
        let above = self.stored - self.threshold;
        let mut wait = 0;
        if above > 0.0 {
            let from_above = above.min(take);
            let length = self.interval_at(above) + self.interval_at(above - from_above);
            wait = (from_above * length / 2.0) as u64;
            take -= from_above;
        }
        wait.saturating_add((self.stable * take) as u64)
    }

    /// Whether `other` is in the same state, bit for bit: the two then answer alike forever.
    pub(crate) fn same(&self, other: &WarmingUp) -> bool {
        let floats = |w: &WarmingUp| {
            [
                w.stable,
                w.warmup,
                w.cold_factor,
                w.threshold,
                w.max_permits,
                w.slope,
                w.stored,
            ]
            .map(f64::to_bits)
        };
        self.next_free == other.next_free && floats(self) == floats(other)
    }

    fn interval_at(&self, permits_above_threshold: f64) -> f64 {
        self.stable + permits_above_threshold * self.slope
    }

    /// Guava's `setRate`: stores what the idle spell earned at the old rate, then applies the
    /// new rate, keeping the stored permits' share of the maximum.
    pub(crate) fn set_rate(&mut self, now: Nanos, tokens: u64, per_nanos: u128) {
        self.resync(now);
        self.set_stable(per_nanos as f64 / tokens as f64);
    }

    /// Permits that could be granted at `now` without waiting.
    pub(crate) fn available(&self, now: Nanos) -> u64 {
        if now < self.next_free {
            return 0;
        }
        let idle = (now.0 - self.next_free.0) as f64;
        let stored = self
            .max_permits
            .min(self.stored + idle / (self.warmup / self.max_permits));
        // A request goes at once whatever it costs; count at least one.
        (stored as u64).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const SEC: u128 = 1_000_000_000;

    /// Runs Guava-style events: `Some(n)` acquires n permits (waiting as long as needed),
    /// `None(ms)` sleeps; returns each acquire's wait in ms, rounded like Guava's log.
    fn waits(limiter: &mut WarmingUp, start: u64, acquires: usize) -> (Vec<f64>, u64) {
        let mut now = start;
        let mut out = Vec::new();
        for _ in 0..acquires {
            let at = limiter.earliest().0.max(now);
            out.push(((at - now) as f64 / 1e7).round() / 100.0);
            limiter.commit(Nanos(at), 1);
            now = at;
        }
        (out, now)
    }

    /// Guava's warm-up cycle for `permits` per second, 4 s warm-up: the waits of 8 acquires
    /// from cold are `cold`; after repaying the last one (`stable_ms`, the stable interval)
    /// and idling the whole warm-up, the same again; after repaying and idling only `short_ms`,
    /// still warm: the stable interval from the second acquire on.
    fn guava_cycle(permits: u64, cold_factor: f64, cold: [f64; 8], stable_ms: u64, short_ms: u64) {
        let mut l = WarmingUp::new(permits, SEC, Nanos(4_000 * MS), cold_factor);
        let (w, now) = waits(&mut l, 0, 8);
        assert_eq!(w, cold);
        let (w, now) = waits(&mut l, now + stable_ms * MS + 4_000 * MS, 8);
        assert_eq!(w, cold);
        let (w, _) = waits(&mut l, now + stable_ms * MS + short_ms * MS, 8);
        #[allow(clippy::cast_precision_loss)]
        let stable = stable_ms as f64 / 1_000.0;
        assert_eq!(
            w,
            [0.0, stable, stable, stable, stable, stable, stable, stable]
        );
    }

    #[test]
    fn guava_warm_up() {
        // RateLimiterTest.testWarmUp: 2 permits/s, 4 s warm-up, cold factor 3; idle 2 s.
        guava_cycle(
            2,
            3.0,
            [0.0, 1.38, 1.13, 0.88, 0.63, 0.5, 0.5, 0.5],
            500,
            2_000,
        );
    }

    #[test]
    fn guava_warm_up_with_cold_factor() {
        // RateLimiterTest.testWarmUpWithColdFactor: 5 permits/s, 4 s warm-up, cold factor 10,
        // idle 1 s; here the cool-down interval (293 ms) differs from the stable one (200 ms).
        guava_cycle(
            5,
            10.0,
            [0.0, 1.75, 1.26, 0.76, 0.3, 0.2, 0.2, 0.2],
            200,
            1_000,
        );
    }

    #[test]
    fn set_rate_resyncs_at_the_old_rate_then_applies_the_new() {
        let mut l = WarmingUp::new(2, SEC, Nanos(4_000 * MS), 3.0);
        let (_, now) = waits(&mut l, 0, 8);
        // Warm and paid up; doubling the rate halves the stable interval.
        l.set_rate(Nanos(now), 4, SEC);
        let (w, _) = waits(&mut l, now, 4);
        assert_eq!(w, [0.5, 0.25, 0.25, 0.25]);
    }

    #[test]
    fn available_is_zero_while_a_price_is_unpaid() {
        let mut l = WarmingUp::new(2, SEC, Nanos(4_000 * MS), 3.0);
        assert!(l.available(Nanos::ZERO) >= 1);
        l.commit(Nanos::ZERO, 1);
        assert_eq!(l.available(Nanos(MS)), 0);
        assert!(l.available(Nanos(1_375 * MS)) >= 1);
    }
}
