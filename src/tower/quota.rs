//! What a request draws on: any [`Quota`], or one key's bucket of a [`KeyedRateLimiter`]; and
//! what it costs.

use std::fmt;
use std::hash::Hash;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use crate::shared::keyed::KeyOwned;
use crate::shared::quota::sealed::Sealed;
use crate::shared::Waiter;
use crate::{KeyedRateLimiter, NotUntil, Quota};

/// The quota a [`RateLimit`](super::RateLimit) draws a request's tokens from: every
/// [`Quota`] ([`RateLimiter`](crate::RateLimiter), [`Stagger`](crate::Stagger),
/// `RedisRateLimiter`), and a [`KeyedRateLimiter`] with a key function ([`ByKey`]).
///
/// Sealed, as [`Quota`] is: the layer relies on the exact semantics of these quotas.
///
/// # Examples
///
/// ```
/// use pacer::tower::{RateLimitLayer, RequestQuota};
/// use pacer::{KeyedRateLimiter, Rate, RateLimiter};
///
/// fn layer_for<Req, Q: RequestQuota<Req>>(quota: Q) -> Q {
///     quota
/// }
/// let _ = layer_for::<u32, _>(RateLimiter::new(Rate::per_second(1), 1));
/// let per_user = KeyedRateLimiter::<u32>::new(Rate::per_second(1), 1);
/// let _ = RateLimitLayer::keyed(&per_user, |user: &u32| *user);
/// ```
pub trait RequestQuota<Req>: Sealed + Clone {
    /// The state of one request in flight, pinned in its response future.
    #[doc(hidden)]
    type Permit;

    /// A fresh, idle request state for `req`.
    #[doc(hidden)]
    fn permit(&self, req: &Req) -> Self::Permit;

    /// Waits until `cost` is granted. Never refuses.
    #[doc(hidden)]
    fn poll_acquire(permit: Pin<&mut Self::Permit>, cx: &mut Context<'_>, cost: u64) -> Poll<()>;

    /// Grants `cost` if it can be had without waiting, or says how long until it could.
    #[doc(hidden)]
    fn poll_try_acquire(
        permit: Pin<&mut Self::Permit>,
        cx: &mut Context<'_>,
        cost: u64,
    ) -> Poll<Result<(), NotUntil>>;
}

pin_project! {
    /// A request's place in a [`Quota`]'s queue.
    pub struct QuotaPermit<Q: Quota> {
        quota: Q,
        #[pin]
        permit: Q::Permit,
    }
}

impl<Q: Quota> fmt::Debug for QuotaPermit<Q>
where
    Q::Permit: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuotaPermit")
            .field("permit", &self.permit)
            .finish_non_exhaustive()
    }
}

impl<Q: Quota, Req> RequestQuota<Req> for Q {
    type Permit = QuotaPermit<Q>;

    fn permit(&self, _: &Req) -> QuotaPermit<Q> {
        QuotaPermit {
            quota: self.clone(),
            permit: self.permit(),
        }
    }

    fn poll_acquire(permit: Pin<&mut QuotaPermit<Q>>, cx: &mut Context<'_>, cost: u64) -> Poll<()> {
        let me = permit.project();
        me.quota.poll_acquire(me.permit, cx, cost)
    }

    fn poll_try_acquire(
        permit: Pin<&mut QuotaPermit<Q>>,
        cx: &mut Context<'_>,
        cost: u64,
    ) -> Poll<Result<(), NotUntil>> {
        let me = permit.project();
        me.quota.poll_try_acquire(me.permit, cx, cost)
    }
}

/// A [`KeyedRateLimiter`] and the function that gives each request its key (a client's IP
/// address or API key, a tenant, a destination host): see [`RateLimitLayer::keyed`].
///
/// [`RateLimitLayer::keyed`]: super::RateLimitLayer::keyed
///
/// # Examples
///
/// ```
/// use pacer::tower::{ByKey, RateLimitLayer};
/// use pacer::{KeyedRateLimiter, Rate};
///
/// let per_tenant = KeyedRateLimiter::new(Rate::per_second(5), 5);
/// let _layer: RateLimitLayer<ByKey<u32, _>> =
///     RateLimitLayer::keyed(&per_tenant, |(tenant, _body): &(u32, String)| *tenant);
/// ```
pub struct ByKey<K, F> {
    pub(super) limiter: KeyedRateLimiter<K>,
    pub(super) key: F,
}

impl<K, F: Clone> Clone for ByKey<K, F> {
    fn clone(&self) -> Self {
        ByKey {
            limiter: self.limiter.clone(),
            key: self.key.clone(),
        }
    }
}

impl<K, F> fmt::Debug for ByKey<K, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ByKey")
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}

impl<K, F> Sealed for ByKey<K, F> {}

pin_project! {
    /// A request's place in its key's queue of a [`KeyedRateLimiter`].
    pub struct KeyPermit<K>
    where
        K: Hash,
        K: Eq,
        K: Clone,
    {
        #[pin]
        waiter: Waiter<KeyOwned<K>>,
    }
}

impl<K: Hash + Eq + Clone> fmt::Debug for KeyPermit<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyPermit")
            .field("waiter", &self.waiter)
            .finish()
    }
}

impl<K, F, Req> RequestQuota<Req> for ByKey<K, F>
where
    K: Hash + Eq + Clone,
    F: Fn(&Req) -> K + Clone,
{
    type Permit = KeyPermit<K>;

    fn permit(&self, req: &Req) -> KeyPermit<K> {
        KeyPermit {
            waiter: Waiter::new(KeyOwned {
                shared: self.limiter.shared.clone(),
                key: (self.key)(req),
            }),
        }
    }

    fn poll_acquire(permit: Pin<&mut KeyPermit<K>>, cx: &mut Context<'_>, cost: u64) -> Poll<()> {
        // Without a timeout the limiter never refuses; it only makes us wait.
        permit
            .project()
            .waiter
            .poll_acquire(cx, cost, None)
            .map(|_| ())
    }

    fn poll_try_acquire(
        permit: Pin<&mut KeyPermit<K>>,
        _: &mut Context<'_>,
        cost: u64,
    ) -> Poll<Result<(), NotUntil>> {
        let key = permit.waiter.handle();
        Poll::Ready(key.shared.try_acquire(&key.key, cost))
    }
}

/// What a request costs in tokens: any `Fn(&Req) -> u64`, or [`OnePerRequest`] (the default).
///
/// # Examples
///
/// ```
/// use pacer::tower::{Cost, OnePerRequest};
///
/// let by_size = |body: &Vec<u8>| body.len() as u64;
/// assert_eq!(by_size.cost(&vec![0; 3]), 3);
/// assert_eq!(Cost::<Vec<u8>>::cost(&OnePerRequest, &vec![0; 3]), 1);
/// ```
pub trait Cost<Req> {
    /// The tokens `req` takes from the quota.
    fn cost(&self, req: &Req) -> u64;
}

impl<Req, F: Fn(&Req) -> u64> Cost<Req> for F {
    fn cost(&self, req: &Req) -> u64 {
        self(req)
    }
}

/// Every request costs one token: the default [`Cost`].
///
/// # Examples
///
/// ```
/// use pacer::tower::{Cost, OnePerRequest};
///
/// assert_eq!(Cost::<&str>::cost(&OnePerRequest, &"any request"), 1);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct OnePerRequest;

impl<Req> Cost<Req> for OnePerRequest {
    fn cost(&self, _: &Req) -> u64 {
        1
    }
}
