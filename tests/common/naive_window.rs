//! The obviously correct fixed window, shared by `FixedWindow`'s unit proptest and
//! `tests/paced/multi.rs`: every window's own charges, each window starting with what the one before
//! used above the quota. Times in any unit (nanoseconds there, milliseconds here).
#![allow(dead_code, unreachable_pub)]

/// At most `quota` per window of `len`, boundaries at `phase + k * len` (`phase < len`).
#[derive(Clone, Debug)]
pub struct NaiveWindow {
    pub quota: u64,
    len: u64,
    phase: u64,
    /// (window, charged there, net of refunds), in window order.
    direct: Vec<(u64, i128)>,
}

impl NaiveWindow {
    pub fn new(quota: u64, len: u64, phase: u64) -> NaiveWindow {
        NaiveWindow {
            quota,
            len,
            phase: phase % len,
            direct: Vec::new(),
        }
    }

    /// The number of the window holding `t`.
    pub fn number(&self, t: u64) -> u64 {
        ((u128::from(t) + u128::from(self.len - self.phase)) / u128::from(self.len)) as u64
    }

    fn start(&self, k: u64) -> u64 {
        (i128::from(k) * i128::from(self.len) + i128::from(self.phase) - i128::from(self.len))
            .max(0) as u64
    }

    fn last(&self) -> u64 {
        self.direct.last().map_or(0, |d| d.0)
    }

    /// The window in force at `t`: the one holding it, or the last one charged.
    fn current(&self, t: u64) -> u64 {
        self.number(t).max(self.last())
    }

    /// What window `k` uses, carry included.
    fn used(&self, k: u64) -> i128 {
        let mut carry = 0i128;
        let first = self.direct.first().map_or(k, |d| d.0);
        for w in first..=k {
            let own: i128 = self.direct.iter().filter(|d| d.0 == w).map(|d| d.1).sum();
            let used = carry + own;
            if w == k {
                return used;
            }
            carry = (used - i128::from(self.quota)).max(0);
        }
        carry
    }

    /// Whether nothing is used (nor carried) in the window in force at `t`: the window is then
    /// as a new one.
    pub fn is_unused_at(&self, t: u64) -> bool {
        self.used(self.current(t)) <= 0
    }

    /// When `cost`, waiting since `since`, fits: the first window from then on with room for
    /// it (an unused one for a cost above the quota).
    pub fn earliest(&self, since: u64, cost: u64) -> u64 {
        if cost == 0 {
            return since;
        }
        let mut k = self.current(since);
        loop {
            let used = self.used(k);
            let fits = if cost > self.quota {
                used == 0
            } else {
                used + i128::from(cost) <= i128::from(self.quota)
            };
            if fits {
                return since.max(self.start(k));
            }
            k += 1;
        }
    }

    /// Charges `cost` at `now` (a grant or a debt).
    pub fn charge(&mut self, now: u64, cost: u64) {
        let k = self.current(now);
        self.direct.push((k, i128::from(cost)));
    }

    /// Gives back `amount` at `now` of a grant made at `at`, only within its window.
    pub fn refund(&mut self, now: u64, at: u64, amount: u64) {
        let k = self.number(at);
        if self.number(now) != k || self.last() != k {
            return;
        }
        let back = i128::from(amount).min(self.used(k));
        self.direct.push((k, -back));
    }

    /// What is left at `now`.
    pub fn available(&self, now: u64) -> u64 {
        (i128::from(self.quota) - self.used(self.current(now))).max(0) as u64
    }

    /// A new quota from `now` on, keeping what the window in force has used.
    pub fn set_quota(&mut self, now: u64, quota: u64) {
        let k = self.current(now);
        self.direct = vec![(k, self.used(k))];
        self.quota = quota;
    }
}
