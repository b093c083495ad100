//! The order of one quota's reservations within this process, kept across the round trip:
//! what both Redis limiters use to serve their waiters in the order Redis charged them.

use std::future::Future;
use std::sync::Arc;
use std::task::{Poll, Waker};

use crate::sync::{lock, Mutex};

/// The order in which one quota's reservations left this process, which is the order Redis
/// charged them in (one ordered connection): each reservation takes a ticket as it is sent,
/// and once it has slept out its wait it also waits until every earlier ticket is used or
/// given up. A reservation's wait is counted from when its reply is read, so without this a
/// reply read late (a busy thread) could let a later reservation of the quota go first.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    state: Mutex<TurnsState>,
    /// Held while a reservation takes its ticket and hands its request to the connection.
    sending: Mutex<()>,
}

#[derive(Debug, Default)]
struct TurnsState {
    next: u64,
    /// The tickets not used nor given up yet, with the waker of each one waiting its turn.
    pending: std::collections::BTreeMap<u64, Option<Waker>>,
}

impl Turns {
    /// Runs `trip`, a reservation's round trip, and gives it a ticket as it is sent.
    ///
    /// The ticket is taken with the call's first poll, which hands the request to the
    /// connection (the `redis` crate queues it there), under the `sending` lock: tickets follow
    /// the order in which the requests reach the connection, which is the order Redis charges
    /// them in (two tasks on two threads could otherwise take tickets in one order and send in
    /// the other, and the first would then wait for the second's turn).
    pub(crate) async fn send<F: Future>(self: &Arc<Self>, trip: F) -> (Turn, F::Output) {
        let mut trip = std::pin::pin!(trip);
        let (turn, first) = std::future::poll_fn(|cx| {
            let _sending = lock(&self.sending);
            let first = trip.as_mut().poll(cx);
            Poll::Ready((self.take(), first))
        })
        .await;
        let answer = match first {
            Poll::Ready(answer) => answer,
            Poll::Pending => trip.await,
        };
        (turn, answer)
    }

    /// Whether no reservation of the quota is in flight or waiting its turn.
    pub(crate) fn is_idle(&self) -> bool {
        lock(&self.state).pending.is_empty()
    }

    /// A ticket behind every reservation sent before.
    fn take(self: &Arc<Self>) -> Turn {
        let mut st = lock(&self.state);
        let ticket = st.next;
        st.next += 1;
        st.pending.insert(ticket, None);
        Turn {
            turns: self.clone(),
            ticket,
        }
    }
}

/// One reservation's place in its quota's order; dropping it (used or given up) lets the next
/// one go.
#[derive(Debug)]
pub(crate) struct Turn {
    turns: Arc<Turns>,
    ticket: u64,
}

impl Turn {
    /// Waits until every reservation sent before this one is used or given up.
    pub(crate) async fn come(&self) {
        std::future::poll_fn(|cx| {
            let mut st = lock(&self.turns.state);
            if st.pending.keys().next() == Some(&self.ticket) {
                return Poll::Ready(());
            }
            st.pending.insert(self.ticket, Some(cx.waker().clone()));
            Poll::Pending
        })
        .await;
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let next = {
            let mut st = lock(&self.turns.state);
            st.pending.remove(&self.ticket);
            st.pending.values_mut().next().and_then(Option::take)
        };
        if let Some(waker) = next {
            waker.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Turns;

    #[tokio::test]
    async fn a_reservation_goes_after_every_one_sent_before_it() {
        use std::sync::Arc;
        use tokio_test::{assert_pending, assert_ready, task};

        let turns = Arc::new(Turns::default());
        let (first, second, third) = (turns.take(), turns.take(), turns.take());
        let mut third_comes = task::spawn(async move {
            third.come().await;
            third
        });
        assert_pending!(third_comes.poll());
        // The second gives up (dropped, refused): the third still waits for the first.
        drop(second);
        assert!(!third_comes.is_woken());
        assert_pending!(third_comes.poll());
        let mut first_comes = task::spawn(first.come());
        assert_ready!(first_comes.poll());
        drop(first_comes);
        // The first is used: the third's turn, and it is woken for it.
        drop(first);
        assert!(third_comes.is_woken());
        let third = assert_ready!(third_comes.poll());
        // A ticket taken now waits for the third only.
        let fourth = turns.take();
        let mut fourth_comes = task::spawn(fourth.come());
        assert_pending!(fourth_comes.poll());
        drop(third);
        assert!(fourth_comes.is_woken());
        assert_ready!(fourth_comes.poll());
    }
}
