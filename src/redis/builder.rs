//! [`RedisLimiterBuilder`], the one builder of every Redis limiter, and its options.

use std::fmt;
use std::time::Duration;

use super::connect::Target;
use super::error::RedisLimiterError;
use super::policy::FailurePolicy;
use super::script::Counters;
use crate::rate::Rate;

/// Builds every Redis limiter: a [`RedisRateLimiter`](crate::redis::RedisRateLimiter) ([`RedisRateLimiterBuilder`](crate::redis::RedisRateLimiterBuilder)) or a
/// [`RedisKeyedRateLimiter`](crate::redis::RedisKeyedRateLimiter) ([`RedisKeyedRateLimiterBuilder`](crate::redis::RedisKeyedRateLimiterBuilder)), of one limit or of several
/// (`L` is the limiter it builds). The same options for all; the several-limit ones add their
/// limits with [`limit`](RedisLimiterBuilder::limit). Made by [`RedisRateLimiter::builder`](crate::redis::RedisRateLimiter::builder),
/// [`RedisKeyedRateLimiter::builder`](crate::redis::RedisKeyedRateLimiter::builder) (one limit), [`RedisRateLimiter::dimensions`](crate::redis::RedisRateLimiter::dimensions),
/// [`RedisKeyedRateLimiter::dimensions`](crate::redis::RedisKeyedRateLimiter::dimensions) (several) and their `cluster_` forms.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paced::redis::FailurePolicy;
/// use paced::{Limit, Rate, RedisKeyedRateLimiter, RedisRateLimiter};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let sms = RedisRateLimiter::builder("redis://127.0.0.1:6379/", "sms", Rate::per_second(100), 10)
///     .lease(20, Duration::from_millis(5))
///     .failure_policy(FailurePolicy::FailOpen { share: 0.25 })
///     .build()
///     .expect("a valid configuration");
/// let per_user = RedisKeyedRateLimiter::<u64>::builder("redis://127.0.0.1/", "users", Rate::per_second(5), 5)
///     .response_timeout(Duration::from_millis(100))
///     .build()
///     .expect("a valid configuration");
/// let llm = RedisRateLimiter::dimensions("redis://127.0.0.1/", "llm", ["requests", "tokens"])
///     .limit("requests", Limit::bucket(Rate::per_minute(500), 50))
///     .limit("tokens", Limit::bucket(Rate::per_minute(40_000), 40_000))
///     .lease([5, 2_000], Duration::from_millis(200))
///     .build()
///     .expect("a valid configuration");
/// # let _ = (sms, per_user, llm);
/// # }
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct RedisLimiterBuilder<L: sealed::Build> {
    options: Options<L::Cost>,
    pub(super) spec: L::Spec,
}

/// What a builder was told, but for the limits (public in a private module: nameable by no
/// user).
#[derive(Debug)]
pub struct Options<C> {
    pub(super) target: Target,
    pub(super) name: String,
    pub(super) lease: Option<(C, Duration)>,
    pub(super) policy: FailurePolicy,
    pub(super) response_timeout: Duration,
    #[cfg(feature = "metrics")]
    pub(super) metrics_name: Option<String>,
}

impl<C> Options<C> {
    /// Fresh counters for the limiter built from these options: recording to its metrics too,
    /// if it was named with `with_metrics`.
    pub(super) fn counters(&self) -> Counters {
        Counters {
            #[cfg(feature = "metrics")]
            metrics: self
                .metrics_name
                .as_deref()
                .map(crate::instrument::RedisMetrics::new),
            ..Counters::default()
        }
    }
}

/// The limit of a one-limit builder (public in a private module: nameable by no user).
#[derive(Debug)]
pub struct OneLimit {
    pub(super) rate: Rate,
    pub(super) burst: u64,
}

pub(crate) mod sealed {
    /// How a Redis limiter is built from a builder's options: out of users' reach.
    pub trait Build: Sized {
        /// What one request costs: what a lease holds at most.
        type Cost: std::fmt::Debug;
        /// Its limits, as the builder was told them.
        type Spec: std::fmt::Debug;
        fn build(
            options: super::Options<Self::Cost>,
            spec: Self::Spec,
        ) -> Result<Self, super::RedisLimiterError>;
    }
}

impl<L: sealed::Build> fmt::Debug for RedisLimiterBuilder<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiterBuilder")
            .field("options", &self.options)
            .field("limits", &self.spec)
            .finish()
    }
}

impl<L: sealed::Build> RedisLimiterBuilder<L> {
    /// Without leases, failing closed, with a 250 ms response timeout.
    pub(super) fn new(target: Target, name: String, spec: L::Spec) -> Self {
        RedisLimiterBuilder {
            options: Options {
                target,
                name,
                lease: None,
                policy: FailurePolicy::default(),
                response_timeout: Duration::from_millis(250),
                #[cfg(feature = "metrics")]
                metrics_name: None,
            },
            spec,
        }
    }

    /// One limit's builder, with `burst` tokens refilled at `rate`.
    pub(super) fn one(target: Target, name: String, rate: Rate, burst: u64) -> Self
    where
        L: sealed::Build<Spec = OneLimit>,
    {
        RedisLimiterBuilder::new(target, name, OneLimit { rate, burst })
    }

    /// Takes up to `max_tokens` (a `u64`, or one amount per dimension for several limits) from
    /// Redis per round trip and spends them locally, so that a high rate does not cost one
    /// round trip per acquisition. Leased tokens unspent after
    /// `max_age` (and any left when the last handle is dropped) are given back. The bound then
    /// holds to within `max_age` of refill; while waiting, a process waits for a whole lease
    /// rather than one token.
    ///
    /// A [`RedisRateLimiter`](crate::redis::RedisRateLimiter) asks for a whole lease with every round trip. A
    /// [`RedisKeyedRateLimiter`](crate::redis::RedisKeyedRateLimiter)'s leases are per key and only for keys in use: a key's first
    /// request takes only its cost, and once a round trip of the key has granted, the key's
    /// next round trips within `max_age` take a lease (so a key not asked again within
    /// `max_age` never holds tokens it does not use, nor costs a round trip to give them back).
    ///
    /// A lease never grants past an earlier request of this process for the same key (one the
    /// lease could not serve, waiting for its round trip or its reservation): later requests,
    /// `try_acquire` too, queue behind it or go to Redis, where its reservation is ahead.
    ///
    /// With several limits (one quota per key for a keyed limiter), a grant that goes to
    /// Redis takes up to `max_tokens[d]` more of each dimension `d` (the least any of its
    /// limits has room for beyond the cost, at the grant's instant), charged in Redis with the
    /// cost. `try_acquire` takes what room there is in each dimension. A reservation
    /// (`acquire`, `acquire_timeout`) over buckets only waits for its cost and a whole lease,
    /// as one limit's does, and one task at a time refills it: a saturated process makes about
    /// one round trip per lease, not one per grant. With a fixed window among the limits (whose
    /// room could come back only in its next window), a reservation takes a lease only if every
    /// dimension asked for has room beyond its cost at its grant's instant, and never waits
    /// longer for one. Either way the lease is this process's once the reservation is
    /// granted. What a lease has not granted when it expires, or when a new lease replaces it,
    /// is given back: with the quota's next round trip or, once no round trip of the quota is
    /// on its way from this process, in the background. Per dimension to each of its
    /// limits, as a [`settle`](super::RedisPermit::settle) of a grant charged at the lease's
    /// instant: a bucket never above its burst, a fixed window only while the window the lease
    /// was charged in lasts (and only the lease's tokens alone: given back with a dropped
    /// waiter's, a window keeps them). (If that round trip fails, or there is no runtime, it
    /// stays charged: on the quota's side.) Every token a lease holds is charged
    /// in Redis when the lease is taken, so Redis holds every limit to its bound; the grants a
    /// lease makes come later, up to `max_age` after that charge, so the fleet's grants can
    /// exceed a limit's bound over a span by at most what the leases taken in it held (a
    /// fixed window: at most the leased tokens charged to the window before). A permit from a
    /// lease is settled in Redis, as charged at the lease's instant.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Rate, RedisKeyedRateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let busy = RedisKeyedRateLimiter::<String>::builder("redis://127.0.0.1/", "t", Rate::per_second(1_000), 50)
    ///     .lease(20, Duration::from_millis(5))
    ///     .build();
    /// assert!(busy.is_ok());
    ///
    /// // Up to 5 requests and 2,000 tokens ahead, for at most 200 ms.
    /// let llm = paced::RedisRateLimiter::dimensions("redis://127.0.0.1/", "llm", ["requests", "tokens"])
    ///     .limit("requests", paced::Limit::bucket(Rate::per_minute(500), 50))
    ///     .limit("tokens", paced::Limit::bucket(Rate::per_minute(40_000), 40_000))
    ///     .lease([5, 2_000], Duration::from_millis(200))
    ///     .build();
    /// assert!(llm.is_ok());
    /// # }
    /// ```
    pub fn lease(mut self, max_tokens: L::Cost, max_age: Duration) -> Self {
        self.options.lease = Some((max_tokens, max_age));
        self
    }

    /// What to do while Redis is unreachable (default: [`FailurePolicy::default`]). Under
    /// `FailOpen`, each key falls back to `share` of its limit as this process knows it (the
    /// one it set with `set_limit`, else the default limit).
    ///
    /// With several limits, a local [`RateLimiter`](crate::RateLimiter) with `share` of every
    /// limit stands in (one per key for a keyed limiter): of the limit this process set with
    /// `set_limit` (and has not cleared), else of the builder's. A limit set by another process
    /// lives in Redis only, which the outage hides: for it, the fallback takes `share` of the
    /// builder's.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::redis::FailurePolicy;
    /// use paced::{Rate, RedisRateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let builder = RedisRateLimiter::builder("redis://127.0.0.1/", "t", Rate::per_second(5), 5)
    ///     .failure_policy(FailurePolicy::FailOpen { share: 0.5 });
    /// assert!(builder.build().is_ok());
    /// # }
    /// ```
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.options.policy = policy;
        self
    }

    /// How long one round trip (and one connection attempt) may take before it counts as an
    /// outage (default 250 ms).
    ///
    /// It must be positive: [`build`](RedisLimiterBuilder::build) refuses zero with
    /// [`ConfigError::ZeroTimeout`](crate::ConfigError::ZeroTimeout). (The `redis` crate takes
    /// zero as a timeout at tokio's next timer tick, not as "no timeout", so whether a round
    /// trip succeeds would depend on how far away Redis is.) There is no "no timeout": a round
    /// trip that never ends would hold `acquire` past the fail-closed deadline and keep
    /// `FailOpen` from falling back; a very long one, up to `Duration::MAX`, is accepted.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::{Rate, RedisKeyedRateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let builder = RedisKeyedRateLimiter::<String>::builder("redis://127.0.0.1/", "t", Rate::per_second(5), 5)
    ///     .response_timeout(Duration::ZERO);
    /// assert!(builder.build().is_err());
    /// # }
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.options.response_timeout = timeout;
        self
    }

    /// Records to the [`metrics`](https://docs.rs/metrics) facade under `name` (feature
    /// `metrics`), every metric with the label `limiter = name`, over all keys (keys are not
    /// labels: their number is unbounded). Given twice, the last name given wins.
    ///
    /// | metric | kind | what |
    /// | --- | --- | --- |
    /// | `paced_grants_total` | counter | acquisitions granted (from Redis, a lease or the fallback) |
    /// | `paced_tokens_granted_total` | counter | tokens (cost) granted |
    /// | `paced_refusals_total` | counter | `try_acquire` calls refused, `acquire_timeout` calls timed out |
    /// | `paced_redis_round_trips_total` | counter | script calls sent (successful or not) |
    /// | `paced_redis_errors_total` | counter | failed round trips, with a label `kind`: `outage` (unreachable, slow, restarting) or `reply` (Redis answered with an error) |
    /// | `paced_redis_fallbacks_total` | counter | grants by the fail-open fallback |
    ///
    /// With several limits, `paced_tokens_granted_total` counts the sum of a cost's amounts.
    ///
    /// The counters of [`RedisStats`](super::RedisStats), for this process; the handles are
    /// registered by [`build`](RedisLimiterBuilder::build), with the recorder in force
    /// then, and shared by every clone. (Waits happen in Redis's reservations, not in a local
    /// queue: there is no wait histogram or waiters gauge.)
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Rate, RedisRateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let quota = RedisRateLimiter::builder("redis://127.0.0.1/", "api", Rate::per_second(5), 5)
    ///     .with_metrics("partner-api")
    ///     .build()
    ///     .unwrap();
    /// # let _ = quota;
    /// # }
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn with_metrics(mut self, name: impl AsRef<str>) -> Self {
        self.options.metrics_name = Some(name.as_ref().to_owned());
        self
    }
}

impl<L: sealed::Build> RedisLimiterBuilder<L> {
    /// Builds the limiter, with one connection (reconnecting by itself) shared by every key
    /// and clone. Nothing is sent to Redis until the first request, so this succeeds while
    /// Redis is down; it needs a tokio runtime.
    ///
    /// # Errors
    ///
    /// [`RedisLimiterError::Config`] for a zero burst, a zero lease, a `FailOpen` share
    /// outside `(0, 1]` or a zero response timeout, and with several limits for a duplicated
    /// or unknown dimension or an invalid limit; [`RedisLimiterError::Client`] for an invalid
    /// URL (or no cluster node).
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Rate, RedisKeyedRateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let zero = RedisKeyedRateLimiter::<u64>::builder("redis://127.0.0.1/", "t", Rate::per_second(5), 0);
    /// assert!(zero.build().is_err());
    /// # }
    /// ```
    pub fn build(self) -> Result<L, RedisLimiterError> {
        L::build(self.options, self.spec)
    }
}
