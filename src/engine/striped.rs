//! A counter that threads add to on cache lines of their own, so that counting a grant on the
//! lock-free path does not make two cores fight over one line (Java's `LongAdder`).

use crate::sync::{AtomicU64, Ordering};

/// Lines per counter: threads are spread over them round-robin, in the order they first count.
/// With 4, two worker threads can land on one line (other threads may count in between); the
/// contended benchmark measured 73-145 ns of CPU per acquisition over runs with 4 lines and
/// 73-105 ns with 16 (2 KiB per limiter).
const STRIPES: usize = 16;

/// 128 bytes: x86 prefetches 64-byte lines in aligned pairs, so two stripes 64 bytes apart
/// would still be fought over.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe(AtomicU64);

/// A sum of `STRIPES` padded atomics.
#[derive(Debug, Default)]
pub(crate) struct Striped {
    stripes: [Stripe; STRIPES],
}

impl Striped {
    /// Adds one on this thread's stripe.
    pub(crate) fn increment(&self) {
        self.stripes[stripe()].0.fetch_add(1, Ordering::Relaxed);
    }

    /// The sum: exact once the additions it should count have happened-before the call.
    pub(crate) fn sum(&self) -> u64 {
        self.stripes
            .iter()
            .fold(0u64, |sum, s| sum.wrapping_add(s.0.load(Ordering::Relaxed)))
    }
}

#[cfg(not(paced_loom))]
fn stripe() -> usize {
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % STRIPES;
    }
    STRIPE.with(|s| *s)
}

/// Under loom every thread counts on one stripe; the model checks the protocol, not the spread.
#[cfg(paced_loom)]
fn stripe() -> usize {
    0
}
