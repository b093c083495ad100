//! `Stagger`: the sliding window of `staggered_start`, shared by handle.

use std::future::poll_fn;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use crate::core::{Nanos, Window};
use crate::engine::{Shared, Waiter};
use crate::error::{ConfigError, NotUntil};
use crate::stats::Stats;

/// At most `k` acquisitions in any window of length `period`, shared by handle: the sliding
/// window of [`staggered_start`](crate::PaceExt::staggered_start) for many tasks and streams
/// (the cats-effect stagger).
///
/// Acquisition `i` is granted no earlier than acquisition `i - k` plus `period`: a semaphore of
/// `k` permits, each coming back `period` after it was taken. Waiters are served in arrival
/// order, only the first of them sleeps on a timer, and a dropped waiter gives its place to
/// the next. Cloning is cheap; every clone is the same window.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paced::Stagger;
/// use tokio::time::Instant;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // A thousand consumers, at most 100 starting in any second.
/// let stagger = Stagger::new(100, Duration::from_secs(1));
/// let start = Instant::now();
/// let consumers: Vec<_> = (0..1000)
///     .map(|_| {
///         let stagger = stagger.clone();
///         tokio::spawn(async move {
///             stagger.acquire().await;
///             start.elapsed().as_secs()
///         })
///     })
///     .collect();
/// let mut per_second = [0; 10];
/// for consumer in consumers {
///     per_second[consumer.await.unwrap() as usize] += 1;
/// }
/// assert_eq!(per_second, [100; 10]);
/// # }
/// ```
#[derive(Clone)]
pub struct Stagger {
    pub(crate) shared: Arc<Shared<Window>>,
}

impl Stagger {
    /// At most `k` acquisitions in any window of `period`. A zero `period` never binds.
    ///
    /// # Panics
    ///
    /// Panics if `k` is 0, with the message `"Stagger::new: {error}"` (the [`ConfigError`]).
    /// Use [`Stagger::try_new`] for values from configuration.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let stagger = paced::Stagger::new(3, Duration::from_secs(1));
    /// assert_eq!(stagger.available(), 3);
    /// ```
    #[track_caller]
    #[must_use]
    pub fn new(k: usize, period: Duration) -> Stagger {
        match Stagger::try_new(k, period) {
            Ok(stagger) => stagger,
            Err(e) => panic!("Stagger::new: {e}"),
        }
    }

    /// At most `k` acquisitions in any window of `period` (see [`new`](Stagger::new)), or a
    /// [`ConfigError`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroStarts`] if `k` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{ConfigError, Stagger};
    ///
    /// assert_eq!(Stagger::try_new(0, Duration::from_secs(1)).err(), Some(ConfigError::ZeroStarts));
    /// assert!(Stagger::try_new(2, Duration::from_secs(1)).is_ok());
    /// ```
    pub fn try_new(k: usize, period: Duration) -> Result<Stagger, ConfigError> {
        if k == 0 {
            return Err(ConfigError::ZeroStarts);
        }
        let window = Window::new(k, Nanos::from_duration(period));
        Ok(Stagger {
            shared: Arc::new(Shared::new(window)),
        })
    }

    /// Waits for a token, in arrival order (cats-effect's `getRatedToken`). Dropping the
    /// future gives its place to the next waiter.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::Stagger;
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let stagger = Stagger::new(2, Duration::from_secs(1));
    /// let start = Instant::now();
    /// for _ in 0..5 {
    ///     stagger.acquire().await;
    /// }
    /// assert_eq!(start.elapsed(), Duration::from_secs(2));
    /// # }
    /// ```
    pub async fn acquire(&self) {
        let mut waiter = pin!(Waiter::new(&*self.shared));
        let _ = poll_fn(|cx| waiter.as_mut().poll_acquire(cx, 1, None)).await;
    }

    /// Takes a token if one is free now and nobody is waiting; never waits.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] with how long until a token would be free (after those already waiting).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let stagger = paced::Stagger::new(1, Duration::from_secs(60));
    /// assert!(stagger.try_acquire().is_ok());
    /// assert!(stagger.try_acquire().unwrap_err().retry_after() <= Duration::from_secs(60));
    /// ```
    pub fn try_acquire(&self) -> Result<(), NotUntil> {
        self.shared.try_acquire(1)
    }

    /// Waits for a token only if one can be had within `timeout` (after those already
    /// waiting); otherwise returns at once, taking nothing. As
    /// [`RateLimiter::acquire_timeout`](crate::RateLimiter::acquire_timeout), for starts.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] with how long the request would have waited.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::Stagger;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let stagger = Stagger::new(1, Duration::from_secs(1));
    /// stagger.acquire().await;
    /// let refused = stagger.acquire_timeout(Duration::from_millis(500)).await;
    /// assert_eq!(refused.unwrap_err().retry_after(), Duration::from_secs(1));
    /// assert!(stagger.acquire_timeout(Duration::from_secs(1)).await.is_ok());
    /// # }
    /// ```
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<(), NotUntil> {
        let mut waiter = pin!(Waiter::new(&*self.shared));
        poll_fn(|cx| waiter.as_mut().poll_acquire(cx, 1, Some(timeout))).await
    }

    /// How many starts could be granted now: `k` minus the acquisitions in the last
    /// `period`, ignoring anyone waiting. A `u64`, as every handle's `available` is.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let stagger = paced::Stagger::new(3, Duration::from_secs(60));
    /// stagger.try_acquire().unwrap();
    /// assert_eq!(stagger.available(), 2);
    /// ```
    #[must_use]
    pub fn available(&self) -> u64 {
        let free = self.shared.read(|window, now| window.available(now));
        u64::try_from(free).unwrap_or(u64::MAX)
    }

    /// At most `k` per `period` from now on. Past acquisitions still count against the new
    /// limit (those older than the previous `period` may already be forgotten); waiters
    /// re-read their deadline at once.
    ///
    /// # Panics
    ///
    /// Panics if `k` is 0, with the message `"Stagger::set_limit: {error}"` (the
    /// [`ConfigError`]). Use [`try_set_limit`](Stagger::try_set_limit) for values from
    /// configuration.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let stagger = paced::Stagger::new(1, Duration::from_secs(60));
    /// stagger.try_acquire().unwrap();
    /// stagger.set_limit(3, Duration::from_secs(60));
    /// assert_eq!(stagger.available(), 2);
    /// ```
    #[track_caller]
    pub fn set_limit(&self, k: usize, period: Duration) {
        ConfigError::or_panic(self.try_set_limit(k, period), "Stagger::set_limit");
    }

    /// At most `k` per `period` from now on, as [`set_limit`](Stagger::set_limit) does, or
    /// refuses a limit that cannot be and changes nothing.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroStarts`] if `k` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{ConfigError, Stagger};
    ///
    /// let stagger = Stagger::new(2, Duration::from_secs(60));
    /// assert_eq!(stagger.try_set_limit(0, Duration::from_secs(60)), Err(ConfigError::ZeroStarts));
    /// assert_eq!(stagger.available(), 2);
    /// ```
    pub fn try_set_limit(&self, k: usize, period: Duration) -> Result<(), ConfigError> {
        if k == 0 {
            return Err(ConfigError::ZeroStarts);
        }
        let period = Nanos::from_duration(period);
        self.shared.update(|window, _| window.set_limit(k, period));
        Ok(())
    }

    /// A snapshot of the counters: granted, rejected, waiting now, total wait.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let stagger = paced::Stagger::new(1, Duration::from_secs(1));
    /// stagger.try_acquire().unwrap();
    /// assert_eq!(stagger.stats().granted, 1);
    /// ```
    #[must_use]
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// Records to the [`metrics`](https://docs.rs/metrics) facade under `name` (feature
    /// `metrics`); a start is a grant of one token:
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
    /// call too, and recording an event is one call on a handle. Named twice (on any handle),
    /// the last name given wins: the handles of the earlier name stop recording (its
    /// `paced_waiters` gauge is set to 0) and those of the new one start. Without a name, the
    /// cost is one branch per event. See the [guide](crate::guide#metrics).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let stagger = paced::Stagger::new(2, Duration::from_secs(1)).with_metrics("workers");
    /// stagger.try_acquire().unwrap();
    /// assert_eq!(stagger.stats().granted, 1);
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    #[must_use]
    pub fn with_metrics(self, name: impl AsRef<str>) -> Self {
        self.shared.set_metrics(name.as_ref());
        self
    }
}

/// Shows the stagger's identity only (clones show the same): its window is shared state.
impl std::fmt::Debug for Stagger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stagger")
            .field("id", &Arc::as_ptr(&self.shared))
            .finish_non_exhaustive()
    }
}
