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
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use crate::error::NotUntil;

    /// What a [`Limiter`](super::Quota) does, out of users' reach: public in a private module,
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
}

use sealed::Sealed;

/// A limiter shared by handle that streams can draw on: [`RateLimiter`], [`Stagger`] and, with
/// the `redis` feature, `RedisRateLimiter`.
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
/// use paced::{PaceExt, Limiter, Rate, RateLimiter, Shaping};
///
/// // One function for a local limiter or (with the `redis` feature) one across machines.
/// fn paced<S: Stream, Q: Limiter>(s: S, limiter: &Q) -> impl Stream<Item = S::Item> {
///     s.throttle_with(limiter, |_| 1, Shaping)
/// }
/// let _ = paced(futures_util::stream::iter([1, 2]), &RateLimiter::new(Rate::per_second(1), 1));
/// ```
pub trait Limiter: Sealed + Clone + Send + Sync + 'static {}

impl Limiter for RateLimiter {}
impl Limiter for Stagger {}

/// The former name of [`Limiter`]: every limiter is one.
///
/// # Examples
///
/// ```
/// # #![allow(deprecated)]
/// use paced::{Quota, Rate, RateLimiter};
///
/// fn takes<Q: Quota>(_: &Q) {} // write `Q: paced::Limiter`
/// takes(&RateLimiter::new(Rate::per_second(1), 1));
/// ```
#[deprecated(since = "1.0.0", note = "renamed `Limiter`")]
pub trait Quota: Limiter {}

#[allow(deprecated)]
impl<T: Limiter> Quota for T {}

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
            waiter: Waiter::new(self.shared.clone()),
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
        coop::poll_try_acquire(cx, || self.shared.try_acquire(cost))
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
