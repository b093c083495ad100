//! The one place that reads tokio's clock and turns a deadline into a `Sleep`.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::core::Nanos;

/// How far ahead "never" is armed: the horizon tokio itself uses for a far-future deadline.
/// A timer that reaches it finds its deadline still ahead and is simply armed again.
const FAR_FUTURE: Nanos = Nanos::from_duration(Duration::from_secs(86_400 * 365 * 30));

pin_project! {
    /// A clock and a lazily created, reusable `Sleep`.
    ///
    /// Times are [`Nanos`] since the first clock read, so building an adapter needs no runtime
    /// and the `Sleep` (which does) is created on the first wait, then only reset. The timer is
    /// armed only while an item waits: an idle adapter registers nothing with the driver.
    #[derive(Debug)]
    pub(crate) struct Timer {
        origin: Option<Instant>,
        // The deadline `sleep` is armed for, if it is armed.
        armed: Option<Nanos>,
        #[pin]
        sleep: Option<Sleep>,
    }
}

impl Timer {
    pub(crate) const fn new() -> Timer {
        Timer {
            origin: None,
            armed: None,
            sleep: None,
        }
    }

    /// A timer whose times count from `origin`, shared with a limiter's state.
    pub(crate) const fn with_origin(origin: Instant) -> Timer {
        Timer {
            origin: Some(origin),
            armed: None,
            sleep: None,
        }
    }

    /// The deadline the timer is armed for, while a wait is under way.
    pub(crate) fn armed(&self) -> Option<Nanos> {
        self.armed
    }

    /// The current time; the first call fixes the origin.
    pub(crate) fn now(self: Pin<&mut Self>) -> Nanos {
        let now = Instant::now();
        let origin = *self.project().origin.get_or_insert(now);
        since(origin, now)
    }

    /// Waits until `deadline` and returns the time read after it passed, which is at or after
    /// `deadline`. Returns at once, without touching the timer, if it has passed already.
    pub(crate) fn poll_until(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        deadline: Nanos,
    ) -> Poll<Nanos> {
        loop {
            if self.armed == Some(deadline) {
                if let Some(sleep) = self.as_mut().project().sleep.as_pin_mut() {
                    ready!(sleep.poll(cx));
                }
            }
            let now = self.as_mut().now();
            if now >= deadline {
                *self.as_mut().project().armed = None;
                return Poll::Ready(now);
            }
            self.as_mut().arm(now, deadline);
        }
    }

    /// Stops a wait under way, so that its deadline no longer wakes the task: for an adapter
    /// whose reason to wait went away before the deadline (an item that left early).
    pub(crate) fn disarm(self: Pin<&mut Self>) {
        let mut me = self.project();
        if me.armed.take().is_none() {
            return;
        }
        if let (Some(sleep), Some(origin)) = (me.sleep.as_mut().as_pin_mut(), *me.origin) {
            // Far enough that it never fires; resetting does not allocate.
            let now = since(origin, Instant::now());
            sleep.reset(origin + now.saturating_add(FAR_FUTURE).to_duration());
        }
    }

    fn arm(self: Pin<&mut Self>, now: Nanos, deadline: Nanos) {
        let mut me = self.project();
        // `now` was read after `origin` was set, so the origin is there.
        let origin = *me.origin.get_or_insert_with(Instant::now);
        let horizon = deadline.min(now.saturating_add(FAR_FUTURE));
        let at = origin + horizon.to_duration();
        match me.sleep.as_mut().as_pin_mut() {
            Some(sleep) => sleep.reset(at),
            None => me.sleep.set(Some(tokio::time::sleep_until(at))),
        }
        *me.armed = Some(deadline);
    }
}

/// The time from `origin` to `now` in nanoseconds; zero if `now` is earlier.
pub(crate) fn since(origin: Instant, now: Instant) -> Nanos {
    Nanos::from_duration(now.saturating_duration_since(origin))
}
