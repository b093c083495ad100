//! [`RedisLimiterBuilder`], the one builder of both Redis limiters, and its options.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use super::connect::Target;
use super::error::RedisLimiterError;
use super::fallback::Fallback;
use super::key::Naming;
use super::keyed::{Inner, RedisKeyedRateLimiter};
use super::limiter::RedisRateLimiter;
use super::policy::{self, FailurePolicy};
use super::script::{Counters, SCRIPT};
use crate::rate::Rate;
use crate::sync::Mutex;

/// Builds a [`RedisRateLimiter`] ([`RedisRateLimiterBuilder`]) or a
/// [`RedisKeyedRateLimiter`] ([`RedisKeyedRateLimiterBuilder`]): the same options for both.
/// Made by [`RedisRateLimiter::builder`], [`RedisKeyedRateLimiter::builder`] and their
/// `cluster_builder`s.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paced::redis::FailurePolicy;
/// use paced::{Rate, RedisKeyedRateLimiter, RedisRateLimiter};
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
/// # let _ = (sms, per_user);
/// # }
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct RedisLimiterBuilder<L> {
    options: Options,
    limiter: PhantomData<fn() -> L>,
}

/// Builds a [`RedisRateLimiter`]; see [`RedisRateLimiter::builder`].
///
/// # Examples
///
/// ```
/// use paced::redis::RedisRateLimiterBuilder;
/// use paced::{Rate, RedisRateLimiter};
///
/// let builder: RedisRateLimiterBuilder =
///     RedisRateLimiter::builder("redis://127.0.0.1/", "api", Rate::per_second(5), 5);
/// # let _ = builder;
/// ```
pub type RedisRateLimiterBuilder = RedisLimiterBuilder<RedisRateLimiter>;

/// Builds a [`RedisKeyedRateLimiter`]; see [`RedisKeyedRateLimiter::builder`].
///
/// # Examples
///
/// ```
/// use paced::redis::RedisKeyedRateLimiterBuilder;
/// use paced::{Rate, RedisKeyedRateLimiter};
///
/// let builder: RedisKeyedRateLimiterBuilder<String> =
///     RedisKeyedRateLimiter::builder("redis://127.0.0.1/", "tenants", Rate::per_second(5), 5);
/// # let _ = builder;
/// ```
pub type RedisKeyedRateLimiterBuilder<K> = RedisLimiterBuilder<RedisKeyedRateLimiter<K>>;

/// What a builder was told (public in a private module: nameable by no user).
#[derive(Debug)]
pub struct Options {
    target: Target,
    name: String,
    rate: Rate,
    burst: u64,
    lease: Option<(u64, Duration)>,
    policy: FailurePolicy,
    response_timeout: Duration,
    #[cfg(feature = "metrics")]
    metrics_name: Option<String>,
}

pub(crate) mod sealed {
    /// How a Redis limiter is built from a builder's options: out of users' reach.
    pub trait Build: Sized {
        fn build(options: super::Options) -> Result<Self, super::RedisLimiterError>;
    }
}

impl<L> fmt::Debug for RedisLimiterBuilder<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiterBuilder")
            .field("options", &self.options)
            .finish()
    }
}

impl<L> RedisLimiterBuilder<L> {
    /// Without leases, failing closed, with a 250 ms response timeout.
    pub(super) fn new(target: Target, name: String, rate: Rate, burst: u64) -> Self {
        RedisLimiterBuilder {
            options: Options {
                target,
                name,
                rate,
                burst,
                lease: None,
                policy: FailurePolicy::default(),
                response_timeout: Duration::from_millis(250),
                #[cfg(feature = "metrics")]
                metrics_name: None,
            },
            limiter: PhantomData,
        }
    }

    /// Takes up to `max_tokens` from Redis per round trip and spends them locally, so that a
    /// high rate does not cost one round trip per acquisition. Leased tokens unspent after
    /// `max_age` (and any left when the last handle is dropped) are given back. The bound then
    /// holds to within `max_age` of refill; while waiting, a process waits for a whole lease
    /// rather than one token.
    ///
    /// A [`RedisRateLimiter`] asks for a whole lease with every round trip. A
    /// [`RedisKeyedRateLimiter`]'s leases are per key and only for keys in use: a key's first
    /// request takes only its cost, and once a round trip of the key has granted, the key's
    /// next round trips within `max_age` take a lease (so a key not asked again within
    /// `max_age` never holds tokens it does not use, nor costs a round trip to give them back).
    ///
    /// A lease never grants past an earlier request of this process for the same key (one the
    /// lease could not serve, waiting for its round trip or its reservation): later requests,
    /// `try_acquire` too, queue behind it or go to Redis, where its reservation is ahead.
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
    /// # }
    /// ```
    pub fn lease(mut self, max_tokens: u64, max_age: Duration) -> Self {
        self.options.lease = Some((max_tokens, max_age));
        self
    }

    /// What to do while Redis is unreachable (default: [`FailurePolicy::default`]). Under
    /// `FailOpen`, each key falls back to `share` of its limit as this process knows it (the
    /// one it set with `set_limit`, else the default limit).
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
    /// outside `(0, 1]` or a zero response timeout; [`RedisLimiterError::Client`] for an
    /// invalid URL (or no cluster node).
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
        L::build(self.options)
    }
}

impl Options {
    /// The state of a limiter that names its keys by `naming`; `eager_lease` asks for a whole
    /// lease with every round trip, not only for keys in use.
    fn inner<K>(self, naming: Naming, eager_lease: bool) -> Result<Inner<K>, RedisLimiterError> {
        policy::validate(self.burst, self.response_timeout, self.lease, self.policy)?;
        let (lease_tokens, lease_age) = self.lease.unwrap_or((0, Duration::ZERO));
        let conn = self.target.connect(self.response_timeout)?;
        Ok(Inner {
            conn,
            warmth: Arc::default(),
            script: redis::Script::new(SCRIPT),
            naming,
            rate: self.rate,
            burst: self.burst,
            interval_us: policy::interval_us(self.rate),
            policy: self.policy,
            lease_tokens,
            lease_age,
            eager_lease,
            sweeping: AtomicBool::new(false),
            fallback: Mutex::new(Fallback::default()),
            limits: Mutex::new(HashMap::new()),
            keys: Mutex::new(HashMap::new()),
            hasher: RandomState::new(),
            counters: Counters {
                #[cfg(feature = "metrics")]
                metrics: self
                    .metrics_name
                    .as_deref()
                    .map(crate::instrument::RedisMetrics::new),
                ..Counters::default()
            },
        })
    }
}

impl<K> sealed::Build for RedisKeyedRateLimiter<K>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    fn build(options: Options) -> Result<Self, RedisLimiterError> {
        let naming = Naming::prefixed(&options.name);
        Ok(RedisKeyedRateLimiter {
            inner: Arc::new(options.inner(naming, false)?),
        })
    }
}

impl sealed::Build for RedisRateLimiter {
    fn build(options: Options) -> Result<Self, RedisLimiterError> {
        let naming = Naming::Exact(options.name.clone());
        Ok(RedisRateLimiter::from_keyed(RedisKeyedRateLimiter {
            inner: Arc::new(options.inner(naming, true)?),
        }))
    }
}
