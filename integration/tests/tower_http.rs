//! `paced::tower` with real HTTP on 127.0.0.1: an axum server and a hyper-util client, in real
//! time (paused time does not apply to sockets). Every run is bounded to a few seconds; the
//! assertions are upper bounds that cannot flake ("at most burst + rate × elapsed", zero 429s
//! with the server's burst covering scheduling jitter) and generous lower bounds.
#![cfg(feature = "tower")]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::error_handling::HandleErrorLayer;
use axum::extract::ConnectInfo;
use axum::http::{header, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use paced::tower::{BoxError, RateLimitLayer, RateLimited};
use paced::{KeyedRateLimiter, Limit, Rate, RateLimiter};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// Serves `app` on an ephemeral port of 127.0.0.1, with the peer's address available to
/// handlers and layers as `ConnectInfo<SocketAddr>`.
async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let app = app.into_make_service_with_connect_info::<SocketAddr>();
        axum::serve(listener, app).await.unwrap();
    });
    addr
}

fn client_from(local: Option<IpAddr>) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_local_address(local);
    Client::builder(TokioExecutor::new()).build(connector)
}

fn get_request(addr: SocketAddr) -> Request<Empty<Bytes>> {
    Request::get(format!("http://{addr}/"))
        .body(Empty::new())
        .unwrap()
}

/// The answer to a refused request: 429 with `Retry-After` in whole seconds, rounded up.
async fn too_many_requests(err: BoxError) -> Response {
    match err.downcast_ref::<RateLimited>() {
        Some(refused) => (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, refused.retry_after_secs().to_string())],
        )
            .into_response(),
        None => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response(),
    }
}

/// An app whose one route answers 200 and records when each request reached it.
fn counting_app(arrivals: &Arc<Mutex<Vec<Instant>>>) -> Router {
    let arrivals = arrivals.clone();
    Router::new().route(
        "/",
        get(move || {
            arrivals.lock().unwrap().push(Instant::now());
            async { "ok" }
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_through_the_layer_gets_no_429_and_uses_the_limit() {
    const RATE: u64 = 1_000;
    const REQUESTS: u64 = 1_500;
    const TASKS: u64 = 30;
    // The server's hidden limit: 1,000/s, enforced by paced on the server side with a burst
    // of 200, which absorbs up to 190 ms of scheduling jitter between client and server.
    let server_quota = RateLimiter::new(Rate::per_second(RATE), 200);
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(too_many_requests))
            .layer(RateLimitLayer::new(&server_quota).enforcing()),
    );
    let addr = serve(app).await;

    // The client: the server's rate, a burst of 10, thirty tasks each with its own clone.
    let quota = RateLimiter::new(Rate::per_second(RATE), 10);
    let client = ServiceBuilder::new()
        .layer(RateLimitLayer::new(&quota))
        .service(client_from(None));
    let start = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for _ in 0..REQUESTS / TASKS {
                    if start.elapsed() > Duration::from_secs(20) {
                        break; // a bound on the loop; the assertions below then fail
                    }
                    let response = client.clone().oneshot(get_request(addr)).await.unwrap();
                    statuses.push(response.status());
                }
                statuses
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.extend(task.await.unwrap());
    }
    let elapsed = start.elapsed();
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count() as u64;
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    let used = (REQUESTS - 10) as f64 / elapsed.as_secs_f64() / RATE as f64;
    println!(
        "{REQUESTS} requests in {elapsed:?}: {ok} × 200, {refused} × 429, {:.1} % of the limit",
        used * 100.0
    );
    assert_eq!(refused, 0);
    assert_eq!(ok, REQUESTS);
    // Never above the limit: 1,490 requests beyond the burst take at least 1.49 s.
    assert!(elapsed >= Duration::from_millis((REQUESTS - 10) * 1_000 / RATE));
    // And close to it, generously for a loaded machine.
    assert!(used > 0.5, "only {:.1} % of the limit used", used * 100.0);
}

/// Sixty-four tasks each build their service from one layer (as every clone of a `Router`
/// does) and make `PER_TASK` requests: returns when each reached the server, from `start`.
async fn from_64_tasks<L>(
    layer: L,
    addr: SocketAddr,
    arrivals: &Arc<Mutex<Vec<Instant>>>,
) -> Vec<Duration>
where
    L: Layer<HttpClient> + Clone + Send + 'static,
    L::Service:
        Service<Request<Empty<Bytes>>, Response = Response<hyper::body::Incoming>> + Send + 'static,
    <L::Service as Service<Request<Empty<Bytes>>>>::Future: Send,
    <L::Service as Service<Request<Empty<Bytes>>>>::Error: std::fmt::Debug,
{
    const PER_TASK: usize = 3;
    let client = client_from(None);
    arrivals.lock().unwrap().clear();
    let start = Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let mut service = layer.layer(client.clone());
            tokio::spawn(async move {
                for _ in 0..PER_TASK {
                    let response = service.ready().await.unwrap().call(get_request(addr));
                    assert_eq!(response.await.unwrap().status(), StatusCode::OK);
                }
            })
        })
        .collect();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("bounded")
            .unwrap();
    }
    let mut seen: Vec<Duration> = arrivals
        .lock()
        .unwrap()
        .iter()
        .map(|t| *t - start)
        .collect();
    seen.sort();
    assert_eq!(seen.len(), 64 * PER_TASK);
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_clones_tower_gives_each_its_own_limit_paced_keeps_one() {
    // axum #2634 / tower #794: the limit is meant for the whole client, 200/s with 10 at once.
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let addr = serve(counting_app(&arrivals)).await;
    let within_limit = |seen: &[Duration]| {
        // Arrivals come after grants, so this can only fail if more was granted.
        seen.iter()
            .enumerate()
            .all(|(i, at)| (i as f64) < 10.0 + 200.0 * at.as_secs_f64())
    };

    // tower's `RateLimit`: each service built from the layer has its own window.
    let tower_layer = tower::limit::RateLimitLayer::new(2, Duration::from_millis(10));
    let seen = from_64_tasks(tower_layer, addr, &arrivals).await;
    println!("tower: 192 requests in {:?}", seen[191]);
    assert!(
        !within_limit(&seen),
        "tower's limit held across 64 services: {:?} for 192 requests",
        seen[191]
    );

    // paced's: every service holds the same quota.
    let quota = RateLimiter::new(Rate::per_second(200), 10);
    let seen = from_64_tasks(RateLimitLayer::new(&quota), addr, &arrivals).await;
    println!("paced: 192 requests in {:?}", seen[191]);
    assert!(within_limit(&seen));
    // 182 beyond the burst at 200/s: at least 0.91 s; generously at most 3 s.
    assert!(seen[191] >= Duration::from_millis(910));
    assert!(seen[191] < Duration::from_secs(3), "{:?}", seen[191]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_axum_app_answers_429_with_retry_after_per_client_ip() {
    // Each client IP: 2 requests at once, then one per second.
    let per_ip = KeyedRateLimiter::new(Rate::per_second(1), 2);
    let client_ip = |req: &Request<axum::body::Body>| {
        req.extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(peer)| peer.ip())
    };
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(too_many_requests))
            .layer(RateLimitLayer::keyed(&per_ip, client_ip).enforcing()),
    );
    let addr = serve(app).await;
    let alice = client_from(Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1))));
    let bob = client_from(Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))));
    let status = |client: &HttpClient| {
        let call = client.request(get_request(addr));
        async move {
            let response = call.await.unwrap();
            let retry_after = response
                .headers()
                .get(header::RETRY_AFTER)
                .map(|v| v.to_str().unwrap().to_owned());
            (response.status().as_u16(), retry_after)
        }
    };

    assert_eq!(status(&alice).await, (200, None));
    assert_eq!(status(&alice).await, (200, None));
    // Over the limit: the next token comes 1 s after the first request, rounded up to 1 s.
    assert_eq!(status(&alice).await, (429, Some("1".to_owned())));
    let told = Instant::now();
    assert_eq!(
        per_ip.stats().rejected,
        1,
        "refused requests are charged nothing"
    );
    // Another client has its own bucket.
    assert_eq!(status(&bob).await, (200, None));
    // Waiting as told is enough.
    tokio::time::sleep_until((told + Duration::from_secs(1)).into()).await;
    assert_eq!(status(&alice).await, (200, None));
    assert_eq!(status(&alice).await.0, 429);
}

/// The tokens an answer used, as the test's model reports them (`x-usage-tokens`).
fn usage_from(response: &Response<hyper::body::Incoming>) -> u64 {
    response.headers()["x-usage-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// A request to the test's model, estimating `estimate` tokens (`x-estimate-tokens`).
fn completion(addr: SocketAddr, estimate: u64) -> Request<Empty<Bytes>> {
    Request::get(format!("http://{addr}/complete"))
        .header("x-estimate-tokens", estimate)
        .body(Empty::new())
        .unwrap()
}

fn estimate(request: &Request<Empty<Bytes>>) -> u64 {
    request.headers()["x-estimate-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_llm_client_settles_each_call_from_the_usage_the_server_reports() {
    // The model answers every call having used 100 tokens, whatever was estimated.
    let app = Router::new().route(
        "/complete",
        get(|| async { ([("x-usage-tokens", "100")], "a completion") }),
    );
    let addr = serve(app).await;

    // 1,000 tokens and 10 requests at once, refilled so slowly that the test sees no refill.
    let llm = RateLimiter::builder(["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_hour(1), 10))
        .limit("tokens", Limit::bucket(Rate::per_hour(1), 1_000))
        .build()
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(&llm)
                .cost(|req: &Request<Empty<Bytes>>| [1, estimate(req)])
                .settle(|response: &Response<hyper::body::Incoming>| [1, usage_from(response)]),
        )
        .service(client_from(None));
    let start = Instant::now();
    // Estimates of 400 tokens each: without settling, the third would wait an hour.
    for _ in 0..5 {
        let call = client.clone().oneshot(completion(addr, 400));
        let response = tokio::time::timeout(Duration::from_secs(5), call)
            .await
            .expect("a call waited: the settle did not give the unused tokens back")
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    assert!(start.elapsed() < Duration::from_secs(5));
    // Each call kept what it used: 5 requests and 5 × 100 tokens.
    assert_eq!(llm.available(), [5, 500]);
    // A call the layer cannot admit waits: the bucket holds 500 and this one estimates 600.
    let waiting = client.clone().oneshot(completion(addr, 600));
    assert!(tokio::time::timeout(Duration::from_millis(200), waiting)
        .await
        .is_err());
}

/// A request to the test's model for `tenant` (`x-tenant`), estimating `estimate` tokens.
fn tenant_completion(addr: SocketAddr, tenant: &str, estimate: u64) -> Request<Empty<Bytes>> {
    let mut request = completion(addr, estimate);
    request
        .headers_mut()
        .insert("x-tenant", tenant.parse().unwrap());
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_llm_client_settles_each_tenants_calls_from_the_usage_the_server_reports() {
    // The model answers every call having used 100 tokens, whatever was estimated.
    let app = Router::new().route(
        "/complete",
        get(|| async { ([("x-usage-tokens", "100")], "a completion") }),
    );
    let addr = serve(app).await;

    // Each tenant: 1,000 tokens and 10 requests at once, refilled so slowly that the test sees
    // no refill.
    let tenants = KeyedRateLimiter::builder(["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_hour(1), 10))
        .limit("tokens", Limit::bucket(Rate::per_hour(1), 1_000))
        .build()
        .unwrap();
    let client = ServiceBuilder::new()
        .layer(
            RateLimitLayer::keyed(&tenants, |req: &Request<Empty<Bytes>>| {
                req.headers()["x-tenant"].to_str().unwrap().to_owned()
            })
            .cost(|req: &Request<Empty<Bytes>>| [1, estimate(req)])
            .settle(|response: &Response<hyper::body::Incoming>| [1, usage_from(response)]),
        )
        .service(client_from(None));
    let start = Instant::now();
    // Estimates of 400 tokens each: without settling, acme's third would wait an hour.
    for _ in 0..5 {
        let call = client.clone().oneshot(tenant_completion(addr, "acme", 400));
        let response = tokio::time::timeout(Duration::from_secs(5), call)
            .await
            .expect("a call waited: the settle did not give the unused tokens back")
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    assert!(start.elapsed() < Duration::from_secs(5));
    // Each call kept what it used, on acme's limits only: 5 requests and 5 × 100 tokens.
    assert_eq!(tenants.available("acme"), [5, 500]);
    assert_eq!(tenants.available("globex"), [10, 1_000]);
    // A call acme's limits cannot admit waits (they hold 500, this one estimates 600) ...
    let waiting = client.clone().oneshot(tenant_completion(addr, "acme", 600));
    assert!(tokio::time::timeout(Duration::from_millis(200), waiting)
        .await
        .is_err());
    // ... while globex, untouched by acme's calls and settles, goes at once.
    let call = client.oneshot(tenant_completion(addr, "globex", 1_000));
    let response = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("globex waited on acme's limits")
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(tenants.available("globex"), [9, 900]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_llm_server_enforces_requests_and_tokens_per_client_estimate() {
    // The server charges each call its announced estimate on both limits: a request and its
    // tokens; the third call finds the tokens short and is answered 429.
    let llm = RateLimiter::builder(["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_hour(1), 10))
        .limit("tokens", Limit::bucket(Rate::per_hour(1), 1_000))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/complete", get(|| async { "a completion" }))
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(too_many_requests))
                .layer(
                    RateLimitLayer::new(&llm)
                        .cost(|req: &Request<axum::body::Body>| {
                            [
                                1,
                                req.headers()["x-estimate-tokens"]
                                    .to_str()
                                    .unwrap()
                                    .parse()
                                    .unwrap(),
                            ]
                        })
                        .enforcing(),
                ),
        );
    let addr = serve(app).await;
    let client = client_from(None);
    let mut statuses = Vec::new();
    for estimate in [400, 400, 400, 200] {
        let response = tokio::time::timeout(
            Duration::from_secs(5),
            client.request(completion(addr, estimate)),
        )
        .await
        .unwrap()
        .unwrap();
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429, 200]);
    assert_eq!(llm.available(), [7, 0]);
}
