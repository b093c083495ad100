//! [`RedisKeyedRateLimiter<K, [u64; N]>`](RedisKeyedRateLimiter): a quota of several limits per
//! key across a fleet, each key's limits in one Redis key `{name:key}`; every key is served by
//! the one implementation of [`RedisRateLimiter<[u64; N]>`](RedisRateLimiter).

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::fmt::{self, Display};
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use super::builder::sealed::Build;
use super::builder::{OneLimit, Options, RedisLimiterBuilder};
use super::connect::Target;
use super::dimensions::Dimensions;
use super::error::{RedisLimiterError, TryAcquireError};
use super::key::Prefix;
use super::keyed::{KeyedOne, RedisKeyedRateLimiter, RedisKeyedRateLimiterBuilder};
use super::limiter::RedisRateLimiter;
use super::settle::RedisPermit;
use super::several::{Form, Inner, Quota, Several};
use super::stats::RedisStats;
use crate::limiter::Limit;
use crate::sync::{lock, Mutex};

/// Keys known to this process are forgotten (when no request of theirs is in flight) once
/// there are more than this many.
const KEYS_KEPT: usize = 4_096;

/// The keys this process knows, and when to sweep the idle ones.
struct Quotas<K, const N: usize> {
    map: HashMap<K, Arc<Quota<N>>>,
    /// The size at which the next new key sweeps: twice what the last sweep kept (at least
    /// [`KEYS_KEPT`]), so that a sweep's cost is spread over as many new keys as it kept, and
    /// keeping many keys busy does not make every new key walk them all.
    sweep_at: usize,
}

impl<K: Hash + Eq, const N: usize> Quotas<K, N> {
    fn new() -> Self {
        Quotas {
            map: HashMap::new(),
            sweep_at: KEYS_KEPT,
        }
    }

    /// `key`'s quota, made by `make` if this process does not know the key yet.
    fn get_or_insert<Q>(&mut self, key: &Q, make: impl FnOnce() -> Quota<N>) -> Arc<Quota<N>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self.map.get(key) {
            Some(quota) => quota.clone(),
            None => self.keep(key, Arc::new(make())),
        }
    }

    /// Keeps `quota` as `key`'s, unless the process knows the key already: then the quota it
    /// knows.
    fn keep<Q>(&mut self, key: &Q, quota: Arc<Quota<N>>) -> Arc<Quota<N>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(known) = self.map.get(key) {
            return known.clone();
        }
        if self.map.len() >= self.sweep_at {
            // Forget the keys with nothing in flight here (a permit, a waiter), not in use (a
            // lease, tokens on their way back, a grant within the lease's age), no limit set
            // by this process (its fallback's) and no outage's fallback that a new one would
            // not equal (see `Quota::holds_state`).
            self.map
                .retain(|_, q| Arc::strong_count(q) > 1 || q.holds_state());
            self.sweep_at = KEYS_KEPT.max(self.map.len().saturating_mul(2));
        }
        self.map.insert(key.to_owned(), quota.clone());
        quota
    }
}

impl<K> Build for RedisKeyedRateLimiter<K>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    type Cost = u64;
    type Spec = OneLimit;

    fn build(options: Options<u64>, limit: OneLimit) -> Result<Self, RedisLimiterError> {
        // A key's first round trip takes only its cost (see `Inner::eager_lease`).
        let several = Several::one(options, limit, false)?;
        Ok(RedisKeyedRateLimiter {
            inner: KeyedOne {
                several: RedisKeyedRateLimiter {
                    inner: KeyedSeveral::new(several),
                },
            },
        })
    }
}

impl<K, const N: usize> Build for RedisKeyedRateLimiter<K, [u64; N]>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    type Cost = [u64; N];
    type Spec = Dimensions<N>;

    fn build(options: Options<[u64; N]>, spec: Dimensions<N>) -> Result<Self, RedisLimiterError> {
        // A key's first round trip takes only its cost (see `Inner::eager_lease`).
        let form = Form {
            eager_lease: false,
            one: false,
        };
        Ok(RedisKeyedRateLimiter {
            inner: KeyedSeveral::new(Several::build(options, spec, form)?),
        })
    }
}

impl<K, const N: usize> RedisLimiterBuilder<RedisKeyedRateLimiter<K, [u64; N]>>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    /// Adds `limit` on the dimension called `name`, for every key; see
    /// [`RedisRateLimiterBuilder::limit`](RedisLimiterBuilder#method.limit-1).
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Limit, Rate, RedisKeyedRateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let per_tenant = RedisKeyedRateLimiter::<String, _>::dimensions("redis://127.0.0.1/", "llm", ["requests", "tokens"])
    ///     .limit("requests", Limit::bucket(Rate::per_minute(60), 10))
    ///     .limit("tokens", Limit::bucket(Rate::per_minute(10_000), 10_000))
    ///     .build();
    /// assert!(per_tenant.is_ok());
    /// # }
    /// ```
    pub fn limit(mut self, name: &str, limit: Limit) -> Self {
        self.spec.limit(name, limit);
        self
    }
}

/// A [`RedisKeyedRateLimiter`]'s state for several limits per key: public in a private
/// module (see [`Cost`](crate::limiter::Cost)).
pub struct KeyedSeveral<K, const N: usize> {
    pub(super) shared: Arc<Inner<N>>,
    naming: Arc<Prefix>,
    quotas: Arc<Mutex<Quotas<K, N>>>,
    /// How a stream over this limiter files its held items by key.
    pub(super) hasher: RandomState,
}

impl<K: Hash + Eq, const N: usize> KeyedSeveral<K, N> {
    /// The keyed limiter whose quotas share what `several` holds (its own quota unused).
    pub(super) fn new(several: Several<N>) -> Self {
        KeyedSeveral {
            naming: Arc::new(Prefix(several.quota.shared.name.clone())),
            shared: several.quota.shared.clone(),
            quotas: Arc::new(Mutex::new(Quotas::new())),
            hasher: RandomState::new(),
        }
    }
}

impl<K, const N: usize> Clone for KeyedSeveral<K, N> {
    fn clone(&self) -> Self {
        KeyedSeveral {
            shared: self.shared.clone(),
            naming: self.naming.clone(),
            quotas: self.quotas.clone(),
            hasher: self.hasher.clone(),
        }
    }
}

impl<K, const N: usize> fmt::Debug for KeyedSeveral<K, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisKeyedRateLimiter")
            .field("name", &self.shared.name)
            .field("keys", &lock(&self.quotas).map.len())
            .finish_non_exhaustive()
    }
}

/// A quota of several limits per key, across processes and machines, kept in Redis (feature
/// `redis`): for every key, what a [`RedisRateLimiter`] is for its one quota (each key's
/// limits in one Redis key, `{name:key}`, so in one Cluster slot; checked and charged by one
/// script call; the same failure policies), all keys under the same limits.
///
/// # Examples
///
/// ```no_run
/// use paced::redis::RedisKeyedRateLimiter;
/// use paced::{Limit, Rate};
///
/// # async fn demo() -> Result<(), paced::redis::RedisLimiterError> {
/// let per_tenant: RedisKeyedRateLimiter<String, [u64; 2]> =
///     RedisKeyedRateLimiter::dimensions("redis://127.0.0.1/", "llm", ["requests", "tokens"])
///         .limit("requests", Limit::bucket(Rate::per_minute(60), 10))
///         .limit("tokens", Limit::bucket(Rate::per_minute(10_000), 10_000))
///         .build()?;
/// let permit = per_tenant.acquire("tenant-7", [1, 500]).await?;
/// permit.settle([1, 320]).await?;
/// # Ok(())
/// # }
/// ```
impl<K, const N: usize> RedisKeyedRateLimiter<K, [u64; N]>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    /// A builder for quotas kept in the Redis server at `url`, key `k`'s under `{name:k}`,
    /// with the dimensions `names`, whose limits are added by
    /// [`limit`](RedisLimiterBuilder::limit); see [`RedisRateLimiter::dimensions`]. (Quotas of
    /// one limit per key are made by [`RedisKeyedRateLimiter::builder`].)
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Limit, Rate, RedisKeyedRateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let per_tenant: RedisKeyedRateLimiter<String, [u64; 2]> =
    ///     RedisKeyedRateLimiter::dimensions("redis://127.0.0.1/", "llm", ["requests", "tokens"])
    ///         .limit("requests", Limit::bucket(Rate::per_minute(60), 10))
    ///         .build()
    ///         .unwrap();
    /// # let _ = per_tenant;
    /// # }
    /// ```
    pub fn dimensions(
        url: &str,
        name: impl Into<String>,
        names: [&str; N],
    ) -> RedisKeyedRateLimiterBuilder<K, [u64; N]> {
        RedisLimiterBuilder::several(Target::Url(url.to_owned()), name, names)
    }

    /// [`dimensions`](Self::dimensions) for a Redis Cluster reached through `nodes`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use paced::{Limit, Rate, RedisKeyedRateLimiter};
    ///
    /// # async fn demo() -> Result<(), paced::redis::RedisLimiterError> {
    /// let nodes = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"];
    /// let per_tenant: RedisKeyedRateLimiter<String, [u64; 2]> =
    ///     RedisKeyedRateLimiter::cluster_dimensions(&nodes, "llm", ["requests", "tokens"])
    ///         .limit("requests", Limit::bucket(Rate::per_minute(60), 10))
    ///         .build()?;
    /// let _permit = per_tenant.acquire("tenant-7", [1, 0]).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn cluster_dimensions(
        nodes: &[&str],
        name: impl Into<String>,
        names: [&str; N],
    ) -> RedisKeyedRateLimiterBuilder<K, [u64; N]> {
        RedisLimiterBuilder::several(Target::cluster(nodes), name, names)
    }

    /// `key`'s quota, as a one-key limiter over this limiter's connection and counters.
    pub(super) fn quota<Q>(&self, key: &Q) -> RedisRateLimiter<[u64; N]>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        let quota = lock(&self.inner.quotas).get_or_insert(key, || self.new_quota(key));
        self.on(quota)
    }

    /// A new quota for `key`, not kept.
    fn new_quota<Q: Display + ?Sized>(&self, key: &Q) -> Quota<N> {
        Quota::new(self.inner.naming.redis_key(key), self.inner.shared.clone())
    }

    /// The limiter of one quota, `quota`.
    fn on(&self, quota: Arc<Quota<N>>) -> RedisRateLimiter<[u64; N]> {
        RedisRateLimiter {
            inner: Several { quota },
        }
    }

    /// Waits until every limit of `key`'s quota grants `cost`, as the several-limit
    /// [`RedisRateLimiter::acquire`](RedisRateLimiter#method.acquire-1) does.
    ///
    /// # Errors
    ///
    /// As [`RedisRateLimiter::acquire`](RedisRateLimiter#method.acquire-1)'s.
    pub async fn acquire<Q>(
        &self,
        key: &Q,
        cost: [u64; N],
    ) -> Result<RedisPermit<N>, RedisLimiterError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        self.quota(key).acquire(cost).await
    }

    /// Waits at most `timeout` for `key`'s quota, as the several-limit
    /// [`RedisRateLimiter::acquire_timeout`](RedisRateLimiter#method.acquire_timeout-1) does.
    ///
    /// # Errors
    ///
    /// As [`RedisRateLimiter::acquire_timeout`](RedisRateLimiter#method.acquire_timeout-1)'s.
    pub async fn acquire_timeout<Q>(
        &self,
        key: &Q,
        cost: [u64; N],
        timeout: Duration,
    ) -> Result<RedisPermit<N>, TryAcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        self.quota(key).acquire_timeout(cost, timeout).await
    }

    /// Grants `cost` of `key`'s quota if every limit holds it now, as the several-limit
    /// [`RedisRateLimiter::try_acquire`](RedisRateLimiter#method.try_acquire-1) does.
    ///
    /// # Errors
    ///
    /// As [`RedisRateLimiter::try_acquire`](RedisRateLimiter#method.try_acquire-1)'s.
    pub async fn try_acquire<Q>(
        &self,
        key: &Q,
        cost: [u64; N],
    ) -> Result<RedisPermit<N>, TryAcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        let known = lock(&self.inner.quotas).map.get(key).cloned();
        if let Some(quota) = known {
            return self.on(quota).try_acquire(cost).await;
        }
        // A key this process holds nothing for is tried on a quota of its own, kept only if
        // the call leaves state in it (a grant within the lease's age, the fallback of an
        // outage): a key tried once costs no entry among the keys known, nor a sweep.
        let quota = Arc::new(self.new_quota(key));
        let keep = || lock(&self.inner.quotas).keep(key, quota.clone());
        let on = self.on(quota.clone());
        let answer = on.try_acquire_keeping(cost, Some(keep)).await;
        if quota.holds_state() {
            lock(&self.inner.quotas).keep(key, quota);
        }
        answer
    }

    /// Replaces the limit at `index` of `key`'s quota in Redis, for every process, keeping its
    /// level, as the several-limit
    /// [`RedisRateLimiter::set_limit`](RedisRateLimiter#method.set_limit-1) does. The other
    /// keys keep the builder's limits. This process remembers it for its fail-open fallback,
    /// until [`clear_limit`](RedisKeyedRateLimiter#method.clear_limit-1).
    ///
    /// # Errors
    ///
    /// As [`RedisRateLimiter::set_limit`](RedisRateLimiter#method.set_limit-1)'s.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use paced::{Limit, Rate};
    ///
    /// # async fn demo(per_tenant: paced::redis::RedisKeyedRateLimiter<String, [u64; 2]>) -> Result<(), paced::redis::RedisLimiterError> {
    /// // A premium tenant: ten times the requests (the builder's first limit).
    /// per_tenant.set_limit("tenant-7", 0, Limit::bucket(Rate::per_minute(600), 100)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn set_limit<Q>(
        &self,
        key: &Q,
        index: usize,
        limit: Limit,
    ) -> Result<(), RedisLimiterError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        self.quota(key).set_limit(index, limit).await
    }

    /// Gives `key`'s quota the builder's limits again, for every process, keeping its levels, as
    /// the several-limit [`RedisRateLimiter::clear_limit`](RedisRateLimiter#method.clear_limit-1)
    /// does. This process forgets the limits it had set for the key: its fail-open fallback takes
    /// `share` of the builder's again.
    ///
    /// # Errors
    ///
    /// As [`RedisRateLimiter::clear_limit`](RedisRateLimiter#method.clear_limit-1)'s.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(per_tenant: paced::redis::RedisKeyedRateLimiter<String, [u64; 2]>) -> Result<(), paced::redis::RedisLimiterError> {
    /// per_tenant.clear_limit("tenant-7").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn clear_limit<Q>(&self, key: &Q) -> Result<(), RedisLimiterError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        self.quota(key).clear_limit().await
    }

    /// This process's counters, over all keys (`keys`: those this process holds state for
    /// now, see [`RedisStats::keys`]).
    pub fn stats(&self) -> RedisStats {
        let keys = lock(&self.inner.quotas)
            .map
            .values()
            .filter(|quota| quota.in_use())
            .count();
        RedisStats::read(&self.inner.shared.counters, keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rate;

    fn limiter() -> RedisKeyedRateLimiter<u32, [u64; 2]> {
        // Nothing is sent before the first acquisition: no server is needed.
        RedisKeyedRateLimiter::dimensions("redis://127.0.0.1:1/", "t", ["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_second(10), 10))
            .build()
            .expect("a limiter")
    }

    fn kept(limiter: &RedisKeyedRateLimiter<u32, [u64; 2]>) -> (usize, usize) {
        let quotas = lock(&limiter.inner.quotas);
        (quotas.map.len(), quotas.sweep_at)
    }

    #[tokio::test]
    async fn a_key_holding_a_lease_is_kept_by_the_sweeps() {
        let limiter: RedisKeyedRateLimiter<u32, [u64; 2]> =
            RedisKeyedRateLimiter::dimensions("redis://127.0.0.1:1/", "t", ["requests", "tokens"])
                .limit("requests", Limit::bucket(Rate::per_second(10), 10))
                .lease([5, 0], Duration::from_secs(60))
                .build()
                .expect("a limiter");
        let leased = limiter.quota(&0);
        lock(&leased.inner.quota.lease).held = Some(super::super::several::Lease {
            left: [5, 0],
            until: tokio::time::Instant::now() + Duration::from_secs(60),
            at_us: 0,
        });
        let quota = Arc::downgrade(&leased.inner.quota);
        drop(leased);
        // Sweeps over 10,000 keys held by no one: the key with its lease stays, the same quota.
        for key in 1..10_000 {
            drop(limiter.quota(&key));
        }
        assert!(kept(&limiter).0 <= KEYS_KEPT);
        let again = limiter.quota(&0);
        assert!(quota
            .upgrade()
            .is_some_and(|q| Arc::ptr_eq(&q, &again.inner.quota)));
    }

    #[tokio::test]
    async fn a_fallback_is_full_again_after_its_own_burst_at_its_own_rate() {
        let limiter: RedisKeyedRateLimiter<u32, [u64; 2]> =
            RedisKeyedRateLimiter::dimensions("redis://127.0.0.1:1/", "t", ["requests", "tokens"])
                .limit("requests", Limit::bucket(Rate::per_second(10), 1))
                .limit("tokens", Limit::window(5, Duration::from_millis(300)))
                .failure_policy(super::super::FailurePolicy::FailOpen { share: 0.25 })
                .build()
                .expect("a limiter");
        // The fallback's bucket holds at least one token, refilled at a quarter of the rate:
        // 400 ms, where the builder's bucket is full again after 100 ms; the window, 300 ms.
        let full = limiter.inner.shared.full_after();
        let ms = full.as_secs_f64() * 1e3;
        assert!((ms - 400.0).abs() < 1e-3, "{full:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_whose_fallback_stood_in_lately_is_kept_by_the_sweeps() {
        // Its limits are full again 1 s after they were last used: requests 10/s, burst 10,
        // and so are its fallback's (all of them).
        let limiter: RedisKeyedRateLimiter<u32, [u64; 2]> =
            RedisKeyedRateLimiter::dimensions("redis://127.0.0.1:1/", "t", ["requests", "tokens"])
                .limit("requests", Limit::bucket(Rate::per_second(10), 10))
                .failure_policy(super::super::FailurePolicy::FailOpen { share: 1.0 })
                .build()
                .expect("a limiter");
        let quota = limiter.quota(&0);
        lock(&quota.inner.quota.fallback).open(|| {
            crate::RateLimiter::builder(["requests", "tokens"])
                .limit("requests", Limit::bucket(Rate::per_second(5), 5))
                .build()
                .expect("a fallback")
        });
        let kept = Arc::downgrade(&quota.inner.quota);
        drop(quota);
        // Its second in charge is over, its limits are not full again yet: sweeps over
        // 10,000 keys held by no one keep it.
        tokio::time::advance(Duration::from_millis(1_500)).await;
        for key in 1..10_000 {
            drop(limiter.quota(&key));
        }
        let again = limiter.quota(&0);
        assert!(kept
            .upgrade()
            .is_some_and(|q| Arc::ptr_eq(&q, &again.inner.quota)));
        drop(again);
        // Full again a second after its second in charge: forgotten by the next sweep.
        tokio::time::advance(Duration::from_millis(501)).await;
        for key in 10_000..20_000 {
            drop(limiter.quota(&key));
        }
        assert!(kept.upgrade().is_none());
    }

    #[tokio::test]
    async fn idle_keys_are_forgotten_and_keys_in_use_are_kept() {
        let limiter = limiter();
        // 10,000 keys, none held: at most KEYS_KEPT are known at any time.
        for key in 0..10_000 {
            drop(limiter.quota(&key));
            assert!(kept(&limiter).0 <= KEYS_KEPT);
        }
        // The same keys' quotas are found again while they are held...
        let held: Vec<_> = (0..10_000).map(|key| limiter.quota(&key)).collect();
        assert_eq!(kept(&limiter).0, 10_000);
        for (key, quota) in held.iter().enumerate().step_by(997) {
            let again = limiter.quota(&(key as u32));
            assert!(Arc::ptr_eq(&again.inner.quota, &quota.inner.quota));
        }
        // ... and a sweep that kept them all waits for as many new keys again: sweeps are
        // spread out, not one per new key.
        let (len, sweep_at) = kept(&limiter);
        assert!(sweep_at > len && sweep_at <= 2 * len, "{len} {sweep_at}");
        drop(held);
        // Once they are dropped, the next sweep forgets them.
        for key in 10_000..10_000 + (sweep_at - len) as u32 + 1 {
            drop(limiter.quota(&key));
        }
        assert!(kept(&limiter).0 <= KEYS_KEPT, "{:?}", kept(&limiter));
    }
}
