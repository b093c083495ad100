//! Leases and the local state of the keys in use, and how unused tokens go back to Redis.

use std::borrow::Borrow;
use std::fmt::Display;
use std::hash::Hash;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::keyed::{Inner, RedisKeyedRateLimiter};
use super::local::{KeyLocal, Lease, ToReturn};
use super::script::{bump, Call};
use super::turns::{Asking, Turns};
use super::wait::{closed_gate, forget_gate, Gate};
use crate::sync::lock;

/// Gives `back` tokens of a key back to Redis, in the background (if there is a runtime; if
/// not, or if it fails, they stay taken: on the quota's side).
pub(super) fn give_back<K>(inner: &Inner<K>, keys: Arc<str>, back: ToReturn) {
    if back.tokens == 0 {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(giving_back(inner, keys, back));
}

/// The round trip that gives `back` tokens of a key back to Redis (none for no tokens); an
/// error leaves them taken, on the quota's side.
fn giving_back<K>(
    inner: &Inner<K>,
    keys: Arc<str>,
    back: ToReturn,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let given = back.tokens > 0;
    if given {
        inner.counters.round_trip();
    }
    let (conn, script) = (inner.conn.clone(), inner.script.clone());
    let (interval_us, burst) = (inner.interval_us, inner.burst);
    async move {
        if !given {
            return;
        }
        let call = Call {
            key: &keys,
            interval_us,
            burst,
            amounts: (0, 0, back.tokens),
            mode: "settle",
            max_wait_us: None,
            back_at_us: back.at_us,
            new_limit: None,
        };
        let _ = call.run(&script, conn).await;
    }
}

impl<K> Inner<K> {
    /// Moves expired leases to be given back, drops the local state of keys nobody uses, and
    /// returns what to give back for them and whether a lease or a key in use remains (to be
    /// swept later).
    fn sweep(&self) -> (Vec<(Arc<str>, ToReturn)>, bool) {
        let now = Instant::now();
        let mut gone = Vec::new();
        let mut later = false;
        lock(&self.keys).retain(|_, local| {
            if local.lease.as_ref().is_some_and(|l| l.expires <= now) {
                let unused = local.lease.take().map_or(0, |l| l.tokens);
                local.to_return.add(unused);
            }
            if local.idle(now, self.lease_age) {
                gone.push((local.redis.clone(), local.to_return));
                return false;
            }
            later |= local.lease.is_some() || local.in_use(now, self.lease_age);
            true
        });
        (gone, later)
    }
}

impl<K> Drop for Inner<K> {
    fn drop(&mut self) {
        let keys = std::mem::take(&mut *lock(&self.keys));
        for (_, local) in keys {
            let mut back = local.to_return;
            back.add(local.lease.map_or(0, |l| l.tokens));
            give_back(self, local.redis, back);
        }
    }
}

/// This process's hold on a key's local state while an acquisition is in flight.
pub(super) struct Hold<'a, K, Q>
where
    K: Borrow<Q> + Hash + Eq + Send + Sync + 'static,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    inner: &'a Arc<Inner<K>>,
    key: &'a Q,
    pub(super) redis: Arc<str>,
    pub(super) refill: Arc<tokio::sync::Mutex<()>>,
    pub(super) turns: Arc<Turns>,
}

impl<K, Q> Hold<'_, K, Q>
where
    K: Borrow<Q> + Hash + Eq + Send + Sync + 'static,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    /// Tokens charged for the key, for the Redis instant `at_us`, but not used (a reservation
    /// whose waiter went away): given back with the key's next round trip or, once nothing
    /// uses the key, in the background, whichever comes first; with that instant while they
    /// are all there is to give back.
    pub(super) fn give_back(&self, tokens: u64, at_us: u64) {
        if let Some(local) = lock(&self.inner.keys).get_mut(self.key) {
            local.to_return.add_reserved(tokens, at_us);
        }
    }
}

impl<K, Q> Drop for Hold<'_, K, Q>
where
    K: Borrow<Q> + Hash + Eq + Send + Sync + 'static,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    fn drop(&mut self) {
        let mut keys = lock(&self.inner.keys);
        let Some(local) = keys.get_mut(self.key) else {
            return;
        };
        local.users -= 1;
        if !local.idle(Instant::now(), self.inner.lease_age) {
            return;
        }
        if local.to_return.tokens == 0 {
            keys.remove(self.key);
            return;
        }
        drop(keys);
        // Kept until given back, so that a request of the key sent meanwhile takes the tokens
        // back with it rather than race the background round trip to Redis.
        give_back_later(self.inner, self.key.to_owned());
    }
}

/// Gives back what `key` has to give back, in the background, and drops its local state if
/// nothing uses it by then (if there is no runtime, it is given back when the limiter goes).
///
/// Until Redis has answered, the key's next requests wait at its gate (`KeyLocal::returning`,
/// see `amounts`): sent first, a reservation would be charged behind
/// tokens about to come back, and Redis gives back only the last grant's tokens while grants
/// wait, so those would stay taken (a reservation abandoned behind a long debt then held up
/// every later request of the key for as long).
fn give_back_later<K>(inner: &Arc<Inner<K>>, key: K)
where
    K: Hash + Eq + Send + Sync + 'static,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let inner = inner.clone();
    runtime.spawn(async move {
        let (gate, closed) = closed_gate();
        match lock(&inner.keys).get_mut(&key) {
            Some(local) if local.returning.is_none() => local.returning = Some(gate.clone()),
            // Gone, or being given back by another such task, which takes this too.
            _ => return,
        }
        loop {
            let (redis, back) = {
                let mut keys = lock(&inner.keys);
                let Some(local) = keys.get_mut(&key) else {
                    break;
                };
                let back = std::mem::take(&mut local.to_return);
                if back.tokens == 0 {
                    // Opened under the lock under which nothing was left: tokens added later
                    // find the gate open, and a task of their own or the next request takes
                    // them back.
                    local.returning = None;
                    if local.idle(Instant::now(), inner.lease_age) {
                        keys.remove(&key);
                    }
                    break;
                }
                (local.redis.clone(), back)
            };
            giving_back(&inner, redis, back).await;
        }
        drop(closed);
    });
}

impl<K> RedisKeyedRateLimiter<K>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    pub(super) fn hold<'a, Q>(&'a self, key: &'a Q) -> Hold<'a, K, Q>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        let mut keys = lock(&self.inner.keys);
        let (redis, refill, turns) = match keys.get_mut(key) {
            Some(local) => {
                local.users += 1;
                (
                    local.redis.clone(),
                    local.refill.clone(),
                    local.turns.clone(),
                )
            }
            None => {
                let local = KeyLocal {
                    users: 1,
                    redis: Arc::from(self.inner.naming.redis_key(key)),
                    lease: None,
                    to_return: ToReturn::NOTHING,
                    returning: None,
                    refill: Arc::new(tokio::sync::Mutex::new(())),
                    turns: Arc::new(Turns::new(self.inner.warmth.clone())),
                    granted_at: None,
                };
                let held = (
                    local.redis.clone(),
                    local.refill.clone(),
                    local.turns.clone(),
                );
                keys.insert(key.to_owned(), local);
                held
            }
        };
        Hold {
            inner: &self.inner,
            key,
            redis,
            refill,
            turns,
        }
    }

    /// Takes `cost` from `key`'s local lease, if it holds enough and has not expired, and
    /// the lease would not pass an earlier request of this process for the key: one that
    /// found the lease short (it holds or waits for the key's refill lock) or a reservation in
    /// flight or waiting its turn. `head`: the caller holds the refill lock, so no earlier
    /// request waits.
    ///
    /// Refused, a request that `asks` (one that will wait for the key, not a try) is counted
    /// as found short, in the same step, until it drops the returned [`Asking`].
    pub(super) fn spend_lease<Q>(
        &self,
        key: &Q,
        cost: u64,
        head: bool,
        asks: bool,
    ) -> Result<(), Option<Asking>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.inner.lease_tokens == 0 {
            return Err(None);
        }
        let mut keys = lock(&self.inner.keys);
        let Some(local) = keys.get_mut(key) else {
            return Err(None);
        };
        let asking = |local: &KeyLocal| Err(asks.then(|| local.turns.ask()));
        let Some(lease) = local.lease.as_mut() else {
            return asking(local);
        };
        let now = Instant::now();
        if lease.expires <= now {
            let unused = lease.tokens;
            local.lease = None;
            local.to_return.add(unused);
            return asking(local);
        }
        if lease.tokens < cost
            || (!head && (local.refill.try_lock().is_err() || !local.turns.is_idle()))
        {
            return asking(local);
        }
        lease.tokens -= cost;
        local.granted_at = Some(now);
        bump(&self.inner.counters.from_lease);
        Ok(())
    }

    /// What `key`'s next round trip asks for: at least `cost`, at most `cost` or, with leases
    /// and if the key is in use, a whole lease; and the tokens it gives back.
    ///
    /// A key is in use while it was granted within the lease age: its first request (and the
    /// first after a pause longer than the lease age) takes only its cost, so keys that are
    /// not asked again within the age cost no lease and no round trip to give it back. A busy
    /// key stays in use, and the unspent tokens of its expired lease go back with its next
    /// round trip.
    ///
    /// Waits first until tokens of the key being given back in the background have reached
    /// Redis (see `give_back_later`), so that the request is charged after them. The key's
    /// gate is checked under the same lock as what it gives back is taken: a give-back that
    /// starts later finds nothing to give back.
    pub(super) async fn amounts<Q>(&self, key: &Q, cost: u64) -> (u64, u64, ToReturn)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        loop {
            match self.amounts_now(key, cost) {
                Ok(amounts) => return amounts,
                Err(gate) => {
                    drop(gate.lock().await);
                    if let Some(local) = lock(&self.inner.keys).get_mut(key) {
                        forget_gate(&mut local.returning, &gate);
                    }
                }
            }
        }
    }

    /// [`amounts`](Self::amounts), or the gate to wait at.
    fn amounts_now<Q>(&self, key: &Q, cost: u64) -> Result<(u64, u64, ToReturn), Gate>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let lease_tokens = self.inner.lease_tokens;
        let now = Instant::now();
        let mut keys = lock(&self.inner.keys);
        let Some(local) = keys.get_mut(key) else {
            return Ok((cost, cost, ToReturn::NOTHING));
        };
        if let Some(gate) = &local.returning {
            return Err(gate.clone());
        }
        let leases = lease_tokens > 0;
        let want = if leases && (self.inner.eager_lease || local.in_use(now, self.inner.lease_age))
        {
            cost.max(lease_tokens)
        } else {
            cost
        };
        Ok((cost, want, std::mem::take(&mut local.to_return)))
    }

    /// After a round trip of `key` granted (with leases): the key is in use, and the surplus,
    /// if any, is its lease, usable until `max_age` from now; what was left of an older lease
    /// is given back with the key's next round trip.
    pub(super) fn granted<Q>(&self, key: &Q, surplus: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.inner.lease_tokens == 0 {
            return;
        }
        let now = Instant::now();
        let expires = now
            .checked_add(self.inner.lease_age)
            .unwrap_or(now + Duration::from_secs(86_400));
        {
            let mut keys = lock(&self.inner.keys);
            // The caller holds the key: its local state is there.
            let Some(local) = keys.get_mut(key) else {
                return;
            };
            local.granted_at = Some(now);
            if surplus > 0 {
                let lease = Lease {
                    tokens: surplus,
                    expires,
                };
                if let Some(old) = local.lease.replace(lease) {
                    local.to_return.add(old.tokens);
                }
            }
        }
        self.schedule_sweep();
    }

    /// Makes sure a task gives back the expired leases of keys nobody uses any more, every
    /// `max_age`, for as long as leases are held.
    fn schedule_sweep(&self) {
        if self.inner.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.inner.sweeping.store(false, Ordering::Release);
            return;
        };
        let every = self
            .inner
            .lease_age
            .clamp(Duration::from_millis(1), Duration::from_secs(3_600));
        let weak = Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let (gone, later) = inner.sweep();
                for (keys, back) in gone {
                    give_back(&inner, keys, back);
                }
                if !later {
                    inner.sweeping.store(false, Ordering::Release);
                    // A lease kept meanwhile may have found the flag still set: look again.
                    let (gone, later) = inner.sweep();
                    for (keys, back) in gone {
                        give_back(&inner, keys, back);
                    }
                    if !later || inner.sweeping.swap(true, Ordering::AcqRel) {
                        return;
                    }
                }
            }
        });
    }

    /// Gives back `key`'s unused lease, and whatever else it has to give back, now, in one
    /// round trip (none if there is nothing).
    pub(super) async fn return_lease<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ?Sized,
    {
        let (redis_key, back) = {
            let mut keys = lock(&self.inner.keys);
            let Some(local) = keys.get_mut(key) else {
                return;
            };
            let mut back = std::mem::take(&mut local.to_return);
            back.add(local.lease.take().map_or(0, |l| l.tokens));
            (local.redis.clone(), back)
        };
        if back.tokens > 0 {
            // It may have run even if it failed: not offering the tokens again errs on the
            // quota's side.
            let _ = self.round_trip(&redis_key, (0, 0, back), false, None).await;
        }
    }
}
