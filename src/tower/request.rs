//! What a request draws on ([`RequestLimiter`], [`ByKey`]) and what it costs ([`Cost`]).

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use crate::error::NotUntil;
use crate::limiter::traits::sealed::Draw;
use crate::limiter::{KeyedLimiter, KeyedPermit, KeyedRateLimiter, Limiter, Permit};

pub(crate) mod sealed {
    use std::fmt;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use crate::error::NotUntil;

    /// What a [`RequestLimiter`](super::RequestLimiter) does, out of users' reach.
    pub trait RequestSealed<Req> {
        /// What a request costs: `u64`, or `[u64; N]` for a `RateLimiter<[u64; N]>`.
        type Cost: Copy + fmt::Debug;

        /// The state of one request in flight, pinned in its response future.
        type Permit;

        /// What a granted request keeps to correct its charge from the response (`()` for a
        /// limiter that cannot be corrected).
        type Grant;

        /// A fresh, idle request state for `req`.
        fn permit(&self, req: &Req) -> Self::Permit;

        /// Waits until `cost` is granted. Never refuses.
        fn poll_acquire(
            permit: Pin<&mut Self::Permit>,
            cx: &mut Context<'_>,
            cost: Self::Cost,
        ) -> Poll<()>;

        /// Grants `cost` if it can be had without waiting, or says how long until it could.
        fn poll_try_acquire(
            permit: Pin<&mut Self::Permit>,
            cx: &mut Context<'_>,
            cost: Self::Cost,
        ) -> Poll<Result<(), NotUntil>>;

        /// The grant of `cost`, just made.
        fn grant(permit: Pin<&mut Self::Permit>, cost: Self::Cost) -> Self::Grant;

        /// The request's limit as quota headers announce it, now (see `Sealed::state`).
        #[cfg(feature = "http")]
        fn state(permit: Pin<&mut Self::Permit>) -> Option<crate::stats::LimitState>;

        /// Every limit of a limiter of several, each with its dimension's name (see
        /// `Draw::states`); empty for the others.
        #[cfg(feature = "http")]
        fn states(_permit: Pin<&mut Self::Permit>) -> Vec<(String, crate::stats::LimitState)> {
            Vec::new()
        }
    }

    /// What a response future does with its grant once the inner service has answered `Ok`:
    /// nothing, the charge is kept ([`KeepCharge`](super::KeepCharge)), or settle it from the
    /// response ([`SettleFrom`](super::SettleFrom)).
    pub trait Answered<Resp, G> {
        /// The inner service answered `response` to a request granted `grant`.
        fn answered(&self, grant: G, response: &Resp);
    }
}

use sealed::{Answered, RequestSealed};

/// The limiter a [`RateLimit`](super::RateLimit) draws a request's tokens from: every
/// [`Limiter`] ([`RateLimiter`](crate::RateLimiter), [`Stagger`](crate::Stagger),
/// [`RateLimiter`](crate::RateLimiter), `RedisRateLimiter`), and every [`KeyedLimiter`] ([`KeyedRateLimiter`],
/// `RedisKeyedRateLimiter`) with a key function ([`ByKey`]).
///
/// Sealed, as [`Limiter`] is: the layer relies on the exact semantics of these limiters.
///
/// # Examples
///
/// ```
/// use paced::tower::{RateLimitLayer, RequestLimiter};
/// use paced::{KeyedRateLimiter, Rate, RateLimiter};
///
/// fn layer_for<Req, Q: RequestLimiter<Req>>(limiter: Q) -> Q {
///     limiter
/// }
/// let _ = layer_for::<u32, _>(RateLimiter::new(Rate::per_second(1), 1));
/// let per_user = KeyedRateLimiter::<u32>::new(Rate::per_second(1), 1);
/// let _ = RateLimitLayer::keyed(&per_user, |user: &u32| *user);
/// ```
pub trait RequestLimiter<Req>: RequestSealed<Req> + Clone {}

impl<Q: Limiter, Req> RequestLimiter<Req> for Q {}

impl<K, S, F, Q, Req> RequestLimiter<Req> for ByKey<K, F, S, Q>
where
    Q: KeyedLimiter<Key = K>,
    F: Fn(&Req) -> K + Clone,
{
}

pin_project! {
    /// A request's place in a [`Limiter`]'s queue (not nameable outside the crate).
    pub struct LimiterPermit<Q: Limiter> {
        limiter: Q,
        #[pin]
        permit: Q::Permit,
    }
}

impl<Q: Limiter> fmt::Debug for LimiterPermit<Q>
where
    Q::Permit: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimiterPermit")
            .field("permit", &self.permit)
            .finish_non_exhaustive()
    }
}

impl<Q: Limiter, Req> RequestSealed<Req> for Q {
    type Cost = Q::Cost;
    type Permit = LimiterPermit<Q>;
    type Grant = Q::Grant;

    fn permit(&self, _: &Req) -> LimiterPermit<Q> {
        LimiterPermit {
            limiter: self.clone(),
            permit: Draw::permit(self),
        }
    }

    fn poll_acquire(
        permit: Pin<&mut LimiterPermit<Q>>,
        cx: &mut Context<'_>,
        cost: Q::Cost,
    ) -> Poll<()> {
        let me = permit.project();
        me.limiter.poll_acquire(me.permit, cx, cost)
    }

    fn poll_try_acquire(
        permit: Pin<&mut LimiterPermit<Q>>,
        cx: &mut Context<'_>,
        cost: Q::Cost,
    ) -> Poll<Result<(), NotUntil>> {
        let me = permit.project();
        me.limiter.poll_try_acquire(me.permit, cx, cost)
    }

    #[inline]
    fn grant(permit: Pin<&mut LimiterPermit<Q>>, cost: Q::Cost) -> Q::Grant {
        let me = permit.project();
        me.limiter.grant(me.permit, cost)
    }

    #[cfg(feature = "http")]
    fn state(permit: Pin<&mut LimiterPermit<Q>>) -> Option<crate::stats::LimitState> {
        permit.limiter.state()
    }

    #[cfg(feature = "http")]
    fn states(permit: Pin<&mut LimiterPermit<Q>>) -> Vec<(String, crate::stats::LimitState)> {
        permit.limiter.states()
    }
}

/// A keyed limiter (a [`KeyedRateLimiter`], or a `RedisKeyedRateLimiter` with the `redis`
/// feature: any [`KeyedLimiter`]) and the function that gives each request its key (a client's
/// IP address or API key, a tenant, a destination host): see [`RateLimitLayer::keyed`].
///
/// `Q` is a [`KeyedRateLimiter`] with hasher `S` unless said otherwise; `S` is unused (left at
/// its default) for another limiter.
///
/// [`RateLimitLayer::keyed`]: super::RateLimitLayer::keyed
///
/// # Examples
///
/// ```
/// use paced::tower::{ByKey, RateLimitLayer};
/// use paced::{KeyedRateLimiter, Rate};
///
/// let per_tenant = KeyedRateLimiter::new(Rate::per_second(5), 5);
/// let _layer: RateLimitLayer<ByKey<u32, _>> =
///     RateLimitLayer::keyed(&per_tenant, |(tenant, _body): &(u32, String)| *tenant);
/// ```
pub struct ByKey<K, F, S = std::collections::hash_map::RandomState, Q = KeyedRateLimiter<K, u64, S>>
{
    pub(super) limiter: Q,
    pub(super) key: F,
    pub(super) types: PhantomData<fn() -> (K, S)>,
}

impl<K, F: Clone, S, Q: Clone> Clone for ByKey<K, F, S, Q> {
    fn clone(&self) -> Self {
        ByKey {
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            types: PhantomData,
        }
    }
}

impl<K, F, S, Q: fmt::Debug> fmt::Debug for ByKey<K, F, S, Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ByKey")
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}

pin_project! {
    /// A request's place in one key's queue (not nameable outside the crate).
    pub struct KeyPermit<Q: KeyedLimiter> {
        #[pin]
        permit: Q::Permit,
    }
}

impl<Q: KeyedLimiter> fmt::Debug for KeyPermit<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyPermit").finish_non_exhaustive()
    }
}

impl<K, S, F, Q, Req> RequestSealed<Req> for ByKey<K, F, S, Q>
where
    Q: KeyedLimiter<Key = K>,
    F: Fn(&Req) -> K + Clone,
{
    type Cost = Q::Cost;
    type Permit = KeyPermit<Q>;
    type Grant = Q::Grant;

    fn permit(&self, req: &Req) -> KeyPermit<Q> {
        let key = (self.key)(req);
        let hash = self.limiter.hash_key(&key);
        KeyPermit {
            permit: self.limiter.permit(key, hash),
        }
    }

    fn poll_acquire(
        permit: Pin<&mut KeyPermit<Q>>,
        cx: &mut Context<'_>,
        cost: Q::Cost,
    ) -> Poll<()> {
        Q::poll_acquire(permit.project().permit, cx, cost)
    }

    fn poll_try_acquire(
        permit: Pin<&mut KeyPermit<Q>>,
        cx: &mut Context<'_>,
        cost: Q::Cost,
    ) -> Poll<Result<(), NotUntil>> {
        Q::poll_try_acquire(permit.project().permit, cx, cost)
    }

    #[inline]
    fn grant(permit: Pin<&mut KeyPermit<Q>>, cost: Q::Cost) -> Q::Grant {
        Q::grant(permit.project().permit, cost)
    }

    #[cfg(feature = "http")]
    fn state(permit: Pin<&mut KeyPermit<Q>>) -> Option<crate::stats::LimitState> {
        Q::state(permit.project().permit)
    }

    #[cfg(feature = "http")]
    fn states(permit: Pin<&mut KeyPermit<Q>>) -> Vec<(String, crate::stats::LimitState)> {
        Q::states(permit.project().permit)
    }
}

/// What a request costs: any `Fn(&Req) -> A`, or [`OnePerRequest`] (the default, one token).
///
/// `A` is the limiter's cost: `u64` (the default), or one amount per dimension, `[u64; N]`, for
/// a [`RateLimiter<[u64; N]>`](crate::RateLimiter).
///
/// # Examples
///
/// ```
/// use paced::tower::{Cost, OnePerRequest};
///
/// let by_size = |body: &Vec<u8>| body.len() as u64;
/// assert_eq!(by_size.cost(&vec![0; 3]), 3);
/// assert_eq!(Cost::<Vec<u8>>::cost(&OnePerRequest, &vec![0; 3]), 1);
/// // A request and its estimated tokens, for a `RateLimiter<[u64; 2]>`.
/// let llm = |prompt: &String| [1, prompt.len() as u64 / 4];
/// assert_eq!(llm.cost(&"a prompt".to_owned()), [1, 2]);
/// ```
pub trait Cost<Req, A = u64> {
    /// What `req` takes from the limiter.
    fn cost(&self, req: &Req) -> A;
}

impl<Req, A, F: Fn(&Req) -> A> Cost<Req, A> for F {
    fn cost(&self, req: &Req) -> A {
        self(req)
    }
}

/// Every request costs one token: the default [`Cost`].
///
/// # Examples
///
/// ```
/// use paced::tower::{Cost, OnePerRequest};
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

/// A [`RateLimitLayer`](super::RateLimitLayer)'s default: a request keeps what it was charged,
/// whatever the response.
///
/// # Examples
///
/// ```
/// use paced::tower::{KeepCharge, RateLimitLayer};
/// use paced::{Rate, RateLimiter};
///
/// let limiter = RateLimiter::new(Rate::per_second(1), 1);
/// let _layer: RateLimitLayer<RateLimiter, _, _, KeepCharge> = RateLimitLayer::new(&limiter);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KeepCharge;

impl<Resp, G> Answered<Resp, G> for KeepCharge {
    #[inline]
    fn answered(&self, _: G, _: &Resp) {}
}

/// Settles each request's [`Permit`] (or, over a
/// [`KeyedRateLimiter`](crate::KeyedRateLimiter), its [`KeyedPermit`]; over a several-limit
/// Redis limiter, its `RedisPermit`) from its response: built by
/// [`RateLimitLayer::settle`](super::RateLimitLayer::settle), which documents it.
///
/// # Examples
///
/// ```
/// use paced::tower::{RateLimitLayer, SettleFrom};
/// use paced::{Limit, RateLimiter, Rate};
///
/// let llm = RateLimiter::builder(["requests", "tokens"])
///     .limit("tokens", Limit::bucket(Rate::per_minute(40_000), 40_000))
///     .build()
///     .unwrap();
/// let _layer: RateLimitLayer<_, _, _, SettleFrom<_>> = RateLimitLayer::new(&llm)
///     .cost(|prompt: &String| [1, prompt.len() as u64])
///     .settle(|answer: &String| [1, answer.len() as u64]);
/// ```
#[derive(Clone, Copy)]
pub struct SettleFrom<F> {
    pub(super) settle: F,
}

impl<F> fmt::Debug for SettleFrom<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettleFrom").finish_non_exhaustive()
    }
}

impl<Resp, F, const N: usize> Answered<Resp, Permit<N>> for SettleFrom<F>
where
    F: Fn(&Resp) -> [u64; N],
{
    fn answered(&self, grant: Permit<N>, response: &Resp) {
        grant.settle((self.settle)(response));
    }
}

/// Over a several-limit Redis limiter the correction is one round trip, made in the
/// background on the current runtime: the response goes on at once. (Should that round trip
/// fail, the charge stays, as `RedisPermit::settle` says.)
#[cfg(feature = "redis")]
impl<Resp, F, const N: usize> Answered<Resp, crate::redis::RedisPermit<N>> for SettleFrom<F>
where
    F: Fn(&Resp) -> [u64; N],
{
    fn answered(&self, grant: crate::redis::RedisPermit<N>, response: &Resp) {
        let actual = (self.settle)(response);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = grant.settle(actual).await;
            });
        }
    }
}

impl<Resp, F, K, S, const N: usize> Answered<Resp, KeyedPermit<K, N, S>> for SettleFrom<F>
where
    F: Fn(&Resp) -> [u64; N],
    K: Hash + Eq + Clone,
    S: BuildHasher,
{
    fn answered(&self, grant: KeyedPermit<K, N, S>, response: &Resp) {
        grant.settle((self.settle)(response));
    }
}
