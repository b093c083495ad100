//! [`RedisKeyedRateLimiter`]: one token bucket per key, kept in Redis, shared by every process.
//!
//! Each key is [`RedisRateLimiter`](super::RedisRateLimiter)'s bucket under its own Redis key,
//! evaluated by the same script; a key's own limit lives in a hash beside it.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::fmt::{self, Display, Write as _};
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

use super::error::{RedisQuotaError, TryAcquireError};
use super::limiter::{poll_slot, Pending};
use super::policy::{self, FailurePolicy, Fallback, Target};
use super::script::{
    bump, wait_from_us, Answer, Call, Conn, Counters, Failure, Reply, REPLY_BACKOFF_MAX, SCRIPT,
};
use super::turns::Turns;
use crate::core::Nanos;
use crate::error::{ConfigError, NotUntil};
use crate::limiter::keyed_traits::sealed::{Arrival, KeyedSealed};
use crate::limiter::{KeyedLimiter, KeyedRateLimiter, RateLimiter};
use crate::rate::Rate;
use crate::sync::{lock, Mutex};

/// Counters of a [`RedisKeyedRateLimiter`] in this process, over all its keys.
///
/// # Examples
///
/// ```
/// let stats = paced::redis::RedisKeyedStats::default();
/// assert_eq!((stats.round_trips, stats.keys), (0, 0));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisKeyedStats {
    /// Script calls sent to Redis (successful or not), limit changes and leases given back in
    /// the background included.
    pub round_trips: u64,
    /// Acquisitions granted, from Redis, from a lease, or from the fail-open fallback.
    pub granted: u64,
    /// Acquisitions served from a key's local lease, without a round trip.
    pub from_lease: u64,
    /// Acquisitions granted by the fail-open fallback while Redis was unreachable.
    pub fallback: u64,
    /// `try_acquire` calls refused, and `acquire_timeout` calls that timed out.
    pub rejected: u64,
    /// Round trips that failed for an outage (Redis unreachable, slow or restarting).
    pub errors: u64,
    /// Round trips that Redis answered with an error (a key of another type, a refused
    /// command): not outages, each also logged at error level with the `tracing` feature.
    pub reply_errors: u64,
    /// Keys this process holds local state for now: those with an acquisition in flight,
    /// and with leases those with a lease or granted within the lease age. A key's local
    /// state is dropped once nothing uses it and its lease, if any, has expired (and been
    /// given back). A `try_acquire` without leases holds none.
    pub keys: usize,
}

/// What this process keeps for one key while it is in use: while an acquisition is in
/// flight, or a lease is held.
struct KeyLocal {
    /// Acquisitions in flight.
    users: usize,
    redis: Arc<str>,
    lease: Option<Lease>,
    /// Tokens to give back with the key's next round trip: an expired or replaced lease.
    to_return: u64,
    /// With leases, one task at a time refills the key's lease; the others wait for it rather
    /// than each asking Redis for a whole lease of its own.
    refill: Arc<tokio::sync::Mutex<()>>,
    /// The order of the key's reservations sent by this process.
    turns: Arc<Turns>,
    /// With leases, when the key was last granted (by Redis or from its lease): a key granted
    /// within the lease age is in use, and its next round trip asks for a whole lease.
    granted_at: Option<Instant>,
}

impl KeyLocal {
    /// Whether the key was granted within `age` before `now`.
    fn in_use(&self, now: Instant, age: Duration) -> bool {
        self.granted_at
            .is_some_and(|at| now.saturating_duration_since(at) < age)
    }

    /// Whether nothing needs the key's local state any more.
    fn idle(&self, now: Instant, age: Duration) -> bool {
        self.users == 0 && self.lease.is_none() && !self.in_use(now, age)
    }
}

/// Tokens of one key taken from Redis ahead of use, spent locally.
struct Lease {
    tokens: u64,
    expires: Instant,
}

struct Inner<K> {
    conn: Conn,
    script: redis::Script,
    /// The prefix, escaped as a key is.
    prefix: String,
    rate: Rate,
    burst: u64,
    /// Microseconds per token, the script's unit: the default limit.
    interval_us: f64,
    policy: FailurePolicy,
    lease_tokens: u64,
    lease_age: Duration,
    /// Whether a task is sweeping expired leases of idle keys.
    sweeping: AtomicBool,
    /// Under `FailOpen`, during an outage: local limiters at `share` of each key's limit as
    /// this process knows it.
    fallback: Mutex<Fallback<KeyedFallback<K>>>,
    /// The limits this process gave keys with `set_limit` (and did not clear since): what the
    /// fail-open fallback knows of per-key limits. Configuration: one entry per such key.
    limits: Mutex<HashMap<K, (Rate, u64)>>,
    keys: Mutex<HashMap<K, KeyLocal>>,
    /// Hashes keys for the streams that file their items by key (`throttle_by_key`).
    hasher: RandomState,
    counters: Counters,
}

/// One token bucket per key, shared by every process that uses the same Redis and prefix: a
/// quota per tenant, per user or per partner across a fleet.
///
/// Each key has [`RedisRateLimiter`](crate::RedisRateLimiter)'s semantics: capacity `burst`,
/// starts full, refills at `rate`, evaluated atomically by the same Lua script on Redis's
/// clock; waiting is a reservation (charged at once in Redis, then waited for locally, so that
/// waiters across processes are served in the order their requests reached Redis); Redis
/// faults follow the [`FailurePolicy`], and a reply error (a key of another type) is not an
/// outage (see [outages and reply errors](crate::RedisRateLimiter#outages-and-reply-errors)).
/// And it has [`KeyedRateLimiter`]'s per-key semantics: keys are independent, a key may be
/// given its own limit ([`set_limit`](RedisKeyedRateLimiter::set_limit)), and keys are
/// borrowed (`&str` for `String` keys).
///
/// # Keys in Redis
///
/// A key is turned into bytes by its [`Display`] form (so `String`, `&str` and the integers
/// all work), with `%`, `{`, `}` and `:` percent-encoded (`%25`, `%7B`, `%7D`, `%3A`), as is
/// the prefix. Key `k` under prefix `p` keeps its bucket, and its own limit if it has one, in
/// the one Redis key `{p:k}` (a string of two or four doubles), so that one read serves both;
/// the braces are a Redis Cluster hash tag. Two keys whose `Display` forms are equal share a
/// bucket.
///
/// A key's bucket expires from Redis once it would be full again, so idle keys cost nothing;
/// a key with its own limit is configuration and does not expire (until
/// [`clear_limit`](RedisKeyedRateLimiter::clear_limit)). This process keeps local state for a
/// key only while an acquisition of it is in flight or, with
/// [leases](RedisKeyedRateLimiterBuilder::lease), until its lease expires and is given back
/// ([`RedisKeyedStats::keys`]).
///
/// Waiters of one key are served in the order their requests reach Redis. Within a process
/// that is the order they were made: the requests share one ordered connection, each is
/// charged (reserved) as it arrives, and a reservation whose wait is over still lets the key's
/// reservations sent before it by this process go first (its wait counts from when its reply
/// was read, which a busy thread may delay); the exceptions are requests resent after a
/// reconnection or after Redis lost the script (`NOSCRIPT`), which may be served later than
/// their turn, never earlier than their reservation. With leases, one task at a time refills a
/// key's lease, in the order they asked (tokio's fair mutex). Under
/// `FailOpen`, the fallback grants each key `share` of its limit as this process knows it: the
/// limit this process gave it with [`set_limit`](RedisKeyedRateLimiter::set_limit) (and did
/// not clear), else the default limit; limits that other processes set are not known locally.
///
/// Streams and tower services draw on it as on a [`KeyedRateLimiter`]: it is a
/// [`KeyedLimiter`], so [`throttle_by_key`](crate::PaceExt::throttle_by_key) and
/// `paced::tower::RateLimitLayer::keyed` take it (see [`KeyedLimiter`] for what holds).
///
/// # Examples
///
/// ```no_run
/// use paced::{Rate, RedisKeyedRateLimiter};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let per_tenant: RedisKeyedRateLimiter<String> =
///     RedisKeyedRateLimiter::builder("redis://127.0.0.1/", "tenants", Rate::per_second(10), 5)
///         .build()?;
/// per_tenant.acquire("acme", 1).await?;
/// // A bigger tenant, for every process at once:
/// per_tenant.set_limit("globex", Rate::per_second(100), 50).await?;
/// if let Err(refused) = per_tenant.try_acquire("acme", 1).await {
///     println!("not now: {refused}");
/// }
/// # Ok(())
/// # }
/// ```
pub struct RedisKeyedRateLimiter<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for RedisKeyedRateLimiter<K> {
    fn clone(&self) -> Self {
        RedisKeyedRateLimiter {
            inner: self.inner.clone(),
        }
    }
}

impl<K> fmt::Debug for RedisKeyedRateLimiter<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisKeyedRateLimiter")
            .field("prefix", &self.inner.prefix)
            .field("rate", &self.inner.rate)
            .field("burst", &self.inner.burst)
            .field("policy", &self.inner.policy)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RedisKeyedRateLimiter`]; see [`RedisKeyedRateLimiter::builder`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use paced::redis::FailurePolicy;
/// use paced::{Rate, RedisKeyedRateLimiter};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let per_user = RedisKeyedRateLimiter::<u64>::builder("redis://127.0.0.1/", "users", Rate::per_second(5), 5)
///     .failure_policy(FailurePolicy::FailOpen { share: 0.25 })
///     .response_timeout(Duration::from_millis(100))
///     .build()
///     .expect("a valid configuration");
/// # let _ = per_user;
/// # }
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct RedisKeyedRateLimiterBuilder<K> {
    target: Target,
    prefix: String,
    rate: Rate,
    burst: u64,
    policy: FailurePolicy,
    response_timeout: Duration,
    lease: Option<(u64, Duration)>,
    #[cfg(feature = "metrics")]
    metrics_name: Option<String>,
    key: PhantomData<fn() -> K>,
}

impl<K> fmt::Debug for RedisKeyedRateLimiterBuilder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisKeyedRateLimiterBuilder")
            .field("target", &self.target)
            .field("prefix", &self.prefix)
            .field("rate", &self.rate)
            .field("burst", &self.burst)
            .field("policy", &self.policy)
            .field("response_timeout", &self.response_timeout)
            .field("lease", &self.lease)
            .finish()
    }
}

impl<K> RedisKeyedRateLimiterBuilder<K> {
    /// Takes up to `max_tokens` of a key from Redis per round trip and spends them locally,
    /// so that a busy key does not cost one round trip per acquisition. Leases are per key
    /// and only for keys in use: a key's first request takes only its cost, and once a round
    /// trip of the key has granted, the key's next round trips within `max_age` take a lease
    /// (so a key not asked again within `max_age` never holds tokens it does not use, nor
    /// costs a round trip to give them back). A key's unspent tokens are given back once
    /// `max_age` has passed (and when the last handle is dropped). The bound then holds to
    /// within `max_age` of refill per key; while waiting, a process waits for a whole lease
    /// of a key in use rather than one token.
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
        self.lease = Some((max_tokens, max_age));
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
    /// use paced::{Rate, RedisKeyedRateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let builder = RedisKeyedRateLimiter::<String>::builder("redis://127.0.0.1/", "t", Rate::per_second(5), 5)
    ///     .failure_policy(FailurePolicy::FailOpen { share: 0.5 });
    /// assert!(builder.build().is_ok());
    /// # }
    /// ```
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// How long one round trip (and one connection attempt) may take before it counts as an
    /// outage (default 250 ms); it must be positive, as for
    /// [`RedisRateLimiterBuilder::response_timeout`](super::RedisRateLimiterBuilder::response_timeout).
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
        self.response_timeout = timeout;
        self
    }

    /// Records the limiter's counters (over all keys: keys are not labels, their number is
    /// unbounded) to the `metrics` facade under `name` (feature `metrics`), as
    /// [`RedisRateLimiterBuilder::metrics_name`](crate::redis::RedisRateLimiterBuilder::metrics_name)
    /// does. The handles are registered with the recorder installed when the limiter is built.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Rate, RedisKeyedRateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let tenants = RedisKeyedRateLimiter::<String>::builder("redis://127.0.0.1/", "tenants", Rate::per_second(5), 5)
    ///     .metrics_name("tenants")
    ///     .build()
    ///     .unwrap();
    /// # let _ = tenants;
    /// # }
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics_name(mut self, name: impl Into<String>) -> Self {
        self.metrics_name = Some(name.into());
        self
    }

    /// Builds the limiter, with one connection (reconnecting by itself) shared by every key
    /// and clone. Nothing is sent to Redis until the first request, so this succeeds while
    /// Redis is down; it needs a tokio runtime.
    ///
    /// # Errors
    ///
    /// [`RedisQuotaError::Config`] for a zero burst, a zero lease, a `FailOpen` share outside
    /// `(0, 1]` or a zero response timeout; [`RedisQuotaError::Client`] for an invalid URL.
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
    pub fn build(self) -> Result<RedisKeyedRateLimiter<K>, RedisQuotaError> {
        policy::validate(self.burst, self.response_timeout, self.lease, self.policy)?;
        let (lease_tokens, lease_age) = self.lease.unwrap_or((0, Duration::ZERO));
        let conn = self.target.connect(self.response_timeout)?;
        Ok(RedisKeyedRateLimiter {
            inner: Arc::new(Inner {
                conn,
                script: redis::Script::new(SCRIPT),
                prefix: escape(&self.prefix),
                rate: self.rate,
                burst: self.burst,
                interval_us: policy::interval_us(self.rate),
                policy: self.policy,
                lease_tokens,
                lease_age,
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
            }),
        })
    }
}

/// `s` with `%`, `{`, `}` and `:` percent-encoded, so that neither a hash tag nor the
/// separator can be forged.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let _ = Escaping(&mut out).write_str(s);
    out
}

/// Writes into a `String` with `%`, `{`, `}` and `:` percent-encoded (see [`escape`]).
struct Escaping<'a>(&'a mut String);

impl fmt::Write for Escaping<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            match c {
                '%' => self.0.push_str("%25"),
                '{' => self.0.push_str("%7B"),
                '}' => self.0.push_str("%7D"),
                ':' => self.0.push_str("%3A"),
                c => self.0.push(c),
            }
        }
        Ok(())
    }
}

/// The fail-open fallback of one outage: a keyed limiter at `share` of the default limit, and
/// for each key with a limit this process set, a limiter at `share` of that limit (made when
/// the key is first used during the outage). Kept for the whole outage, so that probing Redis
/// again does not refill it.
struct KeyedFallback<K> {
    default: KeyedRateLimiter<K>,
    own: Arc<Mutex<HashMap<K, RateLimiter>>>,
}

impl<K> Clone for KeyedFallback<K> {
    fn clone(&self) -> Self {
        KeyedFallback {
            default: self.default.clone(),
            own: self.own.clone(),
        }
    }
}

/// The local limiter that stands in for one key's Redis bucket during an outage.
enum Local<K> {
    /// `share` of the default limit: one bucket of the fallback's keyed limiter.
    Default(KeyedRateLimiter<K>),
    /// `share` of the limit this process set for the key.
    Own(RateLimiter),
}

impl<K: Hash + Eq> Local<K> {
    async fn acquire<Q>(&self, key: &Q, cost: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self {
            Local::Default(keyed) => keyed.acquire(key, cost).await,
            Local::Own(own) => own.acquire(cost).await,
        }
    }

    async fn acquire_timeout<Q>(
        &self,
        key: &Q,
        cost: u64,
        timeout: Duration,
    ) -> Result<(), NotUntil>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self {
            Local::Default(keyed) => keyed.acquire_timeout(key, cost, timeout).await,
            Local::Own(own) => own.acquire_timeout(cost, timeout).await,
        }
    }

    fn try_acquire<Q>(&self, key: &Q, cost: u64) -> Result<(), NotUntil>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self {
            Local::Default(keyed) => keyed.try_acquire(key, cost),
            Local::Own(own) => own.try_acquire(cost),
        }
    }
}

/// How a waiting acquisition ended without a grant.
enum WaitError {
    Quota(RedisQuotaError),
    Refused(NotUntil),
}

/// Gives `back` tokens of a key back to Redis, in the background (if there is a runtime; if
/// not, or if it fails, they stay taken: on the quota's side).
fn give_back<K>(inner: &Inner<K>, keys: Arc<str>, back: u64) {
    if back == 0 {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    inner.counters.round_trip();
    let (conn, script) = (inner.conn.clone(), inner.script.clone());
    let (interval_us, burst) = (inner.interval_us, inner.burst);
    runtime.spawn(async move {
        let call = Call {
            key: &keys,
            interval_us,
            burst,
            amounts: (0, 0, back),
            mode: "try",
            max_wait_us: None,
            new_limit: None,
        };
        let _ = call.run(&script, conn).await;
    });
}

impl<K> Inner<K> {
    /// Moves expired leases to be given back, drops the local state of keys nobody uses, and
    /// returns what to give back for them and whether a lease or a key in use remains (to be
    /// swept later).
    fn sweep(&self) -> (Vec<(Arc<str>, u64)>, bool) {
        let now = Instant::now();
        let mut gone = Vec::new();
        let mut later = false;
        lock(&self.keys).retain(|_, local| {
            if local.lease.as_ref().is_some_and(|l| l.expires <= now) {
                let unused = local.lease.take().map_or(0, |l| l.tokens);
                local.to_return = local.to_return.saturating_add(unused);
            }
            if local.idle(now, self.lease_age) {
                gone.push((local.redis.clone(), local.to_return));
                return false;
            }
            later |= local.lease.is_some() || local.in_use(now, self.lease_age);
            true
        });
        (gone, later)
    }
}

impl<K> Drop for Inner<K> {
    fn drop(&mut self) {
        let keys = std::mem::take(&mut *lock(&self.keys));
        for (_, local) in keys {
            let unused = local.lease.map_or(0, |l| l.tokens);
            give_back(self, local.redis, unused.saturating_add(local.to_return));
        }
    }
}

/// A grant not used yet: given back (in the background) if its waiter goes away.
struct Reserved<'a, K> {
    inner: &'a Inner<K>,
    keys: &'a Arc<str>,
    tokens: u64,
}

impl<K> Drop for Reserved<'_, K> {
    fn drop(&mut self) {
        give_back(self.inner, self.keys.clone(), self.tokens);
    }
}

/// This process's hold on a key's local state while an acquisition is in flight.
struct Hold<'a, K, Q>
where
    K: Borrow<Q> + Hash + Eq,
    Q: Hash + Eq + ?Sized,
{
    inner: &'a Inner<K>,
    key: &'a Q,
    redis: Arc<str>,
    refill: Arc<tokio::sync::Mutex<()>>,
    turns: Arc<Turns>,
}

impl<K, Q> Drop for Hold<'_, K, Q>
where
    K: Borrow<Q> + Hash + Eq,
    Q: Hash + Eq + ?Sized,
{
    fn drop(&mut self) {
        let mut keys = lock(&self.inner.keys);
        let Some(local) = keys.get_mut(self.key) else {
            return;
        };
        local.users -= 1;
        if local.idle(Instant::now(), self.inner.lease_age) {
            let back = local.to_return;
            keys.remove(self.key);
            drop(keys);
            give_back(self.inner, self.redis.clone(), back);
        }
    }
}

impl<K> RedisKeyedRateLimiter<K>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    /// A builder for per-key quotas under `prefix` on the Redis at `url`: each key has `burst`
    /// tokens refilled at `rate` (unless [`set_limit`](RedisKeyedRateLimiter::set_limit) gave
    /// it its own), failing closed.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::{Rate, RedisKeyedRateLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let per_ip: RedisKeyedRateLimiter<String> =
    ///     RedisKeyedRateLimiter::builder("redis://127.0.0.1/", "ip", Rate::per_minute(60), 10)
    ///         .build()
    ///         .unwrap();
    /// # let _ = per_ip;
    /// # }
    /// ```
    pub fn builder(
        url: &str,
        prefix: &str,
        rate: Rate,
        burst: u64,
    ) -> RedisKeyedRateLimiterBuilder<K> {
        RedisKeyedRateLimiterBuilder {
            target: Target::Url(url.to_owned()),
            prefix: prefix.to_owned(),
            rate,
            burst,
            policy: FailurePolicy::default(),
            response_timeout: Duration::from_millis(250),
            lease: None,
            #[cfg(feature = "metrics")]
            metrics_name: None,
            key: PhantomData,
        }
    }

    /// A builder for per-key quotas under `prefix` on a Redis Cluster, reached through
    /// `nodes` (the URLs of some of its nodes; one that answers is enough): each key has
    /// `burst` tokens refilled at `rate`, failing closed. The same builder, with the same
    /// options, as [`builder`](RedisKeyedRateLimiter::builder).
    ///
    /// A key's quota (and its own limit, in the same Redis key) is named with a hash tag,
    /// `{prefix:key}`, so the script runs on that slot's master; different keys spread over the
    /// masters. The cluster client follows redirections and,
    /// when a master fails and its replica takes over, finds the new master by itself;
    /// meanwhile the keys of that master's slots see an outage (each round trip bounded by the
    /// [`response_timeout`](RedisKeyedRateLimiterBuilder::response_timeout)) and the
    /// [`FailurePolicy`] applies to them, while the other keys go on. (Redis replicates
    /// asynchronously: a failover can lose the failed master's last charges.)
    ///
    /// Nothing is sent until the first request: [`build`](RedisKeyedRateLimiterBuilder::build)
    /// succeeds while the cluster is down, and an empty `nodes` is
    /// [`RedisQuotaError::Client`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use paced::{Rate, RedisKeyedRateLimiter};
    ///
    /// # async fn demo() -> Result<(), paced::redis::RedisQuotaError> {
    /// let nodes = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"];
    /// let per_user: RedisKeyedRateLimiter<u64> =
    ///     RedisKeyedRateLimiter::cluster_builder(&nodes, "users", Rate::per_second(5), 5).build()?;
    /// per_user.acquire(&42, 1).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn cluster_builder(
        nodes: &[&str],
        prefix: &str,
        rate: Rate,
        burst: u64,
    ) -> RedisKeyedRateLimiterBuilder<K> {
        RedisKeyedRateLimiterBuilder {
            target: Target::cluster(nodes),
            ..RedisKeyedRateLimiter::builder("", prefix, rate, burst)
        }
    }

    /// The Redis key of `key`'s bucket (and of its own limit, if any).
    fn redis_key<Q: Display + ?Sized>(&self, key: &Q) -> String {
        let prefix = &self.inner.prefix;
        let mut out = String::with_capacity(prefix.len() + 24);
        out.push('{');
        out.push_str(prefix);
        out.push(':');
        // Writing to a `String` cannot fail.
        let _ = write!(Escaping(&mut out), "{key}");
        out.push('}');
        out
    }

    fn hold<'a, Q>(&'a self, key: &'a Q) -> Hold<'a, K, Q>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        let mut keys = lock(&self.inner.keys);
        let (redis, refill, turns) = match keys.get_mut(key) {
            Some(local) => {
                local.users += 1;
                (
                    local.redis.clone(),
                    local.refill.clone(),
                    local.turns.clone(),
                )
            }
            None => {
                let local = KeyLocal {
                    users: 1,
                    redis: Arc::from(self.redis_key(key)),
                    lease: None,
                    to_return: 0,
                    refill: Arc::new(tokio::sync::Mutex::new(())),
                    turns: Arc::default(),
                    granted_at: None,
                };
                let held = (
                    local.redis.clone(),
                    local.refill.clone(),
                    local.turns.clone(),
                );
                keys.insert(key.to_owned(), local);
                held
            }
        };
        Hold {
            inner: &self.inner,
            key,
            redis,
            refill,
            turns,
        }
    }

    /// Takes `cost` from `key`'s local lease, if it holds enough and has not expired.
    fn spend_lease<Q>(&self, key: &Q, cost: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.inner.lease_tokens == 0 {
            return false;
        }
        let mut keys = lock(&self.inner.keys);
        let Some(local) = keys.get_mut(key) else {
            return false;
        };
        let Some(lease) = local.lease.as_mut() else {
            return false;
        };
        let now = Instant::now();
        if lease.expires <= now {
            let unused = lease.tokens;
            local.lease = None;
            local.to_return = local.to_return.saturating_add(unused);
            return false;
        }
        if lease.tokens < cost {
            return false;
        }
        lease.tokens -= cost;
        local.granted_at = Some(now);
        bump(&self.inner.counters.from_lease);
        true
    }

    /// What `key`'s next round trip asks for: at least `cost`, at most `cost` or, with leases
    /// and if the key is in use, a whole lease; and the tokens it gives back.
    ///
    /// A key is in use while it was granted within the lease age: its first request (and the
    /// first after a pause longer than the lease age) takes only its cost, so keys that are
    /// not asked again within the age cost no lease and no round trip to give it back. A busy
    /// key stays in use, and the unspent tokens of its expired lease go back with its next
    /// round trip.
    fn amounts<Q>(&self, key: &Q, cost: u64) -> (u64, u64, u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let lease_tokens = self.inner.lease_tokens;
        if lease_tokens == 0 {
            return (cost, cost, 0);
        }
        let now = Instant::now();
        let mut keys = lock(&self.inner.keys);
        let Some(local) = keys.get_mut(key) else {
            return (cost, cost, 0);
        };
        let want = if local.in_use(now, self.inner.lease_age) {
            cost.max(lease_tokens)
        } else {
            cost
        };
        (cost, want, std::mem::take(&mut local.to_return))
    }

    /// After a round trip of `key` granted (with leases): the key is in use, and the surplus,
    /// if any, is its lease, usable until `max_age` from now; what was left of an older lease
    /// is given back with the key's next round trip.
    fn granted<Q>(&self, key: &Q, surplus: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.inner.lease_tokens == 0 {
            return;
        }
        let now = Instant::now();
        let expires = now
            .checked_add(self.inner.lease_age)
            .unwrap_or(now + Duration::from_secs(86_400));
        {
            let mut keys = lock(&self.inner.keys);
            // The caller holds the key: its local state is there.
            let Some(local) = keys.get_mut(key) else {
                return;
            };
            local.granted_at = Some(now);
            if surplus > 0 {
                let lease = Lease {
                    tokens: surplus,
                    expires,
                };
                if let Some(old) = local.lease.replace(lease) {
                    local.to_return = local.to_return.saturating_add(old.tokens);
                }
            }
        }
        self.schedule_sweep();
    }

    /// Makes sure a task gives back the expired leases of keys nobody uses any more, every
    /// `max_age`, for as long as leases are held.
    fn schedule_sweep(&self) {
        if self.inner.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.inner.sweeping.store(false, Ordering::Release);
            return;
        };
        let every = self
            .inner
            .lease_age
            .clamp(Duration::from_millis(1), Duration::from_secs(3_600));
        let weak = Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let (gone, later) = inner.sweep();
                for (keys, back) in gone {
                    give_back(&inner, keys, back);
                }
                if !later {
                    inner.sweeping.store(false, Ordering::Release);
                    // A lease kept meanwhile may have found the flag still set: look again.
                    let (gone, later) = inner.sweep();
                    for (keys, back) in gone {
                        give_back(&inner, keys, back);
                    }
                    if !later || inner.sweeping.swap(true, Ordering::AcqRel) {
                        return;
                    }
                }
            }
        });
    }

    async fn call(&self, call: Call<'_>) -> Result<Reply, Failure> {
        let inner = &self.inner;
        inner.counters.round_trip();
        call.run(&inner.script, inner.conn.clone())
            .await
            .map_err(|e| Failure::classify(e, &inner.counters, call.key, call.amounts.0))
    }

    /// One script call on `keys`: take at least `cost`, up to `want`, after giving `back`
    /// back, reserving (granted with a wait of at most `max_wait_us`, if given) or only
    /// trying.
    async fn round_trip(
        &self,
        keys: &str,
        (cost, want, back): (u64, u64, u64),
        reserve: bool,
        max_wait_us: Option<u64>,
    ) -> Result<Answer, Failure> {
        let reply = self
            .call(Call {
                key: keys,
                interval_us: self.inner.interval_us,
                burst: self.inner.burst,
                amounts: (cost, want, back),
                mode: if reserve { "reserve" } else { "try" },
                max_wait_us,
                new_limit: None,
            })
            .await?;
        Ok(match reply {
            (0, _, wait_us) => Answer::Refused {
                wait: wait_from_us(wait_us),
            },
            (_, surplus, wait_us) => Answer::Granted {
                // Never more than was asked for, whatever the script's rounding.
                surplus: surplus.min(want - cost),
                wait: wait_from_us(wait_us),
            },
        })
    }

    /// The local limiter in charge of `key` while the fail-open fallback is: `share` of the
    /// limit this process set for the key, else of the default limit.
    fn fallback<Q>(&self, key: &Q) -> Option<Local<K>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let fallback = lock(&self.inner.fallback).current()?;
        let (FailurePolicy::FailOpen { share }, Some((rate, burst))) = (
            self.inner.policy,
            lock(&self.inner.limits).get(key).copied(),
        ) else {
            return Some(Local::Default(fallback.default));
        };
        let mut own = lock(&fallback.own);
        if let Some(limiter) = own.get(key) {
            return Some(Local::Own(limiter.clone()));
        }
        let (rate, burst) = policy::share_of(rate, burst, share);
        let limiter = RateLimiter::new(rate, burst);
        own.insert(key.to_owned(), limiter.clone());
        Some(Local::Own(limiter))
    }

    fn open_fallback(&self, share: f64) {
        let (rate, burst) = policy::share_of(self.inner.rate, self.inner.burst, share);
        lock(&self.inner.fallback).open(|| KeyedFallback {
            default: KeyedRateLimiter::new(rate, burst),
            own: Arc::default(),
        });
    }

    fn recovered(&self) {
        lock(&self.inner.fallback).recovered();
    }

    /// Waits until `key`'s quota grants `cost` tokens.
    ///
    /// Under [`FailurePolicy::FailOpen`] the local fallback grants while Redis is unreachable;
    /// under [`FailurePolicy::FailClosed`] this waits for Redis.
    ///
    /// # Errors
    ///
    /// [`RedisQuotaError::Unavailable`] once Redis has been unreachable for the fail-closed
    /// deadline; [`RedisQuotaError::Reply`] at once when Redis answers with an error (a key of
    /// another type, a refused command), whatever the policy. Nothing was taken.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(quota: paced::RedisKeyedRateLimiter<String>) -> Result<(), paced::redis::RedisQuotaError> {
    /// quota.acquire("tenant-7", 1).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire<Q>(&self, key: &Q, cost: u64) -> Result<(), RedisQuotaError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        match self.wait(key, cost, None, false).await {
            Ok(()) => Ok(()),
            Err(WaitError::Quota(e)) => Err(e),
            // Without a deadline nothing is refused.
            Err(WaitError::Refused(_)) => unreachable!("acquire without a deadline refused"),
        }
    }

    /// Waits until `key`'s quota grants `cost` tokens, if that can be within `timeout`;
    /// otherwise returns at once, having taken nothing.
    ///
    /// A request that Redis would make wait longer than `timeout` is refused without being
    /// charged (in one round trip); one granted with a shorter wait is waited for.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::NotUntil`] when the cost cannot be had within `timeout`, with how
    /// long until it could be (also while Redis is unreachable past `timeout` under
    /// `FailClosed`); [`TryAcquireError::Reply`] when Redis answers with an error.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # async fn demo(quota: paced::RedisKeyedRateLimiter<u64>) {
    /// match quota.acquire_timeout(&42, 1, Duration::from_millis(50)).await {
    ///     Ok(()) => println!("go"),
    ///     Err(e) => println!("not within 50 ms: {e}"),
    /// }
    /// # }
    /// ```
    pub async fn acquire_timeout<Q>(
        &self,
        key: &Q,
        cost: u64,
        timeout: Duration,
    ) -> Result<(), TryAcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        let deadline = Instant::now().checked_add(timeout);
        match self.wait(key, cost, Some(deadline), false).await {
            Ok(()) => Ok(()),
            Err(WaitError::Refused(refused)) => {
                self.inner.counters.refuse();
                Err(TryAcquireError::NotUntil(refused))
            }
            Err(WaitError::Quota(RedisQuotaError::Reply(e))) => Err(TryAcquireError::Reply(e)),
            Err(WaitError::Quota(_)) => unreachable!("a timed wait ends by its deadline"),
        }
    }

    /// Like `acquire`, but never gives up: what a stream or a tower future does, holding its
    /// item or request. An outage is waited out whatever the fail-closed deadline, and a reply
    /// error (counted and logged as always) is asked again after 100 ms, then at a backoff
    /// doubling up to [`REPLY_BACKOFF_MAX`].
    async fn acquire_patiently<Q>(&self, key: &Q, cost: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        // Without a deadline, and retrying reply errors, there is no error to return.
        let _ = self.wait(key, cost, None, true).await;
    }

    /// The wait of `acquire` (`deadline: None`) and `acquire_timeout` (`Some(deadline)`,
    /// `Some(None)` being a deadline beyond time); `patient` (without a deadline only) never
    /// gives up, and retries reply errors at a backoff.
    async fn wait<Q>(
        &self,
        key: &Q,
        cost: u64,
        deadline: Option<Option<Instant>>,
        patient: bool,
    ) -> Result<(), WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        let counters = &self.inner.counters;
        if cost == 0 {
            counters.grant(cost);
            return Ok(());
        }
        let hold = self.hold(key);
        let keys = &hold.redis;
        let lease_tokens = self.inner.lease_tokens;
        let mut backoff = Duration::from_millis(10);
        let mut reply_backoff = Duration::from_millis(100);
        let mut failing_since: Option<Instant> = None;
        let left = |now: Instant| match deadline {
            Some(Some(d)) => Some(d.saturating_duration_since(now)),
            _ => None,
        };
        loop {
            if self.spend_lease(key, cost) {
                counters.grant(cost);
                return Ok(());
            }
            // With leases, one task at a time refills the key's lease; the others queue here
            // and take from the lease it brings back.
            let refilling = if lease_tokens > 0 {
                let lock = hold.refill.clone().lock_owned();
                let guard = match deadline {
                    Some(Some(d)) => match tokio::time::timeout_at(d, lock).await {
                        Ok(guard) => guard,
                        Err(_) => {
                            let retry = Duration::from_millis(1);
                            return Err(WaitError::Refused(NotUntil::after(retry)));
                        }
                    },
                    _ => lock.await,
                };
                if self.spend_lease(key, cost) {
                    counters.grant(cost);
                    return Ok(());
                }
                Some(guard)
            } else {
                None
            };
            if let Some(fallback) = self.fallback(key) {
                drop(refilling);
                match deadline {
                    None => fallback.acquire(key, cost).await,
                    Some(_) => {
                        let timeout = left(Instant::now()).unwrap_or(Duration::MAX);
                        fallback
                            .acquire_timeout(key, cost, timeout)
                            .await
                            .map_err(WaitError::Refused)?;
                    }
                }
                counters.grant(cost);
                counters.fall_back();
                return Ok(());
            }
            let attempt = Instant::now();
            let max_wait_us =
                left(attempt).map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
            let amounts = self.amounts(key, cost);
            let trip = self.round_trip(keys, amounts, true, max_wait_us);
            let (turn, answer) = hold.turns.send(trip).await;
            // Anything but a reservation gives its place up at once.
            let mut turn = matches!(answer, Ok(Answer::Granted { .. })).then_some(turn);
            match answer {
                Ok(Answer::Granted { surplus, wait }) => {
                    self.recovered();
                    let reserved = Reserved {
                        inner: &self.inner,
                        keys,
                        tokens: cost.saturating_add(surplus),
                    };
                    if wait == Nanos::MAX {
                        // Never: it holds nobody up, here or in Redis (nothing was charged).
                        drop(turn.take());
                        if deadline.is_some() {
                            // Never within any timeout: given back (if it was charged at all).
                            return Err(WaitError::Refused(NotUntil::NEVER));
                        }
                        std::future::pending::<()>().await;
                    } else if wait > Nanos::ZERO {
                        tokio::time::sleep(wait.to_duration()).await;
                    }
                    // After the key's reservations sent before it, however late their replies
                    // were read.
                    if let Some(turn) = &turn {
                        turn.come().await;
                    }
                    std::mem::forget(reserved);
                    self.granted(key, surplus);
                    counters.grant(cost);
                    return Ok(());
                }
                Ok(Answer::Refused { wait }) => {
                    self.recovered();
                    if deadline.is_some() {
                        return Err(WaitError::Refused(NotUntil::new(wait)));
                    }
                    // A reservation without a deadline is never refused; should the script
                    // say so, wait and ask again.
                    let wait = wait.to_duration().min(Duration::from_secs(1));
                    tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
                }
                Err(Failure::Reply(e)) => {
                    if !patient {
                        return Err(WaitError::Quota(RedisQuotaError::Reply(e)));
                    }
                    // A stream holds its item and asks again, slowly: granting without Redis's
                    // say-so could exceed the quota, and the key may be repaired meanwhile.
                    drop(refilling);
                    tokio::time::sleep(reply_backoff).await;
                    reply_backoff = (reply_backoff * 2).min(REPLY_BACKOFF_MAX);
                }
                Err(Failure::Outage(e)) => {
                    drop(refilling);
                    let since = *failing_since.get_or_insert(attempt);
                    match self.inner.policy {
                        FailurePolicy::FailClosed {
                            max_backoff,
                            deadline: give_up_after,
                        } => {
                            let mut pause = backoff;
                            if let Some(left) = left(Instant::now()) {
                                if left.is_zero() {
                                    return Err(WaitError::Refused(NotUntil::after(backoff)));
                                }
                                pause = pause.min(left);
                            } else if deadline.is_none()
                                && !patient
                                && since.elapsed() >= give_up_after
                            {
                                return Err(WaitError::Quota(RedisQuotaError::Unavailable(e)));
                            }
                            tokio::time::sleep(pause).await;
                            backoff = (backoff * 2).min(max_backoff.max(Duration::from_millis(1)));
                        }
                        FailurePolicy::FailOpen { share } => self.open_fallback(share),
                    }
                }
            }
        }
    }

    /// Grants `cost` of `key`'s quota if it holds it now; one round trip. A refusal writes
    /// nothing to Redis.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::NotUntil`], a refusal, with how long until the cost could be granted
    /// ([`NotUntil::is_never`] for a cost above the key's burst); while Redis is unreachable,
    /// under `FailClosed` a refusal with the retry backoff, under `FailOpen` the fallback's
    /// answer. [`TryAcquireError::Reply`] when Redis answers with an error.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use paced::redis::TryAcquireError;
    ///
    /// # async fn demo(quota: paced::RedisKeyedRateLimiter<String>) {
    /// match quota.try_acquire("tenant-7", 1).await {
    ///     Ok(()) => println!("go"),
    ///     Err(TryAcquireError::NotUntil(refused)) => println!("retry in {:?}", refused.retry_after()),
    ///     Err(failed) => eprintln!("the quota is broken: {failed}"),
    /// }
    /// # }
    /// ```
    pub async fn try_acquire<Q>(&self, key: &Q, cost: u64) -> Result<(), TryAcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        let counters = &self.inner.counters;
        if cost == 0 || self.spend_lease(key, cost) {
            counters.grant(cost);
            return Ok(());
        }
        let answer = if let Some(fallback) = self.fallback(key) {
            let answer = fallback.try_acquire(key, cost);
            if answer.is_ok() {
                counters.fall_back();
            }
            answer
        } else {
            // Without leases a try keeps nothing locally: it has nothing to give back and
            // takes no turn.
            let leases = self.inner.lease_tokens > 0;
            let hold = leases.then(|| self.hold(key));
            let own_key;
            let redis_key: &str = match &hold {
                Some(hold) => &hold.redis,
                None => {
                    own_key = self.redis_key(key);
                    &own_key
                }
            };
            // A try takes `cost` if it is there, and with leases (of a key in use) whatever
            // more is there, up to a lease; it never waits for a whole one.
            let amounts = self.amounts(key, cost);
            match self.round_trip(redis_key, amounts, false, None).await {
                Ok(Answer::Granted { surplus, .. }) => {
                    self.recovered();
                    self.granted(key, surplus);
                    Ok(())
                }
                Ok(Answer::Refused { wait }) => {
                    self.recovered();
                    Err(NotUntil::new(wait))
                }
                Err(Failure::Reply(e)) => return Err(TryAcquireError::Reply(e)),
                Err(Failure::Outage(_)) => match self.inner.policy {
                    FailurePolicy::FailOpen { share } => {
                        self.open_fallback(share);
                        drop(hold);
                        return Box::pin(self.try_acquire(key, cost)).await;
                    }
                    FailurePolicy::FailClosed { .. } => {
                        Err(NotUntil::after(Duration::from_millis(10)))
                    }
                },
            }
        };
        if answer.is_ok() {
            counters.grant(cost);
        } else {
            counters.refuse();
        }
        answer.map_err(TryAcquireError::NotUntil)
    }

    /// Gives `key` its own limit, for every process: stored in Redis beside the key's bucket
    /// (it does not expire), and read by every process's next request for the key. The key
    /// keeps its level, in tokens (at most the new burst); a full bucket stays full.
    ///
    /// This process also remembers the limit (until it clears it), so that under `FailOpen`
    /// its fallback grants the key `share` of it during an outage.
    ///
    /// # Errors
    ///
    /// [`RedisQuotaError::Config`] for a zero burst; [`RedisQuotaError::Reply`] when Redis
    /// answers with an error; [`RedisQuotaError::Unavailable`] when Redis cannot be reached,
    /// at once, whatever the failure policy: a change of configuration is neither retried nor
    /// granted by a fallback, and a failed one changes nothing in this process (its fallback
    /// keeps the limit it knew). A round trip that timed out may still have reached Redis:
    /// set the limit again once Redis is back.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use paced::Rate;
    ///
    /// # async fn demo(quota: paced::RedisKeyedRateLimiter<String>) -> Result<(), paced::redis::RedisQuotaError> {
    /// quota.set_limit("premium", Rate::per_second(100), 20).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn set_limit<Q>(&self, key: &Q, rate: Rate, burst: u64) -> Result<(), RedisQuotaError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        if burst == 0 {
            return Err(RedisQuotaError::Config(ConfigError::ZeroBurst));
        }
        self.change_limit(key, Some((policy::interval_us(rate), burst)))
            .await?;
        lock(&self.inner.limits).insert(key.to_owned(), (rate, burst));
        Ok(())
    }

    /// Gives `key` the default limit again, for every process, keeping its level (at most the
    /// default burst). This process forgets the limit it had set for the key: its fail-open
    /// fallback grants the key `share` of the default limit again.
    ///
    /// # Errors
    ///
    /// As [`set_limit`](RedisKeyedRateLimiter::set_limit)'s, but for the burst: while Redis
    /// cannot be reached, [`RedisQuotaError::Unavailable`] at once, and nothing changes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(quota: paced::RedisKeyedRateLimiter<String>) -> Result<(), paced::redis::RedisQuotaError> {
    /// quota.clear_limit("premium").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn clear_limit<Q>(&self, key: &Q) -> Result<(), RedisQuotaError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + Display + ToOwned<Owned = K> + ?Sized,
    {
        self.change_limit(key, None).await?;
        lock(&self.inner.limits).remove(key);
        Ok(())
    }

    async fn change_limit<Q>(
        &self,
        key: &Q,
        limit: Option<(f64, u64)>,
    ) -> Result<(), RedisQuotaError>
    where
        Q: Display + ?Sized,
    {
        let keys = self.redis_key(key);
        let reply = self
            .call(Call {
                key: &keys,
                interval_us: self.inner.interval_us,
                burst: self.inner.burst,
                amounts: (0, 0, 0),
                mode: if limit.is_some() { "limit" } else { "clear" },
                max_wait_us: None,
                new_limit: limit,
            })
            .await;
        match reply {
            Ok(_) => {
                self.recovered();
                Ok(())
            }
            Err(Failure::Reply(e)) => Err(RedisQuotaError::Reply(e)),
            Err(Failure::Outage(e)) => Err(RedisQuotaError::Unavailable(e)),
        }
    }

    /// This process's counters, over all keys.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(quota: paced::RedisKeyedRateLimiter<String>) {
    /// let stats = quota.stats();
    /// println!("{} grants in {} round trips; {} keys in use", stats.granted, stats.round_trips, stats.keys);
    /// # }
    /// ```
    #[must_use]
    pub fn stats(&self) -> RedisKeyedStats {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RedisKeyedStats {
            round_trips: get(&c.round_trips),
            granted: get(&c.granted),
            from_lease: get(&c.from_lease),
            fallback: get(&c.fallback),
            rejected: get(&c.rejected),
            errors: get(&c.errors),
            reply_errors: get(&c.reply_errors),
            keys: lock(&self.inner.keys).len(),
        }
    }
}

/// A stream's front item or a tower request of one key in flight on a
/// [`RedisKeyedRateLimiter`] (not nameable outside the crate): the key, and the round trip
/// (with the wait that follows it) in flight.
pub struct RedisKeyPermit<K> {
    quota: RedisKeyedRateLimiter<K>,
    key: K,
    acquire: Option<Pending<()>>,
    #[cfg(feature = "tower")]
    check: Option<Pending<Result<(), NotUntil>>>,
}

/// Nothing in it is ever pinned in place: the key is cloned into each round trip, and the
/// round trips are boxed.
impl<K> Unpin for RedisKeyPermit<K> {}

impl<K> fmt::Debug for RedisKeyPermit<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisKeyPermit")
            .field("in_flight", &self.acquire.is_some())
            .finish_non_exhaustive()
    }
}

impl<K> KeyedLimiter for RedisKeyedRateLimiter<K> where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static
{
}

/// A stream holds its item while its key's request is in flight: nothing is lost if it is
/// dropped (a reservation not yet used is given back), and the stream never fails (see
/// `acquire_patiently`).
impl<K> KeyedSealed for RedisKeyedRateLimiter<K>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
{
    type Key = K;
    type Hasher = RandomState;
    type Permit = RedisKeyPermit<K>;

    fn hash_key(&self, key: &K) -> u64 {
        self.inner.hasher.hash_one(key)
    }

    fn permit(&self, key: K, _: u64) -> RedisKeyPermit<K> {
        RedisKeyPermit {
            quota: self.clone(),
            key,
            acquire: None,
            #[cfg(feature = "tower")]
            check: None,
        }
    }

    fn arrive(&self, key: &K, hash: u64, cost: u64, waker: &Waker) -> Arrival<RedisKeyPermit<K>> {
        let mut permit = self.permit(key.clone(), hash);
        let mut cx = Context::from_waker(waker);
        // From a key's lease, or when the cost is 0, this is ready at once.
        match Self::poll_acquire(Pin::new(&mut permit), &mut cx, cost) {
            Poll::Ready(()) => Arrival::Granted,
            // Its round trip or its sleep wakes `waker`.
            Poll::Pending => Arrival::Waiting { permit, ask: false },
        }
    }

    fn poll_acquire(
        permit: Pin<&mut RedisKeyPermit<K>>,
        cx: &mut Context<'_>,
        cost: u64,
    ) -> Poll<()> {
        let permit = permit.get_mut();
        let (quota, key) = (&permit.quota, &permit.key);
        poll_slot(&mut permit.acquire, cx, || {
            let (quota, key) = (quota.clone(), key.clone());
            async move { quota.acquire_patiently(&key, cost).await }
        })
    }

    #[cfg(feature = "tower")]
    fn poll_try_acquire(
        permit: Pin<&mut RedisKeyPermit<K>>,
        cx: &mut Context<'_>,
        cost: u64,
    ) -> Poll<Result<(), NotUntil>> {
        let permit = permit.get_mut();
        let (quota, key) = (&permit.quota, &permit.key);
        poll_slot(&mut permit.check, cx, || {
            let (quota, key) = (quota.clone(), key.clone());
            async move {
                // A reply error (counted and logged by `try_acquire`) refuses the request: it
                // is not let through without Redis's say-so.
                quota.try_acquire(&key, cost).await.map_err(|e| match e {
                    TryAcquireError::NotUntil(refused) => refused,
                    TryAcquireError::Reply(_) => NotUntil::after(super::script::REPLY_RETRY),
                })
            }
        })
    }

    #[cfg(feature = "http")]
    fn state(_: Pin<&mut RedisKeyPermit<K>>) -> Option<crate::stats::LimitState> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn keys_are_escaped() {
        assert_eq!(escape("plain-key_1"), "plain-key_1");
        assert_eq!(escape("a:b{c}%d"), "a%3Ab%7Bc%7D%25d");
        assert_eq!(escape("é"), "é");
    }
}
