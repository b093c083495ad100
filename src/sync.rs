//! The synchronisation primitives the shared limiters use: std's, or loom's when the crate is
//! model-checked (`RUSTFLAGS="--cfg pacer_loom"`; tokio itself reacts to `--cfg loom`).

#[cfg(pacer_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(pacer_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(pacer_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(not(pacer_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
