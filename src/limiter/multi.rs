//! `RateLimiter`: several limits at once (requests AND tokens, per minute AND per day),
//! one FIFO queue in front of all of them, and [`Permit`]s to correct an estimated cost.

use std::fmt;
use std::future::poll_fn;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::core::{Bucket, FixedWindow, Limits, Nanos, Rule, Tagged};
use crate::engine::waiter::Handle;
use crate::engine::{coop, Shared, Waiter};
use crate::error::{ConfigError, NotUntil};
use crate::limiter::traits::sealed::Draw;
use crate::limiter::traits::Limiter;
use crate::limiter::RateLimiter;
use crate::rate::Rate;
use crate::stats::Stats;

/// One limit of one dimension of a [`RateLimiter`]: a token bucket or a fixed window.
///
/// A value, checked where the limiter is built ([`RateLimiterBuilder::build`]) or
/// changed ([`try_set_limit`](RateLimiter#method.try_set_limit-1)).
///
/// - [`Limit::bucket`]`(rate, burst)`: at most `burst` at once, refilled at `rate`: in any
///   span `[t, t + w]` at most `burst + w * rate` is granted.
/// - [`Limit::window`]`(quota, window)`: at most `quota` per fixed window of length `window`,
///   the windows aligned to an origin ([`aligned_to`](Limit::aligned_to), by default the Unix
///   epoch: a day from midnight UTC, an hour on the hour). A fixed window resets at fixed
///   instants: a bucket of burst `q` and rate `q` per day lets up to `2q` through within one
///   calendar day (full at midnight, and refilled by the next), a window of `q` per day only
///   `q`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paced::{Limit, Rate};
///
/// let per_minute = Limit::bucket(Rate::per_minute(500), 50);
/// let per_day = Limit::window(10_000, Duration::from_secs(86_400)); // from midnight UTC
/// assert_ne!(per_minute, per_day);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Bucket {
        rate: Rate,
        burst: u64,
    },
    Window {
        quota: u64,
        window: Duration,
        origin: Origin,
    },
}

/// Where a fixed window's boundaries fall: `origin + k * window` for every whole `k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    System(SystemTime),
    Instant(Instant),
}

impl Limit {
    /// A token bucket: holds at most `burst` (at least 1, checked when the limiter is built),
    /// starts full, refills at `rate`, as a [`RateLimiter`](crate::RateLimiter) does.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Limit, RateLimiter, Rate};
    ///
    /// let limiter: RateLimiter<[u64; 1]> = RateLimiter::builder(["requests"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(10), 5))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(limiter.available(), [5]);
    /// ```
    #[must_use]
    pub const fn bucket(rate: Rate, burst: u64) -> Limit {
        Limit {
            kind: Kind::Bucket { rate, burst },
        }
    }

    /// A fixed window: at most `quota` (at least 1) per window of length `window` (not zero),
    /// both checked when the limiter is built. The windows are aligned to the Unix epoch
    /// unless [`aligned_to`](Limit::aligned_to) or
    /// [`aligned_to_instant`](Limit::aligned_to_instant) says otherwise.
    ///
    /// A cost above `quota` is granted too: it waits for a window in which nothing has been
    /// used, takes it whole, and carries its excess into the next windows (they start used).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Limit, RateLimiter};
    ///
    /// let limiter: RateLimiter<[u64; 1]> = RateLimiter::builder(["requests"])
    ///     .limit("requests", Limit::window(100, Duration::from_secs(3_600)))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(limiter.available(), [100]);
    /// ```
    #[must_use]
    pub const fn window(quota: u64, window: Duration) -> Limit {
        Limit {
            kind: Kind::Window {
                quota,
                window,
                origin: Origin::System(SystemTime::UNIX_EPOCH),
            },
        }
    }

    /// Puts a fixed window's boundaries at `origin + k * window` (by default the Unix epoch).
    /// A bucket has no boundaries: it is returned unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use paced::Limit;
    ///
    /// // A day that starts at 06:00 UTC.
    /// let six = SystemTime::UNIX_EPOCH + Duration::from_secs(6 * 3_600);
    /// let day = Limit::window(1_000, Duration::from_secs(86_400)).aligned_to(six);
    /// assert_ne!(day, Limit::window(1_000, Duration::from_secs(86_400)));
    /// ```
    #[must_use]
    pub const fn aligned_to(self, origin: SystemTime) -> Limit {
        self.with_origin(Origin::System(origin))
    }

    /// Puts a fixed window's boundaries at `origin + k * window`, for a tokio `Instant`: exact
    /// under paused time, for tests. A bucket is returned unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Limit, RateLimiter};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let start = Instant::now();
    /// let limiter: RateLimiter<[u64; 1]> = RateLimiter::builder(["requests"])
    ///     .limit("requests", Limit::window(2, Duration::from_secs(1)).aligned_to_instant(start))
    ///     .build()
    ///     .unwrap();
    /// limiter.acquire([2]).await;
    /// limiter.acquire([1]).await; // the next window
    /// assert_eq!(start.elapsed(), Duration::from_secs(1));
    /// # }
    /// ```
    #[must_use]
    pub const fn aligned_to_instant(self, origin: Instant) -> Limit {
        self.with_origin(Origin::Instant(origin))
    }

    const fn with_origin(self, origin: Origin) -> Limit {
        match self.kind {
            Kind::Window { quota, window, .. } => Limit {
                kind: Kind::Window {
                    quota,
                    window,
                    origin,
                },
            },
            Kind::Bucket { .. } => self,
        }
    }

    /// A bucket's rate and burst (`None` for a fixed window): what a Redis limiter keeps.
    #[cfg(feature = "redis")]
    pub(crate) fn as_bucket(&self) -> Option<(Rate, u64)> {
        match self.kind {
            Kind::Bucket { rate, burst } => Some((rate, burst)),
            Kind::Window { .. } => None,
        }
    }

    /// A fixed window's quota, length and origin as a time of the system clock (an `Instant`
    /// origin mapped through this machine's clock now): what a Redis limiter keeps.
    #[cfg(feature = "redis")]
    pub(crate) fn as_window(&self) -> Option<(u64, Duration, SystemTime)> {
        match self.kind {
            Kind::Bucket { .. } => None,
            Kind::Window {
                quota,
                window,
                origin,
            } => {
                let origin = match origin {
                    Origin::System(origin) => origin,
                    Origin::Instant(origin) => {
                        let (now, system) = (Instant::now(), SystemTime::now());
                        if origin <= now {
                            system - (now - origin)
                        } else {
                            system + (origin - now)
                        }
                    }
                };
                Some((quota, window, origin))
            }
        }
    }

    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        match self.kind {
            Kind::Bucket { burst: 0, .. } => Err(ConfigError::ZeroBurst),
            Kind::Window { quota: 0, .. } => Err(ConfigError::ZeroQuota),
            Kind::Window { window, .. } if Nanos::from_duration(window) == Nanos::ZERO => {
                Err(ConfigError::ZeroWindow)
            }
            _ => Ok(()),
        }
    }

    /// Whether this limit is of the kind of `rule` (a bucket for a bucket, a window for a
    /// window): only such a limit may replace it.
    pub(crate) fn fits(&self, rule: &Rule) -> bool {
        matches!(
            (self.kind, rule),
            (Kind::Bucket { .. }, Rule::Bucket(_)) | (Kind::Window { .. }, Rule::Window(_))
        )
    }

    /// The rule for this limit in a limiter whose times count from `base`, at `now` (its
    /// time).
    pub(crate) fn rule(&self, base: Instant, now: Nanos) -> Rule {
        match self.kind {
            Kind::Bucket { rate, burst } => {
                Rule::Bucket(Bucket::new(rate.tokens(), rate.per().as_nanos(), burst))
            }
            Kind::Window {
                quota,
                window,
                origin,
            } => Rule::Window(fixed_window(quota, window, origin, base, now)),
        }
    }
}

/// A fixed window of `quota` per `window`, its boundaries at `origin + k * window`, in a
/// limiter whose times count from `base`, at `now` (its time).
fn fixed_window(
    quota: u64,
    window: Duration,
    origin: Origin,
    base: Instant,
    now: Nanos,
) -> FixedWindow {
    let len = Nanos::from_duration(window);
    FixedWindow::new(quota, len, phase(origin, len, base, now))
}

/// Where the boundaries `origin + k * len` fall in a limiter's time (counted from `base`, now
/// `now`): at `phase + k * len`, `phase < len`.
fn phase(origin: Origin, len: Nanos, base: Instant, now: Nanos) -> Nanos {
    fn signed(later: Duration) -> i128 {
        i128::try_from(later.as_nanos()).unwrap_or(i128::MAX)
    }
    let offset = match origin {
        Origin::Instant(origin) => match origin.checked_duration_since(base) {
            Some(after) => signed(after),
            None => -signed(base.duration_since(origin)),
        },
        Origin::System(origin) => {
            let wall = SystemTime::now();
            let to_origin = match origin.duration_since(wall) {
                Ok(ahead) => signed(ahead),
                Err(behind) => -signed(behind.duration()),
            };
            i128::from(now.0) + to_origin
        }
    };
    let phase = offset.rem_euclid(i128::from(len.0.max(1)));
    Nanos(u64::try_from(phase).unwrap_or(0))
}

/// Builds a `RateLimiter<[u64; N]>` of several limits: names its dimensions, then takes its
/// limits. Made by [`RateLimiter::builder`].
///
/// # Examples
///
/// ```
/// use paced::{ConfigError, Limit, RateLimiter, Rate};
///
/// let built = RateLimiter::builder(["requests", "tokens"])
///     .limit("requests", Limit::bucket(Rate::per_minute(500), 50))
///     .limit("tokns", Limit::bucket(Rate::per_minute(40_000), 40_000))
///     .build();
/// assert_eq!(built.err(), Some(ConfigError::UnknownDimension));
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct RateLimiterBuilder<const N: usize> {
    pub(super) names: [String; N],
    limits: Vec<(String, Limit)>,
}

impl<const N: usize> RateLimiterBuilder<N> {
    /// Adds `limit` on the dimension called `name`. Its index (for
    /// [`set_limit`](RateLimiter#method.set_limit-1)) is the number of limits added before it.
    /// A dimension may have several limits (per minute AND per day), or none.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Limit, RateLimiter, Rate};
    ///
    /// let limiter: RateLimiter<[u64; 1]> = RateLimiter::builder(["requests"])
    ///     .limit("requests", Limit::bucket(Rate::per_minute(60), 10)) // index 0
    ///     .limit("requests", Limit::window(1_000, Duration::from_secs(86_400))) // index 1
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(limiter.available(), [10]);
    /// ```
    pub fn limit(mut self, name: &str, limit: Limit) -> Self {
        self.limits.push((name.to_owned(), limit));
        self
    }

    /// The limiter, or the first [`ConfigError`] found.
    ///
    /// # Errors
    ///
    /// [`ConfigError::DuplicateDimension`] if two dimensions have the same name,
    /// [`ConfigError::UnknownDimension`] for a limit on a name that is not a dimension,
    /// [`ConfigError::ZeroBurst`], [`ConfigError::ZeroQuota`] or [`ConfigError::ZeroWindow`]
    /// for a limit that cannot be.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{ConfigError, Limit, RateLimiter, Rate};
    ///
    /// let twice = RateLimiter::builder(["tokens", "tokens"]).build();
    /// assert_eq!(twice.err(), Some(ConfigError::DuplicateDimension));
    /// let empty = RateLimiter::builder(["tokens"])
    ///     .limit("tokens", Limit::bucket(Rate::per_second(1), 0))
    ///     .build();
    /// assert_eq!(empty.err(), Some(ConfigError::ZeroBurst));
    /// ```
    pub fn build(self) -> Result<RateLimiter<[u64; N]>, ConfigError> {
        let base = Instant::now();
        let limits = self.limits(base)?;
        Ok(RateLimiter {
            inner: Several {
                shared: Arc::new(Shared::with_origin(limits, base)),
                names: Arc::new(self.names),
            },
        })
    }

    /// The limits, checked, in a limiter whose times count from `base` (made now).
    pub(crate) fn limits(&self, base: Instant) -> Result<Limits<N>, ConfigError> {
        let limits = by_dimension(&self.names, &self.limits, |dim, limit| Tagged {
            dim,
            rule: limit.rule(base, Nanos::ZERO),
        })?;
        Ok(Limits::new(limits))
    }
}

/// `each` of a builder's `limits` (a dimension's name and its limit, in the order given) with
/// the index of its dimension in `names`, or the first [`ConfigError`] found: the checks of a
/// builder of several limits, local or in Redis.
pub(crate) fn by_dimension<T>(
    names: &[String],
    limits: &[(String, Limit)],
    mut each: impl FnMut(usize, &Limit) -> T,
) -> Result<Vec<T>, ConfigError> {
    for (i, name) in names.iter().enumerate() {
        if names[..i].contains(name) {
            return Err(ConfigError::DuplicateDimension);
        }
    }
    let mut out = Vec::with_capacity(limits.len());
    for (name, limit) in limits {
        let dim = names
            .iter()
            .position(|n| n == name)
            .ok_or(ConfigError::UnknownDimension)?;
        limit.check()?;
        out.push(each(dim, limit));
    }
    Ok(out)
}

/// A [`RateLimiter`]'s state for several limits: public in a private module (see [`Cost`]).
pub struct Several<const N: usize> {
    pub(crate) shared: Arc<Shared<Limits<N>>>,
    pub(crate) names: Arc<[String; N]>,
}

impl<const N: usize> Clone for Several<N> {
    fn clone(&self) -> Self {
        Several {
            shared: Arc::clone(&self.shared),
            names: Arc::clone(&self.names),
        }
    }
}

/// A limiter of several limits at once, `RateLimiter<[u64; N]>`: a cost is one amount per dimension (`[u64; N]`,
/// in the order the dimensions were named), and a request is granted when every limit has room
/// for its amount.
///
/// An LLM account allows R requests per minute AND T tokens per minute (and, on some tiers,
/// per day): a provider refuses a call when any limit lacks room. The token cost is an
/// estimate when the call is sent and exact only in the answer: [`acquire`] returns a
/// [`Permit`], and [`Permit::settle`] corrects the charge.
///
/// - **Exact.** The head of the queue is granted at the earliest instant at which every limit
///   has room: the latest of the limits' own ready times, never later (plus tokio's 1 ms tick
///   in real time). All limits are charged at that one instant.
/// - **Fair.** One FIFO queue for all limits: a dear request at the head is not overtaken by
///   cheap ones, and [`try_acquire`](RateLimiter#method.try_acquire-1) never jumps the queue.
/// - **Charged at the grant.** A waiter that is dropped has taken nothing.
/// - **Never stuck.** A cost above a bucket's burst waits until the bucket is full and the
///   excess has flowed in; a cost above a fixed window's quota waits for an unused window and
///   carries its excess into the next windows.
///
/// **The bound.** With no upward correction, for every bucket limit the cost charged in any
/// span `[t, t + w]` is at most `burst + w * rate`, and for every fixed-window limit the cost
/// charged in any `k` consecutive windows is at most `k * quota` (so at most `quota` in each
/// window when no single cost exceeds the quota). With corrections, each counted at its
/// instant: the same, plus the debt still unpaid at the end of the span (an upward
/// correction is a cost already spent at the provider: it cannot be refused, only paid back
/// by making later grants wait). Downward corrections never let more through than the bound.
///
/// Cloning is cheap (an `Arc`); every clone is the same limiter. Building one needs no runtime;
/// waiting needs tokio's timer, and under paused time the schedule is exact.
///
/// [`acquire`]: RateLimiter#method.acquire-1
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paced::{Limit, RateLimiter, Rate};
/// use tokio::time::Instant;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let llm: RateLimiter<[u64; 2]> = RateLimiter::builder(["requests", "tokens"])
///     .limit("requests", Limit::bucket(Rate::per_minute(60), 10))
///     .limit("tokens", Limit::bucket(Rate::per_minute(6_000), 1_000))
///     .build()
///     .unwrap();
/// let start = Instant::now();
/// let permit = llm.acquire([1, 1_000]).await; // an estimate of 1_000 tokens
/// assert_eq!(llm.available(), [9, 0]);
/// permit.settle([1, 400]); // the answer used 400: 600 come back at once
/// assert_eq!(llm.available(), [9, 600]);
/// llm.acquire([1, 700]).await; // 100 tokens short: 1 s at 100 tokens/s
/// assert_eq!(start.elapsed(), Duration::from_secs(1));
/// # }
/// ```
impl<const N: usize> RateLimiter<[u64; N]> {
    /// Starts a limiter whose dimensions are called `names` (in the order of a cost's amounts;
    /// the names are checked in [`build`](RateLimiterBuilder::build)).
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Limit, RateLimiter, Rate};
    ///
    /// let limiter = RateLimiter::builder(["requests", "tokens"])
    ///     .limit("tokens", Limit::bucket(Rate::per_minute(40_000), 40_000))
    ///     .build()
    ///     .unwrap();
    /// // "requests" has no limit.
    /// assert_eq!(limiter.available(), [u64::MAX, 40_000]);
    /// ```
    pub fn builder(names: [&str; N]) -> RateLimiterBuilder<N> {
        RateLimiterBuilder {
            names: names.map(str::to_owned),
            limits: Vec::new(),
        }
    }

    /// Waits until `cost` is granted, in arrival order, and charges every limit at that one
    /// instant.
    ///
    /// The head of the queue is granted as soon as every limit has room for its amount: the
    /// latest of the limits' own ready times. A cost of 0 in a dimension asks nothing of its
    /// limits; a cost of all zeros passes at once. Dropping the future gives its place in the
    /// queue to the next waiter; it has taken nothing. A grant that needs no wait spends a
    /// unit of the task's cooperative budget, as a tokio `Semaphore` does.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Limit, RateLimiter, Rate};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::builder(["requests", "tokens"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(1), 1))
    ///     .limit("tokens", Limit::bucket(Rate::per_second(100), 100))
    ///     .build()
    ///     .unwrap();
    /// let start = Instant::now();
    /// limiter.acquire([1, 100]).await;
    /// limiter.acquire([1, 50]).await; // requests ready at 1 s, tokens at 0.5 s: the later
    /// assert_eq!(start.elapsed(), Duration::from_secs(1));
    /// # }
    /// ```
    pub async fn acquire(&self, cost: [u64; N]) -> Permit<N> {
        let mut waiter = pin!(Waiter::new(&*self.inner.shared));
        // Without a timeout a request is never refused.
        let at = poll_fn(|cx| waiter.as_mut().poll_acquire_at(cx, cost, None))
            .await
            .unwrap_or(Nanos::ZERO);
        self.permit(cost, at)
    }

    /// Takes `cost` if every limit has room now and nobody is waiting; never waits.
    ///
    /// # Errors
    ///
    /// [`NotUntil`], with how long until the request could be granted (after those already
    /// waiting): the latest of the limits' waits; [`is_never`](NotUntil::is_never) for a cost
    /// above a bucket's burst, which can only be had by waiting. A refused request charges no
    /// limit.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Limit, RateLimiter, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::builder(["requests", "tokens"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(10), 2))
    ///     .limit("tokens", Limit::bucket(Rate::per_second(100), 100))
    ///     .build()
    ///     .unwrap();
    /// limiter.try_acquire([1, 100]).unwrap();
    /// // Requests have room, tokens only in 0.5 s: refused, nothing charged.
    /// let refused = limiter.try_acquire([1, 50]).unwrap_err();
    /// assert_eq!(refused.retry_after(), Duration::from_millis(500));
    /// assert_eq!(limiter.available(), [1, 0]);
    /// # }
    /// ```
    pub fn try_acquire(&self, cost: [u64; N]) -> Result<Permit<N>, NotUntil> {
        let now = self.inner.shared.now();
        self.inner.shared.try_acquire_several_at(Some(now), cost)?;
        Ok(self.permit(cost, now))
    }

    /// Waits for `cost` only if it can be had within `timeout` (after those already waiting);
    /// otherwise returns at once, charging nothing.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] with how long the request would have waited.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Limit, RateLimiter, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::builder(["requests"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(1), 1))
    ///     .build()
    ///     .unwrap();
    /// limiter.acquire([1]).await;
    /// let refused = limiter.acquire_timeout([1], Duration::from_millis(500)).await;
    /// assert_eq!(refused.unwrap_err().retry_after(), Duration::from_secs(1));
    /// assert!(limiter.acquire_timeout([1], Duration::from_secs(1)).await.is_ok());
    /// # }
    /// ```
    pub async fn acquire_timeout(
        &self,
        cost: [u64; N],
        timeout: Duration,
    ) -> Result<Permit<N>, NotUntil> {
        let mut waiter = pin!(Waiter::new(&*self.inner.shared));
        let at = poll_fn(|cx| waiter.as_mut().poll_acquire_at(cx, cost, Some(timeout))).await?;
        Ok(self.permit(cost, at))
    }

    /// A permit for `cost`, granted at `at` (a fixed window gives back only within the
    /// window it was charged in).
    fn permit(&self, cost: [u64; N], at: Nanos) -> Permit<N> {
        Permit {
            shared: Arc::clone(&self.inner.shared),
            charged: cost,
            at,
        }
    }

    /// Per dimension, the least any of its limits holds now (`u64::MAX` for a dimension with
    /// no limit), ignoring anyone waiting.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Limit, RateLimiter, Rate};
    ///
    /// let limiter = RateLimiter::builder(["requests", "tokens"])
    ///     .limit("tokens", Limit::bucket(Rate::per_minute(1_000), 500))
    ///     .limit("tokens", Limit::window(300, Duration::from_secs(86_400)))
    ///     .build()
    ///     .unwrap();
    /// limiter.try_acquire([1, 100]).unwrap();
    /// assert_eq!(limiter.available(), [u64::MAX, 200]);
    /// ```
    #[must_use]
    pub fn available(&self) -> [u64; N] {
        self.inner.shared.read(|limits, now| limits.available(now))
    }

    /// Replaces the limit at `index` (the number of [`limit`](RateLimiterBuilder::limit)
    /// calls before it) from now on, keeping its level: a bucket keeps the tokens it holds (or
    /// lacks), capped at the new burst; a fixed window keeps what the current window used.
    /// Waiters re-read their deadline at once.
    ///
    /// # Panics
    ///
    /// Panics if [`try_set_limit`](RateLimiter#method.try_set_limit-1) refuses the change, with
    /// the message `"RateLimiter::set_limit: {error}"`.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Limit, RateLimiter, Rate};
    ///
    /// let limiter = RateLimiter::builder(["requests"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(1), 2))
    ///     .build()
    ///     .unwrap();
    /// limiter.set_limit(0, Limit::bucket(Rate::per_second(10), 5));
    /// assert_eq!(limiter.available(), [2]); // the level is kept
    /// ```
    #[track_caller]
    pub fn set_limit(&self, index: usize, limit: Limit) {
        ConfigError::or_panic(self.try_set_limit(index, limit), "RateLimiter::set_limit");
    }

    /// Replaces the limit at `index`, as [`set_limit`](RateLimiter#method.set_limit-1) does, or
    /// refuses a change that cannot be and changes nothing.
    ///
    /// # Errors
    ///
    /// [`ConfigError::NoSuchLimit`] if there is no limit at `index`; [`ConfigError::LimitKind`]
    /// if the limit there is of the other kind (a bucket for a window or the reverse);
    /// [`ConfigError::ZeroBurst`], [`ConfigError::ZeroQuota`], [`ConfigError::ZeroWindow`]
    /// for a limit that cannot be.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{ConfigError, Limit, RateLimiter, Rate};
    ///
    /// let limiter = RateLimiter::builder(["requests"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(1), 2))
    ///     .build()
    ///     .unwrap();
    /// let window = Limit::window(5, Duration::from_secs(60));
    /// assert_eq!(limiter.try_set_limit(0, window), Err(ConfigError::LimitKind));
    /// assert_eq!(limiter.try_set_limit(1, window), Err(ConfigError::NoSuchLimit));
    /// ```
    pub fn try_set_limit(&self, index: usize, limit: Limit) -> Result<(), ConfigError> {
        limit.check()?;
        let base = Handle::origin(&&*self.inner.shared);
        self.inner.shared.update(|limits, now| {
            let tagged = limits.limit_mut(index).ok_or(ConfigError::NoSuchLimit)?;
            match (&mut tagged.rule, limit.kind) {
                (Rule::Bucket(old), Kind::Bucket { rate, burst }) => {
                    old.set_rate(now, rate.tokens(), rate.per().as_nanos());
                    old.set_burst(now, burst);
                    Ok(())
                }
                (
                    Rule::Window(old),
                    Kind::Window {
                        quota,
                        window,
                        origin,
                    },
                ) => {
                    old.set_limit(now, &fixed_window(quota, window, origin, base, now));
                    Ok(())
                }
                _ => Err(ConfigError::LimitKind),
            }
        })
    }

    /// The names of the dimensions, in the order of a cost's amounts.
    pub(crate) fn names(&self) -> &[String; N] {
        &self.inner.names
    }

    /// The dimension of the limit at `index` and, if it is a bucket, its rate.
    pub(crate) fn limit_info(&self, index: usize) -> Option<(usize, Option<Rate>)> {
        self.inner.shared.read(|limits, _| {
            let tagged = limits.limit(index)?;
            let rate = match &tagged.rule {
                Rule::Bucket(b) => Some(bucket_rate(b)),
                Rule::Window(_) => None,
            };
            Some((tagged.dim, rate))
        })
    }

    /// What the limit at `index` holds now (0 if there is none).
    pub(crate) fn limit_available(&self, index: usize) -> u64 {
        self.inner.shared.read(|limits, now| {
            limits
                .limit(index)
                .map_or(0, |tagged| tagged.rule.available(now))
        })
    }

    /// Sets the rate of the bucket at `index` (a window or no limit there: nothing changes),
    /// keeping its level and burst; the head of the queue is left for the caller to wake.
    pub(crate) fn set_bucket_rate_deferred(
        &self,
        index: usize,
        rate: Rate,
    ) -> crate::engine::After {
        let ((), after) = self.inner.shared.update_deferred(|limits, now| {
            if let Some(Tagged {
                rule: Rule::Bucket(b),
                ..
            }) = limits.limit_mut(index)
            {
                b.set_rate(now, rate.tokens(), rate.per().as_nanos());
            }
        });
        after
    }
}

/// Every limit of `limits` at `now`, in the order given, each with its dimension's name (of
/// `names`): a bucket as a one-limit bucket is announced, a fixed window as its quota per its
/// length, what is left of it, and the time until nothing of it is used; paused, nothing left
/// until the pause ends. What a `RateLimiter`, or one key of a `KeyedRateLimiter<K, [u64; N]>`,
/// announces.
#[cfg(feature = "http")]
pub(crate) fn announced<const N: usize>(
    limits: &Limits<N>,
    names: &[String; N],
    now: Nanos,
) -> Vec<(String, crate::stats::LimitState)> {
    let paused = limits.paused_until().saturating_sub(now).to_duration();
    let mut out = Vec::new();
    let mut index = 0;
    while let Some(tagged) = limits.limit(index) {
        index += 1;
        let mut state = match &tagged.rule {
            Rule::Bucket(b) => crate::stats::LimitState::of(b, bucket_rate(b), now),
            Rule::Window(w) => {
                let (quota, len, reset) = w.announced(now);
                crate::stats::LimitState {
                    limit: quota,
                    window: len.to_duration(),
                    remaining: w.available(now),
                    reset: reset.to_duration(),
                }
            }
        };
        if !paused.is_zero() {
            state.remaining = 0;
            state.reset = state.reset.max(paused);
        }
        out.push((names[tagged.dim].clone(), state));
    }
    out
}

/// A bucket's rate as a [`Rate`] (reduced, so equal to the rate it was given).
fn bucket_rate(bucket: &Bucket) -> Rate {
    let (tokens, per_nanos) = bucket.rate_parts();
    let per = Duration::new(
        u64::try_from(per_nanos / 1_000_000_000).unwrap_or(u64::MAX),
        (per_nanos % 1_000_000_000) as u32,
    );
    Rate::new(tokens, per)
}

impl<const N: usize> crate::limiter::cost::sealed::State for Several<N> {
    fn pause_for(&self, d: Duration) {
        self.shared.update(|limits, now| {
            limits.pause_until(now.saturating_add(Nanos::from_duration(d)));
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

impl<const N: usize> fmt::Debug for Several<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("id", &Arc::as_ptr(&self.shared))
            .field("dimensions", &self.names)
            .finish_non_exhaustive()
    }
}

/// What a grant of a `RateLimiter<[u64; N]>` (several limits) charged, to correct once the
/// real cost is known.
///
/// Dropping a permit keeps its charge.
///
/// # Examples
///
/// ```
/// use paced::{Limit, RateLimiter, Rate};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let limiter = RateLimiter::builder(["requests", "tokens"])
///     .limit("tokens", Limit::bucket(Rate::per_minute(1_000), 1_000))
///     .build()
///     .unwrap();
/// let permit = limiter.acquire([1, 300]).await;
/// assert_eq!(permit.charged(), [1, 300]);
/// permit.settle([1, 500]); // 200 more than estimated: charged as debt
/// assert_eq!(limiter.available(), [u64::MAX, 500]);
/// # }
/// ```
pub struct Permit<const N: usize> {
    shared: Arc<Shared<Limits<N>>>,
    charged: [u64; N],
    /// When the grant was made, in the limiter's time.
    at: Nanos,
}

impl<const N: usize> Permit<N> {
    /// What the grant charged, per dimension.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Limit, RateLimiter, Rate};
    ///
    /// let limiter = RateLimiter::builder(["requests", "tokens"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(1), 1))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(limiter.try_acquire([1, 42]).unwrap().charged(), [1, 42]);
    /// ```
    #[must_use]
    pub fn charged(&self) -> [u64; N] {
        self.charged
    }

    /// Corrects the charge to `actual`, per dimension, now.
    ///
    /// A smaller amount gives the difference back at once, never beyond a limit's room: a
    /// bucket's level caps at its burst (and a cost above the burst, which took the whole
    /// burst and waited for the rest, gets back only what the bucket gave); a fixed window
    /// gives back only within the window the grant was charged in, and never below nothing
    /// used. The waiters it now admits are woken.
    /// A larger amount is charged as debt: a bucket's level goes below zero, a fixed window's
    /// use above its quota (the excess carries into the next windows), so that later grants
    /// wait.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Limit, RateLimiter, Rate};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::builder(["tokens"])
    ///     .limit("tokens", Limit::bucket(Rate::per_second(100), 100))
    ///     .build()
    ///     .unwrap();
    /// let start = Instant::now();
    /// limiter.acquire([100]).await.settle([300]); // 200 of debt: 2 s to pay
    /// limiter.acquire([100]).await; // and 1 s for its own tokens
    /// assert_eq!(start.elapsed(), Duration::from_secs(3));
    /// # }
    /// ```
    pub fn settle(self, actual: [u64; N]) {
        let (charged, at) = (self.charged, self.at);
        self.shared
            .correct(|limits, now| limits.settle(now, at, charged, actual));
    }
}

impl<const N: usize> fmt::Debug for Permit<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("charged", &self.charged)
            .finish_non_exhaustive()
    }
}

/// A stream's place in a [`RateLimiter`]'s queue, made on its first wait.
///
/// Boxed, once per stream (or per request of a tower layer), and only if it ever waits: the
/// waiter is pinned, and the crate's pinning macro cannot name a const generic. A
/// [`RateLimiter`](crate::RateLimiter)'s is inline.
#[derive(Debug)]
pub struct SeveralPermit<const N: usize> {
    waiter: Option<Pin<Box<MultiWaiter<N>>>>,
    /// When the last grant through it was made (a fixed window gives back only within the
    /// window it was charged in).
    at: Nanos,
}

type MultiWaiter<const N: usize> = Waiter<Arc<Shared<Limits<N>>>>;

/// A cost is one amount per dimension; a grant is a [`Permit`], to settle.
impl<const N: usize> Limiter for RateLimiter<[u64; N]> {}

impl<const N: usize> Draw for RateLimiter<[u64; N]> {
    type Cost = [u64; N];
    type Permit = SeveralPermit<N>;
    type Grant = Permit<N>;

    #[cfg(feature = "http")]
    fn state(&self) -> Option<crate::stats::LimitState> {
        None
    }

    /// Every limit, in the order given: a bucket as a one-limit bucket is announced, a fixed
    /// window as its quota per its length, what is left of it, and the time until nothing of
    /// it is used; paused, nothing left until the pause ends.
    #[cfg(feature = "http")]
    fn states(&self) -> Vec<(String, crate::stats::LimitState)> {
        self.inner
            .shared
            .read(|limits, now| announced(limits, &self.inner.names, now))
    }

    fn permit(&self) -> SeveralPermit<N> {
        SeveralPermit {
            waiter: None,
            at: Nanos::ZERO,
        }
    }

    fn poll_acquire(
        &self,
        permit: Pin<&mut SeveralPermit<N>>,
        cx: &mut Context<'_>,
        cost: [u64; N],
    ) -> Poll<()> {
        let permit = permit.get_mut();
        let waiter = permit
            .waiter
            .get_or_insert_with(|| Box::pin(Waiter::new(Arc::clone(&self.inner.shared))));
        // Without a timeout a request is never refused.
        let at = ready!(waiter.as_mut().poll_acquire_at(cx, cost, None));
        permit.at = at.unwrap_or(Nanos::ZERO);
        Poll::Ready(())
    }

    fn poll_try_acquire(
        &self,
        permit: Pin<&mut SeveralPermit<N>>,
        cx: &mut Context<'_>,
        cost: [u64; N],
    ) -> Poll<Result<(), NotUntil>> {
        let permit = permit.get_mut();
        coop::poll_try_acquire(cx, || {
            let now = self.inner.shared.now();
            self.inner.shared.try_acquire_several_at(Some(now), cost)?;
            permit.at = now;
            Ok(())
        })
    }

    fn grant(&self, permit: Pin<&mut SeveralPermit<N>>, cost: [u64; N]) -> Permit<N> {
        self.permit(cost, permit.at)
    }
}
