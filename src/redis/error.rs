//! The Redis limiters' errors: [`RedisLimiterError`] and [`TryAcquireError`].

use std::fmt;

use crate::error::{ConfigError, NotUntil};

/// Why a [`RedisRateLimiter`](crate::RedisRateLimiter) or a
/// [`RedisKeyedRateLimiter`](crate::RedisKeyedRateLimiter) could not be built or could not
/// answer.
///
/// # Examples
///
/// ```
/// use paced::redis::RedisLimiterError;
/// use paced::{Rate, RedisRateLimiter};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let zero = RedisRateLimiter::builder("redis://127.0.0.1/", "api", Rate::per_second(5), 0).build();
/// assert!(matches!(zero, Err(RedisLimiterError::Config(_))));
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum RedisLimiterError {
    /// A limit that cannot be: a zero burst, a bad lease or share.
    Config(ConfigError),
    /// The Redis URL or client configuration was refused.
    Client(redis::RedisError),
    /// Redis could not be reached: for longer than the `FailClosed` deadline by an
    /// `acquire`, or at all by a change of configuration (`set_limit` and `clear_limit`, which
    /// no failure policy applies to).
    Unavailable(redis::RedisError),
    /// Redis answered the request with an error (see
    /// [outages and reply errors](crate::RedisRateLimiter#outages-and-reply-errors)): the key holds a value of another type or something that is not a paced quota, or a
    /// quota state of a format version this paced does not read (written by a later paced: see
    /// [upgrading a fleet](crate::guide#upgrading-a-fleet)), or a
    /// command was refused (an ACL, a script error). It is not an outage: the failure policy
    /// does not apply, nothing was granted, and asking again fails the same way until the key
    /// or the server's configuration is fixed.
    Reply(redis::RedisError),
}

impl fmt::Display for RedisLimiterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisLimiterError::Config(e) => e.fmt(f),
            RedisLimiterError::Client(e) => write!(f, "invalid Redis client configuration: {e}"),
            RedisLimiterError::Unavailable(e) => {
                write!(f, "Redis unreachable: {e}")
            }
            RedisLimiterError::Reply(e) => write!(f, "Redis answered the quota with an error: {e}"),
        }
    }
}

impl std::error::Error for RedisLimiterError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RedisLimiterError::Config(e) => Some(e),
            RedisLimiterError::Client(e)
            | RedisLimiterError::Unavailable(e)
            | RedisLimiterError::Reply(e) => Some(e),
        }
    }
}

/// Why `try_acquire` or `acquire_timeout` of a Redis limiter
/// ([`RedisRateLimiter::try_acquire`](crate::RedisRateLimiter::try_acquire),
/// [`RedisKeyedRateLimiter::acquire_timeout`](crate::RedisKeyedRateLimiter::acquire_timeout))
/// did not grant: the limiter refused (not now, or not within the timeout), or Redis answered
/// with an error.
///
/// The refusal is the crate's one [`NotUntil`], as from every other limiter; a reply error is
/// a failure, not a refusal, and waiting does not cure it (see [`RedisLimiterError::Reply`]).
/// While Redis is *unreachable* `try_acquire` still refuses, under the [`FailurePolicy`](super::FailurePolicy).
///
/// # Examples
///
/// ```no_run
/// use paced::redis::TryAcquireError;
///
/// # async fn demo(quota: paced::RedisRateLimiter) -> Result<(), Box<dyn std::error::Error>> {
/// match quota.try_acquire(1).await {
///     Ok(()) => println!("go"),
///     Err(TryAcquireError::NotUntil(refused)) => println!("retry in {:?}", refused.retry_after()),
///     Err(failed) => return Err(failed.into()),
/// }
/// // Or, when any failure is to be handled as a refusal would be:
/// if let Err(e) = quota.try_acquire(1).await {
///     println!("not now: {e}; a refusal? {:?}", e.not_until());
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum TryAcquireError {
    /// Refused: the cost cannot be had now. [`NotUntil::retry_after`] says when it could be;
    /// [`NotUntil::is_never`] that it never can without waiting (a cost above the burst).
    NotUntil(NotUntil),
    /// Redis answered with an error; nothing was granted. The same error as
    /// [`RedisLimiterError::Reply`].
    Reply(redis::RedisError),
}

impl TryAcquireError {
    /// The refusal, if this is one; `None` for a reply error.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::redis::TryAcquireError;
    /// use paced::{Rate, RateLimiter};
    ///
    /// let local = RateLimiter::new(Rate::per_second(1), 1);
    /// let refused = TryAcquireError::from(local.try_acquire(2).unwrap_err());
    /// assert!(refused.not_until().unwrap().is_never());
    /// ```
    #[must_use]
    pub fn not_until(&self) -> Option<NotUntil> {
        match self {
            TryAcquireError::NotUntil(n) => Some(*n),
            TryAcquireError::Reply(_) => None,
        }
    }
}

impl From<NotUntil> for TryAcquireError {
    fn from(refused: NotUntil) -> Self {
        TryAcquireError::NotUntil(refused)
    }
}

impl fmt::Display for TryAcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryAcquireError::NotUntil(n) => n.fmt(f),
            TryAcquireError::Reply(e) => write!(f, "Redis answered the quota with an error: {e}"),
        }
    }
}

impl std::error::Error for TryAcquireError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TryAcquireError::NotUntil(n) => Some(n),
            TryAcquireError::Reply(e) => Some(e),
        }
    }
}
