//! [`RedisRateLimiter<[u64; N]>`](RedisRateLimiter): several limits of one quota (token buckets, aligned fixed
//! windows) across a fleet, checked and charged at once by one script call on Redis's clock, and [`RedisPermit`], what a grant
//! charged (to settle).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::builder::sealed::Build;
use super::builder::{Options, RedisLimiterBuilder};
use super::connect::Target;
use super::error::{RedisLimiterError, TryAcquireError};
use super::fallback::Fallback;
use super::limiter::{RedisRateLimiter, RedisRateLimiterBuilder};
use super::policy::{self, FailurePolicy};
use super::script::{
    bump, eval, round_down, round_up, wait_from_us, Conn, Counters, Failure, SCRIPT,
};
use super::stats::RedisStats;
use super::turns::{Asking, Turns, Warmth};
use super::wait::{on_fallback, pause_after, spend_budget, Outages, WaitError};
use crate::core::Nanos;
use crate::error::{ConfigError, NotUntil};
use crate::limiter::multi::by_dimension;
use crate::limiter::{Limit, Permit, RateLimiter};
use crate::rate::Rate;
use crate::sync::{lock, Mutex};

/// What a several-limit builder was told beyond the common options: the dimensions' names
/// and the limits on them (public in a private module: nameable by no user).
#[derive(Debug)]
pub struct Dimensions<const N: usize> {
    names: [String; N],
    limits: Vec<(String, Limit)>,
}

impl<const N: usize> Dimensions<N> {
    pub(super) fn new(names: [&str; N]) -> Self {
        Dimensions {
            names: names.map(str::to_owned),
            limits: Vec::new(),
        }
    }

    pub(super) fn limit(&mut self, name: &str, limit: Limit) {
        self.limits.push((name.to_owned(), limit));
    }
}

impl<L: Build<Spec = Dimensions<N>>, const N: usize> RedisLimiterBuilder<L> {
    /// A builder of several limits on the dimensions `names`, none set yet: as
    /// [`one`](RedisLimiterBuilder::one) is for one limit.
    pub(super) fn several(target: Target, name: impl Into<String>, names: [&str; N]) -> Self {
        RedisLimiterBuilder::new(target, name.into(), Dimensions::new(names))
    }
}

impl<const N: usize> Build for RedisRateLimiter<[u64; N]> {
    type Cost = [u64; N];
    type Spec = Dimensions<N>;

    fn build(options: Options<[u64; N]>, spec: Dimensions<N>) -> Result<Self, RedisLimiterError> {
        let config = |e| RedisLimiterError::Config(e);
        policy::validate(1, options.response_timeout, None, options.policy)?;
        if let Some((max_tokens, _)) = options.lease {
            if max_tokens == [0; N] {
                return Err(config(ConfigError::ZeroLease));
            }
        }
        let limits = by_dimension(&spec.names, &spec.limits, |dim, limit| RedisLimit {
            dim,
            kind: Kind::of(limit),
        })
        .map_err(config)?;
        let conn = options.target.connect(options.response_timeout)?;
        let name = super::key::escape(&options.name);
        let mut key = String::with_capacity(name.len() + 2);
        key.push('{');
        key.push_str(&name);
        key.push('}');
        let warmth = Arc::new(Warmth::default());
        Ok(RedisRateLimiter {
            inner: Several {
                quota: Arc::new(Quota::new(key, warmth.clone())),
                shared: Arc::new(Inner {
                    conn,
                    warmth,
                    script: redis::Script::new(SCRIPT),
                    name,
                    names: spec.names,
                    limits,
                    policy: options.policy,
                    lease: options.lease,
                    counters: options.counters(),
                }),
            },
        })
    }
}

impl<const N: usize> RedisLimiterBuilder<RedisRateLimiter<[u64; N]>> {
    /// Adds `limit` on the dimension called `name`, as
    /// [`RateLimiterBuilder::limit`](crate::limiter::RateLimiterBuilder::limit) does. A fixed
    /// window's boundaries are on Redis's clock: `origin + k * window` in Unix time (an origin
    /// given by [`Limit::aligned_to_instant`] is mapped through this machine's clock when the
    /// limiter is built), in whole microseconds.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Limit, Rate, RedisRateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let llm = RedisRateLimiter::dimensions("redis://127.0.0.1/", "llm", ["requests", "tokens"])
    ///     .limit("requests", Limit::bucket(Rate::per_minute(500), 50))
    ///     .limit("tokens", Limit::bucket(Rate::per_minute(40_000), 40_000))
    ///     .build();
    /// assert!(llm.is_ok());
    /// # }
    /// ```
    pub fn limit(mut self, name: &str, limit: Limit) -> Self {
        self.spec.limit(name, limit);
        self
    }
}

/// One limit of the quota, on dimension `dim`.
#[derive(Debug)]
struct RedisLimit {
    dim: usize,
    kind: Kind,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Bucket {
        rate: Rate,
        burst: u64,
        interval_us: f64,
    },
    Window {
        quota: u64,
        window: Duration,
        origin: SystemTime,
        len_us: f64,
        /// The origin's Unix time modulo the length, in microseconds.
        phase_us: f64,
    },
}

impl Kind {
    /// The script's form of a checked `limit`.
    fn of(limit: &Limit) -> Kind {
        match (limit.as_bucket(), limit.as_window()) {
            (Some((rate, burst)), _) => Kind::Bucket {
                rate,
                burst,
                interval_us: policy::interval_us(rate),
            },
            (None, Some((quota, window, origin))) => {
                let len_us = window.as_nanos() as f64 / 1_000.0;
                let origin_us = match origin.duration_since(SystemTime::UNIX_EPOCH) {
                    Ok(after) => after.as_nanos() as f64 / 1_000.0,
                    Err(before) => -(before.duration().as_nanos() as f64 / 1_000.0),
                };
                Kind::Window {
                    quota,
                    window,
                    origin,
                    len_us,
                    phase_us: origin_us.rem_euclid(len_us),
                }
            }
            (None, None) => unreachable!("a limit is a bucket or a window"),
        }
    }

    /// The script's four numbers: kind, then a bucket's microseconds per token and burst (and
    /// 0), or a window's length, quota and phase.
    fn values(&self) -> [f64; 4] {
        match *self {
            Kind::Bucket {
                burst, interval_us, ..
            } => [0.0, interval_us, round_down(burst), 0.0],
            Kind::Window {
                quota,
                len_us,
                phase_us,
                ..
            } => [1.0, len_us, round_down(quota), phase_us],
        }
    }
}

/// What every quota of a limiter shares: the connection, the script, the limits, the policy,
/// the counters.
pub(super) struct Inner<const N: usize> {
    conn: Conn,
    /// Whether a round trip on `conn` has come back (see [`Warmth`]).
    pub(super) warmth: Arc<Warmth>,
    script: redis::Script,
    /// The limiter's name, escaped as in every Redis key.
    pub(super) name: String,
    names: [String; N],
    limits: Vec<RedisLimit>,
    policy: FailurePolicy,
    lease: Option<([u64; N], Duration)>,
    pub(super) counters: Counters,
}

/// What this process holds of a lease: per dimension, tokens charged in Redis at `at_us` and
/// not granted yet, until `until`.
struct Lease<const N: usize> {
    left: [u64; N],
    until: Instant,
    at_us: u64,
}

/// A quota's lease in this process, and whether a task is set to give it back once it
/// expires (kept under one lock, so that a lease taken as that task ends is never missed).
struct Leased<const N: usize> {
    held: Option<Lease<N>>,
    sweeping: bool,
}

/// One quota (one Redis key, holding all its limits) as this process knows it.
pub(super) struct Quota<const N: usize> {
    /// `{name}` (or `{name:key}` for a keyed limiter): one key, so one Cluster slot, for every
    /// limit.
    key: String,
    /// The order of this process's reservations, as Redis charged them.
    turns: Arc<Turns>,
    fallback: Mutex<Fallback<RateLimiter<[u64; N]>>>,
    lease: Mutex<Leased<N>>,
    /// The limits this process set ([`RedisRateLimiter::set_limit`]) and has not cleared,
    /// by index: what its fail-open fallback takes `share` of.
    own: Mutex<Vec<Option<Kind>>>,
}

impl<const N: usize> Quota<N> {
    pub(super) fn new(key: String, warmth: Arc<Warmth>) -> Quota<N> {
        Quota {
            key,
            turns: Arc::new(Turns::new(warmth)),
            fallback: Mutex::new(Fallback::default()),
            lease: Mutex::new(Leased {
                held: None,
                sweeping: false,
            }),
            own: Mutex::new(Vec::new()),
        }
    }

    /// Whether this process set a limit of the quota that it has not cleared.
    pub(super) fn has_own_limits(&self) -> bool {
        lock(&self.own).iter().any(Option::is_some)
    }
}

/// A [`RedisRateLimiter`]'s state for several limits: public in a private module (see
/// [`Cost`](crate::limiter::Cost)).
pub struct Several<const N: usize> {
    pub(super) shared: Arc<Inner<N>>,
    pub(super) quota: Arc<Quota<N>>,
}

impl<const N: usize> Clone for Several<N> {
    fn clone(&self) -> Self {
        Several {
            shared: self.shared.clone(),
            quota: self.quota.clone(),
        }
    }
}

impl<const N: usize> fmt::Debug for Several<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRateLimiter")
            .field("key", &self.quota.key)
            .field("names", &self.shared.names)
            .field("limits", &self.shared.limits)
            .field("policy", &self.shared.policy)
            .finish_non_exhaustive()
    }
}

/// What one round trip answered: granted, usable after the wait, or refused for the wait.
enum Answer {
    /// Granted, usable after the wait, charged at Redis time `.1` (microseconds), with what
    /// each limit's dimension took beyond the cost for a lease (empty without one).
    Granted(Nanos, u64, Vec<u64>),
    Refused(Nanos),
}

/// Several limits of one quota (token buckets and fixed windows) across processes and machines,
/// kept in Redis (feature `redis`): a cost is one amount per dimension (`[u64; N]`), and a request
/// is granted when every limit has room for its amount; all are checked and charged at one instant
/// by one script call, on Redis's clock, all or nothing.
///
/// The Redis counterpart of a local `RateLimiter<[u64; N]>`: grants are first come, first served
/// across the fleet (in the order Redis received them), each at the earliest instant at which every
/// limit has room, never before an earlier grant (its wait is the latest of the limits'). Every
/// limit lives in one key, `{name}`, so on a Redis Cluster in one slot. A fixed window's boundaries
/// are on Redis's clock. Leases (most grants without a round trip) with
/// [`lease`](RedisRateLimiterBuilder::lease). Every process must give the same limits (a state of
/// another number of limits is a reply error); [`set_limit`](RedisRateLimiter#method.set_limit-1)
/// changes one for the whole fleet, in Redis, and
/// [`clear_limit`](RedisRateLimiter#method.clear_limit-1) gives the builder's back.
///
/// # Examples
///
/// ```no_run
/// use paced::redis::RedisRateLimiter;
/// use paced::{Limit, Rate};
///
/// # async fn demo(estimate: u64) -> Result<(), paced::redis::RedisLimiterError> {
/// let llm: RedisRateLimiter<[u64; 2]> =
///     RedisRateLimiter::dimensions("redis://127.0.0.1/", "llm", ["requests", "tokens"])
///         .limit("requests", Limit::bucket(Rate::per_minute(500), 50))
///         .limit("tokens", Limit::bucket(Rate::per_minute(40_000), 40_000))
///         .build()?;
/// let permit = llm.acquire([1, estimate]).await?;
/// let used = estimate / 2; // the answer's usage
/// permit.settle([1, used]).await?;
/// # Ok(())
/// # }
/// ```
impl<const N: usize> RedisRateLimiter<[u64; N]> {
    /// A builder for a quota kept in the Redis server at `url`, under the key `{name}`, with
    /// the dimensions `names` (a cost gives one amount per name, in this order), whose limits
    /// are added by [`limit`](RedisLimiterBuilder#method.limit-1). Without limits, failing closed,
    /// with a 250 ms response timeout. (A quota of one limit is made by
    /// [`RedisRateLimiter::builder`].)
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Limit, Rate, RedisRateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let llm: RedisRateLimiter<[u64; 2]> =
    ///     RedisRateLimiter::dimensions("redis://127.0.0.1/", "llm", ["requests", "tokens"])
    ///         .limit("requests", Limit::bucket(Rate::per_minute(500), 50))
    ///         .limit("tokens", Limit::bucket(Rate::per_minute(40_000), 40_000))
    ///         .build()
    ///         .unwrap();
    /// # let _ = llm;
    /// # }
    /// ```
    pub fn dimensions(
        url: &str,
        name: impl Into<String>,
        names: [&str; N],
    ) -> RedisRateLimiterBuilder<[u64; N]> {
        RedisLimiterBuilder::several(Target::Url(url.to_owned()), name, names)
    }

    /// [`dimensions`](Self::dimensions) for a Redis Cluster reached through `nodes`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use paced::{Limit, Rate, RedisRateLimiter};
    ///
    /// # async fn demo() -> Result<(), paced::redis::RedisLimiterError> {
    /// let nodes = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"];
    /// let llm = RedisRateLimiter::cluster_dimensions(&nodes, "llm", ["requests", "tokens"])
    ///     .limit("requests", Limit::bucket(Rate::per_minute(500), 50))
    ///     .build()?;
    /// let _permit = llm.acquire([1, 0]).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn cluster_dimensions(
        nodes: &[&str],
        name: impl Into<String>,
        names: [&str; N],
    ) -> RedisRateLimiterBuilder<[u64; N]> {
        RedisLimiterBuilder::several(Target::cluster(nodes), name, names)
    }

    /// Waits until every limit grants `cost` (one amount per dimension), in one round trip
    /// while Redis answers.
    ///
    /// # Errors
    ///
    /// As the one-limit [`RedisRateLimiter::acquire`]'s:
    /// [`RedisLimiterError::Unavailable`] once Redis has been unreachable for the fail-closed
    /// deadline, [`RedisLimiterError::Reply`] when Redis answers with an error. Nothing was
    /// taken.
    pub async fn acquire(&self, cost: [u64; N]) -> Result<RedisPermit<N>, RedisLimiterError> {
        loop {
            match self.reserve(cost, None).await {
                Ok(permit) => return Ok(permit),
                Err(WaitError::Limiter(e)) => return Err(e),
                Err(WaitError::Refused(refused)) => pause_after(refused).await,
            }
        }
    }

    /// Waits until every limit grants `cost`, if that can be within `timeout`; otherwise
    /// returns at once, having taken nothing (one round trip).
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::NotUntil`] when the cost cannot be had within `timeout` (the latest
    /// of the limits' waits; [`NotUntil::is_never`] for a cost above a bucket's burst, which
    /// only `acquire` waits for); [`TryAcquireError::Reply`] when Redis answers with an error.
    pub async fn acquire_timeout(
        &self,
        cost: [u64; N],
        timeout: Duration,
    ) -> Result<RedisPermit<N>, TryAcquireError> {
        let deadline = Instant::now().checked_add(timeout);
        match self.reserve(cost, Some(deadline)).await {
            Ok(permit) => Ok(permit),
            Err(WaitError::Refused(refused)) => {
                self.inner.shared.counters.refuse();
                Err(TryAcquireError::NotUntil(refused))
            }
            Err(WaitError::Limiter(RedisLimiterError::Reply(e))) => Err(TryAcquireError::Reply(e)),
            Err(WaitError::Limiter(_)) => {
                self.inner.shared.counters.refuse();
                Err(TryAcquireError::NotUntil(NotUntil::after(
                    Duration::from_millis(10),
                )))
            }
        }
    }

    /// Grants `cost` if every limit holds it now and no grant is queued; one round trip. A
    /// refusal charges no limit and writes nothing to Redis.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::NotUntil`], a refusal, with the latest of the limits' waits
    /// ([`NotUntil::is_never`] for a cost above a bucket's burst); while Redis is unreachable, under `FailClosed` a refusal with the retry backoff, under
    /// `FailOpen` the fallback's answer. [`TryAcquireError::Reply`] when Redis answers with an
    /// error.
    pub async fn try_acquire(&self, cost: [u64; N]) -> Result<RedisPermit<N>, TryAcquireError> {
        let counters = &self.inner.shared.counters;
        if cost == [0; N] {
            spend_budget().await;
            counters.grant(0);
            return Ok(self.permit(cost, Charged::Nothing));
        }
        let answer = if let Some(fallback) = self.fallback() {
            fallback.try_acquire(cost).map(|local| {
                counters.fall_back();
                Charged::Local(local)
            })
        } else {
            if let Ok(at_us) = self.take_from_lease(cost, false) {
                spend_budget().await;
                bump(&counters.from_lease);
                counters.grant(sum(cost));
                return Ok(self.permit(cost, Charged::Redis(at_us)));
            }
            let trip = match self.lease_wanted() {
                None => self.round_trip("try", self.amounts(cost), None).await,
                Some(want) => {
                    let spec = self.amounts(cost);
                    self.call("try", spec, None, Some(want))
                        .await
                        .map(|r| self.answer(r))
                }
            };
            match trip {
                Ok(Answer::Granted(_, at_us, leased)) => {
                    self.recovered();
                    if let Some((_, max_age)) = self.inner.shared.lease {
                        self.take_lease(&leased, at_us, max_age);
                    }
                    spend_budget().await;
                    Ok(Charged::Redis(at_us))
                }
                Ok(Answer::Refused(wait)) => {
                    self.recovered();
                    Err(NotUntil::new(wait))
                }
                Err(Failure::Reply(e)) => return Err(TryAcquireError::Reply(e)),
                Err(Failure::Outage(_)) => match self.inner.shared.policy {
                    FailurePolicy::FailOpen { share } => {
                        self.open_fallback(share);
                        return Box::pin(self.try_acquire(cost)).await;
                    }
                    FailurePolicy::FailClosed { .. } => {
                        Err(NotUntil::after(Duration::from_millis(10)))
                    }
                },
            }
        };
        match answer {
            Ok(charged) => {
                counters.grant(sum(cost));
                Ok(self.permit(cost, charged))
            }
            Err(refused) => {
                counters.refuse();
                Err(TryAcquireError::NotUntil(refused))
            }
        }
    }

    /// Replaces the limit at `index` (the number of [`limit`](RedisLimiterBuilder#method.limit-1)
    /// calls before it) in Redis, for every process from its next request, keeping its level as
    /// [`RateLimiter::set_limit`](crate::RateLimiter#method.set_limit-1) does: a bucket keeps the
    /// tokens it holds (or lacks), capped at the new burst; a fixed window keeps what the current
    /// window used (carried into the window of the new length that holds now). One round trip.
    ///
    /// The limits set are kept in the quota's key with its state, which then no longer
    /// expires (it is configuration, as a key's own limit of
    /// [`RedisKeyedRateLimiter::set_limit`](crate::RedisKeyedRateLimiter#method.set_limit-1) is);
    /// deleting the key, or [`clear_limit`](RedisRateLimiter#method.clear_limit-1), gives the
    /// builders' limits back.
    ///
    /// This process also remembers the limit (until
    /// [`clear_limit`](RedisRateLimiter#method.clear_limit-1)), so that under `FailOpen` its
    /// fallback grants `share` of it during an outage. A limit set by another process is not known
    /// here (it is read from Redis by the script, which an outage makes unreachable): this
    /// process's fallback takes `share` of the builder's limit for it.
    ///
    /// # Errors
    ///
    /// [`RedisLimiterError::Config`]: [`ConfigError::NoSuchLimit`] if there is no limit at
    /// `index`, [`ConfigError::LimitKind`] for a limit of the other kind, or an invalid limit;
    /// [`RedisLimiterError::Unavailable`] when Redis is unreachable (at once, whatever the
    /// failure policy), [`RedisLimiterError::Reply`] when it answers with an error: nothing
    /// was changed in this process. A round trip that timed out may still have reached Redis:
    /// set the limit again once Redis is back.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use paced::{Limit, Rate};
    ///
    /// # async fn demo(llm: paced::redis::RedisRateLimiter<[u64; 2]>) -> Result<(), paced::redis::RedisLimiterError> {
    /// // The provider raised our token limit (the second `limit` of the builder).
    /// llm.set_limit(1, Limit::bucket(Rate::per_minute(80_000), 80_000)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn set_limit(&self, index: usize, limit: Limit) -> Result<(), RedisLimiterError> {
        let config = RedisLimiterError::Config;
        let old = self
            .inner
            .shared
            .limits
            .get(index)
            .ok_or(config(ConfigError::NoSuchLimit))?;
        limit.check().map_err(config)?;
        let new = Kind::of(&limit);
        if matches!(old.kind, Kind::Bucket { .. }) != matches!(new, Kind::Bucket { .. }) {
            return Err(config(ConfigError::LimitKind));
        }
        let mut extra = Vec::with_capacity(40);
        for v in [index as f64 + 1.0].into_iter().chain(new.values()) {
            extra.extend_from_slice(&v.to_le_bytes());
        }
        match self
            .call("limit", self.spec(|_| 0.0), Some(extra), None)
            .await
        {
            Ok(_) => {
                self.recovered();
                let mut own = lock(&self.inner.quota.own);
                own.resize(self.inner.shared.limits.len(), None);
                own[index] = Some(new);
                Ok(())
            }
            Err(Failure::Reply(e)) => Err(RedisLimiterError::Reply(e)),
            Err(Failure::Outage(e)) => Err(RedisLimiterError::Unavailable(e)),
        }
    }

    /// Gives every limit of the quota the builder's limit again, for every process from its next
    /// request, keeping levels as [`set_limit`](RedisRateLimiter#method.set_limit-1) does (a
    /// bucket's tokens at most the builder's burst; a window's use of its current window). The
    /// quota's key holds no limits any more, and expires again once every limit is back to full.
    /// This process forgets the limits it had set: its fail-open fallback takes `share` of the
    /// builder's limits again. One round trip.
    ///
    /// # Errors
    ///
    /// As [`set_limit`](RedisRateLimiter#method.set_limit-1)'s, but for the limit's own checks:
    /// [`RedisLimiterError::Unavailable`] at once while Redis is unreachable,
    /// [`RedisLimiterError::Reply`] when it answers with an error (a quota whose limits are of
    /// another kind than the builder's): nothing was changed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(llm: paced::redis::RedisRateLimiter<[u64; 2]>) -> Result<(), paced::redis::RedisLimiterError> {
    /// // Back to the limits the fleet was built with.
    /// llm.clear_limit().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn clear_limit(&self) -> Result<(), RedisLimiterError> {
        match self.call("clear", self.spec(|_| 0.0), None, None).await {
            Ok(_) => {
                self.recovered();
                lock(&self.inner.quota.own).clear();
                Ok(())
            }
            Err(Failure::Reply(e)) => Err(RedisLimiterError::Reply(e)),
            Err(Failure::Outage(e)) => Err(RedisLimiterError::Unavailable(e)),
        }
    }

    /// This process's counters (`keys` is 1: the quota's one key).
    pub fn stats(&self) -> RedisStats {
        RedisStats::read(&self.inner.shared.counters, 1)
    }

    fn permit(&self, cost: [u64; N], charged: Charged<N>) -> RedisPermit<N> {
        RedisPermit {
            limiter: self.clone(),
            cost,
            charged,
        }
    }

    /// The script's limits, each with its dimension's amount of `cost`.
    fn amounts(&self, cost: [u64; N]) -> Vec<u8> {
        self.spec(|dim| round_up(cost[dim]))
    }

    /// The script's limits (five doubles each: kind, three numbers, `amount` of the limit's
    /// dimension).
    fn spec(&self, amount: impl Fn(usize) -> f64) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.inner.shared.limits.len() * 40);
        for limit in &self.inner.shared.limits {
            let values = limit.kind.values();
            for v in values.into_iter().chain([amount(limit.dim)]) {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out
    }

    /// The script's lease argument, with leases: per limit, its dimension and the most to
    /// lease of it.
    fn lease_wanted(&self) -> Option<Vec<u8>> {
        let (max_tokens, _) = self.inner.shared.lease?;
        let mut want = Vec::with_capacity(self.inner.shared.limits.len() * 16);
        for limit in &self.inner.shared.limits {
            want.extend_from_slice(&(limit.dim as f64).to_le_bytes());
            let most = round_down(max_tokens[limit.dim]);
            want.extend_from_slice(&most.to_le_bytes());
        }
        // A reservation takes what the limits hold at its instant, never waiting for more.
        want.extend_from_slice(&0f64.to_le_bytes());
        Some(want)
    }

    /// One script call, in the general form, with `arg` after the limits (the reservation's
    /// longest wait, the settled grant's instant in microseconds, a new limit) and a lease.
    async fn call(
        &self,
        mode: &str,
        spec: Vec<u8>,
        arg: Option<Vec<u8>>,
        lease: Option<Vec<u8>>,
    ) -> Result<Vec<u64>, Failure> {
        let inner = &self.inner.shared;
        inner.counters.round_trip();
        let key = &self.inner.quota.key;
        let reply = eval(
            &inner.script,
            inner.conn.clone(),
            key,
            mode,
            spec,
            [arg, lease, None],
        )
        .await;
        reply.map_err(|e| Failure::classify(e, &inner.counters, key, 0))
    }

    async fn round_trip(
        &self,
        mode: &str,
        spec: Vec<u8>,
        max_wait_us: Option<u64>,
    ) -> Result<Answer, Failure> {
        let extra = max_wait_us.map(micros);
        Ok(self.answer(self.call(mode, spec, extra, None).await?))
    }

    /// A reservation's round trip: with leases, it also asks for a lease (taken only if every
    /// dimension asked for has room at the grant's instant).
    async fn reserve_trip(
        &self,
        spec: Vec<u8>,
        max_wait_us: Option<u64>,
    ) -> Result<Answer, Failure> {
        let Some(want) = self.lease_wanted() else {
            return self.round_trip("reserve", spec, max_wait_us).await;
        };
        let reply = self
            .call("reserve", spec, max_wait_us.map(micros), Some(want))
            .await?;
        Ok(self.answer(reply))
    }

    /// What a grant leased, per dimension (one amount per limit, the same for every limit of
    /// a dimension).
    fn leased_per_dim(&self, leased: &[u64]) -> [u64; N] {
        let mut left = [0; N];
        for (limit, &n) in self.inner.shared.limits.iter().zip(leased) {
            left[limit.dim] = n;
        }
        left
    }

    fn answer(&self, reply: Vec<u64>) -> Answer {
        match reply[..] {
            [0, wait_us, ..] => Answer::Refused(wait_from_us(wait_us)),
            [_, wait_us, at_us, ref leased @ ..] => {
                Answer::Granted(wait_from_us(wait_us), at_us, leased.to_vec())
            }
            _ => Answer::Refused(Nanos::MAX),
        }
    }

    /// Takes `cost` from this process's lease, if it holds all of it, has not expired, and no
    /// reservation of this process for the quota is queued (a lease grant never passes an
    /// earlier waiter of this process): the Redis instant the lease was charged at. An expired
    /// lease is given back.
    ///
    /// Refused, a request that `asks` (one that will wait, not a try) is counted as waiting
    /// for the quota, in the same step, until it drops the returned [`Asking`].
    fn take_from_lease(&self, cost: [u64; N], asks: bool) -> Result<u64, Option<Asking>> {
        if self.inner.shared.lease.is_none() {
            return Err(None);
        }
        let mut leased = lock(&self.inner.quota.lease);
        let asking = || Err(asks.then(|| self.inner.quota.turns.ask()));
        let Some(lease) = leased.held.as_mut() else {
            return asking();
        };
        if Instant::now() >= lease.until {
            let refused = asking();
            let expired = leased.held.take();
            drop(leased);
            if let Some(expired) = expired {
                self.give_back(expired);
            }
            return refused;
        }
        // A dimension without a limit needs no lease.
        let limited = |d: usize| self.inner.shared.limits.iter().any(|l| l.dim == d);
        if !self.inner.quota.turns.is_idle()
            || (0..N).any(|d| limited(d) && lease.left[d] < cost[d])
        {
            return asking();
        }
        for (left, c) in lease.left.iter_mut().zip(cost) {
            *left = left.saturating_sub(c);
        }
        Ok(lease.at_us)
    }

    /// Holds what a grant leased (one amount per limit, the same for every limit of a
    /// dimension), replacing what was left of the last lease (given back), and sees that it
    /// is given back once it expires.
    fn take_lease(&self, leased: &[u64], at_us: u64, max_age: Duration) {
        let left = self.leased_per_dim(leased);
        let now = Instant::now();
        let until = now
            .checked_add(max_age)
            .unwrap_or(now + Duration::from_secs(86_400 * 365 * 30));
        let (old, sweep) = {
            let mut slot = lock(&self.inner.quota.lease);
            let old = slot.held.replace(Lease { left, until, at_us });
            let sweep = !std::mem::replace(&mut slot.sweeping, true);
            (old, sweep)
        };
        if let Some(old) = old {
            self.give_back(old);
        }
        if sweep {
            self.sweep_leases();
        }
    }

    /// Gives back, in the background, what `lease` holds: per dimension, to each of its
    /// limits, as a settle of a grant charged at the lease's instant (a bucket never above its
    /// burst; a fixed window only within the window the lease was charged in). One round
    /// trip, none if it holds nothing; if there is no runtime, or it fails, it stays charged:
    /// on the quota's side.
    fn give_back(&self, lease: Lease<N>) {
        let limited = |d: usize| self.inner.shared.limits.iter().any(|l| l.dim == d);
        if (0..N).all(|d| !limited(d) || lease.left[d] == 0) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let this = self.clone();
        runtime.spawn(async move {
            let spec = this.spec(|dim| -round_down(lease.left[dim]));
            let _ = this
                .call("settle", spec, Some(micros(lease.at_us)), None)
                .await;
        });
    }

    /// A task that gives this process's lease back once it expires, for as long as one is
    /// held (one task per quota; it holds the limiter, so at most a lease's age after the
    /// last handle goes).
    fn sweep_leases(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            lock(&self.inner.quota.lease).sweeping = false;
            return;
        };
        let this = self.clone();
        runtime.spawn(async move {
            loop {
                let until = {
                    let mut slot = lock(&this.inner.quota.lease);
                    match slot.held.as_ref().map(|l| l.until) {
                        None => {
                            slot.sweeping = false;
                            return;
                        }
                        Some(until) if until <= Instant::now() => {
                            let expired = slot.held.take();
                            slot.sweeping = false;
                            drop(slot);
                            if let Some(expired) = expired {
                                this.give_back(expired);
                            }
                            return;
                        }
                        Some(until) => until,
                    }
                };
                tokio::time::sleep_until(until).await;
            }
        });
    }

    /// The fail-open fallback, while it is in charge.
    fn fallback(&self) -> Option<RateLimiter<[u64; N]>> {
        lock(&self.inner.quota.fallback).current()
    }

    /// The fail-open fallback while it is in charge, and until when.
    fn fallback_until(&self) -> Option<(RateLimiter<[u64; N]>, Instant)> {
        lock(&self.inner.quota.fallback).current_until()
    }

    /// Puts a local limiter at `share` of every limit in charge for a second: of the limit
    /// this process set, else of the builder's.
    fn open_fallback(&self, share: f64) {
        let own = lock(&self.inner.quota.own).clone();
        lock(&self.inner.quota.fallback).open(|| {
            let names: [&str; N] = std::array::from_fn(|i| self.inner.shared.names[i].as_str());
            let mut builder = RateLimiter::builder(names);
            for (i, limit) in self.inner.shared.limits.iter().enumerate() {
                let kind = own.get(i).copied().flatten().unwrap_or(limit.kind);
                let local = match kind {
                    Kind::Bucket { rate, burst, .. } => {
                        let (rate, burst) = policy::share_of(rate, burst, share);
                        Limit::bucket(rate, burst)
                    }
                    Kind::Window {
                        quota,
                        window,
                        origin,
                        ..
                    } => {
                        let quota = ((quota as f64 * share).floor() as u64).max(1);
                        Limit::window(quota, window).aligned_to(origin)
                    }
                };
                builder = builder.limit(&self.inner.shared.names[limit.dim], local);
            }
            // The limits were checked when this limiter was built.
            builder.build().expect("RedisRateLimiter: valid limits")
        });
    }

    fn recovered(&self) {
        lock(&self.inner.quota.fallback).recovered();
    }

    /// Whether Redis answers again, for a waiter on the fail-open fallback: `None` if it does
    /// (the outage is over), else the end of the fallback's next second in charge.
    async fn probe(&self) -> Option<Instant> {
        self.inner.shared.counters.round_trip();
        if self.inner.shared.conn.answers().await {
            self.recovered();
            return None;
        }
        if let FailurePolicy::FailOpen { share } = self.inner.shared.policy {
            self.open_fallback(share);
        }
        let second = Instant::now() + Duration::from_secs(1);
        Some(self.fallback_until().map_or(second, |(_, until)| until))
    }

    /// The one reservation path of `acquire` (`deadline: None`) and `acquire_timeout`.
    async fn reserve(
        &self,
        cost: [u64; N],
        deadline: Option<Option<Instant>>,
    ) -> Result<RedisPermit<N>, WaitError> {
        let counters = &self.inner.shared.counters;
        if cost == [0; N] {
            spend_budget().await;
            counters.grant(0);
            return Ok(self.permit(cost, Charged::Nothing));
        }
        // Once the lease was found short, this request is counted as waiting for the quota
        // until it returns: no lease grant passes it.
        let mut asking = None;
        if self.fallback().is_none() {
            match self.take_from_lease(cost, true) {
                Ok(at_us) => {
                    spend_budget().await;
                    bump(&counters.from_lease);
                    counters.grant(sum(cost));
                    return Ok(self.permit(cost, Charged::Redis(at_us)));
                }
                Err(found_short) => asking = found_short,
            }
        }
        let mut outages = Outages::new();
        let left = |now: Instant| match deadline {
            Some(Some(d)) => Some(d.saturating_duration_since(now)),
            _ => None,
        };
        loop {
            if let Some((fallback, until)) = self.fallback_until() {
                let grant = async {
                    match deadline {
                        None => Ok(fallback.acquire(cost).await),
                        Some(_) => {
                            let timeout = left(Instant::now()).unwrap_or(Duration::MAX);
                            fallback.acquire_timeout(cost, timeout).await
                        }
                    }
                };
                let Some(local) = on_fallback(grant, until, || self.probe()).await? else {
                    continue;
                };
                counters.grant(sum(cost));
                counters.fall_back();
                return Ok(self.permit(cost, Charged::Local(local)));
            }
            let attempt = Instant::now();
            let max_wait_us =
                left(attempt).map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
            let trip = self.reserve_trip(self.amounts(cost), max_wait_us);
            // A grant takes its place among this process's grants of the quota by the instant
            // Redis charged it for; anything else takes none.
            let (turn, answer) = self
                .inner
                .quota
                .turns
                .send(trip, |answer| match answer {
                    Ok(Answer::Granted(_, at_us, _)) => Some(*at_us),
                    _ => None,
                })
                .await;
            match answer {
                Ok(Answer::Granted(wait, at_us, leased)) => {
                    self.recovered();
                    // Charged already, with its lease if any: a waiter that goes away gives it
                    // all back.
                    let lease = self.leased_per_dim(&leased);
                    let mut charged = cost;
                    for (c, l) in charged.iter_mut().zip(lease) {
                        *c = c.saturating_add(l);
                    }
                    let mut reserved = Reserved(Some(self.permit(charged, Charged::Redis(at_us))));
                    if wait > Nanos::ZERO {
                        tokio::time::sleep(wait.to_duration()).await;
                    } else {
                        spend_budget().await;
                    }
                    if let Some(turn) = turn {
                        turn.come().await;
                    }
                    let mut permit = reserved.0.take().expect("the reservation, until granted");
                    permit.cost = cost;
                    // The lease is this process's from its grant's instant on.
                    if let (Some((_, max_age)), true) = (self.inner.shared.lease, lease != [0; N]) {
                        self.take_lease(&leased, at_us, max_age);
                    }
                    counters.grant(sum(cost));
                    return Ok(permit);
                }
                Ok(Answer::Refused(wait)) => {
                    self.recovered();
                    if deadline.is_some() {
                        return Err(WaitError::Refused(NotUntil::new(wait)));
                    }
                    if wait == Nanos::MAX {
                        // Never, as in process: waiting for nothing, it holds no place.
                        drop(asking);
                        match std::future::pending::<std::convert::Infallible>().await {}
                    }
                    let wait = wait.to_duration().min(Duration::from_secs(1));
                    tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
                }
                Err(Failure::Reply(e)) => {
                    return Err(WaitError::Limiter(RedisLimiterError::Reply(e)));
                }
                Err(Failure::Outage(e)) => {
                    let (policy, left) = (self.inner.shared.policy, left(Instant::now()));
                    let gives_up = deadline.is_none();
                    if let Some(share) =
                        outages.wait_out(policy, e, attempt, left, gives_up).await?
                    {
                        self.open_fallback(share);
                    }
                }
            }
        }
    }
}

/// What a grant of several limits charged (of a `RedisRateLimiter<[u64; N]>`, or of one key of
/// a `RedisKeyedRateLimiter<K, [u64; N]>`), to [`settle`](Self::settle) once the actual cost
/// is known. Dropping it keeps its charge.
pub struct RedisPermit<const N: usize> {
    limiter: RedisRateLimiter<[u64; N]>,
    cost: [u64; N],
    charged: Charged<N>,
}

/// A grant charged in Redis whose waiter has not had it yet: if the waiter goes away, its
/// whole cost is given back (settled to zero) in the background, in one round trip (if there
/// is a runtime; if not, or if that fails, it stays taken: on the quota's side).
struct Reserved<const N: usize>(Option<RedisPermit<N>>);

impl<const N: usize> Drop for Reserved<N> {
    fn drop(&mut self) {
        let Some(permit) = self.0.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = permit.settle([0; N]).await;
            });
        }
    }
}

/// Where a grant was charged.
enum Charged<const N: usize> {
    /// In Redis, at this Redis time (microseconds): a fixed window gives back only within it.
    Redis(u64),
    /// By the fail-open fallback: settled there.
    Local(Permit<N>),
    /// A cost of zero.
    Nothing,
}

impl<const N: usize> fmt::Debug for RedisPermit<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisPermit")
            .field("charged", &self.cost)
            .field("fallback", &matches!(self.charged, Charged::Local(_)))
            .finish_non_exhaustive()
    }
}

impl<const N: usize> RedisPermit<N> {
    /// The cost this grant charged, per dimension.
    pub fn charged(&self) -> [u64; N] {
        self.cost
    }

    /// Corrects the charge to `actual`, in Redis (one round trip, none if nothing changes):
    /// per dimension, a smaller actual gives the difference back to each of its limits (a
    /// bucket's level never above its burst), a larger one is charged as debt (later grants
    /// wait for it). A grant of the fail-open fallback is settled there.
    ///
    /// While grants of the quota wait for later instants (theirs are fixed: their processes
    /// sleep until then), a bucket takes back at most what it would hold beside them, at the
    /// latest one's instant: a later request never goes at the same instant as a waiting
    /// grant beyond the burst. The rest is lost, as a full bucket loses its refill. The latest
    /// grant's own tokens are the exception: no grant was charged after it, so they come back
    /// in full, and the quota moves back from that grant's instant as far as every bucket's
    /// level allows, never before the start of a fixed window that counts grants. When the
    /// buckets it charged are the ones that bind, that is back to now: a waiter that goes away
    /// then no longer holds up the requests after it.
    ///
    /// # Errors
    ///
    /// [`RedisLimiterError::Unavailable`] when Redis is unreachable,
    /// [`RedisLimiterError::Reply`] when it answers with an error: the correction was not
    /// made.
    pub async fn settle(self, actual: [u64; N]) -> Result<(), RedisLimiterError> {
        let at_us = match self.charged {
            Charged::Local(local) => {
                local.settle(actual);
                return Ok(());
            }
            Charged::Redis(at_us) => at_us,
            Charged::Nothing => 0,
        };
        if actual == self.cost {
            return Ok(());
        }
        let (charged, limiter) = (self.cost, &self.limiter);
        // Given back rounded down, charged rounded up: in the quota's favour.
        let spec = limiter.spec(|dim| {
            let (a, c) = (actual[dim], charged[dim]);
            if a >= c {
                round_up(a - c)
            } else {
                -round_down(c - a)
            }
        });
        match limiter
            .call("settle", spec, Some(micros(at_us)), None)
            .await
        {
            Ok(_) => Ok(()),
            Err(Failure::Reply(e)) => Err(RedisLimiterError::Reply(e)),
            Err(Failure::Outage(e)) => Err(RedisLimiterError::Unavailable(e)),
        }
    }
}

/// A number of microseconds as the script reads it: one little-endian double.
fn micros(us: u64) -> Vec<u8> {
    round_down(us).to_le_bytes().to_vec()
}

fn sum<const N: usize>(cost: [u64; N]) -> u64 {
    cost.iter().fold(0u64, |a, &c| a.saturating_add(c))
}
