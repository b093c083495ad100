//! The sliding window of `staggered_start`: at most `k` emissions in any window of `period`.

use std::collections::VecDeque;

use super::bucket::Decision;
use super::nanos::Nanos;

/// The last emission times that can still hold the next one back, oldest first.
///
/// Emission `i` may not leave before emission `i - k` plus `period`, so only the last `k`
/// emissions matter, and of those only the ones less than `period` old: older entries are
/// dropped, so an idle window owns no memory beyond its (lazily allocated) ring buffer.
#[derive(Clone, Debug)]
pub(crate) struct Window {
    k: usize,
    period: Nanos,
    recent: VecDeque<Nanos>,
}

impl Window {
    pub(crate) fn new(k: usize, period: Nanos) -> Window {
        debug_assert!(k > 0);
        Window {
            k,
            period,
            recent: VecDeque::new(),
        }
    }

    /// Whether the window never delays anything (a zero period), so callers can skip the clock.
    pub(crate) fn is_unlimited(&self) -> bool {
        self.period == Nanos::ZERO
    }

    /// The earliest instant the next emission may happen; any value `<= now` means "at once".
    pub(crate) fn earliest(&self, now: Nanos) -> Nanos {
        // The k-th most recent emission holds the next one back (after `set_limit` lowered
        // k, more than k may be remembered).
        match self.recent.len().checked_sub(self.k) {
            Some(i) => self.recent[i].saturating_add(self.period),
            None => now,
        }
    }

    /// How many emissions the window would allow at `now`.
    pub(crate) fn available(&self, now: Nanos) -> usize {
        let recent = self
            .recent
            .iter()
            .filter(|&&at| at.saturating_add(self.period) > now)
            .count();
        self.k.saturating_sub(recent)
    }

    /// At most `k` per `period` from now on; past emissions still count.
    pub(crate) fn set_limit(&mut self, k: usize, period: Nanos) {
        debug_assert!(k > 0);
        self.k = k;
        self.period = period;
    }

    /// Records an emission at `now` if the window allows one; otherwise says when it will.
    pub(crate) fn offer(&mut self, now: Nanos) -> Decision {
        match self.earliest(now) {
            at if at <= now => {
                self.commit(now);
                Decision::Go
            }
            at => Decision::NotUntil(at),
        }
    }

    /// Whether `other` is in the same state: the same limit and the same emissions remembered.
    /// (Compared newest first, where two schedules of the same past usually differ.)
    pub(crate) fn same(&self, other: &Window) -> bool {
        self.k == other.k
            && self.period == other.period
            && self.recent.len() == other.recent.len()
            && self.recent.iter().rev().eq(other.recent.iter().rev())
    }

    /// Records an emission at `now`.
    pub(crate) fn commit(&mut self, now: Nanos) {
        if self.is_unlimited() {
            return;
        }
        while let Some(&oldest) = self.recent.front() {
            if self.recent.len() >= self.k || oldest.saturating_add(self.period) <= now {
                self.recent.pop_front();
            } else {
                break;
            }
        }
        self.recent.push_back(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SEC: u64 = 1_000_000_000;

    fn schedule(window: &mut Window, arrivals: &[u64]) -> Vec<u64> {
        let mut last = 0;
        arrivals
            .iter()
            .map(|&arrival| {
                let now = Nanos(arrival.max(last));
                let at = now.max(window.earliest(now));
                window.commit(at);
                last = at.0;
                at.0
            })
            .collect()
    }

    #[test]
    fn two_per_second() {
        let mut w = Window::new(2, Nanos(SEC));
        let got = schedule(&mut w, &[0; 5]);
        assert_eq!(got, [0, 0, SEC, SEC, 2 * SEC]);
    }

    #[test]
    fn three_per_second() {
        let mut w = Window::new(3, Nanos(SEC));
        let got = schedule(&mut w, &[0; 7]);
        assert_eq!(got, [0, 0, 0, SEC, SEC, SEC, 2 * SEC]);
    }

    #[test]
    fn late_arrivals_go_at_once() {
        let mut w = Window::new(1, Nanos(SEC));
        let got = schedule(&mut w, &[0, 5 * SEC, 5 * SEC + 1]);
        assert_eq!(got, [0, 5 * SEC, 6 * SEC]);
    }

    #[test]
    fn forgets_what_cannot_matter() {
        let mut w = Window::new(1_000, Nanos(SEC));
        for i in 0..10 {
            w.commit(Nanos(i * SEC));
        }
        assert_eq!(w.recent.len(), 1);
    }

    #[test]
    fn zero_period_never_binds() {
        let mut w = Window::new(1, Nanos::ZERO);
        assert!(w.is_unlimited());
        w.commit(Nanos(3));
        assert_eq!(w.earliest(Nanos(3)), Nanos(3));
    }

    #[test]
    fn huge_period_saturates() {
        let mut w = Window::new(1, Nanos::MAX);
        w.commit(Nanos(10));
        assert_eq!(w.earliest(Nanos(10)), Nanos::MAX);
    }

    #[test]
    fn set_limit_keeps_past_emissions() {
        let mut w = Window::new(3, Nanos(SEC));
        for at in [0, 100, 200] {
            w.commit(Nanos(at));
        }
        assert_eq!(w.available(Nanos(300)), 0);
        w.set_limit(1, Nanos(SEC));
        // The most recent of the three now holds the next one back.
        assert_eq!(w.earliest(Nanos(300)), Nanos(SEC + 200));
        w.set_limit(5, Nanos(SEC));
        assert_eq!(w.available(Nanos(300)), 2);
        assert_eq!(w.earliest(Nanos(300)), Nanos(300));
        w.set_limit(2, Nanos(2 * SEC));
        assert_eq!(w.earliest(Nanos(300)), Nanos(2 * SEC + 100));
    }

    proptest! {
        /// Against the definition: emission `i` is exactly max(arrival, emission(i-k) + period).
        #[test]
        fn matches_definition(
            k in 1usize..6,
            period in 1u64..1_000,
            gaps in prop::collection::vec(0u64..700, 1..80),
        ) {
            let mut w = Window::new(k, Nanos(period));
            let mut arrivals = Vec::new();
            let mut t = 0;
            for gap in gaps {
                t += gap;
                arrivals.push(t);
            }
            let got = schedule(&mut w, &arrivals);
            let mut expected: Vec<u64> = Vec::new();
            for (i, &arrival) in arrivals.iter().enumerate() {
                let mut at = arrival.max(expected.last().copied().unwrap_or(0));
                if i >= k {
                    at = at.max(expected[i - k] + period);
                }
                expected.push(at);
            }
            prop_assert_eq!(got, expected);
        }
    }
}
