//! The public handles over the engine: [`RateLimiter`], [`Stagger`], [`KeyedRateLimiter`],
//! [`Adaptive`], and the [`Quota`] and [`KeyedQuota`] traits through which streams, Sinks and
//! tower draw on them.

mod adaptive;
mod keyed;
pub(crate) mod keyed_quota;
pub(crate) mod quota;
mod rate_limiter;
mod stagger;

#[cfg(feature = "unstable-laws")]
pub use adaptive::AdaptiveLaw;
pub use adaptive::{Adaptive, AdaptiveStats, Announced};
pub use keyed::KeyedRateLimiter;
pub use keyed_quota::KeyedQuota;
pub use quota::Quota;
pub use rate_limiter::RateLimiter;
pub use stagger::Stagger;
