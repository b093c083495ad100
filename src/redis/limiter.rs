//! [`RedisRateLimiter`]: one token bucket for many processes and machines, kept in Redis.
//!
//! The bucket is paced's GCRA, evaluated by one Lua script on Redis's own clock (`TIME`), so
//! the clocks of the client machines do not matter and every decision is atomic. The script is
//! sent as `EVALSHA` and loaded once (again after a `NOSCRIPT`, e.g. when Redis restarted),
//! through the `redis` crate's `Script`. The connection is a `ConnectionManager`, which
//! reconnects by itself.

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use super::error::{RedisQuotaError, TryAcquireError};
use super::policy::{self, FailurePolicy, Fallback, Target};
use super::script::{
    bump, round_down, round_up, wait_from_us, Answer, Call, Conn, Counters, Failure, Reply,
    REPLY_BACKOFF_MAX, REPLY_RETRY, SCRIPT,
};
use super::turns::Turns;
use crate::core::Nanos;
use crate::error::NotUntil;
use crate::limiter::traits::sealed;
use crate::limiter::{Limiter, RateLimiter};
use crate::rate::Rate;
use crate::sync::{lock, Mutex};

/// Counters of a [`RedisRateLimiter`] in this process.
///
/// # Examples
///
/// ```
/// let stats = paced::redis::RedisStats::default();
/// assert_eq!(stats.round_trips, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Script calls sent to Redis (successful or not).
    pub round_trips: u64,
    /// Acquisitions granted, from Redis, from a lease, or from the fail-open fallback.
    pub granted: u64,
    /// Acquisitions served from a local lease, without a round trip.
    pub from_lease: u64,
    /// Acquisitions granted by the fail-open fallback while Redis was unreachable.
    pub fallback: u64,
    /// `try_acquire` calls refused.
    pub rejected: u64,
    /// Round trips that failed for an outage (Redis unreachable, slow or restarting).
    pub errors: u64,
    /// Round trips that Redis answered with an error (a key of another type, a refused
    /// command): not outages, each also logged at error level with the `tracing` feature.
    pub reply_errors: u64,
}

/// Tokens taken from Redis ahead of use, spent locally.
struct Lease {
    tokens: u64,
    expires: Instant,
}

#[derive(Default)]
struct Local {
    lease: Option<Lease>,
    /// Tokens to give back with the next round trip: an expired or replaced lease, a
    /// reservation whose waiter went away.
    to_return: u64,
    /// Under `FailOpen`, during an outage.
    fallback: Fallback<RateLimiter>,
}

struct Inner {
    conn: Conn,
    script: redis::Script,
    key: String,
    rate: Rate,
    burst: u64,
    /// Microseconds per token, the script's unit.
    interval_us: f64,
    lease_tokens: u64,
    lease_age: Duration,
    policy: FailurePolicy,
    local: Mutex<Local>,
    /// With leases, one task at a time refills the lease; the others wait for it rather than
    /// each asking Redis for a whole lease of its own.
    refill: tokio::sync::Mutex<()>,
    /// The order of this process's reservations: served in the order Redis charged them.
    turns: Arc<Turns>,
    counters: Counters,
}

/// A token bucket shared by every process that names the same Redis key: one quota across
/// processes and machines (a consumer group on many hosts, one partner API key).
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
/// with the next round trip. Leases ([`RedisRateLimiterBuilder::lease`]) make most grants local.
/// The bound `burst + w * rate` holds across all processes to within one round trip (and the
/// lease age, with leases).
///
/// Redis faults follow the [`FailurePolicy`]. The connection reconnects by itself; nothing
/// panics; a stream never loses or duplicates an item.
///
/// # Outages and reply errors
///
/// An *outage* is Redis not answering: a connection refused, dropped or timed out (see
/// [`response_timeout`](RedisRateLimiterBuilder::response_timeout)), or Redis answering that it
/// cannot serve anyone now (`LOADING`, `BUSY`, `MASTERDOWN`, `READONLY`, `TRYAGAIN`,
/// `CLUSTERDOWN`, `OOM`, `MISCONF`; on a Redis Cluster, redirections (`MOVED`, `ASK`) not
/// settled within the timeout, while a failover moves the slots). The [`FailurePolicy`]
/// applies, and [`RedisStats::errors`] counts it.
///
/// A *reply error* is Redis answering this request with an error: the key holds a value of
/// another type (`WRONGTYPE`) or a string that is not a paced quota, a command is refused
/// (`NOPERM`), the script fails. Waiting does not cure it, so the failure policy does not
/// apply (`FailOpen` does not fall back): [`acquire`](RedisRateLimiter::acquire) returns
/// [`RedisQuotaError::Reply`] at once and [`try_acquire`](RedisRateLimiter::try_acquire)
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
#[derive(Clone)]
pub struct RedisRateLimiter {
    inner: Arc<Inner>,
}

/// Builds a [`RedisRateLimiter`]; see [`RedisRateLimiter::builder`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paced::redis::FailurePolicy;
/// use paced::{Rate, RedisRateLimiter};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let quota = RedisRateLimiter::builder("redis://127.0.0.1:6379/", "sms", Rate::per_second(100), 10)
///     .lease(20, Duration::from_millis(5))
///     .failure_policy(FailurePolicy::FailOpen { share: 0.25 })
///     .build()
///     .expect("a valid configuration");
/// # let _ = quota;
/// # }
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct RedisRateLimiterBuilder {
    target: Target,
    key: String,
    rate: Rate,
    burst: u64,
    lease: Option<(u64, Duration)>,
    policy: FailurePolicy,
    response_timeout: Duration,
    #[cfg(feature = "metrics")]
    metrics_name: Option<String>,
}

impl RedisRateLimiterBuilder {
    /// Takes up to `max_tokens` from Redis per round trip and spends them locally, so that a
    /// high rate does not cost one round trip per item. Leased tokens unspent after `max_age`
    /// (and any left when the last handle is dropped) are given back. The bound then holds to
    /// within `max_age` of refill; while waiting, a process waits for a whole lease rather than
    /// one token.
    pub fn lease(mut self, max_tokens: u64, max_age: Duration) -> Self {
        self.lease = Some((max_tokens, max_age));
        self
    }

    /// What to do while Redis is unreachable (default: [`FailurePolicy::default`]).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// How long one round trip (and one connection attempt) may take before it counts as an
    /// outage (default 250 ms).
    ///
    /// It must be positive: [`build`](RedisRateLimiterBuilder::build) refuses zero with
    /// [`ConfigError::ZeroTimeout`](crate::ConfigError::ZeroTimeout). (The `redis` crate takes zero as a timeout at tokio's
    /// next timer tick, not as "no timeout", so whether a round trip succeeds would depend on
    /// how far away Redis is.) There is no "no timeout": a round trip that never ends would
    /// hold `acquire` past the fail-closed deadline and keep `FailOpen` from falling back; a
    /// very long one, up to `Duration::MAX`, is accepted.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Records to the [`metrics`](https://docs.rs/metrics) facade under `name` (feature
    /// `metrics`), every metric with the label `limiter = name`:
    ///
    /// | metric | kind | what |
    /// | --- | --- | --- |
    /// | `paced_grants_total` | counter | acquisitions granted (from Redis, a lease or the fallback) |
    /// | `paced_tokens_granted_total` | counter | tokens (cost) granted |
    /// | `paced_refusals_total` | counter | `try_acquire` calls refused |
    /// | `paced_redis_round_trips_total` | counter | script calls sent (successful or not) |
    /// | `paced_redis_errors_total` | counter | failed round trips, with a label `kind`: `outage` (unreachable, slow, restarting) or `reply` (Redis answered with an error) |
    /// | `paced_redis_fallbacks_total` | counter | grants by the fail-open fallback |
    ///
    /// The counters of [`RedisRateLimiter::stats`], for this process; the handles are
    /// registered by [`build`](RedisRateLimiterBuilder::build), with the recorder in force
    /// then, and shared by every clone. (Waits happen in Redis's reservations, not in a local
    /// queue: there is no wait histogram or waiters gauge.)
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Rate, RedisRateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let quota = RedisRateLimiter::builder("redis://127.0.0.1/", "api", Rate::per_second(5), 5)
    ///     .metrics_name("partner-api")
    ///     .build()
    ///     .unwrap();
    /// # let _ = quota;
    /// # }
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics_name(mut self, name: impl Into<String>) -> Self {
        self.metrics_name = Some(name.into());
        self
    }

    /// Builds the limiter. Nothing is sent to Redis until the first acquisition, so this
    /// succeeds while Redis is down; it needs a tokio runtime.
    ///
    /// # Errors
    ///
    /// [`RedisQuotaError::Config`] for a zero burst, a zero lease, a `FailOpen` share outside
    /// `(0, 1]` or a zero response timeout; [`RedisQuotaError::Client`] for an invalid URL.
    pub fn build(self) -> Result<RedisRateLimiter, RedisQuotaError> {
        policy::validate(self.burst, self.response_timeout, self.lease, self.policy)?;
        let conn = self.target.connect(self.response_timeout)?;
        let (lease_tokens, lease_age) = self.lease.unwrap_or((0, Duration::ZERO));
        Ok(RedisRateLimiter {
            inner: Arc::new(Inner {
                conn,
                script: redis::Script::new(SCRIPT),
                key: self.key,
                rate: self.rate,
                burst: self.burst,
                interval_us: policy::interval_us(self.rate),
                lease_tokens,
                lease_age,
                policy: self.policy,
                local: Mutex::new(Local::default()),
                refill: tokio::sync::Mutex::new(()),
                turns: Arc::default(),
                counters: Counters {
                    #[cfg(feature = "metrics")]
                    metrics: self
                        .metrics_name
                        .as_deref()
                        .map(crate::instrument::RedisMetrics::new),
                    ..Counters::default()
                },
            }),
        })
    }
}

/// A grant not used yet: given back (with the next round trip) if its waiter goes away.
struct Reserved<'a> {
    quota: &'a RedisRateLimiter,
    tokens: u64,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        let mut local = self.quota.local();
        local.to_return = local.to_return.saturating_add(self.tokens);
    }
}

impl RedisRateLimiter {
    /// The script with this limiter's key and bucket.
    async fn call(&self, amounts: (u64, u64, u64), mode: &str) -> redis::RedisResult<Reply> {
        let inner = &self.inner;
        inner.counters.round_trip();
        inner.call(amounts, mode).await
    }
}

impl Inner {
    fn script_call<'a>(&'a self, amounts: (u64, u64, u64), mode: &'a str) -> Call<'a> {
        Call {
            key: &self.key,
            interval_us: self.interval_us,
            burst: self.burst,
            amounts,
            mode,
            max_wait_us: None,
            new_limit: None,
        }
    }

    async fn call(&self, amounts: (u64, u64, u64), mode: &str) -> redis::RedisResult<Reply> {
        self.script_call(amounts, mode)
            .run(&self.script, self.conn.clone())
            .await
    }
}

impl RedisRateLimiter {
    /// A builder for the quota named `key` on the Redis at `url`: `burst` tokens refilled at
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
        key: impl Into<String>,
        rate: Rate,
        burst: u64,
    ) -> RedisRateLimiterBuilder {
        RedisRateLimiterBuilder {
            target: Target::Url(url.into()),
            key: key.into(),
            rate,
            burst,
            lease: None,
            policy: FailurePolicy::default(),
            response_timeout: Duration::from_millis(250),
            #[cfg(feature = "metrics")]
            metrics_name: None,
        }
    }

    /// A builder for the quota named `key` on a Redis Cluster, reached through `nodes` (the
    /// URLs of some of its nodes, e.g. `redis://10.0.0.1:6379`; one that answers is enough):
    /// `burst` tokens refilled at `rate`, without leases, failing closed. The same builder,
    /// with the same options, as [`builder`](RedisRateLimiter::builder).
    ///
    /// The quota is one key (the script touches no other), so it lives on the master of that
    /// key's slot. The cluster client follows redirections and, when a master fails and its
    /// replica takes over, finds the new master by itself; meanwhile round trips fail, within
    /// the [`response_timeout`](RedisRateLimiterBuilder::response_timeout), and the
    /// [`FailurePolicy`] applies as to any outage. (Redis replicates asynchronously: what the
    /// failed master granted last may not have reached its replica, so a failover can lose up
    /// to one round trip's worth of charges.)
    ///
    /// Nothing is sent until the first acquisition: [`build`](RedisRateLimiterBuilder::build)
    /// succeeds while the cluster is down, and an empty `nodes` is
    /// [`RedisQuotaError::Client`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use paced::redis::FailurePolicy;
    /// use paced::{Rate, RedisRateLimiter};
    ///
    /// # async fn demo() -> Result<(), paced::redis::RedisQuotaError> {
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
        key: impl Into<String>,
        rate: Rate,
        burst: u64,
    ) -> RedisRateLimiterBuilder {
        RedisRateLimiterBuilder {
            target: Target::cluster(nodes),
            ..RedisRateLimiter::builder(String::new(), key, rate, burst)
        }
    }

    fn local(&self) -> crate::sync::MutexGuard<'_, Local> {
        lock(&self.inner.local)
    }

    /// Takes `cost` from the local lease, if it holds enough and has not expired.
    fn spend_lease(&self, cost: u64) -> bool {
        let mut local = self.local();
        let Some(lease) = local.lease.as_mut() else {
            return false;
        };
        if lease.expires <= Instant::now() {
            let unused = lease.tokens;
            local.lease = None;
            local.to_return = local.to_return.saturating_add(unused);
            return false;
        }
        if lease.tokens < cost {
            return false;
        }
        lease.tokens -= cost;
        bump(&self.inner.counters.from_lease);
        true
    }

    /// One script call: take at least `cost`, up to `want`, reserving (granted with a wait)
    /// or only trying.
    async fn round_trip(&self, cost: u64, want: u64, reserve: bool) -> Result<Answer, Failure> {
        let back = std::mem::take(&mut self.local().to_return);
        let mode = if reserve { "reserve" } else { "try" };
        let reply = self.call((cost, want, back), mode).await;
        match reply {
            Ok((0, _, wait_us)) => Ok(Answer::Refused {
                wait: wait_from_us(wait_us),
            }),
            Ok((_, surplus, wait_us)) => Ok(Answer::Granted {
                // Never more than was asked for, whatever the script's rounding.
                surplus: surplus.min(want - cost),
                wait: wait_from_us(wait_us),
            }),
            // A call that failed may still have run on Redis (one that timed out, one whose
            // reply was not understood): the tokens it gave back are not offered again (that
            // could return them twice), and whatever it took stays taken. Both err on the side
            // of the quota.
            Err(e) => Err(self.failure(e, cost)),
        }
    }

    /// Sorts a failed call into an outage or a reply error, and counts (and, for a reply
    /// error, logs) it.
    fn failure(&self, e: redis::RedisError, cost: u64) -> Failure {
        Failure::classify(e, &self.inner.counters, &self.inner.key, cost)
    }

    /// Whether `cost` can never be granted: even from a full bucket, its debt beyond the burst
    /// takes 2^64 ns (about 584 years) or more to pay, where the in-process bucket saturates.
    fn never(&self, cost: u64) -> bool {
        let debt = cost.saturating_sub(self.inner.burst);
        if debt == 0 {
            return false;
        }
        let rate = self.inner.rate;
        match u128::from(debt).checked_mul(rate.per().as_nanos()) {
            Some(ns) => ns.div_ceil(u128::from(rate.tokens())) >= u128::from(u64::MAX),
            None => true,
        }
    }

    /// Keeps the surplus of a grant as the local lease, usable until `max_age` from now; what
    /// was left of an older lease is given back rather than kept past its age.
    fn keep_lease(&self, surplus: u64) {
        if surplus == 0 {
            return;
        }
        let now = Instant::now();
        let expires = now
            .checked_add(self.inner.lease_age)
            .unwrap_or(now + Duration::from_secs(86_400));
        let mut local = self.local();
        if let Some(old) = local.lease.replace(Lease {
            tokens: surplus,
            expires,
        }) {
            local.to_return = local.to_return.saturating_add(old.tokens);
        }
    }

    /// Waits until `cost` tokens are granted by the shared quota.
    ///
    /// Under [`FailurePolicy::FailOpen`] the local fallback grants while Redis is unreachable;
    /// under [`FailurePolicy::FailClosed`] this waits for Redis.
    ///
    /// # Errors
    ///
    /// [`RedisQuotaError::Unavailable`] once Redis has been unreachable for the fail-closed
    /// deadline; [`RedisQuotaError::Reply`] at once when Redis answers with an error (a key of
    /// another type, a refused command), whatever the policy. Nothing was taken.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(quota: paced::RedisRateLimiter) -> Result<(), paced::redis::RedisQuotaError> {
    /// quota.acquire(1).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire(&self, cost: u64) -> Result<(), RedisQuotaError> {
        self.acquire_inner(cost, true).await
    }

    /// Like `acquire`, but never gives up: what a stream does, holding its item. Redis's
    /// reply errors are retried at a backoff from 100 ms up to [`REPLY_BACKOFF_MAX`].
    async fn acquire_patiently(&self, cost: u64) {
        // Without a deadline, and retrying reply errors, there is no error to return.
        let _ = self.acquire_inner(cost, false).await;
    }

    async fn acquire_inner(&self, cost: u64, give_up: bool) -> Result<(), RedisQuotaError> {
        let counters = &self.inner.counters;
        if cost == 0 {
            counters.grant(cost);
            return Ok(());
        }
        if self.never(cost) {
            // As in process, it waits forever; unlike a local waiter it is not charged, so it
            // holds nobody up (across processes, and after this one is gone).
            std::future::pending::<()>().await;
        }
        let mut backoff = Duration::from_millis(10);
        let mut reply_backoff = Duration::from_millis(100);
        // When this call first failed to reach Redis: the fail-closed deadline counts from here.
        let mut failing_since: Option<Instant> = None;
        loop {
            if self.spend_lease(cost) {
                counters.grant(cost);
                return Ok(());
            }
            // With leases, one task at a time refills; the others queue here and take from
            // the lease it brings back, instead of each asking Redis for a whole lease.
            let refilling = if self.inner.lease_tokens > 0 {
                let guard = self.inner.refill.lock().await;
                if self.spend_lease(cost) {
                    counters.grant(cost);
                    return Ok(());
                }
                Some(guard)
            } else {
                None
            };
            if let Some(fallback) = self.fallback() {
                drop(refilling);
                fallback.acquire(cost).await;
                counters.grant(cost);
                counters.fall_back();
                return Ok(());
            }
            let attempt = Instant::now();
            let want = cost.max(self.inner.lease_tokens);
            let (turn, answer) = self
                .inner
                .turns
                .send(self.round_trip(cost, want, true))
                .await;
            // Anything but a reservation gives its place up at once.
            let mut turn = matches!(answer, Ok(Answer::Granted { .. })).then_some(turn);
            match answer {
                Ok(Answer::Granted { surplus, wait }) => {
                    self.recovered();
                    // Until it is used, the grant is given back if this future is dropped.
                    let reserved = Reserved {
                        quota: self,
                        tokens: cost.saturating_add(surplus),
                    };
                    if wait == Nanos::MAX {
                        // Behind debts of 584 years or more: as in process, never; it holds
                        // up nobody of this process either.
                        drop(turn.take());
                        std::future::pending::<()>().await;
                    } else if wait > Nanos::ZERO {
                        tokio::time::sleep(wait.to_duration()).await;
                    }
                    // After this process's reservations sent before it, however late their
                    // replies were read.
                    if let Some(turn) = &turn {
                        turn.come().await;
                    }
                    std::mem::forget(reserved);
                    self.keep_lease(surplus);
                    counters.grant(cost);
                    return Ok(());
                }
                Ok(Answer::Refused { wait }) => {
                    // A reservation is never refused; should the script say so, wait and ask again.
                    let wait = wait.to_duration().min(Duration::from_secs(1));
                    tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
                }
                Err(Failure::Reply(e)) => {
                    if give_up {
                        return Err(RedisQuotaError::Reply(e));
                    }
                    // A stream holds its item and asks again, slowly: granting without Redis's
                    // say-so could exceed the quota, and the key may be fixed meanwhile.
                    drop(refilling);
                    tokio::time::sleep(reply_backoff).await;
                    reply_backoff = (reply_backoff * 2).min(REPLY_BACKOFF_MAX);
                }
                Err(Failure::Outage(e)) => {
                    let since = *failing_since.get_or_insert(attempt);
                    match self.inner.policy {
                        FailurePolicy::FailClosed {
                            max_backoff,
                            deadline,
                        } => {
                            if give_up && since.elapsed() >= deadline {
                                return Err(RedisQuotaError::Unavailable(e));
                            }
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(max_backoff.max(Duration::from_millis(1)));
                        }
                        FailurePolicy::FailOpen { share } => self.open_fallback(share),
                    }
                }
            }
        }
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
        let counters = &self.inner.counters;
        if cost == 0 || self.spend_lease(cost) {
            counters.grant(cost);
            return Ok(());
        }
        // Above the burst (as the script counts it, rounded down beyond 2^53): never without
        // waiting.
        if round_up(cost) > round_down(self.inner.burst) {
            counters.refuse();
            return Err(NotUntil::NEVER.into());
        }
        if let Some(fallback) = self.fallback() {
            let answer = fallback.try_acquire(cost);
            if answer.is_ok() {
                counters.grant(cost);
                counters.fall_back();
            } else {
                counters.refuse();
            }
            return answer.map_err(TryAcquireError::NotUntil);
        }
        // A try takes `cost` if it is there, and with leases whatever more is there, up to a
        // lease; it never waits for a whole one.
        let want = cost.max(self.inner.lease_tokens);
        let answer = match self.round_trip(cost, want, false).await {
            Ok(Answer::Granted { surplus, .. }) => {
                self.recovered();
                self.keep_lease(surplus);
                Ok(())
            }
            Ok(Answer::Refused { wait }) => {
                self.recovered();
                Err(NotUntil::new(wait))
            }
            Err(Failure::Reply(e)) => return Err(TryAcquireError::Reply(e)),
            Err(Failure::Outage(_)) => match self.inner.policy {
                FailurePolicy::FailOpen { share } => {
                    self.open_fallback(share);
                    return Box::pin(self.try_acquire(cost)).await;
                }
                FailurePolicy::FailClosed { .. } => Err(NotUntil::after(Duration::from_millis(10))),
            },
        };
        if answer.is_ok() {
            counters.grant(cost);
        } else {
            counters.refuse();
        }
        answer.map_err(TryAcquireError::NotUntil)
    }

    /// The fail-open fallback, while it is in charge.
    fn fallback(&self) -> Option<RateLimiter> {
        self.local().fallback.current()
    }

    /// Puts the fallback in charge for a second: `share` of the rate and of the burst.
    fn open_fallback(&self, share: f64) {
        let (rate, burst) = policy::share_of(self.inner.rate, self.inner.burst, share);
        self.local().fallback.open(|| RateLimiter::new(rate, burst));
    }

    /// Redis answered: the outage, if any, is over.
    fn recovered(&self) {
        self.local().fallback.recovered();
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
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RedisStats {
            round_trips: get(&c.round_trips),
            granted: get(&c.granted),
            from_lease: get(&c.from_lease),
            fallback: get(&c.fallback),
            rejected: get(&c.rejected),
            errors: get(&c.errors),
            reply_errors: get(&c.reply_errors),
        }
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
        let back = {
            let mut local = self.local();
            let unused = local.lease.take().map_or(0, |l| l.tokens);
            std::mem::take(&mut local.to_return).saturating_add(unused)
        };
        if back > 0 {
            if let Err(e) = self.call((0, 0, back), "try").await {
                // It may have run anyway; not offering the tokens again errs on the quota's side.
                let _ = self.failure(e, 0);
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let local = lock(&self.local);
        let back = (local.lease.as_ref().map_or(0, |l| l.tokens)).saturating_add(local.to_return);
        drop(local);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if back == 0 {
            return;
        }
        let (conn, script) = (self.conn.clone(), self.script.clone());
        let (key, interval_us, burst) = (self.key.clone(), self.interval_us, self.burst);
        runtime.spawn(async move {
            let call = Call {
                key: &key,
                interval_us,
                burst,
                amounts: (0, 0, back),
                mode: "try",
                max_wait_us: None,
                new_limit: None,
            };
            let _ = call.run(&script, conn).await;
        });
    }
}

impl fmt::Debug for RedisRateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRateLimiter")
            .field("key", &self.inner.key)
            .field("rate", &self.inner.rate)
            .field("burst", &self.inner.burst)
            .field("policy", &self.inner.policy)
            .finish_non_exhaustive()
    }
}

/// A round trip (and whatever waiting follows it) in flight for a stream or a tower future.
pub(super) type Pending<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// A stream's request in flight on a [`RedisRateLimiter`] (not nameable outside the crate).
pub struct RedisPermit {
    acquire: Option<Pending<()>>,
    check: Option<Pending<Result<(), NotUntil>>>,
}

impl fmt::Debug for RedisPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisPermit")
            .field(
                "in_flight",
                &(self.acquire.is_some() || self.check.is_some()),
            )
            .finish()
    }
}

/// Polls the request in flight in `slot`, starting it with `start` if there is none, and
/// empties the slot once it has answered.
pub(super) fn poll_slot<T, F>(
    slot: &mut Option<Pending<T>>,
    cx: &mut Context<'_>,
    start: impl FnOnce() -> F,
) -> Poll<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
{
    let fut = slot.get_or_insert_with(|| Box::pin(start()));
    let done = fut.as_mut().poll(cx);
    if done.is_ready() {
        *slot = None;
    }
    done
}

impl Limiter for RedisRateLimiter {}

/// A stream holds its item while the round trip is in flight: nothing is lost if it is
/// dropped, and under `FailClosed` a shaping stream waits for Redis rather than give up.
impl sealed::Sealed for RedisRateLimiter {
    type Permit = RedisPermit;

    fn permit(&self) -> RedisPermit {
        RedisPermit {
            acquire: None,
            check: None,
        }
    }

    fn poll_acquire(
        &self,
        permit: Pin<&mut RedisPermit>,
        cx: &mut Context<'_>,
        cost: u64,
    ) -> Poll<()> {
        let quota = self.clone();
        poll_slot(&mut permit.get_mut().acquire, cx, || async move {
            quota.acquire_patiently(cost).await
        })
    }

    fn poll_try_acquire(
        &self,
        permit: Pin<&mut RedisPermit>,
        cx: &mut Context<'_>,
        cost: u64,
    ) -> Poll<Result<(), NotUntil>> {
        let quota = self.clone();
        poll_slot(&mut permit.get_mut().check, cx, || async move {
            // A reply error (counted and logged by `try_acquire`) refuses the item: it is
            // handed back, not let through.
            quota.try_acquire(cost).await.map_err(|e| match e {
                TryAcquireError::NotUntil(refused) => refused,
                TryAcquireError::Reply(_) => NotUntil::after(REPLY_RETRY),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_round_in_the_quotas_favour() {
        let exact = 1u64 << 53;
        for n in [0, 1, 5, exact - 1, exact] {
            assert_eq!(round_up(n), n as f64);
            assert_eq!(round_down(n), n as f64);
        }
        // 2^53 + 1 is no double: a cost goes up, a burst down.
        assert_eq!(round_up(exact + 1), (exact + 2) as f64);
        assert_eq!(round_down(exact + 1), exact as f64);
        for n in [
            exact + 1,
            exact + 3,
            u64::MAX - 1,
            u64::MAX,
            3_000_000_000_000_000_001,
        ] {
            assert!(round_up(n) as u128 >= u128::from(n), "{n}");
            assert!((round_down(n) as u128) <= u128::from(n), "{n}");
        }
        assert_eq!(round_up(u64::MAX), 18_446_744_073_709_551_616.0);
    }

    #[test]
    fn a_wait_of_584_years_or_more_is_never() {
        assert_eq!(wait_from_us(0), Nanos::ZERO);
        assert_eq!(wait_from_us(1_500), Nanos(1_500_000));
        // The script's NEVER_US, ceil(2^64 / 1000).
        assert_eq!(wait_from_us(18_446_744_073_709_552), Nanos::MAX);
        assert_ne!(wait_from_us(18_446_744_073_709_551), Nanos::MAX);
        assert!(NotUntil::new(wait_from_us(u64::MAX)).is_never());
    }
}
