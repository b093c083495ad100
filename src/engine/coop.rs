//! tokio's cooperative budget for grants that need no wait: a task that loops on a limiter
//! whose tokens are free yields to the runtime as it would on a tokio `Semaphore`.

use std::task::{Context, Poll};

pub(crate) use tokio::task::coop::RestoreOnPending as Budget;

/// Takes one unit of the task's budget, or registers the task to be polled again and answers
/// `Pending` when the budget is spent. Call it before granting without a wait; call
/// [`Budget::made_progress`] once the grant is made (dropping the value without it gives the
/// unit back).
///
/// Outside a tokio runtime (or inside `tokio::task::unconstrained`) it always answers `Ready`.
#[inline]
pub(crate) fn poll_budget(cx: &mut Context<'_>) -> Poll<Budget> {
    tokio::task::coop::poll_proceed(cx)
}

/// Asks `try_acquire` from a poll (an enforcing stream, Sink or tower layer), spending a unit
/// of the task's budget if it grants: an answer that takes nothing (a refusal) gives it back.
#[inline]
pub(crate) fn poll_try_acquire(
    cx: &mut Context<'_>,
    try_acquire: impl FnOnce() -> Result<(), crate::error::NotUntil>,
) -> Poll<Result<(), crate::error::NotUntil>> {
    let budget = std::task::ready!(poll_budget(cx));
    let answer = try_acquire();
    if answer.is_ok() {
        budget.made_progress();
    }
    Poll::Ready(answer)
}
