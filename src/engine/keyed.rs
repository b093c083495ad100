//! The key table under [`KeyedRateLimiter`]: one word per key while nobody waits on it, a lane
//! (the engine's FIFO queue) only for a key that has waiters or a limit of its own, in shards
//! of their own mutex; a key is forgotten once its bucket is full again and nobody waits on it.
//!
//! **A word per key.** Most keys only ever take tokens that are there: for them the whole state
//! is the bucket's `tat` under the default limit, packed in one `u64` ([`Packed`], the
//! arithmetic the shared limiter's lock-free path uses). A slot of the table is the key and that
//! word: 16 bytes for a `u64` key. A key whose request must queue, whose limit is its own, or
//! whose state does not fit in 63 bits gets a [`Lane`] of the exact [`Bucket`] (in the shard's
//! `lanes`, the word then holding its index); it goes back to a word as soon as it is idle again
//! under the default limit.
//!
//! **Forgetting.** A full bucket with an empty queue is the same as a key never seen, so
//! forgetting it is exact, and a key is never forgotten before. Three sweeps, none with a
//! per-key cost in memory:
//! - every operation looks at one more slot of its shard (a clock hand) and forgets it if full;
//! - a shard remembers when the last of its idle keys is full again; the first operation after
//!   that instant forgets them all in one pass (a million keys touched once, then idle);
//! - before the table would grow, one pass forgets every key that is full, so the table grows
//!   only for keys in use. It shrinks once under an eighth full, to twice what it holds: a
//!   working set that stays within a factor of four of itself never moves the table.
//!
//! [`KeyedShared::tracked_keys`] sweeps everything first, so it counts exactly the keys in use.
//!
//! **User code under the lock.** A key is hashed (with the limiter's `BuildHasher`) before the
//! lock is taken and turned into an owned `K` (`ToOwned`) before anything is changed; the key's
//! `Eq` runs in look-ups, before anything is changed. The one call that can run in the middle of
//! a change is the key's `Hash`, when the table grows or shrinks: hashbrown keeps the table
//! whole if it panics there (a `Hash` that panics on a key it hashed fine before), though keys
//! being moved may then be forgotten early.
//!
//! [`KeyedRateLimiter`]: crate::KeyedRateLimiter

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::OnceLock;
use std::task::Waker;
use std::time::Duration;

use hashbrown::HashTable;
use tokio::time::Instant;

use super::lane::{After, Lane, Step, Tally};
use super::waiter::Handle;
use crate::core::{Amount, Bucket, Limits, Nanos, Pace, Packed};
use crate::error::NotUntil;
use crate::rate::Rate;
use crate::stats::Stats;
use crate::sync::{lock, Mutex, MutexGuard};
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

/// What a key's state is: the rule of its lane ([`Pace`]), made from the key's limit. A key
/// whose rule is as good as a fresh one of its limit, with nobody waiting, is forgotten.
pub(crate) trait KeyRule: Pace {
    /// A key's limit, as configured (the default one, or a key's own).
    type Limit: Clone;
    /// A fresh rule of `limit`: what a key never seen has.
    fn fresh(limit: &Self::Limit) -> Self;
    /// The first instant from which the rule answers every question as [`fresh`](Self::fresh)
    /// of its limit does (`Nanos::MAX`: never).
    fn as_new_at(&self) -> Nanos;
    /// Takes `limit` from `now` on, keeping the level.
    fn apply(&mut self, now: Nanos, limit: &Self::Limit);
    /// What could be taken at `now`, ignoring waiters.
    fn level(&self, now: Nanos) -> Self::Cost;
}

impl KeyRule for Bucket {
    type Limit = KeyLimit;
    fn fresh(limit: &KeyLimit) -> Bucket {
        limit.bucket()
    }
    fn as_new_at(&self) -> Nanos {
        self.full_at()
    }
    fn apply(&mut self, now: Nanos, limit: &KeyLimit) {
        self.set_rate(now, limit.rate.tokens(), limit.rate.per().as_nanos());
        self.set_burst(now, limit.burst);
    }
    fn level(&self, now: Nanos) -> u64 {
        self.available(now)
    }
}

/// Several limits per key: a key's limit is a fresh copy of its limits.
impl<const N: usize> KeyRule for Limits<N> {
    type Limit = Limits<N>;
    fn fresh(limit: &Limits<N>) -> Limits<N> {
        limit.clone()
    }
    fn as_new_at(&self) -> Nanos {
        Limits::as_new_at(self)
    }
    fn apply(&mut self, now: Nanos, limit: &Limits<N>) {
        Limits::apply(self, now, limit);
    }
    fn level(&self, now: Nanos) -> [u64; N] {
        self.available(now)
    }
}

/// A word with this bit set holds the index of the key's lane in [`Shard::lanes`]; one
/// without it, the `tat` of a bucket of the default limit ([`Packed`], offset 0).
const LANE: u64 = 1 << 63;

/// One key with state: the key and its word.
struct Slot<K> {
    key: K,
    word: u64,
}

/// A per-key limit: configuration, kept whether or not the key has state.
struct KeyConfig<K, L> {
    hash: u64,
    key: K,
    limit: L,
}

/// How to change a key's limit (from the one in force), with how to own the key if it has no
/// limit yet; or `None`, to clear it.
type LimitChange<Q, K, F> = Option<(F, fn(&Q) -> K)>;

/// The default limit, fixed when the limiter is made.
struct Defaults<R: KeyRule> {
    limit: R::Limit,
    /// A fresh rule of the default limit, copied for a key that needs a lane.
    bucket: R,
    /// The default rule's arithmetic on a word, if it is one bucket whose token fits in 64
    /// bits; `None`: every key with state has a lane.
    packed: Option<Packed>,
}

impl<R: KeyRule> Defaults<R> {
    fn new(limit: R::Limit) -> Defaults<R> {
        let bucket = R::fresh(&limit);
        Defaults {
            packed: bucket
                .plain_bucket(Nanos::ZERO)
                .and_then(|b| Packed::of(b, 0)),
            limit,
            bucket,
        }
    }

    /// The default bucket whose `tat` the word `word` holds.
    fn bucket_of(&self, packed: &Packed, word: u64) -> R {
        let mut bucket = self.bucket.clone();
        if let Some(b) = bucket.bucket_mut() {
            packed.restore(b, word);
        }
        bucket
    }

    /// What `lane` becomes after an operation at `now`: forgotten (as new, nobody waiting), a
    /// word (idle under the default limit, and it fits), or kept as it is.
    fn settle(&self, lane: &Lane<R>, now: Nanos) -> Settled {
        if lane.waiting() > 0 {
            return Settled::Lane;
        }
        let rule = lane.rule();
        if rule.as_new_at() <= now {
            return Settled::Forget;
        }
        match (self.packed, rule.plain_bucket(now)) {
            (Some(p), Some(bucket)) if Packed::of(bucket, 0) == Some(p) => {
                p.word(bucket, LANE).map_or(Settled::Lane, Settled::Word)
            }
            _ => Settled::Lane,
        }
    }
}

/// What becomes of a key's state after an operation.
enum Settled {
    Forget,
    Word(u64),
    Lane,
}

/// A shard's table never shrinks below room for this many keys, so that keys coming and going
/// one at a time do not free and reallocate it on every operation.
const KEEP_CAPACITY: usize = 64;

/// One shard of the table: the keys whose hash falls in it, and everything about them.
struct Shard<K, R: KeyRule> {
    slots: HashTable<Slot<K>>,
    /// The lanes of keys that have one (waiters, a limit of their own); `None`: free.
    lanes: Vec<Option<Lane<R>>>,
    free: Vec<usize>,
    limits: HashTable<KeyConfig<K, R::Limit>>,
    tally: Tally,
    /// The latest `now` an operation ran at: the clock is read before the lock, and a shard
    /// never goes back in time.
    last: Nanos,
    /// The clock hand's slot.
    hand: usize,
    /// The latest `tat` of any word written since the last whole sweep (time units), and the
    /// latest time an idle lane is full: once both have passed, every key not waited on is
    /// full. `None`: nothing written since.
    latest_word: Option<u64>,
    latest_lane: Option<Nanos>,
}

impl<K, R: KeyRule> Shard<K, R> {
    fn new() -> Shard<K, R> {
        Shard {
            slots: HashTable::new(),
            lanes: Vec::new(),
            free: Vec::new(),
            limits: HashTable::new(),
            tally: Tally::default(),
            last: Nanos::ZERO,
            hand: 0,
            latest_word: None,
            latest_lane: None,
        }
    }

    /// The clock hand: one slot per operation; forgets its key if it is full and idle.
    #[inline]
    fn tick(&mut self, now: Nanos, units: u64) {
        let buckets = self.slots.num_buckets();
        self.hand = self.hand.wrapping_add(1) & buckets.wrapping_sub(1);
        // Looked at in place; an entry is taken only for a key to forget.
        let Some(slot) = self.slots.get_bucket(self.hand) else {
            return;
        };
        let word = slot.word;
        if is_idle_full(&self.lanes, word, now, units) {
            self.forget_at_hand(word);
        }
    }

    #[inline(never)]
    fn forget_at_hand(&mut self, word: u64) {
        if let Ok(entry) = self.slots.get_bucket_entry(self.hand) {
            entry.remove();
        }
        if word & LANE != 0 {
            drop_lane(&mut self.lanes, &mut self.free, word);
        }
    }

    /// Whether every key not waited on is full by `now`, so that one pass forgets them all.
    fn all_due(&self, now: Nanos, units: u64) -> bool {
        // Keys in use (a word not due) answer at the first test.
        self.latest_word.is_none_or(|w| w <= units)
            && self.latest_lane.is_none_or(|at| at <= now)
            && (self.latest_word.is_some() || self.latest_lane.is_some())
    }

    /// Forgets every key full and idle at `now` in one pass, and gives memory back if the table
    /// is mostly empty. Returns how many keys it forgot.
    fn sweep<S: BuildHasher>(&mut self, hasher: &S, now: Nanos, units: u64) -> usize
    where
        K: Hash,
    {
        let before = self.slots.len();
        let (lanes, free) = (&mut self.lanes, &mut self.free);
        let (mut latest_word, mut latest_lane) = (None, None::<Nanos>);
        self.slots.retain(|slot| {
            let word = slot.word;
            if is_idle_full(lanes, word, now, units) {
                if word & LANE != 0 {
                    drop_lane(lanes, free, word);
                }
                return false;
            }
            if word & LANE == 0 {
                latest_word = Some(latest_word.map_or(word, |w: u64| w.max(word)));
            } else {
                let lane = lane_of(lanes, word);
                if lane.waiting() == 0 {
                    let at = lane.rule().as_new_at();
                    latest_lane = Some(latest_lane.map_or(at, |l| l.max(at)));
                }
            }
            true
        });
        self.latest_word = latest_word;
        self.latest_lane = latest_lane;
        let (len, capacity) = (self.slots.len(), self.slots.capacity());
        if capacity > KEEP_CAPACITY && len < capacity / 8 {
            self.slots
                .shrink_to((len * 2).max(KEEP_CAPACITY), |s| hasher.hash_one(&s.key));
        }
        if self.free.len() == self.lanes.len() && self.lanes.capacity() > KEEP_CAPACITY {
            self.lanes = Vec::new();
            self.free = Vec::new();
        }
        before - len
    }

    /// Stores a new key. If the table is full, forgets the full keys first, and makes room
    /// for a quarter of it more (in place if the keys kept fit in half of it).
    fn insert<S: BuildHasher>(
        &mut self,
        hasher: &S,
        hash: u64,
        slot: Slot<K>,
        now: Nanos,
        units: u64,
    ) where
        K: Hash,
    {
        if self.slots.len() == self.slots.capacity() {
            self.sweep(hasher, now, units);
            let (len, capacity) = (self.slots.len(), self.slots.capacity());
            if capacity - len < capacity / 4 + 1 {
                self.slots
                    .reserve(capacity / 4 + 1, |s| hasher.hash_one(&s.key));
            }
        }
        if slot.word & LANE == 0 {
            note(&mut self.latest_word, slot.word);
        }
        self.slots
            .insert_unique(hash, slot, |s| hasher.hash_one(&s.key));
    }
}

/// Stores `lane` and returns its word.
fn add_lane<R: KeyRule>(
    lanes: &mut Vec<Option<Lane<R>>>,
    free: &mut Vec<usize>,
    lane: Lane<R>,
) -> u64 {
    let i = match free.pop() {
        Some(i) => {
            lanes[i] = Some(lane);
            i
        }
        None => {
            lanes.push(Some(lane));
            lanes.len() - 1
        }
    };
    LANE | i as u64
}

/// The lane of a word with the lane bit.
fn lane_of<R: KeyRule>(lanes: &mut [Option<Lane<R>>], word: u64) -> &mut Lane<R> {
    #[allow(clippy::cast_possible_truncation)]
    let i = (word & !LANE) as usize;
    match lanes.get_mut(i) {
        Some(Some(lane)) => lane,
        // A word with the lane bit is only ever written with the index of a lane in use.
        _ => unreachable!("a key's lane is gone"),
    }
}

/// Frees the lane of a word with the lane bit.
fn drop_lane<R: KeyRule>(lanes: &mut [Option<Lane<R>>], free: &mut Vec<usize>, word: u64) {
    #[allow(clippy::cast_possible_truncation)]
    let i = (word & !LANE) as usize;
    if let Some(lane) = lanes.get_mut(i) {
        *lane = None;
        free.push(i);
    }
}

/// Whether the key of `word` is full at `now` (`units`: `now` in the default bucket's time
/// units, saturated) with nobody waiting.
fn is_idle_full<R: KeyRule>(lanes: &[Option<Lane<R>>], word: u64, now: Nanos, units: u64) -> bool {
    if word & LANE == 0 {
        return word <= units;
    }
    #[allow(clippy::cast_possible_truncation)]
    match lanes.get((word & !LANE) as usize) {
        Some(Some(lane)) => lane.waiting() == 0 && lane.rule().as_new_at() <= now,
        _ => false,
    }
}

/// What an operation does to one key: `fast` on the word of a key under the default limit
/// (`None`: it needs the key's lane), `slow` on the key's lane.
struct Op<F, L> {
    fast: F,
    slow: L,
}

impl<K, R: KeyRule> Shard<K, R> {
    /// Runs `op` on the state of `key` (hashed to `hash`; a full bucket if it has none) at
    /// `now`, then settles the state: the hot path is one look-up and `op.fast` on the word.
    /// A new key that the operation leaves full and idle is never stored, nor its key owned.
    #[allow(clippy::too_many_arguments)]
    fn on_key<Q, S, T, F, L>(
        &mut self,
        defaults: &Defaults<R>,
        hasher: &S,
        hash: u64,
        key: &Q,
        now: Nanos,
        units: u64,
        after: &mut After,
        op: Op<F, L>,
    ) -> T
    where
        K: Borrow<Q> + Hash,
        Q: Eq + ToOwned<Owned = K> + ?Sized,
        S: BuildHasher,
        F: FnOnce(&Packed, u64, &mut Tally, &mut After) -> Option<(u64, T)>,
        L: FnOnce(&mut Lane<R>, &mut Tally, &mut After) -> T,
    {
        let Shard {
            slots,
            lanes,
            free,
            tally,
            latest_word,
            latest_lane,
            ..
        } = self;
        // The hot path: a key with a word under the default limit, which `op.fast` settles.
        match slots.find_entry(hash, |s| s.key.borrow() == key) {
            Ok(mut entry) => {
                let word = entry.get().word;
                if word & LANE == 0 {
                    // A word: under the default limit, so `packed` is there.
                    let Some(packed) = &defaults.packed else {
                        unreachable!("a word without a packed default");
                    };
                    if let Some((w, out)) = (op.fast)(packed, word, tally, after) {
                        entry.get_mut().word = w;
                        note(latest_word, w);
                        return out;
                    }
                }
                let parts = Parts {
                    lanes,
                    free,
                    latest_word,
                    latest_lane,
                };
                on_stored(defaults, entry, parts, tally, now, after, op.slow)
            }
            Err(_) => self.on_new(defaults, hasher, hash, key, now, units, after, op),
        }
    }

    /// [`Shard::on_key`] for a key with no state: `op` on a full bucket (its own limit's, if it
    /// has one), stored only if the operation leaves it not full or waited on.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn on_new<Q, S, T, F, L>(
        &mut self,
        defaults: &Defaults<R>,
        hasher: &S,
        hash: u64,
        key: &Q,
        now: Nanos,
        units: u64,
        after: &mut After,
        op: Op<F, L>,
    ) -> T
    where
        K: Borrow<Q> + Hash,
        Q: Eq + ToOwned<Owned = K> + ?Sized,
        S: BuildHasher,
        F: FnOnce(&Packed, u64, &mut Tally, &mut After) -> Option<(u64, T)>,
        L: FnOnce(&mut Lane<R>, &mut Tally, &mut After) -> T,
    {
        let own = if self.limits.is_empty() {
            None
        } else {
            self.limits
                .find(hash, |c| c.hash == hash && c.key.borrow() == key)
                .map(|c| R::fresh(&c.limit))
        };
        if let (None, Some(packed)) = (&own, &defaults.packed) {
            if let Some((w, out)) = (op.fast)(packed, 0, &mut self.tally, after) {
                if w > units {
                    // The last user code (`Clone`), before anything changes.
                    let slot = Slot {
                        key: key.to_owned(),
                        word: w,
                    };
                    self.insert(hasher, hash, slot, now, units);
                }
                return out;
            }
        }
        let mut lane = Lane::new(own.unwrap_or_else(|| defaults.bucket.clone()));
        let key = key.to_owned();
        let out = (op.slow)(&mut lane, &mut self.tally, after);
        let word = match defaults.settle(&lane, now) {
            Settled::Forget => return out,
            Settled::Word(w) => w,
            Settled::Lane => {
                if lane.waiting() == 0 {
                    note(&mut self.latest_lane, lane.rule().as_new_at());
                }
                add_lane(&mut self.lanes, &mut self.free, lane)
            }
        };
        self.insert(hasher, hash, Slot { key, word }, now, units);
        out
    }
}

/// A shard, on cache lines of its own.
#[repr(align(128))]
struct Padded<T>(T);

/// A shard behind its mutex, on cache lines of its own.
type ShardLock<K, R> = Padded<Mutex<Shard<K, R>>>;

/// How many shards a keyed limiter has: four per core, a power of two, from 4 to 64.
fn shard_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        (cores * 4).next_power_of_two().clamp(4, 64)
    })
}

/// The state shared by every handle of one keyed limiter.
pub(crate) struct KeyedShared<K, S, R: KeyRule = Bucket> {
    origin: Instant,
    hasher: S,
    defaults: Defaults<R>,
    shards: Box<[ShardLock<K, R>]>,
    /// The handles a named limiter records to, for every clone: set with every shard locked,
    /// and replaced if it is named again.
    #[cfg(feature = "metrics")]
    metrics: crate::instrument::Named<crate::instrument::LimiterMetrics>,
}

impl<K, S: BuildHasher> KeyedShared<K, S> {
    pub(crate) fn new(default: KeyLimit, hasher: S) -> KeyedShared<K, S> {
        KeyedShared::with_origin(default, hasher, Instant::now())
    }
}

impl<K, S: BuildHasher, R: KeyRule> KeyedShared<K, S, R> {
    /// A table whose keys have the limit `default` unless told otherwise, its times counted
    /// from `origin`.
    pub(crate) fn with_origin(
        default: R::Limit,
        hasher: S,
        origin: Instant,
    ) -> KeyedShared<K, S, R> {
        KeyedShared {
            origin,
            hasher,
            defaults: Defaults::new(default),
            shards: (0..shard_count())
                .map(|_| Padded(Mutex::new(Shard::new())))
                .collect(),
            #[cfg(feature = "metrics")]
            metrics: crate::instrument::Named::default(),
        }
    }

    /// The limit of every key that has none of its own.
    pub(crate) fn default_limit(&self) -> &R::Limit {
        &self.defaults.limit
    }

    /// The instant the table's times count from.
    pub(crate) fn origin(&self) -> Instant {
        self.origin
    }

    /// The table's time now (a shard may be a little ahead: it never goes back).
    pub(crate) fn now(&self) -> Nanos {
        timer::since(self.origin, Instant::now())
    }

    /// The hash of `key`, computed before any lock is taken.
    pub(crate) fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of a key hashed to `hash`: the product's top bits mix in every bit of the
    /// hash (a weak hasher's low bits alone would crowd a few shards).
    fn shard_index(&self, hash: u64) -> usize {
        #[allow(clippy::cast_possible_truncation)]
        let i = (hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize;
        i & (self.shards.len() - 1)
    }

    /// `now` in the default bucket's time units, saturated (every word is then below it).
    fn units(&self, now: Nanos) -> u64 {
        self.defaults
            .packed
            .map_or(u64::MAX, |p| now.0.saturating_mul(p.scale))
    }

    /// Locks the shard of `hash` at `now` (never before the shard's latest), forgets what is
    /// due there, runs `f`, and does the deferred work once the lock is released.
    fn with<T>(&self, hash: u64, f: impl FnOnce(&mut Shard<K, R>, Nanos, u64, &mut After) -> T) -> T
    where
        K: Hash,
    {
        let read = timer::since(self.origin, Instant::now());
        let index = self.shard_index(hash);
        let mut shard = lock(&self.shards[index].0);
        let now = read.max(shard.last);
        shard.last = now;
        let units = self.units(now);
        // Many keys forgotten at once: an idle period has just ended.
        let mut idle_ended = false;
        if shard.all_due(now, units) {
            idle_ended = shard.sweep(&self.hasher, now, units) >= KEEP_CAPACITY;
        } else {
            shard.tick(now, units);
        }
        let mut after = After::default();
        let out = f(&mut shard, now, units, &mut after);
        after.unlock_then_run(
            shard,
            #[cfg(feature = "metrics")]
            &self.metrics,
        );
        if idle_ended {
            self.sweep_others(index, now);
        }
        out
    }

    /// After a shard forgot many keys at once, all due: the other shards were most likely idle
    /// as long, and nothing else would look at a shard that no key of the traffic falls in.
    /// Sweeps each that is free and all due, so that memory is given back after an idle period
    /// by the first operation, whichever shard it falls in.
    #[cold]
    fn sweep_others(&self, index: usize, now: Nanos)
    where
        K: Hash,
    {
        for (i, padded) in self.shards.iter().enumerate() {
            if i == index {
                continue;
            }
            let Ok(mut shard) = padded.0.try_lock() else {
                continue;
            };
            let now = now.max(shard.last);
            let units = self.units(now);
            if shard.all_due(now, units) {
                shard.last = now;
                shard.sweep(&self.hasher, now, units);
            }
        }
    }

    /// Grants `cost` of the key (hashed to `hash`) now, if nobody waits for it; the instant of
    /// the grant.
    pub(crate) fn try_acquire<Q>(
        &self,
        hash: u64,
        key: &Q,
        cost: R::Cost,
    ) -> Result<Nanos, NotUntil>
    where
        K: Borrow<Q> + Hash,
        Q: Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.with(hash, |shard, now, units, after| {
            let op = Op {
                fast: |packed: &Packed, word, tally: &mut Tally, after: &mut After| {
                    let cost = cost.single()?;
                    match packed.offer(word, now, cost, LANE)? {
                        Ok(w) => {
                            tally.granted += 1;
                            after.grant(cost, Nanos::ZERO);
                            Some((w, Ok(now)))
                        }
                        Err(at) => {
                            let wait = at.wait_from(now);
                            tally.rejected += 1;
                            after.rejected = Some((cost, wait));
                            Some((word, Err(NotUntil::new(wait))))
                        }
                    }
                },
                slow: |lane: &mut Lane<R>, tally: &mut Tally, after: &mut After| {
                    lane.try_acquire(tally, now, cost, after).map(|()| now)
                },
            };
            shard.on_key(
                &self.defaults,
                &self.hasher,
                hash,
                key,
                now,
                units,
                after,
                op,
            )
        })
    }

    /// See [`Handle::poll`], for the lane of `key`, hashed to `hash`.
    pub(crate) fn poll<Q>(
        &self,
        hash: u64,
        key: &Q,
        ticket: &mut Option<u64>,
        cost: R::Cost,
        waker: &Waker,
        timeout: Option<Duration>,
    ) -> Result<Step, NotUntil>
    where
        K: Borrow<Q> + Hash,
        Q: Eq + ToOwned<Owned = K> + ?Sized,
    {
        // A key with a waiter always has its lane; a request arriving with a ticket finds it
        // there (were it not, the lane would take it as a new arrival).
        let arriving = ticket.is_none();
        // What only the lane needs, behind one reference: the closures' captures are copied
        // into place before the look-up, on the hot path too.
        let mut request = (ticket, waker, timeout);
        let request = &mut request;
        self.with(hash, move |shard, now, units, after| {
            let op = Op {
                fast: move |packed: &Packed, word, tally: &mut Tally, after: &mut After| {
                    if !arriving {
                        return None;
                    }
                    let cost = cost.single()?;
                    let w = packed.offer(word, now, cost, LANE)?.ok()?;
                    tally.granted += 1;
                    after.grant(cost, Nanos::ZERO);
                    Some((w, Ok(Step::Granted(now))))
                },
                slow: move |lane: &mut Lane<R>, tally: &mut Tally, after: &mut After| {
                    let (ticket, waker, timeout) = request;
                    // Only here: the fast path has no use for it.
                    let limit = timeout.map(|t| now.saturating_add(Nanos::from_duration(t)));
                    lane.poll(tally, now, ticket, cost, waker, limit, after)
                },
            };
            shard.on_key(
                &self.defaults,
                &self.hasher,
                hash,
                key,
                now,
                units,
                after,
                op,
            )
        })
    }

    /// See [`Handle::cancel`], for the lane of `key`, hashed to `hash`.
    pub(crate) fn cancel<Q>(&self, hash: u64, key: &Q, ticket: u64)
    where
        K: Borrow<Q> + Hash,
        Q: Eq + ?Sized,
    {
        self.with(hash, |shard, now, _, after| {
            let Ok(entry) = shard.slots.find_entry(hash, |s| s.key.borrow() == key) else {
                return;
            };
            let word = entry.get().word;
            if word & LANE == 0 {
                return;
            }
            lane_of(&mut shard.lanes, word).cancel(now, ticket, after);
            let parts = Parts {
                lanes: &mut shard.lanes,
                free: &mut shard.free,
                latest_word: &mut shard.latest_word,
                latest_lane: &mut shard.latest_lane,
            };
            settle_in_place(&self.defaults, entry, parts, now);
        });
    }

    /// Changes the limit of `key` to what `change` makes of the one in force (the key's own,
    /// or the default), applying it to the key's state at once.
    pub(crate) fn set_limit<Q, F>(&self, key: &Q, change: F)
    where
        K: Borrow<Q> + Hash,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(&R::Limit) -> R::Limit,
    {
        self.change_limit(key, Some((change, Q::to_owned)));
    }

    /// Gives `key` the default limit again.
    pub(crate) fn clear_limit<Q>(&self, key: &Q)
    where
        K: Borrow<Q> + Hash,
        Q: Hash + Eq + ?Sized,
    {
        self.change_limit::<Q, fn(&R::Limit) -> R::Limit>(key, None);
    }

    /// Sets (`Some`, with how to own the key if it has no limit yet) or clears (`None`) the
    /// limit of `key`, and applies it to the key's state, keeping the level; its head waiter,
    /// if any, is woken to re-read its deadline. A key that is as new (and not waited on) is a
    /// key never seen: it starts afresh, full at its new limit. The key's `Eq` and `Clone` run
    /// before anything changes.
    fn change_limit<Q, F>(&self, key: &Q, change: LimitChange<Q, K, F>)
    where
        K: Borrow<Q> + Hash,
        Q: Hash + Eq + ?Sized,
        F: FnOnce(&R::Limit) -> R::Limit,
    {
        let hash = self.hash(key);
        self.with(hash, |shard, now, units, after| {
            let config = shard
                .limits
                .find_entry(hash, |c| c.hash == hash && c.key.borrow() == key);
            // Both look-ups (the key's `Eq`) before anything changes.
            let state = shard
                .slots
                .find_bucket_index(hash, |s| s.key.borrow() == key);
            let (limit, new_key) = match (&config, change) {
                (_, None) => (None, None),
                (Ok(config), Some((f, _))) => (Some(f(&config.get().limit)), None),
                (Err(_), Some((f, to_owned))) => {
                    (Some(f(&self.defaults.limit)), Some(to_owned(key)))
                }
            };
            // No user code from here on.
            let new = match (config, limit, new_key) {
                (Ok(mut config), Some(limit), _) => {
                    config.get_mut().limit = limit.clone();
                    limit
                }
                (Ok(config), None, _) => {
                    config.remove();
                    self.defaults.limit.clone()
                }
                (Err(absent), Some(limit), Some(key)) => {
                    let config = KeyConfig {
                        hash,
                        key,
                        limit: limit.clone(),
                    };
                    absent.into_table().insert_unique(hash, config, |c| c.hash);
                    limit
                }
                (Err(_), _, _) => return,
            };
            let Some(Ok(mut entry)) = state.map(|i| shard.slots.get_bucket_entry(i)) else {
                return;
            };
            let word = entry.get().word;
            if is_idle_full(&shard.lanes, word, now, units) {
                entry.remove();
                if word & LANE != 0 {
                    drop_lane(&mut shard.lanes, &mut shard.free, word);
                }
                return;
            }
            let w = if word & LANE == 0 {
                let Some(packed) = &self.defaults.packed else {
                    unreachable!("a word without a packed default");
                };
                add_lane(
                    &mut shard.lanes,
                    &mut shard.free,
                    Lane::new(self.defaults.bucket_of(packed, word)),
                )
            } else {
                word
            };
            entry.get_mut().word = w;
            let lane = lane_of(&mut shard.lanes, w);
            lane.rule_mut().apply(now, &new);
            after.wake = lane.head_waker();
            let parts = Parts {
                lanes: &mut shard.lanes,
                free: &mut shard.free,
                latest_word: &mut shard.latest_word,
                latest_lane: &mut shard.latest_lane,
            };
            settle_in_place(&self.defaults, entry, parts, now);
        });
    }

    /// Corrects the state of `key` (hashed to `hash`) with `f` at `now` (a fresh rule of its
    /// limit if it has none); if `f` says it gave something back, the key's head waiter is
    /// woken to go. A key left as new and idle is forgotten.
    pub(crate) fn correct<Q>(&self, hash: u64, key: &Q, f: impl FnOnce(&mut R, Nanos) -> bool)
    where
        K: Borrow<Q> + Hash,
        Q: Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.with(hash, |shard, now, units, after| {
            let op = Op {
                fast: |_: &Packed, _, _: &mut Tally, _: &mut After| None,
                slow: |lane: &mut Lane<R>, _: &mut Tally, after: &mut After| {
                    if f(lane.rule_mut(), now) {
                        after.wake = lane.head_waker();
                    }
                },
            };
            shard.on_key(
                &self.defaults,
                &self.hasher,
                hash,
                key,
                now,
                units,
                after,
                op,
            );
        });
    }

    /// What `key` could take now, ignoring its waiters.
    pub(crate) fn available<Q>(&self, key: &Q) -> R::Cost
    where
        K: Borrow<Q> + Hash,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hash(key);
        self.with(hash, |shard, now, _, _| {
            shard.bucket(&self.defaults, hash, key, |rule, _| rule.level(now))
        })
    }

    /// Locks every shard, in order.
    fn lock_all(&self) -> Vec<MutexGuard<'_, Shard<K, R>>> {
        self.shards.iter().map(|s| lock(&s.0)).collect()
    }

    /// How many keys hold state now: every shard is swept first, so that this counts exactly
    /// the keys not full or waited on.
    pub(crate) fn tracked_keys(&self) -> usize
    where
        K: Hash,
    {
        let read = timer::since(self.origin, Instant::now());
        self.shards
            .iter()
            .map(|s| {
                let mut shard = lock(&s.0);
                let now = read.max(shard.last);
                shard.last = now;
                shard.sweep(&self.hasher, now, self.units(now));
                shard.slots.len()
            })
            .sum()
    }

    /// Records to the metrics of the limiter called `name` from now on, on every handle; a
    /// name given before is replaced (its waiters gauge drops to 0: it no longer counts).
    #[cfg(feature = "metrics")]
    pub(crate) fn set_metrics(&self, name: &str) {
        // Registered before the locks: the recorder is the application's code.
        let metrics = crate::instrument::LimiterMetrics::new(name);
        let shards = self.lock_all();
        let waiting: usize = shards.iter().map(|s| s.waiting()).sum();
        #[allow(clippy::cast_precision_loss)]
        metrics.waiters.set(waiting as f64);
        self.metrics
            .replace(metrics, |previous| previous.waiters.set(0.0));
        drop(shards);
    }

    pub(crate) fn stats(&self) -> Stats {
        let shards = self.lock_all();
        let mut sum = Tally::default();
        let mut waiting = 0;
        for shard in &shards {
            sum.granted += shard.tally.granted;
            sum.rejected += shard.tally.rejected;
            sum.waited += shard.tally.waited;
            waiting += shard.waiting();
        }
        sum.stats(waiting)
    }
}

impl<K, S: BuildHasher> KeyedShared<K, S> {
    /// The bucket of `key` (hashed to `hash`) as quota headers describe it now: a full bucket
    /// of its limit if it has no state.
    #[cfg(feature = "http")]
    pub(crate) fn limit_state<Q>(&self, hash: u64, key: &Q) -> crate::stats::LimitState
    where
        K: Borrow<Q> + Hash,
        Q: Eq + ?Sized,
    {
        self.with(hash, |shard, now, _, _| {
            shard.bucket(&self.defaults, hash, key, |bucket, limit| {
                crate::stats::LimitState::of(bucket, limit.rate, now)
            })
        })
    }
}

impl<K, R: KeyRule> Shard<K, R> {
    /// How many requests wait in this shard.
    fn waiting(&self) -> usize {
        self.lanes.iter().flatten().map(Lane::waiting).sum()
    }

    /// Runs `f` on the bucket of `key` (hashed to `hash`; a full bucket of its limit if it has
    /// no state) and the key's limit.
    fn bucket<Q, T>(
        &self,
        defaults: &Defaults<R>,
        hash: u64,
        key: &Q,
        f: impl FnOnce(&R, &R::Limit) -> T,
    ) -> T
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let limit = if self.limits.is_empty() {
            &defaults.limit
        } else {
            self.limits
                .find(hash, |c| c.hash == hash && c.key.borrow() == key)
                .map_or(&defaults.limit, |c| &c.limit)
        };
        match self.slots.find(hash, |s| s.key.borrow() == key) {
            Some(slot) if slot.word & LANE != 0 => {
                #[allow(clippy::cast_possible_truncation)]
                match self.lanes.get((slot.word & !LANE) as usize) {
                    Some(Some(lane)) => f(lane.rule(), limit),
                    _ => f(&R::fresh(limit), limit),
                }
            }
            Some(slot) => match &defaults.packed {
                Some(packed) => f(&defaults.bucket_of(packed, slot.word), limit),
                None => f(&R::fresh(limit), limit),
            },
            None => f(&R::fresh(limit), limit),
        }
    }
}

/// A shard's parts beside its table, borrowed while an entry of the table is.
struct Parts<'a, R: KeyRule> {
    lanes: &'a mut Vec<Option<Lane<R>>>,
    free: &'a mut Vec<usize>,
    latest_word: &'a mut Option<u64>,
    latest_lane: &'a mut Option<Nanos>,
}

/// Settles the key of `entry`, which has a lane, after an operation at `now`: kept as it is,
/// back to a word (its lane freed), or forgotten.
fn settle_in_place<K, R: KeyRule>(
    defaults: &Defaults<R>,
    mut entry: hashbrown::hash_table::OccupiedEntry<'_, Slot<K>>,
    parts: Parts<'_, R>,
    now: Nanos,
) {
    let word = entry.get().word;
    let lane = lane_of(parts.lanes, word);
    match defaults.settle(lane, now) {
        Settled::Lane => {
            if lane.waiting() == 0 {
                let at = lane.rule().as_new_at();
                note(parts.latest_lane, at);
            }
        }
        Settled::Word(w) => {
            entry.get_mut().word = w;
            drop_lane(parts.lanes, parts.free, word);
            note(parts.latest_word, w);
        }
        Settled::Forget => {
            entry.remove();
            drop_lane(parts.lanes, parts.free, word);
        }
    }
}

/// [`Shard::on_key`] for a stored key (its slot `entry`) that has a lane, or whose word the
/// fast operation could not settle: `slow` on its lane (made from the word if it has none),
/// then settled.
#[inline(never)]
fn on_stored<K, R: KeyRule, T, L>(
    defaults: &Defaults<R>,
    mut entry: hashbrown::hash_table::OccupiedEntry<'_, Slot<K>>,
    parts: Parts<'_, R>,
    tally: &mut Tally,
    now: Nanos,
    after: &mut After,
    slow: L,
) -> T
where
    L: FnOnce(&mut Lane<R>, &mut Tally, &mut After) -> T,
{
    let word = entry.get().word;
    if word & LANE != 0 {
        let out = slow(lane_of(parts.lanes, word), tally, after);
        settle_in_place(defaults, entry, parts, now);
        return out;
    }
    let Some(packed) = &defaults.packed else {
        unreachable!("a word without a packed default");
    };
    let mut lane = Lane::new(defaults.bucket_of(packed, word));
    let out = slow(&mut lane, tally, after);
    match defaults.settle(&lane, now) {
        Settled::Lane => {
            let idle = (lane.waiting() == 0).then(|| lane.rule().as_new_at());
            entry.get_mut().word = add_lane(parts.lanes, parts.free, lane);
            if let Some(at) = idle {
                note(parts.latest_lane, at);
            }
        }
        Settled::Word(w) => {
            entry.get_mut().word = w;
            note(parts.latest_word, w);
        }
        Settled::Forget => {
            entry.remove();
        }
    }
    out
}

/// Raises a watermark to `value`.
fn note<T: Ord + Copy>(latest: &mut Option<T>, value: T) {
    *latest = Some(latest.map_or(value, |l| l.max(value)));
}

/// A way into one key's queue: the limiter's state and the key (each borrowed or owned, the
/// key borrowed as `R`), and the key's hash, computed once when the request is made.
pub(crate) struct KeyHandle<P, Q, R: ?Sized> {
    shared: P,
    key: Q,
    hash: u64,
    form: PhantomData<fn(&R)>,
}

impl<
        K,
        S: BuildHasher,
        L: KeyRule,
        P: Deref<Target = KeyedShared<K, S, L>>,
        Q: Borrow<R>,
        R: Hash + ?Sized,
    > KeyHandle<P, Q, R>
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
pub(crate) type KeyRef<'a, K, Q, S, L = Bucket> = KeyHandle<&'a KeyedShared<K, S, L>, &'a Q, Q>;

/// Owned, for a request that outlives any borrow (a stream's, a tower response future's).
pub(crate) type KeyOwned<K, S, L = Bucket> = KeyHandle<std::sync::Arc<KeyedShared<K, S, L>>, K, K>;

impl<K, S, L, P, Q, R> KeyHandle<P, Q, R>
where
    P: Deref<Target = KeyedShared<K, S, L>>,
    S: BuildHasher,
    L: KeyRule,
    Q: Borrow<R>,
    K: Borrow<R> + Hash,
    R: Eq + ToOwned<Owned = K> + ?Sized,
{
    /// Grants `cost` of this key now, if nobody waits for it.
    #[cfg(feature = "tower")]
    pub(crate) fn try_acquire(&self, cost: L::Cost) -> Result<Nanos, NotUntil> {
        self.shared.try_acquire(self.hash, self.key.borrow(), cost)
    }

    /// Corrects this key's state (see [`KeyedShared::correct`]).
    pub(crate) fn correct(&self, f: impl FnOnce(&mut L, Nanos) -> bool) {
        self.shared.correct(self.hash, self.key.borrow(), f);
    }
}

impl<K, S, P, Q, R> KeyHandle<P, Q, R>
where
    P: Deref<Target = KeyedShared<K, S>>,
    S: BuildHasher,
    Q: Borrow<R>,
    K: Borrow<R> + Hash,
    R: Eq + ToOwned<Owned = K> + ?Sized,
{
    /// This key's bucket as quota headers describe it now.
    #[cfg(feature = "http")]
    pub(crate) fn limit_state(&self) -> crate::stats::LimitState {
        self.shared.limit_state(self.hash, self.key.borrow())
    }
}

impl<K, S, L, P, Q, R> Handle for KeyHandle<P, Q, R>
where
    P: Deref<Target = KeyedShared<K, S, L>>,
    S: BuildHasher,
    L: KeyRule,
    Q: Borrow<R>,
    K: Borrow<R> + Hash,
    R: Eq + ToOwned<Owned = K> + ?Sized,
{
    type Cost = L::Cost;
    fn origin(&self) -> Instant {
        self.shared.origin
    }
    fn poll(
        &self,
        ticket: &mut Option<u64>,
        cost: L::Cost,
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

#[cfg(test)]
mod tests {
    use std::collections::hash_map::DefaultHasher;
    use std::hash::BuildHasherDefault;
    use std::time::Duration;

    use super::{KeyLimit, KeyedShared, LANE};
    use crate::rate::Rate;

    type Fixed = BuildHasherDefault<DefaultHasher>;

    /// 10 per second, a burst of 1: a key charged once is full again 100 ms later.
    fn shared() -> KeyedShared<u64, Fixed> {
        let limit = KeyLimit {
            rate: Rate::per_second(10),
            burst: 1,
        };
        KeyedShared::new(limit, Fixed::default())
    }

    impl<K, S> KeyedShared<K, S> {
        /// The keys with state now, without any sweep.
        fn held(&self) -> usize {
            self.shards
                .iter()
                .map(|s| super::lock(&s.0).slots.len())
                .sum()
        }

        /// The slots of every shard's table: what it has allocated.
        fn capacity(&self) -> usize {
            self.shards
                .iter()
                .map(|s| super::lock(&s.0).slots.num_buckets())
                .sum()
        }

        /// The lanes in use, and the words that point at one.
        fn lanes(&self) -> (usize, usize) {
            self.shards.iter().fold((0, 0), |(lanes, words), s| {
                let shard = super::lock(&s.0);
                let pointing = shard.slots.iter().filter(|s| s.word & LANE != 0).count();
                (
                    lanes + shard.lanes.iter().flatten().count(),
                    words + pointing,
                )
            })
        }
    }

    fn take(shared: &KeyedShared<u64, Fixed>, key: u64) -> bool {
        shared.try_acquire(shared.hash(&key), &key, 1).is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn a_mass_expiry_is_forgotten_by_the_next_operation() {
        let shared = shared();
        for key in 0..20_000 {
            assert!(take(&shared, key));
        }
        assert_eq!(shared.held(), 20_000);
        let grown = shared.capacity();
        tokio::time::advance(Duration::from_millis(100)).await;
        // The first operation finds every key of its shard full, forgets them all, and sweeps
        // the other shards, idle as long.
        assert!(take(&shared, 100_000));
        assert_eq!(shared.held(), 1);
        assert!(
            shared.capacity() < grown / 16,
            "{} of {grown}",
            shared.capacity()
        );
        // A shard with keys in use keeps them.
        for key in 200_000..200_100 {
            assert!(take(&shared, key));
        }
        tokio::time::advance(Duration::from_millis(50)).await;
        assert!(take(&shared, 300_000));
        assert_eq!(shared.held(), 102);
    }

    #[tokio::test(start_paused = true)]
    async fn the_clock_hand_forgets_full_keys_among_busy_ones() {
        let shared = shared();
        // Charged once, full again at 100 ms.
        for key in 1_000..3_000 {
            assert!(take(&shared, key));
        }
        // Busy keys, each charged every 100 ms, half of them in turn every 50 ms: some key of
        // every shard is never full, so no shard finds all its keys due at once, and only the
        // clock hand forgets the others.
        for round in 0..200u64 {
            for key in 0..200u64 {
                if (key + round) % 2 == 0 {
                    assert!(take(&shared, key), "key {key} round {round}");
                }
            }
            if round == 199 {
                assert_eq!(shared.held(), 200);
            }
            tokio::time::advance(Duration::from_millis(50)).await;
        }
        // Half of them are full now.
        assert_eq!(shared.tracked_keys(), 100);
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_working_set_never_moves_the_table() {
        let shared = shared();
        let mut next = 0;
        let mut capacities = Vec::new();
        // 2,000 new keys every 25 ms, each full again 100 ms after its charge: about 8,000 in
        // use at any time, and 800,000 keys in all.
        for round in 0..400 {
            for _ in 0..2_000 {
                assert!(take(&shared, next));
                next += 1;
            }
            tokio::time::advance(Duration::from_millis(25)).await;
            if round >= 20 {
                capacities.push(shared.capacity());
            }
        }
        let moves = capacities.windows(2).filter(|w| w[0] != w[1]).count();
        assert_eq!(moves, 0, "{capacities:?}");
        let held = shared.held();
        assert!(held <= 2 * 10_000, "{held}");
        assert!(shared.capacity() <= 4 * 10_000, "{}", shared.capacity());
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_has_a_lane_only_while_it_needs_one() {
        let shared = std::sync::Arc::new(shared());
        assert!(take(&shared, 7));
        assert_eq!(shared.lanes(), (0, 0));
        let waiter = tokio::spawn({
            let shared = shared.clone();
            async move {
                let handle = super::KeyOwned::new(shared, 7u64);
                let mut waiter = std::pin::pin!(crate::engine::Waiter::new(handle));
                std::future::poll_fn(|cx| waiter.as_mut().poll_acquire(cx, 1, None))
                    .await
                    .unwrap();
            }
        });
        tokio::task::yield_now().await;
        assert_eq!(shared.lanes(), (1, 1));
        waiter.await.unwrap();
        // Served at 100 ms: idle again, under the default limit, back to a word.
        assert_eq!(shared.lanes(), (0, 0));
        assert_eq!(shared.held(), 1);
        // A limit of its own keeps a lane while the key has state.
        let own = KeyLimit {
            rate: Rate::per_second(1),
            burst: 1,
        };
        shared.set_limit(&7, |_: &KeyLimit| own);
        assert_eq!(shared.lanes(), (1, 1));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(shared.tracked_keys(), 0);
        assert_eq!(shared.lanes(), (0, 0));
    }
}
