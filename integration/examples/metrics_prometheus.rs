//! A paced workload recorded to Prometheus through the `metrics` facade, served on a scrape
//! endpoint, and scraped once.
//!
//! The application installs a recorder (here `metrics-exporter-prometheus`'s), names its
//! limiters with `with_metrics`, and serves `handle.render()` on `/metrics` (an axum server on
//! 127.0.0.1, as a service would). The example then scrapes it over HTTP and prints the scrape.
//! Two limiters are named:
//!
//! - `partner-api`, a `RateLimiter`: twenty calls at 20 per second with a burst of 5, one
//!   refused `try_acquire`, and one caller that gives up waiting. Its rows show the grants, the
//!   refusal, the cancellation and the wait histogram.
//! - `search-api`, an `Adaptive`: it makes no call, but is told of one `429`, and lowers its
//!   rate from 50/s to 40/s. Its rows show the decrease and the rate; its other counters stay 0.
//!
//! ```text
//! cargo run -p paced-integration --features metrics --example metrics_prometheus
//! ```

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use paced::{Adaptive, Rate, RateLimiter};
use tokio::task::JoinSet;
use tokio::time::{timeout, Instant};

#[tokio::main]
async fn main() {
    // Install the recorder first: a limiter registers its metrics when it is named.
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("no other recorder is installed");

    let limiter = RateLimiter::new(Rate::per_second(20), 5).with_metrics("partner-api");
    let adaptive = Adaptive::new(
        RateLimiter::new(Rate::per_second(50), 1),
        Rate::per_second(5),
        Rate::per_second(50),
    )
    .with_metrics("search-api");

    let start = Instant::now();
    let mut calls = JoinSet::new();
    for _ in 0..20 {
        let limiter = limiter.clone();
        calls.spawn(async move { limiter.acquire(1).await });
    }
    // Everyone ahead is queued: a request that cannot wait is refused...
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(limiter.try_acquire(1).is_err());
    // ...and one that gives up after 50 ms leaves the queue (a cancellation).
    assert!(timeout(Duration::from_millis(50), limiter.acquire(1))
        .await
        .is_err());
    while let Some(call) = calls.join_next().await {
        call.expect("a call panicked");
    }
    // The partner answered 429 once: the adaptive limiter slows down.
    adaptive.on_throttled(None);

    let stats = limiter.stats();
    println!(
        "partner-api: {} calls in {:.2}s, {} refused, 1 caller gave up waiting",
        stats.granted,
        start.elapsed().as_secs_f64(),
        stats.rejected
    );
    println!(
        "search-api: no call, one 429 reported, rate now {}",
        adaptive.rate()
    );
    println!("the scrape:\n");
    let scrape = scrape_over_http(handle).await;
    print!("{scrape}");
    assert!(scrape.contains("paced_grants_total{limiter=\"partner-api\"} 20"));
    assert!(scrape.contains("paced_cancellations_total{limiter=\"partner-api\"} 1"));
    assert!(scrape.contains("paced_adaptive_decreases_total{limiter=\"search-api\"} 1"));
}

/// Serves the recorder's scrape on `/metrics` of an ephemeral port of 127.0.0.1, then fetches
/// it once, as Prometheus would.
async fn scrape_over_http(handle: metrics_exporter_prometheus::PrometheusHandle) -> String {
    use axum::routing::get;
    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let app = axum::Router::new().route("/metrics", get(move || async move { handle.render() }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let uri = format!("http://{addr}/metrics").parse().expect("a URI");
    let response = client.get(uri).await.expect("the scrape endpoint answers");
    assert!(response.status().is_success());
    let body = response.into_body().collect().await.expect("the body");
    String::from_utf8(body.to_bytes().to_vec()).expect("text")
}
