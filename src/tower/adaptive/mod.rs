//! The feedback middleware: [`AdaptiveLayer`] reports each response to an `Adaptive`.

mod layer;

pub use layer::{AdaptiveFuture, AdaptiveLayer, AdaptiveService, Outcome};
