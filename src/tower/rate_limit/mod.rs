//! The pacing middleware: [`RateLimitLayer`], its service [`RateLimit`] and its [`ResponseFuture`].

mod future;
mod layer;
mod service;

pub use future::ResponseFuture;
pub use layer::RateLimitLayer;
pub use service::RateLimit;
