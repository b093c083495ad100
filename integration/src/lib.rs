//! The guide's samples that need a heavy crate (axum, hyper, metrics-util), run as doctests
//! here, where those crates are dev-dependencies. paced's guide shows the same files
//! (`src/guide/*.md`) and leaves them out of its own doctests (`cfg(doctest)`).
//!
//! Everything else in this package is in `tests/` and `examples/`.

/// The guide's enforcing axum server: a refusal is a `429` with `Retry-After`.
#[cfg(all(doctest, feature = "tower"))]
#[doc = include_str!("../../src/guide/axum_server.md")]
pub struct AxumServer;

/// The guide's hyper client that finds its partner's limit from `429`s.
#[cfg(all(doctest, feature = "tower"))]
#[doc = include_str!("../../src/guide/hyper_client.md")]
pub struct HyperClient;

/// The guide's metrics sample, read with metrics-util's debugging recorder.
#[cfg(all(doctest, feature = "metrics"))]
#[doc = include_str!("../../src/guide/metrics_recorder.md")]
pub struct MetricsRecorder;
