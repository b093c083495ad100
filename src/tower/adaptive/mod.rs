//! The feedback middleware: [`AdaptiveLayer`] reports each response to an `Adaptive`.

mod future;
mod layer;
mod outcome;
mod service;

pub use future::AdaptiveFuture;
pub use layer::AdaptiveLayer;
pub use outcome::Outcome;
pub use service::AdaptiveService;
