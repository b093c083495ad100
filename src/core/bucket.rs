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
//! never early.
//!
//! `tat` is exact over the whole range of rates and bursts: it is at most `now + burst *
//! token`, below 2^160 units (`now * scale` is below 2^128 and `burst * token` below 2^158), so
//! it is kept in 160 bits: the low 128 in a field of their own, the high 32 above the 96 bits
//! that any token needs. The common case (a token of at most 64 bits and a `tat` below 2^128)
//! is told by one check and computed in 128 bits; the rest is the same arithmetic in 256 bits.
//! The level is never below zero (a cost above the burst pays its debt by waiting, then
//! leaves the bucket empty), so a change of rate or burst keeps it within `0..=burst`. Only
//! `commit` without the wait `earliest` asks for could push `tat` past 2^160; it then
//! saturates, and a saturated bucket is empty and never refills, never full.

use std::fmt;

use super::nanos::Nanos;
use crate::error::ConfigError;
use crate::rate::Rate;

/// The answer to an offer: go now (and the cost has been charged), or not before a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    Go,
    NotUntil(Nanos),
}

/// A charge computed by [`Bucket::charge_if_room`]: `tat`'s new low 128 bits, and whether it
/// carried into the high bits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Charged {
    tat: u128,
    carry: bool,
}

/// The bits of `Bucket::token_high` that hold the token: every period in nanoseconds is below
/// 2^94 (`Duration::MAX` is about 1.8e28 ns).
const TOKEN_BITS: u32 = 96;
const TOKEN_MASK: u128 = (1 << TOKEN_BITS) - 1;
/// The bits of `tat` above its low 128 (the rest of `token_high`).
const HIGH_BITS: u32 = 128 - TOKEN_BITS;

/// A token bucket: capacity `burst`, refilled at `tokens` per `per_nanos`, starting full.
///
/// Aligned to 8 bytes, not to `u128`'s 16 (`packed(8)`; the fields are only ever read and
/// written whole, by value): a stream adapter holding a bucket beside 8-byte fields would
/// otherwise be padded to a multiple of 16, and a `min_interval` or `throttle` task would go
/// from tokio's 256-byte step to the 384-byte one.
#[derive(Clone, PartialEq, Eq)]
#[repr(C, packed(8))]
pub(crate) struct Bucket {
    /// Theoretical arrival time, in time units: the bucket is full from here on. Its low 128
    /// bits; the rest are in `token_high`.
    tat: u128,
    /// One token's worth of refill time, in time units (zero for a bucket that never binds), in
    /// the low 96 bits; `tat`'s bits above 128 in the high 32. Sharing the field keeps the
    /// bucket at 48 bytes, and makes "a token of at most 64 bits and a `tat` below 2^128" one
    /// check: that the field fits in a `u64`.
    token_high: u128,
    /// Time units per nanosecond.
    scale: u64,
    burst: u64,
}

impl Bucket {
    /// A full bucket holding at most `burst` tokens and refilled with `tokens` every
    /// `per_nanos` nanoseconds. `per_nanos == 0` makes a bucket that never binds.
    ///
    /// # Panics
    ///
    /// If `per_nanos` is 2^96 or more, far beyond `Duration::MAX`.
    pub(crate) fn new(tokens: u64, per_nanos: u128, burst: u64) -> Bucket {
        debug_assert!(tokens > 0 && burst > 0);
        assert!(per_nanos <= TOKEN_MASK, "a period beyond 2^96 ns");
        let g = gcd(per_nanos, u128::from(tokens));
        // `g` divides `tokens`, so the quotient fits in a u64.
        let scale = (u128::from(tokens) / g) as u64;
        Bucket {
            tat: 0,
            token_high: per_nanos / g,
            scale,
            burst,
        }
    }

    /// A full bucket refilled at `rate`, holding at most `burst` tokens; or
    /// [`ConfigError::ZeroBurst`] for a burst of 0, through which no cost could ever pass.
    pub(crate) fn try_of(rate: Rate, burst: u64) -> Result<Bucket, ConfigError> {
        if burst == 0 {
            return Err(ConfigError::ZeroBurst);
        }
        Ok(Bucket::new(rate.tokens(), rate.per().as_nanos(), burst))
    }

    /// A bucket that admits one unit of cost per `interval`, with no burst: the minimum-gap
    /// rule of `min_interval` and `batched_interval`.
    pub(crate) fn interval(interval: Nanos) -> Bucket {
        Bucket::new(1, u128::from(interval.0), 1)
    }

    /// Whether this bucket never delays anything (a zero period), so callers can skip the clock.
    #[inline]
    pub(crate) fn is_unlimited(&self) -> bool {
        self.token() == 0
    }

    pub(crate) fn burst(&self) -> u64 {
        self.burst
    }

    /// Its refill rate, reduced: `tokens` every `per_nanos` nanoseconds (`per_nanos` is zero
    /// for a bucket that never binds).
    pub(crate) fn rate_parts(&self) -> (u64, u128) {
        (self.scale, self.token())
    }

    #[inline]
    fn units(&self, at: Nanos) -> u128 {
        u128::from(at.0) * u128::from(self.scale)
    }

    #[inline]
    fn token(&self) -> u128 {
        self.token_high & TOKEN_MASK
    }

    /// The whole of `tat`.
    fn tat(&self) -> U256 {
        U256 {
            high: self.token_high >> TOKEN_BITS,
            low: self.tat,
        }
    }

    /// Sets `tat`, saturating at 2^160 - 1.
    fn set_tat(&mut self, tat: U256) {
        let (high, low) = if tat.high >> HIGH_BITS == 0 {
            (tat.high, tat.low)
        } else {
            ((1 << HIGH_BITS) - 1, u128::MAX)
        };
        self.tat = low;
        self.token_high = self.token() | high << TOKEN_BITS;
    }

    /// `count` tokens in time units, exactly.
    fn tokens(&self, count: u64) -> U256 {
        U256::mul(u128::from(count), self.token())
    }

    /// The common case, in which 128 bits do: `cost` within the burst, a token of at most 64
    /// bits and `tat` below 2^128 (the last two told by one check). The spare tokens and the
    /// token, then.
    #[inline]
    fn narrow(&self, cost: u64) -> Option<(u64, u128)> {
        let spare = self.burst.checked_sub(cost)?;
        let token = u64::try_from(self.token_high).ok()?;
        Some((spare, u128::from(token)))
    }

    /// Moves `tat` to `max(tat, now) + cost * token`, in the common case (`narrow`), where
    /// that is below 2^129: a carry goes to the high bits.
    #[inline]
    fn charge_narrow(&mut self, now_units: u128, token: u128, cost: u64) {
        let (tat, carry) = self
            .tat
            .max(now_units)
            .overflowing_add(u128::from(cost) * token);
        self.tat = tat;
        self.token_high = token | u128::from(carry) << TOKEN_BITS;
    }

    /// Takes `cost` tokens if the bucket holds them at `now`; otherwise leaves the bucket as it
    /// is and says when an item of `cost` offered now could go (see [`Bucket::earliest`]).
    #[inline]
    pub(crate) fn offer(&mut self, now: Nanos, cost: u64) -> Decision {
        let Some((spare, token)) = self.narrow(cost) else {
            return self.offer_wide(now, cost);
        };
        let now_units = self.units(now);
        // The time the bucket holds `cost`: when tat runs ahead of it by no more than the
        // spare tokens (the level, burst - (tat - now) / token, is then at least cost).
        let at = self.tat.saturating_sub(u128::from(spare) * token);
        if at <= now_units {
            self.charge_narrow(now_units, token, cost);
            Decision::Go
        } else {
            Decision::NotUntil(Nanos::ceil_div(at, self.scale))
        }
    }

    /// If the bucket holds `cost` tokens at `now`, in the common case (`narrow`), the charge
    /// [`Bucket::commit`] would make then; `None` if it does not, or if the common case cannot
    /// tell (a cost above the burst, more than 128 bits): ask [`Bucket::earliest`]. The check
    /// and the charge share their arithmetic; [`Bucket::apply`] makes the charge.
    #[inline]
    pub(crate) fn charge_if_room(&self, now: Nanos, cost: u64) -> Option<Charged> {
        // `narrow`, with the token as the u64 it is (64-bit products).
        let spare = self.burst.checked_sub(cost)?;
        let token = u64::try_from(self.token_high).ok()?;
        let now_units = self.units(now);
        // The level is at least `cost` when `tat` runs ahead of `now` by no more than the
        // spare tokens; the charge moves `max(tat, now)` on by `cost` tokens.
        let from = match self.tat.checked_sub(now_units) {
            None => now_units,
            Some(ahead) if ahead <= u128::from(spare) * u128::from(token) => self.tat,
            Some(_) => return None,
        };
        let (tat, carry) = from.overflowing_add(u128::from(cost) * u128::from(token));
        Some(Charged { tat, carry })
    }

    /// A charge that changes nothing, for [`Bucket::apply`].
    #[inline]
    pub(crate) fn unchanged(&self) -> Charged {
        Charged {
            tat: self.tat,
            carry: false,
        }
    }

    /// Makes a charge [`Bucket::charge_if_room`] computed, nothing having changed since: what
    /// `charge_narrow` does (in the common case `token_high` is the token alone).
    #[inline]
    pub(crate) fn apply(&mut self, charge: Charged) {
        self.tat = charge.tat;
        if charge.carry {
            self.token_high |= 1 << TOKEN_BITS;
        }
    }

    #[inline(never)]
    fn offer_wide(&mut self, now: Nanos, cost: u64) -> Decision {
        match self.earliest_wide(now, cost) {
            at if at <= now => {
                self.commit_wide(now, cost);
                Decision::Go
            }
            at => Decision::NotUntil(at),
        }
    }

    /// The earliest instant an item of `cost` offered at `now` may leave; any value `<= now`
    /// means "at once", `Nanos::MAX` never (not within the 2^64 ns time can count).
    ///
    /// An item that fits in the bucket (`cost <= burst`) may leave when the bucket holds `cost`
    /// tokens. A dearer item waits until the bucket is full *and* the remaining `cost - burst`
    /// tokens have flowed in, counting from the later of `now` and the moment it is full: it
    /// pays its debt before it passes.
    #[inline]
    pub(crate) fn earliest(&self, now: Nanos, cost: u64) -> Nanos {
        let Some((spare, token)) = self.narrow(cost) else {
            return self.earliest_wide(now, cost);
        };
        let at = self.tat.saturating_sub(u128::from(spare) * token);
        if at <= self.units(now) {
            now
        } else {
            Nanos::ceil_div(at, self.scale)
        }
    }

    /// [`Bucket::earliest`] in 256 bits, for any bucket and cost.
    #[inline(never)]
    fn earliest_wide(&self, now: Nanos, cost: u64) -> Nanos {
        let now_units = U256::from(self.units(now));
        let at = match self.burst.checked_sub(cost) {
            Some(spare) => self.tat().saturating_sub(self.tokens(spare)),
            None => self
                .tat()
                .max(now_units)
                .saturating_add(self.tokens(cost - self.burst)),
        };
        if at <= now_units {
            now
        } else {
            at.ceil_div_nanos(self.scale)
        }
    }

    /// Whether an item of `cost` that waited, emitted up to `late` after [`Bucket::earliest`]
    /// allowed it, leaves every later item's time where it was: the bucket, holding `cost`
    /// tokens at that time, does not fill up meanwhile (its spare tokens, `burst - cost`, take
    /// at least `late` to flow in), so the charge moves `tat` from where it was. At burst 1 (or
    /// a cost equal to the burst, or above it) any lateness moves the next item's time.
    #[inline]
    pub(crate) fn absorbs(&self, cost: u64, late: Nanos) -> bool {
        let Some(spare) = self.burst.checked_sub(cost) else {
            return false;
        };
        // Beyond 128 bits the spare tokens cover any `late` (below 2^128 units).
        // A nanosecond more: `earliest` rounds up to the next nanosecond, which the spare
        // tokens must cover too.
        u128::from(spare)
            .checked_mul(self.token())
            .is_none_or(|room| room >= self.units(late.saturating_add(Nanos(1))))
    }

    /// Charges an item of `cost` emitted at `now`, which must be no earlier than
    /// [`Bucket::earliest`] allowed. An item dearer than the bucket has paid the excess while
    /// it waited, so it leaves the bucket empty rather than in debt.
    #[inline]
    pub(crate) fn commit(&mut self, now: Nanos, cost: u64) {
        match self.narrow(cost) {
            Some((_, token)) => self.charge_narrow(self.units(now), token, cost),
            None => self.commit_wide(now, cost),
        }
    }

    /// [`Bucket::commit`] in 256 bits, for any bucket and cost.
    #[inline(never)]
    fn commit_wide(&mut self, now: Nanos, cost: u64) {
        let tat = self.tat().max(U256::from(self.units(now)));
        self.set_tat(tat.saturating_add(self.tokens(cost.min(self.burst))));
    }
}

impl Bucket {
    /// When the bucket is full again, if nothing more is taken: from then on it is
    /// indistinguishable from a new one. `Nanos::MAX` if not within time (never).
    pub(crate) fn full_at(&self) -> Nanos {
        self.tat().ceil_div_nanos(self.scale)
    }

    /// How far `tat` runs ahead of `now`, in time units: what the bucket lacks to be full.
    fn deficit(&self, now: Nanos) -> U256 {
        self.tat().saturating_sub(U256::from(self.units(now)))
    }

    /// The whole tokens the bucket holds at `now`.
    pub(crate) fn available(&self, now: Nanos) -> u64 {
        let token = self.token();
        if token == 0 {
            return self.burst;
        }
        // The tokens missing, rounded up; more than `burst` only for a saturated bucket.
        let (owed, part) = self.deficit(now).div_rem(token);
        match owed
            .to_u64()
            .and_then(|owed| owed.checked_add(u64::from(part != 0)))
        {
            Some(owed) => self.burst.saturating_sub(owed),
            None => 0,
        }
    }

    /// Refills at `tokens` per `per_nanos` from `now` on. The level at `now`, in tokens, is kept:
    /// what the bucket holds, or what a waiting request still lacks (never below zero).
    pub(crate) fn set_rate(&mut self, now: Nanos, tokens: u64, per_nanos: u128) {
        let mut new = Bucket::new(tokens, per_nanos, self.burst);
        let deficit = match self.token() {
            0 => U256::ZERO,
            old => {
                // `owed + part / old` tokens are missing: the whole ones exactly in the new
                // rate's units, the fraction rounded up so that nothing is granted early.
                let (owed, part) = self.deficit(now).div_rem(old);
                // A debt (a level below zero, charged by `charge_debt`) is kept whole.
                match owed.to_u64() {
                    Some(owed) => new.tokens(owed).saturating_add(U256::from(mul_div_ceil(
                        part,
                        new.token(),
                        old,
                    ))),
                    None => new.tokens(self.burst),
                }
            }
        };
        new.set_tat(U256::from(new.units(now)).saturating_add(deficit));
        *self = new;
    }

    /// Holds at most `burst` tokens from `now` on, keeping the level at `now` (capped at the
    /// new `burst`, and never below zero).
    pub(crate) fn set_burst(&mut self, now: Nanos, burst: u64) {
        debug_assert!(burst > 0);
        let now_units = U256::from(self.units(now));
        let full_at = self.tat().max(now_units);
        let tat = if burst >= self.burst {
            full_at.saturating_add(self.tokens(burst - self.burst))
        } else {
            full_at
                .saturating_sub(self.tokens(self.burst - burst))
                .max(now_units)
        };
        // A debt beyond the old burst (see `charge_debt`) is kept whole.
        let debt = self
            .tat()
            .saturating_sub(now_units.saturating_add(self.tokens(self.burst)));
        self.burst = burst;
        let empty_at = now_units.saturating_add(self.tokens(burst));
        self.set_tat(tat.min(empty_at).saturating_add(debt));
    }

    /// Gives back `amount` tokens at `now` (a grant that cost less than it was charged),
    /// never above a full bucket.
    pub(crate) fn refund(&mut self, now: Nanos, amount: u64) {
        let now_units = U256::from(self.units(now));
        let tat = self.tat();
        if tat > now_units {
            self.set_tat(tat.saturating_sub(self.tokens(amount)).max(now_units));
        }
    }

    /// Charges `amount` more tokens at `now` (a grant that cost more than it was charged): a
    /// use already made, which cannot be refused, so the level may go below zero; later
    /// requests wait until it is paid back.
    pub(crate) fn charge_debt(&mut self, now: Nanos, amount: u64) {
        let tat = self.tat().max(U256::from(self.units(now)));
        self.set_tat(tat.saturating_add(self.tokens(amount)));
    }
}

impl fmt::Debug for Bucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bucket")
            .field("tat", &self.tat())
            .field("token", &self.token())
            .field("scale", &self.scale)
            .field("burst", &self.burst)
            .finish()
    }
}

/// An unsigned 256-bit integer, for the bucket's arithmetic beyond 128 bits (a `tat` of up to
/// 160 bits, a product of two 96-bit numbers). Ordered by value (`high` first).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct U256 {
    high: u128,
    low: u128,
}

impl U256 {
    const ZERO: U256 = U256 { high: 0, low: 0 };
    const MAX: U256 = U256 {
        high: u128::MAX,
        low: u128::MAX,
    };

    /// `a * b`, exactly.
    fn mul(a: u128, b: u128) -> U256 {
        const LOW: u128 = u64::MAX as u128;
        let (a1, a0) = (a >> 64, a & LOW);
        let (b1, b0) = (b >> 64, b & LOW);
        let (low, high) = (a0 * b0, a1 * b1);
        // The two middle products, each below 2^128, and their carry.
        let (mid, carry) = (a0 * b1).overflowing_add(a1 * b0);
        let (low, c) = low.overflowing_add(mid << 64);
        U256 {
            high: high + (mid >> 64) + (u128::from(carry) << 64) + u128::from(c),
            low,
        }
    }

    fn saturating_add(self, other: U256) -> U256 {
        let (low, c) = self.low.overflowing_add(other.low);
        match self
            .high
            .checked_add(other.high)
            .and_then(|h| h.checked_add(u128::from(c)))
        {
            Some(high) => U256 { high, low },
            None => U256::MAX,
        }
    }

    fn saturating_sub(self, other: U256) -> U256 {
        if self <= other {
            return U256::ZERO;
        }
        let (low, borrow) = self.low.overflowing_sub(other.low);
        U256 {
            high: self.high - other.high - u128::from(borrow),
            low,
        }
    }

    fn to_u64(self) -> Option<u64> {
        if self.high == 0 {
            u64::try_from(self.low).ok()
        } else {
            None
        }
    }

    /// The quotient and remainder of a division by `d`, which must be in `1..=2^127`.
    fn div_rem(self, d: u128) -> (U256, u128) {
        if self.high == 0 {
            return (U256::from(self.low / d), self.low % d);
        }
        debug_assert!(d != 0 && d <= 1 << 127);
        let high = self.high / d;
        let mut rem = self.high % d;
        let mut low = 0;
        // Long division of the low half, one bit at a time: `rem < d <= 2^127` never
        // overflows when shifted.
        for bit in (0..128).rev() {
            rem = rem << 1 | (self.low >> bit & 1);
            if rem >= d {
                rem -= d;
                low |= 1 << bit;
            }
        }
        (U256 { high, low }, rem)
    }

    /// `ceil(self / scale)` nanoseconds; `Nanos::MAX` if that does not fit (never).
    fn ceil_div_nanos(self, scale: u64) -> Nanos {
        // At least 2^128 / 2^64 nanoseconds otherwise: beyond time.
        if self.high == 0 {
            Nanos::ceil_div(self.low, scale)
        } else {
            Nanos::MAX
        }
    }
}

impl fmt::Debug for U256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.high == 0 {
            write!(f, "{}", self.low)
        } else {
            write!(f, "{} * 2^128 + {}", self.high, self.low)
        }
    }
}

impl From<u128> for U256 {
    fn from(low: u128) -> U256 {
        U256 { high: 0, low }
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
            token: u64::try_from(bucket.token()).ok()?,
            scale: bucket.scale,
            burst: bucket.burst,
            offset,
        })
    }

    /// The word of `bucket`'s `tat`, if it fits below `limit`.
    pub(crate) fn word(&self, bucket: &Bucket, limit: u64) -> Option<u64> {
        if bucket.token_high >> TOKEN_BITS != 0 {
            return None;
        }
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
        bucket.set_tat(U256::from(self.tat(word)));
    }

    /// [`Bucket::offer`] on the word: `Some(Ok(new word))` if an item of `cost` conforms at
    /// `now` (the new word is below `limit`), `Some(Err(at))` if it may not go before `at`,
    /// `None` if the answer needs more than 64 bits or the item must queue (`cost > burst`).
    #[inline]
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

/// `ceil(a * b / c)` for `a < c <= 2^127`, exactly (the result is at most `b`).
fn mul_div_ceil(a: u128, b: u128, c: u128) -> u128 {
    debug_assert!(a < c);
    let (quotient, rem) = U256::mul(a, b).div_rem(c);
    quotient.low + u128::from(rem != 0)
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The exact model the tests check the bucket against, shared with the integration tests.
#[cfg(test)]
#[path = "../../tests/common/exact.rs"]
mod exact;

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
        // 1/s, one token owed, raised to 100/s after 0.1 s: the waiter,
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

    const FASTEST: (u64, u128) = (u64::MAX, 1);
    const SLOWEST: (u64, u128) = (1, Duration::MAX.as_nanos());

    #[test]
    fn the_level_is_kept_when_its_deficit_needs_more_than_128_bits() {
        // Emptied at the fastest rate, then the slowest at once: u64::MAX tokens missing,
        // u64::MAX * 1.8e28 units of the new rate. The bucket is empty and stays so (one
        // token takes 1.8e28 ns, beyond time).
        let mut b = Bucket::new(FASTEST.0, FASTEST.1, u64::MAX);
        assert_eq!(b.offer(Nanos::ZERO, u64::MAX), Decision::Go);
        b.set_rate(Nanos::ZERO, SLOWEST.0, SLOWEST.1);
        assert_eq!(b.available(Nanos::ZERO), 0);
        assert_eq!(b.offer(Nanos::ZERO, 1), Decision::NotUntil(Nanos::MAX));
        assert_eq!(b.earliest(Nanos::ZERO, 0), Nanos::ZERO);
        assert_eq!(b.available(Nanos::MAX), 0);
        assert_eq!(b.full_at(), Nanos::MAX);
        // A burst of 1 keeps the level: 0, not a full bucket of 1.
        b.set_burst(Nanos::ZERO, 1);
        assert_eq!(b.available(Nanos::ZERO), 0);
        assert_eq!(b.offer(Nanos::ZERO, 1), Decision::NotUntil(Nanos::MAX));
        // And back to the fastest rate: the one missing token flows in within a nanosecond.
        b.set_rate(Nanos::ZERO, FASTEST.0, FASTEST.1);
        assert_eq!(b.available(Nanos::ZERO), 0);
        assert_eq!(b.offer(Nanos::ZERO, 1), Decision::NotUntil(Nanos(1)));
        assert_eq!(b.available(Nanos(1)), 1);
    }

    #[test]
    fn a_bucket_of_one_emptied_fast_stays_empty_when_slowed() {
        let mut b = Bucket::new(FASTEST.0, FASTEST.1, 1);
        assert_eq!(b.offer(Nanos::ZERO, 1), Decision::Go);
        b.set_rate(Nanos::ZERO, SLOWEST.0, SLOWEST.1);
        assert_eq!(b.available(Nanos::ZERO), 0);
        assert_eq!(b.offer(Nanos::ZERO, 1), Decision::NotUntil(Nanos::MAX));
        assert_eq!(b.available(Nanos::MAX), 0);
        // The same through a burst of u64::MAX lowered to 1 (what a keyed limit does).
        let mut b = Bucket::new(FASTEST.0, FASTEST.1, u64::MAX);
        assert_eq!(b.offer(Nanos::ZERO, u64::MAX), Decision::Go);
        b.set_rate(Nanos::ZERO, SLOWEST.0, SLOWEST.1);
        b.set_burst(Nanos::ZERO, 1);
        assert_eq!(b.available(Nanos::ZERO), 0);
        assert_eq!(b.offer(Nanos::ZERO, 1), Decision::NotUntil(Nanos::MAX));
    }

    #[test]
    fn a_huge_burst_at_a_slow_rate_refills_token_by_token() {
        // u64::MAX tokens per Duration::MAX: one every 1e9 + 5.4e-11 ns. Emptied, the deficit
        // (u64::MAX tokens of about 2^94 units) needs 158 bits, yet the first token comes
        // 1 s + 1 ns later and the tenth 10 s + 1 ns later.
        let mut b = Bucket::new(u64::MAX, Duration::MAX.as_nanos(), u64::MAX);
        assert_eq!(b.offer(Nanos::ZERO, u64::MAX), Decision::Go);
        let sec = SEC as u64;
        assert_eq!(b.available(Nanos(sec)), 0);
        assert_eq!(b.offer(Nanos(sec), 1), Decision::NotUntil(Nanos(sec + 1)));
        assert_eq!(b.available(Nanos(sec + 1)), 1);
        assert_eq!(b.available(Nanos(10 * sec)), 9);
        assert_eq!(b.available(Nanos(10 * sec + 1)), 10);
        assert_eq!(
            b.offer(Nanos(10 * sec), 10),
            Decision::NotUntil(Nanos(10 * sec + 1))
        );
        assert_eq!(b.offer(Nanos(10 * sec + 1), 10), Decision::Go);
        assert_eq!(b.available(Nanos(10 * sec + 1)), 0);
        assert_eq!(b.full_at(), Nanos::MAX);
        // Switched to the fastest rate 10 s + 1 ns in, with 0.000000001 token in the bucket:
        // u64::MAX tokens short, filled in a nanosecond.
        b.set_rate(Nanos(10 * sec + 1), FASTEST.0, FASTEST.1);
        assert_eq!(b.available(Nanos(10 * sec + 1)), 0);
        assert_eq!(b.available(Nanos(10 * sec + 2)), u64::MAX);
        assert_eq!(b.full_at(), Nanos(10 * sec + 2));
    }

    #[test]
    fn a_saturated_bucket_is_empty_never_full() {
        // Committed without waiting, three buckets' worth at once: beyond 2^160 units.
        let mut b = Bucket::new(SLOWEST.0, SLOWEST.1, u64::MAX);
        for _ in 0..3 {
            b.commit(Nanos::ZERO, u64::MAX);
        }
        assert_eq!(b.available(Nanos(u64::MAX - 1)), 0);
        assert_eq!(b.earliest(Nanos::ZERO, 1), Nanos::MAX);
        assert_eq!(b.full_at(), Nanos::MAX);
        // A change of burst or rate brings the level back to 0, not below, not to full.
        b.set_burst(Nanos::ZERO, 1);
        assert_eq!(b.available(Nanos::ZERO), 0);
        b.set_rate(Nanos::ZERO, FASTEST.0, FASTEST.1);
        assert_eq!(b.available(Nanos::ZERO), 0);
        assert_eq!(b.earliest(Nanos::ZERO, 1), Nanos(1));
    }

    #[test]
    fn the_bucket_stays_48_bytes() {
        // `tat`'s high bits share the token's field: a keyed limiter holds one bucket per key.
        assert_eq!(std::mem::size_of::<Bucket>(), 48);
        // 8-byte aligned, not `u128`'s 16: an adapter holding it is not rounded up to 16
        // bytes (see the `repr` on `Bucket`).
        assert_eq!(std::mem::align_of::<Bucket>(), 8);
    }

    #[test]
    fn u256_arithmetic_is_exact() {
        // (2^128 - 1)^2 = 2^256 - 2^129 + 1: both middle products carry.
        let square = U256::mul(u128::MAX, u128::MAX);
        assert_eq!(
            square,
            U256 {
                high: u128::MAX - 1,
                low: 1
            }
        );
        // ... / 2^127 = 2^129 - 4, remainder 1.
        let quotient = U256 {
            high: 1,
            low: u128::MAX - 3,
        };
        assert_eq!(square.div_rem(1 << 127), (quotient, 1));
        assert_eq!(
            U256::mul(3 << 100, 5 << 90),
            U256 {
                high: 15 << 62,
                low: 0
            }
        );
        let two_128 = U256 { high: 1, low: 0 };
        assert_eq!(two_128.saturating_sub(U256::from(1)), U256::from(u128::MAX));
        assert_eq!(U256::from(1).saturating_sub(two_128), U256::ZERO);
        assert_eq!(U256::MAX.saturating_add(U256::from(1)), U256::MAX);
        assert_eq!(two_128.ceil_div_nanos(u64::MAX), Nanos::MAX);
        assert_eq!(U256::from(10).ceil_div_nanos(3), Nanos(4));
        assert_eq!(format!("{two_128:?}"), "1 * 2^128 + 0");
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
    fn mul_div_ceil_is_exact() {
        assert_eq!(mul_div_ceil(1, 3, 2), 2);
        assert_eq!(mul_div_ceil(4, 3, 6), 2);
        assert_eq!(mul_div_ceil((1 << 126) - 1, 1 << 100, 1 << 127), 1 << 99);
        // (2^94 - 1)(2^94 - 3) / 2^94 = 2^94 - 4 + 3 / 2^94: the product needs 188 bits.
        let p = 1u128 << 94;
        assert_eq!(mul_div_ceil(p - 1, p - 3, p), p - 3);
        assert_eq!(mul_div_ceil(p - 1, p, p), p - 1);
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
        assert_eq!(p.tat(word), { b.tat });
        assert_eq!(word, u64::try_from(b.tat).unwrap() + 1_000);
        assert_eq!(p.word(&b, word), None);
    }

    use super::exact::{any_count, any_period, ExactBucket};

    /// A gap between two operations, in nanoseconds: mostly none or small, sometimes huge.
    fn any_gap() -> impl Strategy<Value = u64> {
        prop_oneof![
            3 => Just(0u64),
            2 => 1u64..1_000,
            2 => 1u64..100_000_000_000,
            1 => (0u32..64).prop_map(|s| 1u64 << s),
            1 => any::<u64>(),
        ]
    }

    /// The cost of a request, relative to what the bucket holds or to its burst, or any.
    #[derive(Clone, Debug)]
    enum Cost {
        /// The whole tokens held, less 1, as is, or plus 1.
        Held(u8),
        /// The burst, less 1, as is, or plus 1.
        Burst(u8),
        Any(u64),
    }

    #[derive(Clone, Debug)]
    enum Op {
        Wait(u64),
        Offer(Cost),
        SetRate(u64, u128),
        SetBurst(u64),
    }

    fn any_op() -> impl Strategy<Value = Op> {
        let cost = prop_oneof![
            3 => (0u8..3).prop_map(Cost::Held),
            1 => (0u8..3).prop_map(Cost::Burst),
            1 => any_count().prop_map(Cost::Any),
            1 => (0u64..4).prop_map(Cost::Any),
        ];
        prop_oneof![
            2 => any_gap().prop_map(Op::Wait),
            3 => cost.prop_map(Op::Offer),
            2 => (any_count(), any_period()).prop_map(|(t, p)| Op::SetRate(t, p)),
            1 => any_count().prop_map(Op::SetBurst),
        ]
    }

    fn resolve(cost: &Cost, exact: &ExactBucket, burst: u64) -> u64 {
        let around = |base: u64, d: u8| match d {
            0 => base.saturating_sub(1),
            1 => base,
            _ => base.saturating_add(1),
        };
        match *cost {
            Cost::Held(d) => around(exact.available(), d),
            Cost::Burst(d) => around(burst, d),
            Cost::Any(c) => c,
        }
    }

    #[test]
    fn a_bucket_of_one_absorbs_no_lateness_and_spare_tokens_absorb_theirs() {
        let ms = Nanos(MS);
        // Burst 1, 500/s: not a nanosecond.
        assert!(!Bucket::new(500, SEC, 1).absorbs(1, Nanos::ZERO));
        // Burst 3, 500/s: two spare tokens, 4 ms.
        let b = Bucket::new(500, SEC, 3);
        assert!(b.absorbs(1, Nanos(3 * MS)));
        assert!(!b.absorbs(1, Nanos(4 * MS)));
        assert!(
            !b.absorbs(3, ms),
            "a cost of the whole burst has none to spare"
        );
        assert!(!b.absorbs(4, ms), "nor has a cost above it");
        // A spare beyond 128 bits covers anything.
        assert!(Bucket::new(1, TOKEN_MASK, u64::MAX).absorbs(1, Nanos::MAX));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// `absorbs` says exactly whether an item that leaves late moves any later item: if
        /// it absorbs `late`, leaving that late leaves the bucket (its `tat`, from which every
        /// later time is counted) where leaving on time does; if not, leaving a nanosecond
        /// later than that moves it.
        #[test]
        fn absorbs_is_whether_a_late_item_moves_the_next(
            tokens in 1u64..1_000,
            per in 1u128..10_000_000_000,
            burst in 1u64..20,
            warm in prop::collection::vec((1u64..20, 0u64..5_000_000), 0..8),
            cost in 1u64..20,
            late in 0u64..50_000_000,
        ) {
            let mut b = Bucket::new(tokens, per, burst);
            let mut now = Nanos::ZERO;
            for &(c, gap) in &warm {
                let c = c.min(burst);
                now = b.earliest(now.saturating_add(Nanos(gap)), c).max(now);
                b.commit(now, c);
            }
            // Emptied, so that the item waits: `absorbs` is asked of a wait, which ends when
            // the bucket holds the item's cost.
            now = b.earliest(now, burst).max(now);
            b.commit(now, burst);
            let cost = cost.min(burst);
            let due = b.earliest(now, cost);
            prop_assert!(due > now);
            let mut on_time = b.clone();
            on_time.commit(due, cost);
            let late = Nanos(late);
            if b.absorbs(cost, late) {
                let mut lagging = b.clone();
                lagging.commit(due.saturating_add(late), cost);
                prop_assert!(lagging == on_time);
            } else {
                let mut lagging = b.clone();
                lagging.commit(due.saturating_add(late).saturating_add(Nanos(1)), cost);
                prop_assert!(lagging.tat() > on_time.tat());
            }
        }

        /// The level is kept across any change of rate and burst, over the whole range of
        /// rates, bursts and times: after every step the bucket holds what an exact model
        /// holds (a rational level in arbitrary precision, rounded down to the new rate's
        /// time unit at a change of rate), grants exactly the costs the model holds, and
        /// promises the model's times. Time stays below `Nanos::MAX`, which means "never".
        #[test]
        fn the_level_is_kept_over_the_whole_range(
            tokens in any_count(),
            per in any_period(),
            burst in any_count(),
            ops in prop::collection::vec(any_op(), 1..40),
        ) {
            let mut real = Bucket::new(tokens, per, burst);
            let mut exact = ExactBucket::new(tokens, per, burst);
            let mut burst = burst;
            let mut now = 0u64;
            for op in &ops {
                match *op {
                    Op::Wait(gap) => {
                        now = now.saturating_add(gap).min(u64::MAX - 1);
                        exact.advance(now);
                    }
                    Op::Offer(ref cost) => {
                        let cost = resolve(cost, &exact, burst);
                        let expected = if exact.holds(cost) {
                            exact.take(cost);
                            Decision::Go
                        } else {
                            Decision::NotUntil(Nanos(exact.earliest(cost)))
                        };
                        prop_assert_eq!(real.offer(Nanos(now), cost), expected, "cost {}", cost);
                    }
                    Op::SetRate(tokens, per) => {
                        real.set_rate(Nanos(now), tokens, per);
                        exact.set_rate(tokens, per);
                    }
                    Op::SetBurst(new) => {
                        real.set_burst(Nanos(now), new);
                        exact.set_burst(new);
                        burst = new;
                    }
                }
                let held = exact.available();
                prop_assert_eq!(real.available(Nanos(now)), held, "after {:?} at {}", op, now);
                // Whole tokens held are granted; one more is not, and comes when the model says.
                prop_assert_eq!(real.earliest(Nanos(now), held), Nanos(now));
                if held < burst {
                    prop_assert_eq!(real.earliest(Nanos(now), held + 1), Nanos(exact.earliest(held + 1)));
                    prop_assert_eq!(real.full_at(), Nanos(exact.full_at()));
                } else {
                    prop_assert!(real.full_at() <= Nanos(now));
                }
            }
        }

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

        /// Over the whole range, `charge_if_room` answers exactly when `earliest` says "now"
        /// in the common case, and its charge is `commit`'s; it declines only what the common
        /// case cannot tell (a cost above the burst, a token beyond 64 bits, a `tat` beyond 128
        /// bits) and a bucket without room.
        #[test]
        fn a_charge_checked_with_its_room_is_earliest_then_commit(
            tokens in any_count(),
            per in any_period(),
            burst in any_count(),
            ops in prop::collection::vec(any_op(), 1..40),
        ) {
            let mut real = Bucket::new(tokens, per, burst);
            let mut now = 0u64;
            for op in &ops {
                match *op {
                    Op::Wait(gap) => now = now.saturating_add(gap).min(u64::MAX - 1),
                    Op::Offer(ref cost) => {
                        let held = real.available(Nanos(now));
                        let cost = match *cost {
                            Cost::Held(d) => held.saturating_add(u64::from(d)).saturating_sub(1),
                            Cost::Burst(d) => real.burst().saturating_add(u64::from(d)).saturating_sub(1),
                            Cost::Any(c) => c,
                        };
                        let room = real.earliest(Nanos(now), cost) <= Nanos(now);
                        let mut split = real.clone();
                        if room {
                            split.commit(Nanos(now), cost);
                        }
                        match real.charge_if_room(Nanos(now), cost) {
                            Some(charge) => {
                                prop_assert!(room, "charged without room: cost {}", cost);
                                real.apply(charge);
                            }
                            None => {
                                let narrow = real.narrow(cost).is_some();
                                prop_assert!(!room || !narrow, "declined with room: cost {}", cost);
                                real = split.clone();
                            }
                        }
                        prop_assert!(real == split, "cost {}", cost);
                        let unchanged = real.unchanged();
                        real.apply(unchanged);
                        prop_assert!(real == split);
                    }
                    Op::SetRate(tokens, per) => real.set_rate(Nanos(now), tokens, per),
                    Op::SetBurst(new) => real.set_burst(Nanos(now), new),
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
