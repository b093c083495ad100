//! `Adaptive<[u64; N]>`: an [`Adaptive`] for a [`RateLimiter`] of several limits: one control
//! law per adapted limit (the same clock-free law, `core::adaptive_law`), each learning its own
//! limit from the refusals and announcements that concern it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::adaptive::{Adaptive, AdaptiveStats, Wakes};
use super::multi::Permit;
use super::RateLimiter;
#[cfg(feature = "metrics")]
use crate::core::adaptive_law::per_second;
use crate::core::adaptive_law::{AdaptiveLaw, Announced, Controller, Limited, QUOTA_MAX_PAUSE};
use crate::error::{ConfigError, NotUntil};
use crate::limiter::cost::sealed::AdaptiveState;
use crate::rate::Rate;
use crate::sync::{lock, Mutex, MutexGuard};

/// An [`Adaptive`]'s state for several limits: public in a private module (see
/// [`Cost`](crate::limiter::Cost)).
pub struct Several<const N: usize> {
    pub(crate) shared: Arc<Inner<N>>,
}

impl<const N: usize> Clone for Several<N> {
    fn clone(&self) -> Self {
        Several {
            shared: Arc::clone(&self.shared),
        }
    }
}

pub(crate) struct Inner<const N: usize> {
    limiter: RateLimiter<[u64; N]>,
    origin: Instant,
    /// Announced names sent to other limits than their dimension's: (name, limit index).
    routes: Vec<(String, usize)>,
    state: Mutex<Vec<Adapted>>,
    /// One controller's handles per adapted limit, in the order of `state`, for every clone:
    /// replaced if it is named again.
    #[cfg(feature = "metrics")]
    metrics: crate::instrument::Named<Vec<crate::instrument::AdaptiveMetrics>>,
}

/// One adapted limit and its law.
struct Adapted {
    index: usize,
    dim: usize,
    controller: Controller,
}

/// Builds an [`Adaptive`] of several limits (`Adaptive<[u64; N]>`): chooses the limits it
/// adapts, their ranges, and where announcements go.
///
/// # Examples
///
/// ```
/// use paced::{Adaptive, ConfigError, Limit, RateLimiter, Rate};
///
/// let limiter = RateLimiter::builder(["requests"])
///     .limit("requests", Limit::bucket(Rate::per_second(10), 10))
///     .build()
///     .unwrap();
/// let built = Adaptive::builder(limiter).adapt(1, Rate::per_second(1), Rate::per_second(10)).build();
/// assert_eq!(built.err(), Some(ConfigError::NoSuchLimit));
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct AdaptiveBuilder<const N: usize> {
    limiter: RateLimiter<[u64; N]>,
    adapted: Vec<(usize, Rate, Rate)>,
    routes: Vec<(String, usize)>,
}

impl<const N: usize> AdaptiveBuilder<N> {
    /// Adapts the limit at `index` (a token bucket) within `[min, max]`; it starts from the
    /// limit's rate, clamped into that range. Given twice for one index, the last range wins.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Adaptive, Limit, RateLimiter, Rate};
    ///
    /// let limiter = RateLimiter::builder(["requests"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(50), 10))
    ///     .build()
    ///     .unwrap();
    /// let adaptive = Adaptive::builder(limiter)
    ///     .adapt(0, Rate::per_second(1), Rate::per_second(20))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(adaptive.rate(0), Some(Rate::per_second(20))); // clamped
    /// ```
    pub fn adapt(mut self, index: usize, min: Rate, max: Rate) -> Self {
        self.adapted.retain(|(i, _, _)| *i != index);
        self.adapted.push((index, min, max));
        self
    }

    /// Sends the announcements named `announced` to the limit at `index` (which must be
    /// adapted). Once a name has a route, its announcements go only where its routes say,
    /// not to the dimension of that name; routes of one name add up.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Adaptive, Limit, RateLimiter, Rate};
    /// use paced::limiter::Announced;
    ///
    /// let limiter = RateLimiter::builder(["calls"])
    ///     .limit("calls", Limit::bucket(Rate::per_second(10), 10))
    ///     .build()
    ///     .unwrap();
    /// let adaptive = Adaptive::builder(limiter)
    ///     .adapt(0, Rate::per_second(1), Rate::per_second(10))
    ///     .route("minute", 0) // an IETF policy called "minute"
    ///     .build()
    ///     .unwrap();
    /// adaptive.on_quota("minute", Announced::new(59, Duration::from_secs(30)));
    /// assert_eq!(adaptive.rate(0), Some(Rate::per_second(2)));
    /// ```
    pub fn route(mut self, announced: &str, index: usize) -> Self {
        self.routes.push((announced.to_owned(), index));
        self
    }

    /// The controller, or the first [`ConfigError`] found.
    ///
    /// # Errors
    ///
    /// [`ConfigError::NoSuchLimit`] for an index with no limit, or a route to a limit that is
    /// not adapted; [`ConfigError::LimitKind`] for a fixed window;
    /// [`ConfigError::MinAboveMax`] for a range whose `min` is above its `max`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Adaptive, ConfigError, Limit, RateLimiter, Rate};
    ///
    /// let limiter = RateLimiter::builder(["requests"])
    ///     .limit("requests", Limit::window(100, Duration::from_secs(60)))
    ///     .build()
    ///     .unwrap();
    /// let built = Adaptive::builder(limiter).adapt(0, Rate::per_second(1), Rate::per_second(2)).build();
    /// assert_eq!(built.err(), Some(ConfigError::LimitKind));
    /// ```
    pub fn build(self) -> Result<Adaptive<[u64; N]>, ConfigError> {
        let limiter = self.limiter;
        let mut adapted = Vec::with_capacity(self.adapted.len());
        let mut wakes = Wakes::default();
        for &(index, min, max) in &self.adapted {
            let (dim, rate) = limiter.limit_info(index).ok_or(ConfigError::NoSuchLimit)?;
            rate.ok_or(ConfigError::LimitKind)?;
            if max < min {
                return Err(ConfigError::MinAboveMax);
            }
            adapted.push((index, dim, min, max));
        }
        for (_, index) in &self.routes {
            if !adapted.iter().any(|a| a.0 == *index) {
                return Err(ConfigError::NoSuchLimit);
            }
        }
        let adapted = adapted
            .into_iter()
            .map(|(index, dim, min, max)| Adapted {
                index,
                dim,
                controller: Controller::new(
                    AdaptiveLaw::Cubic,
                    min,
                    max,
                    &mut Bound {
                        limiter: &limiter,
                        index,
                        wakes: &mut wakes,
                    },
                ),
            })
            .collect();
        wakes.run();
        Ok(Adaptive {
            inner: Several {
                shared: Arc::new(Inner {
                    limiter,
                    origin: Instant::now(),
                    routes: self.routes,
                    state: Mutex::new(adapted),
                    #[cfg(feature = "metrics")]
                    metrics: crate::instrument::Named::default(),
                }),
            },
        })
    }
}

/// A controller of several limits, `Adaptive<[u64; N]>`: learns each token-bucket limit of a
/// [`RateLimiter`] of several limits on its own, from the destination's refusals and
/// announcements, and keeps each at the rate found, within its own `[min, max]`.
///
/// Each adapted limit (chosen by its index, as
/// [`set_limit`](RateLimiter#method.set_limit-1) numbers them) has a control law of its own, the
/// one an [`Adaptive`] of one limit describes: a refusal lowers it to 80 % of the rate
/// measured (once per overload), successes probe it back up along a cubic curve, and an
/// announced quota sets it and holds it there. The rates are set with
/// [`set_limit`](RateLimiter#method.set_limit-1): each bucket keeps its level and its burst.
/// Fixed windows cannot be adapted (their quota is the provider's contract, not a rate).
///
/// - [`on_success`](Adaptive::on_success): every adapted limit probes up.
/// - [`on_throttled_limit`](Adaptive::on_throttled_limit) (or
///   [`on_throttled_dimension`](Adaptive::on_throttled_dimension)): a refusal that names
///   its limit lowers that limit only.
/// - [`on_throttled`](Adaptive::on_throttled): **a refusal that does not name its limit
///   lowers every adapted limit**. Any of them may have refused, and lowering one that did not
///   costs little: its next announcement sets it back, or the curve climbs back within
///   seconds; leaving the one that did refuse unchanged would be refused again.
/// - [`on_quota`](Adaptive#method.on_quota-1) / `on_limits` (feature `http`): an
///   announced limit sets the limits it is routed to. By default an announcement named as a
///   dimension of the limiter (`"requests"`, `"tokens"`, `"input-tokens"`,
///   `"output-tokens"`, as `paced::tower::limits_from_headers` (feature `http`) names
///   OpenAI's and Anthropic's limits) goes to every adapted limit of that dimension;
///   [`AdaptiveBuilder::route`] sends a name elsewhere (an IETF policy `"minute"`, a
///   dimension called otherwise).
///
/// A `Retry-After` pauses the whole limiter ([`RateLimiter::pause_for`]): a call needs
/// every limit. Cloning is cheap (an `Arc`); every clone is the same controller.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paced::{Adaptive, Limit, RateLimiter, Rate};
/// use paced::limiter::Announced;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let limiter = RateLimiter::builder(["requests", "tokens"])
///     .limit("requests", Limit::bucket(Rate::per_second(10), 10)) // index 0
///     .limit("tokens", Limit::bucket(Rate::per_second(1_000), 1_000)) // index 1
///     .build()
///     .unwrap();
/// let adaptive = Adaptive::builder(limiter)
///     .adapt(0, Rate::per_second(1), Rate::per_second(10))
///     .adapt(1, Rate::per_second(100), Rate::per_second(1_000))
///     .build()
///     .unwrap();
/// adaptive.acquire([1, 300]).await;
/// // The provider refused for lack of tokens: tokens only are lowered.
/// adaptive.on_throttled_limit(1, None);
/// assert_eq!(adaptive.rate(0), Some(Rate::per_second(10)));
/// assert_eq!(adaptive.rate(1), Some(Rate::per_second(800)));
/// // It announces 50 requests left for 10 s: requests only are set.
/// adaptive.on_quota("requests", Announced::new(49, Duration::from_secs(10)));
/// assert_eq!(adaptive.rate(0), Some(Rate::per_second(5)));
/// # }
/// ```
impl<const N: usize> Adaptive<[u64; N]> {
    /// Starts a controller over `limiter`: choose the limits it adapts with
    /// [`adapt`](AdaptiveBuilder::adapt).
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Adaptive, Limit, RateLimiter, Rate};
    ///
    /// let limiter = RateLimiter::builder(["requests", "tokens"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(10), 10))
    ///     .limit("tokens", Limit::bucket(Rate::per_second(1_000), 1_000))
    ///     .build()
    ///     .unwrap();
    /// let adaptive = Adaptive::builder(limiter)
    ///     .adapt(1, Rate::per_second(10), Rate::per_second(1_000)) // tokens only
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(adaptive.rate(0), None); // not adapted
    /// ```
    pub fn builder(limiter: RateLimiter<[u64; N]>) -> AdaptiveBuilder<N> {
        AdaptiveBuilder {
            limiter,
            adapted: Vec::new(),
            routes: Vec::new(),
        }
    }

    /// Reports a refusal that names its limit: the adapted limit at `index` is lowered, the
    /// others are not reported (a limit that is not adapted: only the pause applies). With
    /// `Some(d)` nothing is granted before `d` from now.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paced::{Adaptive, Limit, RateLimiter, Rate};
    /// # let limiter = RateLimiter::builder(["requests", "tokens"])
    /// #     .limit("requests", Limit::bucket(Rate::per_second(10), 10))
    /// #     .limit("tokens", Limit::bucket(Rate::per_second(1_000), 1_000)).build().unwrap();
    /// let adaptive = Adaptive::builder(limiter)
    ///     .adapt(0, Rate::per_second(1), Rate::per_second(10))
    ///     .adapt(1, Rate::per_second(10), Rate::per_second(1_000))
    ///     .build()
    ///     .unwrap();
    /// adaptive.on_throttled_limit(0, None);
    /// assert_eq!(adaptive.rate(0), Some(Rate::per_second(8)));
    /// assert_eq!(adaptive.rate(1), Some(Rate::per_second(1_000)));
    /// ```
    pub fn on_throttled_limit(&self, index: usize, retry_after: Option<Duration>) {
        self.inner.shared.report(
            |a| (a.index == index).then_some(Report::Throttled),
            retry_after,
        );
    }

    /// Reports a refusal that names the limits it ran out of by their announced name
    /// (`"tokens"`): every adapted limit that name is routed to (see [`Adaptive`]) is
    /// lowered, the others are not reported. With `Some(d)` nothing is granted before `d`
    /// from now.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paced::{Adaptive, Limit, RateLimiter, Rate};
    /// # let limiter = RateLimiter::builder(["requests", "tokens"])
    /// #     .limit("requests", Limit::bucket(Rate::per_second(10), 10))
    /// #     .limit("tokens", Limit::bucket(Rate::per_second(1_000), 1_000)).build().unwrap();
    /// let adaptive = Adaptive::builder(limiter)
    ///     .adapt(0, Rate::per_second(1), Rate::per_second(10))
    ///     .adapt(1, Rate::per_second(10), Rate::per_second(1_000))
    ///     .build()
    ///     .unwrap();
    /// adaptive.on_throttled_dimension("tokens", None);
    /// assert_eq!(adaptive.rate(0), Some(Rate::per_second(10)));
    /// assert_eq!(adaptive.rate(1), Some(Rate::per_second(800)));
    /// ```
    pub fn on_throttled_dimension(&self, announced: &str, retry_after: Option<Duration>) {
        self.inner.shared.report(
            |a| self.routed(announced, a).then_some(Report::Throttled),
            retry_after,
        );
    }

    /// Reports an announced quota named `announced` (`"requests"`, `"tokens"`, or a name
    /// routed with [`AdaptiveBuilder::route`]): each adapted limit it is routed to is set
    /// from it, as [`on_quota`](Adaptive::on_quota) of one limit says, within its own
    /// `[min, max]`; it counts as a success of those limits only. Nothing left (not a token
    /// bucket): the whole limiter grants nothing until its `reset` (a day at most).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Adaptive, Limit, RateLimiter, Rate};
    /// use paced::limiter::Announced;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let limiter = RateLimiter::builder(["requests", "tokens"])
    /// #     .limit("requests", Limit::bucket(Rate::per_second(10), 10))
    /// #     .limit("tokens", Limit::bucket(Rate::per_second(1_000), 1_000)).build().unwrap();
    /// let adaptive = Adaptive::builder(limiter)
    ///     .adapt(0, Rate::per_second(1), Rate::per_second(10))
    ///     .adapt(1, Rate::per_second(10), Rate::per_second(1_000))
    ///     .build()
    ///     .unwrap();
    /// // 3,599 tokens left after this call, restored in 6 s.
    /// adaptive.on_quota("tokens", Announced::new(3_599, Duration::from_secs(6)));
    /// assert_eq!(adaptive.rate(1), Some(Rate::per_second(600)));
    /// assert_eq!(adaptive.rate(0), Some(Rate::per_second(10)));
    /// # }
    /// ```
    pub fn on_quota(&self, announced: &str, quota: Announced) {
        self.inner.shared.report(
            |a| {
                self.routed(announced, a)
                    .then_some(Report::Announced(quota))
            },
            None,
        );
    }

    /// Reports a response that went through with the limits it announced (as
    /// [`limits_from_headers`](crate::tower::limits_from_headers) reads them; feature `http`):
    /// each adapted limit to which an announcement is routed is set from it (of several, the
    /// one allowing the lowest rate), and the others count a success.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::tower::{AnnouncedLimit, Dimension};
    /// use paced::{Adaptive, Limit, RateLimiter, Rate};
    /// use paced::limiter::Announced;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let limiter = RateLimiter::builder(["requests", "tokens"])
    /// #     .limit("requests", Limit::bucket(Rate::per_second(10), 10))
    /// #     .limit("tokens", Limit::bucket(Rate::per_second(1_000), 1_000)).build().unwrap();
    /// let adaptive = Adaptive::builder(limiter)
    ///     .adapt(0, Rate::per_second(1), Rate::per_second(10))
    ///     .adapt(1, Rate::per_second(10), Rate::per_second(1_000))
    ///     .build()
    ///     .unwrap();
    /// adaptive.on_limits(&[
    ///     AnnouncedLimit::new("requests", Dimension::Requests, Announced::new(5, Duration::from_secs(2))),
    ///     AnnouncedLimit::new("tokens", Dimension::Tokens, Announced::new(199, Duration::from_secs(1))),
    /// ]);
    /// assert_eq!(adaptive.rate(0), Some(Rate::per_second(3)));
    /// assert_eq!(adaptive.rate(1), Some(Rate::per_second(200)));
    /// # }
    /// ```
    #[cfg(feature = "http")]
    #[cfg_attr(docsrs, doc(cfg(feature = "http")))]
    pub fn on_limits(&self, limits: &[crate::limiter::AnnouncedLimit]) {
        self.inner.shared.report(
            |a| {
                Some(
                    self.binding(limits, a)
                        .map_or(Report::Success, Report::Announced),
                )
            },
            None,
        );
    }

    /// Reports a refusal (`429`) with the limits it announced, and its `Retry-After`: the
    /// announced limits with nothing left (`remaining` 0) name the limits that refused, and
    /// those are lowered only (the adapted limits they are routed to); if none is exhausted
    /// (or none is routed to an adapted limit), the refusal names no limit and every adapted
    /// limit is lowered, as in [`on_throttled`](Adaptive::on_throttled). Feature `http`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::tower::{AnnouncedLimit, Dimension};
    /// use paced::{Adaptive, Limit, RateLimiter, Rate};
    /// use paced::limiter::Announced;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let limiter = RateLimiter::builder(["requests", "tokens"])
    /// #     .limit("requests", Limit::bucket(Rate::per_second(10), 10))
    /// #     .limit("tokens", Limit::bucket(Rate::per_second(1_000), 1_000)).build().unwrap();
    /// let adaptive = Adaptive::builder(limiter)
    ///     .adapt(0, Rate::per_second(1), Rate::per_second(10))
    ///     .adapt(1, Rate::per_second(10), Rate::per_second(1_000))
    ///     .build()
    ///     .unwrap();
    /// adaptive.on_throttled_limits(&[
    ///     AnnouncedLimit::new("requests", Dimension::Requests, Announced::new(40, Duration::from_secs(6))),
    ///     AnnouncedLimit::new("tokens", Dimension::Tokens, Announced::new(0, Duration::from_secs(6))),
    /// ], None);
    /// assert_eq!(adaptive.rate(0), Some(Rate::per_second(10)));
    /// assert_eq!(adaptive.rate(1), Some(Rate::per_second(800)));
    /// # }
    /// ```
    #[cfg(feature = "http")]
    #[cfg_attr(docsrs, doc(cfg(feature = "http")))]
    pub fn on_throttled_limits(
        &self,
        limits: &[crate::limiter::AnnouncedLimit],
        retry_after: Option<Duration>,
    ) {
        let exhausted: Vec<&str> = limits
            .iter()
            .filter(|l| l.announced.remaining == 0)
            .map(|l| l.name.as_str())
            .collect();
        let st = self.inner.shared.lock();
        let named = st
            .iter()
            .any(|a| exhausted.iter().any(|name| self.routed(name, a)));
        drop(st);
        if named {
            self.inner.shared.report(
                |a| {
                    exhausted
                        .iter()
                        .any(|name| self.routed(name, a))
                        .then_some(Report::Throttled)
                },
                retry_after,
            );
        } else {
            self.on_throttled(retry_after);
        }
    }

    /// The rate of the adapted limit at `index` now; `None` if it is not adapted.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paced::{Adaptive, Limit, RateLimiter, Rate};
    /// # let limiter = RateLimiter::builder(["requests"])
    /// #     .limit("requests", Limit::bucket(Rate::per_second(10), 10)).build().unwrap();
    /// let adaptive = Adaptive::builder(limiter)
    ///     .adapt(0, Rate::per_second(1), Rate::per_second(10))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(adaptive.rate(0), Some(Rate::per_second(10)));
    /// assert_eq!(adaptive.rate(1), None);
    /// ```
    #[must_use]
    pub fn rate(&self, index: usize) -> Option<Rate> {
        if !self.inner.shared.lock().iter().any(|a| a.index == index) {
            return None;
        }
        self.inner
            .shared
            .limiter
            .limit_info(index)
            .and_then(|(_, r)| r)
    }

    /// The counters of the adapted limit at `index` (the reports that concerned it) and its
    /// rate now; `None` if it is not adapted.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paced::{Adaptive, Limit, RateLimiter, Rate};
    /// # let limiter = RateLimiter::builder(["requests", "tokens"])
    /// #     .limit("requests", Limit::bucket(Rate::per_second(10), 10))
    /// #     .limit("tokens", Limit::bucket(Rate::per_second(1_000), 1_000)).build().unwrap();
    /// let adaptive = Adaptive::builder(limiter)
    ///     .adapt(0, Rate::per_second(1), Rate::per_second(10))
    ///     .adapt(1, Rate::per_second(10), Rate::per_second(1_000))
    ///     .build()
    ///     .unwrap();
    /// adaptive.on_throttled_limit(1, None);
    /// assert_eq!(adaptive.stats(0).unwrap().throttled, 0);
    /// assert_eq!(adaptive.stats(1).unwrap().decreases, 1);
    /// ```
    #[must_use]
    pub fn stats(&self, index: usize) -> Option<AdaptiveStats> {
        let (successes, throttled, decreases) = self
            .inner
            .shared
            .lock()
            .iter()
            .find(|a| a.index == index)?
            .controller
            .counts();
        Some(AdaptiveStats {
            successes,
            throttled,
            decreases,
            rate: self
                .inner
                .shared
                .limiter
                .limit_info(index)
                .and_then(|(_, r)| r)?,
        })
    }

    /// The limiter the controller sets.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paced::{Adaptive, Limit, RateLimiter, Rate};
    /// # let limiter = RateLimiter::builder(["requests"])
    /// #     .limit("requests", Limit::bucket(Rate::per_second(10), 10)).build().unwrap();
    /// let adaptive = Adaptive::builder(limiter).build().unwrap();
    /// assert_eq!(adaptive.limiter().available(), [10]);
    /// ```
    #[must_use]
    pub fn limiter(&self) -> &RateLimiter<[u64; N]> {
        &self.inner.shared.limiter
    }

    /// Waits until `cost` is granted: [`RateLimiter::acquire`](RateLimiter#method.acquire-1) on the
    /// limiter.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paced::{Adaptive, Limit, RateLimiter, Rate};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let limiter = RateLimiter::builder(["requests"])
    /// #     .limit("requests", Limit::bucket(Rate::per_second(10), 10)).build().unwrap();
    /// let adaptive = Adaptive::builder(limiter).build().unwrap();
    /// let permit = adaptive.acquire([1]).await;
    /// assert_eq!(permit.charged(), [1]);
    /// # }
    /// ```
    pub async fn acquire(&self, cost: [u64; N]) -> Permit<N> {
        self.inner.shared.limiter.acquire(cost).await
    }

    /// Takes `cost` now if every limit has room and nobody waits:
    /// [`RateLimiter::try_acquire`](RateLimiter#method.try_acquire-1) on the limiter.
    ///
    /// # Errors
    ///
    /// [`NotUntil`], as [`RateLimiter::try_acquire`](RateLimiter#method.try_acquire-1) says.
    ///
    /// # Examples
    ///
    /// ```
    /// # use paced::{Adaptive, Limit, RateLimiter, Rate};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let limiter = RateLimiter::builder(["requests"])
    /// #     .limit("requests", Limit::bucket(Rate::per_second(10), 1)).build().unwrap();
    /// let adaptive = Adaptive::builder(limiter).build().unwrap();
    /// assert!(adaptive.try_acquire([1]).is_ok());
    /// assert!(adaptive.try_acquire([1]).is_err());
    /// # }
    /// ```
    pub fn try_acquire(&self, cost: [u64; N]) -> Result<Permit<N>, NotUntil> {
        self.inner.shared.limiter.try_acquire(cost)
    }

    /// Waits for `cost` only if it can be had within `timeout`:
    /// [`RateLimiter::acquire_timeout`](RateLimiter#method.acquire_timeout-1) on the limiter.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] with how long the request would have waited.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// # use paced::{Adaptive, Limit, RateLimiter, Rate};
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let limiter = RateLimiter::builder(["requests"])
    /// #     .limit("requests", Limit::bucket(Rate::per_second(10), 1)).build().unwrap();
    /// let adaptive = Adaptive::builder(limiter).build().unwrap();
    /// adaptive.acquire([1]).await;
    /// assert!(adaptive.acquire_timeout([1], Duration::from_millis(50)).await.is_err());
    /// assert!(adaptive.acquire_timeout([1], Duration::from_millis(100)).await.is_ok());
    /// # }
    /// ```
    pub async fn acquire_timeout(
        &self,
        cost: [u64; N],
        timeout: Duration,
    ) -> Result<Permit<N>, NotUntil> {
        self.inner
            .shared
            .limiter
            .acquire_timeout(cost, timeout)
            .await
    }

    /// Per dimension, what could be taken now:
    /// [`RateLimiter::available`](RateLimiter#method.available-1).
    ///
    /// # Examples
    ///
    /// ```
    /// # use paced::{Adaptive, Limit, RateLimiter, Rate};
    /// # let limiter = RateLimiter::builder(["requests"])
    /// #     .limit("requests", Limit::bucket(Rate::per_second(10), 3)).build().unwrap();
    /// let adaptive = Adaptive::builder(limiter).build().unwrap();
    /// assert_eq!(adaptive.available(), [3]);
    /// ```
    #[must_use]
    pub fn available(&self) -> [u64; N] {
        self.inner.shared.limiter.available()
    }

    /// Whether an announcement named `name` goes to the adapted limit `a`.
    fn routed(&self, name: &str, a: &Adapted) -> bool {
        let mut routes = self
            .inner
            .shared
            .routes
            .iter()
            .filter(|(n, _)| n == name)
            .peekable();
        if routes.peek().is_some() {
            routes.any(|(_, i)| *i == a.index)
        } else {
            self.inner.shared.limiter.names()[a.dim] == name
        }
    }

    /// Of the announcements routed to `a`, the one allowing the lowest rate.
    #[cfg(feature = "http")]
    fn binding(&self, limits: &[crate::limiter::AnnouncedLimit], a: &Adapted) -> Option<Announced> {
        limits
            .iter()
            .filter(|l| self.routed(&l.name, a))
            .map(|l| l.announced)
            .min_by(|x, y| x.rate().total_cmp(&y.rate()))
    }
}

/// What one response says of one adapted limit.
#[derive(Clone, Copy)]
enum Report {
    Success,
    Throttled,
    Announced(Announced),
}

impl<const N: usize> Inner<N> {
    /// Folds one response into each adapted limit `what` gives a report for.
    fn report(&self, what: impl Fn(&Adapted) -> Option<Report>, retry_after: Option<Duration>) {
        let limiter = &self.limiter;
        // What concerns each limit depends only on its index and dimension, which never
        // change: decided first, so that the limiter is paused (and its head waiter woken)
        // outside the controller's lock, as `Adaptive` does.
        let reports: Vec<Option<Report>> = self.lock().iter().map(&what).collect();
        let exhausted = |quota: &Announced| quota.remaining == 0 && !quota.is_bucket();
        let pause = reports
            .iter()
            .filter_map(|r| match r {
                Some(Report::Announced(quota)) if exhausted(quota) => {
                    Some(quota.reset.min(QUOTA_MAX_PAUSE))
                }
                _ => None,
            })
            .chain(retry_after)
            .max();
        if let Some(d) = pause {
            limiter.pause_for(d);
        }
        let now = Instant::now()
            .saturating_duration_since(self.origin)
            .as_secs_f64();
        let mut wakes = Wakes::default();
        let mut st = self.lock();
        for (k, (a, report)) in st.iter_mut().zip(reports).enumerate() {
            let Some(report) = report else { continue };
            let decreases = a.controller.counts().2;
            let mut bound = Bound {
                limiter,
                index: a.index,
                wakes: &mut wakes,
            };
            match report {
                Report::Success => a.controller.report(&mut bound, false, None, now),
                Report::Throttled => a.controller.report(&mut bound, true, retry_after, now),
                Report::Announced(quota) => {
                    a.controller
                        .announce(&mut bound, quota, exhausted(&quota), now);
                }
            }
            self.record(k, &a.controller, decreases);
        }
        drop(st);
        wakes.run();
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Adapted>> {
        lock(&self.state)
    }

    /// Records the rate of the `k`-th adapted limit now and its decreases since there were
    /// `decreases_before` (under the lock its report was decided under).
    #[inline]
    #[allow(unused_variables, clippy::unused_self)]
    fn record(&self, k: usize, controller: &Controller, decreases_before: u64) {
        #[cfg(feature = "metrics")]
        if let Some(m) = self.metrics.get() {
            m[k].rate.set(per_second(controller.rate()));
            m[k].decreases
                .increment(controller.counts().2.saturating_sub(decreases_before));
        }
    }
}

/// One limit of the limiter as its law sees it.
struct Bound<'a, const N: usize> {
    limiter: &'a RateLimiter<[u64; N]>,
    index: usize,
    wakes: &'a mut Wakes,
}

impl<const N: usize> Limited for Bound<'_, N> {
    fn rate(&self) -> Rate {
        // An adapted limit is a bucket, and stays one: `set_limit` refuses another kind.
        self.limiter
            .limit_info(self.index)
            .and_then(|(_, r)| r)
            .expect("an adapted limit is a bucket")
    }
    fn granted(&self) -> u64 {
        self.limiter.stats().granted
    }
    /// In the limit's own units: for a limit of tokens, more than the calls whose cost is
    /// already in the bucket, so an overload's refusals are counted as one for longer, never
    /// beyond the law's 2 s.
    fn available(&self) -> u64 {
        self.limiter.limit_available(self.index)
    }
    fn set_rate(&mut self, rate: Rate) {
        self.wakes
            .defer(self.limiter.set_bucket_rate_deferred(self.index, rate));
    }
}

impl<const N: usize> AdaptiveState for Several<N> {
    fn on_success(&self) {
        self.shared.report(|_| Some(Report::Success), None);
    }
    fn on_throttled(&self, retry_after: Option<Duration>) {
        self.shared.report(|_| Some(Report::Throttled), retry_after);
    }
    #[cfg(feature = "metrics")]
    fn set_metrics(&self, name: &str) {
        let _named = self.shared.limiter.clone().with_metrics(name);
        let st = self.shared.lock();
        let metrics: Vec<_> = st
            .iter()
            .map(|a| {
                let m = crate::instrument::AdaptiveMetrics::for_limit(name, a.index);
                m.rate.set(per_second(a.controller.rate()));
                m
            })
            .collect();
        self.shared.metrics.replace(metrics, |_| {});
    }
}

impl<const N: usize> std::fmt::Debug for Several<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.lock();
        let adapted: Vec<_> = st.iter().map(|a| (a.index, a.controller.range())).collect();
        f.debug_struct("Adaptive")
            .field("limiter", &self.shared.limiter)
            .field("adapted", &adapted)
            .finish_non_exhaustive()
    }
}
