//! The feedback middleware: [`AdaptiveLayer`] reports each response to an `Adaptive`.

#[cfg(feature = "http")]
mod classify;
mod future;
mod layer;
mod outcome;
mod service;

#[cfg(feature = "http")]
pub use classify::classify_http;
pub use future::AdaptiveFuture;
pub use layer::AdaptiveLayer;
pub use outcome::Outcome;
pub use service::AdaptiveService;
