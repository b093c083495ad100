//! A simulated LLM provider with several limits, a seeded workload, the exact oracle and the
//! worker pool that drives a client against the provider: the proof harness for pacing against
//! several limits at once (`integration/tests/llm_provider.rs`, by `#[path]`).
//!
//! Nothing here uses paced: the provider is written naively, in integer nanoseconds, so that
//! the limiter can be judged against it.
//!
//! # The provider's accounting rule
//!
//! Each limit is a token bucket of one dimension (requests or tokens): `per_minute` tokens a
//! minute, at most `burst`, full at time 0. Its level is kept exactly, as an integer number of
//! `1 / 60_000_000_000` tokens: one nanosecond adds `per_minute` units, a token is
//! `MINUTE_NS` units, and the level never exceeds `burst × MINUTE_NS`.
//!
//! A call carries an estimate `e` (prompt + `max_tokens`); its cost is 1 in the requests
//! dimension and `e` in the tokens dimension.
//! 1. **Arrival at `t`.** Every bucket is refilled to `t`. If **any** bucket holds less than
//!    the call's cost in its dimension, the call is refused (429) and nothing is charged
//!    (`Retry-After` is the time until every bucket would have room, if nothing else happened).
//!    Otherwise every bucket is charged the call's cost at `t`.
//! 2. **Answer at `t + latency`.** The true usage `u <= e` is known. Every tokens bucket is
//!    refilled to that instant and given back `e - u`, capped at its burst (the level after the
//!    refund is at most `burst`); requests buckets are not corrected (a call is one request,
//!    as estimated). A provider that does not settle answers with `u = e`: nothing comes back.
//!
//! A cost above a bucket's burst can never be accepted (the workloads here stay below it).
//! Events at one instant are taken in the order they are handed to the provider; the oracle
//! applies answers before arrivals at the same instant.
//!
//! # Headers
//!
//! The provider announces its state as of the arrival (after the charge), in one of two
//! dialects; a dimension with several limits announces the one with the least whole tokens
//! left. See [`Provider::headers`].
#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// One minute in nanoseconds: the unit of a bucket's level is `1 / MINUTE_NS` token.
pub const MINUTE_NS: u64 = 60_000_000_000;
pub const SECOND_NS: u64 = 1_000_000_000;
pub const MS_NS: u64 = 1_000_000;

/// The workers a client runs, each sending one call at a time.
pub const WORKERS: usize = 64;
/// The round trip of a refused call: its 429 comes back this long after it was sent.
pub const REFUSAL_RTT: Duration = Duration::from_millis(100);

/// What a limit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dimension {
    Requests,
    Tokens,
}

impl Dimension {
    pub fn name(self) -> &'static str {
        match self {
            Dimension::Requests => "requests",
            Dimension::Tokens => "tokens",
        }
    }
}

/// One limit: a token bucket of `per_minute` a minute and at most `burst`, in one dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitSpec {
    pub dimension: Dimension,
    pub per_minute: u64,
    pub burst: u64,
}

pub const fn requests(per_minute: u64, burst: u64) -> LimitSpec {
    LimitSpec {
        dimension: Dimension::Requests,
        per_minute,
        burst,
    }
}

pub const fn tokens(per_minute: u64, burst: u64) -> LimitSpec {
    LimitSpec {
        dimension: Dimension::Tokens,
        per_minute,
        burst,
    }
}

/// One limit's exact state.
#[derive(Clone, Debug)]
struct Bucket {
    spec: LimitSpec,
    /// In `1 / MINUTE_NS` tokens.
    level: u128,
    /// The instant (ns) `level` was computed for.
    at: u64,
}

impl Bucket {
    fn full(&self) -> u128 {
        u128::from(self.spec.burst) * u128::from(MINUTE_NS)
    }

    fn level_at(&self, now: u64) -> u128 {
        assert!(now >= self.at, "the provider's time went backwards");
        let refill = u128::from(now - self.at) * u128::from(self.spec.per_minute);
        (self.level + refill).min(self.full())
    }

    fn advance(&mut self, now: u64) {
        self.level = self.level_at(now);
        self.at = now;
    }

    /// The call's cost in this bucket's dimension.
    fn cost(&self, estimate: u64) -> u64 {
        match self.spec.dimension {
            Dimension::Requests => 1,
            Dimension::Tokens => estimate,
        }
    }

    /// The earliest instant from `now` on at which the bucket holds `cost`, with nothing else
    /// happening; `None` if it never will (a cost above the burst).
    fn room_at(&self, now: u64, cost: u64) -> Option<u64> {
        if cost > self.spec.burst {
            return None;
        }
        let need = u128::from(cost) * u128::from(MINUTE_NS);
        let level = self.level_at(now);
        if level >= need {
            return Some(now);
        }
        let wait = (need - level).div_ceil(u128::from(self.spec.per_minute));
        Some(now + u64::try_from(wait).expect("a wait of centuries"))
    }

    fn whole_tokens(&self, now: u64) -> u64 {
        u64::try_from(self.level_at(now) / u128::from(MINUTE_NS)).expect("at most the burst")
    }

    /// Nanoseconds from `now` until the bucket is full.
    fn until_full(&self, now: u64) -> u64 {
        let missing = self.full() - self.level_at(now);
        u64::try_from(missing.div_ceil(u128::from(self.spec.per_minute))).expect("fits")
    }
}

/// An accepted call, to be answered with [`Provider::answer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub estimate: u64,
    pub arrived: u64,
}

/// A refused call (429): nothing was charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Nanoseconds until every limit would have room for the call; `None` for never.
    pub retry_after: Option<u64>,
}

/// The header dialect the provider announces its limits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`: `limit` = the limit per minute,
    /// `remaining` = the whole tokens left, `reset` = the time until the bucket is full again,
    /// rounded up to a millisecond, as a Go duration (`6m0s`, `1.5s`, `20ms`, `0s`).
    OpenAi,
    /// The IETF httpapi draft: `RateLimit-Policy: "requests";q=Q;w=W, "tokens";q=..;w=..`
    /// with `Q` = the burst and `W` = the seconds the bucket takes to fill from empty, rounded
    /// up, at least 1 (as paced's own `RateLimitLayer` announces a bucket), and
    /// `RateLimit: "requests";r=R;t=T, ..` with `R` = the whole tokens left and `T` = the
    /// seconds until full, rounded up.
    Ietf,
}

/// The simulated provider: exact token buckets per limit (see the module's documentation).
#[derive(Clone, Debug)]
pub struct Provider {
    buckets: Vec<Bucket>,
    pub accepted: u64,
    pub refused: u64,
}

impl Provider {
    /// All buckets full at time 0.
    pub fn new(limits: &[LimitSpec]) -> Provider {
        let buckets = limits
            .iter()
            .map(|&spec| {
                assert!(spec.per_minute > 0 && spec.burst > 0, "{spec:?}");
                let mut b = Bucket {
                    spec,
                    level: 0,
                    at: 0,
                };
                b.level = b.full();
                b
            })
            .collect();
        Provider {
            buckets,
            accepted: 0,
            refused: 0,
        }
    }

    /// The earliest instant from `now` on at which every limit has room for a call of
    /// `estimate`, if nothing else happens; `None` if some limit never will.
    pub fn earliest(&self, now: u64, estimate: u64) -> Option<u64> {
        self.buckets.iter().try_fold(now, |at, b| {
            b.room_at(now, b.cost(estimate)).map(|t| t.max(at))
        })
    }

    /// A call of `estimate` tokens arriving at `now` (ns): accepted and charged everywhere, or
    /// refused and charged nothing.
    pub fn arrive(&mut self, now: u64, estimate: u64) -> Result<Ticket, Refusal> {
        for b in &mut self.buckets {
            b.advance(now);
        }
        match self.earliest(now, estimate) {
            Some(at) if at == now => {}
            other => {
                self.refused += 1;
                return Err(Refusal {
                    retry_after: other.map(|at| at - now),
                });
            }
        }
        for b in &mut self.buckets {
            b.level -= u128::from(b.cost(estimate)) * u128::from(MINUTE_NS);
        }
        self.accepted += 1;
        Ok(Ticket {
            estimate,
            arrived: now,
        })
    }

    /// The answer to `ticket` at `now`, with the true `usage` (at most the estimate): every
    /// tokens bucket gets the unused part back, capped at its burst.
    pub fn answer(&mut self, now: u64, ticket: Ticket, usage: u64) {
        assert!(usage <= ticket.estimate, "usage above the estimate");
        assert!(now >= ticket.arrived, "answered before it arrived");
        for b in &mut self.buckets {
            b.advance(now);
            if b.spec.dimension == Dimension::Tokens {
                let refund = u128::from(ticket.estimate - usage) * u128::from(MINUTE_NS);
                b.level = (b.level + refund).min(b.full());
            }
        }
    }

    /// Whole tokens left per limit at `now`, in the order the limits were given.
    pub fn remaining(&self, now: u64) -> Vec<u64> {
        self.buckets.iter().map(|b| b.whole_tokens(now)).collect()
    }

    /// The tightest limit of `dimension` at `now` (least whole tokens left), if it has one.
    fn tightest(&self, now: u64, dimension: Dimension) -> Option<&Bucket> {
        self.buckets
            .iter()
            .filter(|b| b.spec.dimension == dimension)
            .min_by_key(|b| b.whole_tokens(now))
    }

    /// The response headers announcing the limits at `now`, as (lower-case name, value) pairs.
    ///
    /// OpenAI style, for 30 requests/min (burst 10) with 9 left and 40,000 tokens/min with
    /// 32,000 left:
    /// `x-ratelimit-limit-requests: 30`, `x-ratelimit-remaining-requests: 9`,
    /// `x-ratelimit-reset-requests: 2s`, `x-ratelimit-limit-tokens: 40000`,
    /// `x-ratelimit-remaining-tokens: 32000`, `x-ratelimit-reset-tokens: 12s`.
    /// IETF style, the same state:
    /// `ratelimit-policy: "requests";q=10;w=20, "tokens";q=40000;w=60` and
    /// `ratelimit: "requests";r=9;t=2, "tokens";r=32000;t=12`.
    pub fn headers(&self, now: u64, dialect: Dialect) -> Vec<(String, String)> {
        let dims = [Dimension::Requests, Dimension::Tokens];
        let announced: Vec<(Dimension, &Bucket)> = dims
            .iter()
            .filter_map(|&d| self.tightest(now, d).map(|b| (d, b)))
            .collect();
        match dialect {
            Dialect::OpenAi => announced
                .iter()
                .flat_map(|&(d, b)| {
                    let reset = b.until_full(now).div_ceil(MS_NS) * MS_NS;
                    [
                        ("limit", b.spec.per_minute.to_string()),
                        ("remaining", b.whole_tokens(now).to_string()),
                        ("reset", go_duration(reset)),
                    ]
                    .map(|(field, value)| (format!("x-ratelimit-{field}-{}", d.name()), value))
                })
                .collect(),
            Dialect::Ietf => {
                let policy = announced
                    .iter()
                    .map(|&(d, b)| {
                        let fill = u128::from(b.spec.burst) * u128::from(MINUTE_NS);
                        let w = fill
                            .div_ceil(u128::from(b.spec.per_minute) * u128::from(SECOND_NS))
                            .max(1);
                        format!("\"{}\";q={};w={w}", d.name(), b.spec.burst)
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                let state = announced
                    .iter()
                    .map(|&(d, b)| {
                        let t = b.until_full(now).div_ceil(SECOND_NS);
                        format!("\"{}\";r={};t={t}", d.name(), b.whole_tokens(now))
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                vec![
                    ("ratelimit-policy".to_owned(), policy),
                    ("ratelimit".to_owned(), state),
                ]
            }
        }
    }
}

/// `ns` as Go's `time.Duration.String()` writes it: `0s`, `750ns`, `1.5µs`, `20ms`,
/// `1.5s`, `6m0s`, `1h0m0s`.
pub fn go_duration(ns: u64) -> String {
    fn with_fraction(value: u64, unit: u64, digits: usize) -> String {
        let (whole, rest) = (value / unit, value % unit);
        if rest == 0 {
            return whole.to_string();
        }
        let fraction = format!("{rest:0digits$}");
        format!("{whole}.{}", fraction.trim_end_matches('0'))
    }
    match ns {
        0 => "0s".to_owned(),
        1..=999 => format!("{ns}ns"),
        1_000..=999_999 => format!("{}µs", with_fraction(ns, 1_000, 3)),
        1_000_000..=999_999_999 => format!("{}ms", with_fraction(ns, MS_NS, 6)),
        _ => {
            let hours = ns / (60 * MINUTE_NS);
            let minutes = ns / MINUTE_NS % 60;
            let seconds = with_fraction(ns % MINUTE_NS, SECOND_NS, 9);
            match (hours, minutes) {
                (0, 0) => format!("{seconds}s"),
                (0, m) => format!("{m}m{seconds}s"),
                (h, m) => format!("{h}h{m}m{seconds}s"),
            }
        }
    }
}

/// SplitMix64: a small seeded generator, so a workload is the same on every machine.
#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> SplitMix {
        SplitMix(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (Lemire's multiply; the bias is below 2^-40 for these ranges).
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        let span = u128::from(hi - lo + 1);
        lo + u64::try_from((u128::from(self.next_u64()) * span) >> 64).expect("below span")
    }

    /// Log-uniform in `lo..=hi`, in integers only: `x` uniform, kept with probability `lo / x`
    /// (so the probability of `x` is proportional to `1 / x`).
    pub fn log_uniform(&mut self, lo: u64, hi: u64) -> u64 {
        loop {
            let x = self.between(lo, hi);
            if self.between(0, x - 1) < lo {
                return x;
            }
        }
    }
}

/// One prompt of the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prompt {
    /// Prompt + `max_tokens`: what the call is charged on arrival.
    pub estimate: u64,
    /// The true usage, 30 to 100 % of the estimate (rounded up): what a settling provider
    /// corrects the charge to.
    pub usage: u64,
    /// From arrival to answer, 300 to 3,000 ms in whole milliseconds.
    pub latency_ms: u64,
}

impl Prompt {
    /// What the provider corrects the charge to: the usage if it settles, else the estimate.
    pub fn charged(&self, settles: bool) -> u64 {
        if settles {
            self.usage
        } else {
            self.estimate
        }
    }
}

/// `n` prompts of 50 to 8,000 tokens (log-uniform), seeded; sent in this order (FIFO).
pub fn workload(n: usize, seed: u64) -> Vec<Prompt> {
    let mut rng = SplitMix::new(seed);
    (0..n)
        .map(|_| {
            let estimate = rng.log_uniform(50, 8_000);
            let percent = rng.between(30, 100);
            Prompt {
                estimate,
                usage: (estimate * percent).div_ceil(100),
                latency_ms: rng.between(300, 3_000),
            }
        })
        .collect()
}

/// One provider configuration, and whether it settles.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: &'static str,
    pub limits: Vec<LimitSpec>,
    pub settles: bool,
}

/// The pairs of scenarios: requests bind, tokens bind, and both (the known finding), each
/// with a provider that settles to the true usage and one that keeps the estimate.
pub fn scenarios() -> Vec<Scenario> {
    let pairs: [(&str, [LimitSpec; 2]); 3] = [
        (
            "requests bind",
            [requests(30, 10), tokens(400_000, 400_000)],
        ),
        ("tokens bind", [requests(500, 50), tokens(40_000, 40_000)]),
        ("both bind", [requests(30, 10), tokens(40_000, 40_000)]),
    ];
    pairs
        .iter()
        .flat_map(|(name, limits)| {
            [false, true].map(|settles| Scenario {
                name,
                limits: limits.to_vec(),
                settles,
            })
        })
        .collect()
}

/// What a run measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Calls the provider refused (429).
    pub refusals: u64,
    /// From the start to the last answer, in nanoseconds.
    pub makespan: u64,
}

impl Outcome {
    pub fn ratio_to(&self, oracle: &Outcome) -> f64 {
        self.makespan as f64 / oracle.makespan as f64
    }
}

/// The exact oracle: an ideal client that knows the provider's state, with the same
/// [`WORKERS`], latencies and usages. It sends each prompt, in order (never before the previous
/// one), as soon as a worker is free and at the earliest instant every limit has room for its
/// estimate, counting the refunds of answers due by then. A discrete-event loop in integer
/// nanoseconds; the provider refuses none of its calls (checked).
pub fn oracle(prompts: &[Prompt], scenario: &Scenario) -> Outcome {
    let mut provider = Provider::new(&scenario.limits);
    // Answers due: (instant, ticket, usage).
    let mut due: BinaryHeap<Reverse<(u64, u64, u64, u64)>> = BinaryHeap::new();
    let mut free: BinaryHeap<Reverse<u64>> = (0..WORKERS).map(|_| Reverse(0)).collect();
    let (mut t, mut makespan) = (0, 0);
    for p in prompts {
        let Reverse(worker) = free.pop().expect("a worker");
        t = t.max(worker);
        loop {
            while let Some(&Reverse((at, estimate, arrived, usage))) = due.peek() {
                if at > t {
                    break;
                }
                due.pop();
                provider.answer(at, Ticket { estimate, arrived }, usage);
            }
            let ready = provider
                .earliest(t, p.estimate)
                .expect("a prompt above a burst");
            match due.peek() {
                // An answer before (or at) the ready instant may give room earlier.
                Some(&Reverse((at, ..))) if at <= ready => t = at,
                _ => {
                    t = ready;
                    break;
                }
            }
        }
        let ticket = provider
            .arrive(t, p.estimate)
            .expect("the oracle sends only when every limit has room");
        let answered = t + p.latency_ms * MS_NS;
        due.push(Reverse((
            answered,
            ticket.estimate,
            ticket.arrived,
            p.charged(scenario.settles),
        )));
        free.push(Reverse(answered));
        makespan = makespan.max(answered);
    }
    assert_eq!(provider.refused, 0);
    Outcome {
        refusals: 0,
        makespan,
    }
}

/// How a call ended, as the client learns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answered {
    /// 200, with the true usage in tokens (the estimate when the provider does not settle).
    Ok { usage: u64 },
    /// 429: the provider charged nothing.
    Refused,
}

/// Drives a client against the provider on tokio's clock (run it under paused time):
/// [`WORKERS`] workers pull prompts from one FIFO queue, each sending one call at a time. A
/// call first awaits `acquire(estimate)` (the client's pacing), arrives at the provider at
/// once, and is answered after its latency; a refused call comes back after [`REFUSAL_RTT`]
/// and is sent again, through `acquire` again. Every answer is handed to `settle` with the
/// grant `acquire` returned.
pub async fn run<G, A, F, S>(
    prompts: &[Prompt],
    scenario: &Scenario,
    acquire: A,
    settle: S,
) -> Outcome
where
    A: Fn(u64) -> F,
    F: Future<Output = G>,
    S: Fn(G, Answered),
{
    let start = Instant::now();
    let now = || u64::try_from(start.elapsed().as_nanos()).expect("centuries");
    let provider = RefCell::new(Provider::new(&scenario.limits));
    let next = Cell::new(0);
    let last = Cell::new(0);
    let worker = || async {
        loop {
            let i = next.get();
            let Some(p) = prompts.get(i) else { break };
            next.set(i + 1);
            loop {
                let grant = acquire(p.estimate).await;
                let arrived = provider.borrow_mut().arrive(now(), p.estimate);
                match arrived {
                    Ok(ticket) => {
                        tokio::time::sleep(Duration::from_millis(p.latency_ms)).await;
                        let usage = p.charged(scenario.settles);
                        let at = now();
                        provider.borrow_mut().answer(at, ticket, usage);
                        settle(grant, Answered::Ok { usage });
                        last.set(last.get().max(at));
                        break;
                    }
                    Err(_) => {
                        tokio::time::sleep(REFUSAL_RTT).await;
                        settle(grant, Answered::Refused);
                    }
                }
            }
        }
    };
    futures_util::future::join_all((0..WORKERS).map(|_| worker())).await;
    let provider = provider.into_inner();
    assert_eq!(provider.accepted, prompts.len() as u64);
    Outcome {
        refusals: provider.refused,
        makespan: last.get(),
    }
}
