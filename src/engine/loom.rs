//! Model checks of the shared state's locking protocol with loom: every interleaving of
//! two or three threads that grant, queue and cancel at once.
//!
//! Run with `RUSTFLAGS="--cfg paced_loom" cargo test --lib --release loom`. (`--cfg loom`
//! would also switch tokio to its own loom build, which does not compile as a dependency.)

use std::task::Waker;

use loom::sync::Arc;
use loom::thread;

use super::{Shared, Step};
use crate::core::{Bucket, Limits, Nanos, Rule, Tagged, Window};
use crate::timer::Lateness;

const AT_ONCE: Nanos = Nanos(0);
const LATER: Nanos = Nanos(1_000_000);

/// Polls a request at `now` until it is granted or queued; returns whether it was granted.
fn ask<R: crate::core::Pace<Cost = u64>>(
    shared: &Shared<R>,
    ticket: &mut Option<u64>,
    now: Nanos,
) -> bool {
    matches!(
        shared.poll_at(Some(now), ticket, 1, Waker::noop(), None),
        Ok(Step::Granted(_))
    )
}

/// A thread that tries `tries` lock-free grants of 1 at `now`; it ends with how many it got.
fn spawn_trier(
    shared: &Arc<Shared<Bucket>>,
    now: Nanos,
    tries: usize,
) -> thread::JoinHandle<usize> {
    let shared = shared.clone();
    thread::spawn(move || {
        (0..tries)
            .filter(|_| shared.try_acquire_at(Some(now), 1).is_ok())
            .count()
    })
}

#[test]
fn grants_never_exceed_the_burst_and_cancel_leaves_nothing() {
    loom::model(|| {
        // Two tokens, refilled one per 1_000 ns; time stands still at 0 while they race.
        let shared = Arc::new(Shared::new(Bucket::new(1, 1_000, 2)));

        let trier = spawn_trier(&shared, AT_ONCE, 1);
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
        assert!(shared.try_acquire_at(Some(AT_ONCE), 1).is_ok());

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
            shared.poll_at(Some(LATER), &mut None, 1, Waker::noop(), None),
            Ok(Step::Wait(Nanos(2 * LATER.0), Lateness::Costly))
        );
    });
}

#[test]
fn a_lock_free_grant_never_overtakes_a_waiter() {
    loom::model(|| {
        // One token, back after LATER.
        let shared = Arc::new(Shared::new(Bucket::new(1, u128::from(LATER.0), 1)));
        assert!(shared.try_acquire_at(Some(AT_ONCE), 1).is_ok());

        let trier = spawn_trier(&shared, LATER, 1);
        // Queues: the token is not back at AT_ONCE.
        let mut ticket = None;
        assert!(!ask(&shared, &mut ticket, AT_ONCE));
        let tried = trier.join().unwrap() == 1;
        // The token that comes back at LATER goes to exactly one of them: to the waiter if it
        // queued first (a lock-free grant may not overtake it), else to the trier.
        let waited = ask(&shared, &mut ticket, LATER);
        assert!(tried != waited, "tried {tried}, waiter granted {waited}");
        if !waited {
            assert!(ask(&shared, &mut ticket, Nanos(2 * LATER.0)));
        }
        assert_eq!(shared.stats().granted, 2 + u64::from(tried));
    });
}

#[test]
fn a_rate_change_racing_lock_free_grants_keeps_the_level() {
    loom::model(|| {
        // Two tokens, one back per 1_000 ns.
        let shared = Arc::new(Shared::new(Bucket::new(1, 1_000, 2)));

        let trier = spawn_trier(&shared, AT_ONCE, 2);
        // Three tokens per 1_000 ns from now on: a new unit of time, and a new offset.
        shared.update_at(Some(AT_ONCE), |b, now| b.set_rate(now, 3, 1_000));
        let granted = trier.join().unwrap();
        // Both tokens were there, whenever the change came: both grants went through, and
        // the level (0 tokens) was kept across the change.
        assert_eq!(granted, 2);
        assert!(shared.try_acquire_at(Some(AT_ONCE), 1).is_err());
        // At the new rate a token is back after 333.3 ns, rounded up, not after 1_000 ns.
        assert!(shared.try_acquire_at(Some(Nanos(333)), 1).is_err());
        assert!(shared.try_acquire_at(Some(Nanos(334)), 1).is_ok());
        assert_eq!(shared.stats().granted, 3);
    });
}

#[test]
fn a_rate_change_racing_a_refusal_refuses_by_one_rate() {
    loom::model(|| {
        // Empty, one token back per 1_000 ns; the rate is raised to one per 10 ns.
        let shared = Arc::new(Shared::new(Bucket::new(1, 1_000, 1)));
        assert!(shared.try_acquire_at(Some(AT_ONCE), 1).is_ok());

        let trier = {
            let shared = shared.clone();
            thread::spawn(move || shared.try_acquire_at(Some(AT_ONCE), 1))
        };
        shared.update_at(Some(AT_ONCE), |b, now| b.set_rate(now, 100, 1_000));
        // Refused either way; the wait is the old rate's or the new one's, never a mix.
        let refused = trier.join().unwrap().unwrap_err().retry_after();
        assert!(
            refused == std::time::Duration::from_nanos(1_000)
                || refused == std::time::Duration::from_nanos(10),
            "{refused:?}"
        );
    });
}

#[test]
fn a_settle_racing_a_waiter_admits_it_once() {
    loom::model(|| {
        // One token, taken; its grant is settled to nothing while another request arrives.
        let bucket = Rule::Bucket(Bucket::new(1, 1_000_000_000, 1));
        let shared = Arc::new(Shared::new(Limits::<1>::new(vec![Tagged {
            dim: 0,
            rule: bucket,
        }])));
        assert!(shared.try_acquire_at(Some(AT_ONCE), [1]).is_ok());
        let settler = {
            let shared = shared.clone();
            thread::spawn(move || {
                shared.correct(|limits, _| limits.settle(AT_ONCE, AT_ONCE, [1], [0]));
            })
        };
        let mut ticket = None;
        let poll = |ticket: &mut Option<u64>| {
            matches!(
                shared.poll_at(Some(AT_ONCE), ticket, [1], Waker::noop(), None),
                Ok(Step::Granted(_))
            )
        };
        let first = poll(&mut ticket);
        settler.join().unwrap();
        // Before the settle it queued; after it, it goes (the token given back).
        assert!(first || poll(&mut ticket));
        assert!(shared.try_acquire_at(Some(AT_ONCE), [1]).is_err());
    });
}

#[test]
fn striped_counts_are_exact_as_threads_come_and_go() {
    use super::striped::Striped;
    // One preemption between a thread's load and store of a stripe is enough to lose a count;
    // the bound keeps the three threads' interleavings to a few seconds.
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(2);
    model.check(|| {
        // Under loom a counter has one owned stripe and the shared one: of three threads at
        // once two add on the shared stripe together (or some own the stripe in turn, one
        // ending before the next claims it), and a thread that ends hands its stripe on.
        let counter = Arc::new(Striped::default());
        let adders: Vec<_> = (0..3)
            .map(|_| {
                let counter = counter.clone();
                thread::spawn(move || counter.increment())
            })
            .collect();
        for adder in adders {
            adder.join().unwrap();
        }
        counter.increment();
        assert_eq!(counter.sum(), 4);
    });
}
