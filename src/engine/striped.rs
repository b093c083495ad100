//! A counter that threads add to on cache lines of their own, so that counting a grant on the
//! lock-free path does not make two cores fight over one line (Java's `LongAdder`), and costs
//! no atomic read-modify-write either: a stripe has one writer.
//!
//! A live thread *owns* one of the first `STRIPES - 1` stripes (the same index in every
//! counter) and adds to it with a plain load and store; it hands the index back when it ends.
//! Threads beyond those, and a thread counting while its thread-locals are torn down, add to
//! the last stripe with `fetch_add`. Two threads therefore never share a stripe they both
//! write with plain stores (a lost count), nor, while at most `STRIPES - 1` threads count at
//! once, any stripe at all (the contention a round-robin spread allowed: threads that took
//! stripes in turn, `index % STRIPES`, could land on one line).

use crate::sync::{AtomicU64, Ordering};

/// Stripes per counter: `STRIPES - 1` owned ones and the shared one (2 KiB per limiter). Under
/// loom, one owned and the shared one, so that two threads reach every path.
#[cfg(not(paced_loom))]
const STRIPES: usize = 16;
#[cfg(paced_loom)]
const STRIPES: usize = 2;

/// The stripe every thread without an owned one adds to, with `fetch_add`.
const SHARED: usize = STRIPES - 1;

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
    #[inline]
    pub(crate) fn increment(&self) {
        let index = stripe();
        let stripe = &self.stripes[index].0;
        if index == SHARED {
            stripe.fetch_add(1, Ordering::Relaxed);
        } else {
            // The only writer of this stripe: its previous owner's stores happened-before the
            // claim (see `Owner`), so this load sees the stripe's latest value.
            stripe.store(
                stripe.load(Ordering::Relaxed).wrapping_add(1),
                Ordering::Relaxed,
            );
        }
    }

    /// The sum: exact once the additions it should count have happened-before the call.
    pub(crate) fn sum(&self) -> u64 {
        self.stripes
            .iter()
            .fold(0u64, |sum, s| sum.wrapping_add(s.0.load(Ordering::Relaxed)))
    }
}

/// A thread's claim on a stripe index, given back when the thread ends.
struct Owner {
    index: usize,
    /// Under loom, the claims themselves: a thread's locals are dropped after the model's
    /// statics, so the claim keeps them alive.
    #[cfg(paced_loom)]
    owned: std::sync::Arc<AtomicU64>,
}

impl Owner {
    /// Claims the lowest free owned index, or [`SHARED`] if every one is taken.
    fn claim() -> Owner {
        let owned = owned();
        let mut taken = owned.load(Ordering::Relaxed);
        let index = loop {
            let free = (!taken).trailing_zeros() as usize;
            if free >= SHARED {
                break SHARED;
            }
            // Acquire: pairs with the release of the index by its previous owner, whose last
            // stores to the stripes then happen-before this thread's.
            match owned.compare_exchange_weak(
                taken,
                taken | 1 << free,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break free,
                Err(actual) => taken = actual,
            }
        };
        Owner {
            index,
            #[cfg(paced_loom)]
            owned: owned.clone(),
        }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        if self.index != SHARED {
            #[cfg(not(paced_loom))]
            let owned = owned();
            #[cfg(paced_loom)]
            let owned = &self.owned;
            owned.fetch_and(!(1 << self.index), Ordering::Release);
        }
    }
}

#[cfg(not(paced_loom))]
fn owned() -> &'static AtomicU64 {
    static OWNED: AtomicU64 = AtomicU64::new(0);
    &OWNED
}

#[cfg(not(paced_loom))]
std::thread_local! {
    static STRIPE: Owner = Owner::claim();
}

#[cfg(paced_loom)]
fn owned() -> std::sync::Arc<AtomicU64> {
    loom::lazy_static! {
        static ref OWNED: std::sync::Arc<AtomicU64> = std::sync::Arc::new(AtomicU64::new(0));
    }
    OWNED.clone()
}

#[cfg(paced_loom)]
loom::thread_local! {
    static STRIPE: Owner = Owner::claim();
}

/// This thread's stripe: its own, or the shared one once its thread-locals are gone.
#[inline]
fn stripe() -> usize {
    STRIPE.try_with(|owner| owner.index).unwrap_or(SHARED)
}

#[cfg(all(test, not(paced_loom)))]
mod tests {
    use super::*;

    #[test]
    fn counts_every_addition_from_many_threads_and_hands_stripes_back() {
        let counter = Striped::default();
        // More threads than owned stripes, in rounds, so that indices are handed back and
        // claimed again, and some threads add to the shared stripe.
        for _ in 0..3 {
            std::thread::scope(|s| {
                for _ in 0..2 * STRIPES {
                    s.spawn(|| {
                        for _ in 0..1_000 {
                            counter.increment();
                        }
                    });
                }
            });
        }
        assert_eq!(counter.sum(), 3 * 2 * STRIPES as u64 * 1_000);
    }

    #[test]
    fn two_live_threads_own_different_stripes() {
        let (a, b) = std::thread::scope(|s| {
            let (claimed, first_claimed) = std::sync::mpsc::channel();
            let (done, second_claimed) = std::sync::mpsc::channel();
            let first = s.spawn(move || {
                let mine = stripe();
                claimed.send(()).ok();
                // Stay alive until the second thread has claimed its stripe.
                second_claimed.recv().ok();
                mine
            });
            let second = s.spawn(move || {
                // Claim only once the first holds its stripe: both are then alive at once.
                first_claimed.recv().ok();
                let mine = stripe();
                done.send(()).ok();
                mine
            });
            (first.join().ok(), second.join().ok())
        });
        let (a, b) = (a.unwrap_or(SHARED), b.unwrap_or(SHARED));
        // Other tests' threads may hold owned stripes meanwhile: only a shared stripe may be
        // common to both.
        assert!(a != b || a == SHARED, "two live threads on stripe {a}");
    }
}
