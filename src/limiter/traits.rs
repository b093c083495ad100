//! [`Limiter`]: what `throttle_with` draws on, whether the limiter lives in this process or
//! elsewhere.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::rate_limiter::{Limit, RateLimiter};
use super::stagger::Stagger;
use crate::core::Window;
use crate::engine::{coop, Shared, Waiter};
use crate::error::NotUntil;

pub(crate) mod sealed {
    use std::fmt;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use crate::error::NotUntil;

    /// What a [`Limiter`](super::Limiter) of one number does, out of users' reach: public in a private module,
    /// so that the adapters can call it and nobody else can name it.
    pub trait Sealed {
        /// The state of one request in flight, kept pinned in the stream that waits.
        type Permit;

        /// The limit as quota headers announce it, now; `None` for a quota that cannot say
        /// (a warming-up limiter, a stagger, a limiter kept in Redis).
        #[cfg(feature = "http")]
        fn state(&self) -> Option<crate::stats::LimitState> {
            None
        }

        /// A fresh, idle request state.
        fn permit(&self) -> Self::Permit;

        /// Waits until `cost` is granted. Never refuses.
        fn poll_acquire(
            &self,
            permit: Pin<&mut Self::Permit>,
            cx: &mut Context<'_>,
            cost: u64,
        ) -> Poll<()>;

        /// Grants `cost` if it can be had without waiting, or says how long until it could.
        fn poll_try_acquire(
            &self,
            permit: Pin<&mut Self::Permit>,
            cx: &mut Context<'_>,
            cost: u64,
        ) -> Poll<Result<(), NotUntil>>;
    }

    /// What every [`Limiter`](super::Limiter) does, out of users' reach, whatever its cost:
    /// one number for the limiters of one limit (every [`Sealed`] one, through a blanket impl
    /// that forwards and adds nothing), one amount per dimension for a `RateLimiter`.
    pub trait Draw {
        /// What one request costs: `u64`, or `[u64; N]` for a `RateLimiter<[u64; N]>`.
        type Cost: Copy + Send + Sync + fmt::Debug + 'static;

        /// The state of one request in flight, kept pinned in the stream that waits.
        type Permit;

        /// What a granted request keeps to correct its charge once its real cost is known:
        /// `()` for a limiter that cannot be corrected, a `Permit<N>` for a
        /// `RateLimiter<[u64; N]>`.
        type Grant;

        /// See [`Sealed::state`].
        #[cfg(feature = "http")]
        fn state(&self) -> Option<crate::stats::LimitState>;

        /// Every limit as quota headers announce it, now, each with the name of its
        /// dimension, for a limiter of several limits (a `RateLimiter`); empty for the
        /// others, which say it with [`state`](Draw::state).
        #[cfg(feature = "http")]
        fn states(&self) -> Vec<(String, crate::stats::LimitState)> {
            Vec::new()
        }

        /// A fresh, idle request state.
        fn permit(&self) -> Self::Permit;

        /// Waits until `cost` is granted. Never refuses.
        fn poll_acquire(
            &self,
            permit: Pin<&mut Self::Permit>,
            cx: &mut Context<'_>,
            cost: Self::Cost,
        ) -> Poll<()>;

        /// Grants `cost` if it can be had without waiting, or says how long until it could.
        fn poll_try_acquire(
            &self,
            permit: Pin<&mut Self::Permit>,
            cx: &mut Context<'_>,
            cost: Self::Cost,
        ) -> Poll<Result<(), NotUntil>>;

        /// The grant of `cost`, just made through `permit` (by `poll_acquire` or
        /// `poll_try_acquire`).
        fn grant(&self, permit: Pin<&mut Self::Permit>, cost: Self::Cost) -> Self::Grant;
    }

    impl<T: Sealed> Draw for T {
        type Cost = u64;
        type Permit = T::Permit;
        type Grant = ();

        #[cfg(feature = "http")]
        #[inline]
        fn state(&self) -> Option<crate::stats::LimitState> {
            Sealed::state(self)
        }

        #[inline]
        fn permit(&self) -> Self::Permit {
            Sealed::permit(self)
        }

        #[inline]
        fn poll_acquire(
            &self,
            permit: Pin<&mut Self::Permit>,
            cx: &mut Context<'_>,
            cost: u64,
        ) -> Poll<()> {
            Sealed::poll_acquire(self, permit, cx, cost)
        }

        #[inline]
        fn poll_try_acquire(
            &self,
            permit: Pin<&mut Self::Permit>,
            cx: &mut Context<'_>,
            cost: u64,
        ) -> Poll<Result<(), NotUntil>> {
            Sealed::poll_try_acquire(self, permit, cx, cost)
        }

        #[inline]
        fn grant(&self, _: Pin<&mut Self::Permit>, _: u64) {}
    }
}

use sealed::{Draw, Sealed};

/// A limiter shared by handle that streams, sinks and tower layers can draw on:
/// [`RateLimiter`] (of one limit or of several), [`Stagger`] and, with the `redis` feature, a
/// `RedisRateLimiter` of one limit.
///
/// Each says what a request costs, its `Cost`: one number (`u64`) for a limiter of one limit,
/// one amount per dimension (`[u64; N]`) for a `RateLimiter<[u64; N]>`. So the same
/// `throttle_with` takes `|_| 1` for one and `|req| [1, req.tokens]` for the other. Code
/// generic over a limiter of one limit says so: `Q: Limiter<Cost = u64>`.
///
/// It is a trait rather than an enum so that each limiter keeps its own waiting machinery
/// without boxing or dispatch on the local hot path, and so that a stream's type says which
/// limiter it uses. It is sealed, and its machinery is out of reach: the adapters rely on the
/// exact semantics of these limiters.
///
/// # Examples
///
/// ```
/// use futures_util::Stream;
/// use paced::{Limit, RateLimiter, PaceExt, Rate, Shaping};
/// use paced::limiter::Limiter;
///
/// // One function for a local limiter or (with the `redis` feature) one across machines.
/// fn paced<S: Stream, Q: Limiter<Cost = u64>>(s: S, limiter: &Q) -> impl Stream<Item = S::Item> {
///     s.throttle_with(limiter, |_| 1, Shaping)
/// }
/// let _ = paced(futures_util::stream::iter([1, 2]), &RateLimiter::new(Rate::per_second(1), 1));
///
/// // Any cost, any limiter: the cost function is the caller's.
/// fn costed<S, Q, F>(s: S, limiter: &Q, cost: F) -> impl Stream<Item = S::Item>
/// where
///     S: Stream,
///     Q: Limiter,
///     F: FnMut(&S::Item) -> Q::Cost,
/// {
///     s.throttle_with(limiter, cost, Shaping)
/// }
/// let llm = RateLimiter::builder(["requests", "tokens"])
///     .limit("tokens", Limit::bucket(Rate::per_minute(40_000), 40_000))
///     .build()
///     .unwrap();
/// let _ = costed(futures_util::stream::iter(["hi"]), &llm, |prompt| [1, prompt.len() as u64]);
/// ```
pub trait Limiter: Draw + Clone + Send + Sync + 'static {}

impl Limiter for RateLimiter {}
impl Limiter for Stagger {}

pin_project! {
    /// A stream's place in a [`RateLimiter`]'s queue.
    #[derive(Debug)]
    pub struct RateLimiterPermit {
        #[pin]
        waiter: Waiter<Arc<Shared<Limit>>>,
    }
}

pin_project! {
    /// A stream's place in a [`Stagger`]'s queue.
    #[derive(Debug)]
    pub struct StaggerPermit {
        #[pin]
        waiter: Waiter<Arc<Shared<Window>>>,
    }
}

impl Sealed for RateLimiter {
    type Permit = RateLimiterPermit;

    #[cfg(feature = "http")]
    fn state(&self) -> Option<crate::stats::LimitState> {
        self.limit_state()
    }

    fn permit(&self) -> Self::Permit {
        RateLimiterPermit {
            waiter: Waiter::new(self.inner.shared.clone()),
        }
    }

    fn poll_acquire(
        &self,
        permit: Pin<&mut Self::Permit>,
        cx: &mut Context<'_>,
        cost: u64,
    ) -> Poll<()> {
        // Without a timeout the limiter never refuses; it only makes us wait.
        permit
            .project()
            .waiter
            .poll_acquire(cx, cost, None)
            .map(|_| ())
    }

    fn poll_try_acquire(
        &self,
        _: Pin<&mut Self::Permit>,
        cx: &mut Context<'_>,
        cost: u64,
    ) -> Poll<Result<(), NotUntil>> {
        coop::poll_try_acquire(cx, || self.inner.shared.try_acquire(cost))
    }
}

/// Every item takes one token, whatever its cost.
impl Sealed for Stagger {
    type Permit = StaggerPermit;

    fn permit(&self) -> Self::Permit {
        StaggerPermit {
            waiter: Waiter::new(self.shared.clone()),
        }
    }

    fn poll_acquire(
        &self,
        permit: Pin<&mut Self::Permit>,
        cx: &mut Context<'_>,
        _: u64,
    ) -> Poll<()> {
        permit
            .project()
            .waiter
            .poll_acquire(cx, 1, None)
            .map(|_| ())
    }

    fn poll_try_acquire(
        &self,
        _: Pin<&mut Self::Permit>,
        cx: &mut Context<'_>,
        _: u64,
    ) -> Poll<Result<(), NotUntil>> {
        coop::poll_try_acquire(cx, || self.shared.try_acquire(1))
    }
}
