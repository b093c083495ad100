//! [`Feedback`]: what an `AdaptiveLayer` reports to (an `Adaptive` of one limit, or of several
//! with feature `http`), and [`LimitsOutcome`], what a response says of each limit of several.

use crate::Adaptive;

use super::outcome::Outcome;

mod sealed {
    pub trait Sealed {}
}

/// A controller an [`AdaptiveLayer`](super::AdaptiveLayer) reports to: an
/// [`Adaptive`] of one limit, fed [`Outcome`]s, or (feature `http`) an `Adaptive<[u64; N]>` of
/// several limits, fed `LimitsOutcome`s. Sealed: paced implements it for these only.
///
/// # Examples
///
/// ```
/// use paced::tower::{Feedback, Outcome};
/// use paced::{Adaptive, Rate, RateLimiter};
///
/// fn fed_outcomes<A: Feedback<Outcome = Outcome>>(_: &A) {}
/// let adaptive = Adaptive::new(RateLimiter::new(Rate::per_second(10), 1), Rate::per_second(1), Rate::per_second(10));
/// fed_outcomes(&adaptive);
/// ```
pub trait Feedback: Clone + sealed::Sealed {
    /// What the classifier makes of a response.
    type Outcome;
    /// Reports one classified response, as the layer does for every response: the same as
    /// calling the controller's `on_success`, `on_throttled` or `on_quota` for it.
    fn report(&self, outcome: Self::Outcome);
}

impl sealed::Sealed for Adaptive {}

impl Feedback for Adaptive {
    type Outcome = Outcome;

    fn report(&self, outcome: Outcome) {
        match outcome {
            Outcome::Success => self.on_success(),
            Outcome::Throttled { retry_after } => self.on_throttled(retry_after),
            Outcome::Quota(quota) => self.on_quota(quota),
            Outcome::Ignore => {}
        }
    }
}

#[cfg(feature = "http")]
pub use self::http::{classify_http_limits, LimitsOutcome};

#[cfg(feature = "http")]
mod http {
    use std::time::{Duration, SystemTime};

    use super::{sealed, Feedback};
    use crate::tower::dialects::limits_from_headers;
    use crate::tower::headers::retry_after;
    use crate::tower::AnnouncedLimit;
    use crate::Adaptive;

    /// What a response says of each limit of several, for an
    /// [`Adaptive`] of several limits (feature `http`): the classifier of
    /// [`AdaptiveLayer::http_multi`](crate::tower::AdaptiveLayer::http_multi) makes one of
    /// each response.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::tower::{AnnouncedLimit, Dimension, LimitsOutcome};
    /// use paced::limiter::Announced;
    ///
    /// let tokens = AnnouncedLimit::new("tokens", Dimension::Tokens, Announced::new(0, Duration::from_secs(6)));
    /// let refused = LimitsOutcome::Throttled { limits: vec![tokens], retry_after: None };
    /// assert_ne!(refused, LimitsOutcome::Ignore);
    /// ```
    #[derive(Clone, Debug, PartialEq, Eq)]
    #[non_exhaustive]
    pub enum LimitsOutcome {
        /// The call went through, announcing these limits (maybe none): reported with
        /// [`Adaptive::on_limits`].
        Success(Vec<AnnouncedLimit>),
        /// The call was refused (`429`, `503`), with the limits it announced and its
        /// `Retry-After`: reported with [`Adaptive::on_throttled_limits`] (the limits with
        /// nothing left are lowered; if none, every adapted limit is).
        Throttled {
            /// The limits the refusal announced.
            limits: Vec<AnnouncedLimit>,
            /// How long the destination asked to wait, if it said.
            retry_after: Option<Duration>,
        },
        /// The answer says nothing about the rate (a connection error, a `500`): not reported.
        Ignore,
    }

    /// Reads an HTTP response for an [`Adaptive`] of several limits (feature `http`), as
    /// [`classify_http`](crate::tower::classify_http) does for one of one limit, keeping every
    /// limit the headers announce ([`limits_from_headers`]: the IETF draft, `X-RateLimit-*`,
    /// OpenAI's and Anthropic's headers):
    ///
    /// - `429` and `503`: [`LimitsOutcome::Throttled`] with the delay of `Retry-After`, or
    ///   else the longest reset of the limits with nothing left;
    /// - other server errors, and transport errors: [`LimitsOutcome::Ignore`];
    /// - anything else: [`LimitsOutcome::Success`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::Response;
    /// use paced::tower::{classify_http_limits, LimitsOutcome};
    ///
    /// let refused = Response::builder()
    ///     .status(429)
    ///     .header("x-ratelimit-remaining-requests", "40")
    ///     .header("x-ratelimit-reset-requests", "1s")
    ///     .header("x-ratelimit-remaining-tokens", "0")
    ///     .header("x-ratelimit-reset-tokens", "6m0s")
    ///     .body(())
    ///     .unwrap();
    /// let LimitsOutcome::Throttled { limits, retry_after } = classify_http_limits::<_, ()>(&Ok(refused)) else {
    ///     panic!()
    /// };
    /// assert_eq!(limits.len(), 2);
    /// assert_eq!(retry_after, Some(Duration::from_secs(360)));
    /// ```
    pub fn classify_http_limits<B, E>(result: &Result<http::Response<B>, E>) -> LimitsOutcome {
        let Ok(response) = result else {
            return LimitsOutcome::Ignore;
        };
        let headers = response.headers();
        match response.status().as_u16() {
            429 | 503 => {
                let limits = limits_from_headers(headers, SystemTime::now());
                let retry_after = retry_after(headers).or_else(|| {
                    limits
                        .iter()
                        .filter(|l| l.announced.remaining == 0)
                        .map(|l| l.announced.reset)
                        .max()
                });
                LimitsOutcome::Throttled {
                    limits,
                    retry_after,
                }
            }
            _ if response.status().is_server_error() => LimitsOutcome::Ignore,
            _ => LimitsOutcome::Success(limits_from_headers(headers, SystemTime::now())),
        }
    }

    impl<const N: usize> sealed::Sealed for Adaptive<[u64; N]> {}

    impl<const N: usize> Feedback for Adaptive<[u64; N]> {
        type Outcome = LimitsOutcome;

        fn report(&self, outcome: LimitsOutcome) {
            match outcome {
                LimitsOutcome::Success(limits) => self.on_limits(&limits),
                LimitsOutcome::Throttled {
                    limits,
                    retry_after,
                } => self.on_throttled_limits(&limits, retry_after),
                LimitsOutcome::Ignore => {}
            }
        }
    }
}
