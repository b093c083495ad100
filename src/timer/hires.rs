//! Feature `hires-timer` (Linux): a `timerfd` that wakes a `precise()` wait below tokio's tick.
//!
//! One timerfd per timer, created on the first wait that needs it (an adapter that never waits
//! below a tick opens no file), armed with a relative time from a fresh clock read and read
//! through tokio's `AsyncFd`. Every failure (no file descriptors left, a registration refused)
//! is reported to the caller, which then finishes the wait by yielding as without the feature.

use std::io;
use std::os::fd::OwnedFd;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::time::Instant;

use super::{since, SubTick};
use crate::core::Nanos;

/// A timer's timerfd, or the memory of having failed to make one.
#[derive(Debug)]
pub(crate) struct Hires {
    /// `None` once creating, arming or reading it failed: the timer yields from then on.
    fd: Option<AsyncFd<OwnedFd>>,
    /// The deadline (in the timer's [`Nanos`]) the timerfd is armed for.
    armed: Option<Nanos>,
    /// When it is armed to expire: `lead()` before the deadline.
    target: Nanos,
    /// How late its expirations were read, in nanoseconds: an estimate of the 80th percentile
    /// of the recent ones (see [`Hires::record`]), at most [`MAX_LEAD`].
    late: u64,
}

/// The most a wait ends by yielding after the timerfd: on a machine whose wake-ups come later
/// than this (a loaded one), the wait costs rate rather than a busy core.
const MAX_LEAD: u64 = 30_000;

/// How the lateness estimate moves: down one step for an expiration read no later than the
/// estimate, up [`UP_STEPS`] steps for one read later, so it settles where one in
/// `UP_STEPS + 1` is later (the 80th percentile), and a single long preemption moves it by a
/// microsecond, not by the preemption.
const STEP: u64 = 250;
const UP_STEPS: u64 = 4;

impl Hires {
    /// A timerfd registered with the current runtime's IO driver, or one that has failed.
    pub(crate) fn new() -> Hires {
        Hires {
            fd: open().ok(),
            armed: None,
            target: Nanos::ZERO,
            late: 0,
        }
    }

    /// The timerfd is usable (it was created and has not failed since).
    pub(crate) fn usable(&self) -> bool {
        self.fd.is_some()
    }

    /// The deadline it is armed for, if any.
    pub(crate) fn armed(&self) -> Option<Nanos> {
        self.armed
    }

    /// How long before a deadline it should expire: what its expirations were late by lately
    /// (the 80th percentile, at most [`MAX_LEAD`]), so that the wait can end by yielding for
    /// that last stretch and the item leave on time rather than a wake-up late.
    ///
    /// The percentile trades CPU for rate: the stretch spent yielding is the lead less the
    /// wake-up's lateness, and an item is late only when its wake-up is later than the lead.
    /// At 10,000/s, burst 1, on the quiet 2-core test machine, the 80th percentile kept 0.983
    /// to 0.995 of the rate at 20 to 24 µs of CPU per item, against governor's 25 to 29 µs in
    /// the same runs; the earlier one and a half times the average lateness (capped at the same
    /// 30 µs) kept 0.980 to 0.995 at 25 to 28 µs, more than governor in half the runs
    /// (BENCHMARKS.md).
    pub(crate) fn lead(&self) -> Nanos {
        Nanos(self.late.min(MAX_LEAD))
    }

    /// Records the time `now` at which an expiration was read.
    pub(crate) fn record(&mut self, now: Nanos) {
        let late = now.saturating_sub(self.target).0;
        self.late = if late > self.late {
            self.late.saturating_add(UP_STEPS * STEP).min(MAX_LEAD)
        } else {
            self.late.saturating_sub(STEP)
        };
    }

    /// Arms it to expire at `target`, `after` from now (at least 1 ns: zero would disarm it),
    /// for a wait until `deadline`. On failure it is left unusable.
    pub(crate) fn arm(&mut self, deadline: Nanos, target: Nanos, after: Duration) -> bool {
        let Some(fd) = &self.fd else {
            return false;
        };
        self.target = target;
        let after = after.max(Duration::from_nanos(1));
        if set(fd.get_ref(), after).is_err() {
            self.fd = None;
            self.armed = None;
            return false;
        }
        self.armed = Some(deadline);
        true
    }

    /// Stops an armed timerfd, so it no longer wakes the task.
    pub(crate) fn disarm(&mut self) {
        if self.armed.take().is_none() {
            return;
        }
        if let Some(fd) = &self.fd {
            if set(fd.get_ref(), Duration::ZERO).is_err() {
                self.fd = None;
            }
        }
    }

    /// Waits for the armed timerfd to expire. `Ready(true)`: it expired (and is disarmed);
    /// `Ready(false)`: it failed and is unusable from now on.
    pub(crate) fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        let Some(fd) = &self.fd else {
            self.armed = None;
            return Poll::Ready(false);
        };
        while let Ok(mut guard) = ready!(fd.poll_read_ready(cx)) {
            // Reading the expiration count empties it. A stale readiness (the timerfd expired
            // and was re-armed before this read) reads nothing: clear it and poll again.
            match guard.try_io(|fd| read_expirations(fd.get_ref())) {
                Ok(Ok(_)) => {
                    // Emptied: it is not readable again before its next expiration, which
                    // the IO driver reports anew. Without this, the next wait's first poll
                    // would find this readiness and pay a read that finds nothing.
                    guard.clear_ready();
                    self.armed = None;
                    return Poll::Ready(true);
                }
                Ok(Err(_)) => break,
                Err(_would_block) => continue,
            }
        }
        self.fd = None;
        self.armed = None;
        Poll::Ready(false)
    }
}

impl SubTick for Option<Box<Hires>> {
    const NONE: Self = None;

    /// Waits for the timerfd armed for `deadline` to expire (at once if none is), recording
    /// how late it was read.
    fn poll_armed(
        &mut self,
        cx: &mut Context<'_>,
        deadline: Nanos,
        origin: Option<Instant>,
    ) -> Poll<()> {
        let Some(hires) = self.as_mut() else {
            return Poll::Ready(());
        };
        if hires.armed() != Some(deadline) {
            return Poll::Ready(());
        }
        if ready!(hires.poll_expired(cx)) {
            // The origin is set: the timerfd was armed from a clock read through it.
            if let Some(origin) = origin {
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
    fn arm(&mut self, now: Nanos, deadline: Nanos) -> bool {
        if let Some(hires) = self.as_ref() {
            if !hires.usable() || deadline.saturating_sub(now) <= hires.lead() {
                return false;
            }
        }
        // Under paused time the timerfd's real time is not the test's time: yield as without
        // the feature, so that paused schedules stay exactly those of a plain timer.
        if !clock_runs() {
            return false;
        }
        let hires = self.get_or_insert_with(|| Box::new(Hires::new()));
        let target = deadline.saturating_sub(hires.lead());
        target > now && hires.arm(deadline, target, target.saturating_sub(now).to_duration())
    }

    fn disarm(&mut self) {
        if let Some(hires) = self.as_mut() {
            hires.disarm();
        }
    }
}

/// Whether tokio's clock moves with real time, as it does unless it is paused (`test-util`).
///
/// The real clock is read until it moves; a tokio clock that runs (it reads the same monotonic
/// clock, plus a constant after a `resume`) must then have moved too, and a paused one has not.
/// A real clock that does not move within a few reads (a coarse clock source) answers "no":
/// the caller then yields, as without the feature.
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

/// Set once a runtime without an IO driver was met: no timerfd is tried again in this process.
static NO_IO_DRIVER: AtomicBool = AtomicBool::new(false);

/// A non-blocking CLOCK_MONOTONIC timerfd registered for readability with the IO driver.
///
/// On a runtime built without its IO driver (`Builder::enable_time` alone), tokio's `AsyncFd`
/// panics instead of answering an error, and tokio has no way to ask first. The feature may
/// have been turned on by another crate of the build (features unify), so that panic is
/// caught and answered as an error: the wait then yields, as without the feature, and so does
/// every later one in this process (the panic's message is printed once, by the panic hook).
/// With `panic = "abort"` it cannot be caught; the feature's documentation says so.
fn open() -> io::Result<AsyncFd<OwnedFd>> {
    if NO_IO_DRIVER.load(Ordering::Relaxed) {
        return Err(io::Error::other("the runtime has no IO driver"));
    }
    let fd = timerfd_create(
        TimerfdClockId::Monotonic,
        TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
    )?;
    // `AsyncFd::register_with_interest` is only in newer tokio than this crate requires; the
    // `OwnedFd` stays open and the same for as long as the `AsyncFd` holds it, which is what
    // the deprecation is about.
    #[allow(deprecated)]
    let registered = std::panic::catch_unwind(AssertUnwindSafe(|| {
        AsyncFd::with_interest(fd, Interest::READABLE)
    }));
    registered.unwrap_or_else(|_| {
        NO_IO_DRIVER.store(true, Ordering::Relaxed);
        Err(io::Error::other("the runtime has no IO driver"))
    })
}

/// Arms `fd` to expire once, `after` from now (`Duration::ZERO` disarms it).
fn set(fd: &OwnedFd, after: Duration) -> io::Result<()> {
    let value = Timespec {
        // Saturated: a wait this long never reaches here (the callers' waits are below a tick).
        tv_sec: after.as_secs().try_into().unwrap_or(i64::MAX),
        tv_nsec: after.subsec_nanos().into(),
    };
    let spec = Itimerspec {
        it_interval: Timespec::default(),
        it_value: value,
    };
    timerfd_settime(fd, TimerfdTimerFlags::empty(), &spec)?;
    Ok(())
}

/// Reads (and so resets) the expiration count of a non-blocking timerfd.
fn read_expirations(fd: &OwnedFd) -> io::Result<u64> {
    let mut count = [0u8; 8];
    rustix::io::read(fd, &mut count)?;
    Ok(u64::from_ne_bytes(count))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unarmed(late: u64) -> Hires {
        Hires {
            fd: None,
            armed: None,
            target: Nanos::ZERO,
            late,
        }
    }

    #[test]
    fn the_lead_is_the_estimate_at_most_max_lead() {
        assert_eq!(unarmed(0).lead(), Nanos::ZERO);
        assert_eq!(unarmed(4_000).lead(), Nanos(4_000));
        assert_eq!(unarmed(u64::MAX).lead(), Nanos(MAX_LEAD));
    }

    #[test]
    fn the_estimate_moves_a_step_at_a_time() {
        let mut hires = unarmed(0);
        hires.target = Nanos(1_000);
        // Later than the estimate: up four steps, whatever the lateness (a preemption of a
        // second counts as much as a microsecond).
        hires.record(Nanos(1_000_000_000));
        assert_eq!(hires.late, UP_STEPS * STEP);
        // Read no later than the estimate, or before its target (another clock): down a step.
        hires.record(Nanos(1_000));
        assert_eq!(hires.late, (UP_STEPS - 1) * STEP);
        hires.record(Nanos(0));
        assert_eq!(hires.late, (UP_STEPS - 2) * STEP);
        // Never below zero, never above MAX_LEAD.
        let mut low = unarmed(0);
        low.record(Nanos(0));
        assert_eq!(low.late, 0);
        let mut high = unarmed(MAX_LEAD);
        high.record(Nanos(u64::MAX));
        assert_eq!(high.late, MAX_LEAD);
    }

    #[test]
    fn the_estimate_settles_at_the_80th_percentile() {
        // Lateness spread evenly over 1..=25 µs, in a scrambled but fixed order: its 80th
        // percentile is 20 µs.
        let mut hires = unarmed(0);
        let mut x = 7u64;
        let mut seen = Vec::new();
        for i in 0..20_000 {
            x = (x * 21 + 3) % 25;
            hires.target = Nanos(0);
            hires.record(Nanos((x + 1) * 1_000));
            if i >= 10_000 {
                seen.push(hires.late);
            }
        }
        let mean = seen.iter().sum::<u64>() / seen.len() as u64;
        assert!((19_000..=21_000).contains(&mean), "{mean}");
        // And it follows a machine that gets slower: lateness of 28 µs, 80th percentile 28.
        for _ in 0..200 {
            hires.record(Nanos(28_000));
        }
        assert!((27_000..=MAX_LEAD).contains(&hires.late), "{}", hires.late);
    }

    #[test]
    fn a_failed_timerfd_reports_failure_and_never_arms() {
        let mut hires = unarmed(0);
        assert!(!hires.usable());
        assert!(!hires.arm(Nanos(10), Nanos(5), Duration::from_micros(1)));
        assert_eq!(hires.armed(), None);
        hires.disarm();
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert_eq!(hires.poll_expired(&mut cx), Poll::Ready(false));
    }

    #[test]
    fn the_clock_runs_in_real_time() {
        // No runtime: tokio's clock is the real one.
        assert!(clock_runs());
    }
}
