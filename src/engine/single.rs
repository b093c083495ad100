//! One quota shared by handle: one [`Lane`] behind a mutex, and a lock-free path beside it.
//!
//! While nobody waits and the rule is a plain token bucket whose state fits in 63 bits, the
//! bucket's `tat` lives in one atomic *word* and a request that conforms is granted with one
//! compare-and-swap, without the lock ([`Packed`] is the arithmetic). Everything else goes
//! through the mutex, which first *takes* the word (sets its `HELD` bit, moving `tat` into the
//! lane's bucket) and gives it back when the queue is empty again. So:
//!
//! - **FIFO holds.** A request that queues takes the word first, and the word stays held
//!   while anyone waits: no lock-free grant can overtake a waiter.
//! - **Rate changes are safe.** The parameters the lock-free path reads (token, scale, burst,
//!   offset) change only while the word is held, and a word given back under new parameters
//!   is strictly greater than any word seen under the old ones (words only grow: the offset
//!   absorbs a change of unit). A compare-and-swap computed from parameters that changed
//!   meanwhile therefore always fails, and a refusal is confirmed by re-reading the word.
//! - **The clock is read before the compare-and-swap**, not under a lock. That is sound: after
//!   any grant the bucket's `tat` is past the grant's time, so a grant computed with an
//!   earlier reading than one already recorded is judged as of that later time, only more
//!   strictly (the GCRA's `max(tat, now)` is the same), and recorded there.

use std::ops::Deref;
use std::task::Waker;
use std::time::Duration;

use tokio::time::Instant;

use super::lane::{After, Lane, Step, Tally};
use super::striped::Striped;
use super::waiter::Handle;
use crate::core::{Amount, Nanos, Pace, Packed};
use crate::error::NotUntil;
use crate::stats::Stats;
use crate::sync::{fence, lock, AtomicU64, Mutex, MutexGuard, Ordering};
use crate::timer;

/// The bit of the word that says the mutex side holds the bucket's state.
const HELD: u64 = 1 << 63;

/// What the mutex guards: the lane, the limiter's counters, and the word's bookkeeping.
#[derive(Debug)]
pub(crate) struct Locked<R: Pace> {
    pub(crate) lane: Lane<R>,
    pub(crate) tally: Tally,
    /// Whether the mutex side holds the bucket's state (the word's `HELD` bit is set).
    held: bool,
    /// The word when it was last taken: a word given back must not be smaller.
    taken: u64,
    /// The parameters the lock-free path reads, as last published.
    published: Option<Packed>,
}

/// The lock-free side: the word, on a cache line of its own that two cores contend for, and
/// the parameters to read it with, on another that each core keeps a copy of. "A line of its
/// own" is 128 bytes: x86's spatial prefetcher moves 64-byte lines in aligned pairs, so a word
/// aligned to 64 bytes only shares a pair with the parameters in some allocations and not in
/// others (contended acquisitions took 95 ns in some runs and 54 in others).
#[derive(Debug)]
struct Fast {
    word: Line,
    token: AtomicU64,
    scale: AtomicU64,
    burst: AtomicU64,
    offset: AtomicU64,
}

#[derive(Debug)]
#[repr(align(128))]
struct Line(AtomicU64);

impl std::ops::Deref for Line {
    type Target = AtomicU64;
    fn deref(&self) -> &AtomicU64 {
        &self.0
    }
}

/// The lock-free path's answer.
enum FastAnswer {
    Granted,
    /// Not before this time (nobody is queued, so this is the whole truth).
    NotUntil(Nanos),
    /// Ask under the lock.
    Locked,
}

/// The state shared by every handle of one limiter.
#[derive(Debug)]
pub(crate) struct Shared<R: Pace> {
    fast: Fast,
    /// Grants and refusals on the lock-free path (those under the lock are in the tally).
    granted: Striped,
    rejected: AtomicU64,
    origin: Instant,
    state: Mutex<Locked<R>>,
    /// The handles a named limiter records to, for every clone: set under the lock, and
    /// replaced if it is named again.
    #[cfg(feature = "metrics")]
    metrics: crate::instrument::Named<crate::instrument::LimiterMetrics>,
}

impl<R: Pace> Shared<R> {
    pub(crate) fn new(rule: R) -> Shared<R> {
        Shared::with_origin(rule, Instant::now())
    }

    /// A limiter whose times count from `origin` (the rule's time 0).
    pub(crate) fn with_origin(rule: R, origin: Instant) -> Shared<R> {
        let shared = Shared {
            fast: Fast {
                word: Line(AtomicU64::new(HELD)),
                token: AtomicU64::new(0),
                scale: AtomicU64::new(0),
                burst: AtomicU64::new(0),
                offset: AtomicU64::new(0),
            },
            granted: Striped::default(),
            rejected: AtomicU64::new(0),
            origin,
            state: Mutex::new(Locked {
                lane: Lane::new(rule),
                tally: Tally::default(),
                held: true,
                taken: 0,
                published: None,
            }),
            #[cfg(feature = "metrics")]
            metrics: crate::instrument::Named::default(),
        };
        shared.release(&mut shared.lock(), Nanos::ZERO);
        shared
    }

    pub(crate) fn now(&self) -> Nanos {
        timer::since(self.origin, Instant::now())
    }

    fn clock(&self, at: Option<Nanos>) -> Nanos {
        at.unwrap_or_else(|| self.now())
    }

    fn lock(&self) -> MutexGuard<'_, Locked<R>> {
        lock(&self.state)
    }

    /// Grants `cost` without the lock if the word is free and the bucket holds it; the clock
    /// is read only then.
    fn try_fast(&self, at: Option<Nanos>, cost: u64) -> (FastAnswer, Nanos) {
        // The clock first, then the word: the word is read as late as possible before the
        // compare-and-swap, so that under contention another core has little time to move it
        // in between (a clock read is about as long as a whole grant).
        let now = self.clock(at);
        let word = self.fast.word.load(Ordering::Acquire);
        if word & HELD != 0 {
            return (FastAnswer::Locked, now);
        }
        (self.try_fast_from(word, now, cost), now)
    }

    fn try_fast_from(&self, mut word: u64, now: Nanos, cost: u64) -> FastAnswer {
        let fast = &self.fast;
        loop {
            if word & HELD != 0 {
                return FastAnswer::Locked;
            }
            let packed = Packed {
                token: fast.token.load(Ordering::Relaxed),
                scale: fast.scale.load(Ordering::Relaxed),
                burst: fast.burst.load(Ordering::Relaxed),
                offset: fast.offset.load(Ordering::Relaxed),
            };
            // Pairs with the fence before the parameters are written: if any of the loads
            // above saw a new value, the word read below shows the take that preceded it.
            fence(Ordering::Acquire);
            match packed.offer(word, now, cost, HELD) {
                None => return FastAnswer::Locked,
                Some(Ok(next)) => {
                    match fast.word.compare_exchange_weak(
                        word,
                        next,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => {
                            self.granted.increment();
                            #[cfg(feature = "metrics")]
                            if let Some(m) = self.metrics.get() {
                                m.granted(cost, 0);
                            }
                            return FastAnswer::Granted;
                        }
                        Err(actual) => word = actual,
                    }
                }
                Some(Err(at)) => {
                    // The parameters were those of `word` if the word has not moved since.
                    // (Acquire: if it has, the next round must see the new parameters.)
                    let again = fast.word.load(Ordering::Acquire);
                    if again == word {
                        return FastAnswer::NotUntil(at);
                    }
                    word = again;
                }
            }
        }
    }

    /// Takes the word: the lane's bucket becomes the truth until [`Shared::release`].
    fn take(&self, st: &mut Locked<R>) {
        if st.held {
            return;
        }
        let word = self.fast.word.fetch_or(HELD, Ordering::AcqRel);
        st.held = true;
        st.taken = word;
        if let (Some(packed), Some(bucket)) = (st.published, st.lane.rule_mut().bucket_mut()) {
            packed.restore(bucket, word);
        }
    }

    /// Gives the word back if nobody waits and the rule is a plain bucket that fits.
    fn release(&self, st: &mut Locked<R>, now: Nanos) {
        if !st.held || st.lane.waiting() > 0 {
            return;
        }
        let Some(bucket) = st.lane.rule().plain_bucket(now) else {
            return;
        };
        let unchanged = st
            .published
            .filter(|p| Packed::of(bucket, p.offset) == Some(*p))
            .and_then(|p| p.word(bucket, HELD))
            .filter(|&word| word >= st.taken);
        let word = match unchanged {
            Some(word) => word,
            None => {
                // New parameters: an offset that puts the word above every word read under
                // the old ones.
                let Some(unit) = Packed::of(bucket, 0) else {
                    return;
                };
                let Some(tat) = unit.word(bucket, HELD) else {
                    return;
                };
                let packed = Packed {
                    offset: (st.taken + 1).saturating_sub(tat),
                    ..unit
                };
                let Some(word) = packed.word(bucket, HELD) else {
                    return;
                };
                // Written only between taking and giving back the word; the fence makes a
                // reader that sees any of them also see the word taken.
                fence(Ordering::Release);
                let fast = &self.fast;
                fast.token.store(packed.token, Ordering::Relaxed);
                fast.scale.store(packed.scale, Ordering::Relaxed);
                fast.burst.store(packed.burst, Ordering::Relaxed);
                fast.offset.store(packed.offset, Ordering::Relaxed);
                st.published = Some(packed);
                word
            }
        };
        self.fast.word.store(word, Ordering::Release);
        st.held = false;
    }

    /// Grants `cost` now if that needs no waiting and nobody is queued.
    pub(crate) fn try_acquire(&self, cost: R::Cost) -> Result<(), NotUntil> {
        self.try_acquire_at(None, cost)
    }

    /// [`Shared::try_acquire`] at `at`, or at the clock's time if `None`.
    pub(crate) fn try_acquire_at(&self, at: Option<Nanos>, cost: R::Cost) -> Result<(), NotUntil> {
        if cost.is_zero() {
            self.grant_free();
            return Ok(());
        }
        match cost.single().map(|units| (units, self.try_fast(at, units))) {
            Some((_, (FastAnswer::Granted, _))) => return Ok(()),
            Some((units, (FastAnswer::NotUntil(when), now))) => {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                #[cfg(feature = "metrics")]
                if let Some(m) = self.metrics.get() {
                    m.refusals.increment(1);
                }
                let wait = when.wait_from(now);
                After {
                    rejected: Some((units, wait)),
                    ..After::default()
                }
                .run();
                return Err(NotUntil::new(wait));
            }
            Some((_, (FastAnswer::Locked, _))) | None => {}
        }
        self.try_acquire_locked(at, cost)
    }

    /// [`Shared::try_acquire_at`] without the lock-free path, which decides for a cost of one
    /// number only: a cost of several amounts (several limits) goes here at once. Inlined
    /// into its caller: such a grant is little more than the lock and the limits.
    #[inline]
    pub(crate) fn try_acquire_several_at(
        &self,
        at: Option<Nanos>,
        cost: R::Cost,
    ) -> Result<(), NotUntil> {
        debug_assert!(cost.single().is_none());
        if cost.is_zero() {
            self.grant_free();
            return Ok(());
        }
        self.try_acquire_locked(at, cost)
    }

    /// Grants a request that costs nothing: counted, and nothing else.
    #[inline]
    fn grant_free(&self) {
        self.granted.increment();
        #[cfg(feature = "metrics")]
        if let Some(m) = self.metrics.get() {
            m.granted(0, 0);
        }
    }

    /// The lock's side of [`Shared::try_acquire_at`].
    #[inline]
    fn try_acquire_locked(&self, at: Option<Nanos>, cost: R::Cost) -> Result<(), NotUntil> {
        let mut st = self.lock();
        // Read again under the lock, so that grants made under it are recorded in order.
        let now = self.clock(at);
        self.take(&mut st);
        let mut after = After::default();
        let Locked { lane, tally, .. } = &mut *st;
        let result = lane.try_acquire(tally, now, cost, &mut after);
        self.release(&mut st, now);
        self.unlock_then(st, after);
        result
    }

    /// See [`Handle::poll`]; at `at`, or at the clock's time if `None`.
    pub(crate) fn poll_at(
        &self,
        at: Option<Nanos>,
        ticket: &mut Option<u64>,
        cost: R::Cost,
        waker: &Waker,
        timeout: Option<Duration>,
    ) -> Result<Step, NotUntil> {
        if let Some(units) = cost.single().filter(|&units| ticket.is_none() && units > 0) {
            if let (FastAnswer::Granted, now) = self.try_fast(at, units) {
                return Ok(Step::Granted(now));
            }
        }
        let mut st = self.lock();
        let now = self.clock(at);
        let limit = timeout.map(|t| now.saturating_add(Nanos::from_duration(t)));
        self.take(&mut st);
        let mut after = After::default();
        let Locked { lane, tally, .. } = &mut *st;
        let step = lane.poll(tally, now, ticket, cost, waker, limit, &mut after);
        self.release(&mut st, now);
        self.unlock_then(st, after);
        step
    }

    /// See [`Handle::cancel`].
    pub(crate) fn cancel(&self, ticket: u64) {
        let mut st = self.lock();
        let now = self.now();
        let mut after = After::default();
        st.lane.cancel(now, ticket, &mut after);
        self.release(&mut st, now);
        self.unlock_then(st, after);
    }

    /// Changes the rule at `now`; the head of the queue re-reads its deadline.
    pub(crate) fn update<T>(&self, f: impl FnOnce(&mut R, Nanos) -> T) -> T {
        self.update_at(None, f)
    }

    /// [`Shared::update`] at `at`, or at the clock's time if `None`.
    pub(crate) fn update_at<T>(&self, at: Option<Nanos>, f: impl FnOnce(&mut R, Nanos) -> T) -> T {
        let (out, after) = self.update_deferred_at(at, f);
        after.run();
        out
    }

    /// [`Shared::update`], but the head of the queue is left for the caller to wake (with
    /// [`After::run`]): a caller that holds a lock of its own wakes it after releasing that
    /// lock, since the head's waker may do anything, even come back for it.
    pub(crate) fn update_deferred<T>(&self, f: impl FnOnce(&mut R, Nanos) -> T) -> (T, After) {
        self.update_deferred_at(None, f)
    }

    fn update_deferred_at<T>(
        &self,
        at: Option<Nanos>,
        f: impl FnOnce(&mut R, Nanos) -> T,
    ) -> (T, After) {
        let mut st = self.lock();
        let now = self.clock(at);
        self.take(&mut st);
        let out = f(st.lane.rule_mut(), now);
        let after = After {
            wake: st.lane.head_waker(),
            ..After::default()
        };
        self.release(&mut st, now);
        drop(st);
        (out, after)
    }

    /// Corrects the rule at `now` (a grant settled for what it really cost); if `f` says it
    /// gave something back, the head of the queue is woken to see whether it may now go (and a
    /// grant wakes the next in turn).
    pub(crate) fn correct(&self, f: impl FnOnce(&mut R, Nanos) -> bool) {
        let mut st = self.lock();
        let now = self.now();
        self.take(&mut st);
        let returned = f(st.lane.rule_mut(), now);
        let after = After {
            wake: if returned { st.lane.head_waker() } else { None },
            ..After::default()
        };
        self.release(&mut st, now);
        drop(st);
        after.run();
    }

    /// Reads the rule at `now`.
    pub(crate) fn read<T>(&self, f: impl FnOnce(&R, Nanos) -> T) -> T {
        let mut st = self.lock();
        let now = self.now();
        self.take(&mut st);
        let out = f(st.lane.rule(), now);
        self.release(&mut st, now);
        out
    }

    /// Records to the metrics of the limiter called `name` from now on, on every handle; a
    /// name given before is replaced (its waiters gauge drops to 0: it no longer counts).
    #[cfg(feature = "metrics")]
    pub(crate) fn set_metrics(&self, name: &str) {
        // Registered before the lock: the recorder is the application's code.
        let metrics = crate::instrument::LimiterMetrics::new(name);
        let st = self.lock();
        #[allow(clippy::cast_precision_loss)]
        metrics.waiters.set(st.lane.waiting() as f64);
        self.metrics
            .replace(metrics, |previous| previous.waiters.set(0.0));
        drop(st);
    }

    /// Releases the lock, then records and runs what `after` noted.
    fn unlock_then(&self, guard: MutexGuard<'_, Locked<R>>, after: After) {
        after.unlock_then_run(
            guard,
            #[cfg(feature = "metrics")]
            &self.metrics,
        );
    }

    pub(crate) fn stats(&self) -> Stats {
        let st = self.lock();
        let mut stats = st.tally.stats(st.lane.waiting());
        stats.granted += self.granted.sum();
        stats.rejected += self.rejected.load(Ordering::Relaxed);
        stats
    }
}

/// Any way to a limiter's state is a way into its queue: borrowed (`&Shared`, for a future of
/// the limiter's own) or owned (`Arc<Shared>`, for a stream or a tower future).
impl<R: Pace, P: Deref<Target = Shared<R>>> Handle for P {
    type Cost = R::Cost;
    fn origin(&self) -> Instant {
        self.origin
    }
    fn poll(
        &self,
        ticket: &mut Option<u64>,
        cost: R::Cost,
        waker: &Waker,
        timeout: Option<Duration>,
    ) -> Result<Step, NotUntil> {
        Shared::poll_at(self, None, ticket, cost, waker, timeout)
    }
    fn cancel(&self, ticket: u64) {
        Shared::cancel(self, ticket);
    }
}

#[cfg(all(test, not(paced_loom)))]
mod tests {
    use super::*;
    use crate::core::Bucket;
    use crate::timer::Lateness;

    fn is_lock_free<R: Pace>(shared: &Shared<R>) -> bool {
        shared.fast.word.load(Ordering::Relaxed) & HELD == 0
    }

    #[test]
    fn the_word_stays_lock_free_across_many_rate_changes() {
        let shared = Shared::new(Bucket::new(1, 1_000, 2));
        assert!(is_lock_free(&shared));
        let at = Some(Nanos(5_000));
        for i in 0..10_000u64 {
            // Alternate between units of 1 and 7 per nanosecond.
            let tokens = if i % 2 == 0 { 7 } else { 1 };
            shared.update_at(at, |b, now| b.set_rate(now, tokens, 1_000));
        }
        assert!(is_lock_free(&shared));
        // Still the bucket it should be: two tokens at once, then one per 1_000 ns.
        assert!(shared.try_acquire_at(at, 2).is_ok());
        assert_eq!(
            shared.try_acquire_at(at, 1),
            Err(NotUntil::new(Nanos(1_000)))
        );
        assert!(shared.try_acquire_at(Some(Nanos(6_000)), 1).is_ok());
        assert_eq!(shared.stats().granted, 2);
        assert_eq!(shared.stats().rejected, 1);
    }

    #[test]
    fn a_queue_holds_the_word_and_an_empty_one_gives_it_back() {
        let shared = Shared::new(Bucket::new(1, 1_000, 1));
        assert!(shared.try_acquire_at(Some(Nanos::ZERO), 1).is_ok());
        let mut ticket = None;
        let waker = Waker::noop();
        let step = shared.poll_at(Some(Nanos::ZERO), &mut ticket, 1, waker, None);
        assert_eq!(step, Ok(Step::Wait(Nanos(1_000), Lateness::Costly)));
        assert!(!is_lock_free(&shared));
        let step = shared.poll_at(Some(Nanos(1_000)), &mut ticket, 1, waker, None);
        assert_eq!(step, Ok(Step::Granted(Nanos(1_000))));
        assert!(is_lock_free(&shared));
    }

    #[test]
    fn a_rule_that_is_not_a_plain_bucket_never_goes_lock_free() {
        let shared = Shared::new(crate::core::Window::new(2, Nanos(1_000)));
        assert!(!is_lock_free(&shared));
        assert!(shared.try_acquire_at(Some(Nanos::ZERO), 1).is_ok());
        assert!(!is_lock_free(&shared));
    }
}
