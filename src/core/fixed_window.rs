//! A fixed window: at most `quota` per window of `len` nanoseconds, the windows aligned to an
//! origin (a boundary at `phase + k * len`), as a provider's daily quota resets at midnight.
//!
//! The window keeps two numbers: the last window charged and what it used. Use above the quota
//! (a cost dearer than the quota, or a debt charged after the fact) is *carried*: each later
//! window starts with what the one before it used beyond the quota, so `k` consecutive windows
//! never hold more than `k * quota` plus the debt still unpaid. A window's use at any later
//! window is therefore `used - (later - index) * quota`, never below zero, and no bookkeeping
//! is needed as time passes.

use super::nanos::Nanos;

/// At most `quota` per fixed window of `len` ns, boundaries at `phase + k * len`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FixedWindow {
    quota: u64,
    /// The window's length in nanoseconds, at least 1.
    len: u64,
    /// Where the boundaries fall: at `phase + k * len` for every `k`, with `phase < len`.
    phase: u64,
    /// The number of the window last charged (see [`FixedWindow::number`]).
    index: u64,
    /// What window `index` used, carry included: above `quota` when it carries into the next.
    used: u128,
}

impl FixedWindow {
    /// A fresh window of `quota` per `len` ns (both at least 1), a boundary at every `phase +
    /// k * len` (`phase` is taken modulo `len`).
    pub(crate) fn new(quota: u64, len: Nanos, phase: Nanos) -> FixedWindow {
        debug_assert!(quota > 0 && len.0 > 0);
        let len = len.0.max(1);
        FixedWindow {
            quota,
            len,
            phase: phase.0 % len,
            index: 0,
            used: 0,
        }
    }

    /// The number of the window holding `t`: window `k` is `[start(k), start(k + 1))`.
    #[inline]
    fn number(&self, t: Nanos) -> u64 {
        // `t + len - phase` does not underflow (phase < len); in u128 it does not overflow.
        let shifted = u128::from(t.0) + u128::from(self.len - self.phase);
        // At most (2^64 + 2^64) / 1: fits in u64 unless len == 1, where t + 1 <= 2^64.
        u64::try_from(shifted / u128::from(self.len)).unwrap_or(u64::MAX)
    }

    /// Where window `k` starts (0 for the window holding 0).
    #[inline]
    fn start(&self, k: u64) -> Nanos {
        let start = (u128::from(k) * u128::from(self.len) + u128::from(self.phase))
            .saturating_sub(u128::from(self.len));
        Nanos(u64::try_from(start).unwrap_or(u64::MAX))
    }

    /// What window `k` (not before the last one charged) has used, carry included.
    #[inline]
    fn used_in(&self, k: u64) -> u128 {
        let passed = u128::from(k.saturating_sub(self.index));
        self.used
            .saturating_sub(passed.saturating_mul(u128::from(self.quota)))
    }

    /// The window in force at `t`: the one holding `t`, or the last one charged if later.
    #[inline]
    fn current(&self, t: Nanos) -> u64 {
        self.number(t).max(self.index)
    }

    /// When a request of `cost` waiting since `since` may go: as soon as a window starts in
    /// which it fits (one in which nothing is used, for a cost above the quota).
    pub(crate) fn earliest(&self, since: Nanos, cost: u64) -> Nanos {
        if cost == 0 {
            return since;
        }
        let k = self.current(since);
        let quota = u128::from(self.quota);
        let cost = u128::from(cost);
        // What window k + j uses is `used - (k + j - index) * quota`: the first window whose
        // use is at most `room`.
        let room = quota.saturating_sub(cost);
        if self.used_in(k) <= room {
            return since;
        }
        // used - n * quota <= room, n = k' - index: n = ceil((used - room) / quota).
        let n = (self.used - room).div_ceil(quota);
        let k = u64::try_from(u128::from(self.index) + n).unwrap_or(u64::MAX);
        since.max(self.start(k))
    }

    /// Charges `cost` at `now` (no earlier than [`FixedWindow::earliest`] allowed, except for
    /// a debt: then the excess carries into the next windows).
    pub(crate) fn commit(&mut self, now: Nanos, cost: u64) {
        if cost == 0 {
            return;
        }
        let k = self.current(now);
        self.used = self.used_in(k).saturating_add(u128::from(cost));
        self.index = k;
    }

    /// What is left of the quota at `now`.
    pub(crate) fn available(&self, now: Nanos) -> u64 {
        let used = self.used_in(self.current(now));
        u64::try_from(u128::from(self.quota).saturating_sub(used)).unwrap_or(0)
    }

    /// Whether `other` has the same quota, length and boundaries (whatever it used).
    pub(crate) fn same_limit(&self, other: &FixedWindow) -> bool {
        (self.quota, self.len, self.phase) == (other.quota, other.len, other.phase)
    }

    /// The first instant from which the window is as good as a new one: no window from then
    /// on has anything charged or carried (`Nanos::ZERO` if nothing is charged now). From then
    /// on it answers every question as a fresh window of the same limit does.
    pub(crate) fn as_new_at(&self) -> Nanos {
        if self.used == 0 {
            return Nanos::ZERO;
        }
        // Window `index + n` uses `used - n * quota`: nothing once `n * quota >= used`.
        let n = self.used.div_ceil(u128::from(self.quota));
        let k = u64::try_from(u128::from(self.index) + n).unwrap_or(u64::MAX);
        self.start(k)
    }

    /// The quota, the window's length, and the time from `now` until nothing is used any more
    /// (the start of the first window whose use, carry included, is nothing; zero if nothing
    /// is used now): what quota headers announce.
    #[cfg(feature = "http")]
    pub(crate) fn announced(&self, now: Nanos) -> (u64, Nanos, Nanos) {
        (
            self.quota,
            Nanos(self.len),
            self.as_new_at().saturating_sub(now),
        )
    }

    /// Gives back `amount` of a grant charged at `at`, if `now` is still in the window it was
    /// charged in (a window that has ended keeps what it used), never below nothing used.
    pub(crate) fn refund(&mut self, now: Nanos, at: Nanos, amount: u64) {
        let k = self.number(at);
        if self.number(now) != k || self.index != k {
            return;
        }
        self.used = self.used.saturating_sub(u128::from(amount));
    }

    /// Charges `amount` more at `now`: a use already made, which cannot be refused; above the
    /// quota it carries into the next windows.
    pub(crate) fn charge_debt(&mut self, now: Nanos, amount: u64) {
        self.commit(now, amount);
    }

    /// Takes `new`'s quota, length and boundaries from `now` on, keeping what the window in
    /// force at `now` has used (carry included).
    pub(crate) fn set_limit(&mut self, now: Nanos, new: &FixedWindow) {
        let used = self.used_in(self.current(now));
        *self = FixedWindow {
            index: 0,
            used: 0,
            ..*new
        };
        self.index = self.number(now);
        self.used = used;
    }
}

/// The naive window `tests/paced/multi.rs` uses too.
#[cfg(test)]
#[path = "../../tests/common/naive_window.rs"]
mod naive_window;

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::naive_window::NaiveWindow;
    use super::*;

    const DAY: u64 = 86_400_000;

    #[test]
    fn a_window_resets_at_its_boundaries() {
        // 3 per 1_000 ns, boundaries at 250 + k * 1_000.
        let mut w = FixedWindow::new(3, Nanos(1_000), Nanos(250));
        assert_eq!(w.available(Nanos(0)), 3);
        w.commit(Nanos(0), 2);
        assert_eq!(w.earliest(Nanos(10), 1), Nanos(10));
        assert_eq!(w.earliest(Nanos(10), 2), Nanos(250));
        w.commit(Nanos(10), 1);
        assert_eq!(w.available(Nanos(249)), 0);
        assert_eq!(w.earliest(Nanos(100), 1), Nanos(250));
        assert_eq!(w.available(Nanos(250)), 3);
        w.commit(Nanos(250), 3);
        assert_eq!(w.earliest(Nanos(300), 3), Nanos(1_250));
        assert_eq!(w.earliest(Nanos(5_000), 3), Nanos(5_000));
    }

    #[test]
    fn a_cost_above_the_quota_waits_for_an_unused_window_and_carries() {
        let mut w = FixedWindow::new(10, Nanos(DAY), Nanos(0));
        w.commit(Nanos(5), 1);
        // 25 needs an unused window: the next day; it then fills that day and the one after,
        // and half of the third.
        assert_eq!(w.earliest(Nanos(5), 25), Nanos(DAY));
        w.commit(Nanos(DAY), 25);
        assert_eq!(w.available(Nanos(DAY)), 0);
        assert_eq!(w.available(Nanos(2 * DAY)), 0);
        assert_eq!(w.available(Nanos(3 * DAY)), 5);
        assert_eq!(w.earliest(Nanos(DAY + 1), 5), Nanos(3 * DAY));
        assert_eq!(w.earliest(Nanos(DAY + 1), 6), Nanos(4 * DAY));
        // In an unused window it goes at once.
        let fresh = FixedWindow::new(10, Nanos(DAY), Nanos(0));
        assert_eq!(fresh.earliest(Nanos(7), 25), Nanos(7));
    }

    #[test]
    fn refunds_stay_in_the_charged_window() {
        let mut w = FixedWindow::new(10, Nanos(1_000), Nanos(0));
        w.commit(Nanos(100), 8);
        w.refund(Nanos(900), Nanos(100), 5);
        assert_eq!(w.available(Nanos(900)), 7);
        // Never below nothing used.
        w.refund(Nanos(950), Nanos(100), 50);
        assert_eq!(w.available(Nanos(950)), 10);
        w.commit(Nanos(960), 4);
        // A window that has ended keeps what it used.
        w.refund(Nanos(1_000), Nanos(960), 4);
        assert_eq!(w.available(Nanos(999)), 6);
        // Debt carries.
        w.charge_debt(Nanos(999), 25);
        assert_eq!(w.available(Nanos(1_000)), 0);
        assert_eq!(w.available(Nanos(2_000)), 1);
        assert_eq!(w.earliest(Nanos(1_500), 2), Nanos(3_000));
    }

    #[test]
    fn a_limit_change_keeps_the_use() {
        let mut w = FixedWindow::new(10, Nanos(1_000), Nanos(0));
        w.commit(Nanos(100), 8);
        w.set_limit(Nanos(200), &FixedWindow::new(20, Nanos(500), Nanos(0)));
        assert_eq!(w.available(Nanos(200)), 12);
        assert_eq!(w.available(Nanos(500)), 20);
    }

    #[test]
    fn time_at_the_edges() {
        let w = FixedWindow::new(1, Nanos(1), Nanos(0));
        assert_eq!(w.earliest(Nanos(u64::MAX), 1), Nanos(u64::MAX));
        let mut w = FixedWindow::new(1, Nanos(u64::MAX), Nanos(5));
        w.commit(Nanos(0), 1);
        assert_eq!(w.earliest(Nanos(1), 1), Nanos(5));
        w.commit(Nanos(5), 1);
        assert_eq!(w.earliest(Nanos(6), 1), Nanos(u64::MAX));
    }

    #[derive(Clone, Debug)]
    enum Op {
        Advance(u64),
        /// Waits for `cost` and takes it.
        Acquire(u64),
        /// Settles the last grant with this actual cost.
        Settle(u64),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec(
            prop_oneof![
                2 => (0u64..2_500).prop_map(Op::Advance),
                4 => (0u64..25).prop_map(Op::Acquire),
                2 => (0u64..25).prop_map(Op::Settle),
            ],
            1..60,
        )
    }

    proptest! {
        #[test]
        fn agrees_with_the_naive_window(
            quota in 1u64..12,
            len in 1u64..1_500,
            phase in 0u64..1_500,
            ops in ops(),
        ) {
            let mut w = FixedWindow::new(quota, Nanos(len), Nanos(phase));
            let mut naive = NaiveWindow::new(quota, len, phase);
            let mut now = 0u64;
            let mut last: Option<(u64, u64)> = None;
            for op in ops {
                match op {
                    Op::Advance(d) => now += d,
                    Op::Acquire(cost) => {
                        let at = naive.earliest(now, cost);
                        prop_assert_eq!(w.earliest(Nanos(now), cost), Nanos(at));
                        now = at;
                        w.commit(Nanos(now), cost);
                        naive.charge(now, cost);
                        last = Some((now, cost));
                    }
                    Op::Settle(actual) => {
                        if let Some((at, charged)) = last.take() {
                            if actual < charged {
                                w.refund(Nanos(now), Nanos(at), charged - actual);
                                naive.refund(now, at, charged - actual);
                            } else if actual > charged {
                                w.charge_debt(Nanos(now), actual - charged);
                                naive.charge(now, actual - charged);
                            }
                        }
                    }
                }
                prop_assert_eq!(w.available(Nanos(now)), naive.available(now));
                for cost in [1, quota, quota + 3] {
                    prop_assert_eq!(w.earliest(Nanos(now), cost), Nanos(naive.earliest(now, cost)));
                }
            }
        }
    }
}
