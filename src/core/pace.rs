//! The rule a one-item adapter (a stream's or a sink's) follows: what an item costs, whether
//! it may leave at `now`, and what leaving charges. Clock-free, like the rest of the core.

use std::fmt;

use super::bucket::{Bucket, Decision};
use super::nanos::Nanos;
use super::window::Window;

/// A pacing rule over the clock-free core.
pub(crate) trait Pace<T> {
    /// What `item` will be charged when it leaves.
    fn cost(&mut self, item: &T) -> u64;
    /// Whether the rule never delays anything, so the clock need not be read at all.
    fn is_unlimited(&self) -> bool;
    /// Charges an item of `cost` offered at `now` if it may leave now; otherwise says when.
    fn offer(&mut self, now: Nanos, cost: u64) -> Decision;
    /// Charges an item of `cost` that left at `now`, after waiting for its time.
    fn commit(&mut self, now: Nanos, cost: u64);
}

/// Every item costs one token (`min_interval`).
impl<T> Pace<T> for Bucket {
    fn cost(&mut self, _: &T) -> u64 {
        1
    }
    fn is_unlimited(&self) -> bool {
        Bucket::is_unlimited(self)
    }
    fn offer(&mut self, now: Nanos, cost: u64) -> Decision {
        Bucket::offer(self, now, cost)
    }
    fn commit(&mut self, now: Nanos, cost: u64) {
        Bucket::commit(self, now, cost);
    }
}

/// A bucket whose items cost what a closure says (`throttle`).
pub(crate) struct Costed<F> {
    pub(crate) bucket: Bucket,
    pub(crate) cost: F,
}

impl<F> fmt::Debug for Costed<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Costed")
            .field("bucket", &self.bucket)
            .finish_non_exhaustive()
    }
}

impl<T, F: FnMut(&T) -> u64> Pace<T> for Costed<F> {
    fn cost(&mut self, item: &T) -> u64 {
        (self.cost)(item)
    }
    fn is_unlimited(&self) -> bool {
        self.bucket.is_unlimited()
    }
    fn offer(&mut self, now: Nanos, cost: u64) -> Decision {
        self.bucket.offer(now, cost)
    }
    fn commit(&mut self, now: Nanos, cost: u64) {
        self.bucket.commit(now, cost);
    }
}

/// At most k emissions per window (`staggered_start`); items carry no cost.
impl<T> Pace<T> for Window {
    fn cost(&mut self, _: &T) -> u64 {
        1
    }
    fn is_unlimited(&self) -> bool {
        Window::is_unlimited(self)
    }
    fn offer(&mut self, now: Nanos, _: u64) -> Decision {
        Window::offer(self, now)
    }
    fn commit(&mut self, now: Nanos, _: u64) {
        Window::commit(self, now);
    }
}
