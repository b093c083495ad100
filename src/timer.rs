//! The one place that reads tokio's clock and turns a deadline into a wait: a `Sleep` on tokio's
//! 1 ms wheel, or, for a wait that must end on time, a wake-up below the tick.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::core::{Nanos, Pace};

#[cfg(target_os = "linux")]
mod hires;
#[cfg(not(target_os = "linux"))]
mod hires {
    //! No high-resolution timer here: every wait that must end on time says so, and the timer
    //! sleeps on tokio's wheel (or yields, for `precise()`).
    use std::task::Waker;
    use tokio::time::Instant;

    pub(crate) use super::SubTick;

    pub(crate) fn wait(_: Instant, _: Instant, _: &Waker, _: bool) -> SubTick {
        SubTick::Unavailable
    }

    pub(crate) fn woke(_: Instant, _: Instant, _: bool) {}
}

/// What the process's timer thread answers for a wait below the tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) enum SubTick {
    /// The deadline is nearer than the timer's wake-ups are late: yield until it.
    Yield,
    /// Armed: the task is woken shortly before the deadline.
    Armed,
    /// None here (another platform, paused time, no timer thread, or too many waits at once):
    /// sleep on tokio's wheel.
    Unavailable,
}

/// What a late wake-up costs a wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lateness {
    /// Nothing: the rule absorbs a `Sleep`'s lateness ([`TICK_LATENESS`]), so the wait sleeps
    /// on tokio's wheel.
    Absorbed,
    /// Rate: every later request would move with it, so the wait ends on time.
    Costly,
}

impl Lateness {
    /// What lateness costs a request of `cost` under `pace`.
    #[inline]
    pub(crate) fn of<P: Pace>(pace: &P, cost: P::Cost) -> Lateness {
        if pace.absorbs(cost, TICK_LATENESS) {
            Lateness::Absorbed
        } else {
            Lateness::Costly
        }
    }
}

/// How far ahead "never" is armed: the horizon tokio itself uses for a far-future deadline.
/// A timer that reaches it finds its deadline still ahead and is simply armed again.
const FAR_FUTURE: Nanos = Nanos::from_duration(Duration::from_secs(86_400 * 365 * 30));

/// tokio's timer tick: a `Sleep` fires on the first tick at or after its deadline.
const TICK: Nanos = Nanos::from_duration(Duration::from_millis(1));

/// How late a `Sleep` may wake in real time: tokio rounds its deadline up to the next tick,
/// and its driver parks for whole milliseconds counted from the tick it parks in, so the
/// wake-up comes up to two ticks after the deadline; one more for the system's own lateness.
/// A wait that may end this late without cost (its rule absorbs it, see `poll_until`) sleeps
/// on the wheel; one that may not sleeps until this long before its deadline at the latest.
const TICK_LATENESS: Nanos = Nanos::from_duration(Duration::from_millis(3));

/// The longest wait handed whole to the high-resolution timer: one wake-up instead of a
/// `Sleep`'s and then the timer's. A longer one sleeps on the wheel first.
const SUB_TICK_SPAN: Nanos = Nanos::from_duration(Duration::from_millis(16));

/// Where the wait under way stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// No wait under way.
    Idle,
    /// The wait has not been armed yet.
    Starting,
    /// The `Sleep` is armed for the deadline or some time before it.
    Sleeping,
    /// Armed on the process's timer thread (real time).
    SubTick,
    /// Yielding until the deadline, in real time; yielded last at the clock in `spun`.
    Yielding,
    /// `precise()` under paused time: yielded once, at the clock in `spun`.
    YieldedPaused,
}

/// Whether tokio's clock runs in real time, as far as the wait under way has asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Clock {
    Unknown,
    Real,
    Paused,
}

pin_project! {
    /// A clock and a lazily created, reusable `Sleep`.
    ///
    /// Times are [`Nanos`] since the first clock read, so building an adapter needs no runtime
    /// and the `Sleep` (which does) is created on the first wait, then only reset. The timer is
    /// armed only while an item waits: an idle adapter registers nothing with the driver, and
    /// holds nothing of the high-resolution timer, which is the process's.
    #[derive(Debug)]
    pub(crate) struct Timer {
        origin: Option<Instant>,
        // The deadline of the wait under way, unless `stage` is `Idle`. (Small enums beside
        // a plain `Nanos` rather than options: the fields pack into 16 bytes, which keeps a
        // waiting adapter inside tokio's 256-byte task step.)
        deadline: Nanos,
        stage: Stage,
        clock: Clock,
        // Every wait ends on time (see `set_precise`).
        precise: bool,
        // The low 32 bits of the clock when the wait last yielded.
        spun: u32,
        #[pin]
        sleep: Option<Sleep>,
    }
}

/// The timer of the adapters that offer `precise()`.
pub(crate) type PreciseTimer = Timer;

impl Timer {
    pub(crate) const fn new() -> Timer {
        Timer::starting_at(None)
    }

    /// A timer whose times count from `origin`, shared with a limiter's state.
    pub(crate) const fn with_origin(origin: Instant) -> Timer {
        Timer::starting_at(Some(origin))
    }

    const fn starting_at(origin: Option<Instant>) -> Timer {
        Timer {
            origin,
            deadline: Nanos::ZERO,
            stage: Stage::Idle,
            clock: Clock::Unknown,
            precise: false,
            spun: 0,
            sleep: None,
        }
    }

    /// Precise waiting: every wait ends on time, whatever its rule absorbs (see `poll_until`).
    ///
    /// Where the process has a high-resolution timer (Linux), that is the default path of a
    /// wait that must end on time, and a precise wait is woken with the timer's longer lead
    /// (its 95th percentile of wake-ups' lateness rather than the 80th). Elsewhere the `Sleep`
    /// covers the wait up to two ticks before the deadline and the rest is spent yielding to
    /// the scheduler and reading the clock again, which keeps a core busy meanwhile. Under paused time the clock does not
    /// move across a yield, and a wait that finds the clock where it left it goes back to
    /// the `Sleep`, so paused schedules are exactly those of a plain timer.
    pub(crate) fn set_precise(&mut self, precise: bool) {
        self.precise = precise;
    }

    /// The deadline of the wait under way, if any.
    pub(crate) fn armed(&self) -> Option<Nanos> {
        (self.stage != Stage::Idle).then_some(self.deadline)
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
    ///
    /// `lateness` says what ending late would cost: a wait whose rule absorbs a `Sleep`'s
    /// lateness (a bucket with spare tokens for [`TICK_LATENESS`]) sleeps on tokio's wheel.
    /// Any other wait (burst 1), in real time, ends on time: on the process's
    /// high-resolution timer and a few microseconds of yielding where there is one (Linux),
    /// otherwise on the wheel (or by yielding, if `precise`). Under paused time every wait is
    /// what it always was: a `Sleep` until the deadline, or the yielding of `precise()`.
    pub(crate) fn poll_until(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        deadline: Nanos,
        lateness: Lateness,
    ) -> Poll<Nanos> {
        {
            let me = self.as_mut().project();
            if *me.stage == Stage::Idle || *me.deadline != deadline {
                *me.deadline = deadline;
                *me.stage = Stage::Starting;
                *me.clock = Clock::Unknown;
            }
        }
        loop {
            let me = self.as_mut().project();
            if *me.stage == Stage::Sleeping {
                if let Some(sleep) = me.sleep.as_pin_mut() {
                    ready!(sleep.poll(cx));
                }
            }
            let now = self.as_mut().now();
            self.as_mut().woke_at(now);
            let me = self.as_mut().project();
            if now >= deadline {
                *me.stage = Stage::Idle;
                return Poll::Ready(now);
            }
            if !*me.precise && lateness == Lateness::Absorbed {
                self.as_mut().arm(now, deadline);
                continue;
            }
            if *me.clock == Clock::Unknown {
                *me.clock = if clock_runs() {
                    Clock::Real
                } else {
                    Clock::Paused
                };
            }
            if *me.clock == Clock::Paused {
                if !*me.precise {
                    self.as_mut().arm(now, deadline);
                    continue;
                }
                ready!(self.as_mut().poll_paused_precise(cx, now, deadline));
                continue;
            }
            if *me.stage == Stage::Yielding {
                // Truncated as in `poll_paused_precise`. A running clock moves across a yield;
                // one that stood still was paused meanwhile (`tokio::time::pause`), and
                // yielding on would keep the runtime busy, so that it never advances the clock.
                let low = now.0 as u32;
                if *me.spun != low {
                    *me.spun = low;
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                *me.clock = Clock::Paused;
                *me.stage = Stage::Starting;
                continue;
            }
            let left = deadline.saturating_sub(now);
            if left > SUB_TICK_SPAN {
                // Sleep until a `Sleep`'s lateness before the deadline, then the rest.
                self.as_mut()
                    .arm(now, deadline.saturating_sub(TICK_LATENESS));
                continue;
            }
            let origin = me.origin.unwrap_or_else(Instant::now);
            let at = origin + deadline.to_duration();
            match hires::wait(at, origin + now.to_duration(), cx.waker(), *me.precise) {
                SubTick::Armed => {
                    *me.stage = Stage::SubTick;
                    return Poll::Pending;
                }
                SubTick::Yield => {
                    *me.stage = Stage::Yielding;
                    *me.spun = now.0 as u32;
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                SubTick::Unavailable if !*me.precise => {
                    self.as_mut().arm(now, deadline);
                }
                SubTick::Unavailable => {
                    // Yield only below two ticks: a `Sleep` for an earlier time may wake up
                    // to two ticks late, and would then make the item late.
                    let early = deadline.saturating_sub(TICK).saturating_sub(TICK);
                    if now < early {
                        self.as_mut().arm(now, early);
                        continue;
                    }
                    *me.stage = Stage::Yielding;
                    *me.spun = now.0 as u32;
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
            }
        }
    }

    /// Tells the timer that the task was polled again: if the wait under way is armed on the
    /// high-resolution timer, how late this poll came after the wake-up was due sets the
    /// timer's lead. A caller that may end its wait without polling the timer (a waiter
    /// granted as it is woken, the deadline having passed) calls this first: otherwise only
    /// the wake-ups that came early enough to be polled here would be counted, the lead would
    /// learn that wake-ups are never late, and they would come later and later.
    pub(crate) fn woken(mut self: Pin<&mut Self>) {
        if self.stage == Stage::SubTick {
            let now = self.as_mut().now();
            self.woke_at(now);
        }
    }

    /// [`Timer::woken`] at `now`.
    fn woke_at(self: Pin<&mut Self>, now: Nanos) {
        let me = self.project();
        if *me.stage != Stage::SubTick {
            return;
        }
        // Woken by the timer thread (or for another reason): how late, sets its lead.
        if let Some(origin) = *me.origin {
            hires::woke(
                origin + me.deadline.to_duration(),
                origin + now.to_duration(),
                *me.precise,
            );
        }
        *me.stage = Stage::Starting;
        // The clock may have been paused meanwhile: ask again.
        *me.clock = Clock::Unknown;
    }

    /// `precise()` under paused time, exactly as it always was: sleep until a tick before the
    /// deadline, then yield while the test moves the clock; a clock that stood still across a
    /// yield sends the wait back to the `Sleep`, until the deadline. `Ready` once the timer is
    /// armed again (the caller polls it).
    fn poll_paused_precise(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        now: Nanos,
        deadline: Nanos,
    ) -> Poll<()> {
        let early = deadline.saturating_sub(TICK);
        if now < early {
            // The tick rounds it up to at most the deadline.
            self.as_mut().arm(now, early);
            return Poll::Ready(());
        }
        let me = self.as_mut().project();
        // Truncated: a clock that moved by an exact multiple of 2^32 ns between two polls
        // only sends this wait back to the `Sleep`.
        let low = now.0 as u32;
        if *me.stage != Stage::YieldedPaused || *me.spun != low {
            // The clock moved since the last yield (the test moved it), so yield again.
            *me.stage = Stage::YieldedPaused;
            *me.spun = low;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        // The clock stood still across a yield: sleep to the deadline, as a plain timer
        // would. Its `Sleep` is pending until then.
        self.arm(now, deadline);
        Poll::Ready(())
    }

    /// Stops a wait under way, so that its deadline no longer wakes the task: for an adapter
    /// whose reason to wait went away before the deadline (an item that left early). A wake-up
    /// armed on the high-resolution timer still comes, at most [`SUB_TICK_SPAN`] later, and
    /// finds nothing to do.
    pub(crate) fn disarm(self: Pin<&mut Self>) {
        let mut me = self.project();
        let sleeping = *me.stage == Stage::Sleeping;
        *me.stage = Stage::Idle;
        if !sleeping {
            return;
        }
        if let (Some(sleep), Some(origin)) = (me.sleep.as_mut().as_pin_mut(), *me.origin) {
            // Far enough that it never fires; resetting does not allocate.
            let now = since(origin, Instant::now());
            sleep.reset(origin + now.saturating_add(FAR_FUTURE).to_duration());
        }
    }

    /// Arms the `Sleep` for `target` (at most the deadline).
    fn arm(self: Pin<&mut Self>, now: Nanos, target: Nanos) {
        let mut me = self.project();
        // `now` was read after `origin` was set, so the origin is there.
        let origin = *me.origin.get_or_insert_with(Instant::now);
        let horizon = target.min(now.saturating_add(FAR_FUTURE));
        let at = origin + horizon.to_duration();
        match me.sleep.as_mut().as_pin_mut() {
            Some(sleep) => sleep.reset(at),
            None => me.sleep.set(Some(tokio::time::sleep_until(at))),
        }
        *me.stage = Stage::Sleeping;
    }
}

/// Whether tokio's clock moves with real time, as it does unless it is paused (`test-util`).
///
/// The real clock is read until it moves; a tokio clock that runs (it reads the same monotonic
/// clock, plus a constant after a `resume`) must then have moved too, and a paused one has not.
/// A real clock that does not move within a few reads (a coarse clock source) answers "no":
/// the caller then waits as under paused time.
pub(crate) fn clock_runs() -> bool {
    let before = Instant::now();
    let real = std::time::Instant::now();
    for _ in 0..64 {
        if std::time::Instant::now() > real {
            return Instant::now() > before;
        }
        std::hint::spin_loop();
    }
    false
}

/// The time from `origin` to `now` in nanoseconds; zero if `now` is earlier.
#[inline]
pub(crate) fn since(origin: Instant, now: Instant) -> Nanos {
    Nanos::from_duration(now.saturating_duration_since(origin))
}

#[cfg(test)]
mod tests {
    use std::task::Waker;

    use super::*;

    /// A waiter woken after its deadline is granted at once, without polling its timer; the
    /// timer still hears how late the wake-up came. (It did not: only wake-ups early enough
    /// to be polled by the timer were counted, and the lead shrank until most came late,
    /// losing 2 to 3 % of 1,000/s at burst 1 on `RateLimiter::acquire`.)
    #[cfg(target_os = "linux")]
    #[test]
    fn a_waiter_granted_as_it_wakes_reports_the_wake_up() {
        use crate::{Rate, RateLimiter};
        use std::future::Future;
        use std::task::Context;

        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let limiter = RateLimiter::new(Rate::per_second(100), 1);
            limiter.acquire(1).await;
            let mut next = std::pin::pin!(limiter.acquire(1));
            let mut cx = Context::from_waker(Waker::noop());
            // Waits 10 ms (below `SUB_TICK_SPAN`), armed on the timer thread.
            assert!(next.as_mut().poll(&mut cx).is_pending());
            // Polled only after its deadline, as a late wake-up would.
            std::thread::sleep(Duration::from_millis(15));
            let before = hires::WOKEN_HERE.with(std::cell::Cell::get);
            assert!(next.as_mut().poll(&mut cx).is_ready());
            assert_eq!(hires::WOKEN_HERE.with(std::cell::Cell::get), before + 1);
        });
    }

    /// A wait that yields for its last microseconds in real time, when the test pauses the
    /// clock meanwhile, goes back to tokio's timer instead of yielding on: a task that always
    /// yields keeps the runtime busy, and a busy runtime never advances a paused clock.
    #[test]
    fn a_clock_paused_while_a_wait_yields_sends_it_to_the_sleep() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let mut timer = std::pin::pin!(Timer::new());
            let now = timer.as_mut().now();
            let deadline = now.saturating_add(Nanos::from_duration(Duration::from_millis(5)));
            {
                // Where the timer thread's `SubTick::Yield` leaves a wait.
                let me = timer.as_mut().project();
                *me.deadline = deadline;
                *me.stage = Stage::Yielding;
                *me.clock = Clock::Real;
                *me.spun = now.0 as u32;
            }
            tokio::time::pause();
            let mut cx = Context::from_waker(Waker::noop());
            // The clock moved between the last yield and the pause: one more yield...
            let first = timer
                .as_mut()
                .poll_until(&mut cx, deadline, Lateness::Costly);
            assert!(first.is_pending());
            // ...across which it stands still: the wait sleeps on tokio's timer.
            let second = timer
                .as_mut()
                .poll_until(&mut cx, deadline, Lateness::Costly);
            assert!(second.is_pending());
            assert_eq!(timer.stage, Stage::Sleeping);
            // And ends at its deadline, rounded up to tokio's tick. The ticks count from the
            // runtime's start, not from this timer's origin (read a few microseconds later),
            // so the rounding may reach just past one tick of the origin's count.
            let ended = std::future::poll_fn(|cx| {
                timer.as_mut().poll_until(cx, deadline, Lateness::Costly)
            })
            .await;
            assert!(ended >= deadline, "{ended:?} before {deadline:?}");
            let latest = deadline.saturating_add(TICK).saturating_add(TICK);
            assert!(ended < latest, "{ended:?} after {deadline:?}");
        });
    }
}
