//! What a quota of several limits holds in this process: its lease, and the tokens charged in
//! Redis that it will not grant, on their way back (with the quota's next round trip, or in
//! the background once no round trip of the quota is on its way).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::limiter::RedisRateLimiter;
use super::script::round_down;
use super::several::{Back, Lease, Several};
use super::turns::Asking;
use super::wait::{closed_gate, forget_gate};
use crate::engine::coop::poll_budget;
use crate::sync::lock;

/// A round trip of the quota on its way to Redis, until it is answered: while one is, tokens
/// to give back wait for a round trip; once none is, they go back in the background (an
/// acquisition that sleeps out its wait, or waits for its turn, holds nothing back).
pub(super) struct Using<'a, const N: usize>(&'a RedisRateLimiter<[u64; N]>);

impl<const N: usize> Drop for Using<'_, N> {
    fn drop(&mut self) {
        let idle = {
            let mut local = lock(&self.0.inner.quota.lease);
            local.users -= 1;
            local.users == 0 && !local.back.is_empty()
        };
        if idle {
            self.0.give_back_later();
        }
    }
}

impl<const N: usize> RedisRateLimiter<[u64; N]> {
    /// Counts a round trip on its way to Redis until the returned guard is dropped.
    pub(super) fn using(&self) -> Using<'_, N> {
        lock(&self.inner.quota.lease).users += 1;
        Using(self)
    }

    /// [`take_from_lease`](Self::take_from_lease), spending a unit of the task's cooperative
    /// budget on a grant (a lease grants without a wait). The budget is asked for first, so
    /// that a request dropped while its task yields has taken nothing from the lease.
    pub(super) async fn grant_from_lease(
        &self,
        cost: [u64; N],
        head: bool,
        asks: bool,
    ) -> Result<u64, Option<Asking>> {
        let budget = std::future::poll_fn(poll_budget).await;
        let taken = self.take_from_lease(cost, head, asks);
        if taken.is_ok() {
            budget.made_progress();
        }
        // Otherwise dropped unused: the unit goes back to the budget.
        taken
    }

    /// Takes `cost` from this process's lease, if it holds all of it, has not expired, and no
    /// reservation of this process for the quota is queued (a lease grant never passes an
    /// earlier waiter of this process; one that holds or waits for the refill turn counts as
    /// queued, see [`Turns::ask`](super::turns::Turns::ask)): the Redis instant the lease was
    /// charged at. `head`: the caller holds the refill turn, so no earlier request waits. An
    /// expired lease is given back with the caller's round trip.
    ///
    /// Refused, a request that `asks` (one that will wait, not a try) is counted as waiting
    /// for the quota, in the same step, until it drops the returned [`Asking`].
    pub(super) fn take_from_lease(
        &self,
        cost: [u64; N],
        head: bool,
        asks: bool,
    ) -> Result<u64, Option<Asking>> {
        if self.inner.quota.shared.lease.is_none() {
            return Err(None);
        }
        let quota = &self.inner.quota;
        let mut local = lock(&quota.lease);
        let asking = || Err(asks.then(|| quota.turns().ask()));
        let Some(lease) = local.held.as_mut() else {
            return asking();
        };
        let now = Instant::now();
        if now >= lease.until {
            let (left, at_us) = (lease.left, lease.at_us);
            local.held = None;
            local
                .back
                .add(self.inner.quota.shared.limited_only(left), at_us);
            return asking();
        }
        if (0..N).any(|d| self.inner.quota.shared.limited(d) && lease.left[d] < cost[d])
            || (!head && !quota.turns_idle())
        {
            return asking();
        }
        for (left, c) in lease.left.iter_mut().zip(cost) {
            *left = left.saturating_sub(c);
        }
        let at_us = lease.at_us;
        local.granted_at = Some(now);
        Ok(at_us)
    }

    /// Holds what a grant leased (one amount per limit, the same for every limit of a
    /// dimension), replacing what was left of the last lease (given back with the next round
    /// trip, or in the background if none is on its way), and sees that it is given back once
    /// it expires.
    pub(super) fn take_lease(&self, leased: &[u64], at_us: u64, max_age: Duration) {
        let left = self.leased_per_dim(leased);
        let now = Instant::now();
        let until = now
            .checked_add(max_age)
            .unwrap_or(now + Duration::from_secs(86_400 * 365 * 30));
        let (sweep, idle) = {
            let mut local = lock(&self.inner.quota.lease);
            if let Some(old) = local.held.replace(Lease { left, until, at_us }) {
                local
                    .back
                    .add(self.inner.quota.shared.limited_only(old.left), old.at_us);
            }
            let sweep = !std::mem::replace(&mut local.sweeping, true);
            (sweep, local.users == 0 && !local.back.is_empty())
        };
        if sweep {
            self.sweep_leases();
        }
        if idle {
            self.give_back_later();
        }
    }

    /// Tokens charged for Redis time `at_us` that this process will not grant (a reservation
    /// whose waiter went away): given back with the quota's next round trip or, once nothing
    /// of the quota is in flight, in the background.
    pub(super) fn put_back(&self, dims: [u64; N], at_us: u64) {
        let idle = {
            let mut local = lock(&self.inner.quota.lease);
            local
                .back
                .add(self.inner.quota.shared.limited_only(dims), at_us);
            local.users == 0
        };
        if idle {
            self.give_back_later();
        }
    }

    /// What to give back with a round trip about to be sent, taken under the lock under which
    /// a give-back in the background is seen: if one is on its way, this waits for its answer
    /// first. Sent before it, a reservation would be charged behind tokens about to come back,
    /// and Redis takes back in full only the latest grant's tokens while grants wait.
    pub(super) async fn take_back(&self) -> Back<N> {
        loop {
            let gate = {
                let mut local = lock(&self.inner.quota.lease);
                match &local.returning {
                    None => return std::mem::replace(&mut local.back, Back::NOTHING),
                    Some(gate) => gate.clone(),
                }
            };
            drop(gate.lock().await);
            forget_gate(&mut lock(&self.inner.quota.lease).returning, &gate);
        }
    }

    /// The script's tokens to give back (ARGV[5]): per limit, its dimension's; then the Redis
    /// time they were charged at, or -1. None for nothing.
    pub(super) fn back_arg(&self, back: &Back<N>) -> Option<Vec<u8>> {
        if back.is_empty() {
            return None;
        }
        let limits = &self.inner.quota.shared.limits;
        let mut arg = Vec::with_capacity((limits.len() + 1) * 8);
        for limit in limits {
            arg.extend_from_slice(&round_down(back.dims[limit.dim]).to_le_bytes());
        }
        let at = back.at_us.map_or(-1.0, round_down);
        arg.extend_from_slice(&at.to_le_bytes());
        Some(arg)
    }

    /// Gives back what the quota has to give back, in the background (one round trip per
    /// batch, none for nothing), its next round trips waiting at its gate until Redis has
    /// answered. If there is no runtime, or the round trip fails, the tokens stay charged: on
    /// the quota's side.
    pub(super) fn give_back_later(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let this = self.clone();
        runtime.spawn(async move {
            let (gate, closed) = closed_gate();
            {
                let mut local = lock(&this.inner.quota.lease);
                if local.returning.is_some() {
                    // Another such task is giving back, and takes this too.
                    return;
                }
                local.returning = Some(gate);
            }
            loop {
                let back = {
                    let mut local = lock(&this.inner.quota.lease);
                    let back = std::mem::replace(&mut local.back, Back::NOTHING);
                    if back.is_empty() {
                        // Opened under the lock under which nothing was left: tokens added
                        // later find the gate open, and a task of their own or the next
                        // round trip takes them back.
                        local.returning = None;
                        break;
                    }
                    back
                };
                this.inner
                    .quota
                    .shared
                    .send_back(&this.inner.quota.key, back)
                    .await;
            }
            drop(closed);
        });
    }

    /// Gives back the lease held and whatever else there is to give back, now (after a
    /// give-back on its way, if any): one round trip, none for nothing.
    pub(super) async fn return_held(&self) {
        let mut back = self.take_back().await;
        {
            let mut local = lock(&self.inner.quota.lease);
            if let Some(lease) = local.held.take() {
                back.add(
                    self.inner.quota.shared.limited_only(lease.left),
                    lease.at_us,
                );
            }
            // Anything put back since `take_back` goes with it.
            back.merge(std::mem::replace(&mut local.back, Back::NOTHING));
        }
        if !back.is_empty() {
            self.inner
                .quota
                .shared
                .send_back(&self.inner.quota.key, back)
                .await;
        }
    }

    /// A task that moves this process's lease to be given back once it expires, for as long as
    /// one is held (one task per quota), and gives it back in the background once the quota is
    /// no longer in use, if no round trip took it back first. It does not hold the quota: once
    /// its last handle goes, the quota gives its lease back itself (see `Quota`'s `Drop`), and
    /// the task ends when it next wakes.
    fn sweep_leases(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            lock(&self.inner.quota.lease).sweeping = false;
            return;
        };
        let quota = Arc::downgrade(&self.inner.quota);
        runtime.spawn(async move {
            loop {
                let Some(quota) = quota.upgrade() else {
                    return;
                };
                let this: RedisRateLimiter<[u64; N]> = RedisRateLimiter {
                    inner: Several { quota },
                };
                let until = {
                    let mut local = lock(&this.inner.quota.lease);
                    let now = Instant::now();
                    match local.held.as_ref().map(|l| (l.until, l.left, l.at_us)) {
                        Some((until, ..)) if until > now => until,
                        held => {
                            if let Some((_, left, at_us)) = held {
                                local.held = None;
                                local
                                    .back
                                    .add(this.inner.quota.shared.limited_only(left), at_us);
                            }
                            // Nothing held: what is to give back waits for the quota's
                            // next round trip while the quota is in use (granted within the
                            // lease's age; a round trip on its way takes it, or gives it back
                            // once answered), then goes back in the background.
                            let age = this
                                .inner
                                .quota
                                .shared
                                .lease
                                .map_or(Duration::ZERO, |l| l.1);
                            let busy_until = local.granted_at.and_then(|at| at.checked_add(age));
                            match busy_until {
                                _ if local.back.is_empty() || local.users > 0 => {
                                    local.sweeping = false;
                                    return;
                                }
                                Some(at) if at > now => at,
                                _ => {
                                    local.sweeping = false;
                                    drop(local);
                                    this.give_back_later();
                                    return;
                                }
                            }
                        }
                    }
                };
                // Not held while it sleeps.
                drop(this);
                tokio::time::sleep_until(until).await;
            }
        });
    }
}
