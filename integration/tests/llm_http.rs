//! Pacing against several limits at once, over real HTTP: the simulated LLM provider
//! (`common/llm.rs`) behind an axum server on 127.0.0.1, called through hyper by 64 workers,
//! each call paced by the client under test, all under paused time and exactly
//! (`common/llm_http.rs` explains how, and checks it on every call).
//!
//! The table prints with `cargo test -p paced-integration --test llm_http -- --nocapture table`.

#[path = "../../tests/common/llm.rs"]
mod llm;
#[path = "common/llm_http.rs"]
mod llm_http;

use std::time::Duration;

use paced::{Limit, Rate, RateLimiter};
use proptest::prelude::*;

use llm::{
    oracle, requests, run, scenarios, tokens, workload, Answered, Dialect, Dimension, LimitSpec,
    Outcome, Prompt, Scenario, SECOND_NS,
};
use llm_http::{paused_runtime, run_http, HttpRun};

const SEED: u64 = 0x5EED_11A1;
/// Prompts per run of the table.
const PROMPTS: usize = 5_000;
/// A month of paused time: a run that takes longer has lost a wake-up.
const WITHIN: Duration = Duration::from_secs(30 * 24 * 3600);

/// The clients compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Client {
    /// One `RateLimiter<[u64; 2]>` (requests, tokens): acquires `[1, estimate]`, settles
    /// `[1, usage]` from the answer (`[0, 0]` on a 429).
    Multi,
    /// Two `RateLimiter`s, awaited requests first: cannot settle.
    RequestsThenTokens,
    /// Two `RateLimiter`s, awaited tokens first: cannot settle.
    TokensThenRequests,
}

impl Client {
    fn name(self) -> &'static str {
        match self {
            Client::Multi => "RateLimiter<[u64; 2]>",
            Client::RequestsThenTokens => "requests then tokens",
            Client::TokensThenRequests => "tokens then requests",
        }
    }
}

/// Where a client's calls go: through HTTP to the axum server, or straight to the provider
/// (`llm::run`, the in-process reference).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wire {
    Http(Dialect),
    InProcess,
}

fn multi_limiter(scenario: &Scenario) -> RateLimiter<[u64; 2]> {
    let mut builder = RateLimiter::builder(["requests", "tokens"]);
    for spec in &scenario.limits {
        let limit = Limit::bucket(Rate::per_minute(spec.per_minute), spec.burst);
        builder = builder.limit(spec.dimension.name(), limit);
    }
    builder.build().expect("a valid quota")
}

/// The composed client's limiter for `dimension`: the provider's rate and burst (the tightest
/// limit by rate when a dimension has several; the composed rows use one limit per dimension).
fn single(scenario: &Scenario, dimension: Dimension) -> RateLimiter {
    let spec = scenario
        .limits
        .iter()
        .filter(|l| l.dimension == dimension)
        .min_by_key(|l| l.per_minute)
        .expect("a limit of that dimension");
    RateLimiter::new(Rate::per_minute(spec.per_minute), spec.burst)
}

/// Runs `client` from clock 0 on a fresh paused runtime (with I/O for the HTTP runs).
fn measure(client: Client, wire: Wire, prompts: &[Prompt], scenario: &Scenario) -> Outcome {
    paused_runtime().block_on(async {
        let run = drive(client, wire, prompts, scenario);
        tokio::time::timeout(WITHIN, run)
            .await
            .expect("a month of paused time: a lost wake-up?")
    })
}

async fn drive(client: Client, wire: Wire, prompts: &[Prompt], scenario: &Scenario) -> Outcome {
    // Both runners take the same closures; `go!` hands them to the one `wire` names.
    macro_rules! go {
        ($acquire:expr, $settle:expr) => {
            match wire {
                Wire::Http(dialect) => {
                    let HttpRun { outcome, calls } =
                        run_http(prompts, scenario, dialect, $acquire, $settle).await;
                    assert_eq!(calls as u64, prompts.len() as u64 + outcome.refusals);
                    outcome
                }
                Wire::InProcess => run(prompts, scenario, $acquire, $settle).await,
            }
        };
    }
    match client {
        Client::Multi => {
            let limiter = multi_limiter(scenario);
            let acquire = |estimate: u64| {
                let limiter = limiter.clone();
                async move { limiter.acquire([1, estimate]).await }
            };
            let settle = |permit: paced::limiter::Permit<2>, answered| match answered {
                Answered::Ok { usage } => permit.settle([1, usage]),
                // A refused call cost the provider nothing: the permit gives it all back.
                Answered::Refused => permit.settle([0, 0]),
            };
            go!(acquire, settle)
        }
        Client::RequestsThenTokens | Client::TokensThenRequests => {
            let reqs = single(scenario, Dimension::Requests);
            let toks = single(scenario, Dimension::Tokens);
            let acquire = |estimate: u64| {
                let (reqs, toks) = (reqs.clone(), toks.clone());
                async move {
                    if client == Client::RequestsThenTokens {
                        reqs.acquire(1).await;
                        toks.acquire(estimate).await;
                    } else {
                        toks.acquire(estimate).await;
                        reqs.acquire(1).await;
                    }
                }
            };
            go!(acquire, |(), _| {})
        }
    }
}

fn describe(limits: &[LimitSpec]) -> String {
    limits
        .iter()
        .map(|l| {
            format!(
                "{} {}/min burst {}",
                l.dimension.name(),
                l.per_minute,
                l.burst
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn secs(ns: u64) -> String {
    format!("{:.3} s", ns as f64 / SECOND_NS as f64)
}

/// The full table, 5,000 prompts, every client × scenario over HTTP (each scenario's dialect
/// alternating between OpenAI's and the IETF draft's): the multi-limit client is never refused
/// and within 1.02 times the oracle, and over HTTP every client does exactly what it does in
/// process (`llm::run`: the same refusals and the same makespan to the nanosecond). About 20 s
/// in debug.
#[test]
fn table_over_http_against_the_oracle() {
    let prompts = workload(PROMPTS, SEED);
    println!(
        "{PROMPTS} prompts, seed {SEED:#x}, {} workers, over HTTP (axum on 127.0.0.1, hyper)",
        llm::WORKERS
    );
    println!("| scenario | client | refusals | makespan | / oracle |\n|---|---|---:|---:|---:|");
    for (k, scenario) in scenarios().iter().enumerate() {
        let dialect = if k % 2 == 0 {
            Dialect::OpenAi
        } else {
            Dialect::Ietf
        };
        let label = format!(
            "{} ({}){}",
            scenario.name,
            describe(&scenario.limits),
            if scenario.settles {
                ", settles to 30-100 %"
            } else {
                ", usage = estimate"
            }
        );
        let best = oracle(&prompts, scenario);
        println!("| {label} | oracle | 0 | {} | 1.000 |", secs(best.makespan));
        for client in [
            Client::Multi,
            Client::RequestsThenTokens,
            Client::TokensThenRequests,
        ] {
            let outcome = measure(client, Wire::Http(dialect), &prompts, scenario);
            let ratio = outcome.ratio_to(&best);
            println!(
                "| {label} | {} | {} | {} | {ratio:.3} |",
                client.name(),
                outcome.refusals,
                secs(outcome.makespan)
            );
            assert!(
                ratio >= 0.999,
                "{label} / {}: beat the oracle",
                client.name()
            );
            if client == Client::Multi {
                assert_eq!(outcome.refusals, 0, "{label}");
                assert!(ratio <= 1.02, "{label}: {ratio:.4}");
            }
            // HTTP adds nothing: the same refusals and the same makespan as in process.
            let in_process = measure(client, Wire::InProcess, &prompts, scenario);
            assert_eq!(
                outcome,
                in_process,
                "{label} / {}: HTTP, in process",
                client.name()
            );
        }
    }
}

/// Limits unlike the table's, drawn at random: one or two limits per dimension (a per-minute
/// bucket and, sometimes, a slower one with a larger burst, as a per-hour quota), rates spread
/// over eight doublings, from 6 to about 3,000 requests and 8,000 to about 4,000,000 tokens a
/// minute (so that either dimension, both or neither binds), with and without settling, in
/// either dialect.
fn limit_pair() -> impl Strategy<Value = Vec<LimitSpec>> {
    let spread = |base: u64, doublings: u32| {
        (0..=doublings, 0u64..1_000).prop_map(move |(k, j)| (base << k) + j * (base << k) / 1_000)
    };
    let requests_limit = spread(6, 8).prop_flat_map(|rate| (Just(rate), 1..=rate.min(300)));
    let tokens_limit = spread(8_000, 8).prop_flat_map(|rate| (Just(rate), 8_000..=rate.max(8_001)));
    (
        requests_limit,
        tokens_limit,
        proptest::option::of((2u64..=20, 2u64..=20)),
        proptest::option::of((2u64..=20, 2u64..=20)),
    )
        .prop_map(|((rr, rb), (tr, tb), slow_requests, slow_tokens)| {
            let mut limits = vec![requests(rr, rb), tokens(tr, tb)];
            // A slower limit: a half to a twentieth of the rate, with a burst 2 to 20 times
            // larger (so that every prompt fits).
            if let Some((slower, larger)) = slow_requests {
                limits.push(requests((rr / slower).max(1), rb * larger));
            }
            if let Some((slower, larger)) = slow_tokens {
                limits.push(tokens((tr / slower).max(1), tb * larger));
            }
            limits
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    #[test]
    fn over_http_with_unseen_limits_no_refusal_and_near_the_oracle(
        limits in limit_pair(),
        seed in any::<u64>(),
        settles in any::<bool>(),
        ietf in any::<bool>(),
    ) {
        let prompts = workload(400, seed);
        let scenario = Scenario { name: "random", limits, settles };
        let dialect = if ietf { Dialect::Ietf } else { Dialect::OpenAi };
        let best = oracle(&prompts, &scenario);
        let outcome = measure(Client::Multi, Wire::Http(dialect), &prompts, &scenario);
        let ratio = outcome.ratio_to(&best);
        // The multi-limit client over HTTP: no refusal, within 1.02 times the oracle.
        prop_assert_eq!(outcome.refusals, 0, "{:?}", scenario);
        prop_assert!((0.999..=1.02).contains(&ratio), "{:?}: {:.4}", scenario, ratio);
    }
}

/// The provider over HTTP by hand, under paused time: what it refuses, what it gives back and
/// what it announces, to the nanosecond. 3 requests/min (burst 2: one more every 20 s) and
/// 1,000 tokens/min (burst 1,000); every call answered after 20 ms, a 429 after 100 ms.
#[tokio::test(start_paused = true)]
async fn over_http_the_provider_refuses_settles_and_announces() {
    use std::sync::Arc;

    use http::HeaderMap;
    use llm_http::{call, connect, serve, Gate, Stamp};

    let scenario = Scenario {
        name: "by hand",
        limits: vec![requests(3, 2), tokens(1_000, 1_000)],
        settles: true,
    };
    let start = tokio::time::Instant::now();
    let gate = Arc::new(Gate::default());
    tokio::spawn(gate.clone().hold());
    gate.enter();
    let server = serve(&scenario, start, gate.clone()).await;
    let mut sender = connect(server.addr).await;
    gate.leave();
    let request = |id: u64, estimate: u64, usage: u64, dialect: &str| {
        http::Request::get("/")
            .header("host", "127.0.0.1")
            .header("x-call", id)
            .header("x-estimate", estimate)
            .header("x-usage", usage)
            .header("x-latency-ms", 20)
            .header("x-dialect", dialect)
            .body(http_body_util::Empty::new())
            .unwrap()
    };
    let text = |h: &HeaderMap, name: &str| -> String {
        h.get(name)
            .unwrap_or_else(|| panic!("no {name} in {h:?}"))
            .to_str()
            .unwrap()
            .to_owned()
    };
    let ms = |n: u64| Duration::from_millis(n);

    // 400 estimated, 100 used: announced as of the arrival, corrected after.
    let (status, h) = call(&gate, &mut sender, request(0, 400, 100, "openai")).await;
    assert_eq!((status.as_u16(), start.elapsed()), (200, ms(20)), "{h:?}");
    let announced = [
        ("x-usage-total-tokens", "100"),
        ("x-ratelimit-limit-requests", "3"),
        ("x-ratelimit-remaining-requests", "1"),
        ("x-ratelimit-reset-requests", "20s"),
        ("x-ratelimit-limit-tokens", "1000"),
        ("x-ratelimit-remaining-tokens", "600"),
        ("x-ratelimit-reset-tokens", "24s"),
    ];
    for (name, value) in announced {
        assert_eq!(text(&h, name), value, "{name}");
    }

    // 700 fits only because the first call's unused 300 came back at 20 ms
    // (600 + 1/3 refilled + 300 = 900 1/3); 200 1/3 left.
    let (status, h) = call(&gate, &mut sender, request(1, 700, 700, "ietf")).await;
    assert_eq!((status.as_u16(), start.elapsed()), (200, ms(40)), "{h:?}");
    assert_eq!(
        text(&h, "ratelimit-policy"),
        "\"requests\";q=2;w=40, \"tokens\";q=1000;w=60"
    );
    assert_eq!(
        text(&h, "ratelimit"),
        "\"requests\";r=0;t=40, \"tokens\";r=200;t=48"
    );

    // 0.002 of a request left at 40 ms: refused (after its 100 ms), charged nothing, with when
    // to come back (19.96 s, rounded up) and the state.
    let (status, h) = call(&gate, &mut sender, request(2, 50, 50, "openai")).await;
    assert_eq!((status.as_u16(), start.elapsed()), (429, ms(140)), "{h:?}");
    assert_eq!(text(&h, "retry-after"), "20");
    assert_eq!(text(&h, "x-ratelimit-remaining-requests"), "0");
    assert_eq!(text(&h, "x-ratelimit-reset-requests"), "39.96s");
    assert!(h.get("x-usage-total-tokens").is_none());

    let provider = server.provider.lock().unwrap();
    assert_eq!((provider.accepted, provider.refused), (2, 1));
    let stamp = |call, arrived: u64, answered: u64, accepted| Stamp {
        call,
        arrived: arrived * llm::MS_NS,
        answered: answered * llm::MS_NS,
        accepted,
    };
    assert_eq!(
        *server.stamps.lock().unwrap(),
        [
            stamp(0, 0, 20, true),
            stamp(1, 20, 40, true),
            stamp(2, 40, 140, false)
        ]
    );
}
