//! How fast tokens flow: [`Rate`], a value (reduced, compared and hashed by value).

use std::cmp::Ordering;
use std::fmt;
use std::time::Duration;

use crate::error::ConfigError;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// A refill rate: `tokens` every `per`, kept as a value.
///
/// The rate is kept as an exact fraction, not a rounded interval:
/// `Rate::new(3, Duration::from_secs(1))` is one token every 333,333,333⅓ ns, so long runs do
/// not drift.
///
/// The fraction is reduced when the rate is built: `tokens` and the period in nanoseconds are
/// divided by their greatest common divisor. Two rates that flow equally fast are therefore
/// equal, hash alike, and read back the same [`tokens`](Rate::tokens) and [`per`](Rate::per),
/// however they were written. Rates are ordered by how fast they flow: a faster rate is
/// greater, compared exactly over the whole range.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paced::Rate;
///
/// let rate = Rate::new(100, Duration::from_secs(60));
/// // Reduced in nanoseconds: 100 per 60 s is 1 per 600 ms.
/// assert_eq!(rate.tokens(), 1);
/// assert_eq!(rate.per(), Duration::from_millis(600));
/// assert_eq!(rate.to_string(), "100/min");
/// assert_eq!(Rate::new(2, Duration::from_secs(2)), Rate::per_second(1));
/// assert_eq!(Rate::new(80_000, Duration::from_secs(1000)), Rate::per_second(80));
/// assert!(Rate::per_second(2) > Rate::per_minute(100));
/// assert_eq!(Rate::per_second(80).to_string(), "80/s");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    // Invariant: `tokens >= 1`, `per > 0`, and `gcd(tokens, per.as_nanos()) == 1`, so the
    // derived `PartialEq`, `Eq` and `Hash` compare values.
    tokens: u64,
    per: Duration,
}

impl Rate {
    /// `tokens` every `per`, reduced to lowest terms (see [`Rate::tokens`]).
    ///
    /// A `const fn`: a rate written in the code can be a `const`.
    ///
    /// # Panics
    ///
    /// Panics if `tokens` is zero or `per` is zero, with the message of the matching
    /// [`ConfigError`]. Use [`Rate::try_new`] for values that come from configuration.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::Rate;
    ///
    /// const TEN_PER_MINUTE: Rate = Rate::new(10, Duration::from_secs(60));
    /// assert_eq!(TEN_PER_MINUTE, Rate::per_minute(10));
    /// assert_eq!(TEN_PER_MINUTE, Rate::new(1, Duration::from_secs(6)));
    /// ```
    #[track_caller]
    #[must_use]
    pub const fn new(tokens: u64, per: Duration) -> Rate {
        // A `const fn` can only panic with a literal: these are `ConfigError`'s messages.
        match Rate::try_new(tokens, per) {
            Ok(rate) => rate,
            Err(ConfigError::ZeroTokens) => {
                panic!("invalid rate: `tokens` is 0, so nothing could ever pass; it must be at least 1")
            }
            Err(ConfigError::ZeroPeriod) => {
                panic!(
                    "invalid rate: `per` is zero, an infinite rate; it must be a positive duration"
                )
            }
            Err(_) => unreachable!(),
        }
    }

    /// `tokens` every `per`, reduced to lowest terms, or a [`ConfigError`] saying which value
    /// is wrong.
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroTokens`] if `tokens` is zero, [`ConfigError::ZeroPeriod`] if `per`
    /// is zero: neither describes a rate at which anything could ever pass.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{ConfigError, Rate};
    ///
    /// assert_eq!(Rate::try_new(5, Duration::from_secs(1)), Ok(Rate::per_second(5)));
    /// assert_eq!(Rate::try_new(0, Duration::from_secs(1)), Err(ConfigError::ZeroTokens));
    /// assert_eq!(Rate::try_new(5, Duration::ZERO), Err(ConfigError::ZeroPeriod));
    /// const FROM_CONFIG: Result<Rate, ConfigError> = Rate::try_new(5, Duration::from_secs(1));
    /// assert!(FROM_CONFIG.is_ok());
    /// ```
    pub const fn try_new(tokens: u64, per: Duration) -> Result<Rate, ConfigError> {
        if tokens == 0 {
            return Err(ConfigError::ZeroTokens);
        }
        if per.is_zero() {
            return Err(ConfigError::ZeroPeriod);
        }
        let nanos = per.as_nanos();
        let g = gcd(tokens as u128, nanos);
        // `g` divides `tokens`, so the quotient fits in a `u64`; the reduced period is at most
        // `per`, so its seconds fit in a `u64` too.
        let tokens = (tokens as u128 / g) as u64;
        let nanos = nanos / g;
        let per = Duration::new(
            (nanos / NANOS_PER_SEC) as u64,
            (nanos % NANOS_PER_SEC) as u32,
        );
        Ok(Rate { tokens, per })
    }

    /// `tokens` every second.
    ///
    /// # Panics
    ///
    /// Panics if `tokens` is zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::Rate;
    ///
    /// const RATE: Rate = Rate::per_second(50);
    /// assert_eq!(RATE, Rate::new(50, Duration::from_secs(1)));
    /// // Reduced: 50 per second is 1 per 20 ms.
    /// assert_eq!((RATE.tokens(), RATE.per()), (1, Duration::from_millis(20)));
    /// ```
    #[track_caller]
    #[must_use]
    pub const fn per_second(tokens: u64) -> Rate {
        Rate::new(tokens, Duration::from_secs(1))
    }

    /// `tokens` every minute.
    ///
    /// # Panics
    ///
    /// Panics if `tokens` is zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::Rate;
    ///
    /// const RATE: Rate = Rate::per_minute(120);
    /// assert_eq!(RATE, Rate::per_second(2));
    /// assert_eq!(Rate::per_minute(7).to_string(), "7/min");
    /// ```
    #[track_caller]
    #[must_use]
    pub const fn per_minute(tokens: u64) -> Rate {
        Rate::new(tokens, Duration::from_secs(60))
    }

    /// `tokens` every hour.
    ///
    /// # Panics
    ///
    /// Panics if `tokens` is zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::Rate;
    ///
    /// const RATE: Rate = Rate::per_hour(5);
    /// assert_eq!(RATE, Rate::new(5, Duration::from_secs(3600)));
    /// assert_eq!(RATE.to_string(), "5/h");
    /// ```
    #[track_caller]
    #[must_use]
    pub const fn per_hour(tokens: u64) -> Rate {
        Rate::new(tokens, Duration::from_secs(3600))
    }

    /// How many tokens flow in every [`per`](Rate::per).
    ///
    /// This is the reduced numerator: the rate as built, divided by the greatest common
    /// divisor of its tokens and its period in nanoseconds, so it may be smaller than the
    /// `tokens` it was built with.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::Rate;
    ///
    /// assert_eq!(Rate::per_second(7).tokens(), 7);
    /// assert_eq!(Rate::new(2, Duration::from_secs(2)).tokens(), 1);
    /// ```
    #[must_use]
    pub const fn tokens(&self) -> u64 {
        self.tokens
    }

    /// The period in which [`tokens`](Rate::tokens) flow in.
    ///
    /// This is the reduced period: the rate as built, divided by the greatest common divisor
    /// of its tokens and its period in nanoseconds, so it may be shorter than the `per` it was
    /// built with.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::Rate;
    ///
    /// assert_eq!(Rate::per_second(7).per(), Duration::from_secs(1));
    /// assert_eq!(Rate::new(2, Duration::from_secs(2)).per(), Duration::from_secs(1));
    /// assert_eq!(Rate::per_second(1000).per(), Duration::from_millis(1));
    /// ```
    #[must_use]
    pub const fn per(&self) -> Duration {
        self.per
    }

    /// The reduced period in nanoseconds (at most `Duration::MAX`, about 2^94).
    pub(crate) const fn per_nanos(&self) -> u128 {
        self.per.as_nanos()
    }
}

/// The greatest common divisor, by Euclid; `gcd(a, 0) == a`.
const fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        let r = a % b;
        a = b;
        b = r;
    }
    a
}

/// `x * y` exactly, as three 64-bit limbs, most significant first: `(high, middle, low)`.
///
/// The product of a `u64` and a `u128` needs up to 192 bits. Tuples compare
/// lexicographically, so the limbs compare as the products do.
const fn wide_mul(x: u64, y: u128) -> (u64, u64, u64) {
    let x = x as u128;
    // Each partial product is below 2^128.
    let low = x * (y as u64 as u128);
    let high = x * (y >> 64);
    // Bits 64.. of `low` plus bits 0..64 of `high`: below 2^65.
    let middle = (low >> 64) + (high as u64 as u128);
    let top = (high >> 64) + (middle >> 64);
    (top as u64, middle as u64, low as u64)
}

impl Ord for Rate {
    /// Orders rates by how fast they flow: a faster rate is greater.
    ///
    /// Exact over the whole range: `a.tokens / a.per` against `b.tokens / b.per` is decided
    /// by the 192-bit cross products `a.tokens * b.per` and `b.tokens * a.per`.
    fn cmp(&self, other: &Rate) -> Ordering {
        wide_mul(self.tokens, other.per_nanos()).cmp(&wide_mul(other.tokens, self.per_nanos()))
    }
}

impl PartialOrd for Rate {
    fn partial_cmp(&self, other: &Rate) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Rate {
    /// `80/s`, `3/min`, `5/h` or `7/ms` when the rate is a whole number of tokens per
    /// millisecond, second, minute or hour (the shortest such unit is used); otherwise
    /// `{tokens} per {per:?}`, as in `7 per 1.3s`.
    ///
    /// The reduced value is shown, so `Rate::new(120, Duration::from_secs(60))` reads `2/s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u128, &str); 4] = [
            (1_000_000, "ms"),
            (NANOS_PER_SEC, "s"),
            (60 * NANOS_PER_SEC, "min"),
            (3600 * NANOS_PER_SEC, "h"),
        ];
        let per = self.per_nanos();
        // `tokens` and `per` are coprime, so `tokens * unit / per` is whole exactly when
        // `per` divides `unit`.
        for (unit, name) in UNITS {
            if unit % per == 0 {
                return write!(f, "{}/{name}", u128::from(self.tokens) * (unit / per));
            }
        }
        write!(f, "{} per {:?}", self.tokens, self.per)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "invalid rate: `tokens` is 0")]
    fn new_panics_on_zero_tokens() {
        let _ = Rate::new(0, Duration::from_secs(1));
    }

    #[test]
    #[should_panic(expected = "invalid rate: `per` is zero")]
    fn new_panics_on_zero_period() {
        let _ = Rate::new(1, Duration::ZERO);
    }

    #[test]
    fn extreme_rates_are_valid() {
        assert!(Rate::try_new(1, Duration::MAX).is_ok());
        assert!(Rate::try_new(u64::MAX, Duration::from_nanos(1)).is_ok());
        assert_eq!(Rate::per_second(3).to_string(), "3/s");
        assert_eq!(
            Rate::new(3, Duration::from_millis(1300)).to_string(),
            "3 per 1.3s"
        );
    }

    /// `new` panics with exactly `ConfigError`'s messages, which it has to repeat as literals.
    #[test]
    fn panic_messages_are_config_errors() {
        let message = |tokens, per| {
            let payload = std::panic::catch_unwind(|| Rate::new(tokens, per)).unwrap_err();
            *payload.downcast::<&str>().unwrap()
        };
        assert_eq!(
            message(0, Duration::from_secs(1)),
            ConfigError::ZeroTokens.to_string()
        );
        assert_eq!(
            message(1, Duration::ZERO),
            ConfigError::ZeroPeriod.to_string()
        );
    }

    #[test]
    fn reduced_by_gcd() {
        let rate = Rate::new(120, Duration::from_secs(60));
        assert_eq!((rate.tokens(), rate.per()), (1, Duration::from_millis(500)));
        assert_eq!(rate.per_nanos(), 500_000_000);
        assert_eq!(gcd(12, 18), 6);
        assert_eq!(gcd(7, 0), 7);
        let max = Rate::new(u64::MAX, Duration::MAX);
        assert_eq!(
            max.per_nanos() * u128::from(u64::MAX / max.tokens()),
            Duration::MAX.as_nanos()
        );
    }

    #[test]
    fn wide_mul_is_exact() {
        assert_eq!(wide_mul(0, u128::MAX), (0, 0, 0));
        assert_eq!(wide_mul(1, u128::MAX), (0, u64::MAX, u64::MAX));
        assert_eq!(wide_mul(2, u128::MAX), (1, u64::MAX, u64::MAX - 1));
        // (2^64 - 1)(2^128 - 1) = 2^192 - 2^128 - 2^64 + 1.
        assert_eq!(wide_mul(u64::MAX, u128::MAX), (u64::MAX - 1, u64::MAX, 1));
        assert_eq!(wide_mul(u64::MAX, 1 << 64), (0, u64::MAX, 0));
    }
}
