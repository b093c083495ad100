//! `throttle_with` over a `RateLimiter`: a stream of LLM requests, each costing one request
//! and its estimated tokens, keeps every limit's bound and its order, under paused time.

use crate::common;

use std::pin::pin;
use std::time::Duration;

use common::{collect_timed, paused, tick_ceil, timeline, within_an_hour, NaiveBucket, MS};
use futures_util::{stream, StreamExt};
use paced::limiter::Limiter;
use paced::{Enforcing, Limit, PaceExt, Rate, RateLimiter, Shaping};
use proptest::prelude::*;
use tokio::time::Instant;
use tokio_test::{assert_pending, task};

/// 2 requests per second (bursts of 2) and 1,000 tokens per second (bursts of 1,000).
fn llm() -> RateLimiter<[u64; 2]> {
    RateLimiter::builder(["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_second(2), 2))
        .limit("tokens", Limit::bucket(Rate::per_second(1_000), 1_000))
        .build()
        .unwrap()
}

/// A request to the model: an id and its estimated tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Prompt {
    id: u32,
    tokens: u64,
}

impl Prompt {
    fn estimate(&self) -> u64 {
        self.tokens
    }
}

fn prompts(tokens: &[u64]) -> Vec<Prompt> {
    (0..)
        .zip(tokens)
        .map(|(id, &tokens)| Prompt { id, tokens })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn llm_requests_leave_when_every_limit_has_room_in_order() {
    let llm = llm();
    let start = Instant::now();
    let requests = stream::iter(prompts(&[600, 300, 500, 300, 1_000]));
    let sent = within_an_hour(collect_timed(
        start,
        requests
            .throttle_with(&llm, |req| [1, req.estimate()], Shaping)
            .map(|req| req.id),
    ))
    .await;
    // 0, 1: both limits have room. 2: a request at 500 ms (tokens at 400 ms). 3: a request at
    // 1,000 ms. 4: 700 tokens short at 1,000 ms, so 1,700 ms (requests would allow 1,500 ms).
    assert_eq!(timeline(&sent), "0ms:0 0ms:1 500ms:2 1000ms:3 1700ms:4");
    assert_eq!(llm.stats().granted, 5);
}

#[tokio::test(start_paused = true)]
async fn two_streams_share_every_limit_in_arrival_order() {
    let llm = llm();
    let start = Instant::now();
    let a = stream::iter(prompts(&[1_000, 500]))
        .throttle_with(&llm, |req| [1, req.tokens], Shaping)
        .map(|req| format!("a{}", req.id));
    let b = stream::iter(prompts(&[100, 100]))
        .throttle_with(&llm, |req| [1, req.tokens], Shaping)
        .map(|req| format!("b{}", req.id));
    let (a, b) = tokio::join!(collect_timed(start, a), collect_timed(start, b));
    // a0 takes every token; a1 queues first (its stream was polled first) and waits 500 ms for
    // its 500 tokens; b0, behind it, for 100 more tokens (600 ms), not overtaking a1 though it
    // costs less; b1 for the requests limit (1.2 requests at 600 ms, one every 500 ms).
    assert_eq!(timeline(&a), "0ms:a0 500ms:a1");
    assert_eq!(timeline(&b), "600ms:b0 1000ms:b1");
}

#[tokio::test(start_paused = true)]
async fn enforcing_refuses_what_any_limit_has_no_room_for_and_charges_nothing() {
    let llm = llm();
    let requests = stream::iter(prompts(&[900, 200, 100, 50]));
    let answers: Vec<_> = requests
        .throttle_with(&llm, |req| [1, req.tokens], Enforcing)
        .map(|answer| match answer {
            Ok(req) => Ok(req.id),
            Err(refused) => Err((refused.get_ref().id, refused.retry_after())),
        })
        .collect()
        .await;
    assert_eq!(
        answers,
        [
            Ok(0),
            // 100 tokens short: 100 ms at 1,000 per second.
            Err((1, Duration::from_millis(100))),
            Ok(2),
            // No request left: 500 ms.
            Err((3, Duration::from_millis(500))),
        ]
    );
    assert_eq!(llm.available(), [0, 0]);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_stream_takes_nothing_and_its_place_goes_to_the_next() {
    let llm = llm();
    llm.try_acquire([2, 0]).unwrap(); // no request left until 500 ms
    let start = Instant::now();
    let mut dropped = task::spawn(stream::iter(prompts(&[10])).throttle_with(
        &llm,
        |req| [1, req.tokens],
        Shaping,
    ));
    assert_pending!(dropped.poll_next());
    let next = stream::iter(prompts(&[20])).throttle_with(&llm, |req| [1, req.tokens], Shaping);
    let mut next = pin!(next);
    drop(dropped);
    within_an_hour(next.next()).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    assert_eq!(llm.available(), [0, 980]);
}

#[tokio::test(start_paused = true)]
async fn a_rate_limiter_still_takes_a_plain_cost() {
    // Generic code over a limiter of one number says so.
    fn paced<S: futures_util::Stream, Q: Limiter<Cost = u64>>(
        s: S,
        limiter: &Q,
    ) -> impl futures_util::Stream<Item = S::Item> + use<S, Q> {
        s.throttle_with(limiter, |_| 1, Shaping)
    }
    let limiter = RateLimiter::new(Rate::per_second(10), 1);
    let start = Instant::now();
    let sent = collect_timed(start, paced(stream::iter(0..3), &limiter)).await;
    assert_eq!(timeline(&sent), "0ms:0 100ms:1 200ms:2");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any stream of requests: every item leaves in order, none lost, each when both limits
    /// (replayed by a naive bucket each) have room and never later than the latest of their
    /// ready times (plus tokio's 1 ms tick), so each limit's bound holds.
    #[test]
    fn every_limit_keeps_its_bound_and_the_order(
        req_rate in 1u64..20,
        req_burst in 1u64..5,
        tok_rate in 100u64..5_000,
        tok_burst in 100u64..2_000,
        tokens in proptest::collection::vec(0u64..100, 1..40),
    ) {
        let tokens: Vec<u64> = tokens.iter().map(|t| t * tok_burst / 100).collect();
        let sent = paused(async {
            let llm = RateLimiter::builder(["requests", "tokens"])
                .limit("requests", Limit::bucket(Rate::per_second(req_rate), req_burst))
                .limit("tokens", Limit::bucket(Rate::per_second(tok_rate), tok_burst))
                .build()
                .unwrap();
            let start = Instant::now();
            within_an_hour(collect_timed(
                start,
                stream::iter(prompts(&tokens)).throttle_with(&llm, |req| [1, req.tokens], Shaping),
            ))
            .await
        });
        prop_assert_eq!(sent.len(), tokens.len());
        let mut requests = NaiveBucket::new(req_rate, Duration::from_secs(1), req_burst);
        let mut tokens_bucket = NaiveBucket::new(tok_rate, Duration::from_secs(1), tok_burst);
        let mut offered = 0;
        for (i, (req, at)) in sent.iter().enumerate() {
            prop_assert_eq!(req.id as usize, i);
            let due = requests
                .earliest(offered, 1)
                .max(tokens_bucket.earliest(offered, req.tokens));
            prop_assert!(*at >= due, "item {} left at {} ns, due at {} ns", i, at, due);
            prop_assert!(
                *at <= tick_ceil(due),
                "item {} left at {} ns, due at {} ns: late",
                i,
                at,
                due
            );
            requests.emit(*at, 1);
            tokens_bucket.emit(*at, req.tokens);
            offered = *at;
        }
        prop_assert!(sent.last().map_or(0, |s| s.1) < 3_600_000 * MS);
    }
}
