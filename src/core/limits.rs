//! [`Limits`]: several limits at once, each on one dimension of a cost `[u64; N]` (requests,
//! tokens, ...): a request may go when every limit has room for its amount, and is charged on
//! all of them at one instant. Clock-free, like the rest of the core.

use super::bucket::{Bucket, Charged, Decision};
use super::fixed_window::FixedWindow;
use super::nanos::Nanos;
use super::pace::Pace;

/// One limit's rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Rule {
    /// A token bucket.
    Bucket(Bucket),
    /// A fixed window.
    Window(FixedWindow),
}

impl Rule {
    #[inline]
    fn earliest(&self, since: Nanos, cost: u64) -> Nanos {
        match self {
            Rule::Bucket(b) => b.earliest(since, cost),
            Rule::Window(w) => w.earliest(since, cost),
        }
    }

    #[inline]
    fn commit(&mut self, now: Nanos, cost: u64) {
        match self {
            Rule::Bucket(b) => b.commit(now, cost),
            Rule::Window(w) => w.commit(now, cost),
        }
    }

    /// Whether the limit has room for `cost` at `now`, as far as the common case tells
    /// (`false` when in doubt).
    #[inline]
    fn has_room(&self, now: Nanos, cost: u64) -> bool {
        cost == 0
            || match self {
                Rule::Bucket(b) => b.charge_if_room(now, cost).is_some(),
                Rule::Window(w) => w.earliest(now, cost) <= now,
            }
    }

    /// What the limit holds at `now`.
    pub(crate) fn available(&self, now: Nanos) -> u64 {
        match self {
            Rule::Bucket(b) => b.available(now),
            Rule::Window(w) => w.available(now),
        }
    }
}

/// A limit on one dimension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Tagged {
    /// The dimension: the place of its amount in a cost.
    pub(crate) dim: usize,
    pub(crate) rule: Rule,
}

/// Every limit of a quota of `N` dimensions, in the order they were given.
///
/// The limits live in a `Vec`: it is read and charged in place on every grant; only a
/// projection of the queue (a refusal while others wait) clones it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Limits<const N: usize> {
    limits: Vec<Tagged>,
    /// Nothing is granted before this time (`RateLimiter::pause_for`).
    paused_until: Nanos,
}

impl<const N: usize> Limits<N> {
    /// The limits; each `dim` must be below `N`.
    pub(crate) fn new(limits: Vec<Tagged>) -> Limits<N> {
        debug_assert!(limits.iter().all(|l| l.dim < N));
        Limits {
            limits,
            paused_until: Nanos::ZERO,
        }
    }

    /// The limit at `index`.
    pub(crate) fn limit(&self, index: usize) -> Option<&Tagged> {
        self.limits.get(index)
    }

    /// Grants nothing before `until` (a later pause given before is kept).
    pub(crate) fn pause_until(&mut self, until: Nanos) {
        self.paused_until = self.paused_until.max(until);
    }

    /// Nothing is granted before this time.
    #[cfg(feature = "http")]
    pub(crate) fn paused_until(&self) -> Nanos {
        self.paused_until
    }

    /// The limit at `index`, to change it.
    pub(crate) fn limit_mut(&mut self, index: usize) -> Option<&mut Tagged> {
        self.limits.get_mut(index)
    }

    /// The first instant from which every limit is as good as new (a bucket full, a fixed
    /// window with nothing charged or carried) and nothing is paused: from then on the limits
    /// answer every question as a fresh copy of their configuration does, so a key in that
    /// state with nobody waiting may be forgotten exactly. `Nanos::MAX` if never.
    pub(crate) fn as_new_at(&self) -> Nanos {
        self.limits
            .iter()
            .map(|l| match &l.rule {
                Rule::Bucket(b) => b.full_at(),
                Rule::Window(w) => w.as_new_at(),
            })
            .fold(self.paused_until, Nanos::max)
    }

    /// Takes every limit of `new` (limits of the same kinds, in the same order) from `now` on,
    /// keeping each level: a bucket what it holds or lacks, capped at the new burst; a fixed
    /// window what the window in force used. A limit without a counterpart is kept.
    pub(crate) fn apply(&mut self, now: Nanos, new: &Limits<N>) {
        for (old, new) in self.limits.iter_mut().zip(&new.limits) {
            match (&mut old.rule, &new.rule) {
                (Rule::Bucket(old), Rule::Bucket(new))
                    if (old.rate_parts(), old.burst()) != (new.rate_parts(), new.burst()) =>
                {
                    let (tokens, per) = new.rate_parts();
                    old.set_rate(now, tokens, per);
                    old.set_burst(now, new.burst());
                }
                (Rule::Window(old), Rule::Window(new)) if !old.same_limit(new) => {
                    old.set_limit(now, new);
                }
                _ => {}
            }
        }
    }

    /// Per dimension, the least any of its limits holds at `now` (`u64::MAX` for a dimension
    /// with none).
    pub(crate) fn available(&self, now: Nanos) -> [u64; N] {
        let mut out = [u64::MAX; N];
        for l in &self.limits {
            out[l.dim] = out[l.dim].min(l.rule.available(now));
        }
        out
    }

    /// Corrects a grant of `charged` made at `at` to `actual`, at `now`: per limit, a smaller
    /// amount gives the difference back (a bucket up to full, a fixed window within the window
    /// charged only), a larger one is charged as debt. Whether anything was given back (so
    /// that the head of the queue may now go).
    pub(crate) fn settle(
        &mut self,
        now: Nanos,
        at: Nanos,
        charged: [u64; N],
        actual: [u64; N],
    ) -> bool {
        let mut returned = false;
        for l in &mut self.limits {
            let (charged, actual) = (charged[l.dim], actual[l.dim]);
            if actual < charged {
                match &mut l.rule {
                    Rule::Bucket(b) => {
                        // A cost above the burst took the burst from the bucket and paid the
                        // rest by waiting: only what the bucket gave is given back.
                        let back = charged.min(b.burst()) - actual.min(b.burst());
                        if back > 0 {
                            returned = true;
                            b.refund(now, back);
                        }
                    }
                    Rule::Window(w) => {
                        returned = true;
                        w.refund(now, at, charged - actual);
                    }
                }
            } else if actual > charged {
                match &mut l.rule {
                    Rule::Bucket(b) => b.charge_debt(now, actual - charged),
                    Rule::Window(w) => w.charge_debt(now, actual - charged),
                }
            }
        }
        returned
    }

    /// Charges `cost` at `now` if every limit has room for it, as far as the common case
    /// tells; charges nothing and answers `false` when in doubt (a limit without room, a cost
    /// above a bucket's burst, a bucket beyond 128 bits, a pause). The granted path of an
    /// offer: no limit's ready time is computed.
    #[inline]
    fn charge_if_room(&mut self, now: Nanos, cost: [u64; N]) -> bool {
        if now < self.paused_until {
            return false;
        }
        // The common quotas, one bucket or two (requests and tokens), unrolled: each bucket's
        // charge is computed with its check.
        match self.limits.as_mut_slice() {
            [Tagged {
                dim,
                rule: Rule::Bucket(a),
            }] => {
                let Some(x) = charge(a, now, cost[*dim]) else {
                    return false;
                };
                a.apply(x);
            }
            [Tagged {
                dim: da,
                rule: Rule::Bucket(a),
            }, Tagged {
                dim: db,
                rule: Rule::Bucket(b),
            }] => {
                let (Some(x), Some(y)) = (charge(a, now, cost[*da]), charge(b, now, cost[*db]))
                else {
                    return false;
                };
                a.apply(x);
                b.apply(y);
            }
            all => {
                if !all.iter().all(|l| l.rule.has_room(now, cost[l.dim])) {
                    return false;
                }
                self.commit(now, now, cost);
            }
        }
        true
    }

    /// [`Pace::offer`] as `earliest` then `commit`: a refusal, and what `charge_if_room`
    /// cannot tell.
    #[inline(never)]
    fn offer_slow(&mut self, now: Nanos, cost: [u64; N]) -> Decision {
        super::pace::offer_by_earliest(self, now, cost)
    }
}

/// What charging `cost` on `bucket` at `now` changes, if it has room (nothing for a cost of 0,
/// which asks nothing of it).
#[inline]
fn charge(bucket: &Bucket, now: Nanos, cost: u64) -> Option<Charged> {
    if cost == 0 {
        return Some(bucket.unchanged());
    }
    bucket.charge_if_room(now, cost)
}

impl<const N: usize> Pace for Limits<N> {
    type Cost = [u64; N];

    /// The latest of the limits' own ready times: each limit, once it has room, keeps it until
    /// something is charged, so that is exactly the first instant all have room.
    #[inline]
    fn earliest(&self, since: Nanos, cost: [u64; N]) -> Nanos {
        let mut at = since.max(self.paused_until);
        for l in &self.limits {
            let c = cost[l.dim];
            if c > 0 {
                at = at.max(l.rule.earliest(since, c));
            }
        }
        at
    }

    #[inline]
    fn commit(&mut self, now: Nanos, _: Nanos, cost: [u64; N]) {
        for l in &mut self.limits {
            let c = cost[l.dim];
            if c > 0 {
                l.rule.commit(now, c);
            }
        }
    }

    /// `earliest` then `commit`; a grant checks and charges each limit once.
    #[inline]
    fn offer(&mut self, now: Nanos, cost: [u64; N]) -> Decision {
        if self.charge_if_room(now, cost) {
            return Decision::Go;
        }
        self.offer_slow(now, cost)
    }

    /// A grant of a cost above a bucket's burst is never found in `charge_if_room`: what it
    /// grants needs no wait.
    #[inline]
    fn try_offer(&mut self, now: Nanos, cost: [u64; N]) -> Decision {
        if self.charge_if_room(now, cost) {
            return Decision::Go;
        }
        if self.needs_wait(cost) {
            return Decision::NotUntil(Nanos::MAX);
        }
        self.offer_slow(now, cost)
    }

    fn needs_wait(&self, cost: [u64; N]) -> bool {
        self.limits
            .iter()
            .any(|l| matches!(&l.rule, Rule::Bucket(b) if cost[l.dim] > b.burst()))
    }

    /// Every bucket that is charged absorbs it (a fixed window's boundaries do not move).
    fn absorbs(&self, cost: [u64; N], late: Nanos) -> bool {
        self.limits.iter().all(|l| match &l.rule {
            Rule::Bucket(b) => cost[l.dim] == 0 || b.absorbs(cost[l.dim], late),
            Rule::Window(_) => true,
        })
    }

    fn same(&self, other: &Self) -> bool {
        self == other
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Requests (dimension 0) in a bucket of `requests_burst`, one per 100 ns; tokens
    /// (dimension 1) in a bucket of `tokens_burst` refilled `tokens` per 1_000 ns, and in a
    /// fixed window of `window` per 3_000 ns starting at `phase`.
    fn requests_and_tokens(
        requests_burst: u64,
        tokens: u64,
        tokens_burst: u64,
        window: u64,
        phase: u64,
    ) -> Limits<2> {
        Limits::new(vec![
            Tagged {
                dim: 0,
                rule: Rule::Bucket(Bucket::new(1, 100, requests_burst)),
            },
            Tagged {
                dim: 1,
                rule: Rule::Bucket(Bucket::new(tokens, 1_000, tokens_burst)),
            },
            Tagged {
                dim: 1,
                rule: Rule::Window(FixedWindow::new(window, Nanos(3_000), Nanos(phase))),
            },
        ])
    }

    /// Requests: burst 2; tokens: 10 per 1_000 ns, burst 10, and 15 per window.
    fn two() -> Limits<2> {
        requests_and_tokens(2, 10, 10, 15, 0)
    }

    #[test]
    fn a_request_waits_for_the_latest_limit() {
        let mut l = two();
        assert_eq!(l.earliest(Nanos(0), [1, 10]), Nanos(0));
        l.commit(Nanos(0), Nanos(0), [1, 10]);
        assert_eq!(l.available(Nanos(0)), [1, 0]);
        // Requests allow one more now, tokens only at 500 (5 tokens).
        assert_eq!(l.earliest(Nanos(0), [1, 5]), Nanos(500));
        assert_eq!(l.earliest(Nanos(0), [1, 0]), Nanos(0));
        l.commit(Nanos(500), Nanos(0), [1, 5]);
        // The fixed window holds 0 more until 3_000.
        assert_eq!(l.earliest(Nanos(500), [1, 1]), Nanos(3_000));
        assert_eq!(l.earliest(Nanos(500), [2, 0]), Nanos(600));
    }

    #[test]
    fn settling_gives_back_and_charges_debt() {
        let mut l = two();
        l.commit(Nanos(0), Nanos(0), [1, 10]);
        assert!(l.settle(Nanos(10), Nanos(0), [1, 10], [1, 4]));
        // The bucket is back to 6 (+ what flowed in), the window to 11 left.
        assert_eq!(l.available(Nanos(10)), [1, 6]);
        assert!(!l.settle(Nanos(10), Nanos(0), [1, 4], [1, 24]));
        // 20 tokens owed beyond an empty bucket: the next token at 2_010 + 100.
        assert_eq!(l.earliest(Nanos(10), [0, 1]), Nanos(3_000));
        assert_eq!(l.available(Nanos(2_900)), [2, 0]);
    }

    #[test]
    fn a_cost_above_the_burst_gets_back_only_what_the_bucket_gave() {
        let mut l = Limits::<1>::new(vec![Tagged {
            dim: 0,
            rule: Rule::Bucket(Bucket::new(1, 100, 10)),
        }]);
        // 15 of a bucket of 10: full at 0, then 5 more by 500.
        assert_eq!(l.earliest(Nanos(0), [15]), Nanos(500));
        l.commit(Nanos(500), Nanos(0), [15]);
        assert_eq!(l.available(Nanos(500)), [0]);
        // It used 3: the bucket gave 10, so 7 come back, not 12.
        assert!(l.settle(Nanos(500), Nanos(500), [15], [3]));
        assert_eq!(l.available(Nanos(500)), [7]);
        // Above the burst both ways: nothing comes back.
        let mut full = l;
        full.commit(Nanos(2_000), Nanos(2_000), [12]);
        assert!(!full.settle(Nanos(2_000), Nanos(2_000), [12], [11]));
    }

    #[test]
    fn a_window_is_as_new_once_nothing_is_charged_or_carried() {
        let mut w = FixedWindow::new(10, Nanos(1_000), Nanos(250));
        assert_eq!(w.as_new_at(), Nanos::ZERO);
        w.commit(Nanos(300), 4);
        // Charged in the window [250, 1_250): as new at the next boundary.
        assert_eq!(w.as_new_at(), Nanos(1_250));
        w.refund(Nanos(400), Nanos(300), 4);
        // Everything given back: as new at once.
        assert_eq!(w.as_new_at(), Nanos::ZERO);
        // 25 in one window carries 15 into the next two.
        w.commit(Nanos(1_300), 25);
        assert_eq!(w.as_new_at(), Nanos(4_250));
    }

    #[test]
    fn limits_are_as_new_when_the_last_of_them_is() {
        let mut l = two();
        assert_eq!(l.as_new_at(), Nanos::ZERO);
        l.commit(Nanos(0), Nanos(0), [2, 5]);
        // Requests full at 200, tokens' bucket at 500, the window at 3_000.
        assert_eq!(l.as_new_at(), Nanos(3_000));
        let mut requests_only = two();
        requests_only.commit(Nanos(100), Nanos(100), [1, 0]);
        assert_eq!(requests_only.as_new_at(), Nanos(200));
        requests_only.pause_until(Nanos(900));
        assert_eq!(requests_only.as_new_at(), Nanos(900));
    }

    #[test]
    fn applying_limits_keeps_levels() {
        let mut l = two();
        l.commit(Nanos(0), Nanos(0), [2, 10]);
        let mut wider = requests_and_tokens(5, 20, 10, 30, 0);
        l.apply(Nanos(0), &wider);
        // Requests: still 0 of 5; tokens: the bucket still empty, the window 20 of 30 left.
        assert_eq!(l.available(Nanos(0)), [0, 0]);
        assert_eq!(l.available(Nanos(500)), [5, 10]);
        // The same limits again: nothing changes.
        let before = l.clone();
        wider.commit(Nanos(0), Nanos(0), [1, 1]);
        l.apply(Nanos(0), &wider);
        assert_eq!(l, before);
    }

    /// A grant, a settle or a wait, on a set of limits and on a fresh copy of their
    /// configuration taken once the limits say they are as new.
    #[derive(Clone, Debug)]
    enum Step {
        Advance(u64),
        Acquire([u64; 2]),
        Settle([u64; 2]),
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        prop::collection::vec(
            prop_oneof![
                2 => (0u64..2_000).prop_map(Step::Advance),
                3 => (0u64..4, 0u64..30).prop_map(|(r, t)| Step::Acquire([r, t])),
                2 => (0u64..4, 0u64..30).prop_map(|(r, t)| Step::Settle([r, t])),
            ],
            1..40,
        )
    }

    /// Runs `steps` on `l` from `now`; returns the answers (every wait, every level).
    fn run(l: &mut Limits<2>, mut now: u64, steps: &[Step]) -> Vec<(u64, [u64; 2])> {
        let mut last: Option<(Nanos, [u64; 2])> = None;
        let mut seen = Vec::new();
        for step in steps {
            match *step {
                Step::Advance(d) => now += d,
                Step::Acquire(cost) => {
                    now = l.earliest(Nanos(now), cost).0;
                    l.commit(Nanos(now), Nanos(now), cost);
                    last = Some((Nanos(now), cost));
                }
                Step::Settle(actual) => {
                    if let Some((at, charged)) = last.take() {
                        l.settle(Nanos(now), at, charged, actual);
                    }
                }
            }
            seen.push((now, l.available(Nanos(now))));
        }
        seen
    }

    /// Something asked of the limits at once, or done to them.
    #[derive(Clone, Debug)]
    enum Ask {
        Advance(u64),
        /// The clock read before another's, which was granted first.
        Back(u64),
        Offer([u64; 2]),
        TryOffer([u64; 2]),
        /// A grant of the first amounts corrected to the second (a refund, a debt).
        Settle([u64; 2], [u64; 2]),
        Pause(u64),
    }

    fn asks() -> impl Strategy<Value = Vec<Ask>> {
        let cost = || (0u64..5, prop_oneof![0u64..30, Just(0)]).prop_map(|(r, t)| [r, t]);
        prop::collection::vec(
            prop_oneof![
                3 => prop_oneof![0u64..300, 0u64..3_000].prop_map(Ask::Advance),
                1 => (0u64..300).prop_map(Ask::Back),
                4 => cost().prop_map(Ask::Offer),
                4 => cost().prop_map(Ask::TryOffer),
                1 => (cost(), cost()).prop_map(|(c, a)| Ask::Settle(c, a)),
                1 => (0u64..2_000).prop_map(Ask::Pause),
            ],
            1..60,
        )
    }

    /// The shapes a quota's limits take, each with a path of its own in `offer`: one bucket,
    /// two, a bucket beside a window, three limits, a window alone.
    fn shape(which: usize, phase: u64) -> Limits<2> {
        let requests = || Tagged {
            dim: 0,
            rule: Rule::Bucket(Bucket::new(1, 100, 3)),
        };
        let tokens = || Tagged {
            dim: 1,
            rule: Rule::Bucket(Bucket::new(10, 1_000, 20)),
        };
        let window = || Tagged {
            dim: 1,
            rule: Rule::Window(FixedWindow::new(25, Nanos(3_000), Nanos(phase))),
        };
        Limits::new(match which {
            0 => vec![tokens()],
            1 => vec![requests(), tokens()],
            2 => vec![tokens(), requests()],
            3 => vec![requests(), window()],
            4 => vec![requests(), tokens(), window()],
            _ => vec![window()],
        })
    }

    proptest! {
        /// A grant asked at once (`offer`, and `try_offer` for `try_acquire`) answers as
        /// `earliest` then `commit` do, and leaves the limits as they leave them, whatever the
        /// shape of the limits: in debt, paused, with costs of 0 and costs above a burst.
        #[test]
        fn a_grant_at_once_is_earliest_then_commit(
            which in 0usize..6,
            phase in 0u64..3_000,
            asks in asks(),
        ) {
            let mut fast = shape(which, phase);
            let mut split = fast.clone();
            let mut now = 0u64;
            for ask in &asks {
                let t = Nanos(now);
                match *ask {
                    Ask::Advance(d) => now += d,
                    Ask::Back(d) => now = now.saturating_sub(d),
                    Ask::Offer(cost) | Ask::TryOffer(cost) => {
                        let expected = if matches!(ask, Ask::TryOffer(_)) && split.needs_wait(cost) {
                            Decision::NotUntil(Nanos::MAX)
                        } else {
                            match split.earliest(t, cost) {
                                at if at <= t => {
                                    split.commit(t, t, cost);
                                    Decision::Go
                                }
                                at => Decision::NotUntil(at),
                            }
                        };
                        let got = match ask {
                            Ask::TryOffer(_) => fast.try_offer(t, cost),
                            _ => fast.offer(t, cost),
                        };
                        prop_assert_eq!(got, expected, "{:?} at {}", ask, now);
                    }
                    Ask::Settle(charged, actual) => {
                        prop_assert_eq!(
                            fast.settle(t, t, charged, actual),
                            split.settle(t, t, charged, actual)
                        );
                    }
                    Ask::Pause(d) => {
                        fast.pause_until(Nanos(now + d));
                        split.pause_until(Nanos(now + d));
                    }
                }
                prop_assert_eq!(&fast, &split, "after {:?} at {}", ask, now);
            }
        }

        /// Forgetting limits the instant they say they are as new (or any time later) changes
        /// nothing: a fresh copy answers every later question as they do.
        #[test]
        fn limits_as_new_answer_as_fresh_ones(
            before in steps(),
            gap in 0u64..3_000,
            after in steps(),
            phase in 0u64..3_000,
        ) {
            let fresh = || requests_and_tokens(3, 10, 20, 25, phase);
            let mut kept = fresh();
            let seen = run(&mut kept, 0, &before);
            let end = seen.last().map_or(0, |s| s.0);
            let at = kept.as_new_at().0.max(end) + gap;
            prop_assert_eq!(kept.available(Nanos(at)), fresh().available(Nanos(at)));
            let mut forgotten = fresh();
            prop_assert_eq!(run(&mut kept, at, &after), run(&mut forgotten, at, &after));
        }
    }
}
