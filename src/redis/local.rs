//! The local state of a keyed limiter's keys in use: what the state its handles share keeps
//! per key. Data only; how leases are taken and given back is in the `lease` module.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::turns::Turns;
use super::wait::Gate;

/// Tokens to give back and, while they are one reservation's alone, the Redis instant it was
/// charged for: Redis takes the last grant's tokens back in full even while grants wait (see
/// the script's "Tokens given back while grants wait").
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ToReturn {
    pub(super) tokens: u64,
    pub(super) at_us: Option<u64>,
}

impl ToReturn {
    /// Nothing to give back.
    pub(super) const NOTHING: ToReturn = ToReturn {
        tokens: 0,
        at_us: None,
    };

    /// Adds tokens of no one reservation (a lease).
    pub(super) fn add(&mut self, tokens: u64) {
        if tokens > 0 {
            self.tokens = self.tokens.saturating_add(tokens);
            self.at_us = None;
        }
    }

    /// Adds a reservation's tokens, charged for Redis instant `at_us`.
    pub(super) fn add_reserved(&mut self, tokens: u64, at_us: u64) {
        if tokens > 0 {
            self.at_us = (self.tokens == 0).then_some(at_us);
            self.tokens = self.tokens.saturating_add(tokens);
        }
    }
}

/// What this process keeps for one key while it is in use: while an acquisition is in
/// flight, or a lease is held.
pub(super) struct KeyLocal {
    /// Acquisitions in flight.
    pub(super) users: usize,
    pub(super) redis: Arc<str>,
    pub(super) lease: Option<Lease>,
    /// Tokens to give back with the key's next round trip: an expired or replaced lease, a
    /// reservation whose waiter went away.
    pub(super) to_return: ToReturn,
    /// Locked while tokens of the key go back to Redis in the background: its next requests
    /// wait for it, so that Redis charges them after the tokens are back.
    pub(super) returning: Option<Gate>,
    /// With leases, one task at a time refills the key's lease; the others wait for it rather
    /// than each asking Redis for a whole lease of its own.
    pub(super) refill: Arc<tokio::sync::Mutex<()>>,
    /// The order of the key's reservations sent by this process.
    pub(super) turns: Arc<Turns>,
    /// With leases, when the key was last granted (by Redis or from its lease): a key granted
    /// within the lease age is in use, and its next round trip asks for a whole lease.
    pub(super) granted_at: Option<Instant>,
}

impl KeyLocal {
    /// Whether the key was granted within `age` before `now`.
    pub(super) fn in_use(&self, now: Instant, age: Duration) -> bool {
        self.granted_at
            .is_some_and(|at| now.saturating_duration_since(at) < age)
    }

    /// Whether nothing needs the key's local state any more.
    pub(super) fn idle(&self, now: Instant, age: Duration) -> bool {
        self.users == 0
            && self.lease.is_none()
            && self.returning.is_none()
            && !self.in_use(now, age)
    }
}

/// Tokens of one key taken from Redis ahead of use, spent locally.
pub(super) struct Lease {
    pub(super) tokens: u64,
    pub(super) expires: Instant,
}
