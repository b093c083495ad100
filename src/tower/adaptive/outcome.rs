//! [`Outcome`]: what a response says about the destination's limit, as a classifier reads it.

use std::time::Duration;

use crate::limiter::Announced;

/// What a response says about the destination's limit: the classifier of an
/// [`AdaptiveLayer`] turns each `Result` into one.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paced::tower::Outcome;
///
/// // A classifier over a plain status code and an optional delay.
/// let classify = |answer: &Result<(u16, Option<u64>), std::io::Error>| match answer {
///     Ok((429 | 503, secs)) => Outcome::Throttled { retry_after: secs.map(Duration::from_secs) },
///     Ok(_) => Outcome::Success,
///     Err(_) => Outcome::Ignore,
/// };
/// assert_eq!(classify(&Ok((200, None))), Outcome::Success);
/// assert_eq!(
///     classify(&Ok((429, Some(2)))),
///     Outcome::Throttled { retry_after: Some(Duration::from_secs(2)) },
/// );
/// ```
///
/// [`AdaptiveLayer`]: super::AdaptiveLayer
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The call went through: reported with [`Adaptive::on_success`].
    ///
    /// [`Adaptive::on_success`]: crate::Adaptive::on_success
    Success,
    /// The call was refused for going too fast (`429 Too Many Requests`, `503 Slow Down`):
    /// reported with [`Adaptive::on_throttled`], which also pauses the limiter for
    /// `retry_after` if there is one.
    ///
    /// [`Adaptive::on_throttled`]: crate::Adaptive::on_throttled
    Throttled {
        /// The destination's `Retry-After`, if it sent one.
        retry_after: Option<Duration>,
    },
    /// The call went through and the answer announced the destination's quota: reported with
    /// [`Adaptive::on_quota`], which counts a success and paces to the quota.
    ///
    /// [`Adaptive::on_quota`]: crate::Adaptive::on_quota
    Quota(Announced),
    /// The answer says nothing about the rate (a connection error, a `500`): not reported.
    Ignore,
}
