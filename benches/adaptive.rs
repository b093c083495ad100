//! The adaptive controller's laws against the simulated provider of `tests/common/provider.rs`,
//! in paused time: how close each gets to a hidden limit `L`, at what cost in refused calls,
//! and how fast it finds it and follows it when it changes.
//!
//! For each law (the default scale-free cubic, AWS's cubic constants, a plain AIMD), each `L`
//! in 5 / 50 / 500 / 5,000 calls per second, with and without `Retry-After`: one client stream
//! starting at `max = 10 × L`, 32 calls in flight at 10 ms round trip (2 ms at 5,000/s),
//! provider burst 50 ms of `L`. Two runs of 100 s each: `L` halved at 60 s, and `L` doubled at
//! 60 s. Reported:
//!
//! - **goodput / L** and **refused**: successful calls per second over `L`, and refused calls
//!   over all calls, from 20 s to 60 s (both runs, averaged);
//! - **converge**: the first whole second from which every 10 s window up to 60 s meets the
//!   convergence goals (goodput ≥ 0.9 L and ≤ 5 % refused with `Retry-After`, ≥ 0.85 L and
//!   ≤ 10 % without); `never` if none does;
//! - **halved**: the same after `L` is halved at 60 s (windows up to 100 s), counted from 60 s;
//! - **doubled**: from 60 s, the time until 5 s of goodput reach 0.85 × the doubled `L`.
//!
//! A second table: the provider announces its quota with every answer (`Adaptive::on_quota`;
//! a token bucket as `B` per `B / L` with its whole tokens left and the seconds until full
//! rounded up, or a fixed window of 10 s), the default law, the client starting at 1/s: goodput
//! over `L` from 0 s to 60 s, and from 60 s to 100 s after `L` is halved or doubled at 60 s
//! (over the new `L`), and the refused calls of the whole run.
//!
//! Run: `cargo bench -p paced-benches --features unstable-laws --bench adaptive` (a few seconds; everything runs in paused time).

#[path = "../tests/common/provider.rs"]
mod provider;

use std::time::Duration;

use paced::limiter::AdaptiveLaw;
use paced::Rate;
use provider::{settled_from, simulate, window, Announce, Run, Scenario};

const LIMITS: [f64; 4] = [5.0, 50.0, 500.0, 5000.0];

fn run(s: &Scenario) -> Run {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
        .block_on(simulate(s))
}

struct Row {
    goodput: f64,
    refused: f64,
    converge: Option<usize>,
    halved: Option<usize>,
    doubled: Option<usize>,
}

fn measure(law: AdaptiveLaw, limit: f64, retry_after: bool) -> Row {
    let latency = if limit > 1000.0 { 2 } else { 10 };
    let mut s = Scenario::new(limit, latency, 32, retry_after);
    s.law = law;
    s.duration = Duration::from_secs(100);
    let (goodput, refused) = if retry_after {
        (0.9, 0.05)
    } else {
        (0.85, 0.10)
    };
    s.changes = vec![(Duration::from_secs(60), limit / 2.0)];
    let halving = run(&s);
    s.changes = vec![(Duration::from_secs(60), limit * 2.0)];
    let doubling = run(&s);
    let (mut ok, mut no) = (0, 0);
    for r in [&halving, &doubling] {
        let (o, n) = window(r, 20, 60);
        ok += o;
        no += n;
    }
    let doubled = (60..=95).find(|&t| {
        let (ok, _) = window(&doubling, t, t + 5);
        ok as f64 / 5.0 >= 0.85 * 2.0 * limit
    });
    Row {
        goodput: ok as f64 / 80.0 / limit,
        refused: no as f64 / (ok + no).max(1) as f64,
        converge: settled_from(&halving, 0, 60, limit, goodput, refused),
        halved: settled_from(&halving, 60, 100, limit / 2.0, goodput, refused).map(|t| t - 60),
        doubled: doubled.map(|t| t + 5 - 60),
    }
}

/// Goodput over `L` in [0, 60), then over the new `L` in [60, 100) after `change`, and the
/// refused calls of the run.
fn announced(limit: f64, announce: Announce, change: f64) -> (f64, f64, u64) {
    let latency = if limit > 1000.0 { 2 } else { 10 };
    let mut s = Scenario::new(limit, latency, 32, true);
    s.announce = announce;
    s.start = Some(Rate::per_second(1));
    s.duration = Duration::from_secs(100);
    s.changes = vec![(Duration::from_secs(60), limit * change)];
    let r = run(&s);
    let (before, _) = window(&r, 0, 60);
    let (after, _) = window(&r, 60, 100);
    let refused = r.refused.iter().sum();
    (
        before as f64 / 60.0 / limit,
        after as f64 / 40.0 / (limit * change),
        refused,
    )
}

fn secs(t: Option<usize>) -> String {
    t.map_or_else(|| "never".to_string(), |t| format!("{t} s"))
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let laws = [
        ("cubic (default)", AdaptiveLaw::Cubic),
        ("AWS cubic", AdaptiveLaw::AwsCubic),
        ("AIMD", AdaptiveLaw::Aimd),
    ];
    println!("| law | L/s | Retry-After | goodput / L | refused | converge | halved | doubled |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    let mut summary = Vec::new();
    for (name, law) in laws {
        let (mut g, mut r, mut n) = (0.0, 0.0, 0.0);
        for retry_after in [true, false] {
            for limit in LIMITS {
                let row = measure(law, limit, retry_after);
                println!(
                    "| {name} | {limit} | {} | {:.3} | {:.2} % | {} | {} | {} |",
                    if retry_after { "yes" } else { "no" },
                    row.goodput,
                    row.refused * 100.0,
                    secs(row.converge),
                    secs(row.halved),
                    secs(row.doubled),
                );
                g += row.goodput;
                r += row.refused;
                n += 1.0;
            }
        }
        summary.push((name, g / n, r / n));
    }
    println!();
    println!("| law | mean goodput / L | mean refused |");
    println!("|---|---:|---:|");
    for (name, g, r) in summary {
        println!("| {name} | {g:.3} | {:.2} % |", r * 100.0);
    }
    println!();
    println!("| announced quota | L/s | goodput / L, 0-60 s | L halved: goodput / L', 60-100 s | refused | L doubled: goodput / L', 60-100 s | refused |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, announce) in [
        ("token bucket", Announce::Bucket),
        ("fixed window 10 s", Announce::FixedWindow(10.0)),
    ] {
        for limit in LIMITS {
            let (g, h, hr) = announced(limit, announce, 0.5);
            let (_, d, dr) = announced(limit, announce, 2.0);
            println!("| {name} | {limit} | {g:.3} | {h:.3} | {hr} | {d:.3} | {dr} |");
        }
    }
}
