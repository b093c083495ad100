//! The adaptive controller's law: from the outcomes reported and the time they came (seconds,
//! as plain numbers), the rate to set. Clock-free: `Adaptive` (in `limiter`) reads the clock,
//! holds the lock and wakes the limiter's waiters; everything that decides *which rate* lives
//! here and is unit-tested with plain numbers.
//!
//! The control law is a CUBIC curve in the rate (the idea of TCP CUBIC and of AWS's adaptive
//! client rate limiter), made scale-free: the climb back to the rate of the last decrease takes
//! 2 s at any rate, or longer where 2 s would hold fewer than 33 calls, so that the one refusal
//! that ends a cycle is a small share of its calls. The benchmark (`benches/adaptive.rs`)
//! compares it with a plain AIMD and with AWS's own constants.

use std::time::Duration;

use crate::rate::Rate;

/// The rates the controller sets are counted in thousandths of a token per second, so that a
/// decrease of 30 % at 5 calls per second is not lost to rounding.
const FINE_PER: Duration = Duration::from_secs(1000);

/// The fraction of the reference rate kept after a refusal: the default law's, and AWS's.
const BETA: f64 = 0.8;
const AWS_BETA: f64 = 0.7;
/// The shortest time the scale-free curve takes to climb back to the rate of the last
/// decrease.
const CLIMB_MIN_SECS: f64 = 2.0;
/// ... and the calls (at that rate) it spends climbing back at the least: a refusal per cycle
/// is then at most 3 % of the calls, even at 5 calls per second. A longer climb spends longer
/// below the limit: with 40, the 10 s window right after a refusal at 2.5/s fell below 0.9 of
/// the limit in about 1 % of simulated schedules; with 25, the refusals came more often.
const CLIMB_MIN_CALLS: f64 = 33.0;
/// The smallest step up the controller applies to the limiter (a fraction of the rate).
const MIN_STEP_UP: f64 = 0.005;
/// AWS's cubic scale constant (tokens per second per second cubed).
const AWS_C: f64 = 0.4;
/// The plain AIMD baseline keeps half the rate after a refusal (TCP Reno's choice).
const AIMD_BETA: f64 = 0.5;
/// The sending rate is measured in buckets of this many seconds, smoothed (the new bucket
/// weighs `MEASURE_WEIGHT`), as in AWS's client rate limiter.
const MEASURE_BUCKET_SECS: f64 = 0.5;
const MEASURE_WEIGHT: f64 = 0.8;
/// The default law's buckets also hold this many outcomes, unless they span this long.
const MEASURE_MIN_CALLS: u64 = 10;
const MEASURE_MAX_SECS: f64 = 5.0;
/// How long the refusals after a decrease may still belong to the same overload when the
/// calls in flight do not all come back (another user of the limiter that does not report).
const OVERLOAD_MAX_SECS: f64 = 2.0;
/// How long an announced quota holds the rate after it came: successes in that time do not
/// probe above it. Announcements that keep coming keep it held.
const QUOTA_HOLD_SECS: f64 = 2.0;
/// The shortest `reset` an announcement is read with (a zero `reset` would spread the quota
/// over no time at all).
const QUOTA_MIN_RESET_SECS: f64 = 0.001;
/// The longest pause an exhausted quota without a policy asks for: a `reset` beyond a day is
/// more likely a misread clock than a real wait.
pub(crate) const QUOTA_MAX_PAUSE: Duration = Duration::from_secs(86_400);

/// A quota a destination announced with a response: how many calls it still accepts
/// (`remaining`) before its count is restored (`reset` from now), and, when it says so, its
/// policy: `limit` calls per `window`.
///
/// Report it with [`Adaptive::on_quota`](crate::Adaptive::on_quota). With the `http` feature,
/// `paced::tower::quota_from_headers` reads one from the IETF draft's `RateLimit` /
/// `RateLimit-Policy` headers or the de facto `X-RateLimit-*` ones.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paced::limiter::Announced;
///
/// // A fixed window of 5,000 calls an hour, 4,000 left, restored in 30 minutes.
/// let quota = Announced::new(4000, Duration::from_secs(1800))
///     .with_policy(5000, Duration::from_secs(3600));
/// assert_eq!(quota.remaining, 4000);
/// assert_eq!(quota.limit, Some(5000));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Announced {
    /// The calls the destination still accepts before `reset`.
    pub remaining: u64,
    /// The time from now until the quota is restored: the end of a fixed window, or the time
    /// a token bucket takes to fill again.
    pub reset: Duration,
    /// The policy's limit (`q`, `X-RateLimit-Limit`), if announced.
    pub limit: Option<u64>,
    /// The policy's window (`w`), if announced.
    pub window: Option<Duration>,
}

impl Announced {
    /// `remaining` calls until `reset`, no policy.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::limiter::Announced;
    ///
    /// let quota = Announced::new(50, Duration::from_secs(30));
    /// assert_eq!((quota.limit, quota.window), (None, None));
    /// ```
    #[must_use]
    pub const fn new(remaining: u64, reset: Duration) -> Announced {
        Announced {
            remaining,
            reset,
            limit: None,
            window: None,
        }
    }

    /// The same, with the policy: `limit` calls per `window`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::limiter::Announced;
    ///
    /// let quota = Announced::new(50, Duration::from_secs(30)).with_policy(100, Duration::from_secs(60));
    /// assert_eq!(quota.window, Some(Duration::from_secs(60)));
    /// ```
    #[must_use]
    pub const fn with_policy(mut self, limit: u64, window: Duration) -> Announced {
        self.limit = Some(limit);
        self.window = Some(window);
        self
    }

    /// The rate this announcement allows, in calls per second, before clamping (see
    /// [`Adaptive::on_quota`](crate::Adaptive::on_quota)). Never NaN; may be infinite or zero.
    pub(crate) fn rate(&self) -> f64 {
        let reset = self.reset.as_secs_f64().max(QUOTA_MIN_RESET_SECS);
        // The call that brought the announcement and the `remaining` after it, one interval
        // apart: the last of them leaves just before `reset`, the next one just after.
        let spread = (self.remaining as f64 + 1.0) / reset;
        match self.policy_rate() {
            Some(sustained) if self.is_bucket() => spread.max(sustained),
            _ => spread,
        }
    }

    /// Whether the destination reads as a token bucket: its count is restored a whole window
    /// from now or later, which a fixed window does only at the instant it starts.
    pub(crate) fn is_bucket(&self) -> bool {
        matches!(self.window, Some(w) if self.reset >= w) && self.policy_rate().is_some()
    }

    /// `limit / window`, if both are announced and the window is not zero.
    fn policy_rate(&self) -> Option<f64> {
        match (self.limit, self.window) {
            (Some(limit), Some(window)) if !window.is_zero() => {
                Some(limit as f64 / window.as_secs_f64())
            }
            _ => None,
        }
    }
}

/// The control laws the adaptive benchmark compares (feature `unstable-laws`, outside semver:
/// they may change or go in any release).
///
/// # Examples
///
/// ```
/// # #[cfg(feature = "unstable-laws")] {
/// use paced::{Adaptive, Rate, RateLimiter};
/// use paced::limiter::AdaptiveLaw;
///
/// let limiter = RateLimiter::new(Rate::per_second(10), 2);
/// let aimd = Adaptive::try_with_law(limiter, Rate::per_second(1), Rate::per_second(10), AdaptiveLaw::Aimd);
/// assert!(aimd.is_ok());
/// # }
/// ```
#[cfg_attr(not(feature = "unstable-laws"), allow(unreachable_pub, dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdaptiveLaw {
    /// The default: a scale-free cubic (see [`Adaptive`](crate::Adaptive)).
    Cubic,
    /// AWS's constants: β = 0.7, cubic with C = 0.4 (so the climb takes longer at higher
    /// rates), the measured sending rate as reference, never above twice that rate.
    AwsCubic,
    /// Halve the limiter's rate on a refusal, climb back linearly, and on beyond at the same
    /// pace, reaching the old rate again in the default's climb time.
    Aimd,
}

/// What the law reads of the limiter it sets, and how it sets it: a `RateLimiter` in use, or
/// plain numbers in a test.
pub(crate) trait Limited {
    /// The limiter's rate now (someone else may have set it by hand).
    fn rate(&self) -> Rate;
    /// The grants the limiter has made since it was built.
    fn granted(&self) -> u64;
    /// The tokens it could grant now, ignoring anyone waiting.
    fn available(&self) -> u64;
    /// Sets its rate.
    fn set_rate(&mut self, rate: Rate);
}

/// The controller: its law, its range, and its state between reports.
#[derive(Debug)]
pub(crate) struct Controller {
    law: AdaptiveLaw,
    min: Rate,
    max: Rate,
    st: State,
}

/// The controller's state between reports.
#[derive(Debug)]
struct State {
    /// The rate the controller last set (or found): a different one on the limiter was set by
    /// hand.
    set: Rate,
    /// The rate of the last decrease (or the starting point): the cubic's plateau.
    w_max: f64,
    /// When the curve started from `w_max` (seconds since `origin`; may be negative).
    curve_start: f64,
    /// The total time paused when the curve started: paused time does not count as probing
    /// time either, or a 1 s `Retry-After` would let the curve climb back during the pause.
    curve_paused: f64,
    /// Whether any decrease happened (the cap at twice the measured rate applies from then).
    decreased: bool,
    /// The current overload: the report count after which its calls are all back, and the
    /// time after which a refusal is new in any case.
    overload_until_reports: u64,
    overload_until_secs: f64,
    /// Grants of the limiter before the controller existed, and reports since.
    granted_before: u64,
    reports: u64,
    /// The measured sending rate: outcomes per second, smoothed over buckets; the bucket
    /// started at `bucket` seconds and holds `in_bucket` outcomes.
    bucket: f64,
    in_bucket: u64,
    measured: f64,
    /// The pauses this controller asked for (`Retry-After`), so that time in which nothing
    /// could be sent does not count as time sent slowly: `[pause_start, pause_end)` is the
    /// latest, `paused_before` the total of the earlier ones, and `bucket_paused` the total
    /// paused when the bucket started.
    pause_start: f64,
    pause_end: f64,
    paused_before: f64,
    bucket_paused: f64,
    /// Successes before this time (seconds since the origin) do not probe: a quota was
    /// announced.
    hold_until: f64,
    successes: u64,
    throttled: u64,
    decreases: u64,
}

/// Tokens per second.
pub(crate) fn per_second(rate: Rate) -> f64 {
    rate.tokens() as f64 / rate.per().as_secs_f64()
}

impl Controller {
    /// A controller over `limiter` (which has made `limiter.granted()` grants so far), setting
    /// rates within `[min, max]` (`min <= max`); it starts from the limiter's rate, clamped
    /// into that range (and sets it if it was outside), at time 0.
    pub(crate) fn new(
        law: AdaptiveLaw,
        min: Rate,
        max: Rate,
        limiter: &mut impl Limited,
    ) -> Controller {
        debug_assert!(min <= max);
        let mut controller = Controller {
            law,
            min,
            max,
            st: State {
                set: min,
                w_max: 0.0,
                curve_start: 0.0,
                curve_paused: 0.0,
                decreased: false,
                overload_until_reports: 0,
                overload_until_secs: f64::NEG_INFINITY,
                granted_before: limiter.granted(),
                reports: 0,
                bucket: 0.0,
                in_bucket: 0,
                measured: 0.0,
                pause_start: 0.0,
                pause_end: 0.0,
                paused_before: 0.0,
                bucket_paused: 0.0,
                hold_until: f64::NEG_INFINITY,
                successes: 0,
                throttled: 0,
                decreases: 0,
            },
        };
        let start = limiter.rate();
        controller.restart(limiter, start, 0.0);
        controller
    }

    /// The law.
    pub(crate) fn law(&self) -> AdaptiveLaw {
        self.law
    }

    /// The range of rates it sets.
    pub(crate) fn range(&self) -> (Rate, Rate) {
        (self.min, self.max)
    }

    /// The rate it last set (or found).
    #[cfg_attr(not(any(feature = "metrics", test)), allow(dead_code))]
    pub(crate) fn rate(&self) -> Rate {
        self.st.set
    }

    /// Successes, throttled calls and decreases reported so far.
    pub(crate) fn counts(&self) -> (u64, u64, u64) {
        (self.st.successes, self.st.throttled, self.st.decreases)
    }

    /// Folds one report at `now` (seconds) into the state and sets the limiter's rate
    /// accordingly: a success, or a call throttled by the destination (`refused`), with its
    /// `Retry-After` (the caller pauses the limiter for it).
    pub(crate) fn report(
        &mut self,
        limiter: &mut impl Limited,
        refused: bool,
        retry_after: Option<Duration>,
        now: f64,
    ) {
        if let Some(d) = retry_after {
            note_pause(&mut self.st, now, d);
        }
        self.st.reports += 1;
        if refused {
            self.st.throttled += 1;
        } else {
            self.st.successes += 1;
        }
        measure(self.law, &mut self.st, now);
        let mut current = limiter.rate();
        if current != self.st.set {
            // Set by hand: start over from there.
            self.restart(limiter, current, now);
            current = self.st.set;
        }
        let st = &self.st;
        if refused {
            let same_overload =
                st.reports <= st.overload_until_reports && now < st.overload_until_secs;
            if same_overload {
                return;
            }
            self.decrease(limiter, current, now);
        } else if now < st.hold_until {
            // An announced quota holds the rate: no probing above it.
            self.hold(now);
        } else {
            let probing = now - st.curve_start - (paused_through(st, now) - st.curve_paused);
            let mut rate = curve(self.law, st.w_max, probing);
            if st.decreased && st.measured > 0.0 {
                rate = rate.min(2.0 * st.measured);
            }
            // Climbing, the curve moves with nearly every success; a change of the limiter's
            // rate wakes its head waiter to re-read its deadline, so small steps up are
            // gathered into steps of at least `MIN_STEP_UP` (or up to `max`).
            let set = per_second(st.set);
            if rate <= set || rate >= set * (1.0 + MIN_STEP_UP) || rate >= per_second(self.max) {
                self.set(limiter, rate);
            }
        }
    }

    /// Folds an announced quota at `now` (seconds) into the state: a success, then the
    /// announced rate, held. `exhausted`: nothing left and not a token bucket, so the caller
    /// pauses the limiter until `reset` (at most [`QUOTA_MAX_PAUSE`]) and the rate is kept.
    pub(crate) fn announce(
        &mut self,
        limiter: &mut impl Limited,
        quota: Announced,
        exhausted: bool,
        now: f64,
    ) {
        if exhausted {
            note_pause(&mut self.st, now, quota.reset.min(QUOTA_MAX_PAUSE));
        }
        self.st.reports += 1;
        self.st.successes += 1;
        measure(self.law, &mut self.st, now);
        let current = limiter.rate();
        if current != self.st.set {
            // Set by hand: start over from there.
            self.restart(limiter, current, now);
        }
        if !exhausted {
            self.set(limiter, quota.rate());
        }
        // The curve waits on its plateau at the announced rate (or the rate kept).
        self.st.w_max = per_second(self.st.set);
        self.hold(now);
        self.st.hold_until = now + QUOTA_HOLD_SECS;
    }

    /// Keeps the curve on its plateau at `w_max` as of `now`.
    fn hold(&mut self, now: f64) {
        self.st.curve_start = now - climb_secs(self.law, self.st.w_max);
        self.st.curve_paused = paused_through(&self.st, now);
    }

    fn decrease(&mut self, limiter: &mut impl Limited, current: Rate, now: f64) {
        let current = per_second(current);
        let st = &mut self.st;
        let reference = match self.law {
            AdaptiveLaw::Aimd => current,
            AdaptiveLaw::Cubic | AdaptiveLaw::AwsCubic if st.measured > 0.0 => {
                st.measured.min(current)
            }
            AdaptiveLaw::Cubic | AdaptiveLaw::AwsCubic => current,
        };
        let beta = match self.law {
            AdaptiveLaw::Aimd => AIMD_BETA,
            AdaptiveLaw::Cubic => BETA,
            AdaptiveLaw::AwsCubic => AWS_BETA,
        };
        st.w_max = reference;
        st.curve_start = now;
        st.curve_paused = paused_through(st, now);
        st.decreased = true;
        st.decreases += 1;
        // The calls of this overload: those granted and not yet back, and those whose tokens
        // are already in the bucket.
        let granted = limiter.granted().saturating_sub(st.granted_before);
        let in_flight = granted.saturating_sub(st.reports);
        let waiting = limiter.available();
        st.overload_until_reports = st.reports.saturating_add(in_flight).saturating_add(waiting);
        st.overload_until_secs = now + OVERLOAD_MAX_SECS;
        self.set(limiter, beta * reference);
    }

    /// Sets `rate` (tokens per second), clamped, if it differs from the one in force.
    fn set(&mut self, limiter: &mut impl Limited, rate: f64) {
        let rate = clamp(self.min, self.max, rate);
        // The same rate in another representation (20/s is 20,000 per 1,000 s) is no change.
        if rate != self.st.set {
            self.st.set = rate;
            limiter.set_rate(rate);
        }
    }

    /// Starts the curve at `rate` (clamped), on its plateau: no decrease remembered.
    fn restart(&mut self, limiter: &mut impl Limited, rate: Rate, now: f64) {
        let clamped = if rate < self.min {
            self.min
        } else if rate > self.max {
            self.max
        } else {
            rate
        };
        let st = &mut self.st;
        st.w_max = per_second(clamped);
        st.curve_start = now - climb_secs(self.law, st.w_max);
        st.curve_paused = paused_through(st, now);
        st.decreased = false;
        st.overload_until_secs = f64::NEG_INFINITY;
        st.set = clamped;
        if clamped != rate {
            limiter.set_rate(clamped);
        }
    }
}

/// Folds one outcome at `now` into the measured sending rate: outcomes per second over a
/// bucket of at least half a second (AWS's buckets) and, for the default law, at least
/// [`MEASURE_MIN_CALLS`] outcomes, so that at 5 calls per second one call more or less in a
/// bucket does not read as a 20 % change; smoothed across buckets.
///
/// The time the limiter spent paused by a `Retry-After` is left out: with the whole seconds
/// of HTTP's header, a bucket spanning a pause would otherwise read a fraction of the rate the
/// calls were sent at, and the next decrease would land far below the limit.
fn measure(law: AdaptiveLaw, st: &mut State, now: f64) {
    st.in_bucket += 1;
    let paused = paused_through(st, now);
    let elapsed = (now - st.bucket) - (paused - st.bucket_paused);
    let enough = match law {
        AdaptiveLaw::Cubic => st.in_bucket >= MEASURE_MIN_CALLS,
        AdaptiveLaw::AwsCubic | AdaptiveLaw::Aimd => true,
    };
    if elapsed >= MEASURE_BUCKET_SECS && (enough || elapsed >= MEASURE_MAX_SECS) {
        let rate = st.in_bucket as f64 / elapsed;
        st.measured = if st.measured > 0.0 {
            MEASURE_WEIGHT * rate + (1.0 - MEASURE_WEIGHT) * st.measured
        } else {
            rate
        };
        st.in_bucket = 0;
        st.bucket = now;
        st.bucket_paused = paused;
    }
}

/// Records a pause of `d` from `now` (seconds since the origin), merged with the latest one.
fn note_pause(st: &mut State, now: f64, d: Duration) {
    let end = now + d.as_secs_f64();
    if end <= st.pause_end {
        return;
    }
    if now <= st.pause_end {
        st.pause_end = end;
    } else {
        st.paused_before += st.pause_end - st.pause_start;
        st.pause_start = now;
        st.pause_end = end;
    }
}

/// The total time paused up to `t` (seconds since the origin).
fn paused_through(st: &State, t: f64) -> f64 {
    st.paused_before + (t.min(st.pause_end) - st.pause_start).max(0.0)
}

/// How long the curve takes to climb from a decrease back to `w_max`.
fn climb_secs(law: AdaptiveLaw, w_max: f64) -> f64 {
    match law {
        // The baseline climbs back in the same time as the default, so that the two differ
        // only in their curves (and in what they keep after a refusal).
        AdaptiveLaw::Cubic | AdaptiveLaw::Aimd => CLIMB_MIN_SECS.max(CLIMB_MIN_CALLS / w_max),
        AdaptiveLaw::AwsCubic => (w_max * (1.0 - AWS_BETA) / AWS_C).cbrt(),
    }
}

/// The law's rate `dt` seconds after a decrease from `w_max`.
fn curve(law: AdaptiveLaw, w_max: f64, dt: f64) -> f64 {
    let k = climb_secs(law, w_max);
    match law {
        AdaptiveLaw::Cubic | AdaptiveLaw::AwsCubic => {
            let beta = if law == AdaptiveLaw::Cubic {
                BETA
            } else {
                AWS_BETA
            };
            // w_max + C (dt - K)^3 with C = w_max (1 - β) / K^3: β w_max at the decrease,
            // flat at w_max after K, and growing again beyond.
            let x = (dt - k) / k;
            w_max * (1.0 + (1.0 - beta) * x * x * x)
        }
        AdaptiveLaw::Aimd => w_max * (AIMD_BETA + (1.0 - AIMD_BETA) * dt / k),
    }
}

/// The `Rate` for `rate` tokens per second: exactly `min` or `max` at or beyond them, else in
/// thousandths of a token per second.
fn clamp(min: Rate, max: Rate, rate: f64) -> Rate {
    if rate.is_nan() || rate <= per_second(min) {
        return min;
    }
    if rate >= per_second(max) {
        return max;
    }
    let millis = (rate * 1000.0).round();
    // A float-to-int cast saturates; a rate that is not zero is at least one thousandth.
    let fine = Rate::new((millis as u64).max(1), FINE_PER);
    if per_second(fine) > per_second(max) {
        max
    } else if per_second(fine) < per_second(min) {
        min
    } else {
        fine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A limiter as plain numbers: the rates set are logged.
    #[derive(Debug)]
    struct Plain {
        rate: Rate,
        granted: u64,
        available: u64,
        sets: Vec<Rate>,
    }

    impl Plain {
        fn at(per_second: u64) -> Plain {
            Plain {
                rate: Rate::per_second(per_second),
                granted: 0,
                available: 0,
                sets: Vec::new(),
            }
        }
    }

    impl Limited for Plain {
        fn rate(&self) -> Rate {
            self.rate
        }
        fn granted(&self) -> u64 {
            self.granted
        }
        fn available(&self) -> u64 {
            self.available
        }
        fn set_rate(&mut self, rate: Rate) {
            self.rate = rate;
            self.sets.push(rate);
        }
    }

    fn cubic(limiter: &mut Plain, min: u64, max: u64) -> Controller {
        Controller::new(
            AdaptiveLaw::Cubic,
            Rate::per_second(min),
            Rate::per_second(max),
            limiter,
        )
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn it_starts_from_the_limiters_rate_clamped() {
        let mut limiter = Plain::at(500);
        let controller = cubic(&mut limiter, 1, 100);
        assert_eq!(limiter.sets, [Rate::per_second(100)]);
        assert_eq!(controller.rate(), Rate::per_second(100));
        let mut limiter = Plain::at(50);
        let controller = cubic(&mut limiter, 1, 100);
        assert!(limiter.sets.is_empty());
        assert_eq!(controller.rate(), Rate::per_second(50));
    }

    #[test]
    fn a_throttled_call_keeps_80_per_cent_once_per_overload() {
        let mut limiter = Plain::at(100);
        limiter.available = 5; // five calls' tokens already out: their refusals are this overload's
        let mut controller = cubic(&mut limiter, 1, 100);
        controller.report(&mut limiter, true, None, 0.0);
        assert_eq!(limiter.sets, [Rate::per_second(80)]);
        for i in 1..=5 {
            controller.report(&mut limiter, true, None, 0.1 * f64::from(i));
        }
        assert_eq!(limiter.sets.len(), 1, "{:?}", limiter.sets);
        assert_eq!(controller.counts(), (0, 6, 1));
        // The overload's calls are all back: the next refusal is a new overload.
        controller.report(&mut limiter, true, None, 0.7);
        assert_eq!(limiter.sets, [Rate::per_second(80), Rate::per_second(64)]);
        assert_eq!(controller.counts(), (0, 7, 2));
    }

    #[test]
    fn the_curve_climbs_back_to_the_decrease_in_the_climb_time() {
        assert!(close(climb_secs(AdaptiveLaw::Cubic, 100.0), 2.0));
        assert!(close(climb_secs(AdaptiveLaw::Cubic, 5.0), 6.6)); // 33 calls at 5/s
        assert!(close(
            climb_secs(AdaptiveLaw::AwsCubic, 100.0),
            75f64.cbrt()
        ));
        assert!(close(curve(AdaptiveLaw::Cubic, 100.0, 0.0), 80.0));
        assert!(close(curve(AdaptiveLaw::Cubic, 100.0, 2.0), 100.0));
        assert!(close(curve(AdaptiveLaw::Cubic, 100.0, 1.0), 97.5));
        assert!(curve(AdaptiveLaw::Cubic, 100.0, 3.0) > 100.0);
        assert!(close(curve(AdaptiveLaw::AwsCubic, 100.0, 0.0), 70.0));
        assert!(close(curve(AdaptiveLaw::Aimd, 100.0, 0.0), 50.0));
        assert!(close(curve(AdaptiveLaw::Aimd, 100.0, 2.0), 100.0));
    }

    #[test]
    fn successes_probe_back_up_and_paused_time_does_not_count() {
        let mut limiter = Plain::at(100);
        let mut controller = cubic(&mut limiter, 1, 100);
        controller.report(&mut limiter, true, None, 0.0);
        controller.report(&mut limiter, false, None, 2.0);
        assert_eq!(limiter.rate, Rate::per_second(100));

        // The same, with a 1 s `Retry-After`: at 2 s the curve has climbed for 1 s only.
        let mut limiter = Plain::at(100);
        let mut controller = cubic(&mut limiter, 1, 100);
        controller.report(&mut limiter, true, Some(Duration::from_secs(1)), 0.0);
        controller.report(&mut limiter, false, None, 2.0);
        assert_eq!(limiter.rate, Rate::new(97_500, FINE_PER));
        assert_eq!(controller.counts(), (1, 1, 1));
    }

    #[test]
    fn a_rate_set_by_hand_is_the_new_start() {
        let mut limiter = Plain::at(100);
        let mut controller = cubic(&mut limiter, 10, 100);
        limiter.rate = Rate::per_second(5); // below `min`
        controller.report(&mut limiter, false, None, 1.0);
        assert_eq!(limiter.sets, [Rate::per_second(10)]);
        assert_eq!(controller.rate(), Rate::per_second(10));
    }

    #[test]
    fn an_announced_quota_sets_the_rate_and_holds_it() {
        let window = Duration::from_secs(60);
        let bucket = Announced::new(0, window).with_policy(600, window);
        assert!(bucket.is_bucket());
        assert!(close(bucket.rate(), 10.0));
        let fixed = Announced::new(4000, Duration::from_secs(1800));
        assert!(!fixed.is_bucket());
        assert!(close(fixed.rate(), 4001.0 / 1800.0));

        let mut limiter = Plain::at(100);
        let mut controller = cubic(&mut limiter, 1, 100);
        controller.announce(&mut limiter, bucket, false, 0.0);
        assert_eq!(limiter.rate, Rate::per_second(10));
        // Held: a success within 2 s does not probe above it...
        controller.report(&mut limiter, false, None, 1.9);
        assert_eq!(limiter.rate, Rate::per_second(10));
        // ... and after, the curve leaves its plateau at the announced rate: flat at first
        // (at 10/s the climb takes 3.3 s: 33 calls), then faster.
        controller.report(&mut limiter, false, None, 2.5);
        assert_eq!(limiter.rate, Rate::per_second(10));
        controller.report(&mut limiter, false, None, 10.0);
        assert!(per_second(limiter.rate) > 20.0, "{}", limiter.rate);
        assert_eq!(controller.counts(), (4, 0, 0));
    }

    #[test]
    fn clamp_keeps_thousandths_or_the_bounds() {
        let (min, max) = (Rate::per_second(1), Rate::per_second(100));
        assert_eq!(clamp(min, max, f64::NAN), min);
        assert_eq!(clamp(min, max, 0.5), min);
        assert_eq!(clamp(min, max, 1e9), max);
        assert_eq!(clamp(min, max, 12.3456), Rate::new(12_346, FINE_PER));
    }

    #[test]
    fn the_measured_rate_leaves_paused_time_out() {
        let mut limiter = Plain::at(100);
        let mut controller = cubic(&mut limiter, 1, 100);
        // Ten successes over 1 s: 10 calls a second.
        for i in 1..=10 {
            controller.report(&mut limiter, false, None, 0.1 * f64::from(i));
        }
        assert!(close(controller.st.measured, 10.0));
        // A pause of 1 s, then ten more in the next second: still 10 a second, not 5.
        note_pause(&mut controller.st, 1.0, Duration::from_secs(1));
        for i in 1..=10 {
            controller.report(&mut limiter, false, None, 2.0 + 0.1 * f64::from(i));
        }
        assert!(
            close(controller.st.measured, 10.0),
            "{}",
            controller.st.measured
        );
    }
}
