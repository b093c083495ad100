//! The token bucket every rate-based operator uses, as a GCRA over exact rational time.
//!
//! The bucket keeps one number, its *theoretical arrival time* (`tat`): the instant from which
//! it is full again. Its level at `now` is `burst - (tat - now) / token`, so a charge moves `tat`
//! forward by `cost * token` and refilling needs no bookkeeping at all.
//!
//! Time is counted in units of `1 / scale` nanoseconds, with `scale` and `token` the rate's
//! period and token count reduced by their greatest common divisor. One token is then a whole
//! number of units and every comparison is exact integer arithmetic: a deadline is rounded up
//! to the next nanosecond only when it is converted back, so it can be a nanosecond late but
//! never early. Everything saturates; a saturated deadline means "never".

use super::nanos::Nanos;

/// The answer to an offer: go now (and the cost has been charged), or not before a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    Go,
    NotUntil(Nanos),
}

/// A token bucket: capacity `burst`, refilled at `tokens` per `per_nanos`, starting full.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Bucket {
    /// Theoretical arrival time, in time units: the bucket is full from here on.
    tat: u128,
    /// One token's worth of refill time, in time units; zero for a bucket that never binds.
    token: u128,
    /// Time units per nanosecond.
    scale: u64,
    burst: u64,
}

impl Bucket {
    /// A full bucket holding at most `burst` tokens and refilled with `tokens` every
    /// `per_nanos` nanoseconds. `per_nanos == 0` makes a bucket that never binds.
    pub(crate) fn new(tokens: u64, per_nanos: u128, burst: u64) -> Bucket {
        debug_assert!(tokens > 0 && burst > 0);
        let g = gcd(per_nanos, u128::from(tokens));
        // `g` divides `tokens`, so the quotient fits in a u64.
        let scale = (u128::from(tokens) / g) as u64;
        let token = per_nanos / g;
        Bucket {
            tat: 0,
            token,
            scale,
            burst,
        }
    }

    /// A bucket that admits one unit of cost per `interval`, with no burst: the minimum-gap
    /// rule of `min_interval` and `batched_interval`.
    pub(crate) fn interval(interval: Nanos) -> Bucket {
        Bucket::new(1, u128::from(interval.0), 1)
    }

    /// Whether this bucket never delays anything (a zero period), so callers can skip the clock.
    #[inline]
    pub(crate) fn is_unlimited(&self) -> bool {
        self.token == 0
    }

    pub(crate) fn burst(&self) -> u64 {
        self.burst
    }

    #[inline]
    fn units(&self, at: Nanos) -> u128 {
        u128::from(at.0) * u128::from(self.scale)
    }

    #[inline]
    fn tokens(&self, count: u64) -> u128 {
        match u64::try_from(self.token) {
            // The common case, and a widening multiplication that cannot overflow.
            Ok(token) => u128::from(count) * u128::from(token),
            Err(_) => u128::from(count).saturating_mul(self.token),
        }
    }

    /// Takes `cost` tokens if the bucket holds them at `now`; otherwise leaves the bucket as it
    /// is and says when an item of `cost` offered now could go (see [`Bucket::earliest`]).
    #[inline]
    pub(crate) fn offer(&mut self, now: Nanos, cost: u64) -> Decision {
        let now_units = self.units(now);
        if let Some(spare) = self
            .burst
            .checked_sub(cost)
            .filter(|_| !self.saturated(cost))
        {
            // Conforms when the level, burst - (tat - now) / token, is at least cost: when tat
            // runs ahead of now by no more than the spare tokens. (Comparing differences, not
            // sums, so that saturation cannot make both sides equal.)
            if self.tat.saturating_sub(now_units) <= self.tokens(spare) {
                self.tat = self.tat.max(now_units).saturating_add(self.tokens(cost));
                return Decision::Go;
            }
        }
        match self.earliest(now, cost) {
            at if at <= now => {
                self.commit(now, cost);
                Decision::Go
            }
            at => Decision::NotUntil(at),
        }
    }

    /// The earliest instant an item of `cost` offered at `now` may leave; any value `<= now`
    /// means "at once".
    ///
    /// An item that fits in the bucket (`cost <= burst`) may leave when the bucket holds `cost`
    /// tokens. A dearer item waits until the bucket is full *and* the remaining `cost - burst`
    /// tokens have flowed in, counting from the later of `now` and the moment it is full: it
    /// pays its debt before it passes.
    pub(crate) fn earliest(&self, now: Nanos, cost: u64) -> Nanos {
        if self.saturated(cost) {
            return Nanos::MAX;
        }
        let now_units = self.units(now);
        let at = match self.burst.checked_sub(cost) {
            Some(spare) => self.tat.saturating_sub(self.tokens(spare)),
            None => self
                .tat
                .max(now_units)
                .saturating_add(self.tokens(cost - self.burst)),
        };
        if at <= now_units {
            now
        } else {
            Nanos::ceil_div(at, self.scale)
        }
    }

    /// Whether `tat` has saturated: the bucket is then infinitely in arrears (its true `tat`
    /// does not fit in 128 bits), so nothing but a zero cost ever conforms again. Without this,
    /// a saturated tolerance could match the saturated `tat` and let everything through.
    #[inline]
    fn saturated(&self, cost: u64) -> bool {
        self.tat == u128::MAX && cost > 0
    }

    /// Charges an item of `cost` emitted at `now`, which must be no earlier than
    /// [`Bucket::earliest`] allowed. An item dearer than the bucket has paid the excess while
    /// it waited, so it leaves the bucket empty rather than in debt.
    pub(crate) fn commit(&mut self, now: Nanos, cost: u64) {
        let charge = self.tokens(cost.min(self.burst));
        self.tat = self.tat.max(self.units(now)).saturating_add(charge);
    }
}

impl Bucket {
    /// When the bucket is full again, if nothing more is taken: from then on it is
    /// indistinguishable from a new one. `Nanos::MAX` for a saturated bucket (never).
    pub(crate) fn full_at(&self) -> Nanos {
        Nanos::ceil_div(self.tat, self.scale)
    }

    /// The whole tokens the bucket holds at `now`.
    pub(crate) fn available(&self, now: Nanos) -> u64 {
        if self.token == 0 {
            return self.burst;
        }
        let ahead = self.tat.saturating_sub(self.units(now));
        let owed = ahead.div_ceil(self.token);
        self.burst
            .saturating_sub(u64::try_from(owed).unwrap_or(u64::MAX))
    }

    /// Refills at `tokens` per `per_nanos` from `now` on. The level at `now`, in tokens, is kept:
    /// what the bucket holds, or what a waiting request still lacks.
    pub(crate) fn set_rate(&mut self, now: Nanos, tokens: u64, per_nanos: u128) {
        let ahead = self.tat.saturating_sub(self.units(now));
        let mut new = Bucket::new(tokens, per_nanos, self.burst);
        // `ahead / token` tokens are missing; the same number in the new rate's units,
        // rounded up so that nothing is granted early.
        let ahead = if self.token == 0 {
            0
        } else {
            mul_div_ceil(ahead, new.token, self.token)
        };
        new.tat = new.units(now).saturating_add(ahead);
        *self = new;
    }

    /// Holds at most `burst` tokens from `now` on, keeping the level at `now` (capped at the
    /// new `burst`).
    pub(crate) fn set_burst(&mut self, now: Nanos, burst: u64) {
        debug_assert!(burst > 0);
        let now_units = self.units(now);
        let full_at = self.tat.max(now_units);
        self.tat = if burst >= self.burst {
            full_at.saturating_add(self.tokens(burst - self.burst))
        } else {
            full_at
                .saturating_sub(self.tokens(self.burst - burst))
                .max(now_units)
        };
        self.burst = burst;
    }
}

/// The bucket's arithmetic in 64 bits, over a `tat` kept elsewhere as one `u64` *word*: the
/// lock-free path of a shared limiter, which swaps that word with one compare-and-swap.
///
/// A word is `tat` in time units plus `offset`, so that a limiter can change its rate (and
/// with it the unit) and still hand out words that only ever grow: a compare-and-swap that
/// read a word under the old rate can then never succeed under the new one. Every step is
/// checked; whatever does not fit in 64 bits (or a cost above the burst, which must queue)
/// answers `None`, and the caller asks the exact [`Bucket`] instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Packed {
    pub(crate) token: u64,
    pub(crate) scale: u64,
    pub(crate) burst: u64,
    pub(crate) offset: u64,
}

impl Packed {
    /// The parameters of `bucket`, if its token fits in 64 bits, with words offset by `offset`.
    pub(crate) fn of(bucket: &Bucket, offset: u64) -> Option<Packed> {
        Some(Packed {
            token: u64::try_from(bucket.token).ok()?,
            scale: bucket.scale,
            burst: bucket.burst,
            offset,
        })
    }

    /// The word of `bucket`'s `tat`, if it fits below `limit`.
    pub(crate) fn word(&self, bucket: &Bucket, limit: u64) -> Option<u64> {
        let word = bucket.tat.checked_add(u128::from(self.offset))?;
        u64::try_from(word).ok().filter(|&w| w < limit)
    }

    /// The bucket's `tat` in time units, from a word made by [`Packed::word`] or
    /// [`Packed::offer`].
    pub(crate) fn tat(&self, word: u64) -> u128 {
        u128::from(word.saturating_sub(self.offset))
    }

    /// Writes the `tat` a word holds back into `bucket`, whose parameters these are.
    pub(crate) fn restore(&self, bucket: &mut Bucket, word: u64) {
        debug_assert_eq!(Packed::of(bucket, self.offset), Some(*self));
        bucket.tat = self.tat(word);
    }

    /// [`Bucket::offer`] on the word: `Some(Ok(new word))` if an item of `cost` conforms at
    /// `now` (the new word is below `limit`), `Some(Err(at))` if it may not go before `at`,
    /// `None` if the answer needs more than 64 bits or the item must queue (`cost > burst`).
    pub(crate) fn offer(
        &self,
        word: u64,
        now: Nanos,
        cost: u64,
        limit: u64,
    ) -> Option<Result<u64, Nanos>> {
        let spare = self.burst.checked_sub(cost)?;
        let now = now.0.checked_mul(self.scale)?.checked_add(self.offset)?;
        let tolerance = spare.checked_mul(self.token)?;
        if word.saturating_sub(now) <= tolerance {
            let charge = cost.checked_mul(self.token)?;
            let next = word.max(now).checked_add(charge)?;
            return (next < limit).then_some(Ok(next));
        }
        // `word - tolerance > now >= offset`: the time the bucket holds `cost` again.
        let at = word - tolerance - self.offset;
        Some(Err(Nanos(at.div_ceil(self.scale))))
    }
}

/// `ceil(a * b / c)`, saturating; when `a * b` overflows, computed in two exact steps.
fn mul_div_ceil(a: u128, b: u128, c: u128) -> u128 {
    match a.checked_mul(b) {
        Some(product) => product.div_ceil(c),
        None => (a / c)
            .saturating_mul(b)
            .saturating_add((a % c).saturating_mul(b).div_ceil(c)),
    }
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;
    const SEC: u128 = 1_000_000_000;

    /// Offers `costs` back to back, each as soon as the previous one left, and returns the
    /// emission times in milliseconds.
    fn schedule(bucket: &mut Bucket, costs: &[u64]) -> Vec<u64> {
        let mut now = Nanos::ZERO;
        costs
            .iter()
            .map(|&cost| {
                now = now.max(bucket.earliest(now, cost));
                bucket.commit(now, cost);
                now.0 / MS
            })
            .collect()
    }

    #[test]
    fn one_per_second() {
        let mut b = Bucket::new(1, SEC, 1);
        assert_eq!(schedule(&mut b, &[1; 5]), [0, 1000, 2000, 3000, 4000]);
    }

    #[test]
    fn burst_then_steady() {
        let mut b = Bucket::new(10, SEC, 5);
        let expected = [0, 0, 0, 0, 0, 100, 200, 300, 400, 500, 600, 700];
        assert_eq!(schedule(&mut b, &[1; 12]), expected);
    }

    #[test]
    fn dear_item_pays_its_debt_first() {
        let mut b = Bucket::new(10, SEC, 5);
        assert_eq!(schedule(&mut b, &[5, 10, 1]), [0, 1000, 1100]);
    }

    #[test]
    fn dear_item_counts_from_arrival_when_already_full() {
        let b = Bucket::new(10, SEC, 5);
        let now = Nanos(7_000 * MS);
        assert_eq!(b.earliest(now, 8), Nanos(7_300 * MS));
    }

    fn exact_times(bucket: &mut Bucket, n: usize) -> Vec<u64> {
        let mut now = Nanos::ZERO;
        (0..n)
            .map(|_| {
                now = now.max(bucket.earliest(now, 1));
                bucket.commit(now, 1);
                now.0
            })
            .collect()
    }

    #[test]
    fn fractional_interval_is_never_early_and_does_not_drift() {
        // 3 per second: one token every 333_333_333.3 ns. With room for the rounding
        // nanosecond in the bucket, deadlines stay on the exact grid.
        let mut b = Bucket::new(3, SEC, 2);
        let expected = [0, 0, 333_333_334, 666_666_667, 1_000_000_000];
        assert_eq!(exact_times(&mut b, 5), expected);
    }

    #[test]
    fn a_bucket_of_one_loses_the_refill_of_late_emissions() {
        // A full bucket of one cannot store the refill of the nanosecond an item left late,
        // like any other lateness: the next gap counts from the actual emission.
        let mut b = Bucket::new(3, SEC, 1);
        let expected = [0, 333_333_334, 666_666_668, 1_000_000_002];
        assert_eq!(exact_times(&mut b, 4), expected);
    }

    #[test]
    fn refill_stops_at_burst() {
        let mut b = Bucket::new(10, SEC, 2);
        b.commit(Nanos::ZERO, 2);
        // An hour idle refills two tokens, not 36,000.
        let later = Nanos(3_600_000 * MS);
        assert_eq!(schedule_from(&mut b, later, &[1, 1, 1]), [0, 0, 100]);
    }

    fn schedule_from(bucket: &mut Bucket, start: Nanos, costs: &[u64]) -> Vec<u64> {
        let mut now = start;
        costs
            .iter()
            .map(|&cost| {
                now = now.max(bucket.earliest(now, cost));
                bucket.commit(now, cost);
                (now.0 - start.0) / MS
            })
            .collect()
    }

    #[test]
    fn zero_cost_always_passes() {
        let mut b = Bucket::new(1, SEC, 1);
        b.commit(Nanos::ZERO, 1);
        assert_eq!(b.earliest(Nanos::ZERO, 0), Nanos::ZERO);
        let dear = b.earliest(Nanos::ZERO, 7);
        assert_eq!(dear, Nanos(7 * SEC as u64));
        b.commit(dear, 7);
        assert_eq!(b.earliest(dear, 0), dear);
    }

    #[test]
    fn zero_interval_never_binds() {
        let mut b = Bucket::interval(Nanos::ZERO);
        assert!(b.is_unlimited());
        for _ in 0..10 {
            assert_eq!(b.earliest(Nanos(5), u64::MAX), Nanos(5));
            b.commit(Nanos(5), u64::MAX);
        }
    }

    #[test]
    fn huge_values_saturate_to_never() {
        let mut b = Bucket::new(1, u128::from(u64::MAX) * SEC, 1);
        b.commit(Nanos::ZERO, 1);
        assert_eq!(b.earliest(Nanos::ZERO, 1), Nanos::MAX);

        let b = Bucket::new(10, SEC, 5);
        assert_eq!(b.earliest(Nanos::ZERO, u64::MAX), Nanos::MAX);

        let mut b = Bucket::new(u64::MAX, Duration::MAX.as_nanos(), u64::MAX);
        b.commit(Nanos::MAX, u64::MAX);
        assert_eq!(b.earliest(Nanos::MAX, u64::MAX), Nanos::MAX);
    }

    #[test]
    fn offer_saturates_to_never_too() {
        // burst * token overflows u128: a saturated sum on both sides must not read as "fits".
        let mut b = Bucket::new(1, Duration::MAX.as_nanos(), u64::MAX);
        assert_eq!(b.offer(Nanos::ZERO, u64::MAX), Decision::Go);
        assert_eq!(
            b.offer(Nanos::ZERO, u64::MAX),
            Decision::NotUntil(Nanos::MAX)
        );
        assert_eq!(
            b.offer(Nanos(1 << 60), 1 << 60),
            Decision::NotUntil(Nanos::MAX)
        );
        let mut b = Bucket::new(1, u128::from(1u64 << 40) * SEC, 1 << 60);
        assert_eq!(b.offer(Nanos::ZERO, 1 << 60), Decision::Go);
        assert_eq!(
            b.offer(Nanos::ZERO, 1 << 60),
            Decision::NotUntil(Nanos::MAX)
        );
    }

    use std::time::Duration;

    /// The obviously correct bucket: a level in units of `1 / per_nanos` tokens, refilled one
    /// nanosecond's worth (`tokens` units) at a time, capped at `burst` tokens.
    struct Naive {
        tokens: u128,
        per: u128,
        burst: u128,
        level: u128,
        at: u128,
    }

    impl Naive {
        fn level_at(&self, now: u128) -> u128 {
            let cap = self.burst * self.per;
            (self.level + (now - self.at) * self.tokens).min(cap)
        }

        /// Emission time of an item of `cost` offered at `now`.
        fn offer(&mut self, now: u128, cost: u128) -> u128 {
            let level = self.level_at(now);
            let need = cost * self.per;
            if cost <= self.burst {
                let when = if level >= need {
                    now
                } else {
                    now + (need - level).div_ceil(self.tokens)
                };
                self.level = self.level_at(when) - need;
                self.at = when;
                when
            } else {
                // Uncapped refill from `level` up to `need`, then empty.
                let when = now + (need - level).div_ceil(self.tokens);
                self.level = 0;
                self.at = when;
                when
            }
        }
    }

    #[test]
    fn offer_charges_only_what_goes() {
        let mut b = Bucket::new(10, SEC, 2);
        assert_eq!(b.offer(Nanos::ZERO, 2), Decision::Go);
        assert_eq!(b.offer(Nanos::ZERO, 1), Decision::NotUntil(Nanos(100 * MS)));
        // The refusal took nothing: the same answer again, and a go at that time.
        assert_eq!(
            b.offer(Nanos(50 * MS), 1),
            Decision::NotUntil(Nanos(100 * MS))
        );
        assert_eq!(b.offer(Nanos(100 * MS), 1), Decision::Go);
        // A dear item waits for a full bucket (300 ms) and its one extra token.
        assert_eq!(
            b.offer(Nanos(100 * MS), 3),
            Decision::NotUntil(Nanos(400 * MS))
        );
    }

    #[test]
    fn raising_the_rate_keeps_what_is_owed() {
        // The example: 1/s, one token owed, raised to 100/s after 0.1 s: the waiter,
        // 0.9 token short, is served 9 ms later.
        let mut b = Bucket::new(1, SEC, 1);
        b.commit(Nanos::ZERO, 1);
        let now = Nanos(100 * MS);
        assert_eq!(b.earliest(now, 1), Nanos(1_000 * MS));
        b.set_rate(now, 100, SEC);
        assert_eq!(b.earliest(now, 1), Nanos(109 * MS));
    }

    #[test]
    fn halving_the_rate_doubles_what_is_owed() {
        let mut b = Bucket::new(10, SEC, 5);
        b.commit(Nanos::ZERO, 5);
        b.set_rate(Nanos::ZERO, 5, SEC);
        assert_eq!(b.available(Nanos(200 * MS)), 1);
        assert_eq!(b.earliest(Nanos::ZERO, 5), Nanos(1_000 * MS));
        // A full bucket stays full.
        let mut full = Bucket::new(10, SEC, 5);
        full.set_rate(Nanos(7 * MS), 1, SEC);
        assert_eq!(full.available(Nanos(7 * MS)), 5);
    }

    #[test]
    fn set_rate_to_a_fraction_rounds_late() {
        let mut b = Bucket::new(1, SEC, 1);
        b.commit(Nanos::ZERO, 1);
        // 0.5 token owed at 3/s: 166_666_666.7 ns, rounded up.
        b.set_rate(Nanos(500 * MS), 3, SEC);
        assert_eq!(b.earliest(Nanos(500 * MS), 1), Nanos(666_666_667));
    }

    #[test]
    fn set_burst_keeps_the_level() {
        let mut b = Bucket::new(10, SEC, 4);
        b.commit(Nanos::ZERO, 3); // level 1
        b.set_burst(Nanos::ZERO, 8);
        assert_eq!(b.available(Nanos::ZERO), 1);
        assert_eq!(b.available(Nanos(700 * MS)), 8);
        b.set_burst(Nanos(700 * MS), 2); // level 8, capped at 2
        assert_eq!(b.available(Nanos(700 * MS)), 2);
        b.commit(Nanos(700 * MS), 2);
        b.set_burst(Nanos(700 * MS), 1); // level 0 stays 0
        assert_eq!(b.available(Nanos(700 * MS)), 0);
        assert_eq!(b.earliest(Nanos(700 * MS), 1), Nanos(800 * MS));
    }

    #[test]
    fn full_at_is_when_the_bucket_is_full_again() {
        let mut b = Bucket::new(3, SEC, 2);
        assert_eq!(b.full_at(), Nanos::ZERO);
        b.commit(Nanos(10), 1);
        // One token of 333_333_333.3 ns owed from 10 ns on, rounded up.
        assert_eq!(b.full_at(), Nanos(333_333_344));
        assert_eq!(b.available(Nanos(333_333_343)), 1);
        assert_eq!(b.available(b.full_at()), 2);
        let mut saturated = Bucket::new(1, Duration::MAX.as_nanos(), u64::MAX);
        saturated.commit(Nanos::ZERO, u64::MAX);
        saturated.commit(Nanos::ZERO, u64::MAX);
        assert_eq!(saturated.full_at(), Nanos::MAX);
    }

    #[test]
    fn available_counts_whole_tokens() {
        let mut b = Bucket::new(10, SEC, 5);
        assert_eq!(b.available(Nanos::ZERO), 5);
        b.commit(Nanos::ZERO, 5);
        assert_eq!(b.available(Nanos(99 * MS)), 0);
        assert_eq!(b.available(Nanos(100 * MS)), 1);
        assert_eq!(b.available(Nanos(10_000 * MS)), 5);
    }

    #[test]
    fn mul_div_ceil_is_exact_or_saturates() {
        assert_eq!(mul_div_ceil(7, 3, 2), 11);
        assert_eq!(mul_div_ceil(u128::MAX, 2, 4), u128::MAX / 2 + 1);
        assert_eq!(mul_div_ceil(u128::MAX, u128::MAX, 1), u128::MAX);
    }

    #[test]
    fn packed_declines_what_does_not_fit() {
        let b = Bucket::new(1, u128::from(u64::MAX) + 1, 1);
        assert_eq!(Packed::of(&b, 0), None);
        let p = Packed::of(&Bucket::new(10, SEC, 5), 0).unwrap();
        assert_eq!(p.offer(0, Nanos::ZERO, 6, u64::MAX), None);
        assert_eq!(p.offer(0, Nanos(u64::MAX), 1, u64::MAX), None);
        // The new word would reach the limit.
        assert_eq!(p.offer(0, Nanos::ZERO, 1, 100 * MS), None);
        assert_eq!(p.offer(0, Nanos::ZERO, 1, 100 * MS + 1), Some(Ok(100 * MS)));
    }

    #[test]
    fn packed_words_carry_the_offset() {
        let mut b = Bucket::new(3, SEC, 2);
        b.commit(Nanos(5), 2);
        let p = Packed::of(&b, 1_000).unwrap();
        let word = p.word(&b, u64::MAX).unwrap();
        assert_eq!(p.tat(word), b.tat);
        assert_eq!(word, u64::try_from(b.tat).unwrap() + 1_000);
        assert_eq!(p.word(&b, word), None);
    }

    proptest! {
        /// The 64-bit arithmetic agrees with the exact bucket wherever it answers, whatever
        /// the offset.
        #[test]
        fn packed_agrees_with_the_bucket(
            tokens in 1u64..1_000_000,
            per in 1u128..5_000_000_000,
            burst in 1u64..1_000,
            offset in 0u64..1 << 40,
            offers in prop::collection::vec((0u64..3_000_000_000, 0u64..40), 1..60),
        ) {
            let mut exact = Bucket::new(tokens, per, burst);
            let packed = Packed::of(&exact, offset).unwrap();
            let mut word = packed.word(&exact, u64::MAX).unwrap();
            let mut now = 0u64;
            for (gap, cost) in offers {
                now += gap;
                let expected = exact.offer(Nanos(now), cost);
                match packed.offer(word, Nanos(now), cost, u64::MAX) {
                    Some(Ok(next)) => {
                        prop_assert_eq!(expected, Decision::Go);
                        word = next;
                    }
                    Some(Err(at)) => prop_assert_eq!(expected, Decision::NotUntil(at)),
                    None => prop_assert!(cost > burst, "declined a cost within the burst"),
                }
                if cost <= burst {
                    prop_assert_eq!(packed.tat(word), exact.tat);
                } else {
                    // The exact bucket may have let a dear item through; follow it.
                    word = packed.word(&exact, u64::MAX).unwrap();
                }
            }
        }

        /// `offer` is `earliest` then `commit`, in one step.
        #[test]
        fn offer_agrees_with_earliest_and_commit(
            tokens in 1u64..50,
            per in 1u128..5_000_000_000,
            burst in 1u64..20,
            offers in prop::collection::vec((0u64..3_000_000_000, 0u64..40), 1..60),
        ) {
            let mut fused = Bucket::new(tokens, per, burst);
            let mut split = fused.clone();
            let mut now = 0u64;
            for (gap, cost) in offers {
                now += gap;
                let at = split.earliest(Nanos(now), cost);
                let expected = if at <= Nanos(now) {
                    split.commit(Nanos(now), cost);
                    Decision::Go
                } else {
                    Decision::NotUntil(at)
                };
                prop_assert_eq!(fused.offer(Nanos(now), cost), expected);
                prop_assert_eq!(fused.tat, split.tat);
            }
        }

        /// The GCRA agrees exactly with the naive bucket on random offers.
        #[test]
        fn agrees_with_naive_model(
            tokens in 1u64..50,
            per_ms in 1u64..2_000,
            burst in 1u64..20,
            offers in prop::collection::vec((0u64..3_000_000_000, 0u64..40), 1..60),
        ) {
            let per = u128::from(per_ms) * 1_000_000 + 7;
            let mut gcra = Bucket::new(tokens, per, burst);
            let mut naive = Naive {
                tokens: u128::from(tokens),
                per,
                burst: u128::from(burst),
                level: u128::from(burst) * per,
                at: 0,
            };
            let mut now = 0u64;
            for (gap, cost) in offers {
                now += gap;
                let expected = naive.offer(u128::from(now), u128::from(cost));
                let got = Nanos(now).max(gcra.earliest(Nanos(now), cost));
                gcra.commit(got, cost);
                prop_assert_eq!(u128::from(got.0), expected);
                now = got.0;
            }
        }
    }
}
