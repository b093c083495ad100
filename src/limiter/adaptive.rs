//! `Adaptive`: a controller that finds a destination's real limit from its answers and keeps a
//! [`RateLimiter`]'s rate there: the handle, the clock, the lock and the waking. The law that
//! decides the rate is clock-free, in `core::adaptive_law`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::rate_limiter::RateLimiter;
#[cfg(feature = "metrics")]
use crate::core::adaptive_law::per_second;
#[cfg(not(feature = "unstable-laws"))]
use crate::core::adaptive_law::AdaptiveLaw;
#[cfg(feature = "unstable-laws")]
pub use crate::core::adaptive_law::AdaptiveLaw;
pub use crate::core::adaptive_law::Announced;
use crate::core::adaptive_law::{Controller, Limited, QUOTA_MAX_PAUSE};
use crate::engine::After;
use crate::error::ConfigError;
use crate::limiter::cost::sealed::AdaptiveState;
use crate::limiter::Cost;
use crate::rate::Rate;
use crate::sync::{lock, Mutex, MutexGuard};

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
/// `max(2 s, 33 calls at that rate)`: at 5,000/s in 2 s, at 5/s in 6.6 s. A fixed time at every
/// scale (AWS's constant `C = 0.4` takes 15 s at 5,000/s and 1.5 s at 5/s) keeps large rates
/// responsive; the 33 calls keep small ones from being refused more than a few per cent of the
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
/// Over a `RateLimiter<[u64; N]>` of several limits, an `Adaptive<[u64; N]>` (made by
/// [`builder`](Adaptive::builder)) adapts each limit you choose on its own, with this law:
/// a refusal that names the tokens limit lowers that limit only. Its methods are below, after
/// those of one limit.
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
pub struct Adaptive<C: Cost = u64> {
    pub(crate) inner: C::Adaptive,
}

/// Shows the controller's range and law (for several limits, the limiter and each adapted
/// limit's range): its rates are read with [`rate`](Adaptive::rate) and
/// [`stats`](Adaptive::stats).
impl<C: Cost> std::fmt::Debug for Adaptive<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl<C: Cost> Clone for Adaptive<C> {
    fn clone(&self) -> Self {
        Adaptive {
            inner: self.inner.clone(),
        }
    }
}

/// An [`Adaptive`]'s state for one limit: public in a private module (see [`Cost`]).
#[derive(Clone)]
pub struct One {
    pub(crate) shared: Arc<Inner>,
}

pub(crate) struct Inner {
    limiter: RateLimiter,
    origin: Instant,
    state: Mutex<Controller>,
    /// The controller's handles, for every clone: replaced if it is named again.
    #[cfg(feature = "metrics")]
    metrics: crate::instrument::Named<crate::instrument::AdaptiveMetrics>,
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
    /// use paced::{Adaptive, Rate, RateLimiter};
    /// use paced::limiter::AdaptiveLaw;
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
        let mut wakes = Wakes::default();
        let controller = Controller::new(
            law,
            min,
            max,
            &mut Bound {
                limiter: &limiter,
                wakes: &mut wakes,
            },
        );
        wakes.run();
        Ok(Adaptive {
            inner: One {
                shared: Arc::new(Inner {
                    limiter,
                    origin: Instant::now(),
                    state: Mutex::new(controller),
                    #[cfg(feature = "metrics")]
                    metrics: crate::instrument::Named::default(),
                }),
            },
        })
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
    /// use paced::{Adaptive, Rate, RateLimiter};
    /// use paced::limiter::Announced;
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
                .shared
                .limiter
                .pause_for(quota.reset.min(QUOTA_MAX_PAUSE));
        }
        let now = Instant::now()
            .saturating_duration_since(self.inner.shared.origin)
            .as_secs_f64();
        let mut wakes = Wakes::default();
        let mut st = self.inner.shared.lock();
        let decreases = st.counts().2;
        st.announce(
            &mut Bound {
                limiter: &self.inner.shared.limiter,
                wakes: &mut wakes,
            },
            quota,
            exhausted,
            now,
        );
        self.inner.shared.record(&st, decreases);
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
        self.inner.shared.limiter.acquire(cost).await;
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
        self.inner.shared.limiter.try_acquire(cost)
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
        self.inner
            .shared
            .limiter
            .acquire_timeout(cost, timeout)
            .await
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
        self.inner.shared.limiter.available()
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
        self.inner.shared.limiter.rate()
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
        &self.inner.shared.limiter
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
        let (successes, throttled, decreases) = self.inner.shared.lock().counts();
        AdaptiveStats {
            successes,
            throttled,
            decreases,
            rate: self.inner.shared.limiter.rate(),
        }
    }
}

/// What every adaptive limiter does, whatever its cost: one limit or several.
impl<C: Cost> Adaptive<C> {
    /// Reports a call that succeeded: the rate probes up along the curve. With several
    /// limits, every adapted limit does (held where a recent announcement set it).
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
        self.inner.on_success();
    }

    /// Reports a call refused for going too fast (`429`, `503 Slow Down`), with the
    /// destination's `Retry-After` if it sent one.
    ///
    /// The first refusal of an overload lowers the rate (see [`Adaptive`]). With several limits,
    /// every adapted limit is lowered (for a refusal that names its limit, use
    /// [`on_throttled_limit`](Adaptive::on_throttled_limit)). The refusals of the calls that were
    /// already in flight then (or already had their tokens) do not lower it again. With `Some(d)`,
    /// nothing is granted to anyone on the limiter before `d` from now
    /// ([`RateLimiter::pause_for`]); `Duration::MAX` saturates to a pause of centuries.
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
        self.inner.on_throttled(retry_after);
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
    /// controller and its limiter). With several limits, each adapted limit has its own
    /// `paced_adaptive_rate` and `paced_adaptive_decreases_total`, with the label `limit`, its
    /// index (`"0"`, `"1"`, ...).
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
        self.inner.set_metrics(name.as_ref());
        self
    }
}

impl AdaptiveState for One {
    fn on_success(&self) {
        self.shared.report(false, None);
    }
    fn on_throttled(&self, retry_after: Option<Duration>) {
        self.shared.report(true, retry_after);
    }
    #[cfg(feature = "metrics")]
    fn set_metrics(&self, name: &str) {
        self.shared.limiter.inner.shared.set_metrics(name);
        let metrics = crate::instrument::AdaptiveMetrics::new(name);
        let st = self.shared.lock();
        metrics.rate.set(per_second(st.rate()));
        self.shared.metrics.replace(metrics, |_| {});
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Controller> {
        lock(&self.state)
    }

    /// Seconds since the controller was made: the law's clock.
    fn now(&self) -> f64 {
        Instant::now()
            .saturating_duration_since(self.origin)
            .as_secs_f64()
    }

    fn report(&self, refused: bool, retry_after: Option<Duration>) {
        if let Some(d) = retry_after {
            self.limiter.pause_for(d);
        }
        let now = self.now();
        let mut wakes = Wakes::default();
        let mut st = self.lock();
        let decreases = st.counts().2;
        st.report(
            &mut Bound {
                limiter: &self.limiter,
                wakes: &mut wakes,
            },
            refused,
            retry_after,
            now,
        );
        self.record(&st, decreases);
        drop(st);
        // The lock released, the limiter's head waiter re-reads its deadline.
        wakes.run();
    }

    /// Records the rate now and the decreases since there were `decreases_before` (under the
    /// lock the report was decided under, so that the gauge moves in the order of the rates).
    #[inline]
    #[allow(unused_variables, clippy::unused_self)]
    fn record(&self, st: &Controller, decreases_before: u64) {
        #[cfg(feature = "metrics")]
        if let Some(m) = self.metrics.get() {
            m.rate.set(per_second(st.rate()));
            m.decreases
                .increment(st.counts().2.saturating_sub(decreases_before));
        }
    }
}

/// The limiter as the law sees it: the rates it sets wake the limiter's waiters only once the
/// controller's lock is released.
struct Bound<'a> {
    limiter: &'a RateLimiter,
    wakes: &'a mut Wakes,
}

impl Limited for Bound<'_> {
    fn rate(&self) -> Rate {
        self.limiter.rate()
    }
    fn granted(&self) -> u64 {
        self.limiter.stats().granted
    }
    fn available(&self) -> u64 {
        self.limiter.available()
    }
    fn set_rate(&mut self, rate: Rate) {
        self.wakes.defer(self.limiter.set_rate_deferred(rate));
    }
}

/// The limiter's waiters a report woke, to be woken once the controller's lock is released:
/// a change of rate wakes the limiter's head waiter to re-read its deadline, and its waker may
/// do anything, even call the controller back. The rate itself is set under the lock, so
/// that concurrent reports set their rates in the order they decided them.
#[derive(Debug, Default)]
#[must_use]
pub(super) struct Wakes(Vec<After>);

impl Wakes {
    pub(super) fn defer(&mut self, after: After) {
        if after.wake.is_some() {
            self.0.push(after);
        }
    }

    pub(super) fn run(self) {
        for after in self.0 {
            after.run();
        }
    }
}

impl std::fmt::Debug for One {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.lock();
        let (min, max) = st.range();
        f.debug_struct("Adaptive")
            .field("min", &min)
            .field("max", &max)
            .field("law", &st.law())
            .finish_non_exhaustive()
    }
}
