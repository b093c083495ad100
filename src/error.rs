//! The one "not now" ([`NotUntil`]), the item an enforcing stream hands back with it
//! ([`RateExceeded`]), and the [`ConfigError`] for a limit that cannot be.

use std::fmt;
use std::time::Duration;

/// A request could not be granted without waiting: the one refusal of every limiter, stream,
/// Sink, tower layer and Redis limiter in this crate.
///
/// [`retry_after`](NotUntil::retry_after) says how long until the request could be granted,
/// counting the requests queued before it, if nothing else were taken meanwhile.
/// [`is_never`](NotUntil::is_never) says it can never be granted without waiting: its cost is
/// above the burst, or the wait is longer than time can represent. A server answers it with
/// `429 Too Many Requests` and `Retry-After:` [`retry_after_secs`](NotUntil::retry_after_secs).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paced::{Rate, RateLimiter};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let limiter = RateLimiter::new(Rate::per_second(10), 1);
/// assert!(limiter.try_acquire(1).is_ok());
/// let refused = limiter.try_acquire(1).unwrap_err();
/// assert_eq!(refused.retry_after(), Duration::from_millis(100));
/// assert_eq!(refused.retry_after_secs(), 1);
/// assert!(!refused.is_never());
/// assert_eq!(refused.to_string(), "rate limited: retry after 100ms");
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NotUntil {
    /// `Duration::MAX` stands for "never".
    retry_after: Duration,
}

impl NotUntil {
    /// A refusal for a wait of `retry_after`; `Duration::MAX` is "never". (From the engine's
    /// nanoseconds: `NotUntil::new`, beside `Nanos`.)
    pub(crate) const fn after(retry_after: Duration) -> NotUntil {
        NotUntil { retry_after }
    }

    /// A request that can never be granted without waiting.
    #[cfg(test)]
    pub(crate) const NEVER: NotUntil = NotUntil {
        retry_after: Duration::MAX,
    };

    /// How long until the request could be granted, counting the requests queued before it,
    /// if nothing else were taken meanwhile. When [`is_never`](NotUntil::is_never) is true it
    /// returns `Duration::MAX`, which is not a wait to sleep for: test `is_never` first.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Rate, RateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(Rate::per_second(4), 1);
    /// limiter.try_acquire(1).unwrap();
    /// assert_eq!(limiter.try_acquire(1).unwrap_err().retry_after(), Duration::from_millis(250));
    /// let dear = limiter.try_acquire(2).unwrap_err();
    /// assert!(dear.is_never());
    /// assert_eq!(dear.retry_after(), Duration::MAX);
    /// # }
    /// ```
    #[must_use]
    pub const fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// Whether the request can never be granted without waiting: its cost is above the burst
    /// (it can still be had by waiting, with `acquire`, which makes it pay its debt), or the
    /// wait is longer than time can represent (beyond about 584 years).
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(10), 5);
    /// assert!(limiter.try_acquire(6).unwrap_err().is_never());
    /// ```
    #[must_use]
    pub const fn is_never(&self) -> bool {
        self.retry_after.as_secs() == Duration::MAX.as_secs()
            && self.retry_after.subsec_nanos() == Duration::MAX.subsec_nanos()
    }

    /// [`retry_after`](NotUntil::retry_after) in whole seconds, rounded up, so that a client
    /// that waits that long conforms: the value of a `Retry-After` header. `u64::MAX` when
    /// [`is_never`](NotUntil::is_never).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::new(1, Duration::from_secs(60)), 1);
    /// limiter.try_acquire(1).unwrap();
    /// // Rounded up: a few nanoseconds may have passed since.
    /// assert_eq!(limiter.try_acquire(1).unwrap_err().retry_after_secs(), 60);
    /// ```
    #[must_use]
    pub const fn retry_after_secs(&self) -> u64 {
        if self.is_never() {
            return u64::MAX;
        }
        let secs = self.retry_after.as_secs();
        if self.retry_after.subsec_nanos() > 0 {
            secs.saturating_add(1)
        } else {
            secs
        }
    }
}

impl fmt::Display for NotUntil {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_never() {
            f.write_str(
                "rate limited: never without waiting (the cost is above the burst, \
                 or the wait is beyond about 584 years)",
            )
        } else {
            write!(f, "rate limited: retry after {:?}", self.retry_after)
        }
    }
}

impl std::error::Error for NotUntil {}

/// An item that an [`Enforcing`](crate::Enforcing) stream refused, handed back with its
/// [`NotUntil`]. Nothing is lost: [`into_inner`](RateExceeded::into_inner) returns the item.
///
/// # Examples
///
/// ```
/// use futures_util::StreamExt;
/// use paced::{Enforcing, PaceExt, Rate};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let mut s = std::pin::pin!(futures_util::stream::iter([10, 20])
///     .throttle(Rate::per_second(2), |&n| n, 15, Enforcing));
/// assert_eq!(s.next().await.unwrap().unwrap(), 10);
/// let refused = s.next().await.unwrap().unwrap_err();
/// // 20 can never fit in a bucket of 15.
/// assert!(refused.not_until().is_never());
/// assert_eq!(refused.into_inner(), 20);
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RateExceeded<T> {
    item: T,
    not_until: NotUntil,
}

impl<T> RateExceeded<T> {
    pub(crate) const fn new(item: T, not_until: NotUntil) -> Self {
        RateExceeded { item, not_until }
    }

    /// Why the item was refused: how long until it would have conformed, or that it never
    /// does without waiting.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use paced::{Enforcing, PaceExt, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let out: Vec<_> = futures_util::stream::iter([1, 2])
    ///     .throttle(Rate::per_second(4), |_| 1, 1, Enforcing)
    ///     .collect()
    ///     .await;
    /// let refused = out[1].as_ref().unwrap_err().not_until();
    /// assert_eq!(refused.retry_after().as_millis(), 250);
    /// assert_eq!(refused.retry_after_secs(), 1);
    /// # }
    /// ```
    #[must_use]
    pub const fn not_until(&self) -> NotUntil {
        self.not_until
    }

    /// How long after the refusal the item would have conformed, if nothing else were taken
    /// meanwhile: [`NotUntil::retry_after`] (`Duration::MAX` if it never conforms without
    /// waiting).
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use paced::{Enforcing, PaceExt, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let out: Vec<_> = futures_util::stream::iter([1, 2])
    ///     .throttle(Rate::per_second(4), |_| 1, 1, Enforcing)
    ///     .collect()
    ///     .await;
    /// assert_eq!(out[1].as_ref().unwrap_err().retry_after().as_millis(), 250);
    /// # }
    /// ```
    #[must_use]
    pub const fn retry_after(&self) -> Duration {
        self.not_until.retry_after()
    }

    /// A reference to the refused item.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use paced::{Enforcing, PaceExt, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let out: Vec<_> = futures_util::stream::iter(["x", "y"])
    ///     .throttle(Rate::per_second(1), |_| 1, 1, Enforcing)
    ///     .collect()
    ///     .await;
    /// assert_eq!(out[1].as_ref().unwrap_err().get_ref(), &"y");
    /// # }
    /// ```
    #[must_use]
    pub const fn get_ref(&self) -> &T {
        &self.item
    }

    /// The refused item, to retry, reroute or drop as you choose.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use paced::{Enforcing, PaceExt, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let out: Vec<_> = futures_util::stream::iter([String::from("x"), String::from("y")])
    ///     .throttle(Rate::per_second(1), |_| 1, 1, Enforcing)
    ///     .collect()
    ///     .await;
    /// let mut out = out.into_iter();
    /// assert_eq!(out.next().unwrap().unwrap(), "x");
    /// assert_eq!(out.next().unwrap().unwrap_err().into_inner(), "y");
    /// # }
    /// ```
    #[must_use]
    pub fn into_inner(self) -> T {
        self.item
    }
}

/// The refusal's text: an item was refused for the same reason a request is.
impl<T> fmt::Display for RateExceeded<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.not_until, f)
    }
}

impl<T: fmt::Debug> std::error::Error for RateExceeded<T> {}

/// A configuration value that describes no usable limit.
///
/// Its `Display` names the value and says why it was refused.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paced::{ConfigError, Rate};
///
/// let err = Rate::try_new(0, Duration::from_secs(1)).unwrap_err();
/// assert_eq!(err, ConfigError::ZeroTokens);
/// assert_eq!(
///     err.to_string(),
///     "invalid rate: `tokens` is 0, so nothing could ever pass; it must be at least 1"
/// );
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConfigError {
    /// A [`Rate`](crate::Rate) of zero tokens per period.
    ZeroTokens,
    /// A [`Rate`](crate::Rate) whose period is zero: an infinite rate.
    ZeroPeriod,
    /// A limiter whose `burst` is zero: nothing could ever pass.
    ZeroBurst,
    /// A warming-up limiter whose warm-up period is zero.
    ZeroWarmup,
    /// A warming-up limiter whose cold factor is not a finite number of at least 1.
    ColdFactor,
    /// A Redis limiter whose lease is zero tokens.
    ZeroLease,
    /// A Redis limiter whose response timeout is zero.
    ZeroTimeout,
    /// A fail-open share outside `(0, 1]`.
    Share,
    /// An adaptive controller whose `min` rate is above its `max`.
    MinAboveMax,
    /// A burst given to a warming-up limiter, which has none: its stored permits play that
    /// part.
    NoBurst,
    /// A [`Stagger`](crate::Stagger) or a `staggered_start` that lets `k = 0` start per
    /// window: nothing could ever start.
    ZeroStarts,
    /// A `batched_interval` whose batches hold at most 0 items.
    ZeroBatch,
    /// A `throttle_by_key` that may hold 0 items: none could ever wait for its key.
    ZeroCapacity,
    /// A limit of a limiter of several limits (built with `builder(names)`) on a name that is
    /// not one of its dimensions.
    UnknownDimension,
    /// A limiter of several limits whose dimensions have the same name twice.
    DuplicateDimension,
    /// A fixed [`Limit::window`](crate::Limit::window) of quota 0: nothing could ever pass.
    ZeroQuota,
    /// A fixed [`Limit::window`](crate::Limit::window) of length zero.
    ZeroWindow,
    /// A `set_limit` of a limiter of several limits (such as
    /// [`RateLimiter::set_limit`](crate::RateLimiter#method.set_limit-1)) at an index where
    /// there is no limit.
    NoSuchLimit,
    /// A `set_limit` of a limiter of several limits (such as
    /// [`RateLimiter::set_limit`](crate::RateLimiter#method.set_limit-1)) that would turn a
    /// bucket into a fixed window or the reverse.
    LimitKind,
}

impl ConfigError {
    /// What `built` holds, or a panic saying `what` was being built and why it could not be:
    /// for the constructors that panic on a configuration that cannot be, beside their `try_`
    /// twins that return the error.
    #[track_caller]
    pub(crate) fn or_panic<T>(built: Result<T, ConfigError>, what: &str) -> T {
        match built {
            Ok(value) => value,
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigError::ZeroTokens => {
                "invalid rate: `tokens` is 0, so nothing could ever pass; it must be at least 1"
            }
            ConfigError::ZeroPeriod => {
                "invalid rate: `per` is zero, an infinite rate; it must be a positive duration"
            }
            ConfigError::ZeroBurst => {
                "invalid burst: `burst` is 0, so nothing could ever pass; it must be at least 1"
            }
            ConfigError::ZeroWarmup => {
                "invalid warm-up: the warm-up period is zero; it must be a positive duration"
            }
            ConfigError::ZeroLease => {
                "invalid lease: 0 tokens per lease; lease at least 1 token, or leave leases off"
            }
            ConfigError::ZeroTimeout => {
                "invalid response timeout: it is zero; it must be a positive duration"
            }
            ConfigError::Share => {
                "invalid fail-open share: it must be a fraction of the rate in (0, 1]"
            }
            ConfigError::MinAboveMax => {
                "invalid adaptive range: `min` is above `max`; it must be at most `max`"
            }
            ConfigError::NoBurst => {
                "invalid burst: a warming-up limiter has no burst (its stored permits play that part)"
            }
            ConfigError::ZeroStarts => {
                "invalid stagger: `k` is 0, so nothing could ever start; it must be at least 1"
            }
            ConfigError::ZeroBatch => {
                "invalid batch: `max_batch` is 0, so no batch could hold an item; it must be at least 1"
            }
            ConfigError::ZeroCapacity => {
                "invalid capacity: `capacity` is 0, so no item could ever be held; it must be at least 1"
            }
            ConfigError::UnknownDimension => {
                "invalid limit: its dimension is not one of the names given to `builder`"
            }
            ConfigError::DuplicateDimension => {
                "invalid dimensions: a name is given twice; each dimension needs a name of its own"
            }
            ConfigError::ZeroQuota => {
                "invalid window: `quota` is 0, so nothing could ever pass; it must be at least 1"
            }
            ConfigError::ZeroWindow => {
                "invalid window: its length is zero; it must be a positive duration"
            }
            ConfigError::NoSuchLimit => {
                "invalid limit index: there is no limit there (limits count from 0, in the order `limit` was called)"
            }
            ConfigError::LimitKind => {
                "invalid limit: a bucket can only be replaced by a bucket, a fixed window by a fixed window"
            }
            ConfigError::ColdFactor => {
                "invalid warm-up: `cold_factor` must be a finite number of at least 1 (3 is Guava's default)"
            }
        })
    }
}

impl std::error::Error for ConfigError {}
