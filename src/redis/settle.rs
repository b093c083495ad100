//! [`RedisPermit`]: what a grant of several limits charged, and how it is settled (or given
//! back, by a waiter that went away).

use std::fmt;

use super::error::RedisLimiterError;
use super::limiter::RedisRateLimiter;
use super::script::{round_down, round_up, Failure};
use super::several::{micros, sum};
use crate::limiter::Permit;

/// What a grant of several limits charged (of a `RedisRateLimiter<[u64; N]>`, or of one key of
/// a `RedisKeyedRateLimiter<K, [u64; N]>`), to [`settle`](Self::settle) once the actual cost
/// is known. Dropping it keeps its charge.
pub struct RedisPermit<const N: usize> {
    pub(super) limiter: RedisRateLimiter<[u64; N]>,
    pub(super) cost: [u64; N],
    pub(super) charged: Charged<N>,
}

/// A grant charged in Redis whose waiter has not had it yet: if the waiter goes away, its
/// whole charge is given back with the quota's next round trip or, once no round trip of the
/// quota is on its way, in the background (if there is a runtime; if not, or if that fails, it
/// stays taken: on the quota's side).
pub(super) struct Reserved<const N: usize>(pub(super) Option<RedisPermit<N>>);

impl<const N: usize> Drop for Reserved<N> {
    fn drop(&mut self) {
        let Some(permit) = self.0.take() else {
            return;
        };
        match permit.charged {
            Charged::Redis(at_us) => permit.limiter.put_back(permit.cost, at_us),
            Charged::Local(local) => local.settle([0; N]),
            Charged::Nothing => {}
        }
    }
}

/// Where a grant was charged.
pub(super) enum Charged<const N: usize> {
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
            .call(
                "settle",
                spec,
                [Some(micros(at_us)), None, None],
                sum(actual),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(Failure::Reply(e)) => Err(RedisLimiterError::Reply(e)),
            Err(Failure::Outage(e)) => Err(RedisLimiterError::Unavailable(e)),
        }
    }
}
