//! [`KeyedLimiter`]: what `throttle_by_key` and the keyed tower layer draw on, one bucket per
//! key, whether the buckets live in this process or in Redis.

use std::hash::{BuildHasher, Hash};
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};

use pin_project_lite::pin_project;

use std::sync::Arc;

use super::keyed::KeyedRateLimiter;
#[cfg(feature = "tower")]
use super::keyed_multi::KeyedPermit;
use crate::core::{Limits, Nanos};
use crate::engine::keyed::{KeyOwned, KeyRule, KeyedShared};
use crate::engine::{Step, Waiter};

pub(crate) mod sealed {
    use std::hash::{BuildHasher, Hash};
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    /// How a stream's first item of a key fared when it was offered.
    #[derive(Debug)]
    pub enum Arrival<P> {
        /// Granted and charged at once: the item leaves.
        Granted,
        /// Not granted yet: `permit` holds the request's place, woken through the waker it was
        /// offered with; `ask` says that it must be polled once more (to arm its timer) even
        /// before it is woken.
        Waiting { permit: P, ask: bool },
    }

    /// What a [`KeyedLimiter`](super::KeyedLimiter) does, out of users' reach: public in a private
    /// module, so that the adapters can call it and nobody else can name it.
    pub trait KeyedSealed {
        /// The keys the limiter has one bucket each for.
        type Key: Hash + Eq + Clone;

        /// What one request costs: `u64`, or `[u64; N]` for a `KeyedRateLimiter<K, [u64; N]>`.
        type Cost: Copy + Send + Sync + std::fmt::Debug + 'static;

        /// The hasher parameter of the adapters' types: the in-process limiter's own; for a
        /// limiter that has none, std's `RandomState` (unused).
        type Hasher: BuildHasher;

        /// The state of one key's request in flight, kept pinned where it waits (a stream's
        /// front item, a tower response future). It holds what it needs of the limiter and the
        /// key; once granted it may be used again for the next request of the same key.
        type Permit;

        /// The hash of `key`, by which the stream files its held items.
        fn hash_key(&self, key: &Self::Key) -> u64;

        /// A fresh, idle request for `key`, hashed to `hash` by [`hash_key`](Self::hash_key).
        fn permit(&self, key: Self::Key, hash: u64) -> Self::Permit;

        /// Offers `cost` of `key` (hashed to `hash`) for an item whose key holds nothing yet:
        /// granted at once if it can be, else a permit that holds its place and wakes `waker`.
        fn arrive(
            &self,
            key: &Self::Key,
            hash: u64,
            cost: Self::Cost,
            waker: &Waker,
        ) -> Arrival<Self::Permit>;

        /// Waits until `cost` is granted. Never refuses.
        fn poll_acquire(
            permit: Pin<&mut Self::Permit>,
            cx: &mut Context<'_>,
            cost: Self::Cost,
        ) -> Poll<()>;

        /// Grants `cost` if it can be had without waiting, or says how long until it could.
        #[cfg(feature = "tower")]
        fn poll_try_acquire(
            permit: Pin<&mut Self::Permit>,
            cx: &mut Context<'_>,
            cost: Self::Cost,
        ) -> Poll<Result<(), crate::error::NotUntil>>;

        /// What a granted request keeps to correct its charge from the response: `()` for a
        /// limiter that cannot be corrected, a `KeyedPermit` for a `KeyedRateLimiter<K, [u64; N]>`.
        #[cfg(feature = "tower")]
        type Grant;

        /// The grant of `cost` through `permit`, just made by
        /// [`poll_acquire`](Self::poll_acquire) or [`poll_try_acquire`](Self::poll_try_acquire).
        #[cfg(feature = "tower")]
        fn grant(permit: Pin<&mut Self::Permit>, cost: Self::Cost) -> Self::Grant;

        /// The key's limit as quota headers announce it, now; `None` for a quota that cannot
        /// say (one kept in Redis).
        #[cfg(feature = "http")]
        fn state(permit: Pin<&mut Self::Permit>) -> Option<crate::stats::LimitState>;

        /// Every limit of the key, each with its dimension's name, now (for a limiter of
        /// several limits per key); empty for the others.
        #[cfg(feature = "http")]
        fn states(_permit: Pin<&mut Self::Permit>) -> Vec<(String, crate::stats::LimitState)> {
            Vec::new()
        }
    }
}

use sealed::{Arrival, KeyedSealed};

/// A limiter with one bucket per key, shared by handle, that
/// [`throttle_by_key`](crate::PaceExt::throttle_by_key) and the keyed tower layer
/// (`paced::tower::RateLimitLayer::keyed`, feature `tower`) draw on: [`KeyedRateLimiter`] in
/// this process and, with the `redis` feature, `RedisKeyedRateLimiter` across processes.
///
/// Each says what a request costs, its `Cost`, as [`Limiter`] does: `u64` for one limit per
/// key, or `[u64; N]` for a `KeyedRateLimiter<K, [u64; N]>` of several limits per key
/// (`|req| [1, req.tokens]`). Generic code that passes one number says so:
/// `Q: KeyedLimiter<Cost = u64>`.
///
/// The key type is the limiter's (`Q: KeyedLimiter<Key = String>` in a bound). As [`Limiter`] is,
/// it is sealed, and its machinery is out of reach: the adapters rely on the exact semantics
/// of these limiters. What each promises to a stream:
///
/// - [`KeyedRateLimiter`], of one limit or several per key: a stream's item waits in its key's
///   FIFO queue like any task, so the
///   stream's items of one key leave in upstream order, FIFO with every other user of the key.
/// - `RedisKeyedRateLimiter`: a stream's item of a key waits by the Redis limiter's own
///   `acquire` (a reservation in Redis, then a local sleep; its retries and its failure
///   policy), one request per key at a time, so the stream's items of one key still leave in
///   upstream order; across processes requests are served in the order they reach Redis. A
///   Redis reply error on a key (a key of another type) neither lets an item through nor
///   fails the stream: its items are held and asked again after 100 ms, then at a backoff up
///   to 1 s, each failure counted in the limiter's `stats().reply_errors` and logged at error
///   level with the `tracing` feature; the other keys go on.
///
/// [`Limiter`]: crate::limiter::Limiter
///
/// # Examples
///
/// ```
/// use futures_util::{Stream, StreamExt};
/// use paced::{KeyedRateLimiter, PaceExt, Rate};
/// use paced::limiter::KeyedLimiter;
///
/// // One function for a local keyed limiter or (with the `redis` feature) one across machines.
/// fn per_tenant<S, Q>(s: S, limiter: &Q) -> impl Stream<Item = (String, u32)>
/// where
///     S: Stream<Item = (String, u32)>,
///     Q: KeyedLimiter<Key = String, Cost = u64>,
/// {
///     s.throttle_by_key(limiter, |m| m.0.clone(), |_| 1, 64)
/// }
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let tenants = KeyedRateLimiter::new(Rate::per_second(1), 1);
/// let messages = ["acme", "acme", "globex"].map(|t| (t.to_string(), 0));
/// let start = tokio::time::Instant::now();
/// let sent: Vec<_> = per_tenant(futures_util::stream::iter(messages), &tenants)
///     .map(|m| (m.0, start.elapsed().as_secs()))
///     .collect()
///     .await;
/// let expected = [("acme", 0), ("globex", 0), ("acme", 1)];
/// assert_eq!(sent, expected.map(|(t, s)| (t.to_string(), s)));
/// # }
/// ```
pub trait KeyedLimiter: KeyedSealed + Clone {}

impl<K: Hash + Eq + Clone, S: BuildHasher> KeyedLimiter for KeyedRateLimiter<K, u64, S> {}

pin_project! {
    /// A stream's item or a request in one key's queue of a [`KeyedRateLimiter`] (not
    /// nameable outside the crate).
    pub struct KeyWaiter<K, S>
    where
        K: Hash,
        K: Eq,
        K: Clone,
        S: BuildHasher,
    {
        #[pin]
        waiter: Waiter<KeyOwned<K, S>>,
    }
}

impl<K: Hash + Eq + Clone, S: BuildHasher> std::fmt::Debug for KeyWaiter<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyWaiter")
            .field("waiter", &self.waiter)
            .finish()
    }
}

/// Offers `cost` of `key` to the table `shared` for a stream's first item of the key: granted,
/// or a waiter (made by `wrap`) that holds the place it took in the key's queue.
fn arrive<K, S, L, P>(
    shared: &Arc<KeyedShared<K, S, L>>,
    (key, hash): (&K, u64),
    cost: L::Cost,
    waker: &Waker,
    wrap: impl FnOnce(Waiter<KeyOwned<K, S, L>>) -> P,
) -> Arrival<P>
where
    K: Hash + Eq + Clone,
    S: BuildHasher,
    L: KeyRule,
{
    // Asked of the key's lane directly, with no waiter: when the limit does not bind, an
    // item costs one hash, one lock and one offer.
    let mut ticket = None;
    match shared.poll(hash, key, &mut ticket, cost, waker, None) {
        // Without a timeout the limiter never refuses.
        Ok(Step::Granted(_)) | Err(_) => Arrival::Granted,
        Ok(step) => {
            // It holds a place in the key's queue now: a waiter takes that place over.
            let handle = KeyOwned::hashed(Arc::clone(shared), key.clone(), hash);
            Arrival::Waiting {
                permit: wrap(Waiter::queued(handle, ticket)),
                // Heading the key's queue, its waiter arms its timer when asked.
                ask: matches!(step, Step::Wait(..)),
            }
        }
    }
}

/// Waits in the key's queue until `cost` is granted (without a timeout the limiter never
/// refuses; it only makes us wait).
fn poll_acquire<K, S, L>(
    waiter: Pin<&mut Waiter<KeyOwned<K, S, L>>>,
    cx: &mut Context<'_>,
    cost: L::Cost,
) -> Poll<()>
where
    K: Hash + Eq + Clone,
    S: BuildHasher,
    L: KeyRule,
{
    waiter.poll_acquire(cx, cost, None).map(|_| ())
}

/// A stream's item (or a request) waits in its key's queue through an engine [`Waiter`].
impl<K: Hash + Eq + Clone, S: BuildHasher> KeyedSealed for KeyedRateLimiter<K, u64, S> {
    type Key = K;
    type Cost = u64;
    type Hasher = S;
    type Permit = KeyWaiter<K, S>;

    fn hash_key(&self, key: &K) -> u64 {
        self.inner.shared.hash(key)
    }

    fn permit(&self, key: K, hash: u64) -> Self::Permit {
        KeyWaiter {
            waiter: Waiter::new(KeyOwned::hashed(self.inner.shared.clone(), key, hash)),
        }
    }

    fn arrive(&self, key: &K, hash: u64, cost: u64, waker: &Waker) -> Arrival<Self::Permit> {
        arrive(&self.inner.shared, (key, hash), cost, waker, |waiter| {
            KeyWaiter { waiter }
        })
    }

    fn poll_acquire(permit: Pin<&mut Self::Permit>, cx: &mut Context<'_>, cost: u64) -> Poll<()> {
        poll_acquire(permit.project().waiter, cx, cost)
    }

    #[cfg(feature = "tower")]
    fn poll_try_acquire(
        permit: Pin<&mut Self::Permit>,
        cx: &mut Context<'_>,
        cost: u64,
    ) -> Poll<Result<(), crate::error::NotUntil>> {
        crate::engine::coop::poll_try_acquire(cx, || {
            permit.waiter.handle().try_acquire(cost).map(|_| ())
        })
    }

    #[cfg(feature = "tower")]
    type Grant = ();

    #[cfg(feature = "tower")]
    #[inline]
    fn grant(_: Pin<&mut Self::Permit>, _: u64) {}

    #[cfg(feature = "http")]
    fn state(permit: Pin<&mut Self::Permit>) -> Option<crate::stats::LimitState> {
        Some(permit.waiter.handle().limit_state())
    }
}

/// One key's place in the queue of a [`KeyedRateLimiter`] of several limits per key.
type MultiWaiter<K, const N: usize, S> = Waiter<KeyOwned<K, S, Limits<N>>>;

/// A stream's item or a request in one key's queue of a [`KeyedRateLimiter`] of several limits
/// per key (not nameable outside the crate): the key, and its place in the key's queue once it
/// waits.
///
/// The waiter is boxed, on its first wait only: it is pinned, and the crate's pinning macro
/// cannot name a const generic (as for `SeveralPermit`).
pub struct KeyMultiWaiter<K: Hash + Eq + Clone, const N: usize, S: BuildHasher> {
    shared: Arc<KeyedShared<K, S, Limits<N>>>,
    /// The dimensions' names, for quota headers.
    #[cfg(feature = "http")]
    names: Arc<[String; N]>,
    key: K,
    hash: u64,
    waiter: Option<Pin<Box<MultiWaiter<K, N, S>>>>,
    /// When the last grant through it was made, in the limiter's time (what a settle needs).
    at: Nanos,
}

/// The waiter is pinned in its box; nothing else is pinned.
impl<K: Hash + Eq + Clone, const N: usize, S: BuildHasher> Unpin for KeyMultiWaiter<K, N, S> {}

impl<K: Hash + Eq + Clone, const N: usize, S: BuildHasher> std::fmt::Debug
    for KeyMultiWaiter<K, N, S>
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyMultiWaiter")
            .field("waiting", &self.waiter.is_some())
            .finish_non_exhaustive()
    }
}

impl<K: Hash + Eq + Clone, const N: usize, S: BuildHasher> KeyedLimiter
    for KeyedRateLimiter<K, [u64; N], S>
{
}

/// As for [`KeyedRateLimiter`], a cost being one amount per dimension.
impl<K: Hash + Eq + Clone, const N: usize, S: BuildHasher> KeyedSealed
    for KeyedRateLimiter<K, [u64; N], S>
{
    type Key = K;
    type Cost = [u64; N];
    type Hasher = S;
    type Permit = KeyMultiWaiter<K, N, S>;

    fn hash_key(&self, key: &K) -> u64 {
        self.inner.shared.hash(key)
    }

    fn permit(&self, key: K, hash: u64) -> Self::Permit {
        KeyMultiWaiter {
            shared: Arc::clone(&self.inner.shared),
            #[cfg(feature = "http")]
            names: Arc::clone(&self.inner.names),
            key,
            hash,
            waiter: None,
            at: Nanos::ZERO,
        }
    }

    fn arrive(&self, key: &K, hash: u64, cost: [u64; N], waker: &Waker) -> Arrival<Self::Permit> {
        arrive(&self.inner.shared, (key, hash), cost, waker, |waiter| {
            KeyMultiWaiter {
                shared: Arc::clone(&self.inner.shared),
                #[cfg(feature = "http")]
                names: Arc::clone(&self.inner.names),
                key: key.clone(),
                hash,
                waiter: Some(Box::pin(waiter)),
                at: Nanos::ZERO,
            }
        })
    }

    fn poll_acquire(
        permit: Pin<&mut Self::Permit>,
        cx: &mut Context<'_>,
        cost: [u64; N],
    ) -> Poll<()> {
        let me = permit.get_mut();
        let waiter = me.waiter.get_or_insert_with(|| {
            let handle = KeyOwned::hashed(Arc::clone(&me.shared), me.key.clone(), me.hash);
            Box::pin(Waiter::new(handle))
        });
        // Without a timeout the limiter never refuses.
        let at = ready!(waiter.as_mut().poll_acquire_at(cx, cost, None));
        me.at = at.unwrap_or(Nanos::ZERO);
        Poll::Ready(())
    }

    #[cfg(feature = "tower")]
    fn poll_try_acquire(
        permit: Pin<&mut Self::Permit>,
        cx: &mut Context<'_>,
        cost: [u64; N],
    ) -> Poll<Result<(), crate::error::NotUntil>> {
        let me = permit.get_mut();
        crate::engine::coop::poll_try_acquire(cx, || {
            me.at = me.shared.try_acquire(me.hash, &me.key, cost)?;
            Ok(())
        })
    }

    /// The key's [`KeyedPermit`], to settle from the response.
    #[cfg(feature = "tower")]
    type Grant = KeyedPermit<K, N, S>;

    #[cfg(feature = "tower")]
    fn grant(permit: Pin<&mut Self::Permit>, cost: [u64; N]) -> KeyedPermit<K, N, S> {
        let me = permit.get_mut();
        KeyedPermit {
            handle: KeyOwned::hashed(Arc::clone(&me.shared), me.key.clone(), me.hash),
            charged: cost,
            at: me.at,
        }
    }

    /// Quota headers of one limit cannot say: the key's limits are announced by `states`.
    #[cfg(feature = "http")]
    fn state(_: Pin<&mut Self::Permit>) -> Option<crate::stats::LimitState> {
        None
    }

    /// Every limit of the key, as a [`RateLimiter`](crate::RateLimiter) announces
    /// its own: the key's state, or its limits as new for a key with none.
    #[cfg(feature = "http")]
    fn states(permit: Pin<&mut Self::Permit>) -> Vec<(String, crate::stats::LimitState)> {
        let me = permit.get_mut();
        let mut out = Vec::new();
        // Read through a correction that changes nothing (and wakes nobody): the table's one
        // way to reach a key's rule, its state if it has one, else a fresh rule of its limits
        // (own or the builder's), forgotten again at once.
        me.shared.correct(me.hash, &me.key, |limits, now| {
            out = super::multi::announced(limits, &me.names, now);
            false
        });
        out
    }
}
