//! The acquisitions of a quota of several limits ([`RedisRateLimiter<[u64; N]>`](RedisRateLimiter)):
//! reservations in Redis, its lease, its fail-open fallback, and changes of its limits.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::error::{RedisLimiterError, TryAcquireError};
use super::limiter::RedisRateLimiter;
use super::policy::{self, FailurePolicy};
use super::script::{bump, Failure};
use super::settle::{Charged, RedisPermit, Reserved};
use super::several::{sum, Answer, Kind, Quota, Several};
use super::stats::RedisStats;
use super::wait::{
    on_fallback, on_refusal, pause_after, refill_turn, spend_budget, Outages, WaitError,
};
use crate::core::Nanos;
use crate::error::{ConfigError, NotUntil};
use crate::limiter::{Limit, RateLimiter};
use crate::sync::lock;

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
/// [`lease`](super::RedisRateLimiterBuilder::lease). Every process must give the same limits (a state of
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
            match self.reserve(cost, None, false).await {
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
        match self.reserve(cost, Some(deadline), false).await {
            Ok(permit) => Ok(permit),
            Err(WaitError::Refused(refused)) => {
                self.inner.quota.shared.counters.refuse();
                Err(TryAcquireError::NotUntil(refused))
            }
            Err(WaitError::Limiter(RedisLimiterError::Reply(e))) => Err(TryAcquireError::Reply(e)),
            Err(WaitError::Limiter(_)) => {
                self.inner.quota.shared.counters.refuse();
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
        self.try_acquire_keeping(cost, None::<fn() -> Arc<Quota<N>>>)
            .await
    }

    /// [`try_acquire`](Self::try_acquire) on a quota that its keyed limiter does not keep
    /// (yet): once an outage puts the fail-open fallback in charge, the quota that `keep`
    /// returns (the one the limiter keeps for the key) stands in, so that a key has one
    /// fallback however many such tries found the outage.
    pub(super) async fn try_acquire_keeping(
        &self,
        cost: [u64; N],
        keep: Option<impl FnOnce() -> Arc<Quota<N>>>,
    ) -> Result<RedisPermit<N>, TryAcquireError> {
        let counters = &self.inner.quota.shared.counters;
        if cost == [0; N] {
            return Ok(self.grant_nothing().await);
        }
        // A lease is Redis's grant already: spent first, also while an outage's fallback
        // stands in.
        if let Ok(at_us) = self.grant_from_lease(cost, false, false).await {
            bump(&counters.from_lease);
            counters.grant(sum(cost));
            return Ok(self.permit(cost, Charged::Redis(at_us)));
        }
        let answer = if let Some(fallback) = self.fallback() {
            fallback.try_acquire(cost).map(|local| {
                counters.fall_back();
                Charged::Local(local)
            })
        } else {
            let _using = self.using();
            match self.charge_trip("try", cost, None).await {
                Ok(Answer::Granted(_, at_us, leased)) => {
                    self.recovered();
                    let lease = self.leased_per_dim(&leased);
                    if let (Some((_, max_age)), true) =
                        (self.inner.quota.shared.lease, lease != [0; N])
                    {
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
                Err(Failure::Outage(_)) => match self.inner.quota.shared.policy {
                    FailurePolicy::FailOpen { share } => {
                        let kept = match keep {
                            Some(keep) => RedisRateLimiter {
                                inner: Several { quota: keep() },
                            },
                            None => self.clone(),
                        };
                        kept.open_fallback(share);
                        return Box::pin(kept.try_acquire(cost)).await;
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

    /// Replaces the limit at `index` (the number of [`limit`](super::RedisLimiterBuilder#method.limit-1)
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
            .quota
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
            .call("limit", self.spec(|_| 0.0), [Some(extra), None, None], 0)
            .await
        {
            Ok(_) => {
                self.recovered();
                let mut own = lock(&self.inner.quota.own);
                own.resize(self.inner.quota.shared.limits.len(), None);
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
        match self
            .call("clear", self.spec(|_| 0.0), [None, None, None], 0)
            .await
        {
            Ok(_) => {
                self.recovered();
                lock(&self.inner.quota.own).clear();
                Ok(())
            }
            Err(Failure::Reply(e)) => Err(RedisLimiterError::Reply(e)),
            Err(Failure::Outage(e)) => Err(RedisLimiterError::Unavailable(e)),
        }
    }

    /// This process's counters (`keys`: 1 while this process holds state for the quota, see
    /// [`RedisStats::keys`], else 0).
    pub fn stats(&self) -> RedisStats {
        let keys = usize::from(self.inner.quota.in_use());
        RedisStats::read(&self.inner.quota.shared.counters, keys)
    }

    /// Gives back the unused tokens of the local lease now, and whatever else this process has
    /// to give back, in one round trip (none if there is nothing). A lease is also given back
    /// in the background once it expires, or once the last handle goes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(llm: paced::RedisRateLimiter<[u64; 2]>) {
    /// llm.return_lease().await;
    /// # }
    /// ```
    pub async fn return_lease(&self) {
        self.return_held().await;
    }

    /// A cost of 0: granted at once, spending the task's cooperative budget.
    async fn grant_nothing(&self) -> RedisPermit<N> {
        spend_budget().await;
        self.inner.quota.shared.counters.grant(0);
        self.permit([0; N], Charged::Nothing)
    }

    fn permit(&self, cost: [u64; N], charged: Charged<N>) -> RedisPermit<N> {
        RedisPermit {
            limiter: self.clone(),
            cost,
            charged,
        }
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
            let names: [&str; N] =
                std::array::from_fn(|i| self.inner.quota.shared.names[i].as_str());
            let mut builder = RateLimiter::builder(names);
            for (i, limit) in self.inner.quota.shared.limits.iter().enumerate() {
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
                builder = builder.limit(&self.inner.quota.shared.names[limit.dim], local);
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
        self.inner.quota.shared.counters.round_trip();
        if self.inner.quota.shared.conn.answers().await {
            self.recovered();
            return None;
        }
        if let FailurePolicy::FailOpen { share } = self.inner.quota.shared.policy {
            self.open_fallback(share);
        }
        let second = Instant::now() + Duration::from_secs(1);
        Some(self.fallback_until().map_or(second, |(_, until)| until))
    }

    /// Like `acquire`, but never gives up: what a stream or a tower future does, holding its
    /// item or request. An outage is waited out whatever the fail-closed deadline, and a reply
    /// error (counted and logged as always) is asked again after 100 ms, then at a backoff
    /// doubling up to 1 s.
    pub(super) async fn acquire_patiently(&self, cost: [u64; N]) -> RedisPermit<N> {
        loop {
            match self.reserve(cost, None, true).await {
                Ok(permit) => return permit,
                // Patient, it returns no error; a refusal is waited out as by `acquire`.
                Err(WaitError::Limiter(_)) => {}
                Err(WaitError::Refused(refused)) => pause_after(refused).await,
            }
        }
    }

    /// The one reservation path, of `acquire` (`deadline: None`) and `acquire_timeout`
    /// (`Some(deadline)`, `Some(None)` being a deadline beyond time); `patient` (without a
    /// deadline only) never gives up, and retries reply errors at a backoff.
    async fn reserve(
        &self,
        cost: [u64; N],
        deadline: Option<Option<Instant>>,
        patient: bool,
    ) -> Result<RedisPermit<N>, WaitError> {
        let counters = &self.inner.quota.shared.counters;
        if cost == [0; N] {
            return Ok(self.grant_nothing().await);
        }
        let from_lease = |at_us| {
            bump(&counters.from_lease);
            counters.grant(sum(cost));
            self.permit(cost, Charged::Redis(at_us))
        };
        // A lease is Redis's grant already: spent first, also while an outage's fallback
        // stands in. Once the lease was found short, this request is counted as waiting for
        // the quota until it returns: no lease grant passes it.
        let mut asking = match self.grant_from_lease(cost, false, true).await {
            Ok(at_us) => return Ok(from_lease(at_us)),
            Err(found_short) => found_short,
        };
        let mut outages = Outages::new();
        let left = |now: Instant| match deadline {
            Some(Some(d)) => Some(d.saturating_duration_since(now)),
            _ => None,
        };
        loop {
            // Over buckets, one task at a time refills the lease; the others queue here and
            // take from the lease it brings back.
            let refilling = if self.inner.quota.shared.refills()
                && self.fallback().is_none()
                && self.wants_lease()
            {
                // Counted as waiting for the quota while it holds or waits for the turn, so
                // that the quota is not idle meanwhile (see `take_from_lease`).
                if asking.is_none() {
                    asking = Some(self.inner.quota.turns().ask());
                }
                let guard = refill_turn(self.inner.quota.refill(), deadline).await?;
                if let Ok(at_us) = self.grant_from_lease(cost, true, false).await {
                    return Ok(from_lease(at_us));
                }
                Some(guard)
            } else {
                None
            };
            if let Some((fallback, until)) = self.fallback_until() {
                drop(refilling);
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
            // Counted until its answer (see `using`): what is put back meanwhile goes with a
            // later round trip, or in the background once it is answered.
            let using = self.using();
            let trip = self.charge_trip("reserve", cost, max_wait_us);
            // A grant takes its place among this process's grants of the quota by the instant
            // Redis charged it for; anything else takes none.
            let (turn, answer) = self
                .inner
                .quota
                .turns()
                .send(trip, |answer| match answer {
                    Ok(Answer::Granted(_, at_us, _)) => Some(*at_us),
                    _ => None,
                })
                .await;
            drop(using);
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
                    if let (Some((_, max_age)), true) =
                        (self.inner.quota.shared.lease, lease != [0; N])
                    {
                        self.take_lease(&leased, at_us, max_age);
                    }
                    counters.grant(sum(cost));
                    return Ok(permit);
                }
                Ok(Answer::Refused(wait)) => {
                    self.recovered();
                    on_refusal(wait, deadline.is_some(), refilling, &mut asking).await?;
                }
                Err(failure) => {
                    drop(refilling);
                    let policy = self.inner.quota.shared.policy;
                    if let Some(share) = outages
                        .after(failure, policy, attempt, deadline, patient)
                        .await?
                    {
                        self.open_fallback(share);
                    }
                }
            }
        }
    }
}
