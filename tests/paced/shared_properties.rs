//! The shared limiters' promises over random schedules, under paused time: the global bound
//! across all users, each user's order, no starvation, and exact accounting when waiters are
//! cancelled at random moments.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{arriving, nanos_since, paused, MS};
use futures_util::StreamExt;
use paced::{PaceExt, Rate, RateLimiter, Shaping};
use proptest::prelude::*;
use tokio::time::Instant;

/// One granted request: when it was asked for, when granted, its cost.
#[derive(Clone, Copy, Debug)]
struct Grant {
    queued: u64,
    at: u64,
    cost: u64,
}

/// The bound: in any window [t_i, t_j], cost <= burst + (t_j - t_i) * rate, exactly.
fn check_bound(grants: &[Grant], tokens: u64, per: Duration, burst: u64) -> Result<(), String> {
    let mut sorted = grants.to_vec();
    sorted.sort_by_key(|g| g.at);
    let per = per.as_nanos();
    for i in 0..sorted.len() {
        let mut sum = 0u128;
        for j in i..sorted.len() {
            sum += u128::from(sorted[j].cost);
            let span = u128::from(sorted[j].at - sorted[i].at);
            if sum * per > u128::from(burst) * per + span * u128::from(tokens) {
                return Err(format!("cost {sum} within {span} ns from {}", sorted[i].at));
            }
        }
    }
    Ok(())
}

/// No starvation: a request is granted no later than the time it takes to grant everything
/// queued up to its own arrival and still waiting then, at the rate, plus a timer tick for
/// each of those wake-ups. A cancelled request ahead (`gave_up`: queued, left) holds the
/// queue until it leaves, and not a moment longer.
fn check_fifo_promptness(
    grants: &[Grant],
    gave_up: &[(u64, u64)],
    tokens: u64,
    per: Duration,
) -> Result<(), String> {
    for g in grants {
        let blocked_until = gave_up
            .iter()
            .filter(|&&(queued, left)| queued <= g.queued && left > g.queued)
            .map(|&(_, left)| left)
            .max()
            .unwrap_or(g.queued);
        let ahead: Vec<&Grant> = grants
            .iter()
            .filter(|h| h.queued <= g.queued && h.at >= g.queued)
            .collect();
        let cost: u128 = ahead.iter().map(|h| u128::from(h.cost)).sum();
        let refill = (cost * per.as_nanos()).div_ceil(u128::from(tokens));
        let latest =
            u128::from(blocked_until) + refill + (ahead.len() as u128 + 1) * u128::from(MS);
        if u128::from(g.at) > latest {
            return Err(format!(
                "{g:?} granted after {latest} ns ({} ahead)",
                ahead.len()
            ));
        }
    }
    Ok(())
}

fn rate_strategy() -> impl Strategy<Value = (u64, Duration)> {
    (1u64..20, 1u64..1_000, 0u64..1_000_000)
        .prop_map(|(tokens, ms, ns)| (tokens, Duration::from_nanos(ms * MS + ns)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn streams_sharing_a_limiter_keep_the_global_bound(
        (tokens, per) in rate_strategy(),
        burst in 1u64..6,
        streams in prop::collection::vec(
            prop::collection::vec((0u64..400, 0u64..6), 1..8),
            1..24,
        ),
    ) {
        let burst = burst.max(1);
        let grants = paused(async {
            let limiter = RateLimiter::new(Rate::new(tokens, per), burst);
            let start = Instant::now();
            let log = Arc::new(Mutex::new(Vec::new()));
            let mut tasks = Vec::new();
            for items in &streams {
                let mut at = 0;
                let schedule: Vec<(u64, (usize, u64))> = items
                    .iter()
                    .enumerate()
                    .map(|(i, &(gap, cost))| {
                        at += gap;
                        (at, (i, cost.min(burst)))
                    })
                    .collect();
                let limiter = limiter.clone();
                let log = log.clone();
                tasks.push(tokio::spawn(async move {
                    let asked = Arc::new(Mutex::new(0u64));
                    let stamp = asked.clone();
                    let source = arriving(start, &schedule).map(move |item| {
                        *stamp.lock().unwrap() = nanos_since(start);
                        item
                    });
                    let s = source.throttle_with(&limiter, |&(_, cost)| cost, Shaping);
                    let mut s = std::pin::pin!(s);
                    let mut order = Vec::new();
                    while let Some((i, cost)) = s.next().await {
                        let queued = *asked.lock().unwrap();
                        log.lock().unwrap().push(Grant { queued, at: nanos_since(start), cost });
                        order.push(i);
                    }
                    order
                }));
            }
            for (task, items) in tasks.into_iter().zip(&streams) {
                let order = task.await.unwrap();
                // Every item of every stream, in its stream's order: nobody starves.
                assert_eq!(order, (0..items.len()).collect::<Vec<_>>());
            }
            assert_eq!(limiter.stats().waiting, 0);
            log.lock().unwrap().clone()
        });
        let total: usize = streams.iter().map(Vec::len).sum();
        prop_assert_eq!(grants.len(), total);
        check_bound(&grants, tokens, per, burst).map_err(TestCaseError::fail)?;
        check_fifo_promptness(&grants, &[], tokens, per).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn cancelled_waiters_leave_no_trace(
        (tokens, per) in rate_strategy(),
        burst in 1u64..6,
        requests in prop::collection::vec((0u64..300, 1u64..6, 0u64..3_000), 1..40),
    ) {
        let (grants, gave_up, granted, stats, after) = paused(async {
            let limiter = RateLimiter::new(Rate::new(tokens, per), burst);
            let start = Instant::now();
            let log = Arc::new(Mutex::new(Vec::new()));
            let cancelled = Arc::new(Mutex::new(Vec::new()));
            let mut tasks = Vec::new();
            let mut at = 0;
            for &(gap, cost, patience) in &requests {
                at += gap;
                let cost = cost.min(burst);
                let limiter = limiter.clone();
                let log = log.clone();
                let cancelled = cancelled.clone();
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep_until(start + Duration::from_millis(at)).await;
                    let queued = nanos_since(start);
                    let patience = Duration::from_millis(patience);
                    // Dropped mid-wait when its patience runs out.
                    if tokio::time::timeout(patience, limiter.acquire(cost)).await.is_ok() {
                        log.lock().unwrap().push(Grant { queued, at: nanos_since(start), cost });
                    } else {
                        cancelled.lock().unwrap().push((queued, nanos_since(start)));
                    }
                }));
            }
            for task in tasks {
                task.await.unwrap();
            }
            let stats = limiter.stats();
            // Idle until the bucket must be full again, then take exactly the burst.
            tokio::time::sleep(per * u32::try_from(burst).unwrap()).await;
            let full = limiter.available();
            let all = limiter.try_acquire(burst).is_ok();
            let more = limiter.try_acquire(1).is_ok();
            let grants = log.lock().unwrap().clone();
            let gave_up = cancelled.lock().unwrap().clone();
            (grants.clone(), gave_up, grants.len() as u64, stats, (full, all, more))
        });
        prop_assert_eq!(stats.granted, granted, "a grant nobody received, or twice");
        prop_assert_eq!(stats.waiting, 0, "a cancelled waiter stayed queued");
        prop_assert_eq!(after, (burst, true, false), "the bucket leaked or double-counted");
        check_bound(&grants, tokens, per, burst).map_err(TestCaseError::fail)?;
        // The survivors did not pay for the cancelled: those hold the queue only until they
        // leave, and their cost is never counted.
        check_fifo_promptness(&grants, &gave_up, tokens, per).map_err(TestCaseError::fail)?;
    }
}

/// At scale: 1,000 streams with pseudo-random arrivals and costs share one limiter.
#[test]
fn a_thousand_streams_share_one_limiter() {
    let (tokens, per, burst) = (50u64, Duration::from_secs(1), 10u64);
    // A small LCG: reproducible, and no dependency.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |bound: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (seed >> 33) % bound
    };
    let streams: Vec<Vec<(u64, u64)>> = (0..1_000)
        .map(|_| {
            (0..1 + next(3))
                .map(|_| (next(5_000), 1 + next(3)))
                .collect()
        })
        .collect();
    let grants = paused(async {
        let limiter = RateLimiter::new(Rate::new(tokens, per), burst);
        let start = Instant::now();
        let log = Arc::new(Mutex::new(Vec::new()));
        let tasks: Vec<_> = streams
            .iter()
            .map(|items| {
                let mut at = 0;
                let schedule: Vec<(u64, (usize, u64))> = items
                    .iter()
                    .enumerate()
                    .map(|(i, &(gap, cost))| {
                        at += gap;
                        (at, (i, cost))
                    })
                    .collect();
                let (limiter, log) = (limiter.clone(), log.clone());
                tokio::spawn(async move {
                    let asked = Arc::new(Mutex::new(0u64));
                    let stamp = asked.clone();
                    let source = arriving(start, &schedule).map(move |item| {
                        *stamp.lock().unwrap() = nanos_since(start);
                        item
                    });
                    let s = source.throttle_with(&limiter, |&(_, cost)| cost, Shaping);
                    let mut s = std::pin::pin!(s);
                    let mut order = Vec::new();
                    while let Some((i, cost)) = s.next().await {
                        let queued = *asked.lock().unwrap();
                        let at = nanos_since(start);
                        log.lock().unwrap().push(Grant { queued, at, cost });
                        order.push(i);
                    }
                    order
                })
            })
            .collect();
        for (task, items) in tasks.into_iter().zip(&streams) {
            let order = common::within_an_hour(task).await.unwrap();
            assert_eq!(order, (0..items.len()).collect::<Vec<_>>(), "order or loss");
        }
        log.lock().unwrap().clone()
    });
    let total: usize = streams.iter().map(Vec::len).sum();
    assert_eq!(grants.len(), total);
    check_bound(&grants, tokens, per, burst).unwrap();
    check_fifo_promptness(&grants, &[], tokens, per).unwrap();
}
