//! What the limiters hand out and take, beside the limiters themselves (which are at the
//! crate root):
//!
//! - [`Cost`]: the shape of a cost, `u64` for one limit or `[u64; N]` for several; it picks a
//!   limiter's limits.
//! - [`Permit`] and [`KeyedPermit`]: what a grant of several limits charged, to settle once
//!   the real cost is known.
//! - [`RateLimiterBuilder`], [`KeyedRateLimiterBuilder`] and [`AdaptiveBuilder`]: the builders
//!   of the limiters of several limits.
//! - [`Stats`] and [`AdaptiveStats`]: a limiter's counters, and an
//!   [`Adaptive`](crate::Adaptive)'s.
//! - [`Announced`]: one limit a response announced in its headers, for
//!   [`Adaptive::on_quota`](crate::Adaptive::on_quota).
//! - [`Limiter`] and [`KeyedLimiter`]: what `throttle_with`, `throttle_by_key` and the tower
//!   layers accept: any shared limiter, any keyed one.
//! - `AdaptiveLaw` (feature `unstable-laws`): the control laws an
//!   [`Adaptive`](crate::Adaptive) can follow, outside semver.

pub(crate) mod adaptive;
mod adaptive_multi;
#[cfg(feature = "http")]
mod announced;
mod cost;
pub(crate) mod keyed;
mod keyed_multi;
pub(crate) mod keyed_traits;
pub(crate) mod rate_limiter;
mod shapes;
pub(crate) mod stagger;
pub(crate) mod traits;

// After `rate_limiter`: rustdoc lists `RateLimiter`'s impl blocks in this order, so the
// one-limit methods come first on its page and `RateLimiter::acquire` links to them, as for
// the other limiters. The several-limit methods are `#method.acquire-1` and so on.
pub(crate) mod multi;

pub use crate::stats::Stats;
#[cfg(feature = "unstable-laws")]
#[cfg_attr(docsrs, doc(cfg(feature = "unstable-laws")))]
pub use adaptive::AdaptiveLaw;
pub use adaptive::{AdaptiveStats, Announced};
pub use adaptive_multi::AdaptiveBuilder;
#[cfg(feature = "http")]
pub use announced::{AnnouncedLimit, Dimension};
pub use cost::Cost;
pub(crate) use keyed::KeyedRateLimiter;
pub use keyed_multi::{KeyedPermit, KeyedRateLimiterBuilder};
pub use keyed_traits::KeyedLimiter;
#[cfg(feature = "redis")]
pub(crate) use multi::Limit;
pub use multi::{Permit, RateLimiterBuilder};
pub(crate) use rate_limiter::RateLimiter;
pub(crate) use stagger::Stagger;
pub use traits::Limiter;
