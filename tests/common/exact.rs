//! A token bucket kept in exact arithmetic, to check the real one against over the whole
//! range of rates, bursts and times: its level is a rational number of tokens in arbitrary
//! precision, refilled by multiplying the elapsed time by the rate, with nothing of the
//! real bucket's representation (no arrival time, no time units, no saturation).
//!
//! `#[path]`-included by `src/core/bucket.rs`'s tests and by `tests/paced/rate_limiter.rs`.
#![allow(dead_code, unreachable_pub)]

use std::cmp::Ordering;
use std::time::Duration;

use proptest::prelude::*;

/// An unsigned integer of any size, as little-endian 32-bit limbs without trailing zeros.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Big(Vec<u32>);

impl Big {
    pub fn zero() -> Big {
        Big(Vec::new())
    }

    pub fn from_u128(mut v: u128) -> Big {
        let mut limbs = Vec::new();
        while v > 0 {
            limbs.push(v as u32);
            v >>= 32;
        }
        Big(limbs)
    }

    fn trimmed(mut self) -> Big {
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
        self
    }

    pub fn is_zero(&self) -> bool {
        self.0.is_empty()
    }

    pub fn to_u128(&self) -> Option<u128> {
        if self.0.len() > 4 {
            return None;
        }
        Some(
            self.0
                .iter()
                .rev()
                .fold(0u128, |acc, &limb| acc << 32 | u128::from(limb)),
        )
    }

    /// Both as `u128`s, when both fit: the common case, computed natively (and checked).
    fn small(&self, other: &Big) -> Option<(u128, u128)> {
        Some((self.to_u128()?, other.to_u128()?))
    }

    pub fn add(&self, other: &Big) -> Big {
        match self.small(other).and_then(|(a, b)| a.checked_add(b)) {
            Some(sum) => Big::from_u128(sum),
            None => self.add_long(other),
        }
    }

    fn add_long(&self, other: &Big) -> Big {
        let mut out = Vec::with_capacity(self.0.len().max(other.0.len()) + 1);
        let mut carry = 0u64;
        for i in 0..self.0.len().max(other.0.len()) {
            let sum = carry
                + u64::from(*self.0.get(i).unwrap_or(&0))
                + u64::from(*other.0.get(i).unwrap_or(&0));
            out.push(sum as u32);
            carry = sum >> 32;
        }
        out.push(carry as u32);
        Big(out).trimmed()
    }

    /// `self - other`; panics if that is negative.
    pub fn sub(&self, other: &Big) -> Big {
        assert!(*self >= *other, "negative difference");
        match self.small(other) {
            Some((a, b)) => Big::from_u128(a - b),
            None => self.sub_long(other),
        }
    }

    fn sub_long(&self, other: &Big) -> Big {
        let mut out = Vec::with_capacity(self.0.len());
        let mut borrow = 0i64;
        for i in 0..self.0.len() {
            let mut d = i64::from(self.0[i]) - i64::from(*other.0.get(i).unwrap_or(&0)) - borrow;
            borrow = 0;
            if d < 0 {
                d += 1 << 32;
                borrow = 1;
            }
            out.push(d as u32);
        }
        Big(out).trimmed()
    }

    pub fn mul(&self, other: &Big) -> Big {
        match self.small(other).and_then(|(a, b)| a.checked_mul(b)) {
            Some(product) => Big::from_u128(product),
            None => self.mul_long(other),
        }
    }

    fn mul_long(&self, other: &Big) -> Big {
        let mut out = vec![0u32; self.0.len() + other.0.len() + 1];
        for (i, &a) in self.0.iter().enumerate() {
            let mut carry = 0u64;
            for (j, &b) in other.0.iter().enumerate() {
                let t = u64::from(out[i + j]) + u64::from(a) * u64::from(b) + carry;
                out[i + j] = t as u32;
                carry = t >> 32;
            }
            let mut k = i + other.0.len();
            while carry > 0 {
                let t = u64::from(out[k]) + carry;
                out[k] = t as u32;
                carry = t >> 32;
                k += 1;
            }
        }
        Big(out).trimmed()
    }

    fn bits(&self) -> usize {
        match self.0.last() {
            None => 0,
            Some(&top) => 32 * self.0.len() - top.leading_zeros() as usize,
        }
    }

    fn bit(&self, i: usize) -> bool {
        self.0
            .get(i / 32)
            .is_some_and(|limb| limb >> (i % 32) & 1 == 1)
    }

    /// Quotient and remainder, by schoolbook long division one bit at a time.
    pub fn div_rem(&self, d: &Big) -> (Big, Big) {
        assert!(!d.is_zero(), "division by zero");
        match self.small(d) {
            Some((a, b)) => (Big::from_u128(a / b), Big::from_u128(a % b)),
            None => self.div_rem_long(d),
        }
    }

    fn div_rem_long(&self, d: &Big) -> (Big, Big) {
        let mut q = vec![0u32; self.0.len()];
        let mut r = Big::zero();
        for i in (0..self.bits()).rev() {
            r = r.add_long(&r);
            if self.bit(i) {
                r = r.add_long(&Big::from_u128(1));
            }
            if r >= *d {
                r = r.sub_long(d);
                q[i / 32] |= 1 << (i % 32);
            }
        }
        (Big(q).trimmed(), r)
    }

    pub fn div_ceil(&self, d: &Big) -> Big {
        let (q, r) = self.div_rem(d);
        if r.is_zero() {
            q
        } else {
            q.add(&Big::from_u128(1))
        }
    }

    pub fn min(self, other: Big) -> Big {
        if self <= other {
            self
        } else {
            other
        }
    }
}

impl Ord for Big {
    fn cmp(&self, other: &Big) -> Ordering {
        self.0
            .len()
            .cmp(&other.0.len())
            .then_with(|| self.0.iter().rev().cmp(other.0.iter().rev()))
    }
}

impl PartialOrd for Big {
    fn partial_cmp(&self, other: &Big) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

fn big(v: impl Into<u128>) -> Big {
    Big::from_u128(v.into())
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// A token bucket in exact arithmetic. Its level is `level / per` tokens, where `tokens / per`
/// is the rate in tokens per nanosecond in lowest terms: refilling for `t` ns adds
/// `t * tokens` to `level`, so the level stays on that grid of `1 / per` tokens.
#[derive(Clone, Debug)]
pub struct ExactBucket {
    tokens: Big,
    per: Big,
    burst: u64,
    level: Big,
    /// The time the level was last brought up to, in nanoseconds.
    at: u64,
}

impl ExactBucket {
    /// A full bucket of `burst` tokens refilled with `tokens` every `per` nanoseconds.
    pub fn new(tokens: u64, per: u128, burst: u64) -> ExactBucket {
        let g = gcd(u128::from(tokens), per);
        let per = big(per / g);
        ExactBucket {
            tokens: big(u128::from(tokens) / g),
            level: per.mul(&big(burst)),
            per,
            burst,
            at: 0,
        }
    }

    fn full(&self) -> Big {
        self.per.mul(&big(self.burst))
    }

    /// Brings the level up to `now`, which must not be earlier than the last time.
    pub fn advance(&mut self, now: u64) {
        assert!(now >= self.at, "time goes forward");
        let inflow = big(now - self.at).mul(&self.tokens);
        self.level = self.level.add(&inflow).min(self.full());
        self.at = now;
    }

    /// The whole tokens held: the level rounded down.
    pub fn available(&self) -> u64 {
        let whole = self.level.div_rem(&self.per).0;
        u64::try_from(whole.to_u128().unwrap()).unwrap()
    }

    /// Whether `cost` tokens are there now (never for a cost above the burst).
    pub fn holds(&self, cost: u64) -> bool {
        cost <= self.burst && self.level >= self.per.mul(&big(cost))
    }

    /// When an item of `cost` could go, as the real bucket promises: once the bucket holds
    /// `cost` tokens, or, for a cost above the burst, once `cost` tokens have flowed in with no
    /// cap. `u64::MAX` if not within time.
    pub fn earliest(&self, cost: u64) -> u64 {
        if self.holds(cost) {
            return self.at;
        }
        let lacking = self.per.mul(&big(cost)).sub(&self.level);
        let wait = lacking.div_ceil(&self.tokens);
        let at = big(self.at).add(&wait);
        at.to_u128()
            .and_then(|at| u64::try_from(at).ok())
            .unwrap_or(u64::MAX)
    }

    /// When the bucket is full again if nothing is taken; `u64::MAX` if not within time.
    pub fn full_at(&self) -> u64 {
        let lacking = self.full().sub(&self.level);
        let at = big(self.at).add(&lacking.div_ceil(&self.tokens));
        at.to_u128()
            .and_then(|at| u64::try_from(at).ok())
            .unwrap_or(u64::MAX)
    }

    /// Takes `cost` tokens, which must be there.
    pub fn take(&mut self, cost: u64) {
        assert!(self.holds(cost));
        self.level = self.level.sub(&self.per.mul(&big(cost)));
    }

    /// Refills at `tokens` per `per` ns from now on. The level is kept, rounded down to the new
    /// rate's grid of `1 / per` tokens (the real bucket's time unit: nothing is granted early).
    pub fn set_rate(&mut self, tokens: u64, per: u128) {
        let g = gcd(u128::from(tokens), per);
        let new_per = big(per / g);
        self.level = self.level.mul(&new_per).div_rem(&self.per).0;
        self.per = new_per;
        self.tokens = big(u128::from(tokens) / g);
    }

    /// Holds at most `burst` tokens from now on; the level is kept, capped at `burst`.
    pub fn set_burst(&mut self, burst: u64) {
        self.burst = burst;
        self.level = self.level.clone().min(self.full());
    }
}

/// A count over the whole `u64` range, with the extremes, the small values and the
/// powers of two more often.
pub fn any_count() -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => Just(1u64),
        1 => Just(u64::MAX),
        3 => 1..=u64::MAX,
        2 => 1u64..1_000,
        2 => (u64::MAX - 1_000)..=u64::MAX,
        2 => (0u32..64).prop_map(|s| 1u64 << s),
    ]
}

/// A period in nanoseconds from 1 to `Duration::MAX`, the same way.
pub fn any_period() -> impl Strategy<Value = u128> {
    let max = Duration::MAX.as_nanos();
    prop_oneof![
        1 => Just(1u128),
        1 => Just(max),
        3 => 1..=max,
        2 => 1u128..1_000_000_000_000,
        2 => (max - 1_000)..=max,
        2 => (0u32..94).prop_map(|s| 1u128 << s),
        1 => (0u32..29).prop_map(|e| 10u128.pow(e)),
    ]
}

#[test]
fn big_arithmetic_is_exact() {
    let a = Big::from_u128(u128::MAX);
    let b = Big::from_u128(u128::MAX - 5);
    let p = a.mul(&b);
    assert_eq!(p.div_rem(&a), (b.clone(), Big::zero()));
    let (q, r) = p.add(&Big::from_u128(7)).div_rem(&b);
    assert_eq!((q, r), (a.clone(), Big::from_u128(7)));
    assert_eq!(p.sub(&p), Big::zero());
    assert!(p > a && a > b);
    assert_eq!(
        Big::from_u128(10).div_ceil(&Big::from_u128(3)),
        Big::from_u128(4)
    );
}

/// Any `u128`, half of the time below 2^64 (so that products fit too).
fn wide() -> impl Strategy<Value = u128> {
    prop_oneof![any::<u128>(), any::<u64>().prop_map(u128::from)]
}

proptest! {
    /// The long arithmetic (limb by limb, what values beyond `u128` get) is the native one
    /// wherever both can compute: the fast path above hides it for smaller values.
    #[test]
    fn long_arithmetic_is_the_native_one(a in wide(), b in wide()) {
        let (x, y) = (Big::from_u128(a), Big::from_u128(b));
        if let Some(sum) = a.checked_add(b) {
            prop_assert_eq!(x.add_long(&y), Big::from_u128(sum));
        }
        let (hi, lo) = if x >= y { (&x, &y) } else { (&y, &x) };
        prop_assert_eq!(hi.sub_long(lo), Big::from_u128(a.max(b) - a.min(b)));
        if let Some(product) = a.checked_mul(b) {
            prop_assert_eq!(x.mul_long(&y), Big::from_u128(product));
        }
        if let (Some(q), Some(r)) = (a.checked_div(b), a.checked_rem(b)) {
            prop_assert_eq!(x.div_rem_long(&y), (Big::from_u128(q), Big::from_u128(r)));
        }
        // Beyond u128: the product divided back.
        if a != 0 {
            prop_assert_eq!(x.mul_long(&y).div_rem_long(&x), (y.clone(), Big::zero()));
        }
    }
}
