//! Linux: one thread per process that wakes the waits below tokio's 1 ms tick.
//!
//! Every wait that must end on time registers its deadline and its task's waker here. The
//! thread sleeps on a condition variable until the soonest deadline less the lead (how late
//! recent wake-ups reached their tasks), wakes the waits that are due and sleeps again. A woken
//! wait yields for the last microseconds and leaves on its own clock read, so it is never
//! early. It needs nothing of the runtime (no IO driver, no file descriptor) and only the
//! standard library: the thread is started on the first such wait and then stays, asleep
//! while no wait is registered. An adapter holds nothing of it while it is idle.
//!
//! If the thread cannot be started, every wait sleeps on tokio's wheel instead, as on other
//! systems.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::task::Waker;
use std::time::Duration;

use tokio::time::Instant;

use super::SubTick;

/// The most waits the thread holds at once; a wait beyond them sleeps on the wheel. Each holds
/// a deadline at most `SUB_TICK_SPAN` away, and only a wait its rule cannot make late registers
/// (burst 1, `min_interval`, `precise()`), so a process has few at once unless it runs
/// hundreds of burst-1 streams or keys side by side.
const MAX_WAITS: usize = 1024;

/// The most a wait ends by yielding after its wake-up: on a machine whose wake-ups come later
/// than this (a loaded one), the wait costs rate rather than a busy core. A wake-up here
/// crosses threads (the timer thread's sleep ends, then the task's worker is woken), so it
/// comes later than a timer read on the task's own thread would: 40 to 120 µs on the 2-core
/// test VM (see BENCHMARKS.md, "burst 1").
const MAX_LEAD: u64 = 200_000;

/// How the lateness estimate moves: down one step for a wake-up no later than the estimate, up
/// [`UP_STEPS`] steps for one later, so it settles where one in `UP_STEPS + 1` is later (the
/// 80th percentile), and a single long preemption moves it by a microsecond, not by the
/// preemption. (The 90th percentile kept no more rate on the test VM and cost up to twice the
/// CPU under load: BENCHMARKS.md, "Burst 1".)
const STEP: u64 = 250;
const UP_STEPS: u64 = 4;

/// The same for a `precise()` wait's lead, up [`PRECISE_UP_STEPS`] steps for a later wake-up:
/// it settles at the 95th percentile. Such a wait asked for every interval, however short, and
/// pays for it in CPU: at 10,000 items a second on the test VM the 80th percentile kept 0.97 of
/// the rate, the 95th 0.99 (BENCHMARKS.md, "Even pacing below a millisecond").
const PRECISE_UP_STEPS: u64 = 19;

/// Asks the timer thread to wake the task of `waker` shortly before `at` (`now` is tokio's
/// clock just read, running in real time), the lead before it: the `precise()` lead if
/// `precise`. A wait due within the lead is not armed: it yields ([`SubTick::Yield`]).
pub(crate) fn wait(at: Instant, now: Instant, waker: &Waker, precise: bool) -> SubTick {
    let left = at.saturating_duration_since(now);
    // On the timer as recorded, under one lock. A wait within the lead yields and needs no
    // thread: decided whatever process started the timer (as `woke` does), without a system
    // call for the process id. A woken wait asks once more before it leaves, and that call
    // yields, so only an armed wait asks for the process id.
    {
        let recorded = TIMER
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((started_in, Started::Running(timer))) = &*recorded {
            let mut state = timer.lock();
            if state.yields(left, precise) {
                return SubTick::Yield;
            }
            if *started_in == std::process::id() {
                return timer.arm(state, at, left, waker, precise);
            }
        }
    }
    // No timer yet, or a forked process's parent's: start this process's own.
    match timer(std::process::id()) {
        Some(timer) => timer.wait(at, left, waker, precise),
        None => SubTick::Unavailable,
    }
}

#[cfg(test)]
thread_local! {
    /// How many wake-ups this thread has reported ([`woke`]): for the tests of the callers.
    pub(crate) static WOKEN_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Tells the timer thread that a wait it armed (with the `precise()` lead if `precise`) was
/// polled again at `now`, its deadline `at`: how late the wake-up reached the task, which sets
/// the leads.
pub(crate) fn woke(at: Instant, now: Instant, precise: bool) {
    #[cfg(test)]
    WOKEN_HERE.with(|count| count.set(count.get() + 1));
    // The timer as recorded, whatever process started it: no system call for the process id
    // on every wake-up. In a forked process that has not armed a wait of its own yet, the
    // record is its parent's, and the report only moves a lead nobody reads.
    // Reported under the read lock, without cloning the `Arc`: the lock is only ever taken for
    // writing to start a timer, and the timer thread never takes it.
    let recorded = TIMER
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, Started::Running(timer))) = &*recorded {
        timer.woke(at, now, precise);
    }
}

impl Timer {
    /// Records how late a wait for `at`, armed here (with the `precise()` lead if `precise`),
    /// was polled again (at `now`).
    fn woke(&self, at: Instant, now: Instant, precise: bool) {
        let mut state = self.lock();
        // Late by how much after the moment the task was to be woken (the deadline less the
        // lead). A poll before that moment was not the thread's wake-up (the task was woken for
        // another reason) and says nothing of it.
        let target = at.checked_sub(state.lead(precise)).unwrap_or(at);
        if now >= target {
            state.record(now - target);
        }
    }
}

/// The timer of process `pid` (the caller's), started on the first call; `None` if its thread
/// could not be started. A start that failed (the process at its limit of threads, say) is
/// tried again after [`RETRY`], not on every wait meanwhile.
///
/// Kept with the process id it was started in: a process forked from one that had started it
/// has no such thread (`fork` copies only the calling thread), and its waits would never be
/// woken, so it starts its own.
fn timer(pid: u32) -> Option<Arc<Timer>> {
    let known = TIMER
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(timer) = known_to(&known, pid) {
        return timer;
    }
    drop(known);
    let mut current = TIMER
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(timer) = known_to(&current, pid) {
        return timer;
    }
    let timer = Timer::start();
    let started = match &timer {
        Some(timer) => Started::Running(Arc::clone(timer)),
        None => Started::Failed(std::time::Instant::now()),
    };
    *current = Some((pid, started));
    timer
}

/// What process `pid` has of its timer, as `current` records it: the timer, or `None` while a
/// failed start is recent; `None` (outer) if it is to be started (again).
fn known_to(current: &Option<(u32, Started)>, pid: u32) -> Option<Option<Arc<Timer>>> {
    match current {
        Some((started_in, Started::Running(timer))) if *started_in == pid => {
            Some(Some(Arc::clone(timer)))
        }
        Some((started_in, Started::Failed(at))) if *started_in == pid && at.elapsed() < RETRY => {
            Some(None)
        }
        _ => None,
    }
}

/// How long after a failed start of the timer thread the next wait tries again; the waits
/// meanwhile sleep on tokio's wheel.
const RETRY: Duration = Duration::from_secs(1);

/// The timer of the process that last started one ([`timer`]), with that process's id.
static TIMER: RwLock<Option<(u32, Started)>> = RwLock::new(None);

/// The timer thread of a process, or when it last failed to start.
#[derive(Debug)]
enum Started {
    Running(Arc<Timer>),
    Failed(std::time::Instant),
}

/// What the waits and the timer thread share.
#[derive(Debug, Default)]
struct Timer {
    state: Mutex<State>,
    /// Signalled when a wait is due before the thread would wake.
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// The waits not yet woken, in no order; their deadlines are on the real clock.
    waits: Vec<Registered>,
    /// When the thread wakes next: `None` while it sleeps with no wait to wake, `Some` of a
    /// time in the past while it is awake and will look at the waits again before sleeping.
    wakes_at: Option<std::time::Instant>,
    /// How late the wake-ups reached their tasks, in nanoseconds: an estimate of the 80th
    /// percentile of the recent ones (see [`State::record`]), at most [`MAX_LEAD`].
    late: u64,
    /// The same, of the 95th percentile: the lead of `precise()` waits.
    late_precise: u64,
}

#[derive(Debug)]
struct Registered {
    /// The deadline as the wait knows it, on tokio's clock (which may run ahead of the real
    /// clock by a constant, after a `pause` and `resume`).
    deadline: Instant,
    /// When to wake the task, on the real clock, which the thread reads: the deadline less the
    /// lead.
    at: std::time::Instant,
    waker: Waker,
}

impl Timer {
    fn start() -> Option<Arc<Timer>> {
        let timer = Arc::new(Timer::default());
        let run = Arc::clone(&timer);
        std::thread::Builder::new()
            .name("paced-timer".into())
            // It holds a few locals and calls wakers (and, should one panic, the panic hook).
            .stack_size(256 * 1024)
            .spawn(move || run.run())
            .ok()?;
        Some(timer)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding it, short of a waker's `clone`; a poisoned lock holds
        // consistent state.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a wait for `deadline` (tokio's clock), due `left` from now, with the
    /// `precise()` lead if `precise`.
    fn wait(&self, deadline: Instant, left: Duration, waker: &Waker, precise: bool) -> SubTick {
        let mut state = self.lock();
        if state.yields(left, precise) {
            return SubTick::Yield;
        }
        self.arm(state, deadline, left, waker, precise)
    }

    /// [`Timer::wait`] for a wait beyond the lead, `state` locked: registers it.
    fn arm(
        &self,
        mut state: MutexGuard<'_, State>,
        deadline: Instant,
        left: Duration,
        waker: &Waker,
        precise: bool,
    ) -> SubTick {
        let lead = state.lead(precise);
        let now = std::time::Instant::now();
        let at = now + left;
        let target = at - lead;
        // A wait polled again (woken for another reason) is registered once.
        let known = state
            .waits
            .iter()
            .any(|w| w.deadline == deadline && w.waker.will_wake(waker));
        if !known {
            if state.waits.len() >= MAX_WAITS {
                return SubTick::Unavailable;
            }
            state.waits.push(Registered {
                deadline,
                at: target,
                waker: waker.clone(),
            });
        }
        // Wake the thread only if it would sleep past this wait.
        if state.wakes_at.is_none_or(|wakes| target < wakes) {
            state.wakes_at = Some(target);
            drop(state);
            self.changed.notify_one();
        }
        SubTick::Armed
    }

    /// The thread: wakes the waits that are due, a few at a time outside the lock, then sleeps
    /// until the next is due, or until a new one is.
    fn run(&self) {
        exact_sleeps();
        let mut state = self.lock();
        loop {
            let now = std::time::Instant::now();
            let mut due: [Option<Waker>; 16] = Default::default();
            let mut taken = 0;
            let mut i = 0;
            while i < state.waits.len() && taken < due.len() {
                if state.waits[i].at <= now {
                    due[taken] = Some(state.waits.swap_remove(i).waker);
                    taken += 1;
                } else {
                    i += 1;
                }
            }
            if taken > 0 {
                // Awake: a wait registered meanwhile needs no signal, it is looked at next.
                state.wakes_at = Some(now);
                drop(state);
                for waker in due.into_iter().flatten() {
                    // A waker that panics must not end the thread: every later wait would
                    // then hang. Its own task was woken or not; the others still are.
                    let _ = std::panic::catch_unwind(AssertUnwindSafe(|| waker.wake()));
                }
                state = self.lock();
                continue;
            }
            let next = state.waits.iter().map(|w| w.at).min();
            state = match next {
                None => {
                    state.wakes_at = None;
                    self.changed
                        .wait(state)
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                }
                Some(target) => {
                    state.wakes_at = Some(target);
                    let sleep = target.saturating_duration_since(now);
                    self.changed
                        .wait_timeout(state, sleep)
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .0
                }
            };
        }
    }
}

/// Asks the kernel to end this thread's timed sleeps on time: a thread's timer slack (50 µs by
/// default) lets the kernel end them that much later, to merge wake-ups. Best effort, through
/// `/proc` (no system call wrapper in `std`); where it fails, the lead absorbs the slack.
fn exact_sleeps() {
    let Ok(path) = std::fs::read_link("/proc/thread-self") else {
        return;
    };
    // `<pid>/task/<tid>`: the thread's own entry is `/proc/<tid>`.
    if let Some(tid) = path.file_name() {
        let slack = std::path::Path::new("/proc")
            .join(tid)
            .join("timerslack_ns");
        // 1 ns: 0 would mean "the process's default".
        let _ = std::fs::write(slack, "1");
    }
}

impl State {
    /// Whether a wait due `left` from now is within the lead (the `precise()` lead if
    /// `precise`), so that it yields rather than being armed; if so, lowers that lead a
    /// little (call it once per decision).
    fn yields(&mut self, left: Duration, precise: bool) -> bool {
        if left > self.lead(precise) {
            return false;
        }
        // No wake-up, so no lateness learned: lower the lead a little at each such wait, so
        // that one learned on a loaded machine does not keep short waits yielding (a busy
        // core) once the machine is idle. Waits at the new lead are armed and say again how
        // late wake-ups come.
        let late = if precise {
            &mut self.late_precise
        } else {
            &mut self.late
        };
        *late = late.saturating_sub(STEP / 8);
        true
    }

    /// How long before a deadline the task should be woken: what wake-ups were late by lately
    /// (the 80th percentile, at most [`MAX_LEAD`]), so that the wait can end by yielding for
    /// that last stretch and the item leave on time rather than a wake-up late.
    ///
    /// The percentile trades CPU for rate: the stretch spent yielding is the lead less the
    /// wake-up's lateness, and an item is late only when its wake-up is later than the lead.
    /// A `precise()` wait (`precise`) takes the 95th percentile.
    fn lead(&self, precise: bool) -> Duration {
        let late = if precise {
            self.late_precise
        } else {
            self.late
        };
        Duration::from_nanos(late.min(MAX_LEAD))
    }

    /// Records how late a wake-up reached its task, in both estimates.
    fn record(&mut self, late: Duration) {
        let late = u64::try_from(late.as_nanos()).unwrap_or(u64::MAX);
        let step = |estimate: u64, up: u64| {
            if late > estimate {
                estimate.saturating_add(up * STEP).min(MAX_LEAD)
            } else {
                estimate.saturating_sub(STEP)
            }
        };
        self.late = step(self.late, UP_STEPS);
        self.late_precise = step(self.late_precise, PRECISE_UP_STEPS);
    }
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
        assert_eq!(late(0).lead(false), Duration::ZERO);
        assert_eq!(late(4_000).lead(false), Duration::from_nanos(4_000));
        assert_eq!(late(u64::MAX).lead(false), Duration::from_nanos(MAX_LEAD));
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
    fn the_precise_estimate_settles_at_the_95th_percentile() {
        // Lateness spread evenly over 1..=100 µs, in a scrambled but fixed order: its 80th
        // percentile is 80 µs, its 95th 95 µs.
        let mut state = late(0);
        let mut x = 7u64;
        let (mut plain, mut precise) = (Vec::new(), Vec::new());
        for i in 0..40_000 {
            x = (x * 41 + 3) % 100;
            state.record(Duration::from_nanos((x + 1) * 1_000));
            if i >= 20_000 {
                plain.push(state.lead(false).as_nanos() as u64);
                precise.push(state.lead(true).as_nanos() as u64);
            }
        }
        let mean = |v: &[u64]| v.iter().sum::<u64>() / v.len() as u64;
        assert!(
            (78_000..=82_000).contains(&mean(&plain)),
            "{}",
            mean(&plain)
        );
        assert!(
            (93_000..=97_000).contains(&mean(&precise)),
            "{}",
            mean(&precise)
        );
    }

    /// A timer (without its thread) whose estimates are `late` and `late_precise` ns.
    fn with_leads(late: u64, late_precise: u64) -> Timer {
        let timer = Timer::default();
        {
            let mut state = timer.lock();
            state.late = late;
            state.late_precise = late_precise;
        }
        timer
    }

    #[test]
    fn a_precise_wait_takes_the_precise_lead() {
        let timer = with_leads(20_000, 60_000);
        let waker = Waker::noop();
        let deadline = Instant::now() + Duration::from_millis(1);
        let us = Duration::from_micros;
        // 40 µs left: beyond the plain lead, within the precise one.
        assert_eq!(timer.wait(deadline, us(40), waker, false), SubTick::Armed);
        assert_eq!(
            timer.wait(deadline + us(1), us(40), waker, true),
            SubTick::Yield
        );
        // Armed beyond it, to be woken the precise lead (60 µs) before its deadline, 100 µs
        // away: 40 µs after the call (the plain lead would make that 80 µs).
        let before = std::time::Instant::now();
        assert_eq!(
            timer.wait(deadline + us(2), us(100), waker, true),
            SubTick::Armed
        );
        let after = std::time::Instant::now();
        let state = timer.lock();
        let precise = state.waits.iter().map(|w| w.at).max().expect("registered");
        assert!(precise >= before + us(40), "{:?}", precise - before);
        assert!(precise <= after + us(40), "{:?}", precise - after);
    }

    #[test]
    fn a_precise_wake_up_is_timed_from_the_precise_lead() {
        let timer = with_leads(20_000, 60_000);
        let at = Instant::now() + Duration::from_millis(1);
        // Polled 50 µs before the deadline: 10 µs after a precise wait's wake-up was due (on
        // time, so both estimates come down a step), but before a plain wait's (nothing).
        let estimates = || {
            let state = timer.lock();
            (state.late, state.late_precise)
        };
        timer.woke(at, at - Duration::from_micros(50), false);
        assert_eq!(estimates(), (20_000, 60_000));
        timer.woke(at, at - Duration::from_micros(50), true);
        assert_eq!(estimates(), (20_000 - STEP, 60_000 - STEP));
    }

    #[test]
    fn a_wait_within_the_lead_yields_and_one_beyond_it_is_armed_once() {
        let timer = Timer::default();
        timer.lock().late = 50_000;
        struct Task;
        impl std::task::Wake for Task {
            fn wake(self: Arc<Self>) {}
        }
        let waker = &Waker::from(Arc::new(Task));
        let deadline = Instant::now() + Duration::from_millis(1);
        let us = Duration::from_micros;
        assert_eq!(timer.wait(deadline, us(40), waker, false), SubTick::Yield);
        let armed_at = std::time::Instant::now();
        assert_eq!(timer.wait(deadline, us(51), waker, false), SubTick::Armed);
        // Polled again for the same deadline: the same registration.
        assert_eq!(timer.wait(deadline, us(40), waker, false), SubTick::Yield);
        assert_eq!(timer.wait(deadline, us(60), waker, false), SubTick::Armed);
        assert_eq!(timer.lock().waits.len(), 1);
        // Another deadline of the same task (two timers in one task): a registration of its own.
        assert_eq!(
            timer.wait(deadline + us(300), us(400), waker, false),
            SubTick::Armed
        );
        {
            let state = timer.lock();
            assert_eq!(state.waits.len(), 2);
            // The thread is to wake for the soonest, a lead (50 µs) before its deadline: 1 µs
            // after the first registration.
            let soonest = state.waits.iter().map(|w| w.at).min();
            assert_eq!(state.wakes_at, soonest);
            let first = soonest.expect("registered").duration_since(armed_at);
            // Later only by however long this thread was preempted in between.
            assert!(
                first >= us(1) && first < Duration::from_secs(5),
                "{first:?}"
            );
        }
    }

    #[test]
    fn a_panicking_waker_does_not_stop_the_thread() {
        struct Panics;
        impl std::task::Wake for Panics {
            fn wake(self: Arc<Self>) {
                panic!("a waker that panics");
            }
        }
        struct Sends(Mutex<std::sync::mpsc::Sender<()>>);
        impl std::task::Wake for Sends {
            fn wake(self: Arc<Self>) {
                let _ = self.0.lock().map(|tx| tx.send(()));
            }
        }
        let timer = Timer::start().expect("a thread");
        let (tx, rx) = std::sync::mpsc::channel();
        let now = Instant::now();
        let panics = Waker::from(Arc::new(Panics));
        let sends = Waker::from(Arc::new(Sends(Mutex::new(tx))));
        let ms = Duration::from_millis;
        assert_eq!(
            timer.wait(now + ms(1), ms(1), &panics, false),
            SubTick::Armed
        );
        assert_eq!(
            timer.wait(now + ms(3), ms(3), &sends, false),
            SubTick::Armed
        );
        // Woken after the panic (generous: the thread only has to come round).
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the second wait was woken");
        // And the thread still runs: a third wait is woken too.
        let (tx, rx) = std::sync::mpsc::channel();
        let again = Waker::from(Arc::new(Sends(Mutex::new(tx))));
        let now = Instant::now();
        assert_eq!(
            timer.wait(now + ms(1), ms(1), &again, false),
            SubTick::Armed
        );
        rx.recv_timeout(Duration::from_secs(10))
            .expect("a wait after the panic was woken");
    }

    #[test]
    fn a_forked_process_starts_a_timer_of_its_own() {
        let pid = std::process::id();
        let ours = timer(pid).expect("a timer");
        assert!(
            Arc::ptr_eq(&ours, &timer(pid).expect("a timer")),
            "one per process"
        );
        // Seen from another process id (as in a child after `fork`, which has no timer
        // thread), a new timer.
        let forked = timer(pid.wrapping_add(1)).expect("a timer");
        assert!(!Arc::ptr_eq(&ours, &forked));
        // Restored for the other tests of this process.
        let back = timer(pid).expect("a timer");
        assert!(!Arc::ptr_eq(&forked, &back));
    }

    #[test]
    fn yields_lower_a_lead_that_no_wake_up_can_correct() {
        // A lead learned under load, above every gap: waits only yield, and learn nothing.
        let timer = Timer::default();
        timer.lock().late = MAX_LEAD;
        let waker = Waker::noop();
        let deadline = Instant::now() + Duration::from_millis(1);
        let gap = Duration::from_micros(100);
        let mut yields = 0;
        while timer.wait(deadline, gap, waker, false) == SubTick::Yield {
            yields += 1;
            assert!(yields < 10_000, "the lead never came down");
        }
        // Armed once the lead is below the gap: the next wake-up says how late they come.
        assert!(timer.lock().lead(false) < gap);
    }

    #[test]
    fn a_poll_before_the_wake_up_teaches_nothing() {
        let timer = Timer::default();
        timer.lock().late = 20_000;
        let at = Instant::now() + Duration::from_millis(1);
        // Polled 30 µs before the deadline, 10 µs before the thread would have woken it.
        timer.woke(at, at - Duration::from_micros(30), false);
        assert_eq!(timer.lock().late, 20_000);
        // Polled 5 µs after the wake-up was due: on time (within the estimate), one step down.
        timer.woke(at, at - Duration::from_micros(15), false);
        assert_eq!(timer.lock().late, 20_000 - STEP);
    }
}
