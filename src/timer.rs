//! The one place that reads tokio's clock and turns a deadline into a `Sleep`.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::core::Nanos;

#[cfg(all(feature = "hires-timer", target_os = "linux"))]
mod hires;

/// The timer of the adapters that offer `precise()`: with the feature `hires-timer` on Linux it
/// carries the timerfd that ends precise waits below a tick; elsewhere it is a plain [`Timer`].
/// The other timers (sinks, shared limiters' waiters, `batched_interval`) never wait precisely
/// and carry nothing.
#[cfg(all(feature = "hires-timer", target_os = "linux"))]
pub(crate) type PreciseTimer = Timer<Option<Box<hires::Hires>>>;
#[cfg(not(all(feature = "hires-timer", target_os = "linux")))]
pub(crate) type PreciseTimer = Timer;

/// What a timer uses for the part of a precise wait below a tick, before yielding: nothing
/// (`()`), or a timerfd created on the first such wait (feature `hires-timer`, Linux; boxed,
/// so a timer that never makes one pays a pointer).
pub(crate) trait SubTick {
    /// Nothing created yet.
    const NONE: Self;
    /// Waits for a wake-up armed for `deadline` (at once if none is); `origin` is the timer's.
    fn poll_armed(
        &mut self,
        cx: &mut Context<'_>,
        deadline: Nanos,
        origin: Option<Instant>,
    ) -> Poll<()>;
    /// Arms a wake-up for a wait from `now` until `deadline`, below a tick: `false` if it
    /// cannot serve, and the wait yields.
    fn arm(&mut self, now: Nanos, deadline: Nanos) -> bool;
    /// Stops an armed wake-up.
    fn disarm(&mut self);
}

impl SubTick for () {
    const NONE: () = ();

    #[inline]
    fn poll_armed(&mut self, _: &mut Context<'_>, _: Nanos, _: Option<Instant>) -> Poll<()> {
        Poll::Ready(())
    }

    #[inline]
    fn arm(&mut self, _: Nanos, _: Nanos) -> bool {
        false
    }

    #[inline]
    fn disarm(&mut self) {}
}

/// How far ahead "never" is armed: the horizon tokio itself uses for a far-future deadline.
/// A timer that reaches it finds its deadline still ahead and is simply armed again.
const FAR_FUTURE: Nanos = Nanos::from_duration(Duration::from_secs(86_400 * 365 * 30));

/// tokio's timer tick: a `Sleep` fires on the first tick at or after its deadline.
const TICK: Nanos = Nanos::from_duration(Duration::from_millis(1));

pin_project! {
    /// A clock and a lazily created, reusable `Sleep`.
    ///
    /// Times are [`Nanos`] since the first clock read, so building an adapter needs no runtime
    /// and the `Sleep` (which does) is created on the first wait, then only reset. The timer is
    /// armed only while an item waits: an idle adapter registers nothing with the driver.
    #[derive(Debug)]
    pub(crate) struct Timer<H = ()> {
        origin: Option<Instant>,
        // The deadline of the wait under way, if `armed`. (Flags beside a plain `Nanos`
        // rather than options: the fields pack into 16 bytes, which keeps a waiting adapter
        // inside tokio's 256-byte task step.)
        deadline: Nanos,
        armed: bool,
        // Precise waiting (see `set_precise`): whether the wait under way has yielded, and
        // the low 32 bits of the clock when it last did.
        precise: bool,
        spinning: bool,
        spun: u32,
        #[pin]
        sleep: Option<Sleep>,
        // What ends precise waits below a tick before yielding (see `SubTick`).
        hires: H,
    }
}

impl<H: SubTick> Timer<H> {
    pub(crate) const fn new() -> Timer<H> {
        Timer {
            origin: None,
            deadline: Nanos::ZERO,
            armed: false,
            precise: false,
            spinning: false,
            spun: 0,
            sleep: None,
            hires: H::NONE,
        }
    }

    /// A timer whose times count from `origin`, shared with a limiter's state.
    pub(crate) const fn with_origin(origin: Instant) -> Timer<H> {
        Timer {
            origin: Some(origin),
            deadline: Nanos::ZERO,
            armed: false,
            precise: false,
            spinning: false,
            spun: 0,
            sleep: None,
            hires: H::NONE,
        }
    }

    /// Precise waiting: the part of a wait shorter than tokio's 1 ms tick is finished by
    /// yielding to the scheduler and reading the clock again, instead of sleeping to the next
    /// tick. The `Sleep` covers the wait up to one tick before the deadline.
    ///
    /// It keeps a core busy while an item is less than a tick from its time. Under paused time
    /// the clock does not move across a yield, and a wait that finds the clock where it left
    /// it goes back to the `Sleep`, so paused schedules are exactly those of a plain timer.
    ///
    /// With the feature `hires-timer` on Linux, the part below a tick is slept on a timerfd
    /// instead (see `SubTick`) while tokio's clock runs in real time; under paused time, or
    /// if the timerfd cannot be had, the wait yields as above.
    pub(crate) fn set_precise(&mut self, precise: bool) {
        self.precise = precise;
    }

    /// The deadline the timer is armed for, while a wait is under way.
    pub(crate) fn armed(&self) -> Option<Nanos> {
        self.armed.then_some(self.deadline)
    }

    /// The current time; the first call fixes the origin.
    #[inline]
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
            if self.armed && self.deadline == deadline {
                if let Some(sleep) = self.as_mut().project().sleep.as_pin_mut() {
                    ready!(sleep.poll(cx));
                }
            }
            let me = self.as_mut().project();
            ready!(me.hires.poll_armed(cx, deadline, *me.origin));
            let now = self.as_mut().now();
            if now >= deadline {
                let me = self.as_mut().project();
                *me.armed = false;
                *me.spinning = false;
                // A timerfd still armed (the task woke for another reason first) would only
                // wake it for nothing.
                me.hires.disarm();
                return Poll::Ready(now);
            }
            if !self.precise {
                self.as_mut().arm(now, deadline, deadline);
                continue;
            }
            let early = deadline.saturating_sub(TICK);
            if now < early {
                // Sleep up to a tick before the deadline (the tick rounds it up to at most
                // the deadline), then finish below the tick.
                self.as_mut().arm(now, deadline, early);
                continue;
            }
            let me = self.as_mut().project();
            if me.hires.arm(now, deadline) {
                *me.spinning = false;
                // The loop polls it next, which registers the waker.
                continue;
            }
            // Truncated: a clock that moved by an exact multiple of 2^32 ns between two polls
            // only sends this wait back to the `Sleep`.
            let low = now.0 as u32;
            if !*me.spinning || *me.spun != low {
                // Real time: the clock moved since the last yield, so yield again.
                *me.spinning = true;
                *me.spun = low;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            // The clock stood still across a yield (paused time): sleep to the deadline, as
            // a plain timer would. Its `Sleep` is pending until then.
            self.as_mut().arm(now, deadline, deadline);
        }
    }

    /// Stops a wait under way, so that its deadline no longer wakes the task: for an adapter
    /// whose reason to wait went away before the deadline (an item that left early).
    pub(crate) fn disarm(self: Pin<&mut Self>) {
        let mut me = self.project();
        *me.spinning = false;
        me.hires.disarm();
        if !std::mem::take(me.armed) {
            return;
        }
        if let (Some(sleep), Some(origin)) = (me.sleep.as_mut().as_pin_mut(), *me.origin) {
            // Far enough that it never fires; resetting does not allocate.
            let now = since(origin, Instant::now());
            sleep.reset(origin + now.saturating_add(FAR_FUTURE).to_duration());
        }
    }

    /// Arms the `Sleep` for `target` (at most `deadline`), for a wait until `deadline`.
    fn arm(self: Pin<&mut Self>, now: Nanos, deadline: Nanos, target: Nanos) {
        let mut me = self.project();
        // `now` was read after `origin` was set, so the origin is there.
        let origin = *me.origin.get_or_insert_with(Instant::now);
        let horizon = target.min(now.saturating_add(FAR_FUTURE));
        let at = origin + horizon.to_duration();
        match me.sleep.as_mut().as_pin_mut() {
            Some(sleep) => sleep.reset(at),
            None => me.sleep.set(Some(tokio::time::sleep_until(at))),
        }
        *me.deadline = deadline;
        *me.armed = true;
    }
}

/// The time from `origin` to `now` in nanoseconds; zero if `now` is earlier.
#[inline]
pub(crate) fn since(origin: Instant, now: Instant) -> Nanos {
    Nanos::from_duration(now.saturating_duration_since(origin))
}
