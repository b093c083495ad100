//! How fast tokens flow: [`Rate`], and the [`ConfigError`] for a rate that cannot be.

use std::fmt;
use std::time::Duration;

/// A refill rate: `tokens` every `per`.
///
/// The rate is kept as the exact fraction you give it: `Rate::new(3, Duration::from_secs(1))`
/// is one token every 333,333,333⅓ ns, not a rounded interval, so long runs do not drift.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use pacer::Rate;
///
/// let rate = Rate::new(100, Duration::from_secs(60));
/// assert_eq!(rate.tokens(), 100);
/// assert_eq!(rate.per(), Duration::from_secs(60));
/// assert_eq!(Rate::per_second(5), Rate::new(5, Duration::from_secs(1)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    tokens: u64,
    per: Duration,
}

impl Rate {
    /// `tokens` every `per`.
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
    /// use pacer::Rate;
    ///
    /// let ten_per_minute = Rate::new(10, Duration::from_secs(60));
    /// # let _ = ten_per_minute;
    /// ```
    #[track_caller]
    #[must_use]
    pub fn new(tokens: u64, per: Duration) -> Rate {
        match Rate::try_new(tokens, per) {
            Ok(rate) => rate,
            Err(e) => panic!("{e}"),
        }
    }

    /// `tokens` every `per`, or a [`ConfigError`] saying which value is wrong.
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
    /// use pacer::{ConfigError, Rate};
    ///
    /// assert!(Rate::try_new(5, Duration::from_secs(1)).is_ok());
    /// assert_eq!(Rate::try_new(0, Duration::from_secs(1)), Err(ConfigError::ZeroTokens));
    /// assert_eq!(Rate::try_new(5, Duration::ZERO), Err(ConfigError::ZeroPeriod));
    /// ```
    pub const fn try_new(tokens: u64, per: Duration) -> Result<Rate, ConfigError> {
        if tokens == 0 {
            Err(ConfigError::ZeroTokens)
        } else if per.is_zero() {
            Err(ConfigError::ZeroPeriod)
        } else {
            Ok(Rate { tokens, per })
        }
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
    /// use pacer::Rate;
    ///
    /// let rate = Rate::per_second(50);
    /// assert_eq!(rate.tokens(), 50);
    /// ```
    #[track_caller]
    #[must_use]
    pub fn per_second(tokens: u64) -> Rate {
        Rate::new(tokens, Duration::from_secs(1))
    }

    /// How many tokens flow in every [`per`](Rate::per).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(pacer::Rate::per_second(7).tokens(), 7);
    /// ```
    #[must_use]
    pub const fn tokens(&self) -> u64 {
        self.tokens
    }

    /// The period in which [`tokens`](Rate::tokens) flow in.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// assert_eq!(pacer::Rate::per_second(7).per(), Duration::from_secs(1));
    /// ```
    #[must_use]
    pub const fn per(&self) -> Duration {
        self.per
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} per {:?}", self.tokens, self.per)
    }
}

/// A configuration value that describes no usable limit.
///
/// Its `Display` names the value and says why it was refused.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use pacer::{ConfigError, Rate};
///
/// let err = Rate::try_new(0, Duration::from_secs(1)).unwrap_err();
/// assert_eq!(err, ConfigError::ZeroTokens);
/// assert_eq!(
///     err.to_string(),
///     "invalid rate: `tokens` is 0, so nothing could ever pass; it must be at least 1"
/// );
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConfigError {
    /// A [`Rate`] of zero tokens per period.
    ZeroTokens,
    /// A [`Rate`] whose period is zero: an infinite rate.
    ZeroPeriod,
    /// A limiter whose `burst` is zero: nothing could ever pass.
    ZeroBurst,
    /// A warming-up limiter whose warm-up period is zero.
    ZeroWarmup,
    /// A warming-up limiter whose cold factor is not a finite number of at least 1.
    ColdFactor,
    /// A Redis limiter whose lease is zero tokens.
    ZeroLease,
    /// A fail-open share outside `(0, 1]`.
    Share,
    /// An adaptive controller whose `min` rate is above its `max`.
    MinAboveMax,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigError::ZeroTokens => {
                "invalid rate: `tokens` is 0, so nothing could ever pass; it must be at least 1"
            }
            ConfigError::ZeroPeriod => {
                "invalid rate: `per` is zero, an infinite rate; it must be a positive duration"
            }
            ConfigError::ZeroBurst => {
                "invalid limiter: `burst` is 0, so nothing could ever pass; it must be at least 1"
            }
            ConfigError::ZeroWarmup => {
                "invalid warm-up: the warm-up period is zero; it must be a positive duration"
            }
            ConfigError::ZeroLease => {
                "invalid lease: 0 tokens per lease; lease at least 1 token, or leave leases off"
            }
            ConfigError::Share => {
                "invalid fail-open share: it must be a fraction of the rate in (0, 1]"
            }
            ConfigError::MinAboveMax => {
                "invalid adaptive range: `min` is above `max`; it must be at most `max`"
            }
            ConfigError::ColdFactor => {
                "invalid warm-up: `cold_factor` must be a finite number of at least 1 (3 is Guava's default)"
            }
        })
    }
}

impl std::error::Error for ConfigError {}

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
        assert_eq!(Rate::per_second(3).to_string(), "3 per 1s");
    }
}
