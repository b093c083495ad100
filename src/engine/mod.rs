//! The one waiter engine: a [`Lane`] is a pacing rule (a [`Pace`](crate::core::Pace)) with the FIFO queue of requests in front
//! of it; [`single`] puts one lane behind a mutex (with a lock-free path beside it), [`keyed`]
//! one lane per key; a [`Waiter`] is one request's async side, and every entry point that waits
//! on an in-process limiter (tasks, streams, Sinks, tower) waits through one. Redis
//! reservations do not: Redis keeps their queue, and each sleeps out the wait Redis gave it on a
//! tokio timer of its own, then its turn among its process's reservations (`redis/turns.rs`).
//!
//! Every operation takes `now` and decides under the lock in a few arithmetic steps; the async
//! layer only reads the clock and sleeps until the head's deadline. A request is charged when
//! it is granted, never before, so a waiter that gives up (a dropped future, a dropped stream)
//! has taken nothing and leaves nothing behind but its place in the queue.

pub(crate) mod coop;
pub(crate) mod keyed;
pub(crate) mod lane;
#[cfg(all(test, paced_loom))]
mod loom;
pub(crate) mod single;
mod striped;
pub(crate) mod waiter;

pub(crate) use lane::{After, Step};
pub(crate) use single::Shared;
pub(crate) use waiter::{Acquire, Answered, Granted, Waiter};
