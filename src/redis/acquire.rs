//! The acquisition path of the one-limit Redis limiters (a `RedisKeyedRateLimiter<K>`, and
//! the one key of a `RedisRateLimiter`): `acquire`, `acquire_timeout`, `try_acquire`.
//!
//! A reservation in Redis (or a lease, or the fallback), the wait it was given, the key's turn;
//! retries, backoff and failure policy; the round trips, and the changes of a key's limit.

use std::borrow::Borrow;
use std::fmt::Display;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::error::{RedisLimiterError, TryAcquireError};
use super::fallback::{KeyedFallback, StandIn};
use super::keyed::RedisKeyedRateLimiter;
use super::lease::Hold;
use super::local::ToReturn;
use super::policy::{self, FailurePolicy};
use super::script::{wait_from_us, Answer, Call, Failure, Reply};
use super::turns::Asking;
use super::wait::{
    on_fallback, on_refusal, pause_after, refill_turn, spend_budget, Outages, WaitError,
};
use crate::core::Nanos;
use crate::engine::coop::poll_budget;
use crate::error::{ConfigError, NotUntil};
use crate::limiter::{KeyedRateLimiter, RateLimiter};
use crate::rate::Rate;
use crate::sync::lock;

/// A grant not used yet: given back (see [`Hold::give_back`]) if its waiter goes away.
struct Reserved<'a, 'h, K, Q>
where
    K: Borrow<Q> + Hash + Eq + Send + Sync + 'static,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    hold: &'a Hold<'h, K, Q>,
    tokens: u64,
    /// The Redis instant it was charged for.
    at_us: u64,
}

impl<K, Q> Drop for Reserved<'_, '_, K, Q>
where
    K: Borrow<Q> + Hash + Eq + Send + Sync + 'static,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    fn drop(&mut self) {
        self.hold.give_back(self.tokens, self.at_us);
    }
}

impl<K> RedisKeyedRateLimiter<K>
where
    K: Hash + Eq + Send + Sync + 'static,
{
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
        loop {
            match self.reserve(key, cost, None, false).await {
                Ok(()) => return Ok(()),
                Err(WaitError::Limiter(e)) => return Err(e),
                Err(WaitError::Refused(refused)) => pause_after(refused).await,
            }
        }
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
        let deadline = Instant::now().checked_add(timeout);
        match self.reserve(key, cost, Some(deadline), false).await {
            Ok(()) => Ok(()),
            Err(WaitError::Refused(refused)) => {
                self.inner.counters.refuse();
                Err(TryAcquireError::NotUntil(refused))
            }
            Err(WaitError::Limiter(RedisLimiterError::Reply(e))) => Err(TryAcquireError::Reply(e)),
            // A timed wait ends by its deadline, never for an outage: a refusal.
            Err(WaitError::Limiter(_)) => {
                self.inner.counters.refuse();
                Err(TryAcquireError::NotUntil(NotUntil::after(
                    Duration::from_millis(10),
                )))
            }
        }
    }

    /// Like `acquire`, but never gives up: what a stream or a tower future does, holding its
    /// item or request. An outage is waited out whatever the fail-closed deadline, and a reply
    /// error (counted and logged as always) is asked again after 100 ms, then at a backoff
    /// doubling up to [`REPLY_BACKOFF_MAX`].
    pub(super) async fn acquire_patiently<Q>(&self, key: &Q, cost: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        // Without a deadline, and retrying reply errors, there is no error to return.
        let _ = self.reserve(key, cost, None, true).await;
    }

    /// Whether Redis answers again, for a waiter on the fail-open fallback: `None` if it does
    /// (the outage is over), else the end of the fallback's next second in charge.
    async fn probe<Q>(&self, key: &Q) -> Option<Instant>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        self.inner.counters.round_trip();
        if self.inner.conn.answers().await {
            self.recovered();
            return None;
        }
        if let FailurePolicy::FailOpen { share } = self.inner.policy {
            self.open_fallback(share);
        }
        let second = Instant::now() + Duration::from_secs(1);
        Some(self.fallback(key).map_or(second, |(_, until)| until))
    }

    /// A cost of 0: granted at once, spending the task's cooperative budget.
    async fn grant_nothing(&self) {
        spend_budget().await;
        self.inner.counters.grant(0);
    }

    /// Takes `cost` from `key`'s lease if it holds it and no earlier request of this process
    /// waits for the key (`head`: the caller holds the key's refill lock), spending the task's
    /// cooperative budget (a lease grants without a wait), and counts the grant. Refused, a
    /// request that `asks` (see [`spend_lease`](Self::spend_lease)) is counted as waiting for
    /// the key until it drops what `asking` then holds.
    async fn grant_from_lease<Q>(
        &self,
        key: &Q,
        cost: u64,
        head: bool,
        asking: Option<&mut Option<Asking>>,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.inner.lease_tokens == 0 {
            return false;
        }
        let budget = std::future::poll_fn(poll_budget).await;
        let asks = asking.as_ref().is_some_and(|a| a.is_none());
        match self.spend_lease(key, cost, head, asks) {
            Ok(()) => {
                budget.made_progress();
                self.inner.counters.grant(cost);
                true
            }
            Err(marked) => {
                // Dropped unused: the unit goes back to the budget.
                if let (Some(slot), Some(marked)) = (asking, marked) {
                    *slot = Some(marked);
                }
                false
            }
        }
    }

    /// The one reservation path, of `acquire` (`deadline: None`) and `acquire_timeout`
    /// (`Some(deadline)`, `Some(None)` being a deadline beyond time); `patient` (without a
    /// deadline only) never gives up, and retries reply errors at a backoff.
    async fn reserve<Q>(
        &self,
        key: &Q,
        cost: u64,
        deadline: Option<Option<Instant>>,
        patient: bool,
    ) -> Result<(), WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        let counters = &self.inner.counters;
        if cost == 0 {
            self.grant_nothing().await;
            return Ok(());
        }
        let hold = self.hold(key);
        let keys = &hold.redis;
        let lease_tokens = self.inner.lease_tokens;
        let mut outages = Outages::new();
        let left = |now: Instant| match deadline {
            Some(Some(d)) => Some(d.saturating_duration_since(now)),
            _ => None,
        };
        // Once the lease was found short, this request is counted as waiting for the key
        // until it returns: no lease grant passes it.
        let mut asking = None;
        loop {
            if self
                .grant_from_lease(key, cost, false, Some(&mut asking))
                .await
            {
                return Ok(());
            }
            // With leases, one task at a time refills the key's lease; the others queue here
            // and take from the lease it brings back.
            let refilling = if lease_tokens > 0 {
                let guard = refill_turn(&hold.refill, deadline).await?;
                if self.grant_from_lease(key, cost, true, None).await {
                    return Ok(());
                }
                Some(guard)
            } else {
                None
            };
            if let Some((fallback, until)) = self.fallback(key) {
                drop(refilling);
                let grant = async {
                    match deadline {
                        None => {
                            fallback.acquire(key, cost).await;
                            Ok(())
                        }
                        Some(_) => {
                            let timeout = left(Instant::now()).unwrap_or(Duration::MAX);
                            fallback.acquire_timeout(key, cost, timeout).await
                        }
                    }
                };
                if on_fallback(grant, until, || self.probe(key))
                    .await?
                    .is_none()
                {
                    continue;
                }
                counters.grant(cost);
                counters.fall_back();
                return Ok(());
            }
            let attempt = Instant::now();
            let max_wait_us =
                left(attempt).map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
            // What to give back is taken when the request is sent, not before it queues: a
            // request dropped meanwhile leaves it for the next one.
            let trip = async {
                let amounts = self.amounts(key, cost).await;
                self.round_trip(keys, amounts, true, max_wait_us).await
            };
            // A grant takes its place among this process's grants of the key by the instant
            // Redis charged it for; anything else takes none.
            let (mut turn, answer) = hold
                .turns
                .send(trip, |answer| match answer {
                    Ok(Answer::Granted { wait, at_us, .. }) if *wait != Nanos::MAX => Some(*at_us),
                    _ => None,
                })
                .await;
            match answer {
                Ok(Answer::Granted {
                    surplus,
                    wait,
                    at_us,
                }) => {
                    self.recovered();
                    let mut reserved = Reserved {
                        hold: &hold,
                        tokens: cost.saturating_add(surplus),
                        at_us,
                    };
                    if wait == Nanos::MAX {
                        // Never: it holds nobody up, here or in Redis. The script charges
                        // nothing for it, so there is nothing to give back either.
                        reserved.tokens = 0;
                        if deadline.is_some() {
                            return Err(WaitError::Refused(NotUntil::NEVER));
                        }
                        // Waiting for nothing, it holds no lock and no place.
                        drop(refilling);
                        drop(asking);
                        match std::future::pending::<std::convert::Infallible>().await {}
                    } else if wait > Nanos::ZERO {
                        tokio::time::sleep(wait.to_duration()).await;
                    } else {
                        // Granted without a wait: a task looping on free tokens yields in
                        // time, as on a tokio `Semaphore`.
                        spend_budget().await;
                    }
                    // After this process's grants of the key for earlier instants, however
                    // late their replies were read.
                    if let Some(turn) = turn.take() {
                        turn.come().await;
                    }
                    std::mem::forget(reserved);
                    self.granted(key, surplus);
                    counters.grant(cost);
                    return Ok(());
                }
                Ok(Answer::Refused { wait }) => {
                    self.recovered();
                    on_refusal(wait, deadline.is_some(), refilling, &mut asking).await?;
                }
                Err(failure) => {
                    drop(refilling);
                    let policy = self.inner.policy;
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
        let counters = &self.inner.counters;
        if cost == 0 {
            self.grant_nothing().await;
            return Ok(());
        }
        if self.grant_from_lease(key, cost, false, None).await {
            return Ok(());
        }
        let answer = if let Some((fallback, _)) = self.fallback(key) {
            let answer = fallback.try_acquire(key, cost);
            if answer.is_ok() {
                counters.fall_back();
            }
            answer
        } else {
            // Without leases a try keeps nothing locally: it has nothing to give back and
            // takes no turn.
            let leases = self.inner.lease_tokens > 0;
            let hold = leases.then(|| self.hold(key));
            let own_key;
            let redis_key: &str = match &hold {
                Some(hold) => &hold.redis,
                None => {
                    own_key = self.inner.naming.redis_key(key);
                    &own_key
                }
            };
            // A try takes `cost` if it is there, and with leases (of a key in use) whatever
            // more is there, up to a lease; it never waits for a whole one.
            let amounts = self.amounts(key, cost).await;
            match self.round_trip(redis_key, amounts, false, None).await {
                Ok(Answer::Granted { surplus, .. }) => {
                    self.recovered();
                    self.granted(key, surplus);
                    spend_budget().await;
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
                        drop(hold);
                        return Box::pin(self.try_acquire(key, cost)).await;
                    }
                    FailurePolicy::FailClosed { .. } => {
                        Err(NotUntil::after(Duration::from_millis(10)))
                    }
                },
            }
        };
        if answer.is_ok() {
            counters.grant(cost);
        } else {
            counters.refuse();
        }
        answer.map_err(TryAcquireError::NotUntil)
    }

    /// Gives `key` its own limit (`Some`), or the default one again (`None`), in Redis, and
    /// remembers it for the fail-open fallback once Redis has it.
    pub(super) async fn change_limit<Q>(
        &self,
        key: &Q,
        limit: Option<(Rate, u64)>,
    ) -> Result<(), RedisLimiterError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        if let Some((_, 0)) = limit {
            return Err(RedisLimiterError::Config(ConfigError::ZeroBurst));
        }
        let keys = self.inner.naming.redis_key(key);
        let reply = self
            .call(Call {
                key: &keys,
                interval_us: self.inner.interval_us,
                burst: self.inner.burst,
                amounts: (0, 0, 0),
                mode: if limit.is_some() { "limit" } else { "clear" },
                max_wait_us: None,
                back_at_us: None,
                new_limit: limit.map(|(rate, burst)| (policy::interval_us(rate), burst)),
            })
            .await;
        match reply {
            Ok(_) => {
                self.recovered();
                let mut limits = lock(&self.inner.limits);
                match limit {
                    Some(limit) => limits.insert(key.to_owned(), limit),
                    None => limits.remove(key),
                };
                Ok(())
            }
            Err(Failure::Reply(e)) => Err(RedisLimiterError::Reply(e)),
            Err(Failure::Outage(e)) => Err(RedisLimiterError::Unavailable(e)),
        }
    }

    async fn call(&self, call: Call<'_>) -> Result<Reply, Failure> {
        let inner = &self.inner;
        inner.counters.round_trip();
        call.run(&inner.script, inner.conn.clone())
            .await
            .map_err(|e| Failure::classify(e, &inner.counters, call.key, call.amounts.0))
    }

    /// One script call on `keys`: take at least `cost`, up to `want`, after giving `back`
    /// back, reserving (granted with a wait of at most `max_wait_us`, if given) or only
    /// trying.
    pub(super) async fn round_trip(
        &self,
        keys: &str,
        (cost, want, back): (u64, u64, ToReturn),
        reserve: bool,
        max_wait_us: Option<u64>,
    ) -> Result<Answer, Failure> {
        let reply = self
            .call(Call {
                key: keys,
                interval_us: self.inner.interval_us,
                burst: self.inner.burst,
                amounts: (cost, want, back.tokens),
                mode: match (reserve, cost) {
                    (true, _) => "reserve",
                    // Nothing to take: only tokens to give back.
                    (false, 0) => "settle",
                    (false, _) => "try",
                },
                max_wait_us,
                back_at_us: back.at_us,
                new_limit: None,
            })
            .await?;
        Ok(match reply {
            (0, _, wait_us, _) => Answer::Refused {
                wait: wait_from_us(wait_us),
            },
            (_, surplus, wait_us, at_us) => Answer::Granted {
                // Never more than was asked for, whatever the script's rounding.
                surplus: surplus.min(want - cost),
                wait: wait_from_us(wait_us),
                at_us,
            },
        })
    }
}

/// The fail-open fallback of a keyed limiter (its state is in [`super::fallback`]).
impl<K> RedisKeyedRateLimiter<K>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    /// The local limiter in charge of `key` while the fail-open fallback is: `share` of the
    /// limit this process set for the key, else of the default limit.
    ///
    /// With the instant until which it stays in charge.
    pub(super) fn fallback<Q>(&self, key: &Q) -> Option<(StandIn<K>, Instant)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (fallback, until) = lock(&self.inner.fallback).current_until()?;
        let (FailurePolicy::FailOpen { share }, Some((rate, burst))) = (
            self.inner.policy,
            lock(&self.inner.limits).get(key).copied(),
        ) else {
            return Some((StandIn::Default(fallback.default), until));
        };
        let mut own = lock(&fallback.own);
        if let Some(limiter) = own.get(key) {
            return Some((StandIn::Own(limiter.clone()), until));
        }
        let (rate, burst) = policy::share_of(rate, burst, share);
        let limiter = RateLimiter::new(rate, burst);
        own.insert(key.to_owned(), limiter.clone());
        Some((StandIn::Own(limiter), until))
    }

    /// Puts the fallback in charge for a second: `share` of the default limit, and of the
    /// limits this process set.
    pub(super) fn open_fallback(&self, share: f64) {
        let (rate, burst) = policy::share_of(self.inner.rate, self.inner.burst, share);
        lock(&self.inner.fallback).open(|| KeyedFallback {
            default: KeyedRateLimiter::new(rate, burst),
            own: Arc::default(),
        });
    }

    /// Redis answered: the outage, if any, is over.
    pub(super) fn recovered(&self) {
        lock(&self.inner.fallback).recovered();
    }
}

#[cfg(test)]
mod tests {
    use super::super::script::{round_down, round_up, wait_from_us};
    use crate::core::Nanos;
    use crate::error::NotUntil;

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
