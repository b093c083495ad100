//! The builder of several limits: a [`RedisRateLimiter<[u64; N]>`](RedisRateLimiter)'s
//! dimensions and limits, checked and put in the script's form when it is built.

use std::sync::Arc;

use super::builder::sealed::Build;
use super::builder::{OneLimit, Options, RedisLimiterBuilder};
use super::connect::Target;
use super::error::RedisLimiterError;
use super::limiter::{One, RedisRateLimiter, RedisRateLimiterBuilder};
use super::policy;
use super::script::SCRIPT;
use super::several::{Form, Inner, Kind, Quota, RedisLimit, Several};
use super::turns::Warmth;
use crate::error::ConfigError;
use crate::limiter::multi::by_dimension;
use crate::limiter::Limit;

/// What a several-limit builder was told beyond the common options: the dimensions' names
/// and the limits on them (public in a private module: nameable by no user).
#[derive(Debug)]
pub struct Dimensions<const N: usize> {
    names: [String; N],
    limits: Vec<(String, Limit)>,
}

impl<const N: usize> Dimensions<N> {
    pub(super) fn new(names: [&str; N]) -> Self {
        Dimensions {
            names: names.map(str::to_owned),
            limits: Vec::new(),
        }
    }

    pub(super) fn limit(&mut self, name: &str, limit: Limit) {
        self.limits.push((name.to_owned(), limit));
    }
}

impl<L: Build<Spec = Dimensions<N>>, const N: usize> RedisLimiterBuilder<L> {
    /// A builder of several limits on the dimensions `names`, none set yet: as
    /// [`one`](RedisLimiterBuilder::one) is for one limit.
    pub(super) fn several(target: Target, name: impl Into<String>, names: [&str; N]) -> Self {
        RedisLimiterBuilder::new(target, name.into(), Dimensions::new(names))
    }
}

impl Build for RedisRateLimiter {
    type Cost = u64;
    type Spec = OneLimit;

    fn build(options: Options<u64>, limit: OneLimit) -> Result<Self, RedisLimiterError> {
        let several = Several::one(options, limit, true)?;
        Ok(RedisRateLimiter {
            inner: One {
                several: RedisRateLimiter { inner: several },
            },
        })
    }
}

impl<const N: usize> Build for RedisRateLimiter<[u64; N]> {
    type Cost = [u64; N];
    type Spec = Dimensions<N>;

    fn build(options: Options<[u64; N]>, spec: Dimensions<N>) -> Result<Self, RedisLimiterError> {
        Ok(RedisRateLimiter {
            inner: Several::build(
                options,
                spec,
                Form {
                    eager_lease: true,
                    one: false,
                },
            )?,
        })
    }
}

impl<const N: usize> Several<N> {
    /// The state of a limiter of the limits `spec`: its one quota, named as given, and what
    /// every quota of a keyed limiter built from it shares. `eager_lease`: with leases, every
    /// round trip asks for one (see [`Inner::eager_lease`]).
    pub(super) fn build(
        options: Options<[u64; N]>,
        spec: Dimensions<N>,
        form: Form,
    ) -> Result<Self, RedisLimiterError> {
        let config = |e| RedisLimiterError::Config(e);
        policy::validate(1, options.response_timeout, None, options.policy)?;
        if let Some((max_tokens, _)) = options.lease {
            if max_tokens == [0; N] {
                return Err(config(ConfigError::ZeroLease));
            }
        }
        let limits = by_dimension(&spec.names, &spec.limits, |dim, limit| {
            RedisLimit::new(dim, Kind::of(limit))
        })
        .map_err(config)?;
        let conn = options.target.connect(options.response_timeout)?;
        let name = super::key::escape(&options.name);
        let key = if form.one {
            options.name.clone()
        } else {
            let mut key = String::with_capacity(name.len() + 2);
            key.push('{');
            key.push_str(&name);
            key.push('}');
            key
        };
        let warmth = Arc::new(Warmth::default());
        let shared = Arc::new(Inner {
            conn,
            warmth,
            script: redis::Script::new(SCRIPT),
            name,
            names: spec.names,
            limits,
            policy: options.policy,
            lease: options.lease,
            eager_lease: form.eager_lease,
            one: form.one,
            counters: options.counters(),
        });
        Ok(Several {
            quota: Arc::new(Quota::new(key, shared)),
        })
    }
}

/// The one dimension of a one-limit limiter, as its fail-open fallback names it.
const TOKENS: &str = "tokens";

impl Several<1> {
    /// The state of a one-limit limiter of `limit`: the quota of one dimension, in the
    /// one-bucket form (see [`Form::one`]).
    pub(super) fn one(
        options: Options<u64>,
        limit: OneLimit,
        eager_lease: bool,
    ) -> Result<Self, RedisLimiterError> {
        let OneLimit { rate, burst } = limit;
        policy::validate(
            burst,
            options.response_timeout,
            options.lease,
            options.policy,
        )?;
        let mut spec = Dimensions::new([TOKENS]);
        spec.limit(TOKENS, Limit::bucket(rate, burst));
        let options = Options {
            target: options.target,
            name: options.name,
            lease: options.lease.map(|(m, age)| ([m], age)),
            policy: options.policy,
            response_timeout: options.response_timeout,
            #[cfg(feature = "metrics")]
            metrics_name: options.metrics_name,
        };
        let form = Form {
            eager_lease,
            one: true,
        };
        Several::build(options, spec, form)
    }
}

impl<const N: usize> RedisLimiterBuilder<RedisRateLimiter<[u64; N]>> {
    /// Adds `limit` on the dimension called `name`, as
    /// [`RateLimiterBuilder::limit`](crate::limiter::RateLimiterBuilder::limit) does. A fixed
    /// window's boundaries are on Redis's clock: `origin + k * window` in Unix time (an origin
    /// given by [`Limit::aligned_to_instant`] is mapped through this machine's clock when the
    /// limiter is built), in whole microseconds.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Limit, Rate, RedisRateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let llm = RedisRateLimiter::dimensions("redis://127.0.0.1/", "llm", ["requests", "tokens"])
    ///     .limit("requests", Limit::bucket(Rate::per_minute(500), 50))
    ///     .limit("tokens", Limit::bucket(Rate::per_minute(40_000), 40_000))
    ///     .build();
    /// assert!(llm.is_ok());
    /// # }
    /// ```
    pub fn limit(mut self, name: &str, limit: Limit) -> Self {
        self.spec.limit(name, limit);
        self
    }
}

impl<const N: usize> RedisRateLimiter<[u64; N]> {
    /// A builder for a quota kept in the Redis server at `url`, under the key `{name}`, with
    /// the dimensions `names` (a cost gives one amount per name, in this order), whose limits
    /// are added by [`limit`](RedisLimiterBuilder#method.limit-1). Without limits, failing closed,
    /// with a 250 ms response timeout. (A quota of one limit is made by
    /// [`RedisRateLimiter::builder`].)
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Limit, Rate, RedisRateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let llm: RedisRateLimiter<[u64; 2]> =
    ///     RedisRateLimiter::dimensions("redis://127.0.0.1/", "llm", ["requests", "tokens"])
    ///         .limit("requests", Limit::bucket(Rate::per_minute(500), 50))
    ///         .limit("tokens", Limit::bucket(Rate::per_minute(40_000), 40_000))
    ///         .build()
    ///         .unwrap();
    /// # let _ = llm;
    /// # }
    /// ```
    pub fn dimensions(
        url: &str,
        name: impl Into<String>,
        names: [&str; N],
    ) -> RedisRateLimiterBuilder<[u64; N]> {
        RedisLimiterBuilder::several(Target::Url(url.to_owned()), name, names)
    }

    /// [`dimensions`](Self::dimensions) for a Redis Cluster reached through `nodes`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use paced::{Limit, Rate, RedisRateLimiter};
    ///
    /// # async fn demo() -> Result<(), paced::redis::RedisLimiterError> {
    /// let nodes = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"];
    /// let llm = RedisRateLimiter::cluster_dimensions(&nodes, "llm", ["requests", "tokens"])
    ///     .limit("requests", Limit::bucket(Rate::per_minute(500), 50))
    ///     .build()?;
    /// let _permit = llm.acquire([1, 0]).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn cluster_dimensions(
        nodes: &[&str],
        name: impl Into<String>,
        names: [&str; N],
    ) -> RedisRateLimiterBuilder<[u64; N]> {
        RedisLimiterBuilder::several(Target::cluster(nodes), name, names)
    }
}
