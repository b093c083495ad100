//! tower middleware: pace (or refuse) the requests a [`Service`](tower_service::Service)
//! makes or serves on a shared limiter.
//!
//! [`RateLimitLayer`] wraps any tower service (a hyper client, a tonic channel, an axum
//! router) in a [`RateLimit`] that draws every request's cost from a limiter shared by handle: a
//! [`RateLimiter`](crate::RateLimiter), a [`Stagger`](crate::Stagger), a `RedisRateLimiter`
//! (feature `redis`) or, one bucket per client or destination, a
//! [`KeyedRateLimiter`](crate::KeyedRateLimiter) with a key function. Two flavours:
//!
//! - **shaping** (the default, for clients): a request waits for its tokens, in FIFO order with
//!   every other user of the limiter, then goes to the inner service. Nothing is refused and the
//!   error type is the inner service's.
//! - **enforcing** ([`RateLimitLayer::enforcing`], for servers): a request that does not
//!   conform now is refused at once with [`RateLimited`], which carries
//!   [`retry_after`](RateLimited::retry_after) for a `429 Too Many Requests` with `Retry-After`.
//!
//! Unlike tower's own `RateLimit`, whose window lives inside the service so that every clone
//! starts a fresh one (tower #794, axum #2634), every clone of a [`RateLimit`] holds a handle
//! to the same limiter: cloning a service into 64 tasks keeps one limit.
//!
//! [`AdaptiveLayer`] closes the loop with an [`Adaptive`](crate::Adaptive): it reports each
//! response, as a classifier closure reads it ([`Outcome`]), so that a client finds a
//! destination's real limit from its `429`s and `Retry-After`s, and a [`RateLimitLayer`] over
//! [`adaptive.limiter()`](crate::Adaptive::limiter) paces the requests at it.
//!
//! # Examples
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use paced::tower::RateLimitLayer;
//! use paced::{Rate, RateLimiter};
//! use tower_layer::Layer;
//! use tower_service::Service;
//! use tokio::time::Instant;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // The partner API allows 10 calls per second, one at a time.
//! let limiter = RateLimiter::new(Rate::per_second(10), 1);
//! let api = tower::service_fn(|call: u32| async move { Ok::<_, Infallible>(call * 2) });
//! let mut api = RateLimitLayer::new(&limiter).layer(api);
//! let start = Instant::now();
//! for call in 0..3 {
//!     std::future::poll_fn(|cx| api.poll_ready(cx)).await.unwrap();
//!     assert_eq!(api.call(call).await.unwrap(), call * 2);
//! }
//! assert_eq!(start.elapsed(), Duration::from_millis(200));
//! # }
//! ```

/// `get_ref`, `get_mut` and `into_inner` for a middleware service over its field `inner`. The
/// doctests start with `$setup` (the `use` lines and whatever the layer needs) and build the
/// service over `7u8` with `$make`.
macro_rules! service_accessors {
    ($service:ident [$($param:tt)*], $setup:literal, $make:literal) => {
        impl<$($param)*> $service<$($param)*> {
            /// The inner service.
            ///
            /// # Examples
            ///
            /// ```
            #[doc = $setup]
            #[doc = concat!("let service = ", $make, ";")]
            /// assert_eq!(*service.get_ref(), 7);
            /// ```
            pub fn get_ref(&self) -> &S {
                &self.inner
            }

            /// The inner service, mutably.
            ///
            /// # Examples
            ///
            /// ```
            #[doc = $setup]
            #[doc = concat!("let mut service = ", $make, ";")]
            /// *service.get_mut() += 1;
            /// assert_eq!(*service.get_ref(), 8);
            /// ```
            pub fn get_mut(&mut self) -> &mut S {
                &mut self.inner
            }

            /// The inner service, unwrapped.
            ///
            /// # Examples
            ///
            /// ```
            #[doc = $setup]
            #[doc = concat!("let service = ", $make, ";")]
            /// assert_eq!(service.into_inner(), 7);
            /// ```
            pub fn into_inner(self) -> S {
                self.inner
            }
        }
    };
}

mod adaptive;
#[cfg(feature = "http")]
mod dialects;
mod error;
#[cfg(feature = "http")]
mod headers;
mod rate_limit;
mod request;
#[cfg(feature = "http")]
mod values;

#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use crate::limiter::{AnnouncedLimit, Dimension};
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use adaptive::classify_http;
#[cfg(feature = "http")]
pub use adaptive::{classify_http_limits, LimitsOutcome};
pub use adaptive::{AdaptiveFuture, AdaptiveLayer, AdaptiveService, Feedback, Outcome};
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use dialects::{binding_request_limit, limits_from_headers};
pub use error::{BoxError, RateLimited};
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use headers::{quota_from_headers, retry_after};
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use rate_limit::{Announcing, AnnouncingFuture, QuotaHeaders};
pub use rate_limit::{RateLimit, RateLimitLayer, ResponseFuture};
pub use request::{ByKey, Cost, KeepCharge, OnePerRequest, RequestLimiter, SettleFrom};
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use values::{EPOCH_THRESHOLD_SECS, MAX_DELAY};
