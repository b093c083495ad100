//! `Adaptive`: a controller that finds a destination's real limit from its answers and keeps a
//! [`RateLimiter`]'s rate there.
//!
//! The control law is a CUBIC curve in the rate (the idea of TCP CUBIC and of AWS's adaptive
//! client rate limiter), made scale-free: the climb back to the rate of the last decrease takes
//! 2 s at any rate, or longer where 2 s would hold fewer than 40 calls, so that the one refusal
//! that ends a cycle is a small share of its calls. The benchmark (`benches/adaptive.rs`)
//! compares it with a plain AIMD and with AWS's own constants.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::rate_limiter::RateLimiter;
use crate::engine::After;
use crate::error::ConfigError;
use crate::rate::Rate;
use crate::sync::{lock, Mutex, MutexGuard};

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
/// is then at most a few per cent of the calls, even at 5 calls per second.
const CLIMB_MIN_CALLS: f64 = 40.0;
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
const QUOTA_MAX_PAUSE: Duration = Duration::from_secs(86_400);

/// A quota a destination announced with a response: how many calls it still accepts
/// (`remaining`) before its count is restored (`reset` from now), and, when it says so, its
/// policy: `limit` calls per `window`.
///
/// Report it with [`Adaptive::on_quota`]. With the `http` feature,
/// `paced::tower::quota_from_headers` reads one from the IETF draft's `RateLimit` /
/// `RateLimit-Policy` headers or the de facto `X-RateLimit-*` ones.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paced::Announced;
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
    /// use paced::Announced;
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
    /// use paced::Announced;
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
    /// [`Adaptive::on_quota`]). Never NaN; may be infinite or zero.
    fn rate(&self) -> f64 {
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
    fn is_bucket(&self) -> bool {
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
/// use paced::{Adaptive, AdaptiveLaw, Rate, RateLimiter};
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
    /// The default: a scale-free cubic (see [`Adaptive`]).
    Cubic,
    /// AWS's constants: β = 0.7, cubic with C = 0.4 (so the climb takes longer at higher
    /// rates), the measured sending rate as reference, never above twice that rate.
    AwsCubic,
    /// Halve the limiter's rate on a refusal, climb back linearly, and on beyond at the same
    /// pace, reaching the old rate again in the default's climb time.
    Aimd,
}

/// Finds the rate a destination accepts from its answers, and keeps a shared
/// [`RateLimiter`] at it.
///
/// The stage that makes the call reports each outcome: [`on_success`](Adaptive::on_success),
/// or [`on_throttled`](Adaptive::on_throttled) for a `429 Too Many Requests` or a
/// `503 Slow Down`, with its `Retry-After` if it had one. Streams draw on
/// [`limiter`](Adaptive::limiter) unchanged, with
/// [`throttle_with`](crate::PaceExt::throttle_with); tasks with `acquire`.
///
/// **After a refusal** the rate drops to 80 % of the rate the calls were really sent at (the
/// measured sending rate, if lower than the limiter's), and with a `Retry-After` the limiter
/// grants nothing to anyone until it has passed. The refusals of one overload count once: the
/// calls already in flight (and the tokens already in the bucket) when the first refusal came
/// back were sent at the old rate, and their refusals do not lower the rate again. 80 % rather
/// than AWS's 70 %: the rate spends each cycle climbing back, averaging `1 - (1 - β) / 4` of
/// the rate found on the way (95 % rather than 92.5 %), and the measured reference already
/// makes each cut land near the limit.
///
/// **Then it probes up** along a cubic curve: fast at first, flat as it approaches the rate of
/// the last decrease (where the limit was found), and faster again beyond it, in case the limit
/// has risen. The curve reaches the rate of the last decrease after
/// `max(2 s, 40 calls at that rate)`: at 5,000/s in 2 s, at 5/s in 8 s. A fixed time at every
/// scale (AWS's constant `C = 0.4` takes 15 s at 5,000/s and 1.5 s at 5/s) keeps large rates
/// responsive; the 40 calls keep small ones from being refused more than a few per cent of the
/// time, since every cycle ends with at least one refusal. The rate never climbs above twice
/// the measured sending rate, so a client that cannot use its rate does not inflate it.
///
/// **A destination that announces its quota** (`RateLimit`, `X-RateLimit-*`) needs no
/// probing: report its answers with [`on_quota`](Adaptive::on_quota) and the rate follows the
/// announcements, held there while they keep coming; probing resumes from the last announced
/// rate when they stop.
///
/// **Time paused by a `Retry-After`** counts neither as probing time nor as sending time:
/// HTTP's header has whole seconds, so a server asks for 1 s where 20 ms would do, and
/// counting that second would let the curve climb back during the pause and make the calls
/// around it read as sent at a fraction of their rate.
///
/// It starts from the limiter's rate, clamped into `[min, max]`, probes up from there if no
/// refusal comes, and only ever sets rates within `[min, max]`. If the limiter's rate is changed
/// by hand, the next report takes the new rate (clamped) as its starting point, as if the
/// controller had been created then. The rates it sets are kept in thousandths of a token per
/// second (`Rate::new(millis, 1000 s)`), or are exactly `min` or `max`.
///
/// The controller sets the rate only; the limiter's burst stays yours. Give it at least 2 and
/// at least `max` × 1 ms: tokio's timer ticks every millisecond, and with a burst of 1 a grant
/// that wakes late loses the time it was late.
///
/// Everything reads tokio's clock, so under paused time the rates are exact and repeatable.
/// Cloning is cheap (an `Arc`); every clone is the same controller.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paced::{Adaptive, Rate, RateLimiter};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let limiter = RateLimiter::new(Rate::per_second(100), 10);
/// let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(100));
/// adaptive.limiter().acquire(1).await;
/// // The partner answered 429 with `Retry-After: 1`.
/// adaptive.on_throttled(Some(Duration::from_secs(1)));
/// assert_eq!(adaptive.rate(), Rate::per_second(80));
/// assert!(adaptive.limiter().try_acquire(1).is_err()); // paused for 1 s
/// # }
/// ```
#[derive(Clone)]
pub struct Adaptive {
    inner: Arc<Inner>,
}

struct Inner {
    limiter: RateLimiter,
    min: Rate,
    max: Rate,
    law: AdaptiveLaw,
    origin: Instant,
    state: Mutex<State>,
    /// The controller's handles, for every clone: replaced if it is named again.
    #[cfg(feature = "metrics")]
    metrics: crate::instrument::Named<crate::instrument::AdaptiveMetrics>,
}

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

/// A snapshot of an [`Adaptive`]'s counters and its rate.
///
/// # Examples
///
/// ```
/// use paced::{Adaptive, Rate, RateLimiter};
///
/// let limiter = RateLimiter::new(Rate::per_second(10), 1);
/// let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(10));
/// adaptive.on_success();
/// adaptive.on_throttled(None);
/// adaptive.on_throttled(None); // the same overload: no second decrease
/// let stats = adaptive.stats();
/// assert_eq!((stats.successes, stats.throttled, stats.decreases), (1, 2, 1));
/// assert_eq!(stats.rate, adaptive.rate());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdaptiveStats {
    /// Calls reported by [`on_success`](Adaptive::on_success).
    pub successes: u64,
    /// Calls reported by [`on_throttled`](Adaptive::on_throttled): refused by the destination
    /// (a `429`), not by the limiter. (Named `refusals` before 1.0.)
    pub throttled: u64,
    /// Times the rate was lowered: once per overload, however many refusals it caused.
    pub decreases: u64,
    /// The limiter's rate now.
    pub rate: Rate,
}

/// Tokens per second.
fn per_second(rate: Rate) -> f64 {
    rate.tokens() as f64 / rate.per().as_secs_f64()
}

impl Adaptive {
    /// A controller over `limiter`, setting rates within `[min, max]`; it starts from the
    /// limiter's rate, clamped into that range (and sets it if it was outside).
    ///
    /// # Panics
    ///
    /// Panics if `min` is above `max`, with the message `"Adaptive::new: {error}"`, the error
    /// being [`ConfigError::MinAboveMax`]. Use
    /// [`Adaptive::try_new`] for values from configuration. (A zero `min` cannot be built: a
    /// [`Rate`] is never zero.)
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Adaptive, Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(500), 5);
    /// let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(100));
    /// assert_eq!(adaptive.rate(), Rate::per_second(100)); // clamped
    /// ```
    #[track_caller]
    #[must_use]
    pub fn new(limiter: RateLimiter, min: Rate, max: Rate) -> Adaptive {
        match Adaptive::try_new(limiter, min, max) {
            Ok(adaptive) => adaptive,
            Err(e) => panic!("Adaptive::new: {e}"),
        }
    }

    /// A controller (see [`Adaptive::new`]), or a [`ConfigError`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::MinAboveMax`] if `min` is above `max`.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Adaptive, ConfigError, Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(10), 1);
    /// let err = Adaptive::try_new(limiter, Rate::per_second(20), Rate::per_second(10)).err();
    /// assert_eq!(err.map(|e| e.to_string()).as_deref(), Some(
    ///     "invalid adaptive range: `min` is above `max`; it must be at most `max`"
    /// ));
    /// ```
    pub fn try_new(limiter: RateLimiter, min: Rate, max: Rate) -> Result<Adaptive, ConfigError> {
        Adaptive::with_law(limiter, min, max, AdaptiveLaw::Cubic)
    }

    /// A controller with another control law (feature `unstable-laws`, outside semver), for
    /// the benchmark that compares them.
    ///
    /// # Errors
    ///
    /// [`ConfigError::MinAboveMax`] if `min` is above `max`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(feature = "unstable-laws")] {
    /// use paced::{Adaptive, AdaptiveLaw, Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(10), 2);
    /// let law = AdaptiveLaw::AwsCubic;
    /// assert!(Adaptive::try_with_law(limiter, Rate::per_second(1), Rate::per_second(10), law).is_ok());
    /// # }
    /// ```
    #[cfg(feature = "unstable-laws")]
    #[cfg_attr(docsrs, doc(cfg(feature = "unstable-laws")))]
    pub fn try_with_law(
        limiter: RateLimiter,
        min: Rate,
        max: Rate,
        law: AdaptiveLaw,
    ) -> Result<Adaptive, ConfigError> {
        Adaptive::with_law(limiter, min, max, law)
    }

    fn with_law(
        limiter: RateLimiter,
        min: Rate,
        max: Rate,
        law: AdaptiveLaw,
    ) -> Result<Adaptive, ConfigError> {
        if max < min {
            return Err(ConfigError::MinAboveMax);
        }
        let origin = Instant::now();
        let inner = Inner {
            limiter,
            min,
            max,
            law,
            origin,
            #[cfg(feature = "metrics")]
            metrics: crate::instrument::Named::default(),
            state: Mutex::new(State {
                set: min,
                w_max: 0.0,
                curve_start: 0.0,
                curve_paused: 0.0,
                decreased: false,
                overload_until_reports: 0,
                overload_until_secs: f64::NEG_INFINITY,
                granted_before: 0,
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
            }),
        };
        let granted_before = inner.limiter.stats().granted;
        let mut wakes = Wakes::default();
        {
            let mut state = lock(&inner.state);
            state.granted_before = granted_before;
            let start = inner.limiter.rate();
            Inner::restart(
                &inner.limiter,
                min,
                max,
                law,
                &mut state,
                start,
                0.0,
                &mut wakes,
            );
        }
        wakes.run();
        Ok(Adaptive {
            inner: Arc::new(inner),
        })
    }

    /// Reports a call that succeeded: the rate probes up along the curve.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Adaptive, Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(10), 1);
    /// let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(10));
    /// adaptive.on_success();
    /// assert_eq!(adaptive.stats().successes, 1);
    /// ```
    pub fn on_success(&self) {
        self.inner.report(false, None);
    }

    /// Reports a call refused for going too fast (`429`, `503 Slow Down`), with the
    /// destination's `Retry-After` if it sent one.
    ///
    /// The first refusal of an overload lowers the rate (see [`Adaptive`]); the refusals of
    /// the calls that were already in flight then (or already had their tokens) do not lower
    /// it again. With `Some(d)`, nothing is granted to anyone on the limiter before `d` from
    /// now ([`RateLimiter::pause_for`]); `Duration::MAX` saturates to a pause of centuries.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Adaptive, Rate, RateLimiter};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(Rate::per_second(10), 1);
    /// let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(10));
    /// let start = Instant::now();
    /// adaptive.on_throttled(Some(Duration::from_millis(1500)));
    /// adaptive.limiter().acquire(1).await;
    /// assert_eq!(start.elapsed().as_millis(), 1500);
    /// # }
    /// ```
    pub fn on_throttled(&self, retry_after: Option<Duration>) {
        self.inner.report(true, retry_after);
    }

    /// Reports a call that succeeded and announced the destination's quota: call it instead
    /// of [`on_success`](Adaptive::on_success) (it counts as a success).
    ///
    /// The rate is set to spread the quota over the time it lasts, clamped into `[min, max]`:
    ///
    /// - `(remaining + 1) / reset`: the calls left, spread over the time until the count is
    ///   restored (a fixed window of 5,000 an hour with 4,000 left and 30 minutes to go:
    ///   2.2/s), one interval apart from the call that brought the announcement, so that the
    ///   last leaves just before `reset` (`remaining` counts the calls left after that one, as
    ///   servers announce it). Paced so from the start of a window, this stays at
    ///   `limit / window`; whatever else used the quota, it is not exhausted before `reset`.
    /// - a token bucket (a policy of `limit` calls per `window` announced, and a `reset` at
    ///   least as long as the window, which a fixed window announces only as it starts: the
    ///   bucket takes that long to fill) refills at `limit / window`: the rate is the larger of that and
    ///   `remaining / reset`, since pacing at its refill rate never runs it dry, however little
    ///   is left in it. (Servers that round `reset` up to whole seconds make a bucket of less
    ///   than a second read so; a bucket whose `reset` is within its window reads as a fixed
    ///   window: safe, but slower until its level settles.)
    /// - nothing left (`remaining == 0`) and not a token bucket: the limiter grants nothing
    ///   until `reset` (a day at most), as for a `Retry-After`, and keeps its rate.
    ///
    /// **Probing is suspended** while announcements keep coming: for 2 s after each one, a
    /// success does not raise the rate above the announced one (the curve waits on its
    /// plateau). A refusal still lowers it, as in [`on_throttled`](Adaptive::on_throttled),
    /// until the next announcement sets it again. When announcements stop, probing resumes
    /// from the last announced rate, as after a start at it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Adaptive, Announced, Rate, RateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(Rate::per_second(100), 10);
    /// let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(100));
    /// // A token bucket of 600 per 60 s, drained: `RateLimit-Policy: "default";q=600;w=60`
    /// // and `RateLimit: "default";r=0;t=60`.
    /// let window = Duration::from_secs(60);
    /// adaptive.on_quota(Announced::new(0, window).with_policy(600, window));
    /// assert_eq!(adaptive.rate(), Rate::per_second(10)); // its refill rate
    /// adaptive.on_success(); // no probing above it while announcements come
    /// assert_eq!(adaptive.rate(), Rate::per_second(10));
    /// // A fixed window: 199 left after this call, 20 s to go.
    /// adaptive.on_quota(Announced::new(199, Duration::from_secs(20)).with_policy(600, window));
    /// assert_eq!(adaptive.rate(), Rate::per_second(10)); // 200 calls in 20 s
    /// # }
    /// ```
    pub fn on_quota(&self, quota: Announced) {
        let exhausted = quota.remaining == 0 && !quota.is_bucket();
        if exhausted {
            self.inner
                .limiter
                .pause_for(quota.reset.min(QUOTA_MAX_PAUSE));
        }
        let now = Instant::now()
            .saturating_duration_since(self.inner.origin)
            .as_secs_f64();
        let mut wakes = Wakes::default();
        let mut st = self.inner.lock();
        let decreases = st.decreases;
        self.inner
            .announce(&mut st, quota, exhausted, now, &mut wakes);
        self.inner.record(&st, decreases);
        drop(st);
        wakes.run();
    }

    /// Waits until `cost` tokens of the limiter are granted: [`RateLimiter::acquire`] on
    /// [`limiter`](Adaptive::limiter), at the rate the controller set.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Adaptive, Rate, RateLimiter};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(Rate::per_second(10), 1);
    /// let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(10));
    /// let start = Instant::now();
    /// adaptive.acquire(1).await;
    /// adaptive.acquire(1).await;
    /// assert_eq!(start.elapsed(), Duration::from_millis(100));
    /// # }
    /// ```
    pub async fn acquire(&self, cost: u64) {
        self.inner.limiter.acquire(cost).await;
    }

    /// Takes `cost` tokens of the limiter if they are there now and nobody waits:
    /// [`RateLimiter::try_acquire`] on [`limiter`](Adaptive::limiter).
    ///
    /// # Errors
    ///
    /// [`NotUntil`](crate::NotUntil), as [`RateLimiter::try_acquire`] says.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Adaptive, Rate, RateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(Rate::per_second(10), 1);
    /// let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(10));
    /// assert!(adaptive.try_acquire(1).is_ok());
    /// adaptive.on_throttled(Some(Duration::from_secs(1))); // the destination said: wait 1 s
    /// assert_eq!(adaptive.try_acquire(1).unwrap_err().retry_after(), Duration::from_secs(1));
    /// # }
    /// ```
    pub fn try_acquire(&self, cost: u64) -> Result<(), crate::NotUntil> {
        self.inner.limiter.try_acquire(cost)
    }

    /// Waits for `cost` tokens of the limiter only if they can be had within `timeout`:
    /// [`RateLimiter::acquire_timeout`] on [`limiter`](Adaptive::limiter).
    ///
    /// # Errors
    ///
    /// [`NotUntil`](crate::NotUntil) with how long the request would have waited.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Adaptive, Rate, RateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(Rate::per_second(10), 1);
    /// let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(10));
    /// adaptive.acquire(1).await;
    /// let refused = adaptive.acquire_timeout(1, Duration::from_millis(50)).await;
    /// assert_eq!(refused.unwrap_err().retry_after(), Duration::from_millis(100));
    /// assert!(adaptive.acquire_timeout(1, Duration::from_millis(100)).await.is_ok());
    /// # }
    /// ```
    pub async fn acquire_timeout(
        &self,
        cost: u64,
        timeout: Duration,
    ) -> Result<(), crate::NotUntil> {
        self.inner.limiter.acquire_timeout(cost, timeout).await
    }

    /// The whole tokens of the limiter that could be taken now, ignoring anyone waiting:
    /// [`RateLimiter::available`] on [`limiter`](Adaptive::limiter).
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Adaptive, Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(10), 3);
    /// let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(10));
    /// adaptive.try_acquire(1).unwrap();
    /// assert_eq!(adaptive.available(), 2);
    /// ```
    #[must_use]
    pub fn available(&self) -> u64 {
        self.inner.limiter.available()
    }

    /// The limiter's rate now.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Adaptive, Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(10), 1);
    /// let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(10));
    /// assert_eq!(adaptive.rate(), Rate::per_second(10));
    /// ```
    #[must_use]
    pub fn rate(&self) -> Rate {
        self.inner.limiter.rate()
    }

    /// The limiter the controller sets: draw on it with
    /// [`throttle_with`](crate::PaceExt::throttle_with) or `acquire`.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use paced::{Adaptive, PaceExt, Rate, RateLimiter, Shaping};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(Rate::per_second(10), 1);
    /// let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(10));
    /// let sent = futures_util::stream::iter(0..3)
    ///     .throttle_with(adaptive.limiter(), |_| 1, Shaping)
    ///     .count()
    ///     .await;
    /// assert_eq!(sent, 3);
    /// # }
    /// ```
    #[must_use]
    pub fn limiter(&self) -> &RateLimiter {
        &self.inner.limiter
    }

    /// The counters (successes, throttled, decreases) and the rate now.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Adaptive, Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(10), 1);
    /// let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(10));
    /// adaptive.on_throttled(None);
    /// assert_eq!(adaptive.stats().decreases, 1);
    /// ```
    #[must_use]
    pub fn stats(&self) -> AdaptiveStats {
        let st = self.inner.lock();
        AdaptiveStats {
            successes: st.successes,
            throttled: st.throttled,
            decreases: st.decreases,
            rate: self.inner.limiter.rate(),
        }
    }

    /// Records to the [`metrics`](https://docs.rs/metrics) facade under `name` (feature
    /// `metrics`): the controller's
    ///
    /// | metric | kind | what |
    /// | --- | --- | --- |
    /// | `paced_adaptive_rate` | gauge | the rate the controller set, in tokens per second (updated on every report: `on_success`, `on_throttled`, `on_quota`) |
    /// | `paced_adaptive_decreases_total` | counter | decreases of the rate |
    ///
    /// and the limiter's own (it is named too: see [`RateLimiter::with_metrics`]), all with the
    /// label `limiter = name`. As there, the handles are registered here, with the recorder in
    /// force, and shared by every clone; named twice, the last name given wins (for the
    /// controller and its limiter).
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Adaptive, Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(10), 1);
    /// let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(10))
    ///     .with_metrics("partner-api");
    /// adaptive.on_throttled(None); // paced_adaptive_decreases_total{limiter="partner-api"} 1
    /// assert_eq!(adaptive.stats().decreases, 1);
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    #[must_use]
    pub fn with_metrics(self, name: impl AsRef<str>) -> Self {
        let name = name.as_ref();
        self.inner.limiter.shared.set_metrics(name);
        let metrics = crate::instrument::AdaptiveMetrics::new(name);
        let st = self.inner.lock();
        metrics.rate.set(per_second(st.set));
        self.inner.metrics.replace(metrics);
        drop(st);
        self
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn report(&self, refused: bool, retry_after: Option<Duration>) {
        if let Some(d) = retry_after {
            self.limiter.pause_for(d);
        }
        let now = Instant::now()
            .saturating_duration_since(self.origin)
            .as_secs_f64();
        let mut wakes = Wakes::default();
        let mut st = self.lock();
        let decreases = st.decreases;
        self.decide(&mut st, refused, retry_after, now, &mut wakes);
        self.record(&st, decreases);
        drop(st);
        // The lock released, the limiter's head waiter re-reads its deadline.
        wakes.run();
    }

    /// Records the rate now and the decreases since there were `decreases_before` (under the
    /// lock the report was decided under, so that the gauge moves in the order of the rates).
    #[inline]
    #[allow(unused_variables)]
    fn record(&self, st: &State, decreases_before: u64) {
        #[cfg(feature = "metrics")]
        if let Some(m) = self.metrics.get() {
            m.rate.set(per_second(st.set));
            m.decreases
                .increment(st.decreases.saturating_sub(decreases_before));
        }
    }

    /// Folds one report into the state and sets the limiter's rate accordingly; the waiters
    /// a change of rate wakes are left in `wakes`.
    fn decide(
        &self,
        st: &mut State,
        refused: bool,
        retry_after: Option<Duration>,
        now: f64,
        wakes: &mut Wakes,
    ) {
        if let Some(d) = retry_after {
            note_pause(st, now, d);
        }
        st.reports += 1;
        if refused {
            st.throttled += 1;
        } else {
            st.successes += 1;
        }
        measure(self.law, st, now);
        let mut current = self.limiter.rate();
        if current != st.set {
            // Set by hand: start over from there.
            Inner::restart(
                &self.limiter,
                self.min,
                self.max,
                self.law,
                st,
                current,
                now,
                wakes,
            );
            current = st.set;
        }
        if refused {
            let same_overload =
                st.reports <= st.overload_until_reports && now < st.overload_until_secs;
            if same_overload {
                return;
            }
            self.decrease(st, current, now, wakes);
        } else if now < st.hold_until {
            // An announced quota holds the rate: no probing above it.
            self.hold(st, now);
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
                self.set(st, rate, wakes);
            }
        }
    }

    /// Folds an announced quota into the state: a success, then the announced rate, held.
    fn announce(
        &self,
        st: &mut State,
        quota: Announced,
        exhausted: bool,
        now: f64,
        wakes: &mut Wakes,
    ) {
        if exhausted {
            note_pause(st, now, quota.reset.min(QUOTA_MAX_PAUSE));
        }
        st.reports += 1;
        st.successes += 1;
        measure(self.law, st, now);
        let current = self.limiter.rate();
        if current != st.set {
            // Set by hand: start over from there.
            Inner::restart(
                &self.limiter,
                self.min,
                self.max,
                self.law,
                st,
                current,
                now,
                wakes,
            );
        }
        if !exhausted {
            self.set(st, quota.rate(), wakes);
        }
        // The curve waits on its plateau at the announced rate (or the rate kept).
        st.w_max = per_second(st.set);
        self.hold(st, now);
        st.hold_until = now + QUOTA_HOLD_SECS;
    }

    /// Keeps the curve on its plateau at `w_max` as of `now`.
    fn hold(&self, st: &mut State, now: f64) {
        st.curve_start = now - climb_secs(self.law, st.w_max);
        st.curve_paused = paused_through(st, now);
    }

    fn decrease(&self, st: &mut State, current: Rate, now: f64, wakes: &mut Wakes) {
        let current = per_second(current);
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
        let granted = self
            .limiter
            .stats()
            .granted
            .saturating_sub(st.granted_before);
        let in_flight = granted.saturating_sub(st.reports);
        let waiting = self.limiter.available();
        st.overload_until_reports = st.reports.saturating_add(in_flight).saturating_add(waiting);
        st.overload_until_secs = now + OVERLOAD_MAX_SECS;
        self.set(st, beta * reference, wakes);
    }

    /// Sets `rate` (tokens per second), clamped, if it differs from the one in force.
    fn set(&self, st: &mut State, rate: f64, wakes: &mut Wakes) {
        let rate = clamp(self.min, self.max, rate);
        // The same rate in another representation (20/s is 20,000 per 1,000 s) is no change.
        if rate != st.set {
            st.set = rate;
            wakes.defer(self.limiter.set_rate_deferred(rate));
        }
    }

    /// Starts the curve at `rate` (clamped), on its plateau: no decrease remembered.
    #[allow(clippy::too_many_arguments)]
    fn restart(
        limiter: &RateLimiter,
        min: Rate,
        max: Rate,
        law: AdaptiveLaw,
        st: &mut State,
        rate: Rate,
        now: f64,
        wakes: &mut Wakes,
    ) {
        let clamped = if rate < min {
            min
        } else if rate > max {
            max
        } else {
            rate
        };
        st.w_max = per_second(clamped);
        st.curve_start = now - climb_secs(law, st.w_max);
        st.curve_paused = paused_through(st, now);
        st.decreased = false;
        st.overload_until_secs = f64::NEG_INFINITY;
        st.set = clamped;
        if clamped != rate {
            wakes.defer(limiter.set_rate_deferred(clamped));
        }
    }
}

/// The limiter's waiters a report woke, to be woken once the controller's lock is released:
/// a change of rate wakes the limiter's head waiter to re-read its deadline, and its waker may
/// do anything, even call the controller back. The rate itself is set under the lock, so
/// that concurrent reports set their rates in the order they decided them.
#[derive(Debug, Default)]
#[must_use]
struct Wakes(Vec<After>);

impl Wakes {
    fn defer(&mut self, after: After) {
        if after.wake.is_some() {
            self.0.push(after);
        }
    }

    fn run(self) {
        for after in self.0 {
            after.run();
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

impl std::fmt::Debug for Adaptive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adaptive")
            .field("min", &self.inner.min)
            .field("max", &self.inner.max)
            .field("law", &self.inner.law)
            .finish_non_exhaustive()
    }
}
