//! [`RedisKeyedRateLimiter`]: its state, constructors, limit changes and counters.

use std::borrow::Borrow;
use std::fmt::{self, Display};
use std::hash::Hash;
use std::time::Duration;

use super::builder::RedisLimiterBuilder;
use super::connect::Target;
use super::error::{RedisLimiterError, TryAcquireError};
use super::limiter::RedisRateLimiter;
use super::stats::RedisStats;
#[allow(unused_imports)] // the docs' links
use super::FailurePolicy;
#[allow(unused_imports)] // the docs' links
use crate::error::NotUntil;
use crate::limiter::{Cost, Limit};
#[allow(unused_imports)] // the docs' links
use crate::limiter::{KeyedLimiter, KeyedRateLimiter};
use crate::rate::Rate;

/// Builds a [`RedisKeyedRateLimiter`] of one limit per key (`C = u64`; see
/// [`RedisKeyedRateLimiter::builder`]) or of several (`C = [u64; N]`; see
/// [`RedisKeyedRateLimiter::dimensions`]).
///
/// # Examples
///
/// ```
/// use paced::redis::RedisKeyedRateLimiterBuilder;
/// use paced::{Rate, RedisKeyedRateLimiter};
///
/// let builder: RedisKeyedRateLimiterBuilder<String> =
///     RedisKeyedRateLimiter::builder("redis://127.0.0.1/", "tenants", Rate::per_second(5), 5);
/// let several: RedisKeyedRateLimiterBuilder<String, [u64; 2]> =
///     RedisKeyedRateLimiter::dimensions("redis://127.0.0.1/", "llm", ["requests", "tokens"]);
/// # let _ = (builder, several);
/// ```
pub type RedisKeyedRateLimiterBuilder<K, C = u64> =
    RedisLimiterBuilder<RedisKeyedRateLimiter<K, C>>;

/// One token bucket per key, shared by every process that uses the same Redis and prefix: a
/// quota per tenant, per user or per partner across a fleet.
///
/// `C` is what one request costs ([`Cost`]): a `RedisKeyedRateLimiter<K>` (`C = u64`, built by
/// [`builder`](RedisKeyedRateLimiter::builder)) holds one limit per key; a
/// `RedisKeyedRateLimiter<K, [u64; N]>` (built by
/// [`dimensions`](RedisKeyedRateLimiter::dimensions)) several limits per key, as a
/// several-limit [`RedisRateLimiter`](crate::RedisRateLimiter) does for its one quota. The
/// same methods on both; the cost's type differs. What follows is the one-limit form.
///
/// Each key has [`RedisRateLimiter`](crate::RedisRateLimiter)'s semantics: capacity `burst`,
/// starts full, refills at `rate`, evaluated atomically by the same Lua script on Redis's
/// clock; waiting is a reservation (charged at once in Redis, then waited for locally, so that
/// waiters across processes are served in the order their requests reached Redis); Redis
/// faults follow the [`FailurePolicy`], and a reply error (a key of another type) is not an
/// outage (see [outages and reply errors](crate::RedisRateLimiter#outages-and-reply-errors)).
/// And it has [`KeyedRateLimiter`]'s per-key semantics: keys are independent, a key may be
/// given its own limit ([`set_limit`](RedisKeyedRateLimiter::set_limit)), and keys are
/// borrowed (`&str` for `String` keys).
///
/// # Keys in Redis
///
/// A key is turned into bytes by its [`Display`] form (so `String`, `&str` and the integers
/// all work), with `%`, `{`, `}` and `:` percent-encoded (`%25`, `%7B`, `%7D`, `%3A`), as is
/// the prefix. Key `k` under prefix `p` keeps its bucket, and its own limit if it has one, in
/// the one Redis key `{p:k}` (a string of two or four doubles), so that one read serves both;
/// the braces are a Redis Cluster hash tag. Two keys whose `Display` forms are equal share a
/// bucket.
///
/// A key's bucket expires from Redis once it would be full again, so idle keys cost nothing;
/// a key with its own limit is configuration and does not expire (until
/// [`clear_limit`](RedisKeyedRateLimiter::clear_limit)). This process uses local state for a
/// key while an acquisition of it is in flight or, with
/// [leases](super::RedisLimiterBuilder::lease), until its lease expires and is given back
/// ([`RedisStats::keys`]). It remembers idle keys too, a few hundred bytes each, until it knows
/// 4,096 keys; then it forgets those not in use, and does so again each time the keys it knows
/// have doubled. A key whose fail-open fallback stood in is kept until that fallback would be
/// full again.
///
/// Waiters of one key are served in the order their requests reach Redis. Within a process
/// that is the order they were made: the requests share one ordered connection, each is
/// charged (reserved) as it arrives, and a reservation whose wait is over still lets the key's
/// reservations sent before it by this process go first (its wait counts from when its reply
/// was read, which a busy thread may delay); the exceptions are requests resent after a
/// reconnection or after Redis lost the script (`NOSCRIPT`), which may be served later than
/// their turn, never earlier than their reservation. With leases, one task at a time refills a
/// key's lease, in the order they asked (tokio's fair mutex). A reservation waits out the
/// wait Redis gave it on a tokio timer of its own, then its turn among the key's reservations
/// sent before it. It does not queue like the waiters of an in-process limiter: the order that
/// matters is the one in which Redis received the requests. Under
/// `FailOpen`, the fallback grants each key `share` of its limit as this process knows it: the
/// limit this process gave it with [`set_limit`](RedisKeyedRateLimiter::set_limit) (and did
/// not clear), else the default limit; limits that other processes set are not known locally.
///
/// Streams and tower services draw on it as on a [`KeyedRateLimiter`]: it is a
/// [`KeyedLimiter`], so [`throttle_by_key`](crate::PaceExt::throttle_by_key) and
/// `paced::tower::RateLimitLayer::keyed` take it (see [`KeyedLimiter`] for what holds).
///
/// How many tokens a key has free is not offered: it would cost a round trip, and be stale
/// by the time it is read; [`try_acquire`](RedisKeyedRateLimiter::try_acquire) says when a
/// refused cost could be had.
///
/// # Examples
///
/// ```no_run
/// use paced::{Rate, RedisKeyedRateLimiter};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let per_tenant: RedisKeyedRateLimiter<String> =
///     RedisKeyedRateLimiter::builder("redis://127.0.0.1/", "tenants", Rate::per_second(10), 5)
///         .build()?;
/// per_tenant.acquire("acme", 1).await?;
/// // A bigger tenant, for every process at once:
/// per_tenant.set_limit("globex", Rate::per_second(100), 50).await?;
/// if let Err(refused) = per_tenant.try_acquire("acme", 1).await {
///     println!("not now: {refused}");
/// }
/// # Ok(())
/// # }
/// ```
pub struct RedisKeyedRateLimiter<K, C: Cost = u64> {
    pub(crate) inner: C::RedisKeyed<K>,
}

/// A [`RedisKeyedRateLimiter`]'s state for one limit per key: public in a private module (see
/// [`Cost`]). Each key is the quota of one dimension, in the one-bucket form (see `Form::one`):
/// every Redis limiter has one implementation.
pub struct KeyedOne<K> {
    pub(super) several: RedisKeyedRateLimiter<K, [u64; 1]>,
}

impl<K> Clone for KeyedOne<K> {
    fn clone(&self) -> Self {
        KeyedOne {
            several: self.several.clone(),
        }
    }
}

impl<K, C: Cost> Clone for RedisKeyedRateLimiter<K, C> {
    fn clone(&self) -> Self {
        RedisKeyedRateLimiter {
            inner: self.inner.clone(),
        }
    }
}

/// Shows the limiter's prefix, its limits and its failure policy.
impl<K, C: Cost> fmt::Debug for RedisKeyedRateLimiter<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl<K> fmt::Debug for KeyedOne<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared = &self.several.inner.shared;
        let (rate, burst) = shared.bucket();
        f.debug_struct("RedisKeyedRateLimiter")
            .field("prefix", &shared.name)
            .field("rate", &rate)
            .field("burst", &burst)
            .field("policy", &shared.policy)
            .finish_non_exhaustive()
    }
}

impl<K> RedisKeyedRateLimiter<K>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    /// A builder for per-key quotas under `name` (its prefix in Redis) on the Redis at `url`: each key has `burst`
    /// tokens refilled at `rate` (unless [`set_limit`](RedisKeyedRateLimiter::set_limit) gave
    /// it its own), failing closed.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Rate, RedisKeyedRateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let per_ip: RedisKeyedRateLimiter<String> =
    ///     RedisKeyedRateLimiter::builder("redis://127.0.0.1/", "ip", Rate::per_minute(60), 10)
    ///         .build()
    ///         .unwrap();
    /// # let _ = per_ip;
    /// # }
    /// ```
    pub fn builder(
        url: impl Into<String>,
        name: impl Into<String>,
        rate: Rate,
        burst: u64,
    ) -> RedisKeyedRateLimiterBuilder<K> {
        RedisKeyedRateLimiterBuilder::one(Target::Url(url.into()), name.into(), rate, burst)
    }

    /// A builder for per-key quotas under `name` (its prefix in Redis) on a Redis Cluster, reached through
    /// `nodes` (the URLs of some of its nodes; one that answers is enough): each key has
    /// `burst` tokens refilled at `rate`, failing closed. The same builder, with the same
    /// options, as [`builder`](RedisKeyedRateLimiter::builder).
    ///
    /// A key's quota (and its own limit, in the same Redis key) is named with a hash tag,
    /// `{name:key}`, so the script runs on that slot's master; different keys spread over the
    /// masters. The cluster client follows redirections and,
    /// when a master fails and its replica takes over, finds the new master by itself;
    /// meanwhile the keys of that master's slots see an outage (each round trip bounded by the
    /// [`response_timeout`](super::RedisLimiterBuilder::response_timeout)) and the
    /// [`FailurePolicy`] applies to them, while the other keys go on. (Redis replicates
    /// asynchronously: a failover can lose the failed master's last charges.)
    ///
    /// Nothing is sent until the first request: [`build`](super::RedisLimiterBuilder::build)
    /// succeeds while the cluster is down, and an empty `nodes` is
    /// [`RedisLimiterError::Client`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use paced::{Rate, RedisKeyedRateLimiter};
    ///
    /// # async fn demo() -> Result<(), paced::redis::RedisLimiterError> {
    /// let nodes = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"];
    /// let per_user: RedisKeyedRateLimiter<u64> =
    ///     RedisKeyedRateLimiter::cluster_builder(&nodes, "users", Rate::per_second(5), 5).build()?;
    /// per_user.acquire(&42, 1).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn cluster_builder(
        nodes: &[&str],
        name: impl Into<String>,
        rate: Rate,
        burst: u64,
    ) -> RedisKeyedRateLimiterBuilder<K> {
        RedisKeyedRateLimiterBuilder::one(Target::cluster(nodes), name.into(), rate, burst)
    }

    /// Waits until `key`'s quota grants `cost` tokens.
    ///
    /// Under [`FailurePolicy::FailOpen`] the local fallback grants while Redis is unreachable;
    /// under [`FailurePolicy::FailClosed`] this waits for Redis.
    ///
    /// # Errors
    ///
    /// [`RedisLimiterError::Unavailable`] once Redis has been unreachable for the fail-closed
    /// deadline; [`RedisLimiterError::Reply`] at once when Redis answers with an error (a key of
    /// another type, a refused command), whatever the policy. Nothing was taken.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(quota: paced::RedisKeyedRateLimiter<String>) -> Result<(), paced::redis::RedisLimiterError> {
    /// quota.acquire("tenant-7", 1).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire<Q>(&self, key: &Q, cost: u64) -> Result<(), RedisLimiterError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        self.inner.several.acquire(key, [cost]).await.map(drop)
    }

    /// Waits until `key`'s quota grants `cost` tokens, if that can be within `timeout`;
    /// otherwise returns at once, having taken nothing.
    ///
    /// A request that Redis would make wait longer than `timeout` is refused without being
    /// charged (in one round trip); one granted with a shorter wait is waited for.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::NotUntil`] when the cost cannot be had within `timeout`, with how
    /// long until it could be ([`NotUntil::is_never`] for a cost above the key's burst, which
    /// only `acquire` waits for; also while Redis is unreachable past `timeout` under
    /// `FailClosed`); [`TryAcquireError::Reply`] when Redis answers with an error.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # async fn demo(quota: paced::RedisKeyedRateLimiter<u64>) {
    /// match quota.acquire_timeout(&42, 1, Duration::from_millis(50)).await {
    ///     Ok(()) => println!("go"),
    ///     Err(e) => println!("not within 50 ms: {e}"),
    /// }
    /// # }
    /// ```
    pub async fn acquire_timeout<Q>(
        &self,
        key: &Q,
        cost: u64,
        timeout: Duration,
    ) -> Result<(), TryAcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        let several = &self.inner.several;
        several
            .acquire_timeout(key, [cost], timeout)
            .await
            .map(drop)
    }

    /// Grants `cost` of `key`'s quota if it holds it now; one round trip. A refusal writes
    /// nothing to Redis.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::NotUntil`], a refusal, with how long until the cost could be granted
    /// ([`NotUntil::is_never`] for a cost above the key's burst); while Redis is unreachable,
    /// under `FailClosed` a refusal with the retry backoff, under `FailOpen` the fallback's
    /// answer. [`TryAcquireError::Reply`] when Redis answers with an error.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use paced::redis::TryAcquireError;
    ///
    /// # async fn demo(quota: paced::RedisKeyedRateLimiter<String>) {
    /// match quota.try_acquire("tenant-7", 1).await {
    ///     Ok(()) => println!("go"),
    ///     Err(TryAcquireError::NotUntil(refused)) => println!("retry in {:?}", refused.retry_after()),
    ///     Err(failed) => eprintln!("the quota is broken: {failed}"),
    /// }
    /// # }
    /// ```
    pub async fn try_acquire<Q>(&self, key: &Q, cost: u64) -> Result<(), TryAcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        self.inner.several.try_acquire(key, [cost]).await.map(drop)
    }

    /// Gives `key` its own limit, for every process: stored in Redis beside the key's bucket
    /// (it does not expire), and read by every process's next request for the key. The key
    /// keeps its level, in tokens (at most the new burst); a full bucket stays full.
    ///
    /// This process also remembers the limit (until it clears it), so that under `FailOpen`
    /// its fallback grants the key `share` of it during an outage.
    ///
    /// # Errors
    ///
    /// [`RedisLimiterError::Config`] for a zero burst; [`RedisLimiterError::Reply`] when Redis
    /// answers with an error; [`RedisLimiterError::Unavailable`] when Redis cannot be reached,
    /// at once, whatever the failure policy: a change of configuration is neither retried nor
    /// granted by a fallback, and a failed one changes nothing in this process (its fallback
    /// keeps the limit it knew). A round trip that timed out may still have reached Redis:
    /// set the limit again once Redis is back.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use paced::Rate;
    ///
    /// # async fn demo(quota: paced::RedisKeyedRateLimiter<String>) -> Result<(), paced::redis::RedisLimiterError> {
    /// quota.set_limit("premium", Rate::per_second(100), 20).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn set_limit<Q>(
        &self,
        key: &Q,
        rate: Rate,
        burst: u64,
    ) -> Result<(), RedisLimiterError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        let several = &self.inner.several;
        several.set_limit(key, 0, Limit::bucket(rate, burst)).await
    }

    /// Gives `key` the default limit again, for every process, keeping its level (at most the
    /// default burst). This process forgets the limit it had set for the key: its fail-open
    /// fallback grants the key `share` of the default limit again.
    ///
    /// # Errors
    ///
    /// As [`set_limit`](RedisKeyedRateLimiter::set_limit)'s, but for the burst: while Redis
    /// cannot be reached, [`RedisLimiterError::Unavailable`] at once, and nothing changes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(quota: paced::RedisKeyedRateLimiter<String>) -> Result<(), paced::redis::RedisLimiterError> {
    /// quota.clear_limit("premium").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn clear_limit<Q>(&self, key: &Q) -> Result<(), RedisLimiterError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        self.inner.several.clear_limit(key).await
    }

    /// This process's counters, over all keys.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(quota: paced::RedisKeyedRateLimiter<String>) {
    /// let stats = quota.stats();
    /// println!("{} grants in {} round trips; {} keys in use", stats.granted, stats.round_trips, stats.keys);
    /// # }
    /// ```
    #[must_use]
    pub fn stats(&self) -> RedisStats {
        self.inner.several.stats()
    }

    /// `key`'s quota, of one dimension.
    pub(super) fn quota<Q>(&self, key: &Q) -> RedisRateLimiter<[u64; 1]>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        self.inner.several.quota(key)
    }
}
