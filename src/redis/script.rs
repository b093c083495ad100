//! What [`RedisRateLimiter`](super::RedisRateLimiter) and
//! [`RedisKeyedRateLimiter`](super::RedisKeyedRateLimiter) share: the one script (one limit or several) and a
//! bucket's arguments, the sorting of failures into outages and reply errors, the counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;

use crate::core::Nanos;

/// paced's one Redis script, of every Redis limiter: one limit or several. It reads and writes
/// quota states of format version 1 only (a leading byte; see the script's header and the
/// guide's "Upgrading a fleet"): a state of another version is a reply error, never misread nor
/// overwritten.
pub(crate) const SCRIPT: &str = include_str!("quota.lua");

/// Whether Redis *answered* with an error about this request (a script error, `WRONGTYPE`,
/// a value out of range, `NOPERM`, an unexpected reply), rather than failed to answer (a
/// connection refused, dropped or timed out) or answered that it cannot serve anyone now
/// (`LOADING`, `BUSY`, `MASTERDOWN`, `READONLY`, `TRYAGAIN`, `CLUSTERDOWN`, `OOM`, `MISCONF`,
/// `NOREPLICAS`), or, on a Redis Cluster, redirected it (`MOVED`, `ASK`) more times than the
/// client follows within its timeout while the slots move (a failover), which are outages.
fn is_reply_error(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask
            // Reloaded by `Script` on its own; a second one is a race with `SCRIPT FLUSH`.
            | ServerErrorKind::NoScript,
        ) => false,
        ErrorKind::Server(_) => true,
        ErrorKind::Extension => !matches!(
            e.code(),
            Some("BUSY" | "OOM" | "MISCONF" | "NOREPLICAS" | "UNBLOCKED")
        ),
        // The reply came, but not in the script's shape.
        ErrorKind::UnexpectedReturnType => true,
        _ => false,
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) round_trips: AtomicU64,
    pub(crate) granted: AtomicU64,
    pub(crate) from_lease: AtomicU64,
    pub(crate) fallback: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) reply_errors: AtomicU64,
    /// The handles a named limiter records to (`with_metrics`).
    #[cfg(feature = "metrics")]
    pub(crate) metrics: Option<crate::instrument::RedisMetrics>,
}

impl Counters {
    /// An acquisition of `cost` granted.
    pub(crate) fn grant(&self, cost: u64) {
        bump(&self.granted);
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.grants.increment(1);
            m.tokens.increment(cost);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = cost;
    }

    /// A `try_acquire` refused.
    pub(crate) fn refuse(&self) {
        bump(&self.rejected);
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.refusals.increment(1);
        }
    }

    /// A grant by the fail-open fallback (counted as a grant too, with [`Counters::grant`]).
    pub(crate) fn fall_back(&self) {
        bump(&self.fallback);
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.fallbacks.increment(1);
        }
    }

    /// A script call sent.
    pub(crate) fn round_trip(&self) {
        bump(&self.round_trips);
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            m.round_trips.increment(1);
        }
    }

    /// A round trip failed: Redis answered with an error (`reply`), or an outage.
    pub(crate) fn error(&self, reply: bool) {
        bump(if reply {
            &self.reply_errors
        } else {
            &self.errors
        });
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.metrics {
            if reply {
                m.reply_errors.increment(1);
            } else {
                m.outages.increment(1);
            }
        }
    }
}

/// How a round trip failed.
pub(crate) enum Failure {
    /// Redis did not answer, or cannot serve anyone now: the failure policy applies.
    Outage(redis::RedisError),
    /// Redis answered this request with an error: permanent for the request.
    Reply(redis::RedisError),
}

/// The longest pause between two attempts of a waiting stream whose requests Redis answers
/// with an error; the first is 100 ms.
impl Failure {
    /// Sorts a failed call on `key` into an outage or a reply error, and counts (and, for a
    /// reply error, logs) it.
    pub(crate) fn classify(
        e: redis::RedisError,
        counters: &Counters,
        key: &str,
        cost: u64,
    ) -> Failure {
        if is_reply_error(&e) {
            counters.error(true);
            #[cfg(feature = "tracing")]
            tracing::error!(
                key = %key,
                cost,
                error = %e,
                "paced: Redis answered the quota's script with an error; nothing granted"
            );
            #[cfg(not(feature = "tracing"))]
            let _ = (key, cost);
            Failure::Reply(e)
        } else {
            counters.error(false);
            Failure::Outage(e)
        }
    }
}

pub(crate) const REPLY_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The wait an enforcing stream is told when Redis answered its request with an error.
pub(crate) const REPLY_RETRY: Duration = Duration::from_secs(1);

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A limiter's one connection (shared by its clones, cheap to clone): to one Redis server, or
/// to a Redis Cluster. Both reconnect by themselves; the cluster client also follows
/// redirections (`MOVED`, `ASK`) and finds the new master after a failover.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    /// Whether Redis answers a `PING` now (the client reconnects first if it must).
    pub(crate) async fn answers(&self) -> bool {
        let ping = redis::cmd("PING");
        match self.clone() {
            Conn::Single(mut conn) => ping.query_async::<()>(&mut conn).await.is_ok(),
            Conn::Cluster(mut conn) => ping.query_async::<()>(&mut conn).await.is_ok(),
        }
    }
}

/// A wait in whole microseconds as the script returns it, in nanoseconds; the script's
/// "never" (2^64 ns or more) saturates to `Nanos::MAX`, the in-process bucket's.
pub(crate) fn wait_from_us(us: u64) -> Nanos {
    Nanos(us.saturating_mul(1_000))
}

/// `n` as a double no smaller than `n`, for an amount the script must not under-count (a cost).
/// The script's amounts are doubles, exact only up to 2^53.
pub(crate) fn round_up(n: u64) -> f64 {
    let f = n as f64;
    if (f as u128) < u128::from(n) {
        f64::from_bits(f.to_bits() + 1)
    } else {
        f
    }
}

/// `n` as a double no larger than `n`, for an amount the script must not over-count (a burst,
/// a lease, tokens given back).
pub(crate) fn round_down(n: u64) -> f64 {
    let f = n as f64;
    if (f as u128) > u128::from(n) {
        f64::from_bits(f.to_bits() - 1)
    } else {
        f
    }
}

/// One call of the script, of every Redis limiter: on `key`, in `mode`, with the limits `spec`
/// (ARGV[2]) and the optional arguments after them (ARGV[3] to ARGV[5]; `None`, an empty one).
/// Each argument costs Redis about 1,200 instructions: none is sent after the last one given.
/// The script has one key, so on a Redis Cluster the command goes to its slot's master.
pub(crate) async fn eval(
    script: &redis::Script,
    conn: Conn,
    key: &str,
    mode: &str,
    spec: Vec<u8>,
    args: [Option<Vec<u8>>; 3],
) -> redis::RedisResult<Vec<u64>> {
    let cmd = command(script.get_hash(), key, mode, spec, args);
    match conn {
        Conn::Single(mut conn) => evalsha(&cmd, script, &mut conn).await,
        Conn::Cluster(mut conn) => evalsha(&cmd, script, &mut conn).await,
    }
}

/// The `EVALSHA` of the script of hash `hash` (see [`eval`]), its buffers sized once: built up
/// argument by argument, they would grow four times, which cost more than all of the
/// limiter's own work on a call.
fn command(
    hash: &str,
    key: &str,
    mode: &str,
    spec: Vec<u8>,
    args: [Option<Vec<u8>>; 3],
) -> redis::Cmd {
    let given = args.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
    let optional: usize = args[..given].iter().flatten().map(Vec::len).sum();
    // The `1` is the number of keys.
    let bytes = "EVALSHA".len() + hash.len() + 1 + key.len() + mode.len() + spec.len() + optional;
    let mut cmd = redis::Cmd::with_capacity(6 + given, bytes);
    cmd.arg("EVALSHA")
        .arg(hash)
        .arg(1)
        .arg(key)
        .arg(mode)
        .arg(spec);
    for arg in args.into_iter().take(given) {
        cmd.arg(arg.unwrap_or_default());
    }
    cmd
}

/// Runs `cmd` (an `EVALSHA` of `script`), loading the script first if Redis lost it
/// (`NOSCRIPT`: a restart, a failover, `SCRIPT FLUSH`).
pub(crate) async fn evalsha<T: redis::FromRedisValue>(
    cmd: &redis::Cmd,
    script: &redis::Script,
    conn: &mut impl redis::aio::ConnectionLike,
) -> redis::RedisResult<T> {
    match cmd.query_async(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            cmd.query_async(conn).await
        }
        answer => answer,
    }
}

#[cfg(test)]
mod tests {
    use super::{command, round_down, round_up, wait_from_us};
    use crate::core::Nanos;
    use crate::error::NotUntil;

    #[test]
    fn amounts_round_in_the_quotas_favour() {
        let exact = 1u64 << 53;
        for n in [0, 1, 5, exact - 1, exact] {
            assert_eq!(round_up(n), n as f64);
            assert_eq!(round_down(n), n as f64);
        }
        // 2^53 + 1 is no double: a cost goes up, a burst down.
        assert_eq!(round_up(exact + 1), (exact + 2) as f64);
        assert_eq!(round_down(exact + 1), exact as f64);
        for n in [
            exact + 1,
            exact + 3,
            u64::MAX - 1,
            u64::MAX,
            3_000_000_000_000_000_001,
        ] {
            assert!(round_up(n) as u128 >= u128::from(n), "{n}");
            assert!((round_down(n) as u128) <= u128::from(n), "{n}");
        }
        assert_eq!(round_up(u64::MAX), 18_446_744_073_709_551_616.0);
    }

    #[test]
    fn a_command_is_the_one_built_argument_by_argument_and_sends_none_after_the_last() {
        let hash = "a".repeat(40);
        let spec = vec![7u8; 41];
        for args in [
            [None, None, None],
            [Some(vec![1u8; 8]), None, None],
            [None, Some(vec![2u8; 24]), None],
            [Some(vec![1u8; 8]), None, Some(vec![3u8; 16])],
        ] {
            let mut plain = redis::cmd("EVALSHA");
            plain
                .arg(&hash)
                .arg(1)
                .arg("{q:k}")
                .arg("try")
                .arg(spec.clone());
            let given = args.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
            for arg in args.iter().take(given) {
                plain.arg(arg.clone().unwrap_or_default());
            }
            let built = command(&hash, "{q:k}", "try", spec.clone(), args);
            assert_eq!(built.get_packed_command(), plain.get_packed_command());
            assert_eq!(built.args_iter().count(), 6 + given);
        }
    }

    #[test]
    fn a_wait_of_584_years_or_more_is_never() {
        assert_eq!(wait_from_us(0), Nanos::ZERO);
        assert_eq!(wait_from_us(1_500), Nanos(1_500_000));
        // The script's NEVER_US, ceil(2^64 / 1000).
        assert_eq!(wait_from_us(18_446_744_073_709_552), Nanos::MAX);
        assert_ne!(wait_from_us(18_446_744_073_709_551), Nanos::MAX);
        assert!(NotUntil::new(wait_from_us(u64::MAX)).is_never());
    }
}
