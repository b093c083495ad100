//! `RateLimiter`: one token bucket (or Guava warm-up curve) shared by many tasks and streams.

use std::future::poll_fn;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use crate::core::{Bucket, Nanos, Pace, WarmingUp};
use crate::engine::{After, Shared, Waiter};
use crate::error::{ConfigError, NotUntil};
use crate::limiter::cost::sealed::State;
use crate::limiter::Cost;
use crate::rate::Rate;
use crate::stats::Stats;

/// The rule behind a [`RateLimiter`]: its curve, the rate it was given, and a pause.
#[derive(Clone, Debug)]
pub(crate) struct Limit {
    pub(crate) curve: Curve,
    rate: Rate,
    /// Nothing is granted before this time ([`RateLimiter::pause_for`]).
    paused_until: Nanos,
}

#[derive(Clone, Debug)]
pub(crate) enum Curve {
    Bucket(Bucket),
    WarmingUp(WarmingUp),
}

impl Limit {
    fn new(curve: Curve, rate: Rate) -> Limit {
        Limit {
            curve,
            rate,
            paused_until: Nanos::ZERO,
        }
    }

    /// Whether a pause keeps everything back at `now`.
    pub(crate) fn is_paused(&self, now: Nanos) -> bool {
        now < self.paused_until
    }
}

impl Pace for Limit {
    type Cost = u64;
    fn earliest(&self, since: Nanos, cost: u64) -> Nanos {
        let at = match &self.curve {
            Curve::Bucket(b) => Pace::earliest(b, since, cost),
            Curve::WarmingUp(w) => Pace::earliest(w, since, cost),
        };
        at.max(self.paused_until)
    }
    fn commit(&mut self, now: Nanos, since: Nanos, cost: u64) {
        match &mut self.curve {
            Curve::Bucket(b) => Pace::commit(b, now, since, cost),
            Curve::WarmingUp(w) => Pace::commit(w, now, since, cost),
        }
    }
    fn needs_wait(&self, cost: u64) -> bool {
        match &self.curve {
            Curve::Bucket(b) => Pace::needs_wait(b, cost),
            Curve::WarmingUp(w) => Pace::needs_wait(w, cost),
        }
    }
    fn absorbs(&self, cost: u64, late: Nanos) -> bool {
        match &self.curve {
            Curve::Bucket(b) => Pace::absorbs(b, cost, late),
            Curve::WarmingUp(w) => Pace::absorbs(w, cost, late),
        }
    }
    fn same(&self, other: &Self) -> bool {
        let curve = match (&self.curve, &other.curve) {
            (Curve::Bucket(a), Curve::Bucket(b)) => Pace::same(a, b),
            (Curve::WarmingUp(a), Curve::WarmingUp(b)) => Pace::same(a, b),
            _ => false,
        };
        curve && self.paused_until == other.paused_until && self.rate == other.rate
    }
    fn plain_bucket(&self, now: Nanos) -> Option<&Bucket> {
        match &self.curve {
            Curve::Bucket(b) if !self.is_paused(now) => Some(b),
            _ => None,
        }
    }
    fn bucket_mut(&mut self) -> Option<&mut Bucket> {
        match &mut self.curve {
            Curve::Bucket(b) => Some(b),
            Curve::WarmingUp(_) => None,
        }
    }
}

/// A token bucket shared by handle: any number of tasks and streams draw on one quota.
///
/// The bucket holds at most `burst` tokens, starts full and refills at `rate`, with the same
/// exact arithmetic and meaning as [`throttle`](crate::PaceExt::throttle): in any window
/// `[t, t + w]` the tokens granted (when no request exceeds `burst`) are at most
/// `burst + w * rate`.
///
/// - **Fair.** Waiters are served in arrival order; a large request is not overtaken by a
///   stream of small ones, and [`try_acquire`](RateLimiter::try_acquire) never jumps the queue.
/// - **Charged at the grant.** A request takes its tokens when it is granted, so a waiter that
///   is dropped (a cancelled future, a dropped stream) has taken nothing: the others do not
///   pay for it.
/// - **No thundering herd.** Only the head of the queue sleeps on a timer; a grant wakes exactly
///   the next waiter.
/// - **Changeable.** [`set_rate`](RateLimiter::set_rate),
///   [`set_burst`](RateLimiter::set_burst) and [`set_limit`](RateLimiter::set_limit) (both at
///   once) take effect at once, also for those waiting.
///
/// Cloning is cheap (an `Arc`); every clone is the same limiter. Building one needs no runtime;
/// waiting needs tokio's timer, and under paused time the schedule is exact.
///
/// With a cost of `[u64; N]`, a `RateLimiter<[u64; N]>` (made by
/// [`builder`](RateLimiter::builder)) holds several limits at once: requests AND tokens per
/// minute, say. A request waits until every limit has room, and its grant returns a
/// [`Permit`](crate::limiter::Permit) to settle once the real cost is known. Its methods are
/// below, after those of one limit.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paced::{Rate, RateLimiter};
/// use tokio::time::Instant;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // Ten tasks share 2 requests per second, 2 at once.
/// let limiter = RateLimiter::new(Rate::per_second(2), 2);
/// let start = Instant::now();
/// let tasks: Vec<_> = (0..10)
///     .map(|_| {
///         let limiter = limiter.clone();
///         tokio::spawn(async move {
///             limiter.acquire(1).await;
///             start.elapsed()
///         })
///     })
///     .collect();
/// let mut last = Duration::ZERO;
/// for task in tasks {
///     last = last.max(task.await.unwrap());
/// }
/// assert_eq!(last, Duration::from_secs(4));
/// # }
/// ```
pub struct RateLimiter<C: Cost = u64> {
    pub(crate) inner: C::Local,
}

/// Shows the limiter's identity (clones show the same) and the names of its dimensions: its
/// levels are shared state, read with [`available`](RateLimiter::available) and
/// [`stats`](RateLimiter::stats).
impl<C: Cost> std::fmt::Debug for RateLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl<C: Cost> Clone for RateLimiter<C> {
    fn clone(&self) -> Self {
        RateLimiter {
            inner: self.inner.clone(),
        }
    }
}

/// A [`RateLimiter`]'s state for one limit: public in a private module (see [`Cost`]).
#[derive(Clone)]
pub struct One {
    pub(crate) shared: Arc<Shared<Limit>>,
}

impl RateLimiter {
    /// A limiter of `burst` tokens refilled at `rate`, starting full.
    ///
    /// # Panics
    ///
    /// Panics if `burst` is 0, with the message `"RateLimiter::new: {error}"` (the
    /// [`ConfigError`]). Use [`RateLimiter::try_new`] for values from configuration.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(100), 10);
    /// assert_eq!(limiter.available(), 10);
    /// ```
    #[track_caller]
    #[must_use]
    pub fn new(rate: Rate, burst: u64) -> RateLimiter {
        match RateLimiter::try_new(rate, burst) {
            Ok(limiter) => limiter,
            Err(e) => panic!("RateLimiter::new: {e}"),
        }
    }

    /// A limiter of `burst` tokens refilled at `rate`, or a [`ConfigError`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroBurst`] if `burst` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{ConfigError, Rate, RateLimiter};
    ///
    /// assert!(RateLimiter::try_new(Rate::per_second(1), 1).is_ok());
    /// assert_eq!(RateLimiter::try_new(Rate::per_second(1), 0).err(), Some(ConfigError::ZeroBurst));
    /// ```
    pub fn try_new(rate: Rate, burst: u64) -> Result<RateLimiter, ConfigError> {
        if burst == 0 {
            return Err(ConfigError::ZeroBurst);
        }
        let bucket = Bucket::new(rate.tokens(), rate.per().as_nanos(), burst);
        Ok(RateLimiter::from_limit(Limit::new(
            Curve::Bucket(bucket),
            rate,
        )))
    }

    /// A limiter that warms up after an idle spell, following Guava's `SmoothWarmingUp`.
    ///
    /// Once warm it grants `rate`. From cold, the interval between permits starts at
    /// `cold_factor` times the stable interval (`rate.per() / rate.tokens()`) and falls linearly
    /// to it as stored permits are spent; the warm-up takes `warmup` longer than the same
    /// permits at the stable rate. An idle limiter cools down over `warmup`. As in Guava, a
    /// request waits for the previous one's price to be paid: the first request after an idle
    /// spell goes at once, whatever it costs, and the next one pays for it. With 2 permits/s,
    /// a 4 s warm-up and a cold factor of 3, eight acquisitions from cold wait 0, 1.375, 1.125,
    /// 0.875, 0.625, 0.5, 0.5 and 0.5 s.
    ///
    /// The curve is computed in `f64`, as Guava computes it in `double`; a warming-up limiter
    /// has no `burst` (its stored permits play that part), so
    /// [`set_burst`](RateLimiter::set_burst) does not apply to it.
    ///
    /// # Panics
    ///
    /// Panics if `warmup` is zero or `cold_factor` is not a finite number of at least 1, with
    /// the message `"RateLimiter::warming_up: {error}"` (the [`ConfigError`]). Use
    /// [`RateLimiter::try_warming_up`] for values from configuration.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Rate, RateLimiter};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::warming_up(Rate::per_second(2), Duration::from_secs(4), 3.0);
    /// let mut waits = Vec::new();
    /// for _ in 0..8 {
    ///     let start = Instant::now();
    ///     limiter.acquire(1).await;
    ///     waits.push(start.elapsed().as_millis());
    /// }
    /// assert_eq!(waits, [0, 1375, 1125, 875, 625, 500, 500, 500]);
    /// # }
    /// ```
    #[track_caller]
    #[must_use]
    pub fn warming_up(rate: Rate, warmup: Duration, cold_factor: f64) -> RateLimiter {
        match RateLimiter::try_warming_up(rate, warmup, cold_factor) {
            Ok(limiter) => limiter,
            Err(e) => panic!("RateLimiter::warming_up: {e}"),
        }
    }

    /// A warming-up limiter (see [`RateLimiter::warming_up`]), or a [`ConfigError`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroWarmup`] if `warmup` is zero, [`ConfigError::ColdFactor`] if
    /// `cold_factor` is not finite or below 1.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{ConfigError, Rate, RateLimiter};
    ///
    /// let rate = Rate::per_second(2);
    /// assert!(RateLimiter::try_warming_up(rate, Duration::from_secs(4), 3.0).is_ok());
    /// let err = RateLimiter::try_warming_up(rate, Duration::from_secs(4), 0.5).err();
    /// assert_eq!(err, Some(ConfigError::ColdFactor));
    /// ```
    pub fn try_warming_up(
        rate: Rate,
        warmup: Duration,
        cold_factor: f64,
    ) -> Result<RateLimiter, ConfigError> {
        if warmup.is_zero() {
            return Err(ConfigError::ZeroWarmup);
        }
        if !(cold_factor.is_finite() && cold_factor >= 1.0) {
            return Err(ConfigError::ColdFactor);
        }
        let curve = WarmingUp::new(
            rate.tokens(),
            rate.per().as_nanos(),
            Nanos::from_duration(warmup),
            cold_factor,
        );
        Ok(RateLimiter::from_limit(Limit::new(
            Curve::WarmingUp(curve),
            rate,
        )))
    }

    fn from_limit(limit: Limit) -> RateLimiter {
        RateLimiter {
            inner: One {
                shared: Arc::new(Shared::new(limit)),
            },
        }
    }

    /// Waits until `cost` tokens are granted, in arrival order.
    ///
    /// A cost above `burst` is allowed and pays its debt, as in shaping
    /// [`throttle`](crate::PaceExt::throttle): it waits until the bucket is full and the rest
    /// has flowed in, then leaves it empty. A cost of 0 passes at once. Dropping the future
    /// gives its place in the queue to the next waiter; it has taken nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Rate, RateLimiter};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(Rate::per_second(10), 5);
    /// let start = Instant::now();
    /// limiter.acquire(5).await; // the full bucket
    /// limiter.acquire(10).await; // twice the bucket: waits for 10 tokens' worth
    /// assert_eq!(start.elapsed().as_millis(), 1000);
    /// # }
    /// ```
    pub async fn acquire(&self, cost: u64) {
        let mut waiter = pin!(Waiter::new(&*self.inner.shared));
        // Without a timeout a request is never refused.
        let _ = poll_fn(|cx| waiter.as_mut().poll_acquire(cx, cost, None)).await;
    }

    /// Takes `cost` tokens if they are there now and nobody is waiting; never waits.
    ///
    /// # Errors
    ///
    /// [`NotUntil`], with how long until the request could be granted (after those already
    /// waiting); `Duration::MAX` for a cost above `burst`, which can only be had by waiting.
    /// A refused request takes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(4), 1);
    /// assert!(limiter.try_acquire(1).is_ok());
    /// let refused = limiter.try_acquire(1).unwrap_err();
    /// assert!(refused.retry_after() <= Duration::from_millis(250));
    /// ```
    pub fn try_acquire(&self, cost: u64) -> Result<(), NotUntil> {
        self.inner.shared.try_acquire(cost)
    }

    /// Waits for `cost` tokens only if they can be had within `timeout` (after those already
    /// waiting); otherwise returns at once, taking nothing (Guava's
    /// `tryAcquire(permits, timeout)`).
    ///
    /// The decision is made on arrival from the current rate; lowering the rate afterwards
    /// can make an accepted request wait longer.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] with how long the request would have waited.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Rate, RateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(Rate::per_second(1), 1);
    /// limiter.acquire(1).await;
    /// let refused = limiter.acquire_timeout(1, Duration::from_millis(500)).await;
    /// assert_eq!(refused.unwrap_err().retry_after(), Duration::from_secs(1));
    /// assert!(limiter.acquire_timeout(1, Duration::from_secs(1)).await.is_ok());
    /// # }
    /// ```
    pub async fn acquire_timeout(&self, cost: u64, timeout: Duration) -> Result<(), NotUntil> {
        let mut waiter = pin!(Waiter::new(&*self.inner.shared));
        poll_fn(|cx| waiter.as_mut().poll_acquire(cx, cost, Some(timeout))).await
    }

    /// The whole tokens that could be taken now, ignoring anyone waiting.
    ///
    /// For a warming-up limiter: the permits that could be granted without waiting (at
    /// least one once the previous price is paid, since a request then goes at once).
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(1), 3);
    /// limiter.try_acquire(2).unwrap();
    /// assert_eq!(limiter.available(), 1);
    /// ```
    #[must_use]
    pub fn available(&self) -> u64 {
        self.inner.shared.read(|limit, now| {
            if limit.is_paused(now) {
                return 0;
            }
            match &limit.curve {
                Curve::Bucket(b) => b.available(now),
                Curve::WarmingUp(w) => w.available(now),
            }
        })
    }

    /// Refills at `rate` from now on. The current level, counted in tokens (what the bucket
    /// holds, or what a waiting request still lacks), is kept, and the new rate applies to the
    /// rest: at 1/s with one token missing, raising the rate to 100/s after 0.1 s serves the
    /// waiter 9 ms later. Waiters re-read their deadline at once.
    ///
    /// On a warming-up limiter this is Guava's `setRate`: the idle time so far is stored at
    /// the old rate, then the curve is rebuilt for the new one, keeping the stored permits'
    /// share of the maximum.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Rate, RateLimiter};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(Rate::per_second(1), 1);
    /// limiter.acquire(1).await;
    /// let start = Instant::now();
    /// let waiter = tokio::spawn({
    ///     let limiter = limiter.clone();
    ///     async move { limiter.acquire(1).await }
    /// });
    /// tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    /// limiter.set_rate(Rate::per_second(100));
    /// waiter.await.unwrap();
    /// assert_eq!(start.elapsed().as_millis(), 109);
    /// # }
    /// ```
    pub fn set_rate(&self, rate: Rate) {
        self.set_rate_deferred(rate).run();
    }

    /// [`RateLimiter::set_rate`], leaving the head waiter for the caller to wake (with
    /// [`After::run`]) once it has released a lock of its own.
    pub(crate) fn set_rate_deferred(&self, rate: Rate) -> After {
        let ((), wake) = self.inner.shared.update_deferred(|limit, now| {
            let (tokens, per) = (rate.tokens(), rate.per().as_nanos());
            match &mut limit.curve {
                Curve::Bucket(b) => b.set_rate(now, tokens, per),
                Curve::WarmingUp(w) => w.set_rate(now, tokens, per),
            }
            limit.rate = rate;
        });
        wake
    }

    /// Holds at most `burst` tokens from now on, keeping the current level (capped at the new
    /// `burst`). Waiters re-read their deadline at once.
    ///
    /// # Panics
    ///
    /// Panics if `burst` is 0, or if the limiter is warming up (it has no burst), with the
    /// message `"RateLimiter::set_burst: {error}"` (the [`ConfigError`]). Use
    /// [`try_set_burst`](RateLimiter::try_set_burst) for values from configuration.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(1), 2);
    /// limiter.set_burst(5);
    /// assert_eq!(limiter.available(), 2); // the level is kept
    /// ```
    #[track_caller]
    pub fn set_burst(&self, burst: u64) {
        ConfigError::or_panic(self.try_set_burst(burst), "RateLimiter::set_burst");
    }

    /// Holds at most `burst` tokens from now on, as [`set_burst`](RateLimiter::set_burst)
    /// does, or refuses a burst that cannot be and changes nothing.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroBurst`] if `burst` is 0; [`ConfigError::NoBurst`] if the limiter is
    /// warming up: its stored permits play the part of a burst, and are set by its warm-up.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{ConfigError, Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(1), 2);
    /// assert_eq!(limiter.try_set_burst(0), Err(ConfigError::ZeroBurst));
    /// assert_eq!(limiter.try_set_burst(4), Ok(()));
    /// assert_eq!(limiter.burst(), Some(4));
    ///
    /// let warming = RateLimiter::warming_up(Rate::per_second(5), Duration::from_secs(2), 3.0);
    /// assert_eq!(warming.try_set_burst(4), Err(ConfigError::NoBurst));
    /// ```
    pub fn try_set_burst(&self, burst: u64) -> Result<(), ConfigError> {
        self.try_set_bucket(burst, |b, _, now| b.set_burst(now, burst))
    }

    /// Runs `set` on the bucket (and the rate in force) under the lock, at the lock's `now`,
    /// once `burst` (the burst it sets) is known to be one: the refusals of
    /// [`try_set_burst`](RateLimiter::try_set_burst) and
    /// [`try_set_limit`](RateLimiter::try_set_limit), in their order, before anything changes.
    fn try_set_bucket(
        &self,
        burst: u64,
        set: impl FnOnce(&mut Bucket, &mut Rate, Nanos),
    ) -> Result<(), ConfigError> {
        if burst == 0 {
            return Err(ConfigError::ZeroBurst);
        }
        self.inner
            .shared
            .update(|limit, now| match &mut limit.curve {
                Curve::Bucket(b) => {
                    set(b, &mut limit.rate, now);
                    Ok(())
                }
                Curve::WarmingUp(_) => Err(ConfigError::NoBurst),
            })
    }

    /// Refills at `rate` and holds at most `burst` tokens from now on: [`set_rate`] and
    /// [`set_burst`] in one step, under one lock, so that no request is decided between the
    /// two. The level is kept (capped at the new `burst`); waiters re-read their deadline at
    /// once.
    ///
    /// [`set_rate`]: RateLimiter::set_rate
    /// [`set_burst`]: RateLimiter::set_burst
    ///
    /// # Panics
    ///
    /// Panics if `burst` is 0, or if the limiter is warming up (it has no burst), with the
    /// message `"RateLimiter::set_limit: {error}"` (the [`ConfigError`]). Use
    /// [`try_set_limit`](RateLimiter::try_set_limit) for values from configuration.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Rate, RateLimiter};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(Rate::per_second(1), 1);
    /// limiter.set_limit(Rate::per_second(10), 5);
    /// assert_eq!((limiter.rate(), limiter.burst()), (Rate::per_second(10), Some(5)));
    /// let start = Instant::now();
    /// limiter.acquire(1).await; // the token it held
    /// limiter.acquire(1).await; // then one per 100 ms
    /// assert_eq!(start.elapsed(), Duration::from_millis(100));
    /// # }
    /// ```
    #[track_caller]
    pub fn set_limit(&self, rate: Rate, burst: u64) {
        ConfigError::or_panic(self.try_set_limit(rate, burst), "RateLimiter::set_limit");
    }

    /// Refills at `rate` and holds at most `burst` tokens from now on, as
    /// [`set_limit`](RateLimiter::set_limit) does, or refuses a limit that cannot be and
    /// changes nothing.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroBurst`] if `burst` is 0; [`ConfigError::NoBurst`] if the limiter is
    /// warming up (use [`set_rate`](RateLimiter::set_rate)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{ConfigError, Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(1), 2);
    /// assert_eq!(limiter.try_set_limit(Rate::per_second(5), 0), Err(ConfigError::ZeroBurst));
    /// assert_eq!(limiter.rate(), Rate::per_second(1)); // unchanged
    /// assert_eq!(limiter.try_set_limit(Rate::per_second(5), 4), Ok(()));
    /// assert_eq!((limiter.rate(), limiter.burst()), (Rate::per_second(5), Some(4)));
    ///
    /// let warming = RateLimiter::warming_up(Rate::per_second(5), Duration::from_secs(2), 3.0);
    /// let refused = warming.try_set_limit(Rate::per_second(1), 4);
    /// assert_eq!(refused, Err(ConfigError::NoBurst));
    /// assert_eq!(warming.rate(), Rate::per_second(5));
    /// ```
    pub fn try_set_limit(&self, rate: Rate, burst: u64) -> Result<(), ConfigError> {
        self.try_set_bucket(burst, |b, in_force, now| {
            b.set_rate(now, rate.tokens(), rate.per().as_nanos());
            b.set_burst(now, burst);
            *in_force = rate;
        })
    }

    /// The rate in force now: the one given to [`new`](RateLimiter::new) or
    /// [`warming_up`](RateLimiter::warming_up), or to the last [`set_rate`](RateLimiter::set_rate).
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(10), 5);
    /// limiter.set_rate(Rate::per_second(20));
    /// assert_eq!(limiter.rate(), Rate::per_second(20));
    /// ```
    #[must_use]
    pub fn rate(&self) -> Rate {
        self.inner.shared.read(|limit, _| limit.rate)
    }

    /// The burst in force now: the most tokens the bucket holds; `None` for a warming-up
    /// limiter, which has no burst (its stored permits play that part, see
    /// [`warming_up`](RateLimiter::warming_up)). An `Option` rather than a separate type, so
    /// that one handle serves both kinds of limiter wherever a `RateLimiter` is taken
    /// (`throttle_with`, `Adaptive`, the tower layer).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(10), 5);
    /// limiter.set_burst(2);
    /// assert_eq!(limiter.burst(), Some(2));
    /// let warming = RateLimiter::warming_up(Rate::per_second(5), Duration::from_secs(2), 3.0);
    /// assert_eq!(warming.burst(), None);
    /// ```
    #[must_use]
    pub fn burst(&self) -> Option<u64> {
        self.inner.shared.read(|limit, _| match &limit.curve {
            Curve::Bucket(b) => Some(b.burst()),
            Curve::WarmingUp(_) => None,
        })
    }

    /// The bucket as quota headers describe it now; `None` for a warming-up limiter, which
    /// has no burst. While paused, nothing remains and the reset is no earlier than the pause's
    /// end.
    #[cfg(feature = "http")]
    pub(crate) fn limit_state(&self) -> Option<crate::stats::LimitState> {
        self.inner.shared.read(|limit, now| match &limit.curve {
            Curve::Bucket(b) => {
                let mut state = crate::stats::LimitState::of(b, limit.rate, now);
                if limit.is_paused(now) {
                    state.remaining = 0;
                    let pause = limit.paused_until.saturating_sub(now).to_duration();
                    state.reset = state.reset.max(pause);
                }
                Some(state)
            }
            Curve::WarmingUp(_) => None,
        })
    }
}

impl std::fmt::Debug for One {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("id", &Arc::as_ptr(&self.shared))
            .finish_non_exhaustive()
    }
}

/// What every limiter does, whatever its cost: one limit or several.
impl<C: Cost> RateLimiter<C> {
    /// Grants nothing, to anyone, before `d` from now: what a server's `Retry-After` asks for.
    ///
    /// Every limit of the limiter is paused. Waiters keep their places and their order and are
    /// served from the end of the pause on, as the limits allow;
    /// [`try_acquire`](RateLimiter::try_acquire) is refused meanwhile with the time left. The
    /// buckets keep refilling during the pause (a pause takes no tokens). A later pause that ends sooner does not shorten this one; one that ends later
    /// extends it. A `d` too large to represent is a pause of about 584 years, never a panic.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Rate, RateLimiter};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(Rate::per_second(100), 10);
    /// let start = Instant::now();
    /// limiter.pause_for(Duration::from_secs(2));
    /// limiter.pause_for(Duration::from_secs(1)); // does not shorten the first
    /// assert!(limiter.try_acquire(1).is_err());
    /// limiter.acquire(1).await;
    /// assert_eq!(start.elapsed(), Duration::from_secs(2));
    /// # }
    /// ```
    pub fn pause_for(&self, d: Duration) {
        self.inner.pause_for(d);
    }

    /// A snapshot of the limiter's counters: granted, rejected, waiting now, total wait.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(1), 1);
    /// limiter.try_acquire(1).unwrap();
    /// assert_eq!(limiter.stats().granted, 1);
    /// ```
    #[must_use]
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// Records to the [`metrics`](https://docs.rs/metrics) facade under `name` (feature
    /// `metrics`):
    ///
    /// | metric | kind | what |
    /// | --- | --- | --- |
    /// | `paced_grants_total` | counter | requests granted |
    /// | `paced_tokens_granted_total` | counter | tokens (cost) granted |
    /// | `paced_refusals_total` | counter | requests refused (`try_acquire`, timeouts, enforcing) |
    /// | `paced_cancellations_total` | counter | waiters dropped before their grant |
    /// | `paced_wait_seconds` | histogram | time a granted request spent queued (0 if none) |
    /// | `paced_waiters` | gauge | requests queued now |
    ///
    /// Every metric carries the label `limiter = name`. The handles are registered once, here,
    /// with the recorder in force (install the recorder first), and kept in the state every
    /// clone shares: the name applies to every handle of the limiter, those cloned before the
    /// call too, and recording an event is one call on a handle. With several limits, a
    /// grant's `paced_tokens_granted_total` is its cost summed over the dimensions. Named twice
    /// (on any handle), the last name given wins: the handles of the earlier name stop recording (its
    /// `paced_waiters` gauge is set to 0) and those of the new one start. Without a name, the
    /// cost is one branch per event. See the [guide](crate::guide#metrics).
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Rate, RateLimiter};
    ///
    /// // With a recorder installed (e.g. metrics-exporter-prometheus), the grants below
    /// // appear as `paced_grants_total{limiter="partner-api"} 2`.
    /// let limiter = RateLimiter::new(Rate::per_second(10), 2).with_metrics("partner-api");
    /// let clone = limiter.clone();
    /// limiter.try_acquire(1).unwrap();
    /// clone.try_acquire(1).unwrap(); // recorded too: the name is shared state
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    #[must_use]
    pub fn with_metrics(self, name: impl AsRef<str>) -> Self {
        self.inner.set_metrics(name.as_ref());
        self
    }
}

impl State for One {
    fn pause_for(&self, d: Duration) {
        self.shared.update(|limit, now| {
            let until = now.saturating_add(Nanos::from_duration(d));
            limit.paused_until = limit.paused_until.max(until);
        });
    }
    fn stats(&self) -> Stats {
        self.shared.stats()
    }
    #[cfg(feature = "metrics")]
    fn set_metrics(&self, name: &str) {
        self.shared.set_metrics(name);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::engine::lane::testing::{ops, replay};

    proptest! {
        /// The waiter queue's projection (how long a refused request would wait behind it)
        /// is the walk down the queue, with pauses and changes of rate and burst, for either
        /// curve.
        #[test]
        fn the_queue_projection_is_the_walk(
            warm in any::<bool>(),
            tokens in 1u64..4,
            per in 100u64..5_000,
            burst in 1u64..5,
            ops in ops(6, 3_000),
        ) {
            let curve = if warm {
                Curve::WarmingUp(WarmingUp::new(tokens, u128::from(per), Nanos(10_000), 3.0))
            } else {
                Curve::Bucket(Bucket::new(tokens, u128::from(per), burst))
            };
            let rate = Rate::new(tokens, Duration::from_nanos(per));
            replay(Limit::new(curve, rate), &ops, 6, |limit, now, seed| match seed % 3 {
                0 => {
                    let until = now.saturating_add(Nanos((seed >> 8) % 10_000));
                    limit.paused_until = limit.paused_until.max(until);
                }
                1 => {
                    let tokens = 1 + (seed >> 8) % 3;
                    let per = u128::from(100 + (seed >> 16) % 5_000);
                    match &mut limit.curve {
                        Curve::Bucket(b) => b.set_rate(now, tokens, per),
                        Curve::WarmingUp(w) => w.set_rate(now, tokens, per),
                    }
                }
                _ => {
                    if let Curve::Bucket(b) = &mut limit.curve {
                        b.set_burst(now, 1 + (seed >> 8) % 5);
                    }
                }
            })?;
        }
    }
}
