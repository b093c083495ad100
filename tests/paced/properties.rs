//! Every promise of every operator, checked over random schedules under paused time.
//!
//! Each case runs a paused runtime: items arrive at random whole milliseconds, the consumer
//! sometimes dawdles between items, and the emission times are checked against the
//! definitions: the bound, order and no loss, never early, and promptness within the one
//! tick that tokio's timer adds (a deadline rounded up to the next millisecond).

use crate::common;

use std::time::Duration;

use common::{arriving, nanos_since, paused, tick_ceil, NaiveBucket, MS};
use futures_util::{Stream, StreamExt};
use paced::{Enforcing, PaceExt, Rate, Shaping};
use proptest::prelude::*;
use tokio::time::Instant;

/// One upstream item: when it arrives after the previous one, what it costs, and how long the
/// consumer dawdles after taking it.
#[derive(Clone, Debug)]
struct Step {
    gap_ms: u64,
    cost: u64,
    think_ms: u64,
}

fn steps(max_cost: u64) -> impl Strategy<Value = Vec<Step>> {
    let gap = prop_oneof![3 => Just(0u64), 2 => 0u64..50, 1 => 0u64..2_000];
    let think = prop_oneof![4 => Just(0u64), 1 => 0u64..300];
    prop::collection::vec(
        (gap, 0..=max_cost, think).prop_map(|(gap_ms, cost, think_ms)| Step {
            gap_ms,
            cost,
            think_ms,
        }),
        1..50,
    )
}

/// What the consumer saw of item `index`.
#[derive(Debug)]
struct Seen<T> {
    out: T,
    /// When the item became ready upstream.
    arrival: u64,
    /// When the consumer asked for it: after taking the previous one and dawdling.
    asked: u64,
    /// When it came out.
    at: u64,
}

/// Runs `make(source)` to completion, the consumer dawdling `think_ms` after each item.
fn run<S, F>(steps: &[Step], make: F) -> Vec<Seen<S::Item>>
where
    F: FnOnce(std::pin::Pin<Box<dyn Stream<Item = usize>>>) -> S,
    S: Stream,
{
    paused(async {
        let start = Instant::now();
        let mut at = 0;
        let schedule: Vec<(u64, usize)> = steps
            .iter()
            .enumerate()
            .map(|(i, step)| {
                at += step.gap_ms;
                (at, i)
            })
            .collect();
        let arrivals: Vec<u64> = schedule.iter().map(|&(ms, _)| ms * MS).collect();
        let s = make(Box::pin(arriving(start, &schedule)));
        let mut s = std::pin::pin!(s);
        let mut seen = Vec::new();
        let mut asked = 0;
        let mut k = 0;
        while let Some(out) = s.next().await {
            let now = nanos_since(start);
            seen.push(Seen {
                out,
                arrival: arrivals.get(k).copied().unwrap_or(0),
                asked,
                at: now,
            });
            let think = steps.get(k).map_or(0, |step| step.think_ms);
            tokio::time::sleep(Duration::from_millis(think)).await;
            asked = nanos_since(start);
            k += 1;
        }
        seen
    })
}

/// The throttle's bound, by its definition: the cost emitted in [t_i, t_j] is at most
/// burst + (t_j - t_i) * rate, for every pair of emissions, in exact integers.
fn check_bound(
    seen: &[Seen<usize>],
    costs: &[u64],
    tokens: u64,
    per: Duration,
    burst: u64,
) -> Result<(), TestCaseError> {
    let per = per.as_nanos();
    for i in 0..seen.len() {
        let mut sum = 0u128;
        for j in i..seen.len() {
            sum += u128::from(costs[seen[j].out]);
            let span = u128::from(seen[j].at - seen[i].at);
            prop_assert!(
                sum * per <= u128::from(burst) * per + span * u128::from(tokens),
                "cost {} in {} ns from item {}",
                sum,
                span,
                i
            );
        }
    }
    Ok(())
}

fn rate_strategy() -> impl Strategy<Value = (u64, Duration)> {
    // Whole and fractional per-token intervals, from sub-millisecond to seconds.
    (1u64..20, 1u64..2_000, 0u64..1_000_000)
        .prop_map(|(tokens, ms, ns)| (tokens, Duration::from_nanos(ms * MS + ns)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn throttle_shaping_keeps_the_bound_and_is_prompt(
        (tokens, per) in rate_strategy(),
        burst in 1u64..8,
        steps in steps(10),
    ) {
        let costs: Vec<u64> = steps.iter().map(|s| s.cost).collect();
        let cost_of = costs.clone();
        let seen = run(&steps, |src| {
            src.throttle(Rate::new(tokens, per), move |&i| cost_of[i], burst, Shaping)
        });
        // Order kept, nothing lost or duplicated.
        let order: Vec<usize> = seen.iter().map(|s| s.out).collect();
        prop_assert_eq!(order, (0..steps.len()).collect::<Vec<_>>());

        let mut model = NaiveBucket::new(tokens, per, burst);
        let mut prev = 0;
        for s in &seen {
            let cost = costs[s.out];
            let offered = s.arrival.max(s.asked);
            let earliest = model.earliest(offered, cost);
            // Never early (the model also panics if the item left without its tokens)...
            prop_assert!(s.at >= earliest, "item {} at {} before {}", s.out, s.at, earliest);
            // ...and no later than its time, rounded up to the timer's tick.
            prop_assert!(
                s.at <= tick_ceil(earliest.max(offered)).max(prev),
                "item {} at {} ns, due at {} ns (offered {})", s.out, s.at, earliest, offered
            );
            model.emit(s.at, cost);
            prev = s.at;
        }

        // The bound, directly: cost in [t_i, t_j] <= burst + (t_j - t_i) * rate.
        if costs.iter().all(|&c| c <= burst) {
            check_bound(&seen, &costs, tokens, per, burst)?;
        }
    }

    #[test]
    fn throttle_bound_holds_in_every_window(
        (tokens, per) in rate_strategy(),
        burst in 1u64..8,
        steps in steps(7),
    ) {
        // Costs never above the burst, so that the bound applies to every case.
        let costs: Vec<u64> = steps.iter().map(|s| s.cost.min(burst)).collect();
        let cost_of = costs.clone();
        let seen = run(&steps, |src| {
            src.throttle(Rate::new(tokens, per), move |&i| cost_of[i], burst, Shaping)
        });
        prop_assert_eq!(seen.len(), steps.len());
        check_bound(&seen, &costs, tokens, per, burst)?;
    }

    #[test]
    fn throttle_enforcing_never_delays_and_refuses_exactly(
        (tokens, per) in rate_strategy(),
        burst in 1u64..8,
        steps in steps(10),
    ) {
        let costs: Vec<u64> = steps.iter().map(|s| s.cost).collect();
        let cost_of = costs.clone();
        let seen = run(&steps, |src| {
            src.throttle(Rate::new(tokens, per), move |&i| cost_of[i], burst, Enforcing)
        });
        prop_assert_eq!(seen.len(), steps.len());
        let mut model = NaiveBucket::new(tokens, per, burst);
        for (i, s) in seen.iter().enumerate() {
            let offered = s.arrival.max(s.asked);
            prop_assert_eq!(s.at, offered, "enforcing delayed an item");
            let cost = costs[i];
            match &s.out {
                Ok(item) => {
                    prop_assert_eq!(*item, i);
                    model.emit(s.at, cost);
                }
                Err(refused) => {
                    prop_assert_eq!(*refused.get_ref(), i);
                    if cost > burst {
                        prop_assert_eq!(refused.retry_after(), Duration::MAX);
                    } else {
                        let due = model.earliest(s.at, cost);
                        prop_assert!(due > s.at, "refused an item that conformed");
                        prop_assert_eq!(refused.retry_after(), Duration::from_nanos(due - s.at));
                    }
                }
            }
        }
    }

    #[test]
    fn min_interval_keeps_gaps_and_is_prompt(
        interval_ns in prop_oneof![Just(0u64), 0u64..500_000_000],
        steps in steps(0),
    ) {
        let d = Duration::from_nanos(interval_ns);
        let seen = run(&steps, |src| src.min_interval(d));
        let order: Vec<usize> = seen.iter().map(|s| s.out).collect();
        prop_assert_eq!(order, (0..steps.len()).collect::<Vec<_>>());
        for (i, s) in seen.iter().enumerate() {
            let offered = s.arrival.max(s.asked);
            let due = if i == 0 { offered } else { seen[i - 1].at + interval_ns };
            if i > 0 {
                prop_assert!(s.at - seen[i - 1].at >= interval_ns, "gap {} < {}", s.at - seen[i - 1].at, interval_ns);
            }
            prop_assert!(s.at <= offered.max(tick_ceil(due)), "item {} at {} due {} offered {}", i, s.at, due, offered);
        }
    }

    #[test]
    fn staggered_start_keeps_the_window_and_is_prompt(
        k in 1usize..6,
        period_ns in prop_oneof![Just(0u64), 0u64..1_500_000_000],
        steps in steps(0),
    ) {
        let period = Duration::from_nanos(period_ns);
        let seen = run(&steps, |src| src.staggered_start(k, period));
        let order: Vec<usize> = seen.iter().map(|s| s.out).collect();
        prop_assert_eq!(order, (0..steps.len()).collect::<Vec<_>>());
        for (i, s) in seen.iter().enumerate() {
            let offered = s.arrival.max(s.asked);
            let due = if i >= k { seen[i - k].at + period_ns } else { 0 };
            // At most k in any window of `period`: item i is at least `period` after i - k.
            prop_assert!(s.at >= due, "item {} at {} before {}", i, s.at, due);
            prop_assert!(s.at <= offered.max(tick_ceil(due)), "item {} at {} due {} offered {}", i, s.at, due, offered);
        }
    }

    #[test]
    fn batched_interval_batches_fully_and_promptly(
        n in 1usize..6,
        interval_ns in prop_oneof![Just(0u64), 0u64..500_000_000],
        steps in steps(0),
    ) {
        let d = Duration::from_nanos(interval_ns);
        let arrivals: Vec<u64> = steps
            .iter()
            .scan(0, |at, s| { *at += s.gap_ms * MS; Some(*at) })
            .collect();
        let batches = paused(async {
            let start = Instant::now();
            let schedule: Vec<(u64, usize)> =
                arrivals.iter().enumerate().map(|(i, &a)| (a / MS, i)).collect();
            let s = arriving(start, &schedule).batched_interval(n, d);
            let mut s = std::pin::pin!(s);
            let mut out = Vec::new();
            let mut asked = 0;
            while let Some(batch) = s.next().await {
                let at = nanos_since(start);
                let think = steps[batch[0]].think_ms;
                out.push((batch, asked, at));
                tokio::time::sleep(Duration::from_millis(think)).await;
                asked = nanos_since(start);
            }
            out
        });
        let flat: Vec<usize> = batches.iter().flat_map(|(b, _, _)| b.clone()).collect();
        prop_assert_eq!(flat, (0..steps.len()).collect::<Vec<_>>());
        for (j, (batch, asked, at)) in batches.iter().enumerate() {
            prop_assert!(!batch.is_empty() && batch.len() <= n, "batch of {}", batch.len());
            let first_ready = arrivals[batch[0]].max(*asked);
            let due = if j == 0 { 0 } else { batches[j - 1].2 + interval_ns };
            prop_assert!(*at >= due, "batch {} at {} before {}", j, at, due);
            prop_assert!(*at <= first_ready.max(tick_ceil(due)), "batch {} at {} late", j, at);
            for &i in batch {
                prop_assert!(arrivals[i] <= *at, "item {} left before it arrived", i);
            }
            // A batch that is not full holds everything that had arrived when it left.
            if batch.len() < n {
                if let Some(next) = batch.last().map(|&i| i + 1).filter(|&i| i < steps.len()) {
                    prop_assert!(arrivals[next] > *at, "item {} had arrived but waited", next);
                }
            }
        }
    }
}
