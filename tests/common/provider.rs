//! A simulated provider with a hidden limit, and clients that find it with an [`Adaptive`]:
//! the test bed of `integration/tests/adaptive_convergence.rs` and `integration/tests/quota.rs`,
//! reused by `tests/paced/adaptive.rs`, `benches/adaptive.rs` and `examples/adaptive_partner.rs` (by
//! `#[path]`).
//!
//! The provider is a token bucket of rate `L` and burst `B` on its own side. A call that finds
//! a token succeeds, otherwise it is refused, with `Retry-After` (the time until its next
//! token, rounded up to a millisecond) or without; the answer comes back after the round trip. Clients are streams paced by
//! `throttle_with(adaptive.limiter(), |_| 1, Shaping)` with `buffer_unordered(c)`, and tasks
//! that `acquire` one token per call; every outcome is reported to the `Adaptive`. A refused
//! call is retried: it goes back through the limiter as the next call (all calls are alike, so
//! the stream of calls is endless and a retry is simply the next one).
//!
//! With [`Scenario::announce`], the provider also announces its quota with every answer, and
//! the clients report it with `Adaptive::on_quota`: a token bucket (GCRA) announces
//! `limit` = its burst `B` per `window` = `B / L` (the time it takes to fill from empty, so that
//! `limit / window` = `L`), `remaining` = its whole tokens left and `reset` = the seconds until
//! it is full, rounded up; a fixed window of `w` announces `limit` = `L × w` per `w`,
//! `remaining` = the calls left in the window and `reset` = the time to its end, rounded up to a
//! millisecond. A fixed window's new limit applies from its next window.
//!
//! Everything runs on tokio's paused clock: a run of 80 s of simulated time takes only the
//! CPU its calls cost.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{stream, StreamExt};
#[cfg(feature = "unstable-laws")]
pub use paced::limiter::AdaptiveLaw;
use paced::limiter::{AdaptiveStats, Announced};
use paced::{Adaptive, PaceExt, Rate, RateLimiter, Shaping};

/// Without the `unstable-laws` feature, the default law only.
#[cfg(not(feature = "unstable-laws"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdaptiveLaw {
    Cubic,
}
use tokio::time::Instant;

/// Tokens per second.
pub fn per_second(rate: Rate) -> f64 {
    rate.tokens() as f64 / rate.per().as_secs_f64()
}

/// A rate of `r` per second, in thousandths (as the controller keeps them).
pub fn rate_of(r: f64) -> Rate {
    Rate::new(
        ((r * 1000.0).round() as u64).max(1),
        Duration::from_secs(1000),
    )
}

/// The provider's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Ok,
    Refused(Option<Duration>),
}

/// What the provider announces with its answers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Announce {
    /// Nothing: the limit is hidden.
    Nothing,
    /// Its token bucket (see the module's documentation).
    Bucket,
    /// It is a fixed window of this many seconds instead of a token bucket, and says so.
    FixedWindow(f64),
}

/// The provider's token bucket: `rate` per second, at most `burst`, starting full.
#[derive(Debug)]
pub struct Provider {
    state: Mutex<Bucket>,
    retry_after: bool,
    announce: Announce,
}

/// A fixed window's count: the window `index` started at `index × w`.
#[derive(Debug, Default)]
struct Window {
    index: u64,
    used: u64,
    /// The limit per second from the next window on, if it changes.
    next_rate: Option<f64>,
}

#[derive(Debug)]
struct Bucket {
    rate: f64,
    burst: f64,
    level: f64,
    at: Instant,
    start: Instant,
    window: Window,
}

impl Provider {
    pub fn new(rate: f64, burst: f64, retry_after: bool) -> Provider {
        Provider::announcing(rate, burst, retry_after, Announce::Nothing)
    }

    pub fn announcing(rate: f64, burst: f64, retry_after: bool, announce: Announce) -> Provider {
        let now = Instant::now();
        Provider {
            state: Mutex::new(Bucket {
                rate,
                burst,
                level: burst,
                at: now,
                start: now,
                window: Window::default(),
            }),
            retry_after,
            announce,
        }
    }

    /// A call arriving now, and what the provider announces with its answer.
    pub fn call_announced(&self) -> (Answer, Option<Announced>) {
        let Announce::FixedWindow(w) = self.announce else {
            let answer = self.call();
            if self.announce == Announce::Nothing {
                return (answer, None);
            }
            let b = self.state.lock().unwrap();
            let remaining = b.level.floor() as u64;
            let reset = ((b.burst - b.level) / b.rate).ceil().max(0.0);
            let quota = Announced::new(remaining, Duration::from_secs(reset as u64)).with_policy(
                b.burst.round() as u64,
                Duration::from_secs_f64(b.burst / b.rate),
            );
            return (answer, Some(quota));
        };
        let mut b = self.state.lock().unwrap();
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(b.start).as_secs_f64();
        let index = (elapsed / w).floor() as u64;
        if index != b.window.index {
            b.window.index = index;
            b.window.used = 0;
            if let Some(rate) = b.window.next_rate.take() {
                b.rate = rate;
            }
        }
        let limit = (b.rate * w).round() as u64;
        let end = (index + 1) as f64 * w - elapsed;
        let reset = Duration::from_millis((end * 1000.0).ceil() as u64);
        let answer = if b.window.used < limit {
            b.window.used += 1;
            Answer::Ok
        } else if self.retry_after {
            Answer::Refused(Some(reset))
        } else {
            Answer::Refused(None)
        };
        let remaining = limit - b.window.used;
        let quota = Announced::new(remaining, reset).with_policy(limit, Duration::from_secs_f64(w));
        (answer, Some(quota))
    }

    fn refill(b: &mut Bucket, now: Instant) {
        let dt = now.saturating_duration_since(b.at).as_secs_f64();
        b.level = (b.level + dt * b.rate).min(b.burst);
        b.at = now;
    }

    /// A call arriving now.
    pub fn call(&self) -> Answer {
        let mut b = self.state.lock().unwrap();
        Provider::refill(&mut b, Instant::now());
        if b.level >= 1.0 {
            b.level -= 1.0;
            return Answer::Ok;
        }
        if !self.retry_after {
            return Answer::Refused(None);
        }
        let wait = (1.0 - b.level) / b.rate;
        let ms = (wait * 1000.0).ceil().max(1.0) as u64;
        Answer::Refused(Some(Duration::from_millis(ms)))
    }

    /// The provider changes its limit (keeping the tokens it holds).
    pub fn set_rate(&self, rate: f64) {
        let mut b = self.state.lock().unwrap();
        if let Announce::FixedWindow(_) = self.announce {
            b.window.next_rate = Some(rate);
            return;
        }
        Provider::refill(&mut b, Instant::now());
        b.rate = rate;
    }
}

/// One simulated run.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The provider's hidden rate `L` (calls per second) and burst `B`.
    pub limit: f64,
    pub provider_burst: f64,
    pub retry_after: bool,
    /// The round trip of every call.
    pub latency: Duration,
    /// Streams, each with up to `concurrency` calls in flight, and tasks with one each.
    pub streams: usize,
    pub concurrency: usize,
    pub tasks: usize,
    /// The controller's range; it starts at `max`.
    pub min: Rate,
    pub max: Rate,
    /// The client limiter's burst.
    pub client_burst: u64,
    /// The provider's limit changes to `.1` at `.0`.
    pub changes: Vec<(Duration, f64)>,
    pub duration: Duration,
    pub law: AdaptiveLaw,
    /// What the provider announces with its answers.
    pub announce: Announce,
    /// The client limiter's starting rate (default `max`).
    pub start: Option<Rate>,
}

impl Scenario {
    /// One stream, `max = 10 × L`, `min` = 0.1/s, the provider's burst 50 ms of its rate and
    /// the client's 1 ms of `max` (both at least 2: with a burst of 1, tokio's 1 ms tick would
    /// cost every grant that wakes late the time it was late).
    pub fn new(limit: f64, latency_ms: u64, concurrency: usize, retry_after: bool) -> Scenario {
        let max = rate_of(10.0 * limit);
        Scenario {
            limit,
            provider_burst: (limit * 0.05).round().max(2.0),
            retry_after,
            latency: Duration::from_millis(latency_ms),
            streams: 1,
            concurrency,
            tasks: 0,
            min: Rate::new(1, Duration::from_secs(10)),
            max,
            client_burst: ((10.0 * limit / 1000.0).round() as u64).max(2),
            changes: Vec::new(),
            duration: Duration::from_secs(80),
            law: AdaptiveLaw::Cubic,
            announce: Announce::Nothing,
            start: None,
        }
    }
}

/// What a run saw, per whole second of simulated time.
#[derive(Clone, Debug, Default)]
pub struct Run {
    /// Successful and refused calls answered in each second.
    pub ok: Vec<u64>,
    pub refused: Vec<u64>,
    /// The controller's rate at the end of each second (calls per second).
    pub rate: Vec<f64>,
    /// The lowest and highest rate seen right after any report.
    pub lowest: f64,
    pub highest: f64,
    pub stats: Option<AdaptiveStats>,
}

struct Record {
    start: Instant,
    end: Instant,
    run: Run,
}

impl Record {
    fn note(&mut self, ok: bool, rate: f64) {
        let now = Instant::now();
        if now >= self.end {
            return;
        }
        let s = now.duration_since(self.start).as_secs() as usize;
        let run = &mut self.run;
        if ok {
            run.ok[s] += 1;
        } else {
            run.refused[s] += 1;
        }
        run.lowest = run.lowest.min(rate);
        run.highest = run.highest.max(rate);
    }
}

/// One call: the provider's decision, the round trip, the report. The provider decides as the
/// call leaves: a fixed delay on the way there would only shift the provider's clock, and one
/// timer per call instead of two keeps the simulation cheap.
async fn call(provider: &Provider, adaptive: &Adaptive, record: &Mutex<Record>, latency: Duration) {
    let (answer, quota) = provider.call_announced();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    match (answer, quota) {
        (Answer::Ok, Some(quota)) => adaptive.on_quota(quota),
        (Answer::Ok, None) => adaptive.on_success(),
        (Answer::Refused(retry_after), _) => adaptive.on_throttled(retry_after),
    }
    let rate = per_second(adaptive.rate());
    record.lock().unwrap().note(answer == Answer::Ok, rate);
}

/// Runs `scenario` on the current (paused) runtime, with the controller `adaptive` over a
/// limiter at `max`, or a fresh one.
pub async fn simulate(scenario: &Scenario) -> Run {
    let limiter = RateLimiter::new(
        scenario.start.unwrap_or(scenario.max),
        scenario.client_burst,
    );
    #[cfg(feature = "unstable-laws")]
    let adaptive = Adaptive::try_with_law(limiter, scenario.min, scenario.max, scenario.law);
    #[cfg(not(feature = "unstable-laws"))]
    let adaptive = {
        let AdaptiveLaw::Cubic = scenario.law;
        Adaptive::try_new(limiter, scenario.min, scenario.max)
    };
    let adaptive = adaptive.expect("min <= max");
    simulate_with(scenario, &adaptive).await
}

/// [`simulate`] with a given controller (its limiter's burst is the client's).
pub async fn simulate_with(scenario: &Scenario, adaptive: &Adaptive) -> Run {
    let start = Instant::now();
    let end = start + scenario.duration;
    let seconds = scenario.duration.as_secs() as usize + 1;
    let provider = Arc::new(Provider::announcing(
        scenario.limit,
        scenario.provider_burst,
        scenario.retry_after,
        scenario.announce,
    ));
    let record = Arc::new(Mutex::new(Record {
        start,
        end,
        run: Run {
            ok: vec![0; seconds],
            refused: vec![0; seconds],
            rate: vec![0.0; seconds],
            lowest: f64::INFINITY,
            highest: 0.0,
            stats: None,
        },
    }));
    let latency = scenario.latency;
    let mut handles = Vec::new();
    for _ in 0..scenario.streams {
        let (provider, adaptive, record) = (provider.clone(), adaptive.clone(), record.clone());
        let c = scenario.concurrency;
        handles.push(tokio::spawn(async move {
            let limiter = adaptive.limiter().clone();
            stream::repeat(())
                .take_until(tokio::time::sleep_until(end))
                .throttle_with(&limiter, |_| 1, Shaping)
                .map(|()| call(&provider, &adaptive, &record, latency))
                .buffer_unordered(c)
                .for_each(|()| async {})
                .await;
        }));
    }
    for _ in 0..scenario.tasks {
        let (provider, adaptive, record) = (provider.clone(), adaptive.clone(), record.clone());
        handles.push(tokio::spawn(async move {
            // `timeout_at` returns what is ready at once even after its deadline: check the
            // time too.
            while Instant::now() < end {
                let granted = tokio::time::timeout_at(end, adaptive.limiter().acquire(1)).await;
                if granted.is_err() {
                    break;
                }
                call(&provider, &adaptive, &record, latency).await;
            }
        }));
    }
    {
        let (provider, adaptive, record) = (provider.clone(), adaptive.clone(), record.clone());
        let changes = scenario.changes.clone();
        handles.push(tokio::spawn(async move {
            let mut changes = changes.into_iter().peekable();
            for s in 1..seconds {
                let at = start + Duration::from_secs(s as u64);
                while let Some(&(when, rate)) = changes.peek() {
                    if start + when > at {
                        break;
                    }
                    tokio::time::sleep_until(start + when).await;
                    provider.set_rate(rate);
                    changes.next();
                }
                tokio::time::sleep_until(at).await;
                record.lock().unwrap().run.rate[s - 1] = per_second(adaptive.rate());
            }
        }));
    }
    for (i, handle) in handles.into_iter().enumerate() {
        let done =
            tokio::time::timeout(scenario.duration + Duration::from_secs(3600), handle).await;
        match done {
            Ok(joined) => joined.expect("client task panicked"),
            Err(_) => panic!(
                "client {i} still running an hour after the end: a lost wake-up? {:?} {:?}",
                adaptive,
                adaptive.limiter()
            ),
        }
    }
    let mut run = std::mem::take(&mut record.lock().unwrap().run);
    run.stats = Some(adaptive.stats());
    run
}

/// The 10 s windows `[t, t + 10)` for whole seconds `t` in `from..=to - 10`, each checked for
/// goodput at least `goodput × limit` and refusals at most `refused` of the calls; the first
/// window that fails, described.
pub fn check_windows(
    run: &Run,
    from: usize,
    to: usize,
    limit: f64,
    goodput: f64,
    refused: f64,
) -> Result<(), String> {
    check_windows_allowing(run, from, to, limit, goodput, refused, 0)
}

/// [`check_windows`], where a window may also hold up to `floor` refusals whatever their
/// share: at a few calls per second each of the law's probes above the limit costs a call, and
/// one or two of them in a 10 s window are above any small share (2 of 25 calls at 2.5/s is
/// 8 %).
#[allow(clippy::too_many_arguments)]
pub fn check_windows_allowing(
    run: &Run,
    from: usize,
    to: usize,
    limit: f64,
    goodput: f64,
    refused: f64,
    floor: u64,
) -> Result<(), String> {
    let to = to.min(run.ok.len() - 1);
    for t in from..=to.saturating_sub(10) {
        let (ok, no) = window(run, t, t + 10);
        let got = ok as f64 / 10.0;
        let share = no as f64 / (ok + no).max(1) as f64;
        if got < goodput * limit || (share > refused && no > floor) {
            return Err(format!(
                "window [{t} s, {} s): goodput {got:.2}/s (need {:.2}), refused {:.1} % \
                 (at most {:.1} %); rates {:?}",
                t + 10,
                goodput * limit,
                share * 100.0,
                refused * 100.0,
                &run.rate[t.saturating_sub(5)..(t + 10).min(run.rate.len())],
            ));
        }
    }
    Ok(())
}

/// Successful and refused calls answered in `[from, to)` seconds.
pub fn window(run: &Run, from: usize, to: usize) -> (u64, u64) {
    let ok = run.ok[from..to].iter().sum();
    let no = run.refused[from..to].iter().sum();
    (ok, no)
}

/// The first whole second `t` in `from..` from which every window up to `to` passes
/// [`check_windows`]; `None` if none does.
pub fn settled_from(
    run: &Run,
    from: usize,
    to: usize,
    limit: f64,
    goodput: f64,
    refused: f64,
) -> Option<usize> {
    (from..=to.saturating_sub(10))
        .find(|&t| check_windows(run, t, to, limit, goodput, refused).is_ok())
}
