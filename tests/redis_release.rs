//! Every Redis limiter releases a process's grants of one key at the instants Redis charged
//! them, in Redis's order, on every runtime flavor: a current-thread runtime and multi-thread
//! runtimes of 2 and 8 workers. Also: tokens given back while grants wait never let a later
//! request go at a waiting grant's instant, and a cost above a bucket's burst is never granted
//! without waiting. Against a private `redis-server`, in real time (Redis keeps its own clock).
#![cfg(feature = "redis")]

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use paced::redis::{RedisKeyedRateLimiter, TryAcquireError};
use paced::{Limit, Rate, RedisRateLimiter};

#[allow(dead_code)]
#[path = "common/redis_server.rs"]
mod redis_server;
use redis_server::Server;

/// 4,000 tokens a second, 1,500 at once: six costs of 1,000 from a full bucket are charged at
/// 0, 125, 375, 625, 875 and 1,125 ms.
const RATE: u64 = 4_000;
const BURST: u64 = 1_500;
const COST: u64 = 1_000;
const CHARGED_MS: [u64; 6] = [0, 125, 375, 625, 875, 1_125];
/// How late a release may be: the round trip, tokio's 1 ms tick, and a busy machine's
/// scheduling, all far below the 125 ms between two charges.
const LATE: Duration = Duration::from_millis(40);

fn runtime(workers: usize) -> tokio::runtime::Runtime {
    let mut builder = if workers == 0 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(workers);
        b
    };
    builder.enable_all().build().unwrap()
}

/// Six tasks on one handle, spawned one after another with a yield between them, each
/// acquiring `COST` once: when each was released, sorted, counted from before the first.
async fn six_releases<F, Fut>(acquire: F) -> Vec<Duration>
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let released = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CHARGED_MS.len() {
        let (acquire, released) = (acquire.clone(), released.clone());
        tasks.push(tokio::spawn(async move {
            acquire().await;
            released.lock().unwrap().push(start.elapsed());
        }));
        tokio::task::yield_now().await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut released = released.lock().unwrap().clone();
    released.sort();
    released
}

/// The k-th release comes at the k-th charge's instant: never earlier, at most `LATE` after.
fn assert_at_charges(what: &str, workers: usize, released: &[Duration]) {
    let ok = released.iter().zip(CHARGED_MS).all(|(&at, ms)| {
        let charged = Duration::from_millis(ms);
        at + Duration::from_millis(2) >= charged && at <= charged + LATE
    });
    assert!(
        ok,
        "{what} on {workers} workers: released at {released:?}, charged at {CHARGED_MS:?} ms"
    );
}

/// Runs `scenario` on every flavor, three rounds each (a fresh key per round).
fn on_every_flavor<F, Fut>(what: &str, scenario: F)
where
    F: Fn(String, usize) -> Fut,
    Fut: Future<Output = Vec<Duration>>,
{
    let server = Server::start();
    for workers in [0, 2, 8] {
        for round in 0..3 {
            let released = runtime(workers).block_on(scenario(server.url(), round));
            println!("{what}, {workers} workers: released at {released:?}");
            assert_at_charges(what, workers, &released);
        }
    }
}

#[test]
fn one_limit_releases_at_the_charged_instants() {
    on_every_flavor("RedisRateLimiter", |url, round| async move {
        let quota =
            RedisRateLimiter::builder(url, format!("one-{round}"), Rate::per_second(RATE), BURST)
                .build()
                .unwrap();
        six_releases(move || {
            let quota = quota.clone();
            async move { quota.acquire(COST).await.unwrap() }
        })
        .await
    });
}

#[test]
fn one_limit_with_leases_releases_at_the_charged_instants() {
    on_every_flavor("RedisRateLimiter with leases", |url, round| async move {
        let quota =
            RedisRateLimiter::builder(url, format!("lease-{round}"), Rate::per_second(RATE), BURST)
                .lease(10, Duration::from_millis(50))
                .build()
                .unwrap();
        six_releases(move || {
            let quota = quota.clone();
            async move { quota.acquire(COST).await.unwrap() }
        })
        .await
    });
}

#[test]
fn keyed_releases_at_the_charged_instants() {
    on_every_flavor("RedisKeyedRateLimiter", |url, round| async move {
        let quota: RedisKeyedRateLimiter<String> = RedisKeyedRateLimiter::builder(
            url,
            format!("keyed-{round}"),
            Rate::per_second(RATE),
            BURST,
        )
        .build()
        .unwrap();
        six_releases(move || {
            let quota = quota.clone();
            async move { quota.acquire("tenant", COST).await.unwrap() }
        })
        .await
    });
}

fn tokens_limit() -> Limit {
    Limit::bucket(Rate::per_second(RATE), BURST)
}

#[test]
fn several_limits_release_at_the_charged_instants() {
    on_every_flavor("RedisRateLimiter<[u64; 1]>", |url, round| async move {
        let quota = RedisRateLimiter::dimensions(&url, format!("multi-{round}"), ["tokens"])
            .limit("tokens", tokens_limit())
            .build()
            .unwrap();
        six_releases(move || {
            let quota = quota.clone();
            async move {
                quota.acquire([COST]).await.unwrap();
            }
        })
        .await
    });
}

#[test]
fn several_limits_with_leases_release_at_the_charged_instants() {
    on_every_flavor(
        "RedisRateLimiter<[u64; 1]> with leases",
        |url, round| async move {
            let quota =
                RedisRateLimiter::dimensions(&url, format!("multi-lease-{round}"), ["tokens"])
                    .limit("tokens", tokens_limit())
                    .lease([10], Duration::from_millis(50))
                    .build()
                    .unwrap();
            six_releases(move || {
                let quota = quota.clone();
                async move {
                    quota.acquire([COST]).await.unwrap();
                }
            })
            .await
        },
    );
}

#[test]
fn keyed_several_limits_release_at_the_charged_instants() {
    on_every_flavor(
        "RedisKeyedRateLimiter<String, [u64; 1]>",
        |url, round| async move {
            let quota: RedisKeyedRateLimiter<String, [u64; 1]> =
                RedisKeyedRateLimiter::dimensions(&url, format!("keyed-multi-{round}"), ["tokens"])
                    .limit("tokens", tokens_limit())
                    .build()
                    .unwrap();
            six_releases(move || {
                let quota = quota.clone();
                async move {
                    quota.acquire("tenant", [COST]).await.unwrap();
                }
            })
            .await
        },
    );
}

/// A refund while a reservation waits: a takes 1,500 at 0; b reserves 1,000 (due at 250 ms); at 100 ms a
/// settles to 500; c then asks for 1,000. c must not go at b's instant: b's 1,000 and c's
/// together would be 2,000 at once on a burst of 1,500. With the refund held back to b's
/// instant and capped at what the bucket holds beside b (500), c goes at 375 ms.
#[test]
fn a_refund_while_a_reservation_waits_does_not_bunch_requests() {
    let server = Server::start();
    for workers in [0, 2, 8] {
        runtime(workers).block_on(async {
            let quota = RedisRateLimiter::dimensions(
                &server.url(),
                format!("refund-{workers}"),
                ["tokens"],
            )
            .limit("tokens", tokens_limit())
            .build()
            .unwrap();
            let start = Instant::now();
            let a = quota.acquire([1_500]).await.unwrap();
            let b = tokio::spawn({
                let quota = quota.clone();
                async move {
                    quota.acquire([1_000]).await.unwrap();
                    start.elapsed()
                }
            });
            tokio::time::sleep_until((start + Duration::from_millis(100)).into()).await;
            a.settle([500]).await.unwrap();
            quota.acquire([1_000]).await.unwrap();
            let c = start.elapsed();
            let b = b.await.unwrap();
            println!("{workers} workers: b at {b:?}, c at {c:?}");
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            assert!(
                (250.0..290.0).contains(&ms(b)),
                "{workers} workers: b at {b:?}"
            );
            // Every window [b, c] holds at most burst + rate × its length: 2,000 ≤ 1,500 +
            // 4 × (c - b) ms.
            assert!(
                ms(c) - ms(b) >= 125.0 - 2.0,
                "{workers} workers: b at {b:?}, c at {c:?}: 2,000 tokens within {:?}",
                c - b
            );
            assert!(ms(c) < 375.0 + 40.0, "{workers} workers: c at {c:?}");
        });
    }
}

/// The one-limit limiter: a reservation dropped while another waits behind it gives back
/// nothing that would let a new request go at the waiting one's instant.
#[test]
fn a_dropped_reservation_before_another_does_not_bunch_requests() {
    let server = Server::start();
    for workers in [0, 2, 8] {
        runtime(workers).block_on(async {
            let quota = RedisRateLimiter::builder(
                server.url(),
                format!("dropped-{workers}"),
                Rate::per_second(RATE),
                BURST,
            )
            .build()
            .unwrap();
            let start = Instant::now();
            quota.acquire(1_500).await.unwrap();
            // b: due at 250 ms, dropped at 50 ms; d: due at 500 ms, kept.
            let b = tokio::time::timeout(Duration::from_millis(50), quota.acquire(1_000));
            let d = tokio::spawn({
                let quota = quota.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    quota.acquire(1_000).await.unwrap();
                    start.elapsed()
                }
            });
            assert!(b.await.is_err());
            tokio::time::sleep(Duration::from_millis(20)).await;
            // c: must not go at d's instant.
            quota.acquire(1_000).await.unwrap();
            let c = start.elapsed();
            let d = d.await.unwrap();
            println!("{workers} workers: d at {d:?}, c at {c:?}");
            let gap = c.abs_diff(d);
            assert!(
                gap >= Duration::from_millis(123),
                "{workers} workers: d at {d:?}, c at {c:?}: 2,000 tokens within {gap:?}"
            );
        });
    }
}

/// A cost above a bucket's burst is never granted without waiting, on every Redis limiter:
/// `is_never` from `try_acquire` and `acquire_timeout`.
#[test]
fn a_cost_above_a_burst_is_never_on_every_redis_limiter() {
    let server = Server::start();
    runtime(2).block_on(async {
        let url = server.url();
        let never = |e: TryAcquireError| matches!(e, TryAcquireError::NotUntil(n) if n.is_never());
        let long = Duration::from_secs(3_600);

        let multi = RedisRateLimiter::dimensions(&url, "never-multi", ["requests", "tokens"])
            .limit("requests", Limit::bucket(Rate::per_second(80), 8))
            .limit("tokens", tokens_limit())
            .build()
            .unwrap();
        for cost in [[1, 1_501], [9, 0]] {
            let refused = multi.try_acquire(cost).await.unwrap_err();
            assert!(never(refused), "try_acquire({cost:?})");
            let refused = multi.acquire_timeout(cost, long).await.unwrap_err();
            assert!(never(refused), "acquire_timeout({cost:?})");
        }
        // Nothing was charged: a cost within every burst goes at once.
        assert!(multi.try_acquire([8, 1_500]).await.is_ok());

        let keyed: RedisKeyedRateLimiter<String, [u64; 2]> =
            RedisKeyedRateLimiter::dimensions(&url, "never-keyed-multi", ["requests", "tokens"])
                .limit("requests", Limit::bucket(Rate::per_second(80), 8))
                .limit("tokens", tokens_limit())
                .build()
                .unwrap();
        for cost in [[1, 1_501], [9, 0]] {
            assert!(never(keyed.try_acquire("k", cost).await.unwrap_err()));
            assert!(never(
                keyed.acquire_timeout("k", cost, long).await.unwrap_err()
            ));
        }

        let one =
            RedisRateLimiter::builder(url.clone(), "never-one", Rate::per_second(RATE), BURST)
                .build()
                .unwrap();
        assert!(never(one.try_acquire(1_501).await.unwrap_err()));
        assert!(never(one.acquire_timeout(1_501, long).await.unwrap_err()));
        assert!(one.try_acquire(1_500).await.is_ok());

        let keyed_one: RedisKeyedRateLimiter<String> =
            RedisKeyedRateLimiter::builder(url, "never-keyed", Rate::per_second(RATE), BURST)
                .build()
                .unwrap();
        assert!(never(keyed_one.try_acquire("k", 1_501).await.unwrap_err()));
        assert!(never(
            keyed_one
                .acquire_timeout("k", 1_501, long)
                .await
                .unwrap_err()
        ));
    });
}

/// A loopback address where nothing listens: every round trip fails at once.
fn nowhere() -> String {
    let port = redis_server::free_port();
    format!("redis://127.0.0.1:{port}/")
}

/// Fail-open, a waiter whose cost the fallback takes longer than its second in charge to
/// refill keeps its place on the fallback and is granted as debt, as in process: at 100/s,
/// burst 10, share 0.5 the fallback holds 5 and refills at 50/s, so 100 tokens take 1.9 s.
#[test]
fn fail_open_grants_a_cost_dearer_than_a_second_of_the_fallback() {
    use paced::redis::FailurePolicy;
    let open = FailurePolicy::FailOpen { share: 0.5 };
    for workers in [0, 2] {
        runtime(workers).block_on(async {
            let one = RedisRateLimiter::builder(nowhere(), "dear", Rate::per_second(100), 10)
                .failure_policy(open)
                .build()
                .unwrap();
            let start = Instant::now();
            tokio::time::timeout(Duration::from_secs(5), one.acquire(100))
                .await
                .expect("granted by the fallback within 5 s")
                .unwrap();
            let took = start.elapsed();
            assert!(
                took >= Duration::from_millis(1_850) && took < Duration::from_millis(3_000),
                "{workers} workers: {took:?}"
            );
            let multi = RedisRateLimiter::dimensions(&nowhere(), "dear", ["tokens"])
                .limit("tokens", Limit::bucket(Rate::per_second(100), 10))
                .failure_policy(open)
                .build()
                .unwrap();
            let start = Instant::now();
            tokio::time::timeout(Duration::from_secs(5), multi.acquire([100]))
                .await
                .expect("granted by the fallback within 5 s")
                .unwrap();
            let took = start.elapsed();
            assert!(
                took >= Duration::from_millis(1_850) && took < Duration::from_millis(3_000),
                "{workers} workers: {took:?}"
            );
        });
    }
}
