//! The feedback middleware: [`AdaptiveLayer`] reports each response to an `Adaptive`.

#[cfg(feature = "http")]
mod classify;
mod feedback;
mod future;
mod layer;
mod outcome;
mod service;

#[cfg(feature = "http")]
pub use classify::classify_http;
pub use feedback::Feedback;
#[cfg(feature = "http")]
pub use feedback::{classify_http_limits, LimitsOutcome};
pub use future::AdaptiveFuture;
pub use layer::AdaptiveLayer;
pub use outcome::Outcome;
pub use service::AdaptiveService;
