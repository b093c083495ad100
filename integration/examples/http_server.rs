//! An axum app that answers `429 Too Many Requests` with `Retry-After`, per API key, through
//! paced's enforcing tower layer; a client in the same program shows it, then the program
//! exits.
//!
//! Each API key may make 2 requests at once, then one per second. A request over its key's
//! limit is refused at once, charged nothing, and never reaches the handler; the refusal's
//! `retry_after()`, rounded up to whole seconds, becomes the `Retry-After` header. To key by
//! client IP instead, serve with `into_make_service_with_connect_info::<SocketAddr>()` and
//! key by `req.extensions().get::<ConnectInfo<SocketAddr>>()` (see `tests/tower_http.rs`).
//!
//! ```text
//! cargo run -p paced-integration --features tower --example http_server
//! ```

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::error_handling::HandleErrorLayer;
use axum::http::{header, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use paced::tower::{BoxError, RateLimitLayer, RateLimited};
use paced::{KeyedRateLimiter, Rate};
use tower::ServiceBuilder;

/// Turns a refusal into `429` with `Retry-After`; any other error is the app's own.
async fn too_many_requests(err: BoxError) -> Response {
    match err.downcast_ref::<RateLimited>() {
        Some(refused) => (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, refused.retry_after_secs().to_string())],
            format!("{refused}\n"),
        )
            .into_response(),
        None => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response(),
    }
}

/// The client's API key, from the `x-api-key` header (`None`: anonymous clients share one
/// bucket).
fn api_key(req: &Request<Body>) -> Option<String> {
    let key = req.headers().get("x-api-key")?;
    Some(key.to_str().ok()?.to_owned())
}

#[tokio::main]
async fn main() {
    let per_key = KeyedRateLimiter::new(Rate::per_second(1), 2);
    let app = Router::new()
        .route("/quote", get(|| async { "42\n" }))
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(too_many_requests))
                .layer(RateLimitLayer::keyed(&per_key, api_key).enforcing()),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    println!("serving on http://{addr}/quote");

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let start = Instant::now();
    let get = |key: &'static str| {
        let request = Request::get(format!("http://{addr}/quote"))
            .header("x-api-key", key)
            .body(Empty::new())
            .unwrap();
        let response = client.request(request);
        async move {
            let response = response.await.unwrap();
            let retry_after = response
                .headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            println!(
                "[{:>5.3}s] {key:<5} -> {}{}",
                start.elapsed().as_secs_f64(),
                response.status(),
                retry_after.map_or(String::new(), |s| format!(", Retry-After: {s}")),
            );
            (response.status(), retry_after)
        }
    };

    assert_eq!(get("alice").await.0, StatusCode::OK);
    assert_eq!(get("alice").await.0, StatusCode::OK);
    let (status, retry_after) = get("alice").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(get("bob").await.0, StatusCode::OK, "bob has his own bucket");
    // alice waits as told, then is served again.
    let wait = Duration::from_secs(retry_after.expect("a Retry-After header"));
    tokio::time::sleep(wait).await;
    assert_eq!(get("alice").await.0, StatusCode::OK);
    let served = per_key.stats();
    println!("granted {}, refused {}", served.granted, served.rejected);
}
