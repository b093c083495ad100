//! [`RedisKeyedMultiRateLimiter`]: a quota of several limits per key across a fleet, each key's
//! limits in one Redis key `{name:key}`; every key is served by the one implementation of
//! [`RedisMultiRateLimiter`].

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt::{self, Display};
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use super::error::{RedisLimiterError, TryAcquireError};
use super::key::Naming;
use super::multi::{
    Inner, Quota, RedisMultiPermit, RedisMultiRateLimiter, RedisMultiRateLimiterBuilder,
};
use super::policy::FailurePolicy;
use super::stats::RedisStats;
use crate::limiter::Limit;
use crate::sync::{lock, Mutex};

/// Keys known to this process are forgotten (when no request of theirs is in flight) once
/// there are more than this many.
const KEYS_KEPT: usize = 4_096;

/// Builds a [`RedisKeyedMultiRateLimiter`]: the options of [`RedisMultiRateLimiterBuilder`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct RedisKeyedMultiRateLimiterBuilder<K, const N: usize> {
    builder: RedisMultiRateLimiterBuilder<N>,
    key: PhantomData<fn() -> K>,
}

impl<K, const N: usize> RedisKeyedMultiRateLimiterBuilder<K, N>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    /// Adds `limit` on the dimension called `name`, for every key; see
    /// [`RedisMultiRateLimiterBuilder::limit`].
    pub fn limit(self, name: &str, limit: Limit) -> Self {
        self.map(|b| b.limit(name, limit))
    }

    /// See [`RedisMultiRateLimiterBuilder::failure_policy`]; under `FailOpen` each key falls
    /// back to a local limiter of its own.
    pub fn failure_policy(self, policy: FailurePolicy) -> Self {
        self.map(|b| b.failure_policy(policy))
    }

    /// See [`RedisMultiRateLimiterBuilder::lease`]: a lease per key, in each process.
    pub fn lease(self, max_tokens: [u64; N], max_age: Duration) -> Self {
        self.map(|b| b.lease(max_tokens, max_age))
    }

    /// See [`RedisMultiRateLimiterBuilder::response_timeout`].
    pub fn response_timeout(self, timeout: Duration) -> Self {
        self.map(|b| b.response_timeout(timeout))
    }

    /// See [`RedisMultiRateLimiterBuilder::with_metrics`] (over all keys: keys are not labels).
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn with_metrics(self, name: impl AsRef<str>) -> Self {
        self.map(|b| b.with_metrics(name))
    }

    fn map(
        self,
        f: impl FnOnce(RedisMultiRateLimiterBuilder<N>) -> RedisMultiRateLimiterBuilder<N>,
    ) -> Self {
        RedisKeyedMultiRateLimiterBuilder {
            builder: f(self.builder),
            key: PhantomData,
        }
    }

    /// The limiter; see [`RedisMultiRateLimiterBuilder::build`].
    ///
    /// # Errors
    ///
    /// As [`RedisMultiRateLimiterBuilder::build`].
    pub fn build(self) -> Result<RedisKeyedMultiRateLimiter<K, N>, RedisLimiterError> {
        let one = self.builder.build()?;
        Ok(RedisKeyedMultiRateLimiter {
            naming: Arc::new(Naming::Prefixed(one.inner.name.clone())),
            inner: one.inner,
            quotas: Arc::new(Mutex::new(HashMap::new())),
        })
    }
}

/// A quota of several limits per key, across processes and machines, kept in Redis (feature
/// `redis`): for every key, what a [`RedisMultiRateLimiter`] is for its one quota (each key's
/// limits in one Redis key, `{name:key}`, so in one Cluster slot; checked and charged by one
/// script call; the same failure policies), all keys under the same limits.
///
/// # Examples
///
/// ```no_run
/// use paced::redis::RedisKeyedMultiRateLimiter;
/// use paced::{Limit, Rate};
///
/// # async fn demo() -> Result<(), paced::redis::RedisLimiterError> {
/// let per_tenant: RedisKeyedMultiRateLimiter<String, 2> =
///     RedisKeyedMultiRateLimiter::builder("redis://127.0.0.1/", "llm", ["requests", "tokens"])
///         .limit("requests", Limit::bucket(Rate::per_minute(60), 10))
///         .limit("tokens", Limit::bucket(Rate::per_minute(10_000), 10_000))
///         .build()?;
/// let permit = per_tenant.acquire("tenant-7", [1, 500]).await?;
/// permit.settle([1, 320]).await?;
/// # Ok(())
/// # }
/// ```
pub struct RedisKeyedMultiRateLimiter<K, const N: usize> {
    inner: Arc<Inner<N>>,
    naming: Arc<Naming>,
    quotas: Arc<Mutex<HashMap<K, Arc<Quota<N>>>>>,
}

impl<K, const N: usize> Clone for RedisKeyedMultiRateLimiter<K, N> {
    fn clone(&self) -> Self {
        RedisKeyedMultiRateLimiter {
            inner: self.inner.clone(),
            naming: self.naming.clone(),
            quotas: self.quotas.clone(),
        }
    }
}

impl<K, const N: usize> fmt::Debug for RedisKeyedMultiRateLimiter<K, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisKeyedMultiRateLimiter")
            .field("name", &self.inner.name)
            .field("keys", &lock(&self.quotas).len())
            .finish_non_exhaustive()
    }
}

impl<K, const N: usize> RedisKeyedMultiRateLimiter<K, N>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    /// A builder for quotas kept in the Redis server at `url`, key `k`'s under `{name:k}`,
    /// with the dimensions `names`; see [`RedisMultiRateLimiter::builder`].
    pub fn builder(
        url: &str,
        name: impl Into<String>,
        names: [&str; N],
    ) -> RedisKeyedMultiRateLimiterBuilder<K, N> {
        RedisKeyedMultiRateLimiterBuilder {
            builder: RedisMultiRateLimiter::builder(url, name, names),
            key: PhantomData,
        }
    }

    /// [`builder`](Self::builder) for a Redis Cluster reached through `nodes`.
    pub fn cluster_builder(
        nodes: &[&str],
        name: impl Into<String>,
        names: [&str; N],
    ) -> RedisKeyedMultiRateLimiterBuilder<K, N> {
        RedisKeyedMultiRateLimiterBuilder {
            builder: RedisMultiRateLimiter::cluster_builder(nodes, name, names),
            key: PhantomData,
        }
    }

    /// `key`'s quota, as a one-key limiter over this limiter's connection and counters.
    fn quota<Q>(&self, key: &Q) -> RedisMultiRateLimiter<N>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        let mut quotas = lock(&self.quotas);
        let quota = match quotas.get(key) {
            Some(quota) => quota.clone(),
            None => {
                if quotas.len() >= KEYS_KEPT {
                    // Forget the keys with nothing in flight here (a permit, a waiter, a
                    // lease) and no limit set by this process (its fallback's).
                    quotas.retain(|_, q| Arc::strong_count(q) > 1 || q.has_own_limits());
                }
                let warmth = self.inner.warmth.clone();
                let quota = Arc::new(Quota::new(self.naming.redis_key(key), warmth));
                quotas.insert(key.to_owned(), quota.clone());
                quota
            }
        };
        RedisMultiRateLimiter {
            inner: self.inner.clone(),
            quota,
        }
    }

    /// Waits until every limit of `key`'s quota grants `cost`; see
    /// [`RedisMultiRateLimiter::acquire`].
    ///
    /// # Errors
    ///
    /// As [`RedisMultiRateLimiter::acquire`].
    pub async fn acquire<Q>(
        &self,
        key: &Q,
        cost: [u64; N],
    ) -> Result<RedisMultiPermit<N>, RedisLimiterError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        self.quota(key).acquire(cost).await
    }

    /// Waits at most `timeout` for `key`'s quota; see [`RedisMultiRateLimiter::acquire_timeout`].
    ///
    /// # Errors
    ///
    /// As [`RedisMultiRateLimiter::acquire_timeout`].
    pub async fn acquire_timeout<Q>(
        &self,
        key: &Q,
        cost: [u64; N],
        timeout: Duration,
    ) -> Result<RedisMultiPermit<N>, TryAcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        self.quota(key).acquire_timeout(cost, timeout).await
    }

    /// Grants `cost` of `key`'s quota if every limit holds it now; see
    /// [`RedisMultiRateLimiter::try_acquire`].
    ///
    /// # Errors
    ///
    /// As [`RedisMultiRateLimiter::try_acquire`].
    pub async fn try_acquire<Q>(
        &self,
        key: &Q,
        cost: [u64; N],
    ) -> Result<RedisMultiPermit<N>, TryAcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        self.quota(key).try_acquire(cost).await
    }

    /// Replaces the limit at `index` of `key`'s quota in Redis, for every process, keeping its
    /// level; see [`RedisMultiRateLimiter::set_limit`]. The other keys keep the builder's
    /// limits. This process remembers it for its fail-open fallback, until
    /// [`clear_limit`](Self::clear_limit).
    ///
    /// # Errors
    ///
    /// As [`RedisMultiRateLimiter::set_limit`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use paced::{Limit, Rate};
    ///
    /// # async fn demo(per_tenant: paced::redis::RedisKeyedMultiRateLimiter<String, 2>) -> Result<(), paced::redis::RedisLimiterError> {
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

    /// Gives `key`'s quota the builder's limits again, for every process, keeping its levels;
    /// see [`RedisMultiRateLimiter::clear_limit`]. This process forgets the limits it had set
    /// for the key: its fail-open fallback takes `share` of the builder's again.
    ///
    /// # Errors
    ///
    /// As [`RedisMultiRateLimiter::clear_limit`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(per_tenant: paced::redis::RedisKeyedMultiRateLimiter<String, 2>) -> Result<(), paced::redis::RedisLimiterError> {
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

    /// This process's counters, over all keys (`keys`: the keys this process knows now).
    pub fn stats(&self) -> RedisStats {
        RedisStats::read(&self.inner.counters, lock(&self.quotas).len())
    }
}
