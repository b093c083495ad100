//! The permits by which streams and tower services wait on the Redis limiters.

use std::collections::hash_map::RandomState;
use std::fmt::{self, Display};
use std::hash::{BuildHasher, Hash};
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};

use super::error::TryAcquireError;
use super::keyed::RedisKeyedRateLimiter;
use super::limiter::RedisRateLimiter;
use super::script::REPLY_RETRY;
use super::settle::RedisPermit;
use crate::error::NotUntil;
use crate::limiter::keyed_traits::sealed::{Arrival, KeyedSealed};
use crate::limiter::traits::sealed;
use crate::limiter::{KeyedLimiter, Limiter};

/// A round trip (and whatever waiting follows it) in flight for a stream or a tower future.
pub(super) type Pending<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// What a permit shows: whether a round trip of it is in flight.
fn debug_permit(f: &mut fmt::Formatter<'_>, name: &str, in_flight: bool) -> fmt::Result {
    f.debug_struct(name)
        .field("in_flight", &in_flight)
        .finish_non_exhaustive()
}

/// Polls the request in flight in `slot`, starting it with `start` if there is none, and
/// empties the slot once it has answered.
fn poll_slot<T, F>(
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

/// A stream or a tower service over one limit waits on the quota of one dimension, as over
/// several; the grant has nothing to settle. A stream holds its item while the round trip is
/// in flight: nothing is lost if it is dropped, and under `FailClosed` a shaping stream waits
/// for Redis rather than give up.
impl sealed::Sealed for RedisRateLimiter {
    type Permit = RedisSeveralPermit<1>;

    fn permit(&self) -> RedisSeveralPermit<1> {
        RedisSeveralPermit::new(self.inner.several.clone())
    }

    fn poll_acquire(
        &self,
        permit: Pin<&mut RedisSeveralPermit<1>>,
        cx: &mut Context<'_>,
        cost: u64,
    ) -> Poll<()> {
        permit.get_mut().poll_acquire_one(cx, cost)
    }

    fn poll_try_acquire(
        &self,
        permit: Pin<&mut RedisSeveralPermit<1>>,
        cx: &mut Context<'_>,
        cost: u64,
    ) -> Poll<Result<(), NotUntil>> {
        permit.get_mut().poll_try_acquire_one(cx, cost)
    }
}

impl<K> KeyedLimiter for RedisKeyedRateLimiter<K> where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static
{
}

/// As [`RedisRateLimiter`]'s: each key's quota of one dimension.
impl<K> KeyedSealed for RedisKeyedRateLimiter<K>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
{
    type Key = K;
    type Cost = u64;
    type Hasher = RandomState;
    type Permit = RedisSeveralPermit<1>;

    fn hash_key(&self, key: &K) -> u64 {
        self.inner.several.inner.hasher.hash_one(key)
    }

    fn permit(&self, key: K, _: u64) -> RedisSeveralPermit<1> {
        RedisSeveralPermit::new(self.quota(&key))
    }

    fn arrive(
        &self,
        key: &K,
        hash: u64,
        cost: u64,
        waker: &Waker,
    ) -> Arrival<RedisSeveralPermit<1>> {
        let mut permit = self.permit(key.clone(), hash);
        let mut cx = Context::from_waker(waker);
        // From the quota's lease, or when the cost is 0, this is ready at once.
        match permit.poll_acquire_one(&mut cx, cost) {
            Poll::Ready(()) => Arrival::Granted,
            // Its round trip or its sleep wakes `waker`.
            Poll::Pending => Arrival::Waiting { permit, ask: false },
        }
    }

    fn poll_acquire(
        permit: Pin<&mut RedisSeveralPermit<1>>,
        cx: &mut Context<'_>,
        cost: u64,
    ) -> Poll<()> {
        permit.get_mut().poll_acquire_one(cx, cost)
    }

    #[cfg(feature = "tower")]
    fn poll_try_acquire(
        permit: Pin<&mut RedisSeveralPermit<1>>,
        cx: &mut Context<'_>,
        cost: u64,
    ) -> Poll<Result<(), NotUntil>> {
        permit.get_mut().poll_try_acquire_one(cx, cost)
    }

    #[cfg(feature = "tower")]
    type Grant = ();

    #[cfg(feature = "tower")]
    #[inline]
    fn grant(_: Pin<&mut RedisSeveralPermit<1>>, _: u64) {}

    #[cfg(feature = "http")]
    fn state(_: Pin<&mut RedisSeveralPermit<1>>) -> Option<crate::stats::LimitState> {
        None
    }
}

/// Waits until `quota` grants `cost`, as a stream or a tower future does: it never gives up
/// (see `acquire_patiently`).
async fn acquire_several<const N: usize>(
    quota: RedisRateLimiter<[u64; N]>,
    cost: [u64; N],
) -> RedisPermit<N> {
    quota.acquire_patiently(cost).await
}

/// `try_acquire` as an enforcing stream or a tower future asks it: a reply error refuses the
/// request (it is not let through without Redis's say-so).
async fn try_several<const N: usize>(
    quota: RedisRateLimiter<[u64; N]>,
    cost: [u64; N],
) -> Result<RedisPermit<N>, NotUntil> {
    quota.try_acquire(cost).await.map_err(|e| match e {
        TryAcquireError::NotUntil(refused) => refused,
        TryAcquireError::Reply(_) => NotUntil::after(REPLY_RETRY),
    })
}

/// A stream's or a tower request's request in flight on a [`RedisRateLimiter<[u64; N]>`], or on
/// one key of a [`RedisKeyedRateLimiter<K, [u64; N]>`] (not nameable outside the crate): the
/// round trip in flight, then its grant until the caller takes it.
pub struct RedisSeveralPermit<const N: usize> {
    quota: RedisRateLimiter<[u64; N]>,
    acquire: Option<Pending<RedisPermit<N>>>,
    check: Option<Pending<Result<RedisPermit<N>, NotUntil>>>,
    granted: Option<RedisPermit<N>>,
}

/// Nothing in it is ever pinned in place: the round trips are boxed.
impl<const N: usize> Unpin for RedisSeveralPermit<N> {}

impl<const N: usize> fmt::Debug for RedisSeveralPermit<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let in_flight = self.acquire.is_some() || self.check.is_some();
        debug_permit(f, "RedisSeveralPermit", in_flight)
    }
}

impl<const N: usize> RedisSeveralPermit<N> {
    fn new(quota: RedisRateLimiter<[u64; N]>) -> Self {
        RedisSeveralPermit {
            quota,
            acquire: None,
            check: None,
            granted: None,
        }
    }

    fn poll_acquire(&mut self, cx: &mut Context<'_>, cost: [u64; N]) -> Poll<()> {
        let quota = &self.quota;
        let permit = ready!(poll_slot(&mut self.acquire, cx, || {
            acquire_several(quota.clone(), cost)
        }));
        self.granted = Some(permit);
        Poll::Ready(())
    }

    fn poll_try_acquire(
        &mut self,
        cx: &mut Context<'_>,
        cost: [u64; N],
    ) -> Poll<Result<(), NotUntil>> {
        let quota = &self.quota;
        let answer = ready!(poll_slot(&mut self.check, cx, || try_several(
            quota.clone(),
            cost
        )));
        Poll::Ready(answer.map(|permit| self.granted = Some(permit)))
    }

    /// The grant just made: the callers ask for it only after `poll_acquire` or
    /// `poll_try_acquire` granted.
    fn grant(&mut self) -> RedisPermit<N> {
        self.granted
            .take()
            .expect("a grant is taken once, after it was made")
    }
}

/// A cost is one amount per dimension; a grant is a [`RedisPermit`], to settle. A stream holds
/// its item while the round trip is in flight, as over the one-limit `RedisRateLimiter`.
impl RedisSeveralPermit<1> {
    /// [`poll_acquire`](Self::poll_acquire) of a one-limit cost: the grant has nothing to
    /// settle, and is dropped.
    fn poll_acquire_one(&mut self, cx: &mut Context<'_>, cost: u64) -> Poll<()> {
        ready!(self.poll_acquire(cx, [cost]));
        self.granted = None;
        Poll::Ready(())
    }

    /// [`poll_try_acquire`](Self::poll_try_acquire) of a one-limit cost, as
    /// [`poll_acquire_one`](Self::poll_acquire_one).
    fn poll_try_acquire_one(
        &mut self,
        cx: &mut Context<'_>,
        cost: u64,
    ) -> Poll<Result<(), NotUntil>> {
        let answer = ready!(self.poll_try_acquire(cx, [cost]));
        self.granted = None;
        Poll::Ready(answer)
    }
}

impl<const N: usize> Limiter for RedisRateLimiter<[u64; N]> {}

impl<const N: usize> sealed::Draw for RedisRateLimiter<[u64; N]> {
    type Cost = [u64; N];
    type Permit = RedisSeveralPermit<N>;
    type Grant = RedisPermit<N>;

    #[cfg(feature = "http")]
    fn state(&self) -> Option<crate::stats::LimitState> {
        None
    }

    fn permit(&self) -> RedisSeveralPermit<N> {
        RedisSeveralPermit::new(self.clone())
    }

    fn poll_acquire(
        &self,
        permit: Pin<&mut RedisSeveralPermit<N>>,
        cx: &mut Context<'_>,
        cost: [u64; N],
    ) -> Poll<()> {
        permit.get_mut().poll_acquire(cx, cost)
    }

    fn poll_try_acquire(
        &self,
        permit: Pin<&mut RedisSeveralPermit<N>>,
        cx: &mut Context<'_>,
        cost: [u64; N],
    ) -> Poll<Result<(), NotUntil>> {
        permit.get_mut().poll_try_acquire(cx, cost)
    }

    fn grant(&self, permit: Pin<&mut RedisSeveralPermit<N>>, _: [u64; N]) -> RedisPermit<N> {
        permit.get_mut().grant()
    }
}

impl<K, const N: usize> KeyedLimiter for RedisKeyedRateLimiter<K, [u64; N]> where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static
{
}

/// Each key's requests draw on that key's quota, as `acquire(key, cost)` does.
impl<K, const N: usize> KeyedSealed for RedisKeyedRateLimiter<K, [u64; N]>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
{
    type Key = K;
    type Cost = [u64; N];
    type Hasher = RandomState;
    type Permit = RedisSeveralPermit<N>;

    fn hash_key(&self, key: &K) -> u64 {
        self.inner.hasher.hash_one(key)
    }

    fn permit(&self, key: K, _: u64) -> RedisSeveralPermit<N> {
        RedisSeveralPermit::new(self.quota(&key))
    }

    fn arrive(
        &self,
        key: &K,
        hash: u64,
        cost: [u64; N],
        waker: &Waker,
    ) -> Arrival<RedisSeveralPermit<N>> {
        let mut permit = self.permit(key.clone(), hash);
        let mut cx = Context::from_waker(waker);
        // From the quota's lease, or when the cost is 0, this is ready at once.
        match permit.poll_acquire(&mut cx, cost) {
            Poll::Ready(()) => Arrival::Granted,
            // Its round trip or its sleep wakes `waker`.
            Poll::Pending => Arrival::Waiting { permit, ask: false },
        }
    }

    fn poll_acquire(
        permit: Pin<&mut RedisSeveralPermit<N>>,
        cx: &mut Context<'_>,
        cost: [u64; N],
    ) -> Poll<()> {
        permit.get_mut().poll_acquire(cx, cost)
    }

    #[cfg(feature = "tower")]
    fn poll_try_acquire(
        permit: Pin<&mut RedisSeveralPermit<N>>,
        cx: &mut Context<'_>,
        cost: [u64; N],
    ) -> Poll<Result<(), NotUntil>> {
        permit.get_mut().poll_try_acquire(cx, cost)
    }

    #[cfg(feature = "tower")]
    type Grant = RedisPermit<N>;

    #[cfg(feature = "tower")]
    fn grant(permit: Pin<&mut RedisSeveralPermit<N>>, _: [u64; N]) -> RedisPermit<N> {
        permit.get_mut().grant()
    }

    #[cfg(feature = "http")]
    fn state(_: Pin<&mut RedisSeveralPermit<N>>) -> Option<crate::stats::LimitState> {
        None
    }
}
