//! A point in time or a span, in whole nanoseconds, that saturates instead of overflowing.

use std::time::Duration;

use crate::error::NotUntil;

/// Nanoseconds since an adapter's origin (its first clock read), or a span of nanoseconds.
///
/// Every operation saturates at [`Nanos::MAX`], which the timer treats as "never".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Nanos(pub(crate) u64);

impl Nanos {
    pub(crate) const ZERO: Nanos = Nanos(0);
    /// About 584 years: the far future, reached only by saturation.
    pub(crate) const MAX: Nanos = Nanos(u64::MAX);

    /// A duration in nanoseconds, saturating at `Nanos::MAX`.
    pub(crate) const fn from_duration(d: Duration) -> Nanos {
        let secs = d.as_secs().saturating_mul(1_000_000_000);
        Nanos(secs.saturating_add(d.subsec_nanos() as u64))
    }

    /// The span as a `Duration`; `Nanos::MAX` becomes `Duration::MAX` so that "never" stays
    /// "never" for callers.
    pub(crate) const fn to_duration(self) -> Duration {
        if self.0 == u64::MAX {
            Duration::MAX
        } else {
            Duration::from_nanos(self.0)
        }
    }

    pub(crate) const fn saturating_add(self, other: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(other.0))
    }

    pub(crate) const fn saturating_sub(self, other: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(other.0))
    }

    /// The wait from `now` until this deadline: none if it has passed, never if it is never
    /// (`Nanos::MAX`, which a deadline reaches only by saturation).
    pub(crate) const fn wait_from(self, now: Nanos) -> Nanos {
        if self.0 == u64::MAX {
            Nanos::MAX
        } else {
            self.saturating_sub(now)
        }
    }

    /// `ceil(value / divisor)` as nanoseconds, saturating: rounding up makes a deadline late by
    /// at most one nanosecond, never early.
    pub(crate) const fn ceil_div(value: u128, divisor: u64) -> Nanos {
        let d = divisor as u128;
        let q = value / d + (value % d != 0) as u128;
        if q > u64::MAX as u128 {
            Nanos::MAX
        } else {
            Nanos(q as u64)
        }
    }
}

impl NotUntil {
    /// A refusal for a wait of `wait`; `Nanos::MAX` (reached only by saturation) is "never".
    pub(crate) const fn new(wait: Nanos) -> NotUntil {
        NotUntil::after(wait.to_duration())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_duration_saturates() {
        assert_eq!(
            Nanos::from_duration(Duration::from_millis(3)),
            Nanos(3_000_000)
        );
        assert_eq!(Nanos::from_duration(Duration::MAX), Nanos::MAX);
        let secs = u64::MAX / 1_000_000_000;
        assert_eq!(
            Nanos::from_duration(Duration::new(secs - 1, 999_999_999)),
            Nanos(secs * 1_000_000_000 - 1)
        );
        assert_eq!(
            Nanos::from_duration(Duration::new(secs, 999_999_999)),
            Nanos::MAX
        );
    }

    #[test]
    fn to_duration_keeps_never() {
        assert_eq!(Nanos(1_500).to_duration(), Duration::from_nanos(1_500));
        assert_eq!(Nanos::MAX.to_duration(), Duration::MAX);
    }

    #[test]
    fn arithmetic_saturates() {
        assert_eq!(Nanos::MAX.saturating_add(Nanos(1)), Nanos::MAX);
        assert_eq!(Nanos(1).saturating_sub(Nanos(2)), Nanos::ZERO);
    }

    #[test]
    fn a_wait_for_never_is_never() {
        assert_eq!(Nanos(7).wait_from(Nanos(5)), Nanos(2));
        assert_eq!(Nanos(5).wait_from(Nanos(7)), Nanos::ZERO);
        assert_eq!(Nanos::MAX.wait_from(Nanos(7)), Nanos::MAX);
    }

    #[test]
    fn ceil_div_rounds_up_and_saturates() {
        assert_eq!(Nanos::ceil_div(10, 5), Nanos(2));
        assert_eq!(Nanos::ceil_div(11, 5), Nanos(3));
        assert_eq!(Nanos::ceil_div(0, 7), Nanos(0));
        assert_eq!(Nanos::ceil_div(u128::MAX, 1), Nanos::MAX);
        assert_eq!(Nanos::ceil_div(u64::MAX as u128 * 3, 3), Nanos::MAX);
        assert_eq!(Nanos::ceil_div(u64::MAX as u128 * 3 + 1, 3), Nanos::MAX);
    }

    #[test]
    fn never_is_only_the_saturated_wait() {
        assert!(NotUntil::new(Nanos::MAX).is_never());
        assert!(NotUntil::NEVER.is_never());
        assert_eq!(NotUntil::NEVER.retry_after_secs(), u64::MAX);
        let long = NotUntil::new(Nanos(u64::MAX - 1));
        assert!(!long.is_never());
        assert_eq!(long.retry_after_secs(), u64::MAX / 1_000_000_000 + 1);
    }

    #[test]
    fn retry_after_secs_rounds_up() {
        assert_eq!(NotUntil::new(Nanos(0)).retry_after_secs(), 0);
        assert_eq!(NotUntil::new(Nanos(1)).retry_after_secs(), 1);
        assert_eq!(NotUntil::new(Nanos(1_000_000_000)).retry_after_secs(), 1);
        assert_eq!(NotUntil::new(Nanos(1_000_000_001)).retry_after_secs(), 2);
    }
}
