//! `throttle_by_key`: items paced by a [`KeyedLimiter`] (a [`KeyedRateLimiter`] unless said
//! otherwise), one bucket per key, with no head-of-line blocking between keys.
//!
//! The adapter holds up to `capacity` items in a FIFO per key. The oldest held item of each
//! key (its *front*) waits through the limiter's permit: in a [`KeyedRateLimiter`], an engine
//! [`Waiter`](crate::engine::Waiter) in the key's lane, like any task's request (it sleeps on
//! its own timer while it heads the key's queue, and is woken by the lane when it comes to head
//! it); in Redis, the Redis limiter's own wait. The items behind it wait in the adapter and take
//! the permit over when they become the front. Each front's permit runs with a waker of its
//! own, which records the front as woken before it wakes the task, so a poll asks only the
//! fronts that were woken (oldest first) and never those still queued behind other users of
//! their key. An item is charged when it leaves.
//!
//! The first item of a key that holds nothing is offered to the limiter directly (its
//! `arrive`): in process, when the limit does not bind, an item costs
//! one hash, one lock and one bucket offer.

use std::collections::{BTreeSet, VecDeque};
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Wake, Waker};

use futures_core::stream::FusedStream;
use futures_core::Stream;
use hashbrown::HashTable;
use pin_project_lite::pin_project;

use super::upstream::Source;
use crate::engine::coop::poll_budget;
use crate::error::ConfigError;
use crate::limiter::keyed_traits::sealed::{Arrival, KeyedSealed};
use crate::limiter::{KeyedLimiter, KeyedRateLimiter};
use crate::sync::{lock, Mutex};

/// The fronts woken since the adapter last looked, and the task to wake for them.
#[derive(Debug, Default)]
struct Woken {
    slots: Vec<usize>,
    task: Option<Waker>,
}

/// The waker of one front (one slot): records the slot as woken, then wakes the task.
struct FrontWake {
    slot: usize,
    woken: Arc<Mutex<Woken>>,
}

impl Wake for FrontWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let task = {
            let mut woken = lock(&self.woken);
            woken.slots.push(self.slot);
            woken.task.take()
        };
        if let Some(task) = task {
            task.wake();
        }
    }
}

/// A front's place in its key's queue, pinned where it waits.
type FrontPermit<Q> = Pin<Box<<Q as KeyedSealed>::Permit>>;

/// The held items of one key, oldest first (arrival number, item, cost), and the front's
/// place in the key's queue once it has had to wait.
struct Front<Q: KeyedLimiter, T> {
    key: Q::Key,
    hash: u64,
    items: VecDeque<(u64, T, Q::Cost)>,
    permit: Option<FrontPermit<Q>>,
}

/// A place for one key's front, with the waker its permit runs with (made once per slot).
struct Slot<Q: KeyedLimiter, T> {
    waker: Waker,
    front: Option<Front<Q, T>>,
}

/// Everything the adapter holds, and its places in the limiter's queues.
struct Held<Q: KeyedLimiter, T> {
    limiter: Q,
    /// The key of each slot that holds items, by the key's hash (the limiter's hasher).
    table: HashTable<(u64, usize)>,
    slots: Vec<Slot<Q, T>>,
    free: Vec<usize>,
    woken: Arc<Mutex<Woken>>,
    /// The fronts to ask at this poll: (the front's arrival number, its slot), oldest first.
    to_ask: BTreeSet<(u64, usize)>,
    count: usize,
    next_seq: u64,
    /// How many times a front's permit was polled: only woken fronts are.
    #[cfg(test)]
    asked: usize,
}

impl<Q: KeyedLimiter, T> Held<Q, T> {
    fn new(limiter: Q) -> Self {
        Held {
            limiter,
            table: HashTable::new(),
            slots: Vec::new(),
            free: Vec::new(),
            woken: Arc::default(),
            to_ask: BTreeSet::new(),
            count: 0,
            next_seq: 0,
            #[cfg(test)]
            asked: 0,
        }
    }

    /// A slot with no front, left in `free`: the caller takes it out once it holds a front.
    fn free_slot(&mut self) -> usize {
        if let Some(&slot) = self.free.last() {
            return slot;
        }
        let slot = self.slots.len();
        let waker = Waker::from(Arc::new(FrontWake {
            slot,
            woken: self.woken.clone(),
        }));
        self.slots.push(Slot { waker, front: None });
        self.free.push(slot);
        slot
    }

    /// Offers an item pulled from upstream: returned at once if its key holds nothing and the
    /// limiter grants it now, else held.
    fn arrive(&mut self, key: Q::Key, item: T, cost: Q::Cost) -> Option<T> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let hash = self.limiter.hash_key(&key);
        let slots = &mut self.slots;
        // Nothing held (the common case while the limit does not bind): no key to look for.
        let found = if self.count == 0 {
            None
        } else {
            self.table.find(hash, |&(h, s)| {
                h == hash && slots[s].front.as_ref().is_some_and(|f| f.key == key)
            })
        };
        if let Some(&(_, slot)) = found {
            if let Some(front) = slots[slot].front.as_mut() {
                front.items.push_back((seq, item, cost));
                self.count += 1;
                return None;
            }
        }
        // Granted at once (the common case), the slot stays free: only its waker was lent.
        let slot = self.free_slot();
        let (permit, ask) = match self
            .limiter
            .arrive(&key, hash, cost, &self.slots[slot].waker)
        {
            Arrival::Granted => return Some(item),
            Arrival::Waiting { permit, ask } => (permit, ask),
        };
        self.free.pop();
        let mut items = VecDeque::with_capacity(1);
        items.push_back((seq, item, cost));
        self.slots[slot].front = Some(Front {
            key,
            hash,
            items,
            permit: Some(Box::pin(permit)),
        });
        self.table.insert_unique(hash, (hash, slot), |&(h, _)| h);
        self.count += 1;
        if ask {
            self.to_ask.insert((seq, slot));
        }
        None
    }

    /// Files the fronts woken since the last look to be asked. (Out of `poll_next`'s frame, as
    /// `release` is: an item granted on arrival does not pay for them.)
    #[inline(never)]
    fn collect_woken(&mut self) {
        let woken = std::mem::take(&mut lock(&self.woken).slots);
        for slot in woken {
            let front = self.slots.get(slot).and_then(|s| s.front.as_ref());
            if let Some(&(seq, _, _)) = front.and_then(|f| f.items.front()) {
                self.to_ask.insert((seq, slot));
            }
        }
    }

    /// Asks the fronts to be asked, oldest first; emits the first one granted.
    #[inline(never)]
    fn release(&mut self) -> Option<T> {
        while let Some((seq, slot)) = self.to_ask.pop_first() {
            let Slot { waker, front } = &mut self.slots[slot];
            let Some(front) = front.as_mut() else {
                continue;
            };
            let Some(&(first, _, cost)) = front.items.front() else {
                continue;
            };
            if first != seq {
                continue; // a stale entry: that item has left
            }
            let limiter = &self.limiter;
            let permit = front
                .permit
                .get_or_insert_with(|| Box::pin(limiter.permit(front.key.clone(), front.hash)));
            let mut cx = Context::from_waker(waker);
            #[cfg(test)]
            {
                self.asked += 1;
            }
            // Pending: its queue or its timer wakes it through the slot's waker.
            if Q::poll_acquire(permit.as_mut(), &mut cx, cost).is_ready() {
                return self.take_front(slot);
            }
        }
        None
    }

    /// Removes the granted front of `slot`; the key's next item becomes its front, to ask.
    fn take_front(&mut self, slot: usize) -> Option<T> {
        let front = self.slots[slot].front.as_mut()?;
        let (_, item, _) = front.items.pop_front()?;
        self.count -= 1;
        if let Some(&(seq, _, _)) = front.items.front() {
            self.to_ask.insert((seq, slot));
        } else {
            let hash = front.hash;
            if let Ok(entry) = self.table.find_entry(hash, |&(_, s)| s == slot) {
                entry.remove();
            }
            self.slots[slot].front = None;
            self.free.push(slot);
        }
        Some(item)
    }

    /// Registers the task to wake for the fronts; false if a front was woken meanwhile, so
    /// that the caller looks again instead of waiting for a wake-up already spent.
    fn register(&self, task: &Waker) -> bool {
        let mut woken = lock(&self.woken);
        if !woken.slots.is_empty() {
            return false;
        }
        match &woken.task {
            Some(current) if current.will_wake(task) => {}
            _ => woken.task = Some(task.clone()),
        }
        true
    }
}

pin_project! {
    /// Stream for [`throttle_by_key`](crate::PaceExt::throttle_by_key): items paced per key
    /// by a [`KeyedLimiter`] `Q`, in upstream order per key, with no key holding up another.
    ///
    /// `Q` is a [`KeyedRateLimiter`] with hasher `H` unless said otherwise; `H` is unused (left
    /// at its default) for another limiter, such as a `RedisKeyedRateLimiter<K>`.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use paced::stream::ThrottleByKey;
    /// use paced::{KeyedRateLimiter, PaceExt, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = KeyedRateLimiter::new(Rate::per_second(1), 1);
    /// let start = tokio::time::Instant::now();
    /// let paced = futures_util::stream::iter([("a", 1), ("a", 2), ("b", 3)])
    ///     .throttle_by_key(&limiter, |m| m.0, |_| 1, 16);
    /// let out: Vec<_> = paced.map(|m| (m.1, start.elapsed().as_secs())).collect().await;
    /// // "b" did not wait behind the second "a".
    /// assert_eq!(out, [(1, 0), (3, 0), (2, 1)]);
    /// # }
    /// ```
    #[must_use = "streams do nothing unless polled"]
    pub struct ThrottleByKey<
        S: Stream,
        K,
        KF,
        F,
        H = std::collections::hash_map::RandomState,
        Q = KeyedRateLimiter<K, u64, H>,
    >
    where
        K: Hash,
        K: Eq,
        K: Clone,
        H: BuildHasher,
        Q: KeyedLimiter<Key = K>,
    {
        #[pin]
        source: Source<S>,
        held: Held<Q, S::Item>,
        key: KF,
        cost: F,
        capacity: usize,
        hasher: PhantomData<fn() -> H>,
    }
}

impl<S, K, KF, F, H, Q> ThrottleByKey<S, K, KF, F, H, Q>
where
    S: Stream,
    K: Hash + Eq + Clone,
    H: BuildHasher,
    Q: KeyedLimiter<Key = K>,
{
    pub(crate) fn try_new(
        stream: S,
        limiter: &Q,
        key: KF,
        cost: F,
        capacity: usize,
    ) -> Result<Self, ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::ZeroCapacity);
        }
        Ok(ThrottleByKey {
            source: Source::new(stream),
            held: Held::new(limiter.clone()),
            key,
            cost,
            capacity,
            hasher: PhantomData,
        })
    }

    /// How many items the adapter holds now, waiting for their keys.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use paced::{KeyedRateLimiter, PaceExt, Rate};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = KeyedRateLimiter::new(Rate::per_second(1), 1);
    /// let mut paced = std::pin::pin!(futures_util::stream::iter([1, 1, 1])
    ///     .throttle_by_key(&limiter, |n| *n, |_| 1, 8));
    /// assert_eq!(paced.next().await, Some(1));
    /// assert_eq!(paced.held(), 0);
    /// # }
    /// ```
    #[must_use]
    pub fn held(&self) -> usize {
        self.held.count
    }
}

accessors!(
    ThrottleByKey
    [S: Stream, K: Hash + Eq + Clone, KF, F, H: BuildHasher, Q: KeyedLimiter<Key = K>]
    [S, K, KF, F, H, Q],
    source,
    "futures_util::stream::iter([1, 2, 3]).throttle_by_key(&paced::KeyedRateLimiter::new(Rate::per_second(1), 1), |n| *n, |_| 1, 8)"
);

impl<S, K, KF, F, H, Q> Stream for ThrottleByKey<S, K, KF, F, H, Q>
where
    S: Stream,
    K: Hash + Eq + Clone,
    KF: FnMut(&S::Item) -> K,
    F: FnMut(&S::Item) -> Q::Cost,
    H: BuildHasher,
    Q: KeyedLimiter<Key = K>,
{
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let mut me = self.project();
        loop {
            if me.held.count > 0 {
                me.held.collect_woken();
                if let Some(item) = me.held.release() {
                    return Poll::Ready(Some(item));
                }
            }
            if !me.source.is_done() && me.held.count < *me.capacity {
                // An item granted on arrival spends a unit of the task's budget (one granted
                // from the held ones spends it in its waiter); one that must wait gives it back.
                let budget = ready!(poll_budget(cx));
                match me.source.as_mut().poll_next(cx) {
                    Poll::Ready(Some(item)) => {
                        let key = (me.key)(&item);
                        let cost = (me.cost)(&item);
                        if let Some(item) = me.held.arrive(key, item, cost) {
                            budget.made_progress();
                            return Poll::Ready(Some(item));
                        }
                        continue;
                    }
                    Poll::Ready(None) | Poll::Pending => {}
                }
            }
            if me.held.count == 0 {
                return if me.source.is_done() {
                    Poll::Ready(None)
                } else {
                    Poll::Pending
                };
            }
            if me.held.to_ask.is_empty() && me.held.register(cx.waker()) {
                return Poll::Pending;
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.source.size_hint(self.held.count)
    }
}

impl<S, K, KF, F, H, Q> FusedStream for ThrottleByKey<S, K, KF, F, H, Q>
where
    S: Stream,
    K: Hash + Eq + Clone,
    KF: FnMut(&S::Item) -> K,
    F: FnMut(&S::Item) -> Q::Cost,
    H: BuildHasher,
    Q: KeyedLimiter<Key = K>,
{
    fn is_terminated(&self) -> bool {
        self.source.is_done() && self.held.count == 0
    }
}

impl<S, K, KF, F, H, Q> fmt::Debug for ThrottleByKey<S, K, KF, F, H, Q>
where
    S: Stream + fmt::Debug,
    K: Hash + Eq + Clone,
    H: BuildHasher,
    Q: KeyedLimiter<Key = K>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottleByKey")
            .field("source", &self.source)
            .field("held", &self.held.count)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(paced_loom)))]
mod tests {
    use std::time::Duration;

    use futures_util::StreamExt;

    use crate::limiter::KeyedRateLimiter;
    use crate::rate::Rate;
    use crate::stream::PaceExt;

    #[tokio::test(start_paused = true)]
    async fn a_front_queued_behind_another_user_is_asked_only_when_woken() {
        let limiter = KeyedRateLimiter::new(Rate::per_second(1), 1);
        limiter.set_limit(&"fast", Rate::per_second(1_000_000), 1_000_000);
        limiter.acquire(&"slow", 1).await;
        // A task waits for "slow" until 1 s; the stream's "slow" item queues behind it.
        let task = tokio::spawn({
            let limiter = limiter.clone();
            async move { limiter.acquire(&"slow", 1).await }
        });
        tokio::task::yield_now().await;
        let items = std::iter::once("slow").chain(std::iter::repeat_n("fast", 500));
        let mut paced = Box::pin(futures_util::stream::iter(items).throttle_by_key(
            &limiter,
            |k| *k,
            |_| 1,
            16,
        ));
        for _ in 0..500 {
            assert_eq!(paced.next().await, Some("fast"));
        }
        // 500 polls, and the queued front was never asked.
        assert_eq!(paced.held.asked, 0);
        assert_eq!(paced.held(), 1);
        let start = tokio::time::Instant::now();
        assert_eq!(paced.next().await, Some("slow"));
        task.await.unwrap();
        // Woken when the task's grant made it the head, asked once to arm its timer and once
        // when the timer fired.
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        assert!(paced.held.asked <= 2, "asked {} times", paced.held.asked);
    }
}
