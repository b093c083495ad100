//! `paced::tower::RateLimitLayer`: exact timelines under paused time with a plain
//! `tower::service_fn` inside (waiting, FIFO, cost, cancellation, readiness, clones, keys), and
//! property tests against the limiters used directly.
#![cfg(feature = "tower")]

mod common;

use std::convert::Infallible;
use std::future::poll_fn;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{nanos_since, paused, within_an_hour, NaiveBucket, MS};
use paced::tower::{RateLimitLayer, RateLimited};
use paced::{KeyedRateLimiter, Limit, Rate, RateLimiter, Stagger};
use proptest::prelude::*;
use tokio::time::{sleep, sleep_until, Instant};
use tokio_test::{assert_pending, assert_ready_ok, task};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

type Log = Arc<Mutex<Vec<(u64, u64)>>>;

/// An inner service that records `(request, ns since start)` at the moment it is called, and
/// answers with the request.
fn recorder(
    start: Instant,
    log: &Log,
) -> impl Service<u64, Response = u64, Error = Infallible, Future: Send> + Clone + Send + use<> {
    let log = log.clone();
    tower::service_fn(move |req: u64| {
        log.lock().unwrap().push((req, nanos_since(start)));
        async move { Ok::<_, Infallible>(req) }
    })
}

fn ms(log: &Log) -> Vec<(u64, u64)> {
    log.lock()
        .unwrap()
        .iter()
        .map(|&(r, t)| (r, t / MS))
        .collect()
}

/// Spawns one task per request, each with its own clone of `service`, in order and each a
/// moment after the previous one so that they queue in that order; waits for all.
async fn spawn_all<S>(service: &S, requests: &[u64])
where
    S: Service<u64> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send,
    S::Error: std::fmt::Debug + Send,
{
    let mut tasks = Vec::new();
    for &req in requests {
        tasks.push(tokio::spawn(service.clone().oneshot(req)));
        tokio::task::yield_now().await;
    }
    for t in tasks {
        within_an_hour(t).await.unwrap().unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn requests_wait_their_turn_in_arrival_order() {
    let start = Instant::now();
    let log = Log::default();
    let quota = RateLimiter::new(Rate::per_second(10), 2);
    let service = RateLimitLayer::new(&quota).layer(recorder(start, &log));
    spawn_all(&service, &[0, 1, 2, 3, 4, 5]).await;
    assert_eq!(
        ms(&log),
        [(0, 0), (1, 0), (2, 100), (3, 200), (4, 300), (5, 400)]
    );
}

#[tokio::test(start_paused = true)]
async fn the_layer_queues_with_every_other_user_of_the_quota() {
    // A stream of direct acquisitions and the service share one FIFO queue.
    let start = Instant::now();
    let log = Log::default();
    let quota = RateLimiter::new(Rate::per_second(10), 1);
    let service = RateLimitLayer::new(&quota).layer(recorder(start, &log));
    let direct = {
        let quota = quota.clone();
        let log = log.clone();
        tokio::spawn(async move {
            quota.acquire(1).await;
            log.lock().unwrap().push((100, nanos_since(start)));
            quota.acquire(1).await;
            log.lock().unwrap().push((101, nanos_since(start)));
        })
    };
    tokio::task::yield_now().await;
    spawn_all(&service, &[0, 1]).await;
    within_an_hour(direct).await.unwrap();
    // The direct task's second acquisition queued (at 0 ms) before the requests did: they
    // wait behind it, in their own order.
    assert_eq!(ms(&log), [(100, 0), (101, 100), (0, 200), (1, 300)]);
}

#[tokio::test(start_paused = true)]
async fn a_request_costs_what_the_cost_function_says() {
    // The dear request queues second; the cheap ones behind it wait for it.
    let start = Instant::now();
    let log = Log::default();
    let quota = RateLimiter::new(Rate::per_second(10), 4);
    let service = RateLimitLayer::new(&quota)
        .cost(|req: &u64| *req)
        .layer(recorder(start, &log));
    spawn_all(&service, &[4, 4, 1, 1, 0]).await;
    // Cost 0 goes at once, even with others waiting.
    assert_eq!(ms(&log), [(4, 0), (0, 0), (4, 400), (1, 500), (1, 600)]);
    assert_eq!(quota.stats().granted, 5);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_response_future_gives_back_its_place_and_is_charged_nothing() {
    let start = Instant::now();
    let log = Log::default();
    let quota = RateLimiter::new(Rate::per_second(10), 1);
    let mut service = RateLimitLayer::new(&quota).layer(recorder(start, &log));

    service.ready().await.unwrap().call(1).await.unwrap();
    // The second request heads the queue, waiting for 100 ms; given up at 50 ms.
    let mut second = task::spawn(service.ready().await.unwrap().call(2));
    assert_pending!(second.poll());
    assert_eq!(quota.stats().waiting, 1);
    sleep(Duration::from_millis(50)).await;
    drop(second);
    assert_eq!(quota.stats().waiting, 0);
    // The third takes the token the second would have had, at 100 ms as if it never existed.
    within_an_hour(service.ready().await.unwrap().call(3))
        .await
        .unwrap();
    assert_eq!(ms(&log), [(1, 0), (3, 100)]);
    assert_eq!(quota.stats().granted, 2);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_in_the_middle_of_the_queue_lets_the_next_move_up() {
    let start = Instant::now();
    let log = Log::default();
    let quota = RateLimiter::new(Rate::per_second(10), 1);
    let service = RateLimitLayer::new(&quota).layer(recorder(start, &log));
    let mut waiting: Vec<_> = (0..4)
        .map(|req| task::spawn(service.clone().oneshot(req)))
        .collect();
    for w in &mut waiting {
        let _ = w.poll();
    }
    assert_eq!(ms(&log), [(0, 0)]);
    drop(waiting.remove(2)); // request 2, queued behind 1
    for w in waiting.iter_mut().skip(1) {
        within_an_hour(w).await.unwrap();
    }
    assert_eq!(ms(&log), [(0, 0), (1, 100), (3, 200)]);
    assert_eq!(quota.stats().granted, 3);
}

#[tokio::test(start_paused = true)]
async fn the_inner_service_is_called_only_when_ready_and_when_charged() {
    // Inside: one request at a time, each taking 300 ms. `ConcurrencyLimit` panics if called
    // without a permit from `poll_ready`.
    let start = Instant::now();
    let log = Log::default();
    let slow = {
        let log = log.clone();
        tower::service_fn(move |req: u64| {
            log.lock().unwrap().push((req, nanos_since(start)));
            async move {
                sleep(Duration::from_millis(300)).await;
                Ok::<_, Infallible>(req)
            }
        })
    };
    let quota = RateLimiter::new(Rate::per_second(10), 1);
    let service = ServiceBuilder::new()
        .layer(RateLimitLayer::new(&quota))
        .concurrency_limit(1)
        .service(slow);
    spawn_all(&service, &[0, 1, 2]).await;
    // Readiness, not tokens, held 1 and 2 back; each was charged when it was called.
    assert_eq!(ms(&log), [(0, 0), (1, 300), (2, 600)]);
    assert_eq!(quota.stats().total_wait, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn poll_ready_is_the_inner_readiness_and_takes_no_token() {
    let quota = RateLimiter::new(Rate::per_second(1), 1);
    let inner = ServiceBuilder::new()
        .concurrency_limit(1)
        .service_fn(|req: u64| async move { Ok::<_, Infallible>(req) });
    let mut a = RateLimitLayer::new(&quota).layer(inner);
    let mut b = a.clone();
    assert!(poll_fn(|cx| a.poll_ready(cx)).await.is_ok());
    // `a` holds the only slot: `b` is not ready, and asking took no token.
    let mut b_ready = task::spawn(poll_fn(|cx| b.poll_ready(cx)));
    assert_pending!(b_ready.poll());
    assert_eq!(quota.available(), 1);
    assert_eq!(quota.stats().granted, 0);
    drop(a); // gives the slot back
    assert!(b_ready.is_woken());
    assert_ready_ok!(b_ready.poll());
}

#[tokio::test(start_paused = true)]
async fn sixty_four_clones_in_sixty_four_tasks_keep_one_limit() {
    let start = Instant::now();
    let log = Log::default();
    let quota = RateLimiter::new(Rate::per_second(100), 10);
    let service = RateLimitLayer::new(&quota).layer(recorder(start, &log));
    let tasks: Vec<_> = (0..64u64)
        .map(|t| {
            let service = service.clone();
            tokio::spawn(async move {
                for i in 0..3 {
                    service.clone().oneshot(t * 3 + i).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        within_an_hour(t).await.unwrap();
    }
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 192);
    let mut bucket = NaiveBucket::new(100, Duration::from_secs(1), 10);
    for &(_, at) in &log {
        bucket.emit(at, 1);
    }
    // 10 at once, then one per 10 ms: the last of 192 at 1.82 s.
    assert_eq!(log[191].1 / MS, 1820);
}

#[tokio::test(start_paused = true)]
async fn enforcing_refuses_at_once_what_does_not_conform() {
    let start = Instant::now();
    let log = Log::default();
    let quota = RateLimiter::new(Rate::per_second(10), 2);
    let service = RateLimitLayer::new(&quota)
        .enforcing()
        .layer(recorder(start, &log));
    let mut answers = Vec::new();
    for (req, at_ms) in [(0, 0), (1, 0), (2, 0), (3, 50), (4, 100), (5, 100)] {
        sleep_until(start + Duration::from_millis(at_ms)).await;
        let answer = service.clone().oneshot(req).await;
        let answer = answer.map_err(|e| retry_after_ms(&e));
        answers.push((nanos_since(start) / MS, answer));
    }
    let refused = Err::<u64, u128>;
    assert_eq!(
        answers,
        [
            (0, Ok(0)),
            (0, Ok(1)),
            (0, refused(100)),
            (50, refused(50)),
            (100, Ok(4)),
            (100, refused(100)),
        ]
    );
    // Refused requests never reached the inner service and took nothing.
    assert_eq!(ms(&log), [(0, 0), (1, 0), (4, 100)]);
    assert_eq!((quota.stats().granted, quota.stats().rejected), (3, 3));
}

// ---------------------------------------------------------------------------------------------
// A RateLimiter: requests AND tokens, estimated at the call, settled from the answer

/// A request to a model: its id, its estimated tokens, the tokens its answer will report, and
/// how long the model takes to answer.
#[derive(Clone, Copy, Debug)]
struct Prompt {
    id: u64,
    estimate: u64,
    used: u64,
    takes_ms: u64,
}

fn prompt(id: u64, estimate: u64, used: u64, takes_ms: u64) -> Prompt {
    Prompt {
        id,
        estimate,
        used,
        takes_ms,
    }
}

/// The model's answer: the usage it reports.
#[derive(Debug)]
struct Answer {
    id: u64,
    tokens_used: u64,
}

/// A model that records `(id, ns since start)` when called, takes its time, and reports the
/// tokens used; a prompt of id 99 fails.
fn model(
    start: Instant,
    log: &Log,
) -> impl Service<Prompt, Response = Answer, Error = &'static str, Future: Send> + Clone + Send + use<>
{
    let log = log.clone();
    tower::service_fn(move |p: Prompt| {
        log.lock().unwrap().push((p.id, nanos_since(start)));
        async move {
            sleep(Duration::from_millis(p.takes_ms)).await;
            if p.id == 99 {
                return Err("the model failed");
            }
            Ok(Answer {
                id: p.id,
                tokens_used: p.used,
            })
        }
    })
}

/// 10 requests per second (bursts of 10), 100 tokens per second (bursts of 1,000).
fn llm() -> RateLimiter<[u64; 2]> {
    RateLimiter::builder(["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_second(10), 10))
        .limit("tokens", Limit::bucket(Rate::per_second(100), 1_000))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_multi_limit_layer_waits_for_every_limit_in_arrival_order() {
    let start = Instant::now();
    let log = Log::default();
    let llm = RateLimiter::builder(["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_second(2), 2))
        .limit("tokens", Limit::bucket(Rate::per_second(1_000), 1_000))
        .build()
        .unwrap();
    let service = RateLimitLayer::new(&llm)
        .cost(|p: &Prompt| [1, p.estimate])
        .layer(model(start, &log));
    let mut tasks = Vec::new();
    for (id, estimate) in [(0, 600), (1, 300), (2, 500), (3, 300), (4, 1_000)] {
        tasks.push(tokio::spawn(
            service.clone().oneshot(prompt(id, estimate, estimate, 0)),
        ));
        tokio::task::yield_now().await;
    }
    for t in tasks {
        within_an_hour(t).await.unwrap().unwrap();
    }
    // 2 waits for a request (500 ms), 3 for the next (1,000 ms), 4 for 700 tokens (1,700 ms).
    assert_eq!(ms(&log), [(0, 0), (1, 0), (2, 500), (3, 1_000), (4, 1_700)]);
}

#[tokio::test(start_paused = true)]
async fn settling_down_admits_the_next_waiter_the_moment_the_answer_arrives() {
    let start = Instant::now();
    let log = Log::default();
    let llm = llm();
    let service = RateLimitLayer::new(&llm)
        .cost(|p: &Prompt| [1, p.estimate])
        .settle(|answer: &Answer| [1, answer.tokens_used])
        .layer(model(start, &log));
    // The first takes every token on its estimate and answers after 1 s, having used 200.
    let first = tokio::spawn(service.clone().oneshot(prompt(0, 1_000, 200, 1_000)));
    tokio::task::yield_now().await;
    // The second needs 500 tokens: by the refill alone it would go at 5 s.
    let second = tokio::spawn(service.clone().oneshot(prompt(1, 500, 500, 0)));
    let first = within_an_hour(first).await.unwrap().unwrap();
    assert_eq!((first.id, first.tokens_used), (0, 200));
    within_an_hour(second).await.unwrap().unwrap();
    // At 1 s the bucket held 100 refilled + 800 given back: the second goes at that instant.
    assert_eq!(ms(&log), [(0, 0), (1, 1_000)]);
    assert_eq!(llm.available(), [9, 400]);
}

#[tokio::test(start_paused = true)]
async fn settling_up_is_debt_the_next_request_waits_for() {
    let start = Instant::now();
    let log = Log::default();
    let llm = llm();
    let service = RateLimitLayer::new(&llm)
        .cost(|p: &Prompt| [1, p.estimate])
        .settle(|answer: &Answer| [1, answer.tokens_used])
        .layer(model(start, &log));
    // Estimated 500, used 1,200: 200 tokens of debt at 0 ms.
    within_an_hour(service.clone().oneshot(prompt(0, 500, 1_200, 0)))
        .await
        .unwrap();
    assert_eq!(llm.available(), [9, 0]);
    // 100 tokens: the debt (2 s) and then its own (1 s).
    within_an_hour(service.oneshot(prompt(1, 100, 100, 0)))
        .await
        .unwrap();
    assert_eq!(ms(&log), [(0, 0), (1, 3_000)]);
}

#[tokio::test(start_paused = true)]
async fn an_error_or_a_dropped_future_keeps_the_charge() {
    let start = Instant::now();
    let log = Log::default();
    let llm = llm();
    let mut service = RateLimitLayer::new(&llm)
        .cost(|p: &Prompt| [1, p.estimate])
        .settle(|answer: &Answer| [1, answer.tokens_used])
        .layer(model(start, &log));
    let failed = service.clone().oneshot(prompt(99, 300, 0, 0)).await;
    assert_eq!(failed.unwrap_err(), "the model failed");
    assert_eq!(llm.available(), [9, 700]);
    // Granted and called, then dropped before the answer: the estimate stays charged.
    let mut dropped = task::spawn(
        service
            .ready()
            .await
            .unwrap()
            .call(prompt(1, 300, 0, 1_000)),
    );
    assert_pending!(dropped.poll());
    drop(dropped);
    assert_eq!(llm.available(), [8, 400]);
    assert_eq!(ms(&log), [(99, 0), (1, 0)]);
}

#[tokio::test(start_paused = true)]
async fn an_enforcing_multi_limit_layer_refuses_then_settles() {
    let start = Instant::now();
    let log = Log::default();
    let llm = llm();
    let service = RateLimitLayer::new(&llm)
        .cost(|p: &Prompt| [1, p.estimate])
        .enforcing()
        .settle(|answer: &Answer| [1, answer.tokens_used]);
    let service = service.layer(model(start, &log));
    within_an_hour(service.clone().oneshot(prompt(0, 1_000, 100, 0)))
        .await
        .unwrap();
    // 900 tokens came back: a request of 900 passes at once, one of 1,000 more does not.
    within_an_hour(service.clone().oneshot(prompt(1, 900, 900, 0)))
        .await
        .unwrap();
    let refused = service.oneshot(prompt(2, 1_000, 0, 0)).await.unwrap_err();
    assert_eq!(retry_after_ms(&refused), 10_000);
    assert_eq!(ms(&log), [(0, 0), (1, 0)]);
    assert_eq!((llm.stats().granted, llm.stats().rejected), (2, 1));
}

// ---------------------------------------------------------------------------------------------
// A KeyedRateLimiter: each tenant's requests AND tokens, settled on its key from the answer

/// A prompt's tenant: ids 0 to 9 are tenant 0, 10 to 19 tenant 1, 99 tenant 9.
fn tenant(p: &Prompt) -> u64 {
    p.id / 10
}

/// Each tenant: 10 requests per second (bursts of 10), 100 tokens per second (bursts of 1,000).
fn tenants() -> KeyedRateLimiter<u64, [u64; 2]> {
    KeyedRateLimiter::builder(["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_second(10), 10))
        .limit("tokens", Limit::bucket(Rate::per_second(100), 1_000))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_keyed_settle_gives_back_to_its_tenant_only_the_moment_the_answer_arrives() {
    let start = Instant::now();
    let log = Log::default();
    let tenants = tenants();
    let service = RateLimitLayer::keyed(&tenants, tenant)
        .cost(|p: &Prompt| [1, p.estimate])
        .settle(|answer: &Answer| [1, answer.tokens_used])
        .layer(model(start, &log));
    let mut tasks = Vec::new();
    // Tenant 0: the first takes every token on its estimate and answers after 1 s, having used
    // 200; the second needs 500, by the refill alone at 5 s. Tenant 1: the same two, its
    // first using all it estimated.
    for p in [
        prompt(0, 1_000, 200, 1_000),
        prompt(1, 500, 500, 0),
        prompt(10, 1_000, 1_000, 1_000),
        prompt(11, 500, 500, 0),
    ] {
        tasks.push(tokio::spawn(service.clone().oneshot(p)));
        tokio::task::yield_now().await;
    }
    let mut tasks = tasks.into_iter();
    let first = within_an_hour(tasks.next().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((first.id, first.tokens_used), (0, 200));
    within_an_hour(tasks.next().unwrap())
        .await
        .unwrap()
        .unwrap();
    // At 1 s tenant 0 held 100 refilled + 800 given back: its second went at that instant.
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(tenants.available(&0), [9, 400]);
    // Tenant 1's answer gave nothing back: 100 refilled, its second still waits.
    assert_eq!(tenants.available(&1), [10, 100]);
    for t in tasks {
        within_an_hour(t).await.unwrap().unwrap();
    }
    assert_eq!(ms(&log), [(0, 0), (10, 0), (1, 1_000), (11, 5_000)]);
}

#[tokio::test(start_paused = true)]
async fn a_keyed_settle_up_is_debt_for_its_tenant_only() {
    let start = Instant::now();
    let log = Log::default();
    let tenants = tenants();
    let service = RateLimitLayer::keyed(&tenants, tenant)
        .cost(|p: &Prompt| [1, p.estimate])
        .settle(|answer: &Answer| [1, answer.tokens_used])
        .layer(model(start, &log));
    // Estimated 500, used 1,200: 200 tokens of debt on tenant 0 at 0 ms.
    within_an_hour(service.clone().oneshot(prompt(0, 500, 1_200, 0)))
        .await
        .unwrap();
    assert_eq!(tenants.available(&0), [9, 0]);
    assert_eq!(tenants.available(&1), [10, 1_000]);
    // Tenant 1 owes nothing; tenant 0's 100 tokens wait for the debt (2 s) and their own (1 s).
    within_an_hour(service.clone().oneshot(prompt(10, 1_000, 1_000, 0)))
        .await
        .unwrap();
    within_an_hour(service.oneshot(prompt(1, 100, 100, 0)))
        .await
        .unwrap();
    assert_eq!(ms(&log), [(0, 0), (10, 0), (1, 3_000)]);
}

#[tokio::test(start_paused = true)]
async fn a_keyed_error_or_a_dropped_future_keeps_the_charge() {
    let start = Instant::now();
    let log = Log::default();
    let tenants = tenants();
    let mut service = RateLimitLayer::keyed(&tenants, tenant)
        .cost(|p: &Prompt| [1, p.estimate])
        .settle(|answer: &Answer| [1, answer.tokens_used])
        .layer(model(start, &log));
    let failed = service.clone().oneshot(prompt(99, 300, 0, 0)).await;
    assert_eq!(failed.unwrap_err(), "the model failed");
    assert_eq!(tenants.available(&9), [9, 700]);
    // Granted and called, then dropped before the answer: the estimate stays charged.
    let mut dropped = task::spawn(
        service
            .ready()
            .await
            .unwrap()
            .call(prompt(1, 300, 0, 1_000)),
    );
    assert_pending!(dropped.poll());
    drop(dropped);
    assert_eq!(tenants.available(&0), [9, 700]);
    assert_eq!(ms(&log), [(99, 0), (1, 0)]);
}

#[tokio::test(start_paused = true)]
async fn an_enforcing_keyed_multi_limit_layer_refuses_then_settles_per_tenant() {
    let start = Instant::now();
    let log = Log::default();
    let tenants = tenants();
    let service = RateLimitLayer::keyed(&tenants, tenant)
        .cost(|p: &Prompt| [1, p.estimate])
        .enforcing()
        .settle(|answer: &Answer| [1, answer.tokens_used])
        .layer(model(start, &log));
    within_an_hour(service.clone().oneshot(prompt(0, 1_000, 100, 0)))
        .await
        .unwrap();
    // 900 tokens came back to tenant 0: a request of 900 passes at once, one of 1,000 more
    // does not; tenant 1's bucket is full.
    within_an_hour(service.clone().oneshot(prompt(1, 900, 900, 0)))
        .await
        .unwrap();
    let refused = service
        .clone()
        .oneshot(prompt(2, 1_000, 0, 0))
        .await
        .unwrap_err();
    assert_eq!(retry_after_ms(&refused), 10_000);
    within_an_hour(service.oneshot(prompt(10, 1_000, 1_000, 0)))
        .await
        .unwrap();
    assert_eq!(ms(&log), [(0, 0), (1, 0), (10, 0)]);
    assert_eq!(tenants.available(&0), [8, 0]);
    assert_eq!(tenants.available(&1), [9, 0]);
}

/// The `Retry-After` of a refusal, in milliseconds; panics if `err` is not a refusal.
fn retry_after_ms(err: &paced::tower::BoxError) -> u128 {
    err.downcast_ref::<RateLimited>()
        .expect("a RateLimited refusal")
        .retry_after()
        .as_millis()
}

#[tokio::test(start_paused = true)]
async fn enforcing_passes_the_inner_error_through_unchanged() {
    #[derive(Debug, PartialEq)]
    struct Broken;
    impl std::fmt::Display for Broken {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("broken")
        }
    }
    impl std::error::Error for Broken {}
    let quota = RateLimiter::new(Rate::per_second(10), 1);
    let service = RateLimitLayer::new(&quota)
        .enforcing()
        .layer(tower::service_fn(|_: u64| async { Err::<u64, _>(Broken) }));
    let err = service.clone().oneshot(1).await.unwrap_err();
    assert_eq!(err.downcast_ref::<Broken>(), Some(&Broken));
    let err = service.oneshot(2).await.unwrap_err();
    assert!(err.is::<RateLimited>());
}

#[tokio::test(start_paused = true)]
async fn keyed_shaping_keys_never_wait_for_each_other() {
    let start = Instant::now();
    let log = Log::default();
    let per_key = KeyedRateLimiter::new(Rate::per_second(10), 1);
    // The key is the request's tens: 10, 11, 12 share a bucket, 20, 21 another.
    let service =
        RateLimitLayer::keyed(&per_key, |req: &u64| req / 10).layer(recorder(start, &log));
    spawn_all(&service, &[10, 11, 20, 12, 21]).await;
    let mut got = ms(&log);
    got.sort_by_key(|&(req, at)| (at, req));
    assert_eq!(got, [(10, 0), (20, 0), (11, 100), (21, 100), (12, 200)]);
    assert_eq!(per_key.stats().granted, 5);
}

#[tokio::test(start_paused = true)]
async fn keyed_enforcing_refuses_per_client() {
    let per_client = KeyedRateLimiter::new(Rate::per_second(2), 2);
    let service = RateLimitLayer::keyed(&per_client, |req: &(&'static str, u64)| req.0)
        .enforcing()
        .layer(tower::service_fn(|req: (&'static str, u64)| async move {
            Ok::<_, Infallible>(req.1)
        }));
    let call = |client, n| service.clone().oneshot((client, n));
    assert_eq!(call("alice", 1).await.unwrap(), 1);
    assert_eq!(call("alice", 2).await.unwrap(), 2);
    assert_eq!(retry_after_ms(&call("alice", 3).await.unwrap_err()), 500);
    // Bob has his own bucket.
    assert_eq!(call("bob", 1).await.unwrap(), 1);
    sleep(Duration::from_millis(500)).await;
    assert_eq!(call("alice", 4).await.unwrap(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_stagger_counts_one_per_request() {
    let start = Instant::now();
    let log = Log::default();
    let window = Stagger::new(2, Duration::from_secs(1));
    let service = RateLimitLayer::new(&window)
        .cost(|req: &u64| *req)
        .layer(recorder(start, &log));
    spawn_all(&service, &[5, 5, 5, 5, 5]).await;
    let at: Vec<u64> = ms(&log).iter().map(|&(_, at)| at).collect();
    assert_eq!(at, [0, 0, 1000, 1000, 2000]);
}

#[tokio::test(start_paused = true)]
async fn debug_shows_the_configuration_not_the_quotas_state() {
    let quota = RateLimiter::new(Rate::per_second(1), 1);
    // A closure cost, which has no `Debug` of its own.
    let layer = RateLimitLayer::new(&quota)
        .cost(|req: &u64| *req)
        .enforcing();
    assert_eq!(
        format!("{layer:?}"),
        "RateLimitLayer { mode: Enforcing, .. }"
    );
    let service = RateLimitLayer::new(&quota).layer(7u8);
    assert_eq!(
        format!("{service:?}"),
        "RateLimit { inner: 7, mode: Shaping, .. }"
    );
    let mut service = layer.layer(tower::service_fn(|req: u64| async move {
        Ok::<_, Infallible>(req)
    }));
    let future = service.ready().await.unwrap().call(3);
    assert_eq!(
        format!("{future:?}"),
        "ResponseFuture { cost: 3, waiting: true, .. }"
    );
}

/// One request of a random schedule: arrival (ns after start), cost, and after how long (if
/// at all) its caller gives up.
#[derive(Clone, Debug)]
struct Arrival {
    at: u64,
    cost: u64,
    give_up_after: Option<u64>,
}

fn schedule() -> impl Strategy<Value = Vec<Arrival>> {
    prop::collection::vec(
        (
            0..400 * MS,
            0..5u64,
            prop::option::weighted(0.3, 1..300 * MS),
        )
            .prop_map(|(at, cost, give_up_after)| Arrival {
                at,
                cost,
                give_up_after,
            }),
        1..24,
    )
    .prop_map(|mut v| {
        v.sort_by_key(|a| a.at);
        v
    })
}

/// Runs `schedule` on a paused runtime. `setup(start, log)` builds the limiter and `go`;
/// each request runs `go(index, cost)` in its own task from its arrival on, abandoned after its
/// `give_up_after`. Returns what `go` recorded in the log, and the limiter's counters.
fn run_schedule<G, Fut>(
    schedule: &[Arrival],
    setup: impl FnOnce(Instant, Log) -> (G, Quota),
) -> (Vec<(u64, u64)>, paced::limiter::Stats)
where
    G: Fn(u64, u64) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    paused(async {
        let start = Instant::now();
        let log = Log::default();
        let (go, quota) = setup(start, log.clone());
        let mut tasks = Vec::new();
        for (i, a) in schedule.iter().enumerate() {
            sleep_until(start + Duration::from_nanos(a.at)).await;
            let work = go(i as u64, a.cost);
            let give_up = a.give_up_after.map(Duration::from_nanos);
            tasks.push(tokio::spawn(async move {
                match give_up {
                    Some(d) => {
                        let _ = tokio::time::timeout(d, work).await;
                    }
                    None => work.await,
                }
            }));
            tokio::task::yield_now().await;
        }
        for t in tasks {
            within_an_hour(t).await.unwrap();
        }
        let log = log.lock().unwrap().clone();
        let stats = match quota {
            Quota::Single(q) => q.stats(),
            Quota::Keyed(q) => q.stats(),
        };
        (log, stats)
    })
}

/// The limiter a schedule ran on, for its counters.
enum Quota {
    Single(RateLimiter),
    Keyed(KeyedRateLimiter<u64>),
}

/// A request carries its index and its cost: `index * COSTS + cost`.
const COSTS: u64 = 8;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Through the layer, requests are granted exactly when the same requests acquiring the
    /// limiter directly are (same order, same instants, the same given-up requests never
    /// charged), the inner service sees only granted requests, and the bound holds.
    #[test]
    fn shaping_grants_exactly_as_the_limiter_does(
        tokens in 1..5u64, per_ms in 20..200u64, burst in 1..5u64, schedule in schedule(),
    ) {
        let rate = Rate::new(tokens, Duration::from_millis(per_ms));
        let (via_layer, layer_stats) = run_schedule(&schedule, |start, log| {
            let quota = RateLimiter::new(rate, burst);
            let service = RateLimitLayer::new(&quota)
                .cost(|req: &u64| req % COSTS)
                .layer(recorder(start, &log));
            let go = move |i: u64, cost: u64| {
                let call = service.clone().oneshot(i * COSTS + cost);
                async move {
                    call.await.unwrap();
                }
            };
            (go, Quota::Single(quota))
        });
        let via_layer: Vec<_> = via_layer.iter().map(|&(req, at)| (req / COSTS, at)).collect();
        let (direct, direct_stats) = run_schedule(&schedule, |start, log| {
            let quota = RateLimiter::new(rate, burst);
            let limiter = quota.clone();
            let go = move |i: u64, cost: u64| {
                let (limiter, log) = (limiter.clone(), log.clone());
                async move {
                    limiter.acquire(cost).await;
                    log.lock().unwrap().push((i, nanos_since(start)));
                }
            };
            (go, Quota::Single(quota))
        });
        prop_assert_eq!(&via_layer, &direct);
        prop_assert_eq!(layer_stats.granted, via_layer.len() as u64);
        prop_assert_eq!(layer_stats.granted, direct_stats.granted);
        let mut bucket = NaiveBucket::new(tokens, rate.per(), burst);
        for &(i, at) in &via_layer {
            bucket.emit(at, schedule[i as usize].cost);
        }
        // Every request nobody gave up on got through.
        for (i, a) in schedule.iter().enumerate() {
            if a.give_up_after.is_none() {
                prop_assert!(via_layer.iter().any(|&(j, _)| j == i as u64));
            }
        }
    }

    /// Keyed: through the layer, each request is granted exactly when acquiring its key
    /// directly would grant it, given-up requests are never charged, and each key keeps its
    /// own bound.
    #[test]
    fn keyed_shaping_grants_exactly_as_the_keyed_limiter_does(
        tokens in 1..5u64, per_ms in 20..200u64, burst in 1..5u64, schedule in schedule(),
    ) {
        const KEYS: u64 = 3;
        let rate = Rate::new(tokens, Duration::from_millis(per_ms));
        let (via_layer, layer_stats) = run_schedule(&schedule, |start, log| {
            let quota = KeyedRateLimiter::new(rate, burst);
            let service = RateLimitLayer::keyed(&quota, |req: &u64| req / COSTS % KEYS)
                .cost(|req: &u64| req % COSTS)
                .layer(recorder(start, &log));
            let go = move |i: u64, cost: u64| {
                let call = service.clone().oneshot(i * COSTS + cost);
                async move {
                    call.await.unwrap();
                }
            };
            (go, Quota::Keyed(quota))
        });
        let via_layer: Vec<_> = via_layer.iter().map(|&(req, at)| (req / COSTS, at)).collect();
        let (direct, direct_stats) = run_schedule(&schedule, |start, log| {
            let quota = KeyedRateLimiter::new(rate, burst);
            let limiter = quota.clone();
            let go = move |i: u64, cost: u64| {
                let (limiter, log) = (limiter.clone(), log.clone());
                async move {
                    limiter.acquire(&(i % KEYS), cost).await;
                    log.lock().unwrap().push((i, nanos_since(start)));
                }
            };
            (go, Quota::Keyed(quota))
        });
        prop_assert_eq!(&via_layer, &direct);
        prop_assert_eq!(layer_stats.granted, via_layer.len() as u64);
        prop_assert_eq!(layer_stats.granted, direct_stats.granted);
        for key in 0..KEYS {
            let mut bucket = NaiveBucket::new(tokens, rate.per(), burst);
            for &(i, at) in via_layer.iter().filter(|&&(i, _)| i % KEYS == key) {
                bucket.emit(at, schedule[i as usize].cost);
            }
        }
    }

    /// Enforcing answers each request at its arrival, exactly as `try_acquire` would, lets
    /// only the accepted ones reach the inner service, and keeps the bound.
    #[test]
    fn enforcing_answers_at_once_as_try_acquire_does(
        tokens in 1..5u64, per_ms in 20..200u64, burst in 1..5u64, schedule in schedule(),
    ) {
        let schedule: Vec<_> = schedule
            .into_iter()
            .map(|a| Arrival { give_up_after: None, ..a })
            .collect();
        let rate = Rate::new(tokens, Duration::from_millis(per_ms));
        // Log: (index, ns) when accepted, (index + REFUSED, retry_after ns) when refused.
        const REFUSED: u64 = 1 << 32;
        let (via_layer, _) = run_schedule(&schedule, |start, log| {
            let quota = RateLimiter::new(rate, burst);
            let service = RateLimitLayer::new(&quota)
                .cost(|req: &u64| req % COSTS)
                .enforcing()
                .layer(recorder(start, &log));
            let go = move |i: u64, cost: u64| {
                let call = service.clone().oneshot(i * COSTS + cost);
                let log = log.clone();
                async move {
                    if let Err(e) = call.await {
                        let wait = e.downcast_ref::<RateLimited>().unwrap().retry_after();
                        let wait = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
                        log.lock().unwrap().push(((i + REFUSED) * COSTS, wait));
                    }
                }
            };
            (go, Quota::Single(quota))
        });
        let via_layer: Vec<_> = via_layer.iter().map(|&(req, at)| (req / COSTS, at)).collect();
        let (direct, _) = run_schedule(&schedule, |start, log| {
            let quota = RateLimiter::new(rate, burst);
            let limiter = quota.clone();
            let go = move |i: u64, cost: u64| {
                let entry = match limiter.try_acquire(cost) {
                    Ok(()) => (i, nanos_since(start)),
                    Err(refused) => (
                        i + REFUSED,
                        u64::try_from(refused.retry_after().as_nanos()).unwrap_or(u64::MAX),
                    ),
                };
                log.lock().unwrap().push(entry);
                async {}
            };
            (go, Quota::Single(quota))
        });
        // The direct run answers (and records) synchronously at each arrival: equal logs mean
        // the layer answered at the arrival instant too.
        prop_assert_eq!(&via_layer, &direct);
        let mut bucket = NaiveBucket::new(tokens, rate.per(), burst);
        for &(i, at) in via_layer.iter().filter(|&&(i, _)| i < REFUSED) {
            bucket.emit(at, schedule[i as usize].cost);
        }
    }
}

/// The layer takes a `RedisRateLimiter` as it takes any quota (compiled, not run: the Redis
/// tests need a server).
#[cfg(feature = "redis")]
#[allow(dead_code)]
fn over_redis(quota: &paced::RedisRateLimiter) {
    fn is_service<S: Service<u64> + Clone + Send>(_: &S) {}
    let inner = tower::service_fn(|n: u64| async move { Ok::<_, Infallible>(n) });
    is_service(&RateLimitLayer::new(quota).layer(inner));
    is_service(&RateLimitLayer::new(quota).enforcing().layer(inner));
}
