//! [`FailurePolicy`], and the checks and arithmetic of a Redis limiter's configuration.

use std::time::Duration;

use super::error::RedisLimiterError;
use crate::error::ConfigError;
use crate::rate::Rate;

/// What a [`RedisRateLimiter`](super::RedisRateLimiter) or a
/// [`RedisKeyedRateLimiter`](super::RedisKeyedRateLimiter) does while Redis cannot be reached:
/// an outage (see
/// [outages and reply errors](super::RedisRateLimiter#outages-and-reply-errors); a reply error is not
/// one, and no policy applies to it).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paced::redis::FailurePolicy;
///
/// // Keep going at a tenth of the quota in every process until Redis is back.
/// let open = FailurePolicy::FailOpen { share: 0.1 };
/// // Wait for Redis, retrying every 10 ms up to every second; give up after 30 s.
/// let closed = FailurePolicy::FailClosed {
///     max_backoff: Duration::from_secs(1),
///     deadline: Duration::from_secs(30),
/// };
/// # let _ = (open, closed);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Grant nothing without Redis: wait and retry, with exponential backoff from 10 ms up to
    /// `max_backoff`. `acquire` gives up with [`RedisLimiterError::Unavailable`] once Redis has
    /// been unreachable for `deadline`; a stream never gives up (it holds its item and keeps
    /// retrying, so nothing is lost), and an enforcing stream hands items back meanwhile.
    /// The quota is never exceeded; the price is a stall while Redis is down.
    FailClosed {
        /// The longest pause between two attempts.
        max_backoff: Duration,
        /// How long `acquire` waits for Redis before it returns an error.
        deadline: Duration,
    },
    /// Keep going without Redis: each process falls back to a local limiter at `share` of the
    /// rate and burst (at least one token), and tries Redis again every second. With `n`
    /// processes the total may reach `n * share` of the quota while Redis is down; choose
    /// `share` as about `1 / n` to stay within it. The price is that the quota is only
    /// approximately kept during an outage.
    ///
    /// Each outage allows a burst: each process's fallback starts with a full bucket of
    /// `share × burst` tokens (rounded down, at least one), which it may grant at once, then
    /// refills at `share × rate`. Probing Redis during the outage keeps that bucket as it is
    /// (it is not refilled by a failed probe); once Redis answers again the fallback is
    /// dropped, and the next outage starts with a full one. So at the start of an outage the
    /// `n` processes may grant up to `n × share × burst` at once, on top of what Redis had
    /// just granted: up to twice the burst with `share = 1 / n`.
    FailOpen {
        /// The fraction of the rate each process grants on its own, in `(0, 1]`.
        share: f64,
    },
}

impl Default for FailurePolicy {
    /// `FailClosed` with a 1 s backoff cap and a 30 s deadline.
    fn default() -> Self {
        FailurePolicy::FailClosed {
            max_backoff: Duration::from_secs(1),
            deadline: Duration::from_secs(30),
        }
    }
}

/// Checks what both builders are given.
pub(crate) fn validate(
    burst: u64,
    response_timeout: Duration,
    lease: Option<(u64, Duration)>,
    policy: FailurePolicy,
) -> Result<(), RedisLimiterError> {
    if burst == 0 {
        return Err(RedisLimiterError::Config(ConfigError::ZeroBurst));
    }
    if response_timeout.is_zero() {
        return Err(RedisLimiterError::Config(ConfigError::ZeroTimeout));
    }
    if let Some((0, _)) = lease {
        return Err(RedisLimiterError::Config(ConfigError::ZeroLease));
    }
    if let FailurePolicy::FailOpen { share } = policy {
        if !(share > 0.0 && share <= 1.0) {
            return Err(RedisLimiterError::Config(ConfigError::Share));
        }
    }
    Ok(())
}

/// Microseconds per token, the script's unit.
pub(crate) fn interval_us(rate: Rate) -> f64 {
    rate.per().as_nanos() as f64 / 1_000.0 / rate.tokens() as f64
}

/// `share` of a limit: of the rate (by stretching the period, so the share is exact) and of
/// the burst (at least one token).
pub(crate) fn share_of(rate: Rate, burst: u64, share: f64) -> (Rate, u64) {
    let per =
        Duration::try_from_secs_f64(rate.per().as_secs_f64() / share).unwrap_or(Duration::MAX);
    let burst = ((burst as f64 * share).floor() as u64).max(1);
    (Rate::new(rate.tokens(), per), burst)
}
