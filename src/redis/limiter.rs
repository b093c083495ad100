//! [`RedisRateLimiter`]: one quota across a fleet; of one limit, the quota of one dimension.

use std::fmt;
use std::time::Duration;

use super::builder::RedisLimiterBuilder;
use super::connect::Target;
use super::error::{RedisLimiterError, TryAcquireError};
use super::stats::RedisStats;
#[allow(unused_imports)] // the docs' links
use super::FailurePolicy;
#[allow(unused_imports)] // the docs' links
use crate::error::NotUntil;
#[allow(unused_imports)] // the docs' links
use crate::limiter::RateLimiter;
use crate::limiter::{Cost, Limit};
use crate::rate::Rate;

/// Builds a [`RedisRateLimiter`] of one limit (`C = u64`; see [`RedisRateLimiter::builder`])
/// or of several (`C = [u64; N]`; see [`RedisRateLimiter::dimensions`]).
///
/// # Examples
///
/// ```
/// use paced::redis::RedisRateLimiterBuilder;
/// use paced::{Rate, RedisRateLimiter};
///
/// let builder: RedisRateLimiterBuilder =
///     RedisRateLimiter::builder("redis://127.0.0.1/", "api", Rate::per_second(5), 5);
/// let several: RedisRateLimiterBuilder<[u64; 2]> =
///     RedisRateLimiter::dimensions("redis://127.0.0.1/", "llm", ["requests", "tokens"]);
/// # let _ = (builder, several);
/// ```
pub type RedisRateLimiterBuilder<C = u64> = RedisLimiterBuilder<RedisRateLimiter<C>>;

/// A token bucket shared by every process that names the same Redis key: one quota across
/// processes and machines (a consumer group on many hosts, one partner API key).
///
/// `C` is what one request costs ([`Cost`]): a `RedisRateLimiter` (`C = u64`, built by
/// [`builder`](RedisRateLimiter::builder)) is one limit; a `RedisRateLimiter<[u64; N]>` (built
/// by [`dimensions`](RedisRateLimiter::dimensions)) holds several limits over `N` dimensions
/// (requests and tokens, say) in one Redis key, checked and charged at once, each grant a
/// [`RedisPermit`](super::RedisPermit) to settle once its real cost is known. The same methods
/// on both; the cost's type differs. What follows is the one-limit quota; the several-limit
/// one is described with its methods.
///
/// Same semantics as [`RateLimiter`]: capacity `burst`, starts full, refills at `rate`, a cost
/// per acquisition; a cost above `burst` pays its debt before it is granted; a cost of 0 passes
/// at once. Every cost and every [`Rate`] works as in process: a wait of 584 years or more is
/// "never" ([`NotUntil::is_never`]), and a cost whose debt alone would take that long makes
/// `acquire` wait forever, as in process, but without charging the quota, so it holds nobody
/// up. (The script computes in doubles; its comment says how that bounds exactness: never in
/// the request's favour.) The state lives in Redis under the key you name and is updated
/// atomically by one Lua script on Redis's clock; the key expires once the bucket is full, so
/// idle quotas vanish (a bucket that takes longer than about 285,000 years to refill keeps its
/// key without an expiry).
///
/// Waiting is a reservation, as in Go's `rate.Limiter::Wait`: a request that cannot be granted
/// at once is charged in Redis at once (the level goes negative, a debt that later requests
/// queue behind) and told how long to wait before use. So each acquisition is one round trip,
/// waiters across processes are served in the order their requests reached Redis, and a large
/// request is not starved by small ones. A waiter dropped before its turn gives its tokens back
/// with the next round trip (at once, in the background). A reservation waits out the wait
/// Redis gave it on a tokio timer of its own, then lets this process's reservations sent before
/// it go first. It does not queue like the waiters of an in-process limiter: the order that
/// matters is the one in which Redis received the requests. Leases
/// ([`RedisLimiterBuilder::lease`](super::RedisLimiterBuilder::lease)) make most grants local.
/// The bound `burst + w * rate` holds across all processes to within one round trip (and the
/// lease age, with leases).
///
/// Redis faults follow the [`FailurePolicy`]. The connection reconnects by itself; nothing
/// panics; a stream never loses or duplicates an item.
///
/// The limit itself may be changed for every process at once
/// ([`set_limit`](RedisRateLimiter::set_limit), stored in Redis beside the bucket). How many
/// tokens are free now is not offered: it would cost a round trip, and be stale by the time it
/// is read; [`try_acquire`](RedisRateLimiter::try_acquire) says when a refused cost could be had.
///
/// Every Redis limiter, of one limit or several, keyed or not, has one implementation: a
/// one-limit quota is the quota of one dimension, kept in Redis in a shorter form.
///
/// # Outages and reply errors
///
/// An *outage* is Redis not answering: a connection refused, dropped or timed out (see
/// [`response_timeout`](super::RedisLimiterBuilder::response_timeout)), or Redis answering that it
/// cannot serve anyone now (`LOADING`, `BUSY`, `MASTERDOWN`, `READONLY`, `TRYAGAIN`,
/// `CLUSTERDOWN`, `OOM`, `MISCONF`; on a Redis Cluster, redirections (`MOVED`, `ASK`) not
/// settled within the timeout, while a failover moves the slots). The [`FailurePolicy`]
/// applies, and [`RedisStats::errors`] counts it.
///
/// A *reply error* is Redis answering this request with an error: the key holds a value of
/// another type (`WRONGTYPE`) or a string that is not a paced quota, a command is refused
/// (`NOPERM`), the script fails. Waiting does not cure it, so the failure policy does not
/// apply (`FailOpen` does not fall back): [`acquire`](RedisRateLimiter::acquire) returns
/// [`RedisLimiterError::Reply`] at once and [`try_acquire`](RedisRateLimiter::try_acquire)
/// returns [`TryAcquireError::Reply`]. Every reply error is counted in
/// [`RedisStats::reply_errors`] and, with the `tracing` feature, logged at error level with
/// the key and Redis's message.
///
/// A stream or sink ([`throttle_with`](crate::PaceExt::throttle_with)) or a tower layer cannot
/// return an error, and must neither exceed the quota nor stall silently. On a reply error it
/// grants nothing without Redis: a waiting ([`Shaping`](crate::Shaping)) stream holds its item
/// and asks again after 100 ms, then at a backoff doubling up to 1 s, each failure counted and
/// logged, and goes on as soon as the key is fixed (deleted, or expired); an
/// [`Enforcing`](crate::Enforcing) stream hands the item back as a refusal with a
/// `retry_after` of 1 s. So a broken key stalls the stream loudly, never silently, never
/// busily, and never lets an item through unaccounted.
///
/// # Examples
///
/// ```no_run
/// use futures_util::StreamExt;
/// use paced::{PaceExt, Rate, RedisRateLimiter, Shaping};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let quota = RedisRateLimiter::builder("redis://127.0.0.1/", "partner-api", Rate::per_second(200), 20)
///     .build()?;
/// quota.acquire(1).await?;
/// let calls = futures_util::stream::iter(0..10).throttle_with(&quota, |_| 1, Shaping);
/// assert_eq!(calls.count().await, 10);
/// # Ok(())
/// # }
/// ```
pub struct RedisRateLimiter<C: Cost = u64> {
    pub(crate) inner: C::Redis,
}

impl<C: Cost> Clone for RedisRateLimiter<C> {
    fn clone(&self) -> Self {
        RedisRateLimiter {
            inner: self.inner.clone(),
        }
    }
}

/// Shows the quota's key, its limits and its failure policy.
impl<C: Cost> fmt::Debug for RedisRateLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

/// A [`RedisRateLimiter`]'s state for one limit: public in a private module (see [`Cost`]).
/// It is the quota of one dimension, in the one-bucket form (see `Form::one`): every Redis
/// limiter has one implementation.
#[derive(Clone)]
pub struct One {
    pub(super) several: RedisRateLimiter<[u64; 1]>,
}

impl RedisRateLimiter {
    /// A builder for the quota named `name` (its Redis key) on the Redis at `url`: `burst` tokens refilled at
    /// `rate`, without leases, failing closed.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Rate, RedisRateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let quota = RedisRateLimiter::builder("redis://127.0.0.1/", "api", Rate::per_second(5), 5)
    ///     .build()
    ///     .unwrap();
    /// # let _ = quota;
    /// # }
    /// ```
    pub fn builder(
        url: impl Into<String>,
        name: impl Into<String>,
        rate: Rate,
        burst: u64,
    ) -> RedisRateLimiterBuilder {
        RedisRateLimiterBuilder::one(Target::Url(url.into()), name.into(), rate, burst)
    }

    /// A builder for the quota named `name` (its Redis key) on a Redis Cluster, reached through `nodes` (the
    /// URLs of some of its nodes, e.g. `redis://10.0.0.1:6379`; one that answers is enough):
    /// `burst` tokens refilled at `rate`, without leases, failing closed. The same builder,
    /// with the same options, as [`builder`](RedisRateLimiter::builder).
    ///
    /// The quota is one key (the script touches no other), so it lives on the master of that
    /// key's slot. The cluster client follows redirections and, when a master fails and its
    /// replica takes over, finds the new master by itself; meanwhile round trips fail, within
    /// the [`response_timeout`](super::RedisLimiterBuilder::response_timeout), and the
    /// [`FailurePolicy`] applies as to any outage. (Redis replicates asynchronously: what the
    /// failed master granted last may not have reached its replica, so a failover can lose up
    /// to one round trip's worth of charges.)
    ///
    /// Nothing is sent until the first acquisition: [`build`](super::RedisLimiterBuilder::build)
    /// succeeds while the cluster is down, and an empty `nodes` is
    /// [`RedisLimiterError::Client`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use paced::redis::FailurePolicy;
    /// use paced::{Rate, RedisRateLimiter};
    ///
    /// # async fn demo() -> Result<(), paced::redis::RedisLimiterError> {
    /// let nodes = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"];
    /// let quota = RedisRateLimiter::cluster_builder(&nodes, "partner-api", Rate::per_second(100), 10)
    ///     .failure_policy(FailurePolicy::FailOpen { share: 0.25 })
    ///     .build()?;
    /// quota.acquire(1).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn cluster_builder(
        nodes: &[&str],
        name: impl Into<String>,
        rate: Rate,
        burst: u64,
    ) -> RedisRateLimiterBuilder {
        RedisRateLimiterBuilder::one(Target::cluster(nodes), name.into(), rate, burst)
    }

    /// Waits until `cost` tokens are granted by the shared quota.
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
    /// # async fn demo(quota: paced::RedisRateLimiter) -> Result<(), paced::redis::RedisLimiterError> {
    /// quota.acquire(1).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire(&self, cost: u64) -> Result<(), RedisLimiterError> {
        self.inner.several.acquire([cost]).await.map(drop)
    }

    /// Waits until the shared quota grants `cost` tokens, if that can be within `timeout`;
    /// otherwise returns at once, having taken nothing.
    ///
    /// A request that Redis would make wait longer than `timeout` is refused without being
    /// charged (in one round trip); one granted with a shorter wait is waited for.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::NotUntil`] when the cost cannot be had within `timeout`, with how
    /// long until it could be (also while Redis is unreachable past `timeout` under
    /// `FailClosed`; [`NotUntil::is_never`] for a cost that is never granted);
    /// [`TryAcquireError::Reply`] when Redis answers with an error.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # async fn demo(quota: paced::RedisRateLimiter) {
    /// match quota.acquire_timeout(1, Duration::from_millis(50)).await {
    ///     Ok(()) => println!("go"),
    ///     Err(e) => println!("not within 50 ms: {e}"),
    /// }
    /// # }
    /// ```
    pub async fn acquire_timeout(
        &self,
        cost: u64,
        timeout: Duration,
    ) -> Result<(), TryAcquireError> {
        self.inner
            .several
            .acquire_timeout([cost], timeout)
            .await
            .map(drop)
    }

    /// Grants `cost` if the shared quota holds it now; one round trip unless a lease holds it.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::NotUntil`], a refusal, with how long until the cost could be granted
    /// ([`NotUntil::is_never`] for a cost above the burst, which needs waiting); while Redis
    /// is unreachable, under `FailClosed` a refusal with the retry backoff, under `FailOpen`
    /// the fallback's answer. [`TryAcquireError::Reply`] when Redis answers with an error (a
    /// key of another type, a refused command): a failure, not a refusal, whatever the policy.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use paced::redis::TryAcquireError;
    ///
    /// # async fn demo(quota: paced::RedisRateLimiter) {
    /// match quota.try_acquire(1).await {
    ///     Ok(()) => println!("go"),
    ///     Err(TryAcquireError::NotUntil(refused)) => println!("retry in {:?}", refused.retry_after()),
    ///     Err(failed) => eprintln!("the quota is broken: {failed}"),
    /// }
    /// # }
    /// ```
    pub async fn try_acquire(&self, cost: u64) -> Result<(), TryAcquireError> {
        self.inner.several.try_acquire([cost]).await.map(drop)
    }

    /// Changes the limit for every process: stored in Redis beside the bucket (it does not
    /// expire), and read by every process's next request. The bucket keeps its level, in
    /// tokens (at most the new burst); a full bucket stays full.
    ///
    /// This process also remembers the limit (until [`clear_limit`](RedisRateLimiter::clear_limit)),
    /// so that under `FailOpen` its fallback grants `share` of it during an outage.
    ///
    /// # Errors
    ///
    /// [`RedisLimiterError::Config`] for a zero burst; [`RedisLimiterError::Reply`] when Redis
    /// answers with an error; [`RedisLimiterError::Unavailable`] when Redis cannot be reached,
    /// at once, whatever the failure policy: a change of configuration is neither retried nor
    /// granted by a fallback, and a failed one changes nothing in this process. A round trip
    /// that timed out may still have reached Redis: set the limit again once Redis is back.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use paced::Rate;
    ///
    /// # async fn demo(quota: paced::RedisRateLimiter) -> Result<(), paced::redis::RedisLimiterError> {
    /// // The partner raised our quota: every process follows at its next request.
    /// quota.set_limit(Rate::per_second(200), 20).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn set_limit(&self, rate: Rate, burst: u64) -> Result<(), RedisLimiterError> {
        self.inner
            .several
            .set_limit(0, Limit::bucket(rate, burst))
            .await
    }

    /// Gives the quota the limit it was built with again, for every process, keeping its level
    /// (at most that burst).
    ///
    /// # Errors
    ///
    /// As [`set_limit`](RedisRateLimiter::set_limit)'s, but for the burst: while Redis cannot
    /// be reached, [`RedisLimiterError::Unavailable`] at once, and nothing changes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(quota: paced::RedisRateLimiter) -> Result<(), paced::redis::RedisLimiterError> {
    /// quota.clear_limit().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn clear_limit(&self) -> Result<(), RedisLimiterError> {
        self.inner.several.clear_limit().await
    }

    /// This process's counters.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(quota: paced::RedisRateLimiter) {
    /// let stats = quota.stats();
    /// println!("{} grants in {} round trips", stats.granted, stats.round_trips);
    /// # }
    /// ```
    #[must_use]
    pub fn stats(&self) -> RedisStats {
        self.inner.several.stats()
    }

    /// Gives back the unused tokens of the local lease now (also done when the last handle is
    /// dropped, in the background).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(quota: paced::RedisRateLimiter) {
    /// quota.return_lease().await;
    /// # }
    /// ```
    pub async fn return_lease(&self) {
        self.inner.several.return_lease().await;
    }
}

impl fmt::Debug for One {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = &self.several.inner;
        let (rate, burst) = state.quota.shared.bucket();
        f.debug_struct("RedisRateLimiter")
            .field("key", &state.quota.key)
            .field("rate", &rate)
            .field("burst", &burst)
            .field("policy", &state.quota.shared.policy)
            .finish_non_exhaustive()
    }
}
