//! `throttle_by_key` and the keyed tower layer over a `RedisKeyedRateLimiter`, against a
//! real, private `redis-server` that each test starts on a free loopback port: the per-key
//! bound and order of a stream, a broken key's items held (counted, logged) without holding up
//! the others, and a keyed enforcing layer answering `429` from a real axum server. Real time:
//! Redis does not run on tokio's paused clock; every wait is bounded.
#![cfg(feature = "redis")]

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use paced::limiter::KeyedLimiter;
use paced::{PaceExt, Rate, RedisKeyedRateLimiter};

#[macro_use]
#[path = "../../tests/common/flavors.rs"]
mod flavors;
#[path = "../../tests/common/redis_server.rs"]
mod redis_server;
use redis_server::{check_bound, Server};

/// A plain connection to `server`, to break or repair keys behind the limiter's back.
fn admin(server: &Server) -> redis::Connection {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

fn limiter(server: &Server, prefix: &str, rate: Rate, burst: u64) -> RedisKeyedRateLimiter<String> {
    RedisKeyedRateLimiter::builder(server.url(), prefix, rate, burst)
        .build()
        .unwrap()
}

/// Drains a `throttle_by_key` stream over `quota` of `items` (key, sequence number), each
/// with the epoch nanoseconds at which it came out.
async fn paced<Q: KeyedLimiter<Key = String, Cost = u64>>(
    quota: Q,
    items: Vec<(String, u32)>,
) -> Vec<((String, u32), u128)> {
    futures_util::stream::iter(items)
        .throttle_by_key(&quota, |m| m.0.clone(), |_| 1, 64)
        .map(|m| (m, epoch_nanos()))
        .collect()
        .await
}

fn epoch_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Interleaved items of `keys`, `per_key` each, numbered per key.
fn interleaved(keys: &[&str], per_key: u32) -> Vec<(String, u32)> {
    (0..per_key)
        .flat_map(|n| keys.iter().map(move |k| (k.to_string(), n)))
        .collect()
}

async fn two_streams_on_two_instances_keep_each_keys_bound_and_order() {
    let server = Server::start();
    // Two processes' worth: two limiters, two connections, one Redis.
    let one = limiter(&server, "streams", Rate::per_second(20), 2);
    let two = limiter(&server, "streams", Rate::per_second(20), 2);
    one.set_limit("fast", Rate::per_second(100), 5)
        .await
        .unwrap();
    let keys = ["a", "b", "fast"];
    let start = Instant::now();
    let (out_one, out_two) = tokio::time::timeout(
        Duration::from_secs(10),
        futures_util::future::join(
            paced(one.clone(), interleaved(&keys, 12)),
            paced(two.clone(), interleaved(&keys, 12)),
        ),
    )
    .await
    .expect("bounded");
    let took = start.elapsed();
    for out in [&out_one, &out_two] {
        assert_eq!(out.len(), 36, "lost or duplicated");
        for key in keys {
            // Each stream's items of one key leave in upstream order.
            let order: Vec<u32> = out
                .iter()
                .filter(|o| o.0 .0 == key)
                .map(|o| o.0 .1)
                .collect();
            assert_eq!(order, (0..12).collect::<Vec<_>>(), "key {key}");
        }
    }
    for (key, rate, burst) in [("a", 20.0, 2), ("b", 20.0, 2), ("fast", 100.0, 5)] {
        let mut times: Vec<u128> = out_one
            .iter()
            .chain(&out_two)
            .filter(|o| o.0 .0 == key)
            .map(|o| o.1)
            .collect();
        times.sort_unstable();
        // An item comes out after its grant, late by a round trip, a timer tick and the
        // scheduler: 30 ms of slack, as one round trip in the multi-process tests.
        let windows: Vec<(u128, u128)> = times.iter().map(|&t| (t - 30_000_000, t)).collect();
        check_bound(&windows, rate, burst).unwrap_or_else(|e| panic!("key {key}: {e}"));
    }
    // 24 items of "a" and "b" at 20/s, 2 at once: at least 1.1 s, and not much more.
    assert!(took >= Duration::from_millis(1_100), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    // One request per key at a time: about one round trip per item.
    let stats = one.stats();
    assert_eq!(stats.granted, 36, "{stats:?}");
    assert!(stats.round_trips <= 40, "{stats:?}");
    assert_eq!(
        stats.keys, 0,
        "nothing held once the stream is done: {stats:?}"
    );
}

/// Counts error-level events, to see that a reply error is logged.
#[cfg(feature = "tracing")]
struct CountErrors(std::sync::Arc<std::sync::atomic::AtomicUsize>);

#[cfg(feature = "tracing")]
impl tracing::Subscriber for CountErrors {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() == tracing::Level::ERROR {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

// Current thread: the stream polls the Redis requests on this thread, where the counting
// subscriber is installed.
#[tokio::test(flavor = "current_thread")]
async fn a_broken_key_holds_its_own_items_loudly_and_no_others() {
    let server = Server::start();
    let mut conn = admin(&server);
    redis::cmd("HSET")
        .arg("{broken:bad}")
        .arg("field")
        .arg("value")
        .exec(&mut conn)
        .unwrap();
    #[cfg(feature = "tracing")]
    let errors = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    #[cfg(feature = "tracing")]
    let _guard = tracing::subscriber::set_default(CountErrors(errors.clone()));
    let quota = limiter(&server, "broken", Rate::per_second(100), 10);
    let repair = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1_200));
        redis::cmd("DEL")
            .arg("{broken:bad}")
            .exec(&mut conn)
            .unwrap();
    });
    let start = Instant::now();
    let items = vec![
        ("bad".to_string(), 0),
        ("good".to_string(), 0),
        ("bad".to_string(), 1),
        ("good".to_string(), 1),
        ("good".to_string(), 2),
    ];
    let out: Vec<((String, u32), Duration)> = tokio::time::timeout(
        Duration::from_secs(10),
        futures_util::stream::iter(items)
            .throttle_by_key(&quota, |m| m.0.clone(), |_| 1, 8)
            .map(|m| (m, start.elapsed()))
            .collect(),
    )
    .await
    .expect("the stream goes on once the key is repaired");
    repair.join().unwrap();
    let order: Vec<(&str, u32)> = out.iter().map(|o| (o.0 .0.as_str(), o.0 .1)).collect();
    // The good key did not wait for the broken one; the broken key's items were held, in
    // order, and none was let through before the repair.
    assert_eq!(
        order,
        [
            ("good", 0),
            ("good", 1),
            ("good", 2),
            ("bad", 0),
            ("bad", 1)
        ],
        "{out:?}"
    );
    assert!(out[2].1 < Duration::from_millis(500), "{out:?}");
    assert!(out[3].1 >= Duration::from_millis(1_200), "{out:?}");
    // Asked again at 0.1, 0.3, 0.7 and 1.5 s: the fourth retry finds it repaired.
    assert!(out[4].1 < Duration::from_millis(2_000), "{out:?}");
    let stats = quota.stats();
    assert!(
        (3..=5).contains(&stats.reply_errors),
        "each failure counted, at a bounded backoff, not a spin: {stats:?}"
    );
    assert_eq!(
        (stats.errors, stats.fallback),
        (0, 0),
        "not an outage: {stats:?}"
    );
    assert_eq!(stats.granted, 5, "{stats:?}");
    #[cfg(feature = "tracing")]
    assert_eq!(
        errors.load(std::sync::atomic::Ordering::Relaxed) as u64,
        stats.reply_errors,
        "each reply error logged at error level"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_gives_its_reservations_back() {
    let server = Server::start();
    let quota = limiter(&server, "dropped", Rate::per_second(1), 1);
    // Four items of one key: the first leaves, the second reserves a token 1 s out.
    let mut stream = Box::pin(
        futures_util::stream::iter(["k"; 4].map(String::from)).throttle_by_key(
            &quota,
            |k| k.clone(),
            |_| 1,
            8,
        ),
    );
    assert_eq!(stream.next().await.as_deref(), Some("k"));
    assert!(
        tokio::time::timeout(Duration::from_millis(100), stream.next())
            .await
            .is_err(),
        "the second item waits"
    );
    drop(stream);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(quota.stats().keys, 0);
    // The dropped reservation was given back: the next token is the first one's refill,
    // about 850 ms away (1.85 s had the reservation stood).
    let start = Instant::now();
    quota.acquire("k", 1).await.unwrap();
    let took = start.elapsed();
    assert!(took < Duration::from_millis(1_300), "{took:?}");
}

/// The keyed tower layer over Redis: an axum server enforcing per-tenant quotas kept in
/// Redis, and a hyper client.
#[cfg(feature = "tower")]
mod tower_layer {
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};

    use axum::error_handling::HandleErrorLayer;
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
    use paced::Rate;
    use tower::{ServiceBuilder, ServiceExt};

    use super::{admin, limiter, Server};

    type HttpClient = Client<HttpConnector, Empty<Bytes>>;

    async fn serve(app: Router) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        addr
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

    fn tenant(req: &Request<axum::body::Body>) -> String {
        req.headers()
            .get("x-tenant")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("anonymous")
            .to_owned()
    }

    /// Status and `Retry-After` of one request as `tenant`.
    async fn call(client: &HttpClient, addr: SocketAddr, tenant: &str) -> (u16, Option<String>) {
        let request = Request::get(format!("http://{addr}/"))
            .header("x-tenant", tenant)
            .body(Empty::new())
            .unwrap();
        let response = client.request(request).await.unwrap();
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_owned());
        (response.status().as_u16(), retry_after)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_axum_app_answers_429_per_tenant_from_redis() {
        let server = Server::start();
        // Every tenant: 2 requests at once, then one per second; "big" has 5 at once.
        let quota = limiter(&server, "http", Rate::per_second(1), 2);
        quota
            .set_limit("big", Rate::per_second(1), 5)
            .await
            .unwrap();
        // A second server instance (another process of the fleet) on the same quotas.
        let other = limiter(&server, "http", Rate::per_second(1), 2);
        let app = |quota| {
            Router::new().route("/", get(|| async { "ok" })).layer(
                ServiceBuilder::new()
                    .layer(HandleErrorLayer::new(too_many_requests))
                    .layer(RateLimitLayer::keyed(&quota, tenant).enforcing()),
            )
        };
        let one = serve(app(quota.clone())).await;
        let two = serve(app(other.clone())).await;
        let client = Client::builder(TokioExecutor::new()).build(HttpConnector::new());

        assert_eq!(call(&client, one, "alice").await, (200, None));
        assert_eq!(call(&client, two, "alice").await, (200, None));
        // Over the limit on either instance: the next token comes 1 s after the first.
        let told = Instant::now();
        assert_eq!(
            call(&client, one, "alice").await,
            (429, Some("1".to_owned()))
        );
        assert_eq!(
            call(&client, two, "alice").await,
            (429, Some("1".to_owned()))
        );
        // Another tenant has its own bucket, and "big" its own limit.
        assert_eq!(call(&client, one, "bob").await, (200, None));
        for _ in 0..5 {
            assert_eq!(call(&client, two, "big").await.0, 200);
        }
        assert_eq!(call(&client, one, "big").await.0, 429);
        // Refused requests were charged nothing, and waiting as told is enough.
        assert_eq!((quota.stats().granted, quota.stats().rejected), (2, 2));
        tokio::time::sleep_until((told + Duration::from_secs(1)).into()).await;
        assert_eq!(call(&client, one, "alice").await, (200, None));
        assert_eq!(call(&client, two, "alice").await.0, 429);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_broken_tenant_key_is_refused_not_let_through() {
        let server = Server::start();
        let mut conn = admin(&server);
        redis::cmd("SET")
            .arg("{broken-http:mallory}")
            .arg("hello")
            .exec(&mut conn)
            .unwrap();
        let quota = limiter(&server, "broken-http", Rate::per_second(10), 5);
        let app = Router::new().route("/", get(|| async { "ok" })).layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(too_many_requests))
                .layer(RateLimitLayer::keyed(&quota, tenant).enforcing()),
        );
        let addr = serve(app).await;
        let client = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        assert_eq!(
            call(&client, addr, "mallory").await,
            (429, Some("1".to_owned()))
        );
        assert_eq!(call(&client, addr, "alice").await, (200, None));
        let stats = quota.stats();
        assert_eq!(stats.reply_errors, 1, "{stats:?}");
        assert_eq!((stats.errors, stats.granted), (0, 1), "{stats:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_shaping_client_waits_per_key_on_redis() {
        let server = Server::start();
        let quota = limiter(&server, "client", Rate::per_second(10), 1);
        let api = ServiceBuilder::new()
            .layer(RateLimitLayer::keyed(&quota, |req: &(String, u32)| {
                req.0.clone()
            }))
            .service_fn(
                |req: (String, u32)| async move { Ok::<_, std::convert::Infallible>(req.1) },
            );
        let start = Instant::now();
        let calls: Vec<_> = [("a", 0), ("a", 1), ("a", 2), ("b", 3)]
            .into_iter()
            .map(|(key, n)| {
                let api = api.clone();
                tokio::spawn(async move {
                    let n = api.oneshot((key.to_owned(), n)).await.unwrap();
                    (n, start.elapsed())
                })
            })
            .collect();
        let mut done = Vec::new();
        for call in calls {
            done.push(
                tokio::time::timeout(Duration::from_secs(5), call)
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        done.sort_by_key(|d| d.1);
        // "b" did not wait for "a"; "a" got one call per 100 ms.
        let b = done.iter().find(|d| d.0 == 3).unwrap();
        assert!(b.1 < Duration::from_millis(80), "{done:?}");
        let last = done.iter().map(|d| d.1).max().unwrap();
        assert!(last >= Duration::from_millis(190), "{done:?}");
        assert!(last < Duration::from_millis(400), "{done:?}");
        assert_eq!(quota.stats().granted, 4);
    }

    #[cfg(feature = "http")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_announcing_layer_over_redis_sends_retry_after_only() {
        use paced::tower::QuotaHeaders;

        let server = Server::start();
        let quota = limiter(&server, "announce", Rate::per_second(1), 1);
        let app = Router::new().route("/", get(|| async { "ok" })).layer(
            RateLimitLayer::keyed(&quota, tenant)
                .enforcing()
                .headers(QuotaHeaders::Both),
        );
        let addr = serve(app).await;
        let client: HttpClient = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        let request = || {
            Request::get(format!("http://{addr}/"))
                .header("x-tenant", "t")
                .body(Empty::new())
                .unwrap()
        };
        let ok = client.request(request()).await.unwrap();
        assert_eq!(ok.status(), 200);
        assert!(!ok.headers().contains_key("ratelimit"));
        let refused = client.request(request()).await.unwrap();
        assert_eq!(refused.status(), 429);
        assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
        assert!(!refused.headers().contains_key("x-ratelimit-remaining"));
    }
}

on_every_flavor!(two_streams_on_two_instances_keep_each_keys_bound_and_order,);
