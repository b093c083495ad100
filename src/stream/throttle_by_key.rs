//! `throttle_by_key`: items paced by a [`KeyedRateLimiter`], one bucket per key, with no
//! head-of-line blocking between keys.
//!
//! The adapter holds up to `capacity` items in a FIFO per key. Only the oldest held item of
//! each key (its *front*) is in the limiter's queue for that key; the rest wait behind it in
//! the adapter. A front is in one of three states: asked and told to wait until a time (kept
//! in a min-heap, which arms the adapter's one timer), queued behind other users of the key
//! (woken by the limiter), or to be asked (new, due, or woken). Each poll asks the fronts to be
//! asked, oldest first, and emits the first one granted: an item is charged when it leaves.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use futures_core::stream::FusedStream;
use futures_core::Stream;
use pin_project_lite::pin_project;

use crate::core::Nanos;
use crate::shared::keyed::KeyedShared;
use crate::shared::Step;
use crate::timer::Timer;
use crate::KeyedRateLimiter;

/// Where a key's front item stands with the limiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Front {
    /// Ask at the next poll: new, due, woken, or queued behind other users of the key.
    Ask,
    /// Heads the key's queue and may go at this time.
    Wait(Nanos),
}

/// The held items of one key, oldest first, each with its arrival number and cost.
struct KeyQueue<T> {
    items: VecDeque<(u64, T, u64)>,
    ticket: Option<u64>,
    front: Front,
}

/// A key filed under an order (an arrival number, or a deadline and one): compared by the
/// order alone, so that keys need not be `Ord`.
struct Filed<O, K>(O, K);

impl<O: PartialEq, K> PartialEq for Filed<O, K> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl<O: Eq, K> Eq for Filed<O, K> {}
impl<O: Ord, K> PartialOrd for Filed<O, K> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<O: Ord, K> Ord for Filed<O, K> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

/// Everything the adapter holds, and its place in the limiter's queues.
struct Held<K, T> {
    limiter: Arc<KeyedShared<K>>,
    /// `KeyedShared::cancel`, taken where `K`'s bounds are known, for `Drop`.
    cancel: fn(&KeyedShared<K>, &K, u64),
    queues: HashMap<K, KeyQueue<T>>,
    /// The fronts to ask at the next poll, by arrival number (unique, so oldest first).
    to_ask: BTreeSet<Filed<u64, K>>,
    /// The fronts told to wait, by deadline; stale entries are skipped.
    deadlines: BinaryHeap<Reverse<Filed<(Nanos, u64), K>>>,
    count: usize,
    next_seq: u64,
    /// The limiter's limits epoch when the fronts were last asked.
    epoch: u64,
}

impl<K: Hash + Eq + Clone, T> Held<K, T> {
    /// Offers an item pulled from upstream: returned at once if its key has nothing held and
    /// the limiter grants it now, else held.
    fn arrive(&mut self, key: K, item: T, cost: u64, waker: &Waker) -> Option<T> {
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(queue) = self.queues.get_mut(&key) {
            queue.items.push_back((seq, item, cost));
            self.count += 1;
            return None;
        }
        let mut ticket = None;
        let front = match self.limiter.poll(&key, &mut ticket, cost, waker, None) {
            // Without a timeout the limiter never refuses.
            Ok(Step::Granted) | Err(_) => return Some(item),
            Ok(Step::Wait(at)) => Front::Wait(at),
            Ok(Step::Queued) => Front::Ask,
        };
        self.hold(key.clone(), seq, front);
        let mut items = VecDeque::with_capacity(1);
        items.push_back((seq, item, cost));
        self.queues.insert(
            key,
            KeyQueue {
                items,
                ticket,
                front,
            },
        );
        self.count += 1;
        None
    }

    /// Files a front under its state.
    fn hold(&mut self, key: K, seq: u64, front: Front) {
        match front {
            Front::Ask => {
                self.to_ask.insert(Filed(seq, key));
            }
            Front::Wait(at) => self.deadlines.push(Reverse(Filed((at, seq), key))),
        }
    }

    /// Whether the heap entry `(at, seq, key)` still describes a waiting front.
    fn is_current(&self, at: Nanos, seq: u64, key: &K) -> bool {
        self.queues.get(key).is_some_and(|q| {
            q.front == Front::Wait(at) && q.items.front().is_some_and(|f| f.0 == seq)
        })
    }

    /// Moves the fronts whose time has come (all of them if `everyone`) to be asked.
    fn collect_due(&mut self, now: Nanos, everyone: bool) {
        while let Some(Reverse(Filed((at, _), _))) = self.deadlines.peek() {
            if *at > now && !everyone {
                break;
            }
            let Some(Reverse(Filed((at, seq), key))) = self.deadlines.pop() else {
                break;
            };
            if self.is_current(at, seq, &key) {
                if let Some(queue) = self.queues.get_mut(&key) {
                    queue.front = Front::Ask;
                }
                self.to_ask.insert(Filed(seq, key));
            }
        }
    }

    /// Asks the fronts to be asked, oldest first; emits the first one granted.
    fn release(&mut self, waker: &Waker) -> Option<T> {
        let mut asked = Vec::new();
        let mut granted = None;
        while let Some(Filed(seq, key)) = self.to_ask.pop_first() {
            let Some(queue) = self.queues.get_mut(&key) else {
                continue;
            };
            let Some(&(_, _, cost)) = queue.items.front() else {
                continue;
            };
            match self
                .limiter
                .poll(&key, &mut queue.ticket, cost, waker, None)
            {
                Ok(Step::Granted) | Err(_) => {
                    granted = self.take_front(key);
                    break;
                }
                Ok(Step::Wait(at)) => {
                    queue.front = Front::Wait(at);
                    self.deadlines.push(Reverse(Filed((at, seq), key)));
                }
                // Still behind other users of the key: ask again at the next poll.
                Ok(Step::Queued) => asked.push(Filed(seq, key)),
            }
        }
        self.to_ask.extend(asked);
        granted
    }

    /// Removes the granted front of `key`; the key's next item becomes its front, to ask.
    fn take_front(&mut self, key: K) -> Option<T> {
        let queue = self.queues.get_mut(&key)?;
        let (_, item, _) = queue.items.pop_front()?;
        self.count -= 1;
        match queue.items.front() {
            Some(&(seq, _, _)) => {
                queue.front = Front::Ask;
                self.to_ask.insert(Filed(seq, key));
            }
            None => {
                self.queues.remove(&key);
            }
        }
        Some(item)
    }

    /// The earliest deadline among the waiting fronts, dropping stale heap entries.
    fn next_deadline(&mut self) -> Option<Nanos> {
        while let Some(Reverse(Filed((at, seq), key))) = self.deadlines.peek() {
            if self.is_current(*at, *seq, key) {
                return Some(*at);
            }
            self.deadlines.pop();
        }
        None
    }
}

impl<K, T> Drop for Held<K, T> {
    fn drop(&mut self) {
        // Gives every place in the limiter's queues back; nothing held was charged.
        for (key, queue) in self.queues.drain() {
            if let Some(ticket) = queue.ticket {
                (self.cancel)(&self.limiter, &key, ticket);
            }
        }
    }
}

pin_project! {
    /// Stream for [`throttle_by_key`](crate::PaceExt::throttle_by_key): items paced per key
    /// by a [`KeyedRateLimiter`], in upstream order per key, with no key holding up another.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use pacer::{KeyedRateLimiter, PaceExt, Rate, ThrottleByKey};
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
    pub struct ThrottleByKey<S: Stream, K, KF, F> {
        #[pin]
        stream: S,
        #[pin]
        timer: Timer,
        held: Held<K, S::Item>,
        key: KF,
        cost: F,
        capacity: usize,
        // Upstream has returned `None` and is never polled again.
        done: bool,
        // The waker the limiter's queues hold for the fronts; a new one means asking them all.
        waker: Option<Waker>,
    }
}

impl<S: Stream, K: Hash + Eq + Clone, KF, F> ThrottleByKey<S, K, KF, F> {
    #[track_caller]
    pub(crate) fn new(
        stream: S,
        limiter: &KeyedRateLimiter<K>,
        key: KF,
        cost: F,
        capacity: usize,
    ) -> Self {
        assert!(
            capacity > 0,
            "throttle_by_key: `capacity` is 0, so no item could ever be held; it must be at least 1"
        );
        let limiter = limiter.shared.clone();
        ThrottleByKey {
            stream,
            timer: Timer::with_origin(limiter.origin()),
            held: Held {
                limiter,
                cancel: |limiter, key, ticket| limiter.cancel(key, ticket),
                queues: HashMap::new(),
                to_ask: BTreeSet::new(),
                deadlines: BinaryHeap::new(),
                count: 0,
                next_seq: 0,
                epoch: 0,
            },
            key,
            cost,
            capacity,
            done: false,
            waker: None,
        }
    }

    /// How many items the adapter holds now, waiting for their keys.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use pacer::{KeyedRateLimiter, PaceExt, Rate};
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
    ThrottleByKey [S: Stream, K, KF, F] [S, K, KF, F],
    stream (direct),
    "futures_util::stream::iter([1, 2, 3]).throttle_by_key(&pacer::KeyedRateLimiter::new(Rate::per_second(1), 1), |n| *n, |_| 1, 8)"
);

impl<S, K, KF, F> Stream for ThrottleByKey<S, K, KF, F>
where
    S: Stream,
    K: Hash + Eq + Clone,
    KF: FnMut(&S::Item) -> K,
    F: FnMut(&S::Item) -> u64,
{
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let mut me = self.project();
        let waker = cx.waker();
        // The fronts' places hold the waker they were last asked with: if the task's waker
        // changed, ask them all, so that their wake-ups reach this task.
        let mut everyone = !me.waker.as_ref().is_some_and(|w| w.will_wake(waker));
        if everyone {
            *me.waker = Some(waker.clone());
        }
        loop {
            if me.held.count > 0 {
                let epoch = me.held.limiter.epoch();
                everyone |= epoch != me.held.epoch;
                me.held.epoch = epoch;
                let now = me.timer.as_mut().now();
                me.held.collect_due(now, everyone);
                everyone = false;
                if let Some(item) = me.held.release(waker) {
                    return Poll::Ready(Some(item));
                }
            }
            if !*me.done && me.held.count < *me.capacity {
                match me.stream.as_mut().poll_next(cx) {
                    Poll::Ready(Some(item)) => {
                        let key = (me.key)(&item);
                        let cost = (me.cost)(&item);
                        if let Some(item) = me.held.arrive(key, item, cost, waker) {
                            return Poll::Ready(Some(item));
                        }
                        continue;
                    }
                    Poll::Ready(None) => *me.done = true,
                    Poll::Pending => {}
                }
            }
            if me.held.count == 0 {
                me.timer.as_mut().disarm();
                return if *me.done {
                    Poll::Ready(None)
                } else {
                    Poll::Pending
                };
            }
            match me.held.next_deadline() {
                Some(at) => {
                    if me.timer.as_mut().poll_until(cx, at).is_pending() {
                        return Poll::Pending;
                    }
                }
                // Every front is queued behind other users of its key: they wake us.
                None => {
                    me.timer.as_mut().disarm();
                    return Poll::Pending;
                }
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let held = self.held.count;
        if self.done {
            return (held, Some(held));
        }
        let (lower, upper) = self.stream.size_hint();
        (
            lower.saturating_add(held),
            upper.and_then(|u| u.checked_add(held)),
        )
    }
}

impl<S, K, KF, F> FusedStream for ThrottleByKey<S, K, KF, F>
where
    S: Stream,
    K: Hash + Eq + Clone,
    KF: FnMut(&S::Item) -> K,
    F: FnMut(&S::Item) -> u64,
{
    fn is_terminated(&self) -> bool {
        self.done && self.held.count == 0
    }
}

impl<S, K, KF, F> fmt::Debug for ThrottleByKey<S, K, KF, F>
where
    S: Stream + fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottleByKey")
            .field("stream", &self.stream)
            .field("held", &self.held.count)
            .field("capacity", &self.capacity)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}
