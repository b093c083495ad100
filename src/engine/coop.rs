//! tokio's cooperative budget for grants that need no wait: a task that loops on a limiter
//! whose tokens are free yields to the runtime as it would on a tokio `Semaphore`.

use std::task::{Context, Poll};

#[allow(unused_imports)] // used by the grant paths as they adopt it
pub(crate) use tokio::task::coop::RestoreOnPending as Budget;

/// Takes one unit of the task's budget, or registers the task to be polled again and answers
/// `Pending` when the budget is spent. Call it before granting without a wait; call
/// [`Budget::made_progress`] once the grant is made (dropping the value without it gives the
/// unit back).
///
/// Outside a tokio runtime (or inside `tokio::task::unconstrained`) it always answers `Ready`.
#[inline]
#[allow(dead_code)] // used by the grant paths as they adopt it
pub(crate) fn poll_budget(cx: &mut Context<'_>) -> Poll<Budget> {
    tokio::task::coop::poll_proceed(cx)
}
