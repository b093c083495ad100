//! [`Pace`]: the one pacing rule, what a bucket, a window or a warm-up curve answers given
//! `now`: when a request of some cost may go, and what granting it charges. Clock-free, like
//! the rest of the core. A one-item adapter (a stream's or a sink's) asks it for its held item;
//! the engine asks it for the head of a shared limiter's queue. What an *item* costs is the
//! adapter's business: [`Cost`].

use std::fmt;

use super::bucket::{Bucket, Decision};
use super::nanos::Nanos;
use super::warmup::WarmingUp;
use super::window::Window;

/// A pacing rule over the clock-free core.
///
/// Generic everywhere it is used (a stream adapter's rule, a lane's rule): no dynamic dispatch,
/// and `Clone` so that a lane can project its queue on a copy.
pub(crate) trait Pace: Clone {
    /// What a request costs: one amount (`u64`) for a rule of one dimension, one amount per
    /// dimension (`[u64; N]`) for [`Limits`](super::Limits).
    type Cost: Amount;
    /// When a request of `cost` that has been waiting first in line since `since` may go
    /// (`since` or earlier if at once).
    fn earliest(&self, since: Nanos, cost: Self::Cost) -> Nanos;
    /// Charges a request of `cost` granted at `now`, which has waited first in line since
    /// `since`.
    fn commit(&mut self, now: Nanos, since: Nanos, cost: Self::Cost);
    /// Whether a request of `cost` can only ever be had by waiting, so that asking without
    /// waiting is pointless (an enforcing adapter refuses it with `Duration::MAX`).
    fn needs_wait(&self, cost: Self::Cost) -> bool;
    /// Whether `other` is in the same state as `self`: whatever the two are asked from now on,
    /// they answer alike. (A projection of a queue uses it to see that it has caught up with
    /// one made earlier; `false` is always safe, only slower.)
    fn same(&self, other: &Self) -> bool;
    /// Whether the rule never delays anything, so the clock need not be read at all.
    fn is_unlimited(&self) -> bool {
        false
    }
    /// Whether a request of `cost` granted up to `late` after [`Pace::earliest`] allowed it
    /// moves no later request's time: the lateness of a wake-up costs no rate. `false` is
    /// always safe: the wait then ends on time, at some CPU.
    fn absorbs(&self, _cost: Self::Cost, _late: Nanos) -> bool {
        false
    }
    /// Charges a request of `cost` arriving at `now` if it may go now; otherwise says when.
    #[inline]
    fn offer(&mut self, now: Nanos, cost: Self::Cost) -> Decision {
        offer_by_earliest(self, now, cost)
    }
    /// What `try_acquire` asks: [`Pace::offer`], but a request of `cost` that can only be had
    /// by waiting ([`Pace::needs_wait`]) is refused until `Nanos::MAX` and charges nothing.
    #[inline]
    fn try_offer(&mut self, now: Nanos, cost: Self::Cost) -> Decision {
        if self.needs_wait(cost) {
            return Decision::NotUntil(Nanos::MAX);
        }
        self.offer(now, cost)
    }
    /// The rule's token bucket, if at `now` the rule is nothing but that bucket, so that a
    /// lock-free path may decide for it (see the engine's `single`).
    fn plain_bucket(&self, _now: Nanos) -> Option<&Bucket> {
        None
    }
    /// The rule's token bucket, to write back the state the lock-free path kept.
    fn bucket_mut(&mut self) -> Option<&mut Bucket> {
        None
    }
}

impl Pace for Bucket {
    type Cost = u64;
    #[inline]
    fn earliest(&self, since: Nanos, cost: u64) -> Nanos {
        Bucket::earliest(self, since, cost)
    }
    #[inline]
    fn commit(&mut self, now: Nanos, _: Nanos, cost: u64) {
        Bucket::commit(self, now, cost);
    }
    #[inline]
    fn needs_wait(&self, cost: u64) -> bool {
        cost > self.burst()
    }
    fn same(&self, other: &Self) -> bool {
        self == other
    }
    #[inline]
    fn is_unlimited(&self) -> bool {
        Bucket::is_unlimited(self)
    }
    #[inline]
    fn absorbs(&self, cost: u64, late: Nanos) -> bool {
        Bucket::absorbs(self, cost, late)
    }
    #[inline]
    fn offer(&mut self, now: Nanos, cost: u64) -> Decision {
        Bucket::offer(self, now, cost)
    }
    fn plain_bucket(&self, _: Nanos) -> Option<&Bucket> {
        Some(self)
    }
    fn bucket_mut(&mut self) -> Option<&mut Bucket> {
        Some(self)
    }
}

impl Pace for WarmingUp {
    type Cost = u64;
    fn earliest(&self, _: Nanos, _: u64) -> Nanos {
        WarmingUp::earliest(self)
    }
    fn commit(&mut self, now: Nanos, since: Nanos, cost: u64) {
        // Guava reserves on arrival: a request that waited is charged as of the moment its
        // turn came, not as of the (up to a tick late) wake-up, so lateness does not add up.
        let due = since.max(WarmingUp::earliest(self)).min(now);
        WarmingUp::commit(self, due, cost);
    }
    fn needs_wait(&self, _: u64) -> bool {
        false
    }
    fn same(&self, other: &Self) -> bool {
        WarmingUp::same(self, other)
    }
    /// Charged as of its turn, whenever it leaves.
    fn absorbs(&self, _: u64, _: Nanos) -> bool {
        true
    }
}

/// At most k grants per window; a request counts once, whatever its cost.
impl Pace for Window {
    type Cost = u64;
    #[inline]
    fn earliest(&self, since: Nanos, _: u64) -> Nanos {
        Window::earliest(self, since)
    }
    #[inline]
    fn commit(&mut self, now: Nanos, _: Nanos, _: u64) {
        Window::commit(self, now);
    }
    fn needs_wait(&self, _: u64) -> bool {
        false
    }
    fn same(&self, other: &Self) -> bool {
        Window::same(self, other)
    }
    #[inline]
    fn is_unlimited(&self) -> bool {
        Window::is_unlimited(self)
    }
    #[inline]
    fn offer(&mut self, now: Nanos, _: u64) -> Decision {
        Window::offer(self, now)
    }
}

/// A request's cost as the engine handles it, whatever its shape: whether it is free, and
/// one number for tracing and metrics.
pub(crate) trait Amount: Copy + fmt::Debug + PartialEq {
    /// Whether the request costs nothing at all (granted at once, charging nothing).
    fn is_zero(&self) -> bool;
    /// The cost as one number: the amount itself, or the sum over the dimensions (saturating).
    fn total(&self) -> u64;
    /// The amount, if the cost is one number (so that a lock-free path for one bucket may
    /// decide for it).
    fn single(&self) -> Option<u64>;
}

impl Amount for u64 {
    #[inline]
    fn is_zero(&self) -> bool {
        *self == 0
    }
    #[inline]
    fn total(&self) -> u64 {
        *self
    }
    #[inline]
    fn single(&self) -> Option<u64> {
        Some(*self)
    }
}

impl<const N: usize> Amount for [u64; N] {
    #[inline]
    fn is_zero(&self) -> bool {
        self.iter().all(|&c| c == 0)
    }
    #[inline]
    fn total(&self) -> u64 {
        self.iter().fold(0u64, |sum, &c| sum.saturating_add(c))
    }
    #[inline]
    fn single(&self) -> Option<u64> {
        None
    }
}

/// What an item costs when it leaves a one-item adapter.
pub(crate) trait Cost<T> {
    /// The cost of `item`.
    fn cost(&mut self, item: &T) -> u64;
}

/// Every item costs one (`min_interval`, `staggered_start`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct One;

impl<T> Cost<T> for One {
    #[inline]
    fn cost(&mut self, _: &T) -> u64 {
        1
    }
}

/// Items cost what a closure says (`throttle`).
#[derive(Clone, Copy)]
pub(crate) struct ByItem<F>(pub(crate) F);

impl<T, F: FnMut(&T) -> u64> Cost<T> for ByItem<F> {
    #[inline]
    fn cost(&mut self, item: &T) -> u64 {
        (self.0)(item)
    }
}

impl<F> fmt::Debug for ByItem<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ByItem(..)")
    }
}

/// [`Pace::offer`] as [`Pace::earliest`] then [`Pace::commit`]: the default, and the slow path
/// of a pace that answers the common case faster.
#[inline]
pub(crate) fn offer_by_earliest<P: Pace>(pace: &mut P, now: Nanos, cost: P::Cost) -> Decision {
    match pace.earliest(now, cost) {
        at if at <= now => {
            pace.commit(now, now, cost);
            Decision::Go
        }
        at => Decision::NotUntil(at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default `offer` is `earliest` then `commit`; the bucket's and the window's own
    /// (faster) ones must answer alike.
    fn offers_agree<P: Pace<Cost = u64>>(mut fast: P, costs: &[(u64, u64)]) {
        let mut slow = fast.clone();
        for &(now, cost) in costs {
            let now = Nanos(now);
            let expected = match slow.earliest(now, cost) {
                at if at <= now => {
                    slow.commit(now, now, cost);
                    Decision::Go
                }
                at => Decision::NotUntil(at),
            };
            assert_eq!(fast.offer(now, cost), expected, "at {now:?}, cost {cost}");
            assert!(fast.same(&slow));
        }
    }

    #[test]
    fn a_buckets_offer_is_earliest_then_commit() {
        let costs = [
            (0, 1),
            (0, 2),
            (0, 1),
            (500, 1),
            (1_000, 1),
            (1_000, 3),
            (9_000, 2),
        ];
        offers_agree(Bucket::new(1, 1_000, 3), &costs);
    }

    #[test]
    fn a_windows_offer_is_earliest_then_commit() {
        let costs = [
            (0, 1),
            (0, 1),
            (0, 1),
            (999, 1),
            (1_000, 1),
            (1_500, 1),
            (2_000, 1),
        ];
        offers_agree(Window::new(2, Nanos(1_000)), &costs);
    }

    #[test]
    fn item_costs() {
        assert_eq!(Cost::<&str>::cost(&mut One, &"x"), 1);
        let mut by_len = ByItem(|s: &&str| s.len() as u64);
        assert_eq!(by_len.cost(&"four"), 4);
    }
}
