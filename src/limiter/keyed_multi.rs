//! `KeyedRateLimiter<K, [u64; N]>`: several limits per key (each tenant's requests and tokens
//! per minute), one FIFO queue per key, over the same key table as one limit per key.

use crate::limiter::cost::sealed::KeyedState;
use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::keyed::KeyedRateLimiter;
use super::multi::{Limit, RateLimiterBuilder};
use crate::core::{Limits, Nanos};
use crate::engine::keyed::{KeyHandle, KeyOwned, KeyRef, KeyedShared};
use crate::engine::Acquire;
use crate::error::{ConfigError, NotUntil};
use crate::stats::Stats;

/// The key table of a [`KeyedRateLimiter`] of several limits per key.
type Table<K, S, const N: usize> = KeyedShared<K, S, Limits<N>>;

/// Builds a `KeyedRateLimiter<K, [u64; N]>`: the dimensions' names, then the limits every key
/// has, as [`RateLimiter::builder`](crate::RateLimiter::builder) does for one quota.
///
/// # Examples
///
/// ```
/// use paced::{KeyedRateLimiter, Limit, Rate};
///
/// let tenants: KeyedRateLimiter<String, [u64; 2]> =
///     KeyedRateLimiter::builder(["requests", "tokens"])
///         .limit("requests", Limit::bucket(Rate::per_minute(60), 10))
///         .limit("tokens", Limit::bucket(Rate::per_minute(40_000), 40_000))
///         .build()
///         .unwrap();
/// assert_eq!(tenants.available("acme"), [10, 40_000]);
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct KeyedRateLimiterBuilder<K, const N: usize, S = RandomState> {
    limits: RateLimiterBuilder<N>,
    hasher: S,
    key: PhantomData<fn() -> K>,
}

impl<K, const N: usize, S> fmt::Debug for KeyedRateLimiterBuilder<K, N, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRateLimiterBuilder")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl<K, const N: usize, S: BuildHasher> KeyedRateLimiterBuilder<K, N, S> {
    /// Adds `limit` on the dimension called `name`, for every key. Its index (for
    /// [`set_limit`](KeyedRateLimiter#method.set_limit-1)) is the number of limits added before
    /// it. A dimension may have several limits (per minute AND per day), or none.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{KeyedRateLimiter, Limit, Rate};
    ///
    /// let limiter: KeyedRateLimiter<u32, [u64; 1]> = KeyedRateLimiter::builder(["requests"])
    ///     .limit("requests", Limit::bucket(Rate::per_minute(60), 10)) // index 0
    ///     .limit("requests", Limit::window(1_000, Duration::from_secs(86_400))) // index 1
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(limiter.available(&7), [10]);
    /// ```
    pub fn limit(self, name: &str, limit: Limit) -> Self {
        KeyedRateLimiterBuilder {
            limits: self.limits.limit(name, limit),
            ..self
        }
    }

    /// Hashes keys with `hasher` instead of std's `RandomState`: a faster hasher for keys no
    /// adversary chooses, or a fixed one for repeatable runs.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::collections::hash_map::DefaultHasher;
    /// use std::hash::BuildHasherDefault;
    /// use paced::{KeyedRateLimiter, Limit, Rate};
    ///
    /// let limiter = KeyedRateLimiter::<u64, [u64; 1]>::builder(["requests"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(5), 1))
    ///     .hasher(BuildHasherDefault::<DefaultHasher>::default())
    ///     .build()
    ///     .unwrap();
    /// assert!(limiter.try_acquire(&7, [1]).is_ok());
    /// ```
    pub fn hasher<T: BuildHasher>(self, hasher: T) -> KeyedRateLimiterBuilder<K, N, T> {
        KeyedRateLimiterBuilder {
            limits: self.limits,
            hasher,
            key: PhantomData,
        }
    }

    /// The limiter, or the first [`ConfigError`] found.
    ///
    /// # Errors
    ///
    /// As [`RateLimiterBuilder::build`]: [`ConfigError::DuplicateDimension`],
    /// [`ConfigError::UnknownDimension`], [`ConfigError::ZeroBurst`],
    /// [`ConfigError::ZeroQuota`] or [`ConfigError::ZeroWindow`].
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{ConfigError, KeyedRateLimiter, Limit, Rate};
    ///
    /// let typo = KeyedRateLimiter::<String, [u64; 2]>::builder(["requests", "tokens"])
    ///     .limit("tokns", Limit::bucket(Rate::per_minute(40_000), 40_000))
    ///     .build();
    /// assert_eq!(typo.err(), Some(ConfigError::UnknownDimension));
    /// ```
    pub fn build(self) -> Result<KeyedRateLimiter<K, [u64; N], S>, ConfigError> {
        let origin = Instant::now();
        let limits = self.limits.limits(origin)?;
        Ok(KeyedRateLimiter {
            inner: Several {
                shared: Arc::new(KeyedShared::with_origin(limits, self.hasher, origin)),
                #[cfg(feature = "http")]
                names: Arc::new(self.limits.names),
            },
        })
    }
}

/// A [`KeyedRateLimiter`]'s state for several limits per key: public in a private module (see
/// [`Cost`](crate::limiter::Cost)).
pub struct Several<K, const N: usize, S> {
    pub(crate) shared: Arc<Table<K, S, N>>,
    /// The dimensions' names, in the order of a cost's amounts (what quota headers announce).
    #[cfg(feature = "http")]
    pub(crate) names: Arc<[String; N]>,
}

impl<K, const N: usize, S> Clone for Several<K, N, S> {
    fn clone(&self) -> Self {
        Several {
            shared: Arc::clone(&self.shared),
            #[cfg(feature = "http")]
            names: Arc::clone(&self.names),
        }
    }
}

impl<K, const N: usize, S> KeyedState<K, S> for Several<K, N, S> {
    fn tracked_keys(&self) -> usize
    where
        K: Hash,
        S: BuildHasher,
    {
        self.shared.tracked_keys()
    }
    fn stats(&self) -> Stats
    where
        S: BuildHasher,
    {
        self.shared.stats()
    }
    #[cfg(feature = "metrics")]
    fn set_metrics(&self, name: &str)
    where
        S: BuildHasher,
    {
        self.shared.set_metrics(name);
    }
}

impl<K, const N: usize, S> fmt::Debug for Several<K, N, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRateLimiter")
            .field("id", &Arc::as_ptr(&self.shared))
            .finish_non_exhaustive()
    }
}

/// Several limits per key, `KeyedRateLimiter<K, [u64; N]>`, shared by handle: each tenant's
/// requests per minute AND tokens per minute (and per day), with the semantics of a
/// `RateLimiter<[u64; N]>` key by key.
///
/// A cost is one amount per dimension (`[u64; N]`, in the order the dimensions were named).
/// Every key has its own copy of the limits (the builder's, or its own set with
/// [`set_limit`](KeyedRateLimiter#method.set_limit-1)) and its own FIFO queue: a key's head
/// waiter is granted at the earliest instant at which every one of the key's limits has room
/// (the latest of their own ready times), all of them charged at that one instant, and it
/// never waits for another key. A waiter that is dropped has taken nothing;
/// [`try_acquire`](KeyedRateLimiter#method.try_acquire-1) charges nothing when any limit
/// refuses. [`acquire`](KeyedRateLimiter#method.acquire-1) returns a [`KeyedPermit`] whose
/// [`settle`](KeyedPermit::settle) corrects an estimate once the answer is known, as
/// [`Permit::settle`](crate::limiter::Permit::settle) does. The bound of a `RateLimiter<[u64; N]>`
/// holds for each key's limits.
///
/// **Memory follows the keys in use**, as with one limit per key: a key is forgotten,
/// without any call from you, once every one of its limits is as good as new (a bucket full,
/// a fixed window with nothing charged or carried in the window in force) and nobody waits
/// on it: such a key is indistinguishable from one never seen, and never forgotten before.
/// [`tracked_keys`](KeyedRateLimiter::tracked_keys) counts exactly the others. Every key
/// with state has a queue of its own (the one-word form of a key, with no queue, is for one
/// limit per key only).
///
/// Cloning is cheap (an `Arc`); every clone is the same limiter. Building one needs no
/// runtime; waiting needs tokio's timer, and under paused time the schedule is exact.
///
/// A cost of the wrong shape does not compile:
///
/// ```compile_fail,E0308
/// use paced::{KeyedRateLimiter, Limit, Rate};
///
/// let tenants = KeyedRateLimiter::<&str, [u64; 2]>::builder(["requests", "tokens"])
///     .limit("requests", Limit::bucket(Rate::per_minute(60), 10))
///     .build()
///     .unwrap();
/// let _ = tenants.try_acquire(&"acme", 1); // two dimensions: a cost is a `[u64; 2]`
/// ```
///
/// [`RateLimiter`]: crate::RateLimiter
/// [`KeyedRateLimiter`]: crate::KeyedRateLimiter
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paced::{KeyedRateLimiter, Limit, Rate};
/// use tokio::time::Instant;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let tenants: KeyedRateLimiter<&str, [u64; 2]> =
///     KeyedRateLimiter::builder(["requests", "tokens"])
///         .limit("requests", Limit::bucket(Rate::per_minute(60), 10))
///         .limit("tokens", Limit::bucket(Rate::per_minute(6_000), 1_000))
///         .build()
///         .unwrap();
/// let start = Instant::now();
/// let permit = tenants.acquire(&"acme", [1, 1_000]).await; // an estimate
/// permit.settle([1, 400]); // the answer used 400: 600 come back at once
/// tenants.acquire(&"acme", [1, 700]).await; // 100 tokens short: 1 s at 100 tokens/s
/// assert_eq!(start.elapsed(), Duration::from_secs(1));
/// // Another tenant has limits of its own: it never waited for "acme".
/// tenants.acquire(&"globex", [1, 1_000]).await;
/// assert_eq!(start.elapsed(), Duration::from_secs(1));
/// # }
/// ```
impl<K, const N: usize> KeyedRateLimiter<K, [u64; N]> {
    /// Starts a keyed limiter whose dimensions are called `names` (in the order of a cost's
    /// amounts; checked in [`build`](KeyedRateLimiterBuilder::build)).
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{KeyedRateLimiter, Limit, Rate};
    ///
    /// let limiter = KeyedRateLimiter::<u32, [u64; 2]>::builder(["requests", "tokens"])
    ///     .limit("tokens", Limit::bucket(Rate::per_minute(40_000), 40_000))
    ///     .build()
    ///     .unwrap();
    /// // "requests" has no limit.
    /// assert_eq!(limiter.available(&1), [u64::MAX, 40_000]);
    /// ```
    pub fn builder(names: [&str; N]) -> KeyedRateLimiterBuilder<K, N> {
        KeyedRateLimiterBuilder {
            limits: crate::RateLimiter::builder(names),
            hasher: RandomState::new(),
            key: PhantomData,
        }
    }
}

impl<K, const N: usize, S: BuildHasher> KeyedRateLimiter<K, [u64; N], S> {
    /// Waits until `cost` of `key` is granted, behind the key's earlier waiters only, and
    /// charges every one of the key's limits at that one instant.
    ///
    /// As [`RateLimiter::acquire`](crate::RateLimiter#method.acquire-1), key by key: the
    /// key's head waiter goes at the latest of its limits' ready times; a cost of 0 in a
    /// dimension asks nothing of its limits; dropping the future gives its place to the next
    /// waiter of the key, having taken nothing. The [`KeyedPermit`] owns a copy of the key
    /// (`ToOwned`), to settle it later.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{KeyedRateLimiter, Limit, Rate};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = KeyedRateLimiter::<String, [u64; 2]>::builder(["requests", "tokens"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(10), 1))
    ///     .limit("tokens", Limit::bucket(Rate::per_second(100), 100))
    ///     .build()
    ///     .unwrap();
    /// let start = Instant::now();
    /// limiter.acquire("a", [1, 100]).await;
    /// // Requests are ready in 100 ms, tokens in 500 ms: the later wins.
    /// limiter.acquire("a", [1, 50]).await;
    /// assert_eq!(start.elapsed(), Duration::from_millis(500));
    /// # }
    /// ```
    pub async fn acquire<Q>(&self, key: &Q, cost: [u64; N]) -> KeyedPermit<K, N, S>
    where
        K: Borrow<Q> + Hash,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self.wait(key, cost, None).await {
            Ok(permit) => permit,
            // Without a timeout a request is never refused.
            Err(_) => self.permit(
                key,
                self.inner.shared.hash(key),
                cost,
                self.inner.shared.now(),
            ),
        }
    }

    /// Takes `cost` of `key` if every one of the key's limits has room now and nobody waits
    /// for the key; never waits.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] with how long until the request could be granted (after the key's
    /// waiters): the latest of its limits' waits; [`is_never`](NotUntil::is_never) for a cost
    /// above a bucket's burst, which can only be had by waiting. A refusal charges no limit.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{KeyedRateLimiter, Limit, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = KeyedRateLimiter::<u32, [u64; 2]>::builder(["requests", "tokens"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(10), 2))
    ///     .limit("tokens", Limit::bucket(Rate::per_second(100), 100))
    ///     .build()
    ///     .unwrap();
    /// limiter.try_acquire(&1, [1, 100]).unwrap();
    /// // Requests have room, tokens only in 0.5 s: refused, nothing charged.
    /// let refused = limiter.try_acquire(&1, [1, 50]).unwrap_err();
    /// assert_eq!(refused.retry_after(), Duration::from_millis(500));
    /// assert_eq!(limiter.available(&1), [1, 0]);
    /// assert!(limiter.try_acquire(&2, [1, 50]).is_ok()); // another key, other limits
    /// # }
    /// ```
    pub fn try_acquire<Q>(&self, key: &Q, cost: [u64; N]) -> Result<KeyedPermit<K, N, S>, NotUntil>
    where
        K: Borrow<Q> + Hash,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.inner.shared.hash(key);
        let at = self.inner.shared.try_acquire(hash, key, cost)?;
        Ok(self.permit(key, hash, cost, at))
    }

    /// Waits for `cost` of `key` only if it can be had within `timeout` (after the key's
    /// waiters); otherwise returns at once, charging nothing.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] with how long the request would have waited.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{KeyedRateLimiter, Limit, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = KeyedRateLimiter::<u32, [u64; 1]>::builder(["requests"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(1), 1))
    ///     .build()
    ///     .unwrap();
    /// limiter.acquire(&1, [1]).await;
    /// let refused = limiter.acquire_timeout(&1, [1], Duration::from_millis(500)).await;
    /// assert_eq!(refused.unwrap_err().retry_after(), Duration::from_secs(1));
    /// assert!(limiter.acquire_timeout(&1, [1], Duration::from_secs(1)).await.is_ok());
    /// # }
    /// ```
    pub async fn acquire_timeout<Q>(
        &self,
        key: &Q,
        cost: [u64; N],
        timeout: Duration,
    ) -> Result<KeyedPermit<K, N, S>, NotUntil>
    where
        K: Borrow<Q> + Hash,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.wait(key, cost, Some(timeout)).await
    }

    /// Waits in `key`'s queue for `cost`, within `timeout` if there is one.
    async fn wait<Q>(
        &self,
        key: &Q,
        cost: [u64; N],
        timeout: Option<Duration>,
    ) -> Result<KeyedPermit<K, N, S>, NotUntil>
    where
        K: Borrow<Q> + Hash,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.inner.shared.hash(key);
        let handle: KeyRef<'_, K, Q, S, Limits<N>> =
            KeyHandle::hashed(&*self.inner.shared, key, hash);
        let at = Acquire::new(handle, cost, timeout).await?;
        Ok(self.permit(key, hash, cost, at))
    }

    /// A permit for `cost` of `key` (hashed to `hash`), granted at `at`.
    fn permit<Q>(&self, key: &Q, hash: u64, cost: [u64; N], at: Nanos) -> KeyedPermit<K, N, S>
    where
        K: Borrow<Q> + Hash,
        Q: ToOwned<Owned = K> + ?Sized,
    {
        KeyedPermit {
            handle: KeyOwned::hashed(Arc::clone(&self.inner.shared), key.to_owned(), hash),
            charged: cost,
            at,
        }
    }

    /// Per dimension, the least any of `key`'s limits holds now (`u64::MAX` for a dimension
    /// with no limit), ignoring its waiters: the full limits for a key with no state.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{KeyedRateLimiter, Limit, Rate};
    ///
    /// let limiter = KeyedRateLimiter::<&str, [u64; 2]>::builder(["requests", "tokens"])
    ///     .limit("tokens", Limit::bucket(Rate::per_minute(1_000), 500))
    ///     .limit("tokens", Limit::window(300, Duration::from_secs(86_400)))
    ///     .build()
    ///     .unwrap();
    /// limiter.try_acquire(&"a", [1, 100]).unwrap();
    /// assert_eq!(limiter.available(&"a"), [u64::MAX, 200]);
    /// assert_eq!(limiter.available(&"b"), [u64::MAX, 300]);
    /// ```
    #[must_use]
    pub fn available<Q>(&self, key: &Q) -> [u64; N]
    where
        K: Borrow<Q> + Hash,
        Q: Hash + Eq + ?Sized,
    {
        self.inner.shared.available(key)
    }

    /// Gives `key` its own limit at `index` (the number of
    /// [`limit`](KeyedRateLimiterBuilder::limit) calls before it; a tenant on a bigger
    /// plan), its other limits kept. It takes effect at once, also for the key's waiters,
    /// keeping the level as [`RateLimiter::set_limit`](crate::RateLimiter#method.set_limit-1)
    /// does. Per-key limits are configuration: kept until
    /// [`clear_limit`](KeyedRateLimiter#method.clear_limit-1), whether or not the key has state.
    ///
    /// # Panics
    ///
    /// Panics if [`try_set_limit`](KeyedRateLimiter#method.try_set_limit-1) refuses the change,
    /// with the message `"KeyedRateLimiter::set_limit: {error}"`.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{KeyedRateLimiter, Limit, Rate};
    ///
    /// let limiter = KeyedRateLimiter::<&str, [u64; 2]>::builder(["requests", "tokens"])
    ///     .limit("requests", Limit::bucket(Rate::per_minute(60), 10))
    ///     .limit("tokens", Limit::bucket(Rate::per_minute(10_000), 10_000))
    ///     .build()
    ///     .unwrap();
    /// limiter.set_limit(&"enterprise", 1, Limit::bucket(Rate::per_minute(100_000), 100_000));
    /// assert_eq!(limiter.available(&"enterprise"), [10, 100_000]);
    /// assert_eq!(limiter.available(&"free"), [10, 10_000]);
    /// ```
    #[track_caller]
    pub fn set_limit<Q>(&self, key: &Q, index: usize, limit: Limit)
    where
        K: Borrow<Q> + Hash,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        ConfigError::or_panic(
            self.try_set_limit(key, index, limit),
            "KeyedRateLimiter::set_limit",
        );
    }

    /// Gives `key` its own limit at `index`, as [`set_limit`](KeyedRateLimiter#method.set_limit-1)
    /// does, or refuses a change that cannot be and changes nothing.
    ///
    /// # Errors
    ///
    /// [`ConfigError::NoSuchLimit`] if there is no limit at `index`; [`ConfigError::LimitKind`]
    /// if the limit there is of the other kind; [`ConfigError::ZeroBurst`],
    /// [`ConfigError::ZeroQuota`], [`ConfigError::ZeroWindow`] for a limit that cannot be.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{ConfigError, KeyedRateLimiter, Limit, Rate};
    ///
    /// let limiter = KeyedRateLimiter::<u32, [u64; 1]>::builder(["requests"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(1), 2))
    ///     .build()
    ///     .unwrap();
    /// let window = Limit::window(5, Duration::from_secs(60));
    /// assert_eq!(limiter.try_set_limit(&1, 0, window), Err(ConfigError::LimitKind));
    /// assert_eq!(limiter.try_set_limit(&1, 1, window), Err(ConfigError::NoSuchLimit));
    /// ```
    pub fn try_set_limit<Q>(&self, key: &Q, index: usize, limit: Limit) -> Result<(), ConfigError>
    where
        K: Borrow<Q> + Hash,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        limit.check()?;
        let default = self
            .inner
            .shared
            .default_limit()
            .limit(index)
            .ok_or(ConfigError::NoSuchLimit)?;
        if !limit.fits(&default.rule) {
            return Err(ConfigError::LimitKind);
        }
        let rule = limit.rule(self.inner.shared.origin(), self.inner.shared.now());
        self.inner.shared.set_limit(key, move |limits: &Limits<N>| {
            let mut own = limits.clone();
            if let Some(tagged) = own.limit_mut(index) {
                tagged.rule = rule;
            }
            own
        });
        Ok(())
    }

    /// Gives `key` the builder's limits again, keeping the level of each.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{KeyedRateLimiter, Limit, Rate};
    ///
    /// let limiter = KeyedRateLimiter::<&str, [u64; 1]>::builder(["requests"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(1), 2))
    ///     .build()
    ///     .unwrap();
    /// limiter.set_limit(&"a", 0, Limit::bucket(Rate::per_second(10), 20));
    /// assert_eq!(limiter.available(&"a"), [20]);
    /// limiter.clear_limit(&"a");
    /// assert_eq!(limiter.available(&"a"), [2]);
    /// ```
    pub fn clear_limit<Q>(&self, key: &Q)
    where
        K: Borrow<Q> + Hash,
        Q: Hash + Eq + ?Sized,
    {
        self.inner.shared.clear_limit(key);
    }
}

/// What a grant of a `KeyedRateLimiter<K, [u64; N]>` charged one key, to correct it once the
/// answer is known. Dropping it keeps the charge.
///
/// # Examples
///
/// ```
/// use paced::{KeyedRateLimiter, Limit, Rate};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let limiter = KeyedRateLimiter::<&str, [u64; 2]>::builder(["requests", "tokens"])
///     .limit("tokens", Limit::bucket(Rate::per_minute(1_000), 1_000))
///     .build()
///     .unwrap();
/// let permit = limiter.acquire(&"a", [1, 300]).await;
/// assert_eq!(permit.charged(), [1, 300]);
/// permit.settle([1, 500]); // 200 more than estimated: charged as debt
/// assert_eq!(limiter.available(&"a"), [u64::MAX, 500]);
/// # }
/// ```
pub struct KeyedPermit<K, const N: usize, S = RandomState> {
    pub(super) handle: KeyOwned<K, S, Limits<N>>,
    pub(super) charged: [u64; N],
    /// When the grant was made, in the limiter's time.
    pub(super) at: Nanos,
}

impl<K: Hash + Eq + Clone, const N: usize, S: BuildHasher> KeyedPermit<K, N, S> {
    /// What the grant charged, per dimension.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{KeyedRateLimiter, Limit, Rate};
    ///
    /// let limiter = KeyedRateLimiter::<u8, [u64; 2]>::builder(["requests", "tokens"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(1), 1))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(limiter.try_acquire(&0, [1, 42]).unwrap().charged(), [1, 42]);
    /// ```
    #[must_use]
    pub fn charged(&self) -> [u64; N] {
        self.charged
    }

    /// Corrects the charge of this key to `actual`, per dimension, now, as
    /// [`Permit::settle`](crate::limiter::Permit::settle) does: a smaller amount gives the difference
    /// back at once (never beyond a limit's room; the key's waiters it now admits are woken),
    /// a larger one is charged as debt, so that the key's later grants wait. A key forgotten
    /// meanwhile (all its limits as new) is as full as it can be: nothing more comes back.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{KeyedRateLimiter, Limit, Rate};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = KeyedRateLimiter::<&str, [u64; 1]>::builder(["tokens"])
    ///     .limit("tokens", Limit::bucket(Rate::per_second(100), 100))
    ///     .build()
    ///     .unwrap();
    /// let start = Instant::now();
    /// limiter.acquire(&"a", [100]).await.settle([300]); // 200 of debt: 2 s to pay
    /// limiter.acquire(&"a", [100]).await; // and 1 s for its own tokens
    /// assert_eq!(start.elapsed(), Duration::from_secs(3));
    /// limiter.acquire(&"b", [100]).await; // another key owes nothing
    /// assert_eq!(start.elapsed(), Duration::from_secs(3));
    /// # }
    /// ```
    pub fn settle(self, actual: [u64; N]) {
        let (charged, at) = (self.charged, self.at);
        self.handle
            .correct(|limits, now| limits.settle(now, at, charged, actual));
    }
}

impl<K, const N: usize, S> fmt::Debug for KeyedPermit<K, N, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedPermit")
            .field("charged", &self.charged)
            .finish_non_exhaustive()
    }
}
