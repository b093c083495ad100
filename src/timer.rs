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

/// Feature `hires-timer` on Linux: the timerfd that ends precise waits below a tick, created on
/// the first such wait (boxed: a timer that never makes one pays a pointer). Elsewhere nothing.
#[cfg(all(feature = "hires-timer", target_os = "linux"))]
type HiresSlot = Option<Box<hires::Hires>>;
#[cfg(not(all(feature = "hires-timer", target_os = "linux")))]
type HiresSlot = ();

#[cfg(all(feature = "hires-timer", target_os = "linux"))]
const NO_HIRES: HiresSlot = None;
#[cfg(not(all(feature = "hires-timer", target_os = "linux")))]
const NO_HIRES: HiresSlot = ();

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
    pub(crate) struct Timer {
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
        // Feature `hires-timer`: the timerfd that ends precise waits below a tick.
        hires: HiresSlot,
    }
}

impl Timer {
    pub(crate) const fn new() -> Timer {
        Timer {
            origin: None,
            deadline: Nanos::ZERO,
            armed: false,
            precise: false,
            spinning: false,
            spun: 0,
            sleep: None,
            hires: NO_HIRES,
        }
    }

    /// A timer whose times count from `origin`, shared with a limiter's state.
    pub(crate) const fn with_origin(origin: Instant) -> Timer {
        Timer {
            origin: Some(origin),
            deadline: Nanos::ZERO,
            armed: false,
            precise: false,
            spinning: false,
            spun: 0,
            sleep: None,
            hires: NO_HIRES,
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
    /// instead (see `arm_hires`) while tokio's clock runs in real time; under paused time, or
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
            #[cfg(all(feature = "hires-timer", target_os = "linux"))]
            ready!(self.as_mut().poll_hires_armed(cx, deadline));
            let now = self.as_mut().now();
            if now >= deadline {
                let me = self.as_mut().project();
                *me.armed = false;
                *me.spinning = false;
                // A timerfd still armed (the task woke for another reason first) would only
                // wake it for nothing.
                #[cfg(all(feature = "hires-timer", target_os = "linux"))]
                if let Some(hires) = me.hires.as_mut() {
                    hires.disarm();
                }
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
            #[cfg(all(feature = "hires-timer", target_os = "linux"))]
            if self.as_mut().arm_hires(now, deadline) {
                continue;
            }
            let me = self.as_mut().project();
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
        #[cfg(all(feature = "hires-timer", target_os = "linux"))]
        if let Some(hires) = me.hires.as_mut() {
            hires.disarm();
        }
        if !std::mem::take(me.armed) {
            return;
        }
        if let (Some(sleep), Some(origin)) = (me.sleep.as_mut().as_pin_mut(), *me.origin) {
            // Far enough that it never fires; resetting does not allocate.
            let now = since(origin, Instant::now());
            sleep.reset(origin + now.saturating_add(FAR_FUTURE).to_duration());
        }
    }

    /// Waits for a timerfd armed for `deadline` to expire (at once if none is), recording how
    /// late it was read.
    #[cfg(all(feature = "hires-timer", target_os = "linux"))]
    fn poll_hires_armed(self: Pin<&mut Self>, cx: &mut Context<'_>, deadline: Nanos) -> Poll<()> {
        let me = self.project();
        let Some(hires) = me.hires.as_mut() else {
            return Poll::Ready(());
        };
        if hires.armed() != Some(deadline) {
            return Poll::Ready(());
        }
        if ready!(hires.poll_expired(cx)) {
            // The origin is set: the timerfd was armed from a clock read through it.
            if let Some(origin) = *me.origin {
                hires.record(since(origin, Instant::now()));
            }
        }
        Poll::Ready(())
    }

    /// Arms the timerfd for the rest of a precise wait, below a tick: `false` when it cannot
    /// serve (paused time, no usable timerfd, or a wait shorter than the timerfd's recent
    /// lateness), and the wait yields instead.
    ///
    /// The timerfd is armed for the time left until its target (the deadline less its lead)
    /// by tokio's clock, counted by the kernel from its own later clock read, so it expires no
    /// earlier than that; the wait then reads tokio's clock again and yields for what is left,
    /// if anything. The item itself never leaves before `deadline`: only a clock read lets it
    /// go.
    #[cfg(all(feature = "hires-timer", target_os = "linux"))]
    fn arm_hires(self: Pin<&mut Self>, now: Nanos, deadline: Nanos) -> bool {
        let me = self.project();
        if let Some(hires) = me.hires.as_mut() {
            if !hires.usable() || deadline.saturating_sub(now) <= hires.lead() {
                return false;
            }
        }
        // Under paused time the timerfd's real time is not the test's time: yield as without
        // the feature, so that paused schedules stay exactly those of a plain timer.
        if !hires::clock_runs() {
            return false;
        }
        let hires = me
            .hires
            .get_or_insert_with(|| Box::new(hires::Hires::new()));
        let target = deadline.saturating_sub(hires.lead());
        if target <= now || !hires.arm(deadline, target, target.saturating_sub(now).to_duration()) {
            return false;
        }
        *me.spinning = false;
        // The wait's loop polls it (and so registers the waker) next.
        true
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
