//! The public handles over the engine: [`RateLimiter`], [`Stagger`], [`KeyedRateLimiter`],
//! [`Adaptive`], and the [`Limiter`] and [`KeyedLimiter`] traits through which streams, Sinks and
//! tower draw on them.

mod adaptive;
mod adaptive_multi;
#[cfg(feature = "http")]
mod announced;
mod cost;
mod keyed;
mod keyed_multi;
pub(crate) mod keyed_traits;
mod multi;
mod rate_limiter;
mod stagger;
pub(crate) mod traits;

#[cfg(feature = "unstable-laws")]
pub use adaptive::AdaptiveLaw;
pub use adaptive::{Adaptive, AdaptiveStats, Announced};
pub use adaptive_multi::AdaptiveBuilder;
#[cfg(feature = "http")]
pub use announced::{AnnouncedLimit, Dimension};
pub use cost::Cost;
pub use keyed::KeyedRateLimiter;
pub use keyed_multi::{KeyedPermit, KeyedRateLimiterBuilder};
pub use keyed_traits::KeyedLimiter;
pub use multi::{Limit, Permit, RateLimiterBuilder};
pub use rate_limiter::RateLimiter;
pub use stagger::Stagger;
pub use traits::Limiter;
