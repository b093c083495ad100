//! The handles a named limiter records to on the `metrics` facade (feature `metrics`).
//!
//! Each handle is registered once, when the limiter is given its name, and kept in the state
//! every clone shares (a [`Named`] slot, replaced if the limiter is named again: the last name
//! given wins), so recording an event is one call on a handle: no look-up in the recorder's
//! registry per event. The names and labels are listed in the guide's "Metrics" section.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{OnceLock, PoisonError, RwLock, RwLockReadGuard};

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram, Label};

/// The label every metric carries: the limiter's name.
const LABEL: &str = "limiter";
/// The label of an `Adaptive<[u64; N]>`'s metrics that tells its limits apart (their index).
const LIMIT_LABEL: &str = "limit";

/// The handles a limiter records to under its name, shared by every clone: none until it is
/// named, then those of the last name given.
///
/// The first name is kept in a set-once slot, read with one load per event; a limiter named
/// again (rare) moves to a slot behind a read-write lock, which each event then read-locks
/// (about 10 ns more per event, measured with `benches/metrics.rs`).
#[derive(Debug)]
pub(crate) struct Named<T> {
    first: OnceLock<T>,
    /// Whether the limiter was named again: `later` holds the handles in force.
    renamed: AtomicBool,
    later: RwLock<Option<T>>,
}

/// The handles in force while an event is recorded to them.
#[derive(Debug)]
pub(crate) enum Handles<'a, T> {
    First(&'a T),
    /// Read-locked: a new name waits until the event is recorded.
    Later(RwLockReadGuard<'a, Option<T>>),
}

impl<T> Deref for Handles<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        match self {
            Handles::First(handles) => handles,
            Handles::Later(guard) => match guard.as_ref() {
                Some(handles) => handles,
                None => unreachable!("a `Handles` is made only over handles"),
            },
        }
    }
}

impl<T> Default for Named<T> {
    fn default() -> Self {
        Named {
            first: OnceLock::new(),
            renamed: AtomicBool::new(false),
            later: RwLock::new(None),
        }
    }
}

impl<T> Named<T> {
    /// The handles in force, if the limiter has a name.
    #[inline]
    pub(crate) fn get(&self) -> Option<Handles<'_, T>> {
        if self.renamed.load(Ordering::Acquire) {
            let guard = self.later.read().unwrap_or_else(PoisonError::into_inner);
            return guard.is_some().then(|| Handles::Later(guard));
        }
        self.first.get().map(Handles::First)
    }

    /// Records to `handles` from now on; `retire` is given those of the previous name, if
    /// any. Call it under the limiter's lock, so that names are given one at a time.
    pub(crate) fn replace(&self, handles: T, retire: impl FnOnce(&T)) {
        let handles = match self.first.set(handles) {
            Ok(()) => return,
            Err(handles) => handles,
        };
        let mut later = self.later.write().unwrap_or_else(PoisonError::into_inner);
        match later.replace(handles) {
            Some(previous) => retire(&previous),
            None => {
                if let Some(first) = self.first.get() {
                    retire(first);
                }
            }
        }
        self.renamed.store(true, Ordering::Release);
    }
}

/// The counters of a limiter called `name`, wherever its state is kept (in the process or in
/// Redis): requests granted, requests refused, tokens granted.
fn grant_counters(name: &str) -> [Counter; 3] {
    let name = name.to_owned();
    [
        counter!("paced_grants_total", LABEL => name.clone()),
        counter!("paced_refusals_total", LABEL => name.clone()),
        counter!("paced_tokens_granted_total", LABEL => name),
    ]
}

/// The handles of a shared limiter (one lane, or one per key).
#[derive(Debug)]
pub(crate) struct LimiterMetrics {
    pub(crate) grants: Counter,
    pub(crate) refusals: Counter,
    pub(crate) cancellations: Counter,
    pub(crate) tokens: Counter,
    pub(crate) wait: Histogram,
    pub(crate) waiters: Gauge,
}

impl LimiterMetrics {
    /// Registers the handles of the limiter called `name` with the recorder in force.
    pub(crate) fn new(name: &str) -> LimiterMetrics {
        let [grants, refusals, tokens] = grant_counters(name);
        let name = name.to_owned();
        LimiterMetrics {
            grants,
            refusals,
            cancellations: counter!("paced_cancellations_total", LABEL => name.clone()),
            tokens,
            wait: histogram!("paced_wait_seconds", LABEL => name.clone()),
            waiters: gauge!("paced_waiters", LABEL => name),
        }
    }

    /// A request of `cost` granted after `waited` nanoseconds in the queue.
    #[inline]
    pub(crate) fn granted(&self, cost: u64, waited_nanos: u64) {
        self.grants.increment(1);
        self.tokens.increment(cost);
        #[allow(clippy::cast_precision_loss)]
        self.wait.record(waited_nanos as f64 / 1e9);
    }
}

/// The handles of an [`Adaptive`](crate::Adaptive)'s controller.
#[derive(Debug)]
pub(crate) struct AdaptiveMetrics {
    pub(crate) rate: Gauge,
    pub(crate) decreases: Counter,
}

impl AdaptiveMetrics {
    pub(crate) fn new(name: &str) -> AdaptiveMetrics {
        AdaptiveMetrics::labelled(&[Label::new(LABEL, name.to_owned())])
    }

    /// The handles of one adapted limit of an `Adaptive<[u64; N]>`: also labelled `limit = index`.
    pub(crate) fn for_limit(name: &str, index: usize) -> AdaptiveMetrics {
        AdaptiveMetrics::labelled(&[
            Label::new(LABEL, name.to_owned()),
            Label::new(LIMIT_LABEL, index.to_string()),
        ])
    }

    fn labelled(labels: &[Label]) -> AdaptiveMetrics {
        AdaptiveMetrics {
            rate: gauge!("paced_adaptive_rate", labels.iter()),
            decreases: counter!("paced_adaptive_decreases_total", labels.iter()),
        }
    }
}

/// The handles of a [`RedisRateLimiter`](crate::RedisRateLimiter).
#[cfg(feature = "redis")]
#[derive(Debug)]
pub(crate) struct RedisMetrics {
    pub(crate) grants: Counter,
    pub(crate) refusals: Counter,
    pub(crate) tokens: Counter,
    pub(crate) round_trips: Counter,
    pub(crate) outages: Counter,
    pub(crate) reply_errors: Counter,
    pub(crate) fallbacks: Counter,
}

#[cfg(feature = "redis")]
impl RedisMetrics {
    pub(crate) fn new(name: &str) -> RedisMetrics {
        let [grants, refusals, tokens] = grant_counters(name);
        let name = name.to_owned();
        RedisMetrics {
            grants,
            refusals,
            tokens,
            round_trips: counter!("paced_redis_round_trips_total", LABEL => name.clone()),
            outages: counter!("paced_redis_errors_total", LABEL => name.clone(), "kind" => "outage"),
            reply_errors: counter!("paced_redis_errors_total", LABEL => name.clone(), "kind" => "reply"),
            fallbacks: counter!("paced_redis_fallbacks_total", LABEL => name),
        }
    }
}
