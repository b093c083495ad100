//! The fail-open fallback: local limiters that stand in for Redis during an outage.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::NotUntil;
use crate::limiter::{KeyedRateLimiter, RateLimiter};
use crate::sync::Mutex;

/// Under `FailOpen`, during an outage: the local limiter (kept for the whole outage, so that
/// probing Redis again does not refill it) and, while it is in charge, until when.
pub(super) struct Fallback<F> {
    limiter: Option<F>,
    until: Option<Instant>,
}

impl<F> Default for Fallback<F> {
    fn default() -> Self {
        Fallback {
            limiter: None,
            until: None,
        }
    }
}

impl<F: Clone> Fallback<F> {
    /// The fallback, while it is in charge; after its second, `None` (time to try Redis
    /// again), keeping its state in case Redis still fails.
    pub(super) fn current(&mut self) -> Option<F> {
        self.current_until().map(|(limiter, _)| limiter)
    }

    /// [`current`](Self::current), with the instant its second ends: a waiter on it waits no
    /// longer, so that once Redis is back nobody is granted by the fallback any more.
    pub(super) fn current_until(&mut self) -> Option<(F, Instant)> {
        match self.until {
            Some(until) if Instant::now() < until => Some((self.limiter.clone()?, until)),
            Some(_) => {
                self.until = None;
                None
            }
            None => None,
        }
    }

    /// Puts the fallback in charge for a second, made by `make` if the outage is new.
    pub(super) fn open(&mut self, make: impl FnOnce() -> F) {
        if self.limiter.is_none() {
            self.limiter = Some(make());
        }
        self.until = Some(Instant::now() + Duration::from_secs(1));
    }

    /// Redis answered: the outage, if any, is over.
    pub(super) fn recovered(&mut self) {
        self.limiter = None;
        self.until = None;
    }
}

/// The fail-open fallback of one outage: a keyed limiter at `share` of the default limit, and
/// for each key with a limit this process set, a limiter at `share` of that limit (made when
/// the key is first used during the outage). Kept for the whole outage, so that probing Redis
/// again does not refill it.
pub(super) struct KeyedFallback<K> {
    pub(super) default: KeyedRateLimiter<K>,
    pub(super) own: Arc<Mutex<HashMap<K, RateLimiter>>>,
}

impl<K> Clone for KeyedFallback<K> {
    fn clone(&self) -> Self {
        KeyedFallback {
            default: self.default.clone(),
            own: self.own.clone(),
        }
    }
}

/// The local limiter that stands in for one key's Redis bucket during an outage.
pub(super) enum StandIn<K> {
    /// `share` of the default limit: one bucket of the fallback's keyed limiter.
    Default(KeyedRateLimiter<K>),
    /// `share` of the limit this process set for the key.
    Own(RateLimiter),
}

impl<K: Hash + Eq> StandIn<K> {
    pub(super) async fn acquire<Q>(&self, key: &Q, cost: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self {
            StandIn::Default(keyed) => keyed.acquire(key, cost).await,
            StandIn::Own(own) => own.acquire(cost).await,
        }
    }

    pub(super) async fn acquire_timeout<Q>(
        &self,
        key: &Q,
        cost: u64,
        timeout: Duration,
    ) -> Result<(), NotUntil>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self {
            StandIn::Default(keyed) => keyed.acquire_timeout(key, cost, timeout).await,
            StandIn::Own(own) => own.acquire_timeout(cost, timeout).await,
        }
    }

    pub(super) fn try_acquire<Q>(&self, key: &Q, cost: u64) -> Result<(), NotUntil>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self {
            StandIn::Default(keyed) => keyed.try_acquire(key, cost),
            StandIn::Own(own) => own.try_acquire(cost),
        }
    }
}
