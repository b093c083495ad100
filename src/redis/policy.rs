//! The failure policy and what both Redis limiters do with it: validating a configuration,
//! connecting, and the fail-open fallback.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::time::Instant;

use super::error::RedisQuotaError;
use super::script::Conn;
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
    /// `max_backoff`. `acquire` gives up with [`RedisQuotaError::Unavailable`] once Redis has
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
) -> Result<(), RedisQuotaError> {
    if burst == 0 {
        return Err(RedisQuotaError::Config(ConfigError::ZeroBurst));
    }
    if response_timeout.is_zero() {
        return Err(RedisQuotaError::Config(ConfigError::ZeroTimeout));
    }
    if let Some((0, _)) = lease {
        return Err(RedisQuotaError::Config(ConfigError::ZeroLease));
    }
    if let FailurePolicy::FailOpen { share } = policy {
        if !(share > 0.0 && share <= 1.0) {
            return Err(RedisQuotaError::Config(ConfigError::Share));
        }
    }
    Ok(())
}

/// The one connection of a limiter (shared by its clones): lazy, so building succeeds while
/// Redis is down; it reconnects by itself.
pub(crate) fn connect(
    url: &str,
    response_timeout: Duration,
) -> Result<ConnectionManager, RedisQuotaError> {
    let client = redis::Client::open(url).map_err(RedisQuotaError::Client)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(response_timeout))
        .set_response_timeout(Some(response_timeout))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(500));
    client
        .get_connection_manager_lazy(config)
        .map_err(RedisQuotaError::Client)
}

/// Where a builder's limiter keeps its quotas: one Redis server, or a Redis Cluster reached
/// through some of its nodes.
#[derive(Clone, Debug)]
pub(crate) enum Target {
    Url(String),
    Cluster(Vec<String>),
}

impl Target {
    pub(crate) fn cluster(nodes: &[&str]) -> Target {
        Target::Cluster(nodes.iter().map(|&n| n.to_owned()).collect())
    }

    /// The limiter's one connection, lazy either way.
    pub(crate) fn connect(&self, response_timeout: Duration) -> Result<Conn, RedisQuotaError> {
        match self {
            Target::Url(url) => connect(url, response_timeout).map(Conn::Single),
            Target::Cluster(nodes) => connect_cluster(nodes, response_timeout).map(Conn::Cluster),
        }
    }
}

/// A lazy connection to a Redis Cluster: the client connects to the nodes in the background
/// and learns the slots' masters from the first that answers; it follows redirections and,
/// after a failover, refreshes the slots by itself. Every request (its retries and
/// redirections included) is bounded by `response_timeout`, after which it is an outage.
fn connect_cluster(
    nodes: &[String],
    response_timeout: Duration,
) -> Result<redis::cluster_async::ClusterConnection, RedisQuotaError> {
    if nodes.is_empty() {
        return Err(RedisQuotaError::Client(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "a Redis Cluster needs at least one node",
        ))));
    }
    let client = redis::cluster::ClusterClient::builder(nodes.iter().map(String::as_str))
        .connection_timeout(response_timeout)
        .response_timeout(response_timeout)
        .overall_response_timeout(Some(response_timeout))
        .retries(3)
        .min_retry_wait(10)
        .max_retry_wait(100)
        .build()
        .map_err(RedisQuotaError::Client)?;
    Ok(client.get_pending_async_connection_with_config(redis::cluster::ClusterConfig::default()))
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

/// Under `FailOpen`, during an outage: the local limiter (kept for the whole outage, so that
/// probing Redis again does not refill it) and, while it is in charge, until when.
pub(crate) struct Fallback<F> {
    limiter: Option<F>,
    until: Option<Instant>,
}

impl<F> Default for Fallback<F> {
    fn default() -> Self {
        Fallback {
            limiter: None,
            until: None,
        }
    }
}

impl<F: Clone> Fallback<F> {
    /// The fallback, while it is in charge; after its second, `None` (time to try Redis
    /// again), keeping its state in case Redis still fails.
    pub(crate) fn current(&mut self) -> Option<F> {
        match self.until {
            Some(until) if Instant::now() < until => self.limiter.clone(),
            Some(_) => {
                self.until = None;
                None
            }
            None => None,
        }
    }

    /// Puts the fallback in charge for a second, made by `make` if the outage is new.
    pub(crate) fn open(&mut self, make: impl FnOnce() -> F) {
        if self.limiter.is_none() {
            self.limiter = Some(make());
        }
        self.until = Some(Instant::now() + Duration::from_secs(1));
    }

    /// Redis answered: the outage, if any, is over.
    pub(crate) fn recovered(&mut self) {
        self.limiter = None;
        self.until = None;
    }
}
