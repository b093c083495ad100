//! One lane per key behind one mutex: the table under [`KeyedRateLimiter`], which forgets a
//! key as soon as its bucket is full again and nobody waits on it.
//!
//! A full bucket with an empty queue is indistinguishable from a key never seen, so forgetting
//! it is exact. Each idle lane is scheduled in a min-heap at the instant its bucket will be
//! full; every operation first forgets the lanes whose instant has passed (re-scheduling those
//! charged again meanwhile). So after any operation the lanes kept are exactly those not full
//! or with waiters, and memory follows the keys in use, not the keys ever seen.
//!
//! **No user code runs where a panic could leave the table inconsistent.** A key is hashed
//! (with the limiter's `BuildHasher`) before the lock is taken, and every entry keeps its hash,
//! so the table never calls `Hash` under the lock, not even to grow; the forget-heap finds its
//! lanes by hash and due time alone. The one call under the lock is the key's `Eq`, which runs
//! in a look-up before anything is changed. A key is turned into an owned `K` (`ToOwned`) only
//! when it gets state, also before anything is changed.
//!
//! [`KeyedRateLimiter`]: crate::KeyedRateLimiter

use std::borrow::Borrow;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::ops::Deref;
use std::task::Waker;
use std::time::Duration;

use hashbrown::HashTable;
use tokio::time::Instant;

use super::lane::{After, Lane, Step, Tally};
use super::waiter::Handle;
use crate::core::{Bucket, Nanos};
use crate::error::NotUntil;
use crate::rate::Rate;
use crate::stats::Stats;
use crate::sync::{lock, Mutex};
use crate::timer;

/// A rate and a burst: the limit of one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeyLimit {
    pub(crate) rate: Rate,
    pub(crate) burst: u64,
}

impl KeyLimit {
    fn bucket(self) -> Bucket {
        Bucket::new(self.rate.tokens(), self.rate.per().as_nanos(), self.burst)
    }
}

/// One key's lane, its hash and key, and when its entry in the forget-heap falls due.
struct KeyLane<K> {
    hash: u64,
    key: K,
    lane: Lane<Bucket>,
    due: Option<Nanos>,
}

/// A per-key limit: configuration, kept whether or not the key has state.
struct KeyConfig<K> {
    hash: u64,
    key: K,
    limit: KeyLimit,
}

/// What is to become of a lane after an operation.
enum Settled {
    Keep,
    /// Keep it, and forget it at this instant unless it is charged again.
    Schedule(Nanos),
    /// Full and idle: the same as a key never seen.
    Forget,
}

/// Settles a lane after an operation at `now` (`due`: its entry in the forget-heap).
fn settle(lane: &Lane<Bucket>, due: &mut Option<Nanos>, now: Nanos) -> Settled {
    if lane.waiting() > 0 {
        return Settled::Keep; // scheduled again when its queue empties
    }
    let full_at = lane.rule().full_at();
    if full_at <= now {
        return Settled::Forget;
    }
    if due.is_none_or(|due| full_at < due) {
        *due = Some(full_at);
        return Settled::Schedule(full_at);
    }
    Settled::Keep
}

/// How many due lanes a sweep forgets one by one before it turns to one pass over the table
/// (or an eighth of the table, if more).
const BULK_SWEEP_AFTER: usize = 4096;

/// An idle lane's bucket is full at `at`: forget it then, unless charged again. The lane is
/// found again by its hash and this due time, with no call to the key's `Hash` or `Eq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Due {
    at: Nanos,
    hash: u64,
}

/// Entries the key table and the forget-heap keep room for when they shrink.
const KEEP_CAPACITY: usize = 64;

/// A limit to set, with how to own the key if it has no limit yet; or `None`, to clear it.
type LimitChange<Q, K> = Option<(KeyLimit, fn(&Q) -> K)>;

/// What the mutex guards.
struct KeyedState<K> {
    default: KeyLimit,
    /// A full bucket of the default limit, copied for every new key.
    default_bucket: Bucket,
    limits: HashTable<KeyConfig<K>>,
    lanes: HashTable<KeyLane<K>>,
    forget: BinaryHeap<Reverse<Due>>,
    tally: Tally,
}

/// The state shared by every handle of one keyed limiter.
pub(crate) struct KeyedShared<K, S> {
    origin: Instant,
    hasher: S,
    state: Mutex<KeyedState<K>>,
    /// The handles a named limiter records to: set once, under the lock, for every clone.
    #[cfg(feature = "metrics")]
    metrics: std::sync::OnceLock<crate::instrument::LimiterMetrics>,
}

impl<K> KeyedState<K> {
    fn limit<Q>(&self, hash: u64, key: &Q) -> KeyLimit
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.limits
            .find(hash, |c| c.hash == hash && c.key.borrow() == key)
            .map_or(self.default, |c| c.limit)
    }

    /// Forgets the idle lanes that are full by `now`; re-schedules those charged again since.
    fn sweep(&mut self, now: Nanos) {
        let mut forgot = false;
        // One by one, each is a heap pop and a table look-up at a random place; when a large
        // share of the table is due (a million keys touched once, then idle), one pass over
        // the table is much cheaper.
        let mut budget = BULK_SWEEP_AFTER.max(self.lanes.len() / 8);
        while let Some(&Reverse(due)) = self.forget.peek() {
            if due.at > now {
                break;
            }
            if budget == 0 {
                self.sweep_all(now);
                return;
            }
            budget -= 1;
            self.forget.pop();
            // A lane with this hash still scheduled at this time; none if the entry is stale
            // (the lane was re-scheduled, or forgotten and re-created).
            let Ok(mut entry) = self.lanes.find_entry(due.hash, |e| e.due == Some(due.at)) else {
                continue;
            };
            let lane = entry.get_mut();
            lane.due = None;
            match settle(&lane.lane, &mut lane.due, now) {
                Settled::Keep => {}
                Settled::Schedule(at) => self.forget.push(Reverse(Due { at, hash: due.hash })),
                Settled::Forget => {
                    entry.remove();
                    forgot = true;
                }
            }
        }
        if forgot {
            self.shrink();
        }
    }

    /// Forgets every idle lane that is full by `now` in one pass over the table, and
    /// schedules the idle lanes kept afresh (a lane with waiters is scheduled when its queue
    /// empties, as ever).
    fn sweep_all(&mut self, now: Nanos) {
        self.lanes
            .retain(|e| e.lane.waiting() > 0 || e.lane.rule().full_at() > now);
        let mut dues = Vec::with_capacity(self.lanes.len());
        for entry in self.lanes.iter_mut() {
            entry.due = None;
            if entry.lane.waiting() == 0 {
                let at = entry.lane.rule().full_at();
                entry.due = Some(at);
                dues.push(Reverse(Due {
                    at,
                    hash: entry.hash,
                }));
            }
        }
        self.forget = BinaryHeap::from(dues);
        self.shrink();
    }

    /// Gives memory back after many lanes were forgotten at once.
    fn shrink(&mut self) {
        // Never below `KEEP_CAPACITY`, or keys that come and go one at a time would free and
        // reallocate both tables on every operation.
        if self.lanes.len() < self.lanes.capacity() / 4 {
            self.lanes
                .shrink_to((self.lanes.len() * 2).max(KEEP_CAPACITY), |e| e.hash);
        }
        if self.forget.len() < self.forget.capacity() / 4 {
            self.forget
                .shrink_to((self.forget.len() * 2).max(KEEP_CAPACITY));
        }
    }

    /// Runs `f` on the lane of `key` (hashed to `hash`; a full lane if the key has none) and
    /// the counters, then settles the lane. The hot path: one look-up for a key that is there;
    /// a new lane that `f` leaves full and idle is never stored, and its key never owned.
    fn on_lane<Q, T>(
        &mut self,
        hash: u64,
        key: &Q,
        now: Nanos,
        f: impl FnOnce(&mut Lane<Bucket>, &mut Tally) -> T,
    ) -> T
    where
        K: Borrow<Q>,
        Q: Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self
            .lanes
            .find_entry(hash, |e| e.hash == hash && e.key.borrow() == key)
        {
            Ok(mut entry) => {
                let lane = entry.get_mut();
                let out = f(&mut lane.lane, &mut self.tally);
                match settle(&lane.lane, &mut lane.due, now) {
                    Settled::Keep => {}
                    Settled::Schedule(at) => self.forget.push(Reverse(Due { at, hash })),
                    Settled::Forget => {
                        entry.remove();
                    }
                }
                out
            }
            Err(_) => {
                let config = self
                    .limits
                    .find(hash, |c| c.hash == hash && c.key.borrow() == key);
                let mut lane = Lane::new(match config {
                    Some(config) => config.limit.bucket(),
                    None => self.default_bucket.clone(),
                });
                // The last user code (`Clone`), before anything changes.
                let key = key.to_owned();
                let out = f(&mut lane, &mut self.tally);
                let mut due = None;
                let settled = settle(&lane, &mut due, now);
                if !matches!(settled, Settled::Forget) {
                    let entry = KeyLane {
                        hash,
                        key,
                        lane,
                        due,
                    };
                    if let Settled::Schedule(at) = settled {
                        self.forget.push(Reverse(Due { at, hash }));
                    }
                    self.lanes.insert_unique(hash, entry, |e| e.hash);
                }
                out
            }
        }
    }

    /// Sets (`Some`, with the owned key to store if the key has no limit yet) or clears
    /// (`None`) the limit of `key`, and applies it to the key's lane, if it has one, keeping
    /// the level. Returns whether anything changed, and the head's waker so that it re-reads
    /// its deadline. The key's `Eq` and `Clone` run before anything changes.
    fn set_limit<Q>(
        &mut self,
        hash: u64,
        key: &Q,
        limit: LimitChange<Q, K>,
        now: Nanos,
    ) -> Option<Option<Waker>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let config = self
            .limits
            .find_entry(hash, |c| c.hash == hash && c.key.borrow() == key);
        let lane = self
            .lanes
            .find_entry(hash, |e| e.hash == hash && e.key.borrow() == key);
        let new_key = match (&config, limit) {
            (Err(_), Some((_, to_owned))) => Some(to_owned(key)),
            _ => None,
        };
        let limit = limit.map(|(limit, _)| limit);
        // No user code from here on.
        match (config, limit, new_key) {
            (Ok(mut config), Some(limit), _) => config.get_mut().limit = limit,
            (Ok(config), None, _) => {
                config.remove();
            }
            (Err(absent), Some(limit), Some(key)) => {
                let config = KeyConfig { hash, key, limit };
                absent.into_table().insert_unique(hash, config, |c| c.hash);
            }
            (Err(_), _, _) => return None,
        }
        let Ok(mut entry) = lane else {
            return Some(None);
        };
        let limit = limit.unwrap_or(self.default);
        let lane = entry.get_mut();
        let bucket = lane.lane.rule_mut();
        bucket.set_rate(now, limit.rate.tokens(), limit.rate.per().as_nanos());
        bucket.set_burst(now, limit.burst);
        let head = lane.lane.head_waker();
        match settle(&lane.lane, &mut lane.due, now) {
            Settled::Keep => {}
            Settled::Schedule(at) => self.forget.push(Reverse(Due { at, hash })),
            Settled::Forget => {
                entry.remove();
            }
        }
        Some(head)
    }
}

impl<K, S: BuildHasher> KeyedShared<K, S> {
    pub(crate) fn new(default: KeyLimit, hasher: S) -> KeyedShared<K, S> {
        KeyedShared {
            origin: Instant::now(),
            hasher,
            state: Mutex::new(KeyedState {
                default,
                default_bucket: default.bucket(),
                limits: HashTable::new(),
                lanes: HashTable::new(),
                forget: BinaryHeap::new(),
                tally: Tally::default(),
            }),
            #[cfg(feature = "metrics")]
            metrics: std::sync::OnceLock::new(),
        }
    }

    /// The hash of `key`, computed before any lock is taken.
    pub(crate) fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    fn now(&self) -> Nanos {
        timer::since(self.origin, Instant::now())
    }

    /// Locks, reads the clock, forgets what is due, then runs `f` on the state at `now`.
    fn with<T>(&self, f: impl FnOnce(&mut KeyedState<K>, Nanos, &mut After) -> T) -> T {
        let mut st = lock(&self.state);
        let now = self.now();
        st.sweep(now);
        let mut after = After::default();
        let out = f(&mut st, now, &mut after);
        #[cfg(feature = "metrics")]
        let metrics = self.metrics.get();
        drop(st);
        #[cfg(feature = "metrics")]
        after.record(metrics);
        after.run();
        out
    }

    /// Grants `cost` of the key (hashed to `hash`) now, if nobody waits for it.
    pub(crate) fn try_acquire<Q>(&self, hash: u64, key: &Q, cost: u64) -> Result<(), NotUntil>
    where
        K: Borrow<Q>,
        Q: Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.with(|st, now, after| {
            st.on_lane(hash, key, now, |lane, tally| {
                lane.try_acquire(tally, now, cost, after)
            })
        })
    }

    /// See [`Handle::poll`], for the lane of `key`, hashed to `hash`.
    pub(crate) fn poll<Q>(
        &self,
        hash: u64,
        key: &Q,
        ticket: &mut Option<u64>,
        cost: u64,
        waker: &Waker,
        timeout: Option<Duration>,
    ) -> Result<Step, NotUntil>
    where
        K: Borrow<Q>,
        Q: Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.with(|st, now, after| {
            let limit = timeout.map(|t| now.saturating_add(Nanos::from_duration(t)));
            // A lane with a waiter is never forgotten, so a ticket's lane is there; were it not,
            // the lane would not know the ticket and take the request as a new arrival.
            st.on_lane(hash, key, now, |lane, tally| {
                lane.poll(tally, now, ticket, cost, waker, limit, after)
            })
        })
    }

    /// See [`Handle::cancel`], for the lane of `key`, hashed to `hash`.
    pub(crate) fn cancel<Q>(&self, hash: u64, key: &Q, ticket: u64)
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.with(|st, now, after| {
            let Ok(mut entry) = st
                .lanes
                .find_entry(hash, |e| e.hash == hash && e.key.borrow() == key)
            else {
                return;
            };
            let lane = entry.get_mut();
            lane.lane.cancel(now, ticket, after);
            match settle(&lane.lane, &mut lane.due, now) {
                Settled::Keep => {}
                Settled::Schedule(at) => st.forget.push(Reverse(Due { at, hash })),
                Settled::Forget => {
                    entry.remove();
                }
            }
        });
    }

    /// Sets (`Some`) or clears (`None`) the limit of `key`, applying it to the key's lane at
    /// once.
    pub(crate) fn set_limit<Q>(&self, key: &Q, limit: KeyLimit)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.change_limit(key, Some((limit, Q::to_owned)));
    }

    /// Gives `key` the default limit again.
    pub(crate) fn clear_limit<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.change_limit(key, None);
    }

    fn change_limit<Q>(&self, key: &Q, limit: LimitChange<Q, K>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hash(key);
        self.with(|st, now, after| {
            if let Some(head) = st.set_limit(hash, key, limit, now) {
                // The key's head waiter (a task, or a stream's front) re-reads its deadline.
                after.wake = head;
            }
        });
    }

    /// The whole tokens of `key` that could be taken now, ignoring its waiters.
    pub(crate) fn available<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hash(key);
        self.with(|st, now, _| {
            match st
                .lanes
                .find(hash, |e| e.hash == hash && e.key.borrow() == key)
            {
                Some(entry) => entry.lane.rule().available(now),
                None => st.limit(hash, key).burst,
            }
        })
    }

    /// The bucket of `key` (hashed to `hash`) as quota headers describe it now: a full bucket
    /// of its limit if it has no state.
    #[cfg(feature = "http")]
    pub(crate) fn quota_state<Q>(&self, hash: u64, key: &Q) -> crate::stats::QuotaState
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.with(|st, now, _| {
            let limit = st.limit(hash, key);
            match st
                .lanes
                .find(hash, |e| e.hash == hash && e.key.borrow() == key)
            {
                Some(entry) => crate::stats::QuotaState::of(entry.lane.rule(), limit.rate, now),
                None => crate::stats::QuotaState::of(&limit.bucket(), limit.rate, now),
            }
        })
    }

    /// How many keys hold state now.
    pub(crate) fn tracked_keys(&self) -> usize {
        self.with(|st, _, _| st.lanes.len())
    }

    /// Records to the metrics of the limiter called `name` from now on, on every handle;
    /// returns `false` (and changes nothing) if the limiter already has a name.
    #[cfg(feature = "metrics")]
    pub(crate) fn set_metrics(&self, name: &str) -> bool {
        if self.metrics.get().is_some() {
            return false;
        }
        // Registered before the lock: the recorder is the application's code.
        let metrics = crate::instrument::LimiterMetrics::new(name);
        let st = lock(&self.state);
        let waiting: usize = st.lanes.iter().map(|e| e.lane.waiting()).sum();
        #[allow(clippy::cast_precision_loss)]
        metrics.waiters.set(waiting as f64);
        let set = self.metrics.set(metrics).is_ok();
        drop(st);
        set
    }

    pub(crate) fn stats(&self) -> Stats {
        self.with(|st, _, _| {
            let waiting = st.lanes.iter().map(|e| e.lane.waiting()).sum();
            st.tally.stats(waiting)
        })
    }
}

/// A way into one key's queue: the limiter's state and the key (each borrowed or owned, the
/// key borrowed as `R`), and the key's hash, computed once when the request is made.
pub(crate) struct KeyHandle<P, Q, R: ?Sized> {
    shared: P,
    key: Q,
    hash: u64,
    form: PhantomData<fn(&R)>,
}

impl<K, S: BuildHasher, P: Deref<Target = KeyedShared<K, S>>, Q: Borrow<R>, R: Hash + ?Sized>
    KeyHandle<P, Q, R>
{
    /// A handle for `key`, hashed now, outside any lock.
    pub(crate) fn new(shared: P, key: Q) -> Self {
        let hash = shared.hash(key.borrow());
        KeyHandle::hashed(shared, key, hash)
    }

    /// A handle for `key`, already hashed to `hash` with the limiter's hasher.
    pub(crate) fn hashed(shared: P, key: Q, hash: u64) -> Self {
        KeyHandle {
            shared,
            key,
            hash,
            form: PhantomData,
        }
    }
}

/// Borrowed, for a future of the limiter's own.
pub(crate) type KeyRef<'a, K, Q, S> = KeyHandle<&'a KeyedShared<K, S>, &'a Q, Q>;

/// Owned, for a request that outlives any borrow (a stream's, a tower response future's).
pub(crate) type KeyOwned<K, S> = KeyHandle<std::sync::Arc<KeyedShared<K, S>>, K, K>;

impl<K, S, P, Q, R> KeyHandle<P, Q, R>
where
    P: Deref<Target = KeyedShared<K, S>>,
    S: BuildHasher,
    Q: Borrow<R>,
    K: Borrow<R>,
    R: Eq + ToOwned<Owned = K> + ?Sized,
{
    /// Grants `cost` of this key now, if nobody waits for it.
    #[cfg(feature = "tower")]
    pub(crate) fn try_acquire(&self, cost: u64) -> Result<(), NotUntil> {
        self.shared.try_acquire(self.hash, self.key.borrow(), cost)
    }

    /// This key's bucket as quota headers describe it now.
    #[cfg(feature = "http")]
    pub(crate) fn quota_state(&self) -> crate::stats::QuotaState {
        self.shared.quota_state(self.hash, self.key.borrow())
    }
}

impl<K, S, P, Q, R> Handle for KeyHandle<P, Q, R>
where
    P: Deref<Target = KeyedShared<K, S>>,
    S: BuildHasher,
    Q: Borrow<R>,
    K: Borrow<R>,
    R: Eq + ToOwned<Owned = K> + ?Sized,
{
    fn origin(&self) -> Instant {
        self.shared.origin
    }
    fn poll(
        &self,
        ticket: &mut Option<u64>,
        cost: u64,
        waker: &Waker,
        timeout: Option<Duration>,
    ) -> Result<Step, NotUntil> {
        self.shared
            .poll(self.hash, self.key.borrow(), ticket, cost, waker, timeout)
    }
    fn cancel(&self, ticket: u64) {
        self.shared.cancel(self.hash, self.key.borrow(), ticket);
    }
}
