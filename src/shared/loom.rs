//! Model checks of the shared state's locking protocol with loom: every interleaving of
//! two or three threads that grant, queue and cancel at once.
//!
//! Run with `RUSTFLAGS="--cfg pacer_loom" cargo test --lib --release loom`. (`--cfg loom`
//! would also switch tokio to its own loom build, which does not compile as a dependency.)

use std::task::Waker;

use loom::sync::Arc;
use loom::thread;

use super::{Shared, Step};
use crate::core::{Bucket, Nanos, Window};

const AT_ONCE: Nanos = Nanos(0);
const LATER: Nanos = Nanos(1_000_000);

/// Polls a request at `now` until it is granted or queued; returns whether it was granted.
fn ask<R: super::Rule>(shared: &Shared<R>, ticket: &mut Option<u64>, now: Nanos) -> bool {
    matches!(
        shared.poll_at(now, ticket, 1, Waker::noop()),
        Ok(Step::Granted)
    )
}

#[test]
fn grants_never_exceed_the_burst_and_cancel_leaves_nothing() {
    loom::model(|| {
        // Two tokens, refilled one per 1_000 ns; time stands still at 0 while they race.
        let shared = Arc::new(Shared::new(Bucket::new(1, 1_000, 2)));

        let trier = {
            let shared = shared.clone();
            thread::spawn(move || usize::from(shared.try_acquire_at(AT_ONCE, 1).is_ok()))
        };
        let quitter = {
            let shared = shared.clone();
            thread::spawn(move || {
                let mut ticket = None;
                let granted = ask(&shared, &mut ticket, AT_ONCE);
                if let Some(ticket) = ticket.take() {
                    shared.cancel(ticket);
                }
                usize::from(granted)
            })
        };
        let mut ticket = None;
        let mut mine = usize::from(ask(&shared, &mut ticket, AT_ONCE));

        let (tried, quit) = (trier.join().unwrap(), quitter.join().unwrap());
        let at_once = tried + quit + mine;
        assert!(at_once <= 2, "{at_once} grants from a bucket of 2");
        // Whoever queued and stayed is served once the tokens are back, exactly once.
        if ticket.is_some() {
            assert!(
                ask(&shared, &mut ticket, LATER),
                "the queue was left blocked"
            );
            mine += 1;
        }
        assert!(ticket.is_none());
        assert_eq!(mine, 1);
        let stats = shared.stats();
        assert_eq!(stats.waiting, 0, "a cancelled request stayed queued");
        assert_eq!(
            stats.granted as usize,
            tried + quit + mine,
            "a grant counted twice"
        );
    });
}

#[test]
fn a_cancelled_head_hands_over_to_the_next() {
    loom::model(|| {
        let shared = Arc::new(Shared::new(Window::new(1, LATER)));
        // Take the only permit, so that both requests below must queue.
        assert!(shared.try_acquire_at(AT_ONCE, 1).is_ok());

        let quitter = {
            let shared = shared.clone();
            thread::spawn(move || {
                let mut ticket = None;
                assert!(!ask(&shared, &mut ticket, AT_ONCE));
                if let Some(ticket) = ticket {
                    shared.cancel(ticket);
                }
            })
        };
        let mut ticket = None;
        assert!(!ask(&shared, &mut ticket, AT_ONCE));
        quitter.join().unwrap();
        // Whatever the interleaving, the survivor heads the queue and gets the permit when it
        // comes back, once.
        assert!(ask(&shared, &mut ticket, LATER));
        assert_eq!(shared.stats().granted, 2);
        assert_eq!(shared.stats().waiting, 0);
        assert_eq!(
            shared.poll_at(LATER, &mut None, 1, Waker::noop()),
            Ok(Step::Wait(Nanos(2 * LATER.0)))
        );
    });
}
