//! `KeyedRateLimiter`: one token bucket per key (one [`Lane`] per key), behind one mutex, that
//! forgets a key as soon as its bucket is full again and nobody waits on it.
//!
//! A full bucket with an empty queue is indistinguishable from a key never seen, so forgetting
//! it is exact. Each idle lane is scheduled in a min-heap at the instant its bucket will be
//! full; every operation first forgets the lanes whose instant has passed (re-scheduling those
//! charged again meanwhile). So after any operation the lanes kept are exactly those not full
//! or with waiters, and memory follows the keys in use, not the keys ever seen.

use std::borrow::Borrow;
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::future::poll_fn;
use std::hash::Hash;
use std::pin::pin;
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use tokio::time::Instant;

use super::lane::{After, Lane, Step, Tally};
use super::single::unlock_then;
use super::{Handle, NotUntil, Stats, Waiter};
use crate::core::{Bucket, Nanos};
use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering as AtomicOrdering};
use crate::{timer, ConfigError, Rate};

/// A rate and a burst: the limit of one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KeyLimit {
    rate: Rate,
    burst: u64,
}

impl KeyLimit {
    fn bucket(self) -> Bucket {
        Bucket::new(self.rate.tokens(), self.rate.per().as_nanos(), self.burst)
    }
}

/// One key's lane, and when its entry in the forget-heap falls due.
struct KeyLane {
    lane: Lane<Bucket>,
    due: Option<Nanos>,
}

/// What is to become of a lane after an operation.
enum Settled {
    Keep,
    /// Keep it, and forget it at this instant unless it is charged again.
    Schedule(Nanos),
    /// Full and idle: the same as a key never seen.
    Forget,
}

impl KeyLane {
    fn settle(&mut self, now: Nanos) -> Settled {
        if self.lane.waiting() > 0 {
            return Settled::Keep; // scheduled again when its queue empties
        }
        let full_at = self.lane.rule.full_at();
        if full_at <= now {
            return Settled::Forget;
        }
        if self.due.is_none_or(|due| full_at < due) {
            self.due = Some(full_at);
            return Settled::Schedule(full_at);
        }
        Settled::Keep
    }
}

/// How many due lanes a sweep forgets one by one before it turns to one pass over the table
/// (or an eighth of the table, if more).
const BULK_SWEEP_AFTER: usize = 4096;

/// An idle lane's bucket is full at `at`: forget it then, unless charged again.
struct Due<K> {
    at: Nanos,
    key: K,
}

impl<K> PartialEq for Due<K> {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}
impl<K> Eq for Due<K> {}
impl<K> PartialOrd for Due<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<K> Ord for Due<K> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at.cmp(&other.at)
    }
}

/// Entries the key table and the forget-heap keep room for when they shrink.
const KEEP_CAPACITY: usize = 64;

/// What the mutex guards.
struct KeyedState<K> {
    default: KeyLimit,
    /// A full bucket of the default limit, copied for every new key: building one reduces the
    /// rate by a gcd in 128 bits, too dear to repeat each time a key comes back.
    default_bucket: Bucket,
    /// Per-key limits: configuration, kept whether or not the key has state.
    limits: HashMap<K, KeyLimit>,
    lanes: HashMap<K, KeyLane>,
    forget: BinaryHeap<Reverse<Due<K>>>,
    tally: Tally,
    /// Bumped by every change of a limit, so that a stream holding items knows to re-ask.
    epoch: u64,
}

/// The state shared by every handle of one keyed limiter.
pub(crate) struct KeyedShared<K> {
    origin: Instant,
    state: Mutex<KeyedState<K>>,
    /// `KeyedState::epoch`, published after each change of a limit, so that a stream holding
    /// items can tell whether to re-ask without taking the lock on every poll.
    epoch: AtomicU64,
}

impl<K: Hash + Eq + Clone> KeyedState<K> {
    fn limit(&self, key: &K) -> KeyLimit {
        self.limits.get(key).copied().unwrap_or(self.default)
    }

    /// Forgets the idle lanes that are full by `now`; re-schedules those charged again since.
    fn sweep(&mut self, now: Nanos) {
        let mut forgot = false;
        // One by one, each is a heap pop and a table look-up at a random place; when a large
        // share of the table is due (a million keys touched once, then idle), one pass over
        // the table is much cheaper.
        let mut budget = BULK_SWEEP_AFTER.max(self.lanes.len() / 8);
        while let Some(Reverse(due)) = self.forget.peek() {
            if due.at > now {
                break;
            }
            if budget == 0 {
                self.sweep_all(now);
                return;
            }
            budget -= 1;
            let Some(Reverse(due)) = self.forget.pop() else {
                break;
            };
            let Some(entry) = self.lanes.get_mut(&due.key) else {
                continue;
            };
            if entry.due != Some(due.at) {
                continue; // a stale entry: the lane was re-scheduled or re-created
            }
            entry.due = None;
            forgot |= self.settle(&due.key, now);
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
            .retain(|_, entry| entry.lane.waiting() > 0 || entry.lane.rule.full_at() > now);
        let mut dues = Vec::with_capacity(self.lanes.len());
        for (key, entry) in &mut self.lanes {
            entry.due = None;
            if entry.lane.waiting() == 0 {
                let at = entry.lane.rule.full_at();
                entry.due = Some(at);
                dues.push(Reverse(Due {
                    at,
                    key: key.clone(),
                }));
            }
        }
        self.forget = BinaryHeap::from(dues);
        self.shrink();
    }

    /// After an operation on `key`'s lane at `now`: forgets it if it is full and idle, else
    /// makes sure an idle lane is scheduled no later than when it is full. Returns whether the
    /// lane was forgotten.
    fn settle(&mut self, key: &K, now: Nanos) -> bool {
        let Some(entry) = self.lanes.get_mut(key) else {
            return false;
        };
        match entry.settle(now) {
            Settled::Keep => false,
            Settled::Schedule(at) => {
                self.schedule(at, key);
                false
            }
            Settled::Forget => {
                self.lanes.remove(key);
                true
            }
        }
    }

    fn schedule(&mut self, at: Nanos, key: &K) {
        self.forget.push(Reverse(Due {
            at,
            key: key.clone(),
        }));
    }

    /// Gives memory back after many lanes were forgotten at once.
    fn shrink(&mut self) {
        // Never below `KEEP_CAPACITY`, or keys that come and go one at a time would free and
        // reallocate both tables on every operation.
        if self.lanes.len() < self.lanes.capacity() / 4 {
            self.lanes
                .shrink_to((self.lanes.len() * 2).max(KEEP_CAPACITY));
        }
        if self.forget.len() < self.forget.capacity() / 4 {
            self.forget
                .shrink_to((self.forget.len() * 2).max(KEEP_CAPACITY));
        }
    }

    /// Runs `f` on `key`'s lane (a full one if the key has none) and the counters, then settles
    /// the lane. The hot path: one hash look-up for a key that is there, and the key is cloned
    /// only to be stored or scheduled; a new lane that `f` leaves full and idle is never stored.
    fn on_lane<T>(
        &mut self,
        key: &K,
        now: Nanos,
        f: impl FnOnce(&mut Lane<Bucket>, &mut Tally) -> T,
    ) -> T {
        if let Some(entry) = self.lanes.get_mut(key) {
            let out = f(&mut entry.lane, &mut self.tally);
            match entry.settle(now) {
                Settled::Keep => {}
                Settled::Schedule(at) => self.schedule(at, key),
                Settled::Forget => {
                    self.lanes.remove(key);
                }
            }
            return out;
        }
        let mut entry = KeyLane {
            lane: Lane::new(match self.limits.get(key) {
                Some(limit) => limit.bucket(),
                None => self.default_bucket.clone(),
            }),
            due: None,
        };
        let out = f(&mut entry.lane, &mut self.tally);
        match entry.settle(now) {
            Settled::Forget => {}
            Settled::Keep => {
                self.lanes.insert(key.clone(), entry);
            }
            Settled::Schedule(at) => {
                self.schedule(at, key);
                self.lanes.insert(key.clone(), entry);
            }
        }
        out
    }

    /// Applies `key`'s limit to its lane, if it has one, keeping the level; returns the head's
    /// waker so that it re-reads its deadline.
    fn apply_limit(&mut self, key: &K, now: Nanos) -> Option<Waker> {
        let limit = self.limit(key);
        self.epoch += 1;
        let entry = self.lanes.get_mut(key)?;
        let bucket = &mut entry.lane.rule;
        bucket.set_rate(now, limit.rate.tokens(), limit.rate.per().as_nanos());
        bucket.set_burst(now, limit.burst);
        let head = entry.lane.head_waker();
        self.settle(key, now);
        head
    }
}

impl<K: Hash + Eq + Clone> KeyedShared<K> {
    fn now(&self) -> Nanos {
        timer::since(self.origin, Instant::now())
    }

    fn lock(&self) -> MutexGuard<'_, KeyedState<K>> {
        // Consistent between any two statements that could panic (a key's `Hash` or `Eq`
        // may): a panic there does not make the limiter unusable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Locks, reads the clock, forgets what is due, then runs `f` on the state at `now`.
    fn with<T>(&self, f: impl FnOnce(&mut KeyedState<K>, Nanos, &mut After) -> T) -> T {
        let mut st = self.lock();
        let now = self.now();
        st.sweep(now);
        let mut after = After::default();
        let out = f(&mut st, now, &mut after);
        unlock_then(st, after);
        out
    }

    pub(crate) fn origin(&self) -> Instant {
        self.origin
    }

    pub(crate) fn try_acquire(&self, key: &K, cost: u64) -> Result<(), NotUntil> {
        self.with(|st, now, after| {
            st.on_lane(key, now, |lane, tally| {
                lane.try_acquire(tally, now, cost, after)
            })
        })
    }

    /// See [`Handle::poll`], for `key`'s lane.
    pub(crate) fn poll(
        &self,
        key: &K,
        ticket: &mut Option<u64>,
        cost: u64,
        waker: &Waker,
        timeout: Option<Duration>,
    ) -> Result<Step, NotUntil> {
        self.with(|st, now, after| {
            let limit = timeout.map(|t| now.saturating_add(Nanos::from_duration(t)));
            // A lane with a waiter is never forgotten, so a ticket's lane is there; were it not,
            // the lane would not know the ticket and take the request as a new arrival.
            st.on_lane(key, now, |lane, tally| {
                lane.poll(tally, now, ticket, cost, waker, limit, after)
            })
        })
    }

    /// See [`Handle::cancel`], for `key`'s lane.
    pub(crate) fn cancel(&self, key: &K, ticket: u64) {
        self.with(|st, now, after| {
            if let Some(entry) = st.lanes.get_mut(key) {
                entry.lane.cancel(now, ticket, after);
                st.settle(key, now);
            }
        });
    }

    /// The number the limits are at: it changes with every `set_limit` and `clear_limit`.
    pub(crate) fn epoch(&self) -> u64 {
        // Published before the lock is released, and before the head waiter is woken.
        self.epoch.load(AtomicOrdering::Acquire)
    }
}

/// A way into one key's queue: the limiter's state and the key, each borrowed or owned.
pub(crate) struct KeyHandle<S, Q> {
    pub(crate) shared: S,
    pub(crate) key: Q,
}

/// Borrowed, for a future of the limiter's own.
pub(crate) type KeyRef<'a, K> = KeyHandle<&'a KeyedShared<K>, &'a K>;

/// Owned, for a request that outlives any borrow (a tower response future).
#[cfg(feature = "tower")]
pub(crate) type KeyOwned<K> = KeyHandle<Arc<KeyedShared<K>>, K>;

impl<K, S, Q> Handle for KeyHandle<S, Q>
where
    K: Hash + Eq + Clone,
    S: std::ops::Deref<Target = KeyedShared<K>>,
    Q: Borrow<K>,
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
            .poll(self.key.borrow(), ticket, cost, waker, timeout)
    }
    fn cancel(&self, ticket: u64) {
        self.shared.cancel(self.key.borrow(), ticket);
    }
}

/// One token bucket per key, shared by handle: a limit per destination (an SMS provider, a
/// tenant's API, a customer's endpoint), with the semantics of [`RateLimiter`] key by key.
///
/// Every key has its own bucket of `burst` tokens refilled at `rate` (the default limit given
/// to [`new`](KeyedRateLimiter::new), or one set for that key with
/// [`set_limit`](KeyedRateLimiter::set_limit)), the same exact GCRA as
/// [`throttle`](crate::PaceExt::throttle), and its own FIFO queue: waiters of one key are
/// served in arrival order and never wait for another key. A cost above the burst pays its
/// debt, a cost of 0 passes at once, and a waiter that is dropped has taken nothing.
///
/// **Memory follows the keys in use.** A key whose bucket is full again and that nobody waits
/// for is indistinguishable from a key never seen, so it is forgotten, without any call from
/// you: after any operation, [`tracked_keys`](KeyedRateLimiter::tracked_keys) counts only the
/// keys whose bucket is not full or that have waiters. (governor's keyed limiter keeps every
/// key until `retain_recent()` is called.) Per-key limits are configuration and are kept.
///
/// Cloning is cheap (an `Arc`); every clone is the same limiter. All keys share one short
/// mutex. Streams draw on it with [`throttle_by_key`](crate::PaceExt::throttle_by_key).
///
/// [`RateLimiter`]: crate::RateLimiter
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use pacer::{KeyedRateLimiter, Rate};
/// use tokio::time::Instant;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // Every provider: 2 messages per second, one at a time; "fast" allows 10 per second.
/// let providers = KeyedRateLimiter::new(Rate::per_second(2), 1);
/// providers.set_limit("fast", Rate::per_second(10), 1);
/// let start = Instant::now();
/// for _ in 0..3 {
///     providers.acquire(&"slow", 1).await;
/// }
/// assert_eq!(start.elapsed(), Duration::from_secs(1));
/// // "fast" has its own bucket: it never waited for "slow".
/// providers.acquire(&"fast", 1).await;
/// assert_eq!(start.elapsed(), Duration::from_secs(1));
/// # }
/// ```
pub struct KeyedRateLimiter<K> {
    pub(crate) shared: Arc<KeyedShared<K>>,
}

impl<K> Clone for KeyedRateLimiter<K> {
    fn clone(&self) -> Self {
        KeyedRateLimiter {
            shared: self.shared.clone(),
        }
    }
}

impl<K: Hash + Eq + Clone> KeyedRateLimiter<K> {
    /// A keyed limiter whose keys each have `burst` tokens refilled at `rate`, unless
    /// [`set_limit`](KeyedRateLimiter::set_limit) says otherwise for a key.
    ///
    /// # Panics
    ///
    /// Panics if `burst` is 0. Use [`KeyedRateLimiter::try_new`] for values from
    /// configuration.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{KeyedRateLimiter, Rate};
    ///
    /// let per_tenant = KeyedRateLimiter::<u32>::new(Rate::per_second(100), 10);
    /// assert_eq!(per_tenant.available(&7), 10);
    /// ```
    #[track_caller]
    #[must_use]
    pub fn new(rate: Rate, burst: u64) -> KeyedRateLimiter<K> {
        match KeyedRateLimiter::try_new(rate, burst) {
            Ok(limiter) => limiter,
            Err(e) => panic!("{e}"),
        }
    }

    /// A keyed limiter (see [`new`](KeyedRateLimiter::new)), or a [`ConfigError`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::ZeroBurst`] if `burst` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{ConfigError, KeyedRateLimiter, Rate};
    ///
    /// let err = KeyedRateLimiter::<String>::try_new(Rate::per_second(1), 0).err();
    /// assert_eq!(err, Some(ConfigError::ZeroBurst));
    /// ```
    pub fn try_new(rate: Rate, burst: u64) -> Result<KeyedRateLimiter<K>, ConfigError> {
        if burst == 0 {
            return Err(ConfigError::ZeroBurst);
        }
        Ok(KeyedRateLimiter {
            shared: Arc::new(KeyedShared {
                origin: Instant::now(),
                state: Mutex::new(KeyedState {
                    default: KeyLimit { rate, burst },
                    default_bucket: KeyLimit { rate, burst }.bucket(),
                    limits: HashMap::new(),
                    lanes: HashMap::new(),
                    forget: BinaryHeap::new(),
                    tally: Tally::default(),
                    epoch: 0,
                }),
                epoch: AtomicU64::new(0),
            }),
        })
    }

    /// Gives `key` its own limit: `burst` tokens refilled at `rate` (a provider that allows
    /// more, a tenant on a bigger plan). It takes effect at once, also for the key's waiters,
    /// keeping the level in tokens as [`RateLimiter::set_rate`](crate::RateLimiter::set_rate)
    /// does (what the bucket holds, or what a waiter lacks), capped at the new `burst`.
    ///
    /// # Panics
    ///
    /// Panics if `burst` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{KeyedRateLimiter, Rate};
    ///
    /// let providers = KeyedRateLimiter::new(Rate::per_second(1), 1);
    /// providers.set_limit("bulk", Rate::per_second(50), 5);
    /// assert_eq!(providers.available(&"bulk"), 5);
    /// assert_eq!(providers.available(&"other"), 1);
    /// ```
    #[track_caller]
    pub fn set_limit(&self, key: K, rate: Rate, burst: u64) {
        assert!(
            burst > 0,
            "KeyedRateLimiter::set_limit: `burst` is 0, so nothing could ever pass; it must be at least 1"
        );
        let epoch = &self.shared.epoch;
        self.shared.with(|st, now, after| {
            st.limits.insert(key.clone(), KeyLimit { rate, burst });
            after.wake = st.apply_limit(&key, now);
            epoch.store(st.epoch, AtomicOrdering::Release);
        });
    }

    /// Gives `key` the default limit again, from now on, keeping its level as
    /// [`set_limit`](KeyedRateLimiter::set_limit) does.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{KeyedRateLimiter, Rate};
    ///
    /// let providers = KeyedRateLimiter::new(Rate::per_second(1), 1);
    /// providers.set_limit("bulk", Rate::per_second(50), 5);
    /// providers.clear_limit(&"bulk");
    /// assert_eq!(providers.available(&"bulk"), 1);
    /// ```
    pub fn clear_limit<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let epoch = &self.shared.epoch;
        self.shared.with(|st, now, after| {
            if let Some((key, _)) = st.limits.remove_entry(key) {
                after.wake = st.apply_limit(&key, now);
                epoch.store(st.epoch, AtomicOrdering::Release);
            }
        });
    }

    /// Waits until `cost` tokens of `key` are granted, behind the key's earlier waiters only.
    ///
    /// As [`RateLimiter::acquire`](crate::RateLimiter::acquire), key by key: a cost above the
    /// key's burst pays its debt, a cost of 0 passes at once, and dropping the future gives its
    /// place to the next waiter of the key; it has taken nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{KeyedRateLimiter, Rate};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = KeyedRateLimiter::new(Rate::per_second(10), 1);
    /// let start = Instant::now();
    /// limiter.acquire(&"a", 1).await;
    /// limiter.acquire(&"a", 1).await;
    /// assert_eq!(start.elapsed().as_millis(), 100);
    /// # }
    /// ```
    pub async fn acquire(&self, key: &K, cost: u64) {
        let mut waiter = pin!(Waiter::new(KeyRef {
            shared: &self.shared,
            key,
        }));
        // Without a timeout a request is never refused.
        let _ = poll_fn(|cx| waiter.as_mut().poll_acquire(cx, cost, None)).await;
    }

    /// Takes `cost` tokens of `key` if they are there now and nobody waits for the key; never
    /// waits.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] with how long until the request could be granted (after the key's
    /// waiters); `Duration::MAX` for a cost above the key's burst. A refusal takes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use pacer::{KeyedRateLimiter, Rate};
    ///
    /// let limiter = KeyedRateLimiter::new(Rate::per_second(4), 1);
    /// assert!(limiter.try_acquire(&"a", 1).is_ok());
    /// let refused = limiter.try_acquire(&"a", 1).unwrap_err();
    /// assert!(refused.retry_after() <= Duration::from_millis(250));
    /// assert!(limiter.try_acquire(&"b", 1).is_ok()); // another key, another bucket
    /// ```
    pub fn try_acquire(&self, key: &K, cost: u64) -> Result<(), NotUntil> {
        self.shared.try_acquire(key, cost)
    }

    /// Waits for `cost` tokens of `key` only if they can be had within `timeout` (after the
    /// key's waiters); otherwise returns at once, taking nothing.
    ///
    /// # Errors
    ///
    /// [`NotUntil`] with how long the request would have waited.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use pacer::{KeyedRateLimiter, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = KeyedRateLimiter::new(Rate::per_second(1), 1);
    /// limiter.acquire(&1, 1).await;
    /// let refused = limiter.acquire_timeout(&1, 1, Duration::from_millis(500)).await;
    /// assert_eq!(refused.unwrap_err().retry_after(), Duration::from_secs(1));
    /// assert!(limiter.acquire_timeout(&1, 1, Duration::from_secs(1)).await.is_ok());
    /// # }
    /// ```
    pub async fn acquire_timeout(
        &self,
        key: &K,
        cost: u64,
        timeout: Duration,
    ) -> Result<(), NotUntil> {
        let mut waiter = pin!(Waiter::new(KeyRef {
            shared: &self.shared,
            key,
        }));
        poll_fn(|cx| waiter.as_mut().poll_acquire(cx, cost, Some(timeout))).await
    }

    /// The whole tokens of `key` that could be taken now, ignoring its waiters: its burst for a
    /// key with no state.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{KeyedRateLimiter, Rate};
    ///
    /// let limiter = KeyedRateLimiter::new(Rate::per_second(1), 3);
    /// limiter.try_acquire(&"a", 2).unwrap();
    /// assert_eq!(limiter.available(&"a"), 1);
    /// assert_eq!(limiter.available(&"b"), 3);
    /// ```
    #[must_use]
    pub fn available<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shared.with(|st, now, _| match st.lanes.get(key) {
            Some(entry) => entry.lane.rule.available(now),
            None => st.limits.get(key).copied().unwrap_or(st.default).burst,
        })
    }

    /// How many keys hold bucket state now: those whose bucket is not full, or that have
    /// waiters. Per-key limits are configuration and are not counted.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use pacer::{KeyedRateLimiter, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = KeyedRateLimiter::new(Rate::per_second(10), 1);
    /// for key in 0..1000 {
    ///     limiter.try_acquire(&key, 1).unwrap();
    /// }
    /// assert_eq!(limiter.tracked_keys(), 1000);
    /// tokio::time::sleep(Duration::from_millis(100)).await; // every bucket is full again
    /// assert_eq!(limiter.tracked_keys(), 0);
    /// # }
    /// ```
    #[must_use]
    pub fn tracked_keys(&self) -> usize {
        self.shared.with(|st, _, _| st.lanes.len())
    }

    /// A snapshot of the counters over all keys: granted, rejected, waiting now, total wait.
    ///
    /// # Examples
    ///
    /// ```
    /// use pacer::{KeyedRateLimiter, Rate};
    ///
    /// let limiter = KeyedRateLimiter::new(Rate::per_second(1), 1);
    /// limiter.try_acquire(&"a", 1).unwrap();
    /// limiter.try_acquire(&"a", 1).unwrap_err();
    /// limiter.try_acquire(&"b", 1).unwrap();
    /// let stats = limiter.stats();
    /// assert_eq!((stats.granted, stats.rejected, stats.waiting), (2, 1, 0));
    /// ```
    #[must_use]
    pub fn stats(&self) -> Stats {
        self.shared.with(|st, _, _| {
            let waiting = st.lanes.values().map(|e| e.lane.waiting()).sum();
            Stats::new(&st.tally, waiting)
        })
    }
}

impl<K> fmt::Debug for KeyedRateLimiter<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self
            .shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f.debug_struct("KeyedRateLimiter")
            .field("rate", &st.default.rate)
            .field("burst", &st.default.burst)
            .field("limits", &st.limits.len())
            .field("tracked_keys", &st.lanes.len())
            .finish()
    }
}
