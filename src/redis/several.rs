//! The state of a quota of several limits (a [`RedisRateLimiter<[u64; N]>`](RedisRateLimiter),
//! or one key of a keyed one): its limits in the script's form, this process's lease and
//! fallback, and the round trips that send them to the script.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::fallback::Fallback;
use super::limiter::RedisRateLimiter;
use super::policy::{self, FailurePolicy};
use super::script::{eval, round_down, round_up, wait_from_us, Conn, Counters, Failure};
use super::turns::{Turns, Warmth};
use super::wait::Gate;
use crate::core::Nanos;
use crate::limiter::{Limit, RateLimiter};
use crate::rate::Rate;
use crate::sync::{lock, Mutex};

/// One limit of the quota, on dimension `dim`: set when the limiter is built, never changed
/// (a limit set later is kept apart, see [`Quota::own`]).
pub(super) struct RedisLimit {
    pub(super) dim: usize,
    pub(super) kind: Kind,
    /// The kind's four numbers as the script reads them (see [`Kind::values`]), written once.
    script: [u8; 32],
}

impl fmt::Debug for RedisLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimit")
            .field("dim", &self.dim)
            .field("kind", &self.kind)
            .finish()
    }
}

impl RedisLimit {
    pub(super) fn new(dim: usize, kind: Kind) -> RedisLimit {
        let mut script = [0; 32];
        for (bytes, v) in script.chunks_exact_mut(8).zip(kind.values()) {
            bytes.copy_from_slice(&v.to_le_bytes());
        }
        RedisLimit { dim, kind, script }
    }
}

/// A limit as the script takes it: a token bucket, or a fixed window aligned on Redis's clock.
#[derive(Clone, Copy, Debug)]
pub(super) enum Kind {
    Bucket {
        rate: Rate,
        burst: u64,
        interval_us: f64,
    },
    Window {
        quota: u64,
        window: Duration,
        origin: SystemTime,
        len_us: f64,
        /// The origin's Unix time modulo the length, in microseconds.
        phase_us: f64,
    },
}

impl Kind {
    /// The script's form of a checked `limit`.
    pub(super) fn of(limit: &Limit) -> Kind {
        match (limit.as_bucket(), limit.as_window()) {
            (Some((rate, burst)), _) => Kind::Bucket {
                rate,
                burst,
                interval_us: policy::interval_us(rate),
            },
            (None, Some((quota, window, origin))) => {
                let len_us = window.as_nanos() as f64 / 1_000.0;
                let origin_us = match origin.duration_since(SystemTime::UNIX_EPOCH) {
                    Ok(after) => after.as_nanos() as f64 / 1_000.0,
                    Err(before) => -(before.duration().as_nanos() as f64 / 1_000.0),
                };
                Kind::Window {
                    quota,
                    window,
                    origin,
                    len_us,
                    phase_us: origin_us.rem_euclid(len_us),
                }
            }
            (None, None) => unreachable!("a limit is a bucket or a window"),
        }
    }

    /// The script's four numbers: kind, then a bucket's microseconds per token and burst (and
    /// 0), or a window's length, quota and phase.
    pub(super) fn values(&self) -> [f64; 4] {
        match *self {
            Kind::Bucket {
                burst, interval_us, ..
            } => [0.0, interval_us, round_down(burst), 0.0],
            Kind::Window {
                quota,
                len_us,
                phase_us,
                ..
            } => [1.0, len_us, round_down(quota), phase_us],
        }
    }
}

/// What every quota of a limiter shares: the connection, the script, the limits, the policy,
/// the counters.
pub(super) struct Inner<const N: usize> {
    pub(super) conn: Conn,
    /// Whether a round trip on `conn` has come back (see [`Warmth`]).
    pub(super) warmth: Arc<Warmth>,
    pub(super) script: redis::Script,
    /// The limiter's name, escaped as in every Redis key.
    pub(super) name: String,
    pub(super) names: [String; N],
    pub(super) limits: Vec<RedisLimit>,
    pub(super) policy: FailurePolicy,
    pub(super) lease: Option<([u64; N], Duration)>,
    /// With leases, whether every round trip asks for one (a `RedisRateLimiter`), or only the
    /// round trips of a quota in use, granted within the lease's age (each key of a
    /// `RedisKeyedRateLimiter`, as with one limit): so a key not asked again within the age
    /// never holds tokens it does not use, nor costs a round trip to give them back.
    pub(super) eager_lease: bool,
    /// A one-limit limiter's quota (see [`Form::one`]).
    pub(super) one: bool,
    pub(super) counters: Counters,
}

/// How a limiter's quotas are kept and leased.
#[derive(Clone, Copy, Debug)]
pub(super) struct Form {
    /// See [`Inner::eager_lease`].
    pub(super) eager_lease: bool,
    /// A one-limit limiter (`RedisRateLimiter`, `RedisKeyedRateLimiter` of a `u64` cost): its
    /// one bucket kept in the script's one-bucket form (two doubles), a limiter's quota named
    /// as given (a keyed one's keys named as for several limits), and a lease of `m` tokens
    /// counting the cost (a round trip takes at most `m`, the cost included).
    pub(super) one: bool,
}

impl<const N: usize> Inner<N> {
    /// The script's limits (five doubles each: kind, three numbers, `amount` of the limit's
    /// dimension).
    pub(super) fn spec(&self, amount: impl Fn(usize) -> f64) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.limits.len() * 40 + 1);
        for limit in &self.limits {
            out.extend_from_slice(&limit.script);
            out.extend_from_slice(&amount(limit.dim).to_le_bytes());
        }
        if self.one {
            // The trailing byte that asks for the one-bucket form (see the script's header).
            out.push(1);
        }
        out
    }

    /// One script call on the quota `key`, in the general form: ARGV[3] to ARGV[5] after the
    /// limits (see the script: the reservation's longest wait, the settled grant's instant, a
    /// new limit; a lease; tokens to give back first).
    pub(super) async fn call(
        &self,
        key: &str,
        mode: &str,
        spec: Vec<u8>,
        args: [Option<Vec<u8>>; 3],
        cost: u64,
    ) -> Result<Vec<u64>, Failure> {
        self.counters.round_trip();
        let reply = eval(&self.script, self.conn.clone(), key, mode, spec, args).await;
        // `cost`, the amounts charged added up, for the log of a reply error.
        reply.map_err(|e| Failure::classify(e, &self.counters, key, cost))
    }

    /// The round trip that gives `back` back to the quota `key`, as a settle of a grant
    /// charged at its instant. It may have run even if it failed: not offering the tokens
    /// again errs on the quota's side.
    pub(super) async fn send_back(&self, key: &str, back: Back<N>) {
        let spec = self.spec(|dim| -round_down(back.dims[dim]));
        let at = back
            .at_us
            .map_or_else(|| (-1f64).to_le_bytes().to_vec(), micros);
        let args = [Some(at), None, None];
        let _ = self.call(key, "settle", spec, args, sum(back.dims)).await;
    }

    /// How long the fail-open fallback's limits take to be full again from empty, unused: a
    /// bucket's burst at its rate (at `share` of the builder's: at least one token, refilled
    /// at `share` of the rate), a window's length; the longest of them. A fallback unused for
    /// that long is as a new one would be.
    pub(super) fn full_after(&self) -> Duration {
        let share = match self.policy {
            FailurePolicy::FailOpen { share } => share,
            FailurePolicy::FailClosed { .. } => 1.0,
        };
        let longest = self.limits.iter().map(|l| match l.kind {
            Kind::Bucket { rate, burst, .. } => {
                let (rate, burst) = policy::share_of(rate, burst, share);
                let us = policy::interval_us(rate) * burst as f64;
                Duration::try_from_secs_f64(us / 1e6).unwrap_or(Duration::MAX)
            }
            Kind::Window { window, .. } => window,
        });
        longest.max().unwrap_or(Duration::ZERO)
    }

    /// Whether a dimension has a limit (one without needs no lease, and gives nothing back).
    pub(super) fn limited(&self, dim: usize) -> bool {
        self.limits.iter().any(|l| l.dim == dim)
    }

    /// `dims` with 0 for the dimensions without a limit.
    pub(super) fn limited_only(&self, mut dims: [u64; N]) -> [u64; N] {
        for (d, n) in dims.iter_mut().enumerate() {
            if !self.limited(d) {
                *n = 0;
            }
        }
        dims
    }

    /// Whether a reservation waits for a whole lease, as a one-limit quota's does: with
    /// leases, when every limit is a bucket. Then each round trip of a saturated fleet brings
    /// back a lease that the next requests of this process share, and one task at a time
    /// refills it. A fixed window could make that wait last until its next window, so with one
    /// a reservation takes what room its instant has, and never waits longer for a lease.
    pub(super) fn refills(&self) -> bool {
        self.lease.is_some()
            && self
                .limits
                .iter()
                .all(|l| matches!(l.kind, Kind::Bucket { .. }))
    }
}

impl Inner<1> {
    /// A one-limit quota's rate and burst, as built.
    pub(super) fn bucket(&self) -> (Rate, u64) {
        match self.limits.first().map(|l| l.kind) {
            Some(Kind::Bucket { rate, burst, .. }) => (rate, burst),
            _ => unreachable!("a one-limit quota is one bucket"),
        }
    }
}

/// What this process holds of a lease: per dimension, tokens charged in Redis at `at_us` and
/// not granted yet, until `until`.
pub(super) struct Lease<const N: usize> {
    pub(super) left: [u64; N],
    pub(super) until: Instant,
    pub(super) at_us: u64,
}

/// Tokens charged in Redis that this process will not grant (a lease expired or replaced, a
/// reservation whose waiter went away), per dimension, and the Redis instant they were
/// charged at while they are one charge's alone (the script then takes the latest grant's
/// tokens back in full, and a fixed window takes them back within the window they were
/// charged in).
#[derive(Clone, Copy, Debug)]
pub(super) struct Back<const N: usize> {
    pub(super) dims: [u64; N],
    pub(super) at_us: Option<u64>,
}

impl<const N: usize> Back<N> {
    pub(super) const NOTHING: Back<N> = Back {
        dims: [0; N],
        at_us: None,
    };

    pub(super) fn is_empty(&self) -> bool {
        self.dims == [0; N]
    }

    /// Adds `dims` charged at Redis time `at_us`.
    pub(super) fn add(&mut self, dims: [u64; N], at_us: u64) {
        self.merge(Back {
            dims,
            at_us: Some(at_us),
        });
    }

    /// Adds what `other` holds: one instant while both were charged at it, else none.
    pub(super) fn merge(&mut self, other: Back<N>) {
        if other.is_empty() {
            return;
        }
        self.at_us = if self.is_empty() || self.at_us == other.at_us {
            other.at_us
        } else {
            None
        };
        for (d, n) in self.dims.iter_mut().zip(other.dims) {
            *d = d.saturating_add(n);
        }
    }
}

/// A quota's state in this process, under one lock: its lease, whether a task is set to
/// give it back once it expires (so that a lease taken as that task ends is never missed),
/// what it has to give back, and its acquisitions in flight.
pub(super) struct Leased<const N: usize> {
    pub(super) held: Option<Lease<N>>,
    pub(super) sweeping: bool,
    /// Given back with the quota's next round trip or, once no acquisition is in flight, in
    /// the background.
    pub(super) back: Back<N>,
    /// Acquisitions in flight.
    pub(super) users: usize,
    /// When the quota was last granted, by Redis or from its lease.
    pub(super) granted_at: Option<Instant>,
    /// Locked while tokens go back to Redis in the background: the quota's next round trips
    /// wait for it, so that Redis charges them after the tokens are back.
    pub(super) returning: Option<Gate>,
}

/// One quota (one Redis key, holding all its limits) as this process knows it.
pub(super) struct Quota<const N: usize> {
    /// `{name}` (or `{name:key}` for a keyed limiter): one key, so one Cluster slot, for every
    /// limit.
    pub(super) key: String,
    /// The order of this process's reservations, as Redis charged them (made by the first
    /// that needs it: a `try_acquire` takes no turn).
    turns: OnceLock<Arc<Turns>>,
    pub(super) fallback: Mutex<Fallback<RateLimiter<[u64; N]>>>,
    pub(super) lease: Mutex<Leased<N>>,
    /// With leases over buckets only, one task at a time refills the lease (see
    /// [`Inner::refills`]); the others wait here and take from what it brings back. Made by
    /// the first that needs it.
    refill: OnceLock<Arc<tokio::sync::Mutex<()>>>,
    /// The limits this process set ([`RedisRateLimiter::set_limit`]) and has not cleared,
    /// by index: what its fail-open fallback takes `share` of.
    pub(super) own: Mutex<Vec<Option<Kind>>>,
    /// What every quota of the limiter shares (also what gives the quota's lease back once
    /// its last handle goes).
    pub(super) shared: Arc<Inner<N>>,
}

impl<const N: usize> Quota<N> {
    pub(super) fn new(key: String, shared: Arc<Inner<N>>) -> Quota<N> {
        Quota {
            key,
            turns: OnceLock::new(),
            fallback: Mutex::new(Fallback::default()),
            lease: Mutex::new(Leased {
                held: None,
                sweeping: false,
                back: Back::NOTHING,
                users: 0,
                granted_at: None,
                returning: None,
            }),
            refill: OnceLock::new(),
            own: Mutex::new(Vec::new()),
            shared,
        }
    }

    /// The order of this process's reservations of the quota.
    pub(super) fn turns(&self) -> &Arc<Turns> {
        self.turns
            .get_or_init(|| Arc::new(Turns::new(self.shared.warmth.clone())))
    }

    /// Whether no reservation of this process is in flight, queued or asking for the quota.
    pub(super) fn turns_idle(&self) -> bool {
        self.turns.get().is_none_or(|turns| turns.is_idle())
    }

    /// The lock of the task that refills the lease.
    pub(super) fn refill(&self) -> &Arc<tokio::sync::Mutex<()>> {
        self.refill.get_or_init(Arc::default)
    }

    /// Whether this process set a limit of the quota that it has not cleared.
    pub(super) fn has_own_limits(&self) -> bool {
        lock(&self.own).iter().any(Option::is_some)
    }

    /// Whether a keyed limiter keeps the quota once a `try_acquire` of a key it did not know is
    /// over: when it is in use ([`in_use`](Self::in_use)), has limits of this process's own, or
    /// its fail-open fallback is not as a new one would be (it stood in for Redis within the
    /// time its limits take to be full again).
    pub(super) fn holds_state(&self) -> bool {
        let fails_open = matches!(self.shared.policy, FailurePolicy::FailOpen { .. });
        self.in_use()
            || self.has_own_limits()
            || (fails_open && lock(&self.fallback).is_kept(|| self.shared.full_after()))
    }

    /// Whether this process holds state for the quota now, as [`RedisStats::keys`] counts it:
    /// an acquisition in flight (a round trip, a grant waiting its turn, a request the lease
    /// could not serve), a lease or tokens on their way back, or, with leases, a grant within
    /// the lease's age.
    ///
    /// [`RedisStats::keys`]: super::RedisStats::keys
    pub(super) fn in_use(&self) -> bool {
        let local = lock(&self.lease);
        let recent = match (self.shared.lease, local.granted_at) {
            (Some((_, age)), Some(at)) => Instant::now().saturating_duration_since(at) < age,
            _ => false,
        };
        local.users > 0
            || local.held.is_some()
            || !local.back.is_empty()
            || local.returning.is_some()
            || recent
            || !self.turns_idle()
    }
}

/// The quota's last handle is gone (a limiter's, or a keyed limiter's that forgot the key or
/// went): what its lease holds, and whatever else it has to give back, goes back in the
/// background, in one round trip (if there is a runtime; if not, it stays charged: on the
/// quota's side).
impl<const N: usize> Drop for Quota<N> {
    fn drop(&mut self) {
        let back = {
            let mut local = lock(&self.lease);
            let mut back = std::mem::replace(&mut local.back, Back::NOTHING);
            if let Some(lease) = local.held.take() {
                back.add(self.shared.limited_only(lease.left), lease.at_us);
            }
            back
        };
        if back.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (shared, key) = (self.shared.clone(), std::mem::take(&mut self.key));
        runtime.spawn(async move { shared.send_back(&key, back).await });
    }
}

/// A [`RedisRateLimiter`]'s state for several limits: public in a private module (see
/// [`Cost`](crate::limiter::Cost)).
pub struct Several<const N: usize> {
    /// The quota, and through it what every quota of the limiter shares.
    pub(super) quota: Arc<Quota<N>>,
}

impl<const N: usize> Clone for Several<N> {
    fn clone(&self) -> Self {
        Several {
            quota: self.quota.clone(),
        }
    }
}

impl<const N: usize> fmt::Debug for Several<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRateLimiter")
            .field("key", &self.quota.key)
            .field("names", &self.quota.shared.names)
            .field("limits", &self.quota.shared.limits)
            .field("policy", &self.quota.shared.policy)
            .finish_non_exhaustive()
    }
}

/// What one round trip answered: granted, usable after the wait, or refused for the wait.
pub(super) enum Answer {
    /// Granted, usable after the wait, charged at Redis time `.1` (microseconds), with what
    /// each limit's dimension took beyond the cost for a lease (empty without one).
    Granted(Nanos, u64, Vec<u64>),
    Refused(Nanos),
}

impl<const N: usize> RedisRateLimiter<[u64; N]> {
    /// The script's limits, each with its dimension's amount of `cost`.
    pub(super) fn amounts(&self, cost: [u64; N]) -> Vec<u8> {
        self.spec(|dim| round_up(cost[dim]))
    }

    /// The script's limits (see [`Inner::spec`]).
    pub(super) fn spec(&self, amount: impl Fn(usize) -> f64) -> Vec<u8> {
        self.inner.quota.shared.spec(amount)
    }

    /// The script's lease argument for a round trip that charges `cost`, with leases: per
    /// limit, its dimension and the most to lease of it beyond the cost (a one-limit lease of
    /// `m` counts the cost: `m - cost`, and none once the cost is `m` or more).
    pub(super) fn lease_wanted(&self, cost: [u64; N]) -> Option<Vec<u8>> {
        if !self.wants_lease() {
            return None;
        }
        let (mut max_tokens, _) = self.inner.quota.shared.lease?;
        if self.inner.quota.shared.one {
            max_tokens[0] = max_tokens[0].saturating_sub(cost[0]);
            if max_tokens[0] == 0 {
                return None;
            }
        }
        let mut want = Vec::with_capacity(self.inner.quota.shared.limits.len() * 16);
        for limit in &self.inner.quota.shared.limits {
            want.extend_from_slice(&(limit.dim as f64).to_le_bytes());
            let most = round_down(max_tokens[limit.dim]);
            want.extend_from_slice(&most.to_le_bytes());
        }
        // The rule of a reservation's lease (see `Inner::refills`): wait for all of it, or
        // take what the limits hold at the grant's instant.
        let rule = if self.inner.quota.shared.refills() {
            1.0
        } else {
            0.0
        };
        want.extend_from_slice(&f64::to_le_bytes(rule));
        Some(want)
    }

    /// Whether a round trip asks for a lease: with leases, always for a limiter of one quota;
    /// for a key of a keyed one, while it is in use (see [`Inner::eager_lease`]).
    pub(super) fn wants_lease(&self) -> bool {
        let Some((_, max_age)) = self.inner.quota.shared.lease else {
            return false;
        };
        if self.inner.quota.shared.eager_lease {
            return true;
        }
        let granted_at = lock(&self.inner.quota.lease).granted_at;
        let now = Instant::now();
        granted_at.is_some_and(|at| now.saturating_duration_since(at) < max_age)
    }

    /// One script call on this quota (see [`Inner::call`]).
    pub(super) async fn call(
        &self,
        mode: &str,
        spec: Vec<u8>,
        args: [Option<Vec<u8>>; 3],
        cost: u64,
    ) -> Result<Vec<u64>, Failure> {
        let key = &self.inner.quota.key;
        self.inner
            .quota
            .shared
            .call(key, mode, spec, args, cost)
            .await
    }

    /// The round trip that charges `cost`: `"reserve"` (within `max_wait_us`, if given) or
    /// `"try"`. With leases it asks for one too (see [`Inner::refills`] for when a reservation
    /// waits for it). It first gives back what this process has to give back, after any that
    /// is on its way back in the background (see `take_back`).
    pub(super) async fn charge_trip(
        &self,
        mode: &str,
        cost: [u64; N],
        max_wait_us: Option<u64>,
    ) -> Result<Answer, Failure> {
        let back = self.take_back().await;
        let args = [
            max_wait_us.map(micros),
            self.lease_wanted(cost),
            self.back_arg(&back),
        ];
        // It may have run even if it failed: not offering the tokens again errs on the
        // quota's side.
        let reply = self.call(mode, self.amounts(cost), args, sum(cost)).await?;
        let answer = self.answer(reply);
        if let (Answer::Granted(..), Some(_)) = (&answer, self.inner.quota.shared.lease) {
            lock(&self.inner.quota.lease).granted_at = Some(Instant::now());
        }
        Ok(answer)
    }

    /// What a grant leased, per dimension (one amount per limit, the same for every limit of
    /// a dimension).
    pub(super) fn leased_per_dim(&self, leased: &[u64]) -> [u64; N] {
        let mut left = [0; N];
        for (limit, &n) in self.inner.quota.shared.limits.iter().zip(leased) {
            left[limit.dim] = n;
        }
        left
    }

    pub(super) fn answer(&self, reply: Vec<u64>) -> Answer {
        match reply[..] {
            [0, wait_us, ..] => Answer::Refused(wait_from_us(wait_us)),
            [_, wait_us, at_us, ref leased @ ..] => {
                Answer::Granted(wait_from_us(wait_us), at_us, leased.to_vec())
            }
            _ => Answer::Refused(Nanos::MAX),
        }
    }
}

/// A number of microseconds as the script reads it: one little-endian double.
pub(super) fn micros(us: u64) -> Vec<u8> {
    round_down(us).to_le_bytes().to_vec()
}

/// A cost's amounts added up (saturating), as the counters count grants.
pub(super) fn sum<const N: usize>(cost: [u64; N]) -> u64 {
    cost.iter().fold(0u64, |a, &c| a.saturating_add(c))
}
