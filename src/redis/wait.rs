//! What every Redis limiter's acquisitions share, whatever their shape: how a wait ends
//! without a grant, the cooperative budget of a grant that needed no wait, the backoff and
//! failure policy of outages, the race of the fail-open fallback against Redis's recovery.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

use super::error::RedisLimiterError;
use super::policy::FailurePolicy;
use super::script::{Failure, REPLY_BACKOFF_MAX};
use super::turns::Asking;
use crate::core::Nanos;
use crate::engine::coop::poll_budget;
use crate::error::NotUntil;

/// How a waiting acquisition ended without a grant (of either Redis limiter).
pub(super) enum WaitError {
    Limiter(RedisLimiterError),
    Refused(NotUntil),
}

/// Spends one unit of the task's cooperative budget on a grant that needed no wait, yielding
/// first if the budget is spent.
pub(super) async fn spend_budget() {
    std::future::poll_fn(poll_budget).await.made_progress();
}

/// The turn to refill a quota's lease (one task at a time; the others queue here and take
/// from the lease it brings back), waited for until `deadline` (`Some(None)`: beyond time)
/// if given; refused with a retry of 1 ms once that passes.
pub(super) async fn refill_turn(
    refill: &Arc<tokio::sync::Mutex<()>>,
    deadline: Option<Option<Instant>>,
) -> Result<OwnedMutexGuard<()>, WaitError> {
    let lock = refill.clone().lock_owned();
    match deadline {
        Some(Some(d)) => tokio::time::timeout_at(d, lock)
            .await
            .map_err(|_| WaitError::Refused(NotUntil::after(Duration::from_millis(1)))),
        _ => Ok(lock.await),
    }
}

/// A reservation that Redis refused: with a deadline, the refusal. Without one it is
/// otherwise never refused; should the script say so, it waits (at most 1 s) to ask again.
/// Refused for ever (the debts ahead of it take 584 years or more), it waits for ever, as in
/// process, having let go of its refill turn and its place among the waiters: waiting for
/// nothing, it holds no lock and no place.
pub(super) async fn on_refusal(
    wait: Nanos,
    timed: bool,
    refilling: Option<OwnedMutexGuard<()>>,
    asking: &mut Option<Asking>,
) -> Result<(), WaitError> {
    if timed {
        return Err(WaitError::Refused(NotUntil::new(wait)));
    }
    if wait == Nanos::MAX {
        drop(refilling);
        drop(asking.take());
        return std::future::pending().await;
    }
    let wait = wait.to_duration();
    tokio::time::sleep(wait.clamp(Duration::from_millis(1), Duration::from_secs(1))).await;
    Ok(())
}

/// A quota's gate, closed while tokens of it go back to Redis in the background: its next
/// round trips wait at it, so that Redis charges them after the tokens are back.
pub(super) type Gate = Arc<tokio::sync::Mutex<()>>;

/// A new gate, and what keeps it closed until dropped.
pub(super) fn closed_gate() -> (Gate, OwnedMutexGuard<()>) {
    let gate = Gate::default();
    let closed = gate.clone().try_lock_owned();
    (gate, closed.expect("a new mutex is unlocked"))
}

/// After waiting at `gate`: opens `slot` if it still holds that gate (its task went away
/// without opening it: a runtime shutting down).
pub(super) fn forget_gate(slot: &mut Option<Gate>, gate: &Gate) {
    if slot.as_ref().is_some_and(|g| Arc::ptr_eq(g, gate)) {
        *slot = None;
    }
}

/// A reply error met by a waiting acquisition: returned, unless it is `patient` (a stream's
/// or a tower future's, which holds its item or request). Then it asks again after
/// `backoff`, which doubles up to [`REPLY_BACKOFF_MAX`]: granting without Redis's say-so could
/// exceed the quota, and the key may be repaired meanwhile.
async fn on_reply_error(
    e: redis::RedisError,
    patient: bool,
    backoff: &mut Duration,
) -> Result<(), WaitError> {
    if !patient {
        return Err(WaitError::Limiter(RedisLimiterError::Reply(e)));
    }
    tokio::time::sleep(*backoff).await;
    *backoff = (*backoff * 2).min(REPLY_BACKOFF_MAX);
    Ok(())
}

/// A waiting acquisition's failed round trips, of either Redis limiter: for outages the
/// fail-closed backoff (from 10 ms, doubling up to the policy's `max_backoff`) and deadline,
/// counted from the first failed round trip; for reply errors a patient wait's backoff.
pub(super) struct Outages {
    backoff: Duration,
    since: Option<Instant>,
    reply_backoff: Duration,
}

impl Outages {
    pub(super) fn new() -> Outages {
        Outages {
            backoff: Duration::from_millis(10),
            since: None,
            reply_backoff: Duration::from_millis(100),
        }
    }

    /// After a round trip sent at `attempt` failed: a reply error as [`on_reply_error`] says
    /// (retried if `patient`); an outage as [`wait_out`](Self::wait_out) says, within the
    /// `deadline` if given (`Some(None)`: beyond time), a wait without one giving up past the
    /// policy's deadline unless `patient`. Under `FailOpen`, the share for the caller's
    /// fallback.
    pub(super) async fn after(
        &mut self,
        failure: Failure,
        policy: FailurePolicy,
        attempt: Instant,
        deadline: Option<Option<Instant>>,
        patient: bool,
    ) -> Result<Option<f64>, WaitError> {
        match failure {
            Failure::Reply(e) => {
                on_reply_error(e, patient, &mut self.reply_backoff).await?;
                Ok(None)
            }
            Failure::Outage(e) => {
                let left = match deadline {
                    Some(Some(d)) => Some(d.saturating_duration_since(Instant::now())),
                    _ => None,
                };
                let gives_up = deadline.is_none() && !patient;
                self.wait_out(policy, e, attempt, left, gives_up).await
            }
        }
    }

    /// After a round trip sent at `attempt` failed for an outage `e`: under `FailClosed`,
    /// pauses (at most the `left` of a deadline, refusing once none is left) or, for a wait
    /// that `gives_up`, gives up past the policy's deadline; under `FailOpen`, returns the
    /// share for the caller's fallback.
    pub(super) async fn wait_out(
        &mut self,
        policy: FailurePolicy,
        e: redis::RedisError,
        attempt: Instant,
        left: Option<Duration>,
        gives_up: bool,
    ) -> Result<Option<f64>, WaitError> {
        let since = *self.since.get_or_insert(attempt);
        match policy {
            FailurePolicy::FailClosed {
                max_backoff,
                deadline: give_up_after,
            } => {
                let mut pause = self.backoff;
                if let Some(left) = left {
                    if left.is_zero() {
                        return Err(WaitError::Refused(NotUntil::after(self.backoff)));
                    }
                    pause = pause.min(left);
                } else if gives_up && since.elapsed() >= give_up_after {
                    return Err(WaitError::Limiter(RedisLimiterError::Unavailable(e)));
                }
                tokio::time::sleep(pause).await;
                self.backoff = (self.backoff * 2).min(max_backoff.max(Duration::from_millis(1)));
                Ok(None)
            }
            FailurePolicy::FailOpen { share } => Ok(Some(share)),
        }
    }
}

/// Waits on the fail-open fallback in charge until `until`: `grant` is its acquisition (with
/// the caller's deadline, if any). Each time the fallback's second in charge ends, it asks
/// whether Redis answers (`probe`: `None` if it does, else the end of the fallback's next
/// second), keeping its place on the fallback meanwhile: a cost the fallback takes more than a
/// second to refill is granted as debt, as in process, while the outage lasts. Once Redis
/// answers it leaves the fallback (`Ok(None)`: the caller asks Redis), so that nobody is
/// granted by a fallback long after Redis is back.
pub(super) async fn on_fallback<T, G, P>(
    grant: G,
    mut until: Instant,
    mut probe: impl FnMut() -> P,
) -> Result<Option<T>, WaitError>
where
    G: Future<Output = Result<T, NotUntil>>,
    P: Future<Output = Option<Instant>>,
{
    let mut grant = std::pin::pin!(grant);
    loop {
        let second = tokio::time::sleep_until(until);
        if let First::Granted(granted) = first_of(grant.as_mut(), second).await {
            return granted.map(Some).map_err(WaitError::Refused);
        }
        match first_of(grant.as_mut(), probe()).await {
            First::Granted(granted) => return granted.map(Some).map_err(WaitError::Refused),
            First::Other(None) => return Ok(None),
            First::Other(Some(next)) => until = next,
        }
    }
}

/// Which of two futures completed first.
enum First<G, O> {
    Granted(G),
    Other(O),
}

/// Polls `grant`, then `other`, until one completes; `grant` stays where it is (its place in
/// a queue) if `other` completes first.
async fn first_of<G: Future, O: Future>(
    mut grant: std::pin::Pin<&mut G>,
    other: O,
) -> First<G::Output, O::Output> {
    let mut other = std::pin::pin!(other);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(granted) = grant.as_mut().poll(cx) {
            return Poll::Ready(First::Granted(granted));
        }
        other.as_mut().poll(cx).map(First::Other)
    })
    .await
}

/// `acquire`'s pause before asking again after a refusal (only a wait with a deadline is
/// refused; should one without be, it asks again): the refusal's wait, within [1 ms, 1 s].
pub(super) async fn pause_after(refused: NotUntil) {
    let pause = refused.retry_after().min(Duration::from_secs(1));
    tokio::time::sleep(pause.max(Duration::from_millis(1))).await;
}
