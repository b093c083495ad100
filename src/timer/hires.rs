//! Linux: one `timerfd` per thread and runtime that wakes the waits below tokio's 1 ms tick.
//!
//! Every timer on a thread shares it: a wait registers its deadline and its task's waker, the
//! timerfd is armed for the soonest deadline less its recent lateness (the lead), and when it
//! expires the runtime's IO driver calls the dispatcher, which wakes the waits that are due and
//! arms the timerfd for the next. A woken wait yields for the last microseconds (the lead) and
//! leaves on its own clock read, so it is never early. An adapter holds nothing of this while
//! it is idle: one descriptor per thread, opened on the first wait that needs it.
//!
//! Every failure (no IO driver, no descriptor left, an error from the timerfd) makes the waits
//! sleep on tokio's wheel instead, as on other systems.

use std::future::{poll_fn, Future};
use std::io;
use std::os::fd::OwnedFd;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{ready, Context, Poll, Wake, Waker};
use std::time::Duration;

use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::runtime::{Handle, Id};
use tokio::time::Instant;

use super::SubTick;

/// The most waits one thread's timer holds at once; a wait beyond them sleeps on the wheel.
/// Each holds a deadline at most `SUB_TICK_SPAN` away, so even a keyed limiter with thousands
/// of keys has few at once.
const MAX_WAITS: usize = 256;

/// The most a wait ends by yielding after the timerfd: on a machine whose wake-ups come later
/// than this (a loaded one), the wait costs rate rather than a busy core. 100 µs: the 2-core
/// test VM's timerfd wake-ups come 35 to 70 µs late (10th to 80th percentile) on some hosts,
/// and a cap of 30 µs (enough on a quiet host) left burst 1 at 0.94 to 0.97 of 1,000/s there;
/// at 100 µs it kept 0.98 to 0.998 at 5 to 15 µs more CPU per item.
const MAX_LEAD: u64 = 100_000;

/// How the lateness estimate moves: down one step for an expiration read no later than the
/// estimate, up [`UP_STEPS`] steps for one read later, so it settles where one in
/// `UP_STEPS + 1` is later (the 80th percentile), and a single long preemption moves it by a
/// microsecond, not by the preemption.
const STEP: u64 = 250;
const UP_STEPS: u64 = 4;

/// Asks this thread's timer to wake the task of `waker` shortly before `at` (`now` is the
/// clock just read; tokio's clock, running in real time).
pub(crate) fn wait(at: Instant, now: Instant, waker: &Waker) -> SubTick {
    match this_thread() {
        Some(hires) => hires.wait(at, now, waker),
        None => SubTick::Unavailable,
    }
}

/// One thread's timer for one runtime.
#[derive(Debug)]
struct Hires {
    runtime: Id,
    fd: AsyncFd<OwnedFd>,
    /// The waker the IO driver calls when the timerfd is readable: [`Hires::dispatch`].
    dispatcher: Waker,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The waits not yet woken, in no order.
    waits: Vec<Registered>,
    /// When the timerfd is armed to expire: the soonest wait's deadline less the lead.
    expires: Option<Instant>,
    /// How late its expirations were read, in nanoseconds: an estimate of the 80th percentile
    /// of the recent ones (see [`State::record`]), at most [`MAX_LEAD`].
    late: u64,
    /// Reading or arming it failed: every wait sleeps on the wheel from now on.
    broken: bool,
}

#[derive(Debug)]
struct Registered {
    at: Instant,
    waker: Waker,
}

/// This thread's timer, made on the first call for the current runtime; `None` where none can
/// be had (outside a runtime, no IO driver, no descriptor left, broken).
fn this_thread() -> Option<Arc<Hires>> {
    thread_local! {
        static THREAD: std::cell::RefCell<Slot> = const { std::cell::RefCell::new(Slot::None) };
    }
    let runtime = Handle::try_current().ok()?.id();
    THREAD.with(|slot| {
        let mut slot = slot.borrow_mut();
        match &*slot {
            Slot::Open(hires) if hires.runtime == runtime => return Some(Arc::clone(hires)),
            Slot::Failed(failed) if *failed == runtime => return None,
            _ => {}
        }
        let made = Hires::open(runtime);
        *slot = match &made {
            Some(hires) => Slot::Open(Arc::clone(hires)),
            None => Slot::Failed(runtime),
        };
        made
    })
}

/// A thread's timer: none yet, one for a runtime, or none to be had for a runtime.
enum Slot {
    None,
    Open(Arc<Hires>),
    Failed(Id),
}

/// The dispatcher's waker: a weak reference, so that the timer (which holds the waker) is
/// freed with its thread.
struct Dispatcher(Weak<Hires>);

impl Wake for Dispatcher {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(hires) = self.0.upgrade() {
            hires.dispatch();
        }
    }
}

impl Hires {
    fn open(runtime: Id) -> Option<Arc<Hires>> {
        let fd = open().ok()?;
        let hires = Arc::new_cyclic(|weak| Hires {
            runtime,
            fd,
            dispatcher: Waker::from(Arc::new(Dispatcher(weak.clone()))),
            state: Mutex::new(State::default()),
        });
        // Registers the dispatcher with the IO driver.
        hires.drain().ok()?;
        Some(hires)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding it; a poisoned lock holds consistent state.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn wait(&self, at: Instant, now: Instant, waker: &Waker) -> SubTick {
        let mut state = self.lock();
        if state.broken {
            return SubTick::Unavailable;
        }
        let lead = state.lead();
        if at.saturating_duration_since(now) <= lead {
            return SubTick::Yield;
        }
        // A wait polled again (woken for another reason) is registered once.
        let known = state
            .waits
            .iter()
            .any(|w| w.at == at && w.waker.will_wake(waker));
        if !known {
            if state.waits.len() >= MAX_WAITS {
                return SubTick::Unavailable;
            }
            state.waits.push(Registered {
                at,
                waker: waker.clone(),
            });
        }
        let target = at.checked_sub(lead).unwrap_or(at);
        if state.expires.is_none_or(|expires| target < expires) && !self.arm(&mut state, target) {
            // Every wait goes back to the wheel: wake the others (outside the lock).
            let others = std::mem::take(&mut state.waits);
            drop(state);
            for wait in others {
                wait.waker.wake();
            }
            return SubTick::Unavailable;
        }
        SubTick::Armed
    }

    /// Arms the timerfd to expire at `target`, counted from a fresh clock read (so no earlier
    /// than that). On failure it is broken: every wait sleeps on the wheel from then on.
    fn arm(&self, state: &mut State, target: Instant) -> bool {
        let after = target.saturating_duration_since(Instant::now());
        // At least 1 ns: zero would disarm it.
        if set(self.fd.get_ref(), after.max(Duration::from_nanos(1))).is_err() {
            state.broken = true;
            return false;
        }
        state.expires = Some(target);
        true
    }

    /// Called by the IO driver when the timerfd is readable (and on the driver's shutdown):
    /// wakes the waits that are due, a few at a time outside the lock, and arms the timerfd
    /// for the next.
    fn dispatch(&self) {
        let mut drained = false;
        loop {
            let mut due: [Option<Waker>; 8] = Default::default();
            let more = {
                let mut state = self.lock();
                let now = Instant::now();
                if !drained {
                    drained = true;
                    match self.drain() {
                        // It expired, so it is disarmed (whatever the clock says).
                        Ok(true) => {
                            if let Some(expires) = state.expires.take() {
                                state.record(now.saturating_duration_since(expires));
                            }
                        }
                        Ok(false) => {}
                        Err(_) => state.broken = true,
                    }
                }
                let lead = state.lead();
                let broken = state.broken;
                let mut taken = 0;
                let mut i = 0;
                while i < state.waits.len() && taken < due.len() {
                    if broken || state.waits[i].at.saturating_duration_since(now) <= lead {
                        due[taken] = Some(state.waits.swap_remove(i).waker);
                        taken += 1;
                    } else {
                        i += 1;
                    }
                }
                let mut more = taken == due.len();
                if !more && !broken {
                    let next = state.waits.iter().map(|w| w.at).min();
                    if let Some(target) = next.map(|at| at.checked_sub(lead).unwrap_or(at)) {
                        // On failure the next round wakes the rest.
                        more = state.expires.is_none_or(|e| target < e)
                            && !self.arm(&mut state, target);
                    }
                }
                more
            };
            for waker in due.into_iter().flatten() {
                waker.wake();
            }
            if !more {
                return;
            }
        }
    }

    /// Reads the timerfd's expirations, if any (`true`: it expired), and registers the
    /// dispatcher for its next readiness. Outside the task's budget: run inside a task's poll,
    /// a spent budget would answer `Pending` and wake the dispatcher at once.
    fn drain(&self) -> io::Result<bool> {
        let mut expired = false;
        let readable = poll_fn(|cx| loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            // Reading the expiration count empties it; a stale readiness (expired and armed
            // again before this read) reads nothing, and `try_io` clears it.
            if let Ok(read) = guard.try_io(|fd| read_expirations(fd.get_ref())) {
                expired |= read? > 0;
                guard.clear_ready();
            }
        });
        let mut readable = pin!(tokio::task::coop::unconstrained(readable));
        let mut cx = Context::from_waker(&self.dispatcher);
        match readable.as_mut().poll(&mut cx) {
            Poll::Pending => Ok(expired),
            Poll::Ready(Err(e)) => Err(e),
            Poll::Ready(Ok(())) => Ok(expired),
        }
    }
}

impl State {
    /// How long before a deadline the timerfd should expire: what its expirations were late
    /// by lately (the 80th percentile, at most [`MAX_LEAD`]), so that the wait can end by
    /// yielding for that last stretch and the item leave on time rather than a wake-up late.
    ///
    /// The percentile trades CPU for rate: the stretch spent yielding is the lead less the
    /// wake-up's lateness, and an item is late only when its wake-up is later than the lead.
    fn lead(&self) -> Duration {
        Duration::from_nanos(self.late.min(MAX_LEAD))
    }

    /// Records how late an expiration was read.
    fn record(&mut self, late: Duration) {
        let late = u64::try_from(late.as_nanos()).unwrap_or(u64::MAX);
        self.late = if late > self.late {
            self.late.saturating_add(UP_STEPS * STEP).min(MAX_LEAD)
        } else {
            self.late.saturating_sub(STEP)
        };
    }
}

/// Set once a runtime without an IO driver was met: no timerfd is tried again in this process.
static NO_IO_DRIVER: AtomicBool = AtomicBool::new(false);

/// A non-blocking CLOCK_MONOTONIC timerfd registered for readability with the IO driver.
///
/// On a runtime built without its IO driver (`Builder::enable_time` alone), tokio's `AsyncFd`
/// panics instead of answering an error, and tokio has no way to ask first. That panic is
/// caught and answered as an error: the waits then sleep on the wheel, and so does every later
/// one in this process (the panic's message is printed once, by the panic hook). With
/// `panic = "abort"` it cannot be caught: such builds open no timerfd unless the feature
/// `hires-timer` says the runtime has its IO driver.
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
        // Saturated: a wait this long never reaches here (the waits are below a tick).
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

    fn late(late: u64) -> State {
        State {
            late,
            ..State::default()
        }
    }

    #[test]
    fn the_lead_is_the_estimate_at_most_max_lead() {
        assert_eq!(late(0).lead(), Duration::ZERO);
        assert_eq!(late(4_000).lead(), Duration::from_nanos(4_000));
        assert_eq!(late(u64::MAX).lead(), Duration::from_nanos(MAX_LEAD));
    }

    #[test]
    fn the_estimate_moves_a_step_at_a_time() {
        let mut state = late(0);
        // Later than the estimate: up four steps, whatever the lateness (a preemption of a
        // second counts as much as a microsecond).
        state.record(Duration::from_secs(1));
        assert_eq!(state.late, UP_STEPS * STEP);
        // Read no later than the estimate: down a step.
        state.record(Duration::from_nanos(1_000));
        assert_eq!(state.late, (UP_STEPS - 1) * STEP);
        state.record(Duration::ZERO);
        assert_eq!(state.late, (UP_STEPS - 2) * STEP);
        // Never below zero, never above MAX_LEAD.
        let mut low = late(0);
        low.record(Duration::ZERO);
        assert_eq!(low.late, 0);
        let mut high = late(MAX_LEAD);
        high.record(Duration::MAX);
        assert_eq!(high.late, MAX_LEAD);
    }

    #[test]
    fn the_estimate_settles_at_the_80th_percentile() {
        // Lateness spread evenly over 1..=25 µs, in a scrambled but fixed order: its 80th
        // percentile is 20 µs.
        let mut state = late(0);
        let mut x = 7u64;
        let mut seen = Vec::new();
        for i in 0..20_000 {
            x = (x * 21 + 3) % 25;
            state.record(Duration::from_nanos((x + 1) * 1_000));
            if i >= 10_000 {
                seen.push(state.late);
            }
        }
        let mean = seen.iter().sum::<u64>() / seen.len() as u64;
        assert!((19_000..=21_000).contains(&mean), "{mean}");
        // And it follows a machine that gets slower: lateness of 28 µs, 80th percentile 28.
        for _ in 0..200 {
            state.record(Duration::from_nanos(28_000));
        }
        assert!((27_000..=MAX_LEAD).contains(&state.late), "{}", state.late);
    }

    #[test]
    fn outside_a_runtime_there_is_no_timer() {
        let waker = Waker::noop();
        let now = Instant::now();
        assert_eq!(
            wait(now + Duration::from_millis(1), now, waker),
            SubTick::Unavailable
        );
    }
}
