//! [`KeyedRateLimiter`]: one token bucket and one FIFO queue per key, over the engine's keyed
//! table.

use crate::limiter::cost::sealed::KeyedState;
use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::time::Duration;

use crate::engine;
use crate::engine::keyed::{KeyHandle, KeyLimit, KeyRef, KeyedShared};
use crate::error::{ConfigError, NotUntil};
use crate::limiter::Cost;
use crate::rate::Rate;
use crate::stats::Stats;

/// One token bucket per key, shared by handle: a limit per destination (an SMS provider, a
/// tenant's API, a customer's endpoint), with the semantics of [`RateLimiter`] key by key.
///
/// Every key has its own bucket of `burst` tokens refilled at `rate` (the default limit given
/// to [`new`](KeyedRateLimiter::new), or one set for that key with
/// [`set_limit`](KeyedRateLimiter::set_limit)), the same exact GCRA as
/// [`throttle`](crate::PaceExt::throttle), and its own FIFO queue: waiters of one key are
/// served in arrival order and never wait for another key. A cost above the burst pays its
/// debt, a cost of 0 passes at once, and a waiter that is dropped has taken nothing.
///
/// **Memory follows the keys in use.** A key whose bucket is full again and that nobody waits
/// for is indistinguishable from a key never seen, so it is forgotten, without any call from
/// you, and never before: [`tracked_keys`](KeyedRateLimiter::tracked_keys) counts exactly the
/// keys whose bucket is not full or that have waiters. The table forgets full keys as it goes
/// (each operation looks at one more entry), all at once when every key it holds is full
/// again, and before it would grow, so it grows only for keys in use. (governor's keyed limiter
/// keeps every key until `retain_recent()` is called.) A key takes one table entry of its key
/// and one `u64` while nobody waits on it and its limit is the default; a key with waiters or
/// a limit of its own also has a queue. Per-key limits are configuration and are kept.
///
/// Cloning is cheap (an `Arc`); every clone is the same limiter. The keys are spread over a
/// few shards, each behind its own short mutex (four per core, from 4 to 64). A key is hashed
/// once per call, before any mutex is taken, with `S`, the third parameter (std's
/// `RandomState` unless you give another to [`with_hasher`](KeyedRateLimiter::with_hasher));
/// the table hashes the keys it holds again only when it grows or shrinks. Every method that takes a key by reference takes
/// any borrowed form of it: a `KeyedRateLimiter<String>` is asked with a `&str`, and a key that
/// has state is found without allocating. Streams draw on it with
/// [`throttle_by_key`](crate::PaceExt::throttle_by_key).
///
/// With a cost of `[u64; N]`, a `KeyedRateLimiter<K, [u64; N]>` (made by
/// [`builder`](KeyedRateLimiter::builder)) holds several limits per key, each tenant's requests
/// AND tokens per minute: see its methods below. A cost of the wrong shape does not compile:
///
/// ```compile_fail,E0308
/// use paced::{KeyedRateLimiter, Rate};
///
/// let providers = KeyedRateLimiter::<&str>::new(Rate::per_second(2), 1);
/// let _ = providers.try_acquire(&"slow", [1, 300]); // one limit per key: a cost is a `u64`
/// ```
///
/// [`RateLimiter`]: crate::RateLimiter
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paced::{KeyedRateLimiter, Rate};
/// use tokio::time::Instant;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // Every provider: 2 messages per second, one at a time; "fast" allows 10 per second.
/// let providers = KeyedRateLimiter::new(Rate::per_second(2), 1);
/// providers.set_limit(&"fast", Rate::per_second(10), 1);
/// let start = Instant::now();
/// for _ in 0..3 {
///     providers.acquire(&"slow", 1).await;
/// }
/// assert_eq!(start.elapsed(), Duration::from_secs(1));
/// // "fast" has its own bucket: it never waited for "slow".
/// providers.acquire(&"fast", 1).await;
/// assert_eq!(start.elapsed(), Duration::from_secs(1));
/// # }
/// ```
pub struct KeyedRateLimiter<K, C: Cost = u64, S = RandomState> {
    pub(crate) inner: C::Keyed<K, S>,
}

impl<K, C: Cost, S> Clone for KeyedRateLimiter<K, C, S> {
    fn clone(&self) -> Self {
        KeyedRateLimiter {
            inner: self.inner.clone(),
        }
    }
}

/// Shows the limiter's identity only (clones show the same): reading its state would take its
/// locks.
impl<K, C: Cost, S> fmt::Debug for KeyedRateLimiter<K, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

/// A [`KeyedRateLimiter`]'s state for one limit per key: public in a private module (see
/// [`Cost`]).
pub struct One<K, S> {
    pub(crate) shared: Arc<KeyedShared<K, S>>,
}

impl<K, S> Clone for One<K, S> {
    fn clone(&self) -> Self {
        One {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K> KeyedRateLimiter<K> {
    /// A keyed limiter whose keys each have `burst` tokens refilled at `rate`, unless
    /// [`set_limit`](KeyedRateLimiter::set_limit) says otherwise for a key.
    ///
    /// # Panics
    ///
    /// Panics if `burst` is 0, with the message `"KeyedRateLimiter::new: {error}"` (the
    /// [`ConfigError`]). Use [`KeyedRateLimiter::try_new`] for values from configuration.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{KeyedRateLimiter, Rate};
    ///
    /// let per_tenant = KeyedRateLimiter::<u32>::new(Rate::per_second(100), 10);
    /// assert_eq!(per_tenant.available(&7), 10);
    /// ```
    #[track_caller]
    #[must_use]
    pub fn new(rate: Rate, burst: u64) -> KeyedRateLimiter<K> {
        match KeyedRateLimiter::try_new(rate, burst) {
            Ok(limiter) => limiter,
            Err(e) => panic!("KeyedRateLimiter::new: {e}"),
        }
    }

    /// A keyed limiter (see [`new`](KeyedRateLimiter::new)), or a [`ConfigError`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroBurst`] if `burst` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{ConfigError, KeyedRateLimiter, Rate};
    ///
    /// let err = KeyedRateLimiter::<String>::try_new(Rate::per_second(1), 0).err();
    /// assert_eq!(err, Some(ConfigError::ZeroBurst));
    /// ```
    pub fn try_new(rate: Rate, burst: u64) -> Result<KeyedRateLimiter<K>, ConfigError> {
        KeyedRateLimiter::try_with_hasher(rate, burst, RandomState::new())
    }
}

impl<K, S: BuildHasher> KeyedRateLimiter<K, u64, S> {
    /// A keyed limiter (see [`new`](KeyedRateLimiter::new)) that hashes keys with `hasher`:
    /// a faster hasher for keys no adversary chooses, or a fixed one for repeatable runs.
    ///
    /// # Panics
    ///
    /// Panics if `burst` is 0, with the message `"KeyedRateLimiter::with_hasher: {error}"` (the
    /// [`ConfigError`]). Use [`KeyedRateLimiter::try_with_hasher`] for values from
    /// configuration.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::hash::BuildHasherDefault;
    /// use std::collections::hash_map::DefaultHasher;
    /// use paced::{KeyedRateLimiter, Rate};
    ///
    /// let hasher = BuildHasherDefault::<DefaultHasher>::default();
    /// let limiter = KeyedRateLimiter::<u64, u64, _>::with_hasher(Rate::per_second(5), 1, hasher);
    /// assert!(limiter.try_acquire(&7, 1).is_ok());
    /// ```
    #[track_caller]
    #[must_use]
    pub fn with_hasher(rate: Rate, burst: u64, hasher: S) -> KeyedRateLimiter<K, u64, S> {
        match KeyedRateLimiter::try_with_hasher(rate, burst, hasher) {
            Ok(limiter) => limiter,
            Err(e) => panic!("KeyedRateLimiter::with_hasher: {e}"),
        }
    }

    /// A keyed limiter that hashes keys with `hasher` (see
    /// [`with_hasher`](KeyedRateLimiter::with_hasher)), or a [`ConfigError`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroBurst`] if `burst` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::collections::hash_map::RandomState;
    /// use paced::{ConfigError, KeyedRateLimiter, Rate};
    ///
    /// let hasher = RandomState::new();
    /// let err = KeyedRateLimiter::<u64, u64, _>::try_with_hasher(Rate::per_second(1), 0, hasher);
    /// assert_eq!(err.err(), Some(ConfigError::ZeroBurst));
    /// ```
    pub fn try_with_hasher(
        rate: Rate,
        burst: u64,
        hasher: S,
    ) -> Result<KeyedRateLimiter<K, u64, S>, ConfigError> {
        if burst == 0 {
            return Err(ConfigError::ZeroBurst);
        }
        Ok(KeyedRateLimiter {
            inner: One {
                shared: Arc::new(KeyedShared::new(KeyLimit { rate, burst }, hasher)),
            },
        })
    }

    /// Gives `key` its own limit: `burst` tokens refilled at `rate` (a provider that allows
    /// more, a tenant on a bigger plan). It takes effect at once, also for the key's waiters,
    /// keeping the level in tokens as [`RateLimiter::set_rate`](crate::RateLimiter::set_rate)
    /// does (what the bucket holds, or what a waiter lacks), capped at the new `burst`.
    ///
    /// # Panics
    ///
    /// Panics if `burst` is 0, with the message `"KeyedRateLimiter::set_limit: {error}"` (the
    /// [`ConfigError`]). Use [`try_set_limit`](KeyedRateLimiter::try_set_limit) for values
    /// from configuration.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{KeyedRateLimiter, Rate};
    ///
    /// // Keyed by `String`, asked with `&str`: the key is copied only if it is new.
    /// let providers = KeyedRateLimiter::<String>::new(Rate::per_second(1), 1);
    /// providers.set_limit("bulk", Rate::per_second(50), 5);
    /// assert_eq!(providers.available("bulk"), 5);
    /// assert_eq!(providers.available("other"), 1);
    /// ```
    #[track_caller]
    pub fn set_limit<Q>(&self, key: &Q, rate: Rate, burst: u64)
    where
        K: Borrow<Q> + Hash,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        ConfigError::or_panic(
            self.try_set_limit(key, rate, burst),
            "KeyedRateLimiter::set_limit",
        );
    }

    /// Gives `key` its own limit, as [`set_limit`](KeyedRateLimiter::set_limit) does, or
    /// refuses a limit that cannot be and changes nothing.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroBurst`] if `burst` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{ConfigError, KeyedRateLimiter, Rate};
    ///
    /// let providers = KeyedRateLimiter::<String>::new(Rate::per_second(1), 1);
    /// assert_eq!(providers.try_set_limit("bulk", Rate::per_second(50), 0), Err(ConfigError::ZeroBurst));
    /// assert_eq!(providers.try_set_limit("bulk", Rate::per_second(50), 5), Ok(()));
    /// assert_eq!(providers.available("bulk"), 5);
    /// ```
    pub fn try_set_limit<Q>(&self, key: &Q, rate: Rate, burst: u64) -> Result<(), ConfigError>
    where
        K: Borrow<Q> + Hash,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if burst == 0 {
            return Err(ConfigError::ZeroBurst);
        }
        let limit = KeyLimit { rate, burst };
        self.inner.shared.set_limit(key, move |_: &KeyLimit| limit);
        Ok(())
    }

    /// Gives `key` the default limit again, from now on, keeping its level as
    /// [`set_limit`](KeyedRateLimiter::set_limit) does.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{KeyedRateLimiter, Rate};
    ///
    /// let providers = KeyedRateLimiter::<String>::new(Rate::per_second(1), 1);
    /// providers.set_limit("bulk", Rate::per_second(50), 5);
    /// providers.clear_limit("bulk");
    /// assert_eq!(providers.available("bulk"), 1);
    /// ```
    pub fn clear_limit<Q>(&self, key: &Q)
    where
        K: Borrow<Q> + Hash,
        Q: Hash + Eq + ?Sized,
    {
        self.inner.shared.clear_limit(key);
    }

    /// Waits until `cost` tokens of `key` are granted, behind the key's earlier waiters only.
    ///
    /// As [`RateLimiter::acquire`](crate::RateLimiter::acquire), key by key: a cost above the
    /// key's burst pays its debt, a cost of 0 passes at once, and dropping the future gives its
    /// place to the next waiter of the key; it has taken nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{KeyedRateLimiter, Rate};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = KeyedRateLimiter::new(Rate::per_second(10), 1);
    /// let start = Instant::now();
    /// limiter.acquire(&"a", 1).await;
    /// limiter.acquire(&"a", 1).await;
    /// assert_eq!(start.elapsed().as_millis(), 100);
    /// # }
    /// ```
    pub fn acquire<'a, Q>(&'a self, key: &'a Q, cost: u64) -> impl Future<Output = ()> + 'a
    where
        K: Borrow<Q> + Hash,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // The engine's future itself, no `async fn` around it: the key is hashed here.
        let handle: KeyRef<'_, K, Q, S> = KeyHandle::new(&*self.inner.shared, key);
        engine::Granted::new(engine::Acquire::new(handle, cost, None))
    }

    /// Takes `cost` tokens of `key` if they are there now and nobody waits for the key; never
    /// waits.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] with how long until the request could be granted (after the key's
    /// waiters); `Duration::MAX` for a cost above the key's burst. A refusal takes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{KeyedRateLimiter, Rate};
    ///
    /// let limiter = KeyedRateLimiter::new(Rate::per_second(4), 1);
    /// assert!(limiter.try_acquire(&"a", 1).is_ok());
    /// let refused = limiter.try_acquire(&"a", 1).unwrap_err();
    /// assert!(refused.retry_after() <= Duration::from_millis(250));
    /// assert!(limiter.try_acquire(&"b", 1).is_ok()); // another key, another bucket
    /// ```
    pub fn try_acquire<Q>(&self, key: &Q, cost: u64) -> Result<(), NotUntil>
    where
        K: Borrow<Q> + Hash,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.inner
            .shared
            .try_acquire(self.inner.shared.hash(key), key, cost)
            .map(|_| ())
    }

    /// Waits for `cost` tokens of `key` only if they can be had within `timeout` (after the
    /// key's waiters); otherwise returns at once, taking nothing.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] with how long the request would have waited.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{KeyedRateLimiter, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = KeyedRateLimiter::new(Rate::per_second(1), 1);
    /// limiter.acquire(&1, 1).await;
    /// let refused = limiter.acquire_timeout(&1, 1, Duration::from_millis(500)).await;
    /// assert_eq!(refused.unwrap_err().retry_after(), Duration::from_secs(1));
    /// assert!(limiter.acquire_timeout(&1, 1, Duration::from_secs(1)).await.is_ok());
    /// # }
    /// ```
    pub fn acquire_timeout<'a, Q>(
        &'a self,
        key: &'a Q,
        cost: u64,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), NotUntil>> + 'a
    where
        K: Borrow<Q> + Hash,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let handle: KeyRef<'_, K, Q, S> = KeyHandle::new(&*self.inner.shared, key);
        engine::Answered::new(engine::Acquire::new(handle, cost, Some(timeout)))
    }

    /// The whole tokens of `key` that could be taken now, ignoring its waiters: its burst for a
    /// key with no state.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{KeyedRateLimiter, Rate};
    ///
    /// let limiter = KeyedRateLimiter::new(Rate::per_second(1), 3);
    /// limiter.try_acquire(&"a", 2).unwrap();
    /// assert_eq!(limiter.available(&"a"), 1);
    /// assert_eq!(limiter.available(&"b"), 3);
    /// ```
    #[must_use]
    pub fn available<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q> + Hash,
        Q: Hash + Eq + ?Sized,
    {
        self.inner.shared.available(key)
    }
}

/// What every keyed limiter does, whatever its cost: one limit or several per key.
impl<K, C: Cost, S> KeyedRateLimiter<K, C, S> {
    /// How many keys hold state now: those with a limit that is not full, or with waiters.
    /// Per-key limits are configuration and are not counted.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{KeyedRateLimiter, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = KeyedRateLimiter::new(Rate::per_second(10), 1);
    /// for key in 0..1000 {
    ///     limiter.try_acquire(&key, 1).unwrap();
    /// }
    /// assert_eq!(limiter.tracked_keys(), 1000);
    /// tokio::time::sleep(Duration::from_millis(100)).await; // every bucket is full again
    /// assert_eq!(limiter.tracked_keys(), 0);
    /// # }
    /// ```
    #[must_use]
    pub fn tracked_keys(&self) -> usize
    where
        K: Hash,
        S: BuildHasher,
    {
        self.inner.tracked_keys()
    }

    /// A snapshot of the counters over all keys: granted, rejected, waiting now, total wait.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{KeyedRateLimiter, Rate};
    ///
    /// let limiter = KeyedRateLimiter::new(Rate::per_second(1), 1);
    /// limiter.try_acquire(&"a", 1).unwrap();
    /// limiter.try_acquire(&"a", 1).unwrap_err();
    /// limiter.try_acquire(&"b", 1).unwrap();
    /// let stats = limiter.stats();
    /// assert_eq!((stats.granted, stats.rejected, stats.waiting), (2, 1, 0));
    /// ```
    #[must_use]
    pub fn stats(&self) -> Stats
    where
        S: BuildHasher,
    {
        self.inner.stats()
    }

    /// Records to the [`metrics`](https://docs.rs/metrics) facade under `name` (feature
    /// `metrics`), over all keys (keys are not labels: their number is unbounded):
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
    /// use paced::{KeyedRateLimiter, Rate};
    ///
    /// let limiter = KeyedRateLimiter::new(Rate::per_second(1), 1).with_metrics("per-tenant");
    /// limiter.try_acquire(&"a", 1).unwrap();
    /// limiter.try_acquire(&"a", 1).unwrap_err(); // paced_refusals_total{limiter="per-tenant"}
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    #[must_use]
    pub fn with_metrics(self, name: impl AsRef<str>) -> Self
    where
        S: BuildHasher,
    {
        self.inner.set_metrics(name.as_ref());
        self
    }
}

impl<K, S> KeyedState<K, S> for One<K, S> {
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

impl<K, S> fmt::Debug for One<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRateLimiter")
            .field("id", &Arc::as_ptr(&self.shared))
            .finish_non_exhaustive()
    }
}
