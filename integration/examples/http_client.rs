//! An HTTP client that never hears `429 Too Many Requests`: every request goes through paced's
//! tower layer, on the rate the partner API allows.
//!
//! The "partner API" here is a local axum server with a hidden limit, counted the way many
//! APIs count: at most 220 requests per calendar second (a fixed window). The client knows the
//! advertised rate, 200 requests per second, and paces at it with a burst of 10, so that any
//! calendar second sees at most 210 of its requests, with room left for scheduling jitter.
//!
//! First twenty tasks send 400 requests unpaced (many are refused), then the same twenty tasks
//! send 400 more through `RateLimitLayer`, each with its own clone of the client: all are
//! served, in about two seconds.
//!
//! ```text
//! cargo run -p paced-integration --features tower --example http_client
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{header, Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use paced::tower::RateLimitLayer;
use paced::{Rate, RateLimiter};
use tower::{Service, ServiceBuilder, ServiceExt};

const SERVER_LIMIT_PER_SECOND: u64 = 220;
const ADVERTISED_RATE: u64 = 200;
const TASKS: u64 = 20;
const REQUESTS: u64 = 400;

/// The partner's fixed window: the current second and how many requests it has seen.
struct Window {
    start: Instant,
    second: u64,
    seen: u64,
}

/// Starts the partner API on an ephemeral port of 127.0.0.1.
async fn partner_api() -> SocketAddr {
    let window = Arc::new(Mutex::new(Window {
        start: Instant::now(),
        second: 0,
        seen: 0,
    }));
    let app = Router::new().route(
        "/send",
        get(move || {
            let mut w = window.lock().unwrap();
            let second = w.start.elapsed().as_secs();
            if second != w.second {
                (w.second, w.seen) = (second, 0);
            }
            w.seen += 1;
            let answer = if w.seen > SERVER_LIMIT_PER_SECOND {
                (StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, "1")]).into_response()
            } else {
                "sent".into_response()
            };
            async move { answer }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Sends `REQUESTS` requests from `TASKS` tasks, each with its own clone of `client`; returns
/// how many were refused and how long it took.
async fn send_all<S>(client: S, addr: SocketAddr) -> (u64, Duration)
where
    S: Service<Request<Empty<Bytes>>, Response = axum::http::Response<hyper::body::Incoming>>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug,
{
    let refused = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (client, refused) = (client.clone(), refused.clone());
            tokio::spawn(async move {
                for _ in 0..REQUESTS / TASKS {
                    let request = Request::get(format!("http://{addr}/send"))
                        .body(Empty::new())
                        .unwrap();
                    let response = client.clone().oneshot(request).await.unwrap();
                    if response.status() == StatusCode::TOO_MANY_REQUESTS {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    (refused.load(Ordering::Relaxed), start.elapsed())
}

#[tokio::main]
async fn main() {
    let addr = partner_api().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();

    let (refused, took) = send_all(client.clone(), addr).await;
    println!("unpaced: {REQUESTS} requests in {took:.2?}, {refused} refused with 429");

    // Let the partner's window roll over, so the paced run starts from a clean second.
    tokio::time::sleep(Duration::from_millis(1_000)).await;

    // One quota for every clone of the client: the advertised rate, 10 at once.
    let quota = RateLimiter::new(Rate::per_second(ADVERTISED_RATE), 10);
    let paced = ServiceBuilder::new()
        .layer(RateLimitLayer::new(&quota))
        .service(client);
    let (refused, took) = send_all(paced, addr).await;
    println!("paced:   {REQUESTS} requests in {took:.2?}, {refused} refused with 429");
    assert_eq!(refused, 0, "the paced client was refused");
}
