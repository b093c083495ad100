//! The synchronisation primitives the shared limiters use: std's, or loom's when the crate is
//! model-checked (`RUSTFLAGS="--cfg paced_loom"`; tokio itself reacts to `--cfg loom`).

#[cfg(paced_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(paced_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(paced_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(not(paced_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, ignoring poisoning: every state behind the crate's mutexes is consistent
/// between any two statements that could panic, so a panic elsewhere while it was held does
/// not make it unusable.
pub(crate) fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
