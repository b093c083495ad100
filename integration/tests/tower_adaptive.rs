//! `paced::tower::AdaptiveLayer`: every completed response reported to an `Adaptive` as the
//! classifier reads it. Paused-time tests against the simulated provider
//! (`common/provider.rs`) answering plain `http::Response`s, and one short real-HTTP test on
//! 127.0.0.1.
#![cfg(feature = "tower")]

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/provider.rs"]
mod provider;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{stream, StreamExt};
use http::{header::RETRY_AFTER, Response, StatusCode};
use paced::tower::{AdaptiveLayer, Outcome, RateLimitLayer};
use paced::{Adaptive, Rate, RateLimiter};
use proptest::prelude::*;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

use common::{paused, within_an_hour, MS};
use provider::{check_windows, per_second, rate_of, Answer, Provider};

/// The classifier the docs give for `http::Response`: 429 and 503 are refusals, with
/// `Retry-After` in delta-seconds; other server errors and transport errors say nothing.
fn classify<B, E>(result: &Result<Response<B>, E>) -> Outcome {
    match result {
        Ok(r) if matches!(r.status().as_u16(), 429 | 503) => Outcome::Throttled {
            retry_after: r
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.trim().parse().ok())
                .map(Duration::from_secs),
        },
        Ok(r) if r.status().is_server_error() => Outcome::Ignore,
        Ok(_) => Outcome::Success,
        Err(_) => Outcome::Ignore,
    }
}

/// A response of `status`, with `Retry-After: secs` if given.
fn answer(status: u16, retry_after_secs: Option<u64>) -> Response<()> {
    let mut builder = Response::builder().status(status);
    if let Some(secs) = retry_after_secs {
        builder = builder.header(RETRY_AFTER, secs.to_string());
    }
    builder.body(()).expect("valid response")
}

/// The provider's answer as HTTP: 200, or 429 with `Retry-After` in whole seconds, rounded up
/// (the header has no finer unit).
fn as_http(answer_: Answer) -> Response<()> {
    match answer_ {
        Answer::Ok => answer(200, None),
        Answer::Refused(None) => answer(429, None),
        Answer::Refused(Some(d)) => answer(429, Some(d.as_millis().div_ceil(1000) as u64)),
    }
}

/// The client of a paused-time run: the stack the docs show, over a service that asks the
/// provider and answers after the round trip.
struct Run {
    /// Responses answered in each whole second, by status.
    ok: Vec<u64>,
    refused: Vec<u64>,
    rate: Vec<f64>,
    max: Rate,
    adaptive: Adaptive,
    /// The pauses `Retry-After` asked for, as `[from, to)` since the start.
    pauses: Vec<(Duration, Duration)>,
}

/// How much of `[from, to)` the pauses cover.
fn paused_within(pauses: &[(Duration, Duration)], from: Duration, to: Duration) -> Duration {
    let mut covered = Duration::ZERO;
    let mut reached = from;
    for &(a, b) in pauses {
        let (a, b) = (a.max(reached), b.min(to));
        if b > a {
            covered += b - a;
            reached = b;
        }
    }
    covered
}

async fn run_through_the_layer(
    limit: f64,
    latency: Duration,
    concurrency: usize,
    retry_after: bool,
    seconds: u64,
) -> Run {
    let max = rate_of(10.0 * limit);
    let limiter = RateLimiter::new(max, ((10.0 * limit / 1000.0).round() as u64).max(2));
    let adaptive = Adaptive::new(limiter, Rate::new(1, Duration::from_secs(10)), max);
    let provider = Arc::new(Provider::new(
        limit,
        (limit * 0.05).round().max(2.0),
        retry_after,
    ));
    let client = ServiceBuilder::new()
        .layer(AdaptiveLayer::new(&adaptive, classify))
        .layer(RateLimitLayer::new(adaptive.limiter()))
        .service_fn(move |()| {
            let provider = provider.clone();
            async move {
                let answer_ = provider.call();
                tokio::time::sleep(latency).await;
                Ok::<_, Infallible>(as_http(answer_))
            }
        });
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds);
    let n = seconds as usize + 1;
    let record = Arc::new(Mutex::new((vec![0u64; n], vec![0u64; n], vec![0.0; n])));
    let pauses = Arc::new(Mutex::new(Vec::new()));
    let calls = {
        let record = record.clone();
        let adaptive = adaptive.clone();
        let pauses = pauses.clone();
        stream::repeat(())
            .take_until(tokio::time::sleep_until(end))
            .map(move |()| client.clone().oneshot(()))
            .buffer_unordered(concurrency)
            .for_each(move |response| {
                let s = start.elapsed().as_secs() as usize;
                let mut r = record.lock().unwrap();
                let response = response.unwrap();
                match response.status() {
                    StatusCode::OK => r.0[s.min(n - 1)] += 1,
                    _ => r.1[s.min(n - 1)] += 1,
                }
                if let Outcome::Throttled {
                    retry_after: Some(d),
                } = classify::<_, ()>(&Ok(response))
                {
                    let now = start.elapsed();
                    pauses.lock().unwrap().push((now, now + d));
                }
                r.2[s.min(n - 1)] = per_second(adaptive.rate());
                async {}
            })
    };
    within_an_hour(calls).await;
    let (ok, refused, rate) = std::mem::take(&mut *record.lock().unwrap());
    let pauses = std::mem::take(&mut *pauses.lock().unwrap());
    Run {
        pauses,
        ok,
        refused,
        rate,
        max,
        adaptive,
    }
}

/// Goodput (per second) and the share of refused calls in `[from, to)` seconds, counting only
/// the time outside the pauses `Retry-After` asked for.
fn figures_outside_pauses(run: &Run, from: u64, to: u64) -> (f64, f64) {
    let (ok, refused): (u64, u64) = (
        run.ok[from as usize..to as usize].iter().sum(),
        run.refused[from as usize..to as usize].iter().sum(),
    );
    let paused = paused_within(
        &run.pauses,
        Duration::from_secs(from),
        Duration::from_secs(to),
    );
    let open = (Duration::from_secs(to - from) - paused).as_secs_f64();
    (
        ok as f64 / open.max(1e-9),
        refused as f64 / (ok + refused).max(1) as f64,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    /// Through the layer, started at 10 × L, the client finds the provider's limit: the rate
    /// comes down from `max` and stays near L, every response is reported (the stats count
    /// exactly the 200s and 429s the client saw), and the convergence goals hold from 20 s on:
    /// without `Retry-After` in every 10 s window (goodput ≥ 0.85 L, ≤ 10 % refused); with it,
    /// over the time the pauses it asked for leave (goodput ≥ 0.9 L, ≤ 5 % refused). A
    /// whole-second `Retry-After` pauses the client far longer than the provider needs, so
    /// counting the paused time as lost goodput would measure the header, not the layer.
    #[test]
    fn the_client_finds_the_limit_through_the_layer(
        limit in 5u32..=200,
        latency_ms in 0u64..=50,
        concurrency in 1usize..=16,
        retry_after in any::<bool>(),
    ) {
        let limit = f64::from(limit);
        // Only where the client can reach the limit at all: c / latency ≥ 2 L.
        prop_assume!(latency_ms == 0 || concurrency as f64 * 1000.0 / latency_ms as f64 >= 2.0 * limit);
        let run = paused(run_through_the_layer(
            limit,
            Duration::from_millis(latency_ms),
            concurrency,
            retry_after,
            60,
        ));
        let stats = run.adaptive.stats();
        prop_assert_eq!(stats.successes, run.ok.iter().sum::<u64>());
        prop_assert_eq!(stats.throttled, run.refused.iter().sum::<u64>());
        prop_assert!(stats.decreases >= 1);
        prop_assert!(stats.rate != run.max);
        let highest = run.rate[20..60].iter().copied().fold(0.0, f64::max);
        prop_assert!(highest <= 1.5 * limit, "rate up to {highest:.1}/s from 20 s on, L = {limit}");
        if retry_after {
            let (goodput, refused) = figures_outside_pauses(&run, 20, 60);
            prop_assert!(
                goodput >= 0.9 * limit && refused <= 0.05,
                "goodput {goodput:.2}/s, refused {:.1} %, L = {limit}, pauses {:?}",
                refused * 100.0,
                run.pauses
            );
        } else {
            let windows = provider::Run {
                ok: run.ok.clone(),
                refused: run.refused.clone(),
                rate: run.rate.clone(),
                ..provider::Run::default()
            };
            let checked = check_windows(&windows, 20, 60, limit, 0.85, 0.10);
            prop_assert!(checked.is_ok(), "{}", checked.unwrap_err());
        }
    }

    /// A 429 with `Retry-After: d` that comes back at `t` pauses the limiter: no request
    /// reaches the inner service after `t` and before `t + d`, and the first waiting one does
    /// at `t + d` exactly.
    #[test]
    fn retry_after_pauses_the_limiter(
        requests in 2usize..=20,
        refused_call in 0usize..20,
        secs in 1u64..=5,
        latency_ms in 0u64..=50,
        burst in 1u64..=5,
    ) {
        let refused_call = refused_call % requests;
        paused(async move {
            let limiter = RateLimiter::new(Rate::per_second(100), burst);
            let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(100));
            let calls = Arc::new(Mutex::new(Vec::new()));
            let start = Instant::now();
            let client = {
                let calls = calls.clone();
                ServiceBuilder::new()
                    .layer(AdaptiveLayer::new(&adaptive, classify))
                    .layer(RateLimitLayer::new(adaptive.limiter()))
                    .service_fn(move |()| {
                        let n = {
                            let mut calls = calls.lock().unwrap();
                            calls.push(start.elapsed());
                            calls.len() - 1
                        };
                        async move {
                            tokio::time::sleep(Duration::from_millis(latency_ms)).await;
                            if n == refused_call {
                                Ok::<_, Infallible>(answer(429, Some(secs)))
                            } else {
                                Ok(answer(200, None))
                            }
                        }
                    })
            };
            let answered: Vec<_> = within_an_hour(futures_util::future::join_all(
                (0..requests).map(|_| {
                    let client = client.clone();
                    async move {
                        let response = client.oneshot(()).await.unwrap();
                        (response.status(), start.elapsed())
                    }
                }),
            ))
            .await;
            let refused_at = answered
                .iter()
                .find(|(status, _)| *status == StatusCode::TOO_MANY_REQUESTS)
                .map(|&(_, at)| at)
                .expect("one 429");
            let calls = calls.lock().unwrap().clone();
            let pause_end = refused_at + Duration::from_secs(secs);
            let inside: Vec<_> = calls
                .iter()
                .filter(|&&at| at > refused_at && at < pause_end)
                .collect();
            prop_assert!(inside.is_empty(), "calls {calls:?}, 429 back at {refused_at:?}");
            if let Some(&first_after) = calls.iter().find(|&&at| at > refused_at) {
                prop_assert_eq!(first_after, pause_end, "calls {:?}", calls);
            }
            let stats = adaptive.stats();
            prop_assert_eq!((stats.successes, stats.throttled), (requests as u64 - 1, 1));
            Ok(())
        })?;
    }

    /// The layer reports exactly what the classifier says, in order, and nothing for
    /// `Ignore`: a twin controller told the same outcomes by hand at the same instants ends
    /// every step in the same state; the response comes out unchanged.
    #[test]
    fn it_reports_what_the_classifier_says_and_nothing_for_ignore(
        steps in prop::collection::vec((0u64..300, 0u8..8, 1u64..=3), 1..40),
    ) {
        paused(async move {
            let new = || {
                Adaptive::new(
                    RateLimiter::new(Rate::per_second(50), 5),
                    Rate::per_second(1),
                    Rate::per_second(50),
                )
            };
            let (adaptive, twin) = (new(), new());
            let script = Arc::new(Mutex::new(steps.clone().into_iter()));
            let mut client = AdaptiveLayer::new(&adaptive, classify).layer(tower::service_fn(
                move |()| {
                    let (_, kind, secs) = script.lock().unwrap().next().expect("scripted");
                    async move {
                        match kind {
                            0 => Ok(answer(200, None)),
                            1 => Ok(answer(404, None)),
                            2 => Ok(answer(429, None)),
                            3 => Ok(answer(429, Some(secs))),
                            4 => Ok(answer(503, Some(secs))),
                            5 => Ok(answer(500, None)),
                            6 => Err("connection reset"),
                            _ => Ok(Response::builder()
                                .status(429)
                                .header(RETRY_AFTER, "Wed, 21 Oct 2026 07:28:00 GMT")
                                .body(())
                                .unwrap()),
                        }
                    }
                },
            ));
            for (gap, kind, secs) in steps {
                tokio::time::sleep(Duration::from_millis(gap)).await;
                let result = client.ready().await.unwrap().call(()).await;
                let status = result.as_ref().map(|r| r.status().as_u16()).map_err(|e| *e);
                match kind {
                    0 | 1 => twin.on_success(),
                    2 | 7 => twin.on_throttled(None),
                    3 | 4 => twin.on_throttled(Some(Duration::from_secs(secs))),
                    _ => {}
                }
                let expected: [Result<u16, &str>; 8] =
                    [Ok(200), Ok(404), Ok(429), Ok(429), Ok(503), Ok(500), Err("connection reset"), Ok(429)];
                prop_assert_eq!(status, expected[usize::from(kind)]);
                prop_assert_eq!(adaptive.stats(), twin.stats());
                prop_assert_eq!(
                    adaptive.limiter().try_acquire(1).is_ok(),
                    twin.limiter().try_acquire(1).is_ok()
                );
            }
            Ok(())
        })?;
    }
}

/// The figures in the README: what honouring a whole-second `Retry-After` costs. Run with
/// `cargo test -p paced-integration --release --features tower --test tower_adaptive -- --ignored
/// --nocapture`.
#[test]
#[ignore = "prints figures; asserts nothing"]
fn figures_with_and_without_retry_after() {
    println!("| L/s | Retry-After | goodput / L | refused | paused |");
    println!("|---:|---|---:|---:|---:|");
    for limit in [5.0, 50.0, 200.0] {
        for retry_after in [true, false] {
            let run = paused(run_through_the_layer(
                limit,
                Duration::from_millis(10),
                8,
                retry_after,
                60,
            ));
            let (ok, refused): (u64, u64) = (
                run.ok[20..60].iter().sum(),
                run.refused[20..60].iter().sum(),
            );
            let paused_for = paused_within(
                &run.pauses,
                Duration::from_secs(20),
                Duration::from_secs(60),
            );
            println!(
                "| {limit} | {} | {:.3} | {:.2} % | {:.0} % |",
                if retry_after { "honoured" } else { "none" },
                ok as f64 / 40.0 / limit,
                100.0 * refused as f64 / (ok + refused).max(1) as f64,
                100.0 * paused_for.as_secs_f64() / 40.0,
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn ignore_outcomes_change_nothing() {
    let limiter = RateLimiter::new(Rate::per_second(50), 5);
    let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(50));
    let before = adaptive.stats();
    let client = ServiceBuilder::new()
        .layer(AdaptiveLayer::new(&adaptive, classify))
        .layer(RateLimitLayer::new(adaptive.limiter()))
        .service_fn(|n: u32| async move {
            if n % 2 == 0 {
                Ok(answer(500, Some(30)))
            } else {
                Err("connection refused")
            }
        });
    let start = Instant::now();
    for n in 0..100 {
        let _ = within_an_hour(client.clone().oneshot(n)).await;
    }
    assert_eq!(adaptive.stats(), before);
    assert_eq!(adaptive.rate(), Rate::per_second(50));
    // No pause either: 100 calls at 50/s with a burst of 5 take (100 - 5) × 20 ms.
    assert_eq!(start.elapsed().as_nanos() as u64, 95 * 20 * MS);
}

#[tokio::test(start_paused = true)]
async fn a_response_future_dropped_before_it_completes_reports_nothing() {
    let limiter = RateLimiter::new(Rate::per_second(1), 1);
    let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(1));
    let calls = Arc::new(Mutex::new(0u32));
    let mut client = {
        let calls = calls.clone();
        ServiceBuilder::new()
            .layer(AdaptiveLayer::new(&adaptive, classify))
            .layer(RateLimitLayer::new(adaptive.limiter()))
            .service_fn(move |()| {
                *calls.lock().unwrap() += 1;
                async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, Infallible>(answer(429, Some(10)))
                }
            })
    };
    // Granted at once, then dropped while the inner call is in flight.
    let mut in_flight = tokio_test::task::spawn(client.ready().await.unwrap().call(()));
    tokio_test::assert_pending!(in_flight.poll());
    assert_eq!(*calls.lock().unwrap(), 1);
    tokio::time::advance(Duration::from_millis(50)).await;
    tokio_test::assert_pending!(in_flight.poll());
    // Waiting for its token (the next one is 1 s away), then dropped.
    let mut waiting = tokio_test::task::spawn(client.ready().await.unwrap().call(()));
    tokio_test::assert_pending!(waiting.poll());
    drop(in_flight);
    drop(waiting);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(*calls.lock().unwrap(), 1);
    let stats = adaptive.stats();
    assert_eq!(
        (stats.successes, stats.throttled, stats.decreases),
        (0, 0, 0)
    );
    // Nothing paused the limiter: a token is there again.
    assert!(adaptive.limiter().try_acquire(1).is_ok());
}

#[tokio::test(start_paused = true)]
async fn each_completed_response_is_classified_once() {
    let limiter = RateLimiter::new(Rate::per_second(10), 10);
    let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(10));
    let classified = Arc::new(Mutex::new(0u32));
    let counted = classified.clone();
    let client = AdaptiveLayer::new(&adaptive, move |_: &Result<u32, Infallible>| {
        *counted.lock().unwrap() += 1;
        Outcome::Success
    })
    .layer(tower::service_fn(|n: u32| async move { Ok(n) }));
    let mut future = std::pin::pin!(client.oneshot(7));
    assert_eq!(within_an_hour(future.as_mut()).await.unwrap(), 7);
    assert_eq!(*classified.lock().unwrap(), 1);
    assert_eq!(adaptive.stats().successes, 1);
}

#[tokio::test(start_paused = true)]
async fn debug_shows_nothing_of_the_controllers_state() {
    let limiter = RateLimiter::new(Rate::per_second(10), 10);
    let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(10));
    let layer = AdaptiveLayer::new(&adaptive, |_: &Result<u32, Infallible>| Outcome::Success);
    assert_eq!(format!("{layer:?}"), "AdaptiveLayer { .. }");
    let service = layer.layer(7u8);
    assert_eq!(format!("{service:?}"), "AdaptiveService { inner: 7, .. }");
    let mut service = layer.layer(tower::service_fn(|n: u32| async move { Ok(n) }));
    let mut future = Box::pin(service.ready().await.unwrap().call(1));
    assert_eq!(
        format!("{future:?}"),
        "AdaptiveFuture { reported: false, .. }"
    );
    assert_eq!((&mut future).await.unwrap(), 1);
    assert_eq!(
        format!("{future:?}"),
        "AdaptiveFuture { reported: true, .. }"
    );
}

/// Real HTTP on 127.0.0.1, in real time (paused time does not apply to sockets): an axum
/// server with a hidden limit of 100/s (burst 10) answering 429 with `Retry-After`, and a
/// hyper-util client through `AdaptiveLayer` + `RateLimitLayer` started at 2.5 × that, from 8
/// tasks. Bounded to 2.5 s of requests; the assertions are ones a loaded machine cannot
/// break: every response is reported, the rate came down from `max`, and refusals are a
/// small share. (Each refusal costs a 1 s pause, the header's smallest, so 2.5 s hold only
/// two or three overloads: the rate ends near 128/s, still above the limit.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_real_http_the_rate_comes_down_to_the_servers_limit() {
    use axum::error_handling::HandleErrorLayer;
    use axum::response::IntoResponse;
    use axum::routing::get;
    use axum::Router;
    use http_body_util::Empty;
    use hyper::body::Bytes;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use paced::tower::{BoxError, RateLimited};

    const TASKS: usize = 8;
    let hidden = RateLimiter::new(Rate::per_second(100), 10);
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(|err: BoxError| async move {
                match err.downcast_ref::<RateLimited>() {
                    Some(refused) => (
                        StatusCode::TOO_MANY_REQUESTS,
                        [(RETRY_AFTER, refused.retry_after_secs().to_string())],
                    )
                        .into_response(),
                    None => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                }
            }))
            .layer(RateLimitLayer::new(&hidden).enforcing()),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let max = Rate::per_second(250);
    let adaptive = Adaptive::new(RateLimiter::new(max, 10), Rate::per_second(10), max);
    let client = ServiceBuilder::new()
        .layer(AdaptiveLayer::new(&adaptive, classify))
        .layer(RateLimitLayer::new(adaptive.limiter()))
        .service(Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>());
    let start = std::time::Instant::now();
    let deadline = start + Duration::from_millis(2_500);
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while std::time::Instant::now() < deadline {
                    let request = http::Request::get(format!("http://{addr}/"))
                        .body(Empty::new())
                        .unwrap();
                    // A request still waiting out a pause at the deadline is dropped: it
                    // reports nothing and is not counted.
                    let bound = tokio::time::Instant::from_std(deadline);
                    match tokio::time::timeout_at(bound, client.clone().oneshot(request)).await {
                        Ok(response) => seen.push((start.elapsed(), response.unwrap().status())),
                        Err(_) => break,
                    }
                }
                seen
            })
        })
        .collect();
    let mut seen = Vec::new();
    for task in tasks {
        seen.extend(task.await.unwrap());
    }
    let count = |from: Duration, status: StatusCode| {
        seen.iter()
            .filter(|&&(at, s)| at >= from && s == status)
            .count() as u64
    };
    let stats = adaptive.stats();
    let (ok, refused) = (
        count(Duration::ZERO, StatusCode::OK),
        count(Duration::ZERO, StatusCode::TOO_MANY_REQUESTS),
    );
    println!(
        "{ok} × 200, {refused} × 429 in {:?}; {stats:?}",
        start.elapsed()
    );
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!((stats.successes, stats.throttled), (ok, refused));
    assert_eq!(ok + refused, seen.len() as u64, "only 200s and 429s");
    // Above the limit the server refuses, and the rate comes down from `max`.
    assert!(refused >= 1 && stats.decreases >= 1, "{stats:?}");
    assert!(per_second(stats.rate) < per_second(max), "{stats:?}");
    // Refusals are a small share: each overload is answered by a pause of at least 1 s, after
    // which the server's bucket is full again (10 successes before the next refusal), and
    // only the requests already in flight (at most one per task) meet the same refusal.
    // So at most 8 refusals per 10 successes, whatever the timing.
    assert!(refused <= ok, "{ok} × 200, {refused} × 429");
}

/// `AdaptiveLayer::http_multi`: an `Adaptive<[u64; N]>` fed every limit a provider's headers
/// announce, and its 429s.
#[cfg(feature = "http")]
mod multi {
    use std::convert::Infallible;
    use std::time::{Duration, SystemTime};

    use http::Response;
    use paced::tower::AdaptiveLayer;
    use paced::{Adaptive, Limit, Rate, RateLimiter};
    use tower::{ServiceBuilder, ServiceExt};

    use super::provider::per_second;

    /// An OpenAI-style answer: `(status, [remaining, reset] of requests, of tokens)`.
    fn openai(status: u16, requests: (u64, &str), tokens: (u64, &str)) -> Response<()> {
        Response::builder()
            .status(status)
            .header("x-ratelimit-limit-requests", "120")
            .header("x-ratelimit-remaining-requests", requests.0.to_string())
            .header("x-ratelimit-reset-requests", requests.1)
            .header("x-ratelimit-limit-tokens", "72000")
            .header("x-ratelimit-remaining-tokens", tokens.0.to_string())
            .header("x-ratelimit-reset-tokens", tokens.1)
            .body(())
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn openai_headers_set_requests_and_tokens_and_a_429_for_tokens_lowers_tokens_only() {
        let limiter = RateLimiter::builder(["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_second(10), 10))
            .limit("tokens", Limit::bucket(Rate::per_second(1_000), 1_000))
            .build()
            .unwrap();
        let adaptive = Adaptive::builder(limiter)
            .adapt(0, Rate::per_second(1), Rate::per_second(10))
            .adapt(1, Rate::per_second(10), Rate::per_second(1_000))
            .build()
            .unwrap();
        let provider = ServiceBuilder::new()
            .layer(AdaptiveLayer::http_multi(&adaptive))
            .service(tower::service_fn(|refuse: bool| async move {
                Ok::<_, Infallible>(if refuse {
                    // Tokens ran out, requests did not.
                    openai(429, (100, "1m0s"), (0, "2s"))
                } else {
                    // 120 requests a minute, 72,000 tokens in 6 minutes.
                    openai(200, (119, "1m0s"), (71_999, "6m0s"))
                })
            }));
        adaptive.acquire([1, 100]).await;
        provider.clone().oneshot(false).await.unwrap();
        assert_eq!(adaptive.rate(0), Some(Rate::per_second(2)));
        assert_eq!(adaptive.rate(1), Some(Rate::per_second(200)));

        provider.oneshot(true).await.unwrap();
        assert_eq!(adaptive.rate(0), Some(Rate::per_second(2)));
        assert_eq!(adaptive.rate(1), Some(Rate::per_second(160))); // 80 %
        let (r, t) = (adaptive.stats(0).unwrap(), adaptive.stats(1).unwrap());
        assert_eq!((r.successes, r.throttled, r.decreases), (1, 0, 0));
        assert_eq!((t.successes, t.throttled, t.decreases), (1, 1, 1));
        // No `Retry-After`: paused until the exhausted limit's reset.
        let refused = adaptive.try_acquire([1, 1]).unwrap_err();
        assert_eq!(refused.retry_after(), Duration::from_secs(2));
    }

    /// An RFC 3339 time `secs` whole seconds after the next whole second of the wall clock
    /// (Anthropic's resets are read against it, not against tokio's paused clock).
    fn at(secs: u64) -> String {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        jiff::Timestamp::from_second((now + 1 + secs) as i64)
            .unwrap()
            .to_string()
    }

    /// An Anthropic-style answer: remaining requests, input and output tokens, each reset in
    /// about 60 s.
    fn anthropic(status: u16, remaining: [u64; 3]) -> Response<()> {
        let mut b = Response::builder().status(status);
        for (part, left) in ["requests", "input-tokens", "output-tokens"]
            .into_iter()
            .zip(remaining)
        {
            b = b
                .header(
                    format!("anthropic-ratelimit-{part}-remaining"),
                    left.to_string(),
                )
                .header(format!("anthropic-ratelimit-{part}-reset"), at(60));
        }
        if status == 429 {
            b = b.header("retry-after", "1");
        }
        b.body(()).unwrap()
    }

    /// `got` is `x / reset` for a reset between 60 and 62 s (the wall clock moves on).
    fn about(got: Option<Rate>, x: f64) {
        let got = per_second(got.unwrap());
        assert!(
            x / 62.0 - 0.001 <= got && got <= x / 60.0 + 0.001,
            "{got} for {x}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn anthropic_headers_set_each_limit_and_a_429_for_requests_lowers_requests_only() {
        let limiter = RateLimiter::builder(["requests", "input", "output"])
            .limit("requests", Limit::bucket(Rate::per_second(10), 10))
            .limit("input", Limit::bucket(Rate::per_second(2_000), 2_000))
            .limit("output", Limit::bucket(Rate::per_second(1_000), 1_000))
            .build()
            .unwrap();
        let adaptive = Adaptive::builder(limiter)
            .adapt(
                0,
                Rate::new(1, Duration::from_secs(10)),
                Rate::per_second(10),
            )
            .adapt(1, Rate::per_second(10), Rate::per_second(2_000))
            .adapt(2, Rate::per_second(10), Rate::per_second(1_000))
            .route("input-tokens", 1)
            .route("output-tokens", 2)
            .build()
            .unwrap();
        let provider = ServiceBuilder::new()
            .layer(AdaptiveLayer::http_multi(&adaptive))
            .service(tower::service_fn(|refuse: bool| async move {
                Ok::<_, Infallible>(if refuse {
                    anthropic(429, [0, 5_000, 1_000])
                } else {
                    anthropic(200, [49, 59_999, 11_999])
                })
            }));
        provider.clone().oneshot(false).await.unwrap();
        about(adaptive.rate(0), 50.0);
        about(adaptive.rate(1), 60_000.0);
        about(adaptive.rate(2), 12_000.0);
        let before = [0, 1, 2].map(|i| adaptive.rate(i).unwrap());

        provider.oneshot(true).await.unwrap();
        let lowered = per_second(adaptive.rate(0).unwrap());
        let expected = 0.8 * per_second(before[0]);
        assert!(
            (lowered - expected).abs() <= 0.001,
            "{lowered} for {expected}"
        );
        assert_eq!(adaptive.rate(1), Some(before[1]));
        assert_eq!(adaptive.rate(2), Some(before[2]));
        assert_eq!(adaptive.stats(0).unwrap().decreases, 1);
        assert_eq!(adaptive.stats(1).unwrap().throttled, 0);
        // `Retry-After: 1` pauses the whole limiter.
        let refused = adaptive.try_acquire([1, 1, 1]).unwrap_err();
        assert_eq!(refused.retry_after(), Duration::from_secs(1));
    }
}
