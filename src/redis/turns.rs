//! The order of one quota's reservations within this process: what every Redis limiter uses
//! to release its waiters at the instants Redis charged them, in Redis's order.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};

use crate::sync::{lock, Mutex};

/// One quota's reservations in this process: those in flight (sent, not answered yet) and
/// those granted that wait for their instant.
///
/// The order comes from Redis's answer: each grant carries the Redis instant it was charged
/// for, and a reservation that has slept out its wait also waits for every grant of this
/// process for an earlier instant. While a reservation sent before it is still in flight, it
/// waits for that answer too (a reply read late could be for an earlier instant), but never
/// longer: on a multi-thread runtime tasks reach the connection in an order of their own, so
/// the order of sending only stands in for Redis's until Redis has answered.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    state: Mutex<TurnsState>,
    /// Held while a reservation takes its ticket and hands its request to the connection, so
    /// that tickets follow the order of sending as closely as the client allows.
    sending: Mutex<()>,
    /// The connection's, shared by every quota of the limiter.
    warmth: Arc<Warmth>,
}

/// Whether a round trip on a limiter's connection has come back. Until then the connection
/// may not be made yet, and requests waiting for it would be sent in an order of the client's:
/// so the first round trip goes alone, and the others queue (in the order they asked) on
/// `first`.
#[derive(Debug, Default)]
pub(crate) struct Warmth {
    warm: AtomicBool,
    first: tokio::sync::Mutex<()>,
    /// How many queue on `first` or hold it: while any do, those who come later queue too.
    queued: AtomicUsize,
}

#[derive(Debug, Default)]
struct TurnsState {
    /// Tickets in the order of sending.
    next: u64,
    /// The tickets of round trips sent and not answered yet.
    in_flight: BTreeSet<u64>,
    /// The grants not used nor given up yet, by (Redis instant, ticket), with the waker of
    /// each one waiting its turn.
    waiting: BTreeMap<(u64, u64), Option<Waker>>,
    /// Requests that found the lease short and are not granted yet (see [`Asking`]).
    asking: usize,
}

impl TurnsState {
    /// Whether the grant `ticket` may go: no grant for an earlier instant waits, and no round
    /// trip sent before it is unanswered.
    fn may_go(&self, ticket: (u64, u64)) -> bool {
        self.waiting
            .keys()
            .next()
            .is_none_or(|first| first.0 >= ticket.0)
            && self.in_flight.first().is_none_or(|&sent| sent > ticket.1)
    }

    /// The wakers of the grants that may go now.
    fn woken(&mut self) -> Vec<Waker> {
        let Some(&(first_at, _)) = self.waiting.keys().next() else {
            return Vec::new();
        };
        let sent = self.in_flight.first().copied().unwrap_or(u64::MAX);
        self.waiting
            .iter_mut()
            .take_while(|(k, _)| k.0 == first_at)
            .filter(|(k, _)| k.1 < sent)
            .filter_map(|(_, w)| w.take())
            .collect()
    }
}

/// Counted in [`Turns::queued`] while alive.
struct Queued<'a>(&'a AtomicUsize);

impl<'a> Queued<'a> {
    fn new(count: &'a AtomicUsize) -> Queued<'a> {
        count.fetch_add(1, Ordering::AcqRel);
        Queued(count)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A round trip in flight until it is answered or dropped.
struct InFlight<'a> {
    turns: &'a Turns,
    ticket: u64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.turns.release(|st| {
            st.in_flight.remove(&self.ticket);
        });
    }
}

impl Turns {
    /// The turns of one quota on a connection whose warmth is `warmth`.
    pub(crate) fn new(warmth: Arc<Warmth>) -> Turns {
        Turns {
            state: Mutex::default(),
            sending: Mutex::default(),
            warmth,
        }
    }

    /// Takes a round trip or a grant out of the state with `remove`, then wakes the grants
    /// that may go now, once the lock is released.
    fn release(&self, remove: impl FnOnce(&mut TurnsState)) {
        let woken = {
            let mut st = lock(&self.state);
            remove(&mut st);
            st.woken()
        };
        for waker in woken {
            waker.wake();
        }
    }

    /// Runs `trip`, a reservation's round trip, with a ticket taken as it is sent (with the
    /// call's first poll, which hands the request to the connection); an answer for which
    /// `granted_at` gives a Redis instant (in microseconds) takes its place among the quota's
    /// grants in the same step, so that the quota never looks idle between the two.
    pub(crate) async fn send<F: Future>(
        self: &Arc<Self>,
        trip: F,
        granted_at: impl FnOnce(&F::Output) -> Option<u64>,
    ) -> (Option<Turn>, F::Output) {
        // Outside the cooperative budget: a spent budget would make the client's send (a
        // bounded channel, served in the order of asking) return before taking its place.
        let mut trip = std::pin::pin!(tokio::task::unconstrained(trip));
        // Those that queued while the connection was cold are sent in their order, one by
        // one: each holds the gate until its request is handed over.
        let warmth = &*self.warmth;
        let mut gate = None;
        if !warmth.warm.load(Ordering::Acquire) || warmth.queued.load(Ordering::Acquire) > 0 {
            let queued = Queued::new(&warmth.queued);
            let lock = tokio::task::unconstrained(warmth.first.lock()).await;
            gate = Some((lock, queued));
        }
        let first_trip = gate.is_some() && !warmth.warm.load(Ordering::Acquire);
        let (in_flight, first) = std::future::poll_fn(|cx| {
            let _sending = lock(&self.sending);
            let first = trip.as_mut().poll(cx);
            let mut st = lock(&self.state);
            let ticket = st.next;
            st.next += 1;
            st.in_flight.insert(ticket);
            Poll::Ready((
                InFlight {
                    turns: self,
                    ticket,
                },
                first,
            ))
        })
        .await;
        if !first_trip {
            drop(gate.take());
        }
        let answer = match first {
            Poll::Ready(answer) => answer,
            Poll::Pending => trip.await,
        };
        if first_trip {
            warmth.warm.store(true, Ordering::Release);
            drop(gate);
        }
        let turn = granted_at(&answer).map(|at| {
            let ticket = (at, in_flight.ticket);
            lock(&self.state).waiting.insert(ticket, None);
            Turn {
                turns: self.clone(),
                ticket,
            }
        });
        drop(in_flight);
        (turn, answer)
    }

    /// Whether no request of this process for the quota waits: none found the lease short,
    /// none is in flight, none waits its turn. A lease grants only then.
    pub(crate) fn is_idle(&self) -> bool {
        let st = lock(&self.state);
        st.asking == 0 && st.in_flight.is_empty() && st.waiting.is_empty()
    }

    /// Counts a request that found the lease short until the returned guard is dropped: to be
    /// called under the lock under which the lease was found short, so that no lease grant
    /// passes the request between its look at the lease and its round trip.
    pub(crate) fn ask(self: &Arc<Self>) -> Asking {
        lock(&self.state).asking += 1;
        Asking(self.clone())
    }
}

/// A request of this process that found its quota's lease short, until it is granted or gives
/// up: meanwhile the quota is not idle, and a lease grants no later request before it.
#[derive(Debug)]
pub(crate) struct Asking(Arc<Turns>);

impl Drop for Asking {
    fn drop(&mut self) {
        lock(&self.0.state).asking -= 1;
    }
}

/// One grant's place in its quota's order; dropping it (used or given up) lets the grants of
/// the next instant go.
#[derive(Debug)]
pub(crate) struct Turn {
    turns: Arc<Turns>,
    ticket: (u64, u64),
}

impl Turn {
    /// Waits until every grant of this process for an earlier Redis instant is used or given
    /// up, and every round trip sent before this one is answered. Grants for the same instant
    /// do not wait for one another.
    pub(crate) async fn come(&self) {
        std::future::poll_fn(|cx| {
            let mut st = lock(&self.turns.state);
            if st.may_go(self.ticket) {
                return Poll::Ready(());
            }
            st.waiting.insert(self.ticket, Some(cx.waker().clone()));
            Poll::Pending
        })
        .await;
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.turns.release(|st| {
            st.waiting.remove(&self.ticket);
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio_test::{assert_pending, assert_ready, task};

    use super::{Turn, Turns};

    async fn granted(turns: &Arc<Turns>, at: u64) -> Turn {
        let (turn, ()) = turns.send(async {}, |_| Some(at)).await;
        turn.expect("granted")
    }

    #[tokio::test]
    async fn a_grant_goes_after_every_grant_for_an_earlier_instant() {
        let turns = Arc::new(Turns::default());
        // Answered out of Redis's order: the grant for 30 first, then 10 and 20.
        let third = granted(&turns, 30).await;
        let first = granted(&turns, 10).await;
        let second = granted(&turns, 20).await;
        let mut third_comes = task::spawn(async move {
            third.come().await;
            third
        });
        assert_pending!(third_comes.poll());
        // The one for 20 gives up: the one for 30 still waits for 10's.
        drop(second);
        assert!(!third_comes.is_woken());
        assert_pending!(third_comes.poll());
        let mut first_comes = task::spawn(first.come());
        assert_ready!(first_comes.poll());
        drop(first_comes);
        drop(first);
        assert!(third_comes.is_woken());
        let third = assert_ready!(third_comes.poll());
        // A grant for a later instant answered now waits for 30's only.
        let fourth = granted(&turns, 40).await;
        let mut fourth_comes = task::spawn(fourth.come());
        assert_pending!(fourth_comes.poll());
        drop(third);
        assert!(fourth_comes.is_woken());
        assert_ready!(fourth_comes.poll());
    }

    #[tokio::test]
    async fn grants_for_one_instant_do_not_wait_for_one_another() {
        let turns = Arc::new(Turns::default());
        let early = granted(&turns, 5).await;
        let (a, b) = (granted(&turns, 7).await, granted(&turns, 7).await);
        let mut a_comes = task::spawn(async move { a.come().await });
        let mut b_comes = task::spawn(async move { b.come().await });
        assert_pending!(a_comes.poll());
        assert_pending!(b_comes.poll());
        drop(early);
        assert!(a_comes.is_woken() && b_comes.is_woken());
        assert_ready!(a_comes.poll());
        assert_ready!(b_comes.poll());
    }

    #[tokio::test]
    async fn the_quota_is_busy_from_the_send_until_the_grant_is_used() {
        let turns = Arc::new(Turns::default());
        assert!(turns.is_idle());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let mut sending = task::spawn({
            let turns = turns.clone();
            async move { turns.send(rx, |_| Some(1)).await }
        });
        assert_pending!(sending.poll());
        assert!(!turns.is_idle(), "in flight");
        tx.send(()).unwrap();
        let (turn, _) = assert_ready!(sending.poll());
        assert!(!turns.is_idle(), "granted, not used");
        drop(turn);
        assert!(turns.is_idle());
        // A refusal, and a round trip dropped in flight, leave nothing behind.
        let (turn, ()) = turns.send(async {}, |_| None).await;
        assert!(turn.is_none() && turns.is_idle());
        let mut dropped = task::spawn({
            let turns = turns.clone();
            async move { turns.send(std::future::pending::<()>(), |_| Some(1)).await }
        });
        assert_pending!(dropped.poll());
        assert!(!turns.is_idle());
        drop(dropped);
        assert!(turns.is_idle());
    }
}
