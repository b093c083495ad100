//! The pacing middleware: [`RateLimitLayer`], its service [`RateLimit`] and its [`ResponseFuture`].

mod future;
#[cfg(feature = "http")]
mod headers;
mod layer;
mod service;

pub use future::ResponseFuture;
#[cfg(feature = "http")]
pub use headers::{Announcing, AnnouncingFuture, QuotaHeaders};
pub use layer::RateLimitLayer;
pub use service::RateLimit;
