//! The `metrics` feature: exact counts on the facade for known schedules, under paused time,
//! with a thread-local debugging recorder.
#![cfg(feature = "metrics")]

use std::time::Duration;

use std::sync::Arc;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::registry::{AtomicStorage, Registry};
use paced::{Adaptive, KeyedRateLimiter, Limit, Rate, RateLimiter, Stagger};
use tokio::time::{sleep, timeout, Instant};

/// A recorder whose values are read without being reset (the debugging recorder's snapshot
/// resets counters and gauges, which a gauge moved by increments cannot survive).
#[derive(Clone)]
struct Reader(Arc<Registry<Key, AtomicStorage>>);

impl Recorder for Reader {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.0
            .get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.0
            .get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.0
            .get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
    }
}

fn labelled(key: &Key, limiter: &str) -> bool {
    key.labels()
        .any(|l| l.key() == "limiter" && l.value() == limiter)
}

impl Reader {
    fn counter(&self, limiter: &str, name: &str) -> u64 {
        self.0
            .get_counter_handles()
            .into_iter()
            .find(|(k, _)| k.name() == name && labelled(k, limiter))
            .map(|(_, c)| c.load(std::sync::atomic::Ordering::SeqCst))
            .unwrap_or_else(|| panic!("no counter {name} for {limiter}"))
    }

    fn gauge(&self, limiter: &str, name: &str) -> f64 {
        self.0
            .get_gauge_handles()
            .into_iter()
            .find(|(k, _)| k.name() == name && labelled(k, limiter))
            .map(|(_, g)| f64::from_bits(g.load(std::sync::atomic::Ordering::SeqCst)))
            .unwrap_or_else(|| panic!("no gauge {name} for {limiter}"))
    }

    /// The values recorded, sorted.
    fn histogram(&self, limiter: &str, name: &str) -> Vec<f64> {
        let mut values = self
            .0
            .get_histogram_handles()
            .into_iter()
            .find(|(k, _)| k.name() == name && labelled(k, limiter))
            .map(|(_, h)| h.data())
            .unwrap_or_else(|| panic!("no histogram {name} for {limiter}"));
        values.sort_by(f64::total_cmp);
        values
    }

    /// How many metrics carry the label `limiter`.
    fn count(&self, limiter: &str) -> usize {
        let r = &self.0;
        r.get_counter_handles()
            .keys()
            .filter(|k| labelled(k, limiter))
            .count()
            + r.get_gauge_handles()
                .keys()
                .filter(|k| labelled(k, limiter))
                .count()
            + r.get_histogram_handles()
                .keys()
                .filter(|k| labelled(k, limiter))
                .count()
    }
}

fn assert_close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn five_acquires_at_burst_two_and_ten_per_second() {
    let recorder = Reader(Arc::new(Registry::atomic()));
    let _guard = metrics::set_default_local_recorder(&recorder);
    let limiter = RateLimiter::new(Rate::per_second(10), 2).with_metrics("api");

    let start = Instant::now();
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.acquire(1).await })
        })
        .collect();
    sleep(Duration::from_millis(50)).await;
    let name = "api";
    assert_eq!(recorder.counter(name, "paced_grants_total"), 2);
    assert_eq!(recorder.gauge(name, "paced_waiters"), 3.0);
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(start.elapsed(), Duration::from_millis(300));

    let name = "api";
    assert_eq!(recorder.counter(name, "paced_grants_total"), 5);
    assert_eq!(recorder.counter(name, "paced_tokens_granted_total"), 5);
    assert_eq!(recorder.counter(name, "paced_refusals_total"), 0);
    assert_eq!(recorder.counter(name, "paced_cancellations_total"), 0);
    assert_eq!(recorder.gauge(name, "paced_waiters"), 0.0);
    let waits = recorder.histogram(name, "paced_wait_seconds");
    assert_close(&waits, &[0.0, 0.0, 0.1, 0.2, 0.3]);
}

#[tokio::test(start_paused = true)]
async fn the_wait_histogram_has_one_value_per_grant() {
    let recorder = Reader(Arc::new(Registry::atomic()));
    let _guard = metrics::set_default_local_recorder(&recorder);
    let limiter = RateLimiter::new(Rate::per_second(10), 2).with_metrics("api");
    let all = (0..5).map(|_| limiter.acquire(1));
    futures_util::future::join_all(all).await;
    let name = "api";
    let waits = recorder.histogram(name, "paced_wait_seconds");
    assert_close(&waits, &[0.0, 0.0, 0.1, 0.2, 0.3]);
    assert_eq!(recorder.counter(name, "paced_tokens_granted_total"), 5);
    assert_eq!(limiter.stats().total_wait, Duration::from_millis(600));
}

#[tokio::test(start_paused = true)]
async fn refusals_and_tokens() {
    let recorder = Reader(Arc::new(Registry::atomic()));
    let _guard = metrics::set_default_local_recorder(&recorder);
    let limiter = RateLimiter::new(Rate::per_second(10), 4).with_metrics("api");
    limiter.try_acquire(3).unwrap(); // lock-free
    limiter.try_acquire(3).unwrap_err(); // lock-free refusal
    limiter.try_acquire(0).unwrap();
    limiter.try_acquire(9).unwrap_err(); // more than the burst
    limiter
        .acquire_timeout(1, Duration::from_millis(10))
        .await
        .unwrap();
    limiter
        .acquire_timeout(2, Duration::from_millis(10))
        .await
        .unwrap_err();
    let name = "api";
    assert_eq!(recorder.counter(name, "paced_grants_total"), 3);
    assert_eq!(recorder.counter(name, "paced_tokens_granted_total"), 4);
    assert_eq!(recorder.counter(name, "paced_refusals_total"), 3);
    let stats = limiter.stats();
    assert_eq!((stats.granted, stats.rejected), (3, 3));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_is_a_cancellation() {
    let recorder = Reader(Arc::new(Registry::atomic()));
    let _guard = metrics::set_default_local_recorder(&recorder);
    let limiter = RateLimiter::new(Rate::per_second(1), 1).with_metrics("api");
    limiter.try_acquire(1).unwrap();
    timeout(Duration::from_millis(10), limiter.acquire(1))
        .await
        .unwrap_err();
    let name = "api";
    assert_eq!(recorder.counter(name, "paced_cancellations_total"), 1);
    assert_eq!(recorder.counter(name, "paced_grants_total"), 1);
    assert_eq!(recorder.gauge(name, "paced_waiters"), 0.0);
    // The place given back, the next request is granted as if nobody had waited.
    limiter.acquire(1).await;
    let name = "api";
    assert_eq!(recorder.counter(name, "paced_grants_total"), 2);
    assert_eq!(recorder.counter(name, "paced_cancellations_total"), 1);
}

#[tokio::test(start_paused = true)]
async fn every_clone_records_and_the_last_name_wins() {
    let recorder = Reader(Arc::new(Registry::atomic()));
    let _guard = metrics::set_default_local_recorder(&recorder);
    let limiter = RateLimiter::new(Rate::per_second(10), 10);
    let before = limiter.clone();
    let limiter = limiter.with_metrics("first");
    before.try_acquire(1).unwrap();
    limiter.try_acquire(1).unwrap();
    assert_eq!(recorder.counter("first", "paced_grants_total"), 2);
    // Named again on another handle: every handle records under the new name from now on.
    let _ = before.clone().with_metrics("second");
    before.try_acquire(1).unwrap();
    limiter.try_acquire(1).unwrap();
    limiter.try_acquire(100).unwrap_err();
    assert_eq!(recorder.counter("first", "paced_grants_total"), 2);
    assert_eq!(recorder.counter("first", "paced_refusals_total"), 0);
    assert_eq!(recorder.counter("second", "paced_grants_total"), 2);
    assert_eq!(recorder.counter("second", "paced_refusals_total"), 1);
    // Four counters, a gauge and a histogram.
    assert_eq!(recorder.count("second"), 6);
}

#[tokio::test(start_paused = true)]
async fn renamed_while_requests_wait_the_waiters_move_to_the_new_name() {
    let recorder = Reader(Arc::new(Registry::atomic()));
    let _guard = metrics::set_default_local_recorder(&recorder);
    let limiter = RateLimiter::new(Rate::per_second(10), 1).with_metrics("old");
    limiter.try_acquire(1).unwrap();
    let waiting = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire(1).await })
    };
    sleep(Duration::from_millis(10)).await;
    assert_eq!(recorder.gauge("old", "paced_waiters"), 1.0);
    let limiter = limiter.with_metrics("new");
    assert_eq!(recorder.gauge("old", "paced_waiters"), 0.0);
    assert_eq!(recorder.gauge("new", "paced_waiters"), 1.0);
    waiting.await.unwrap();
    assert_eq!(recorder.gauge("new", "paced_waiters"), 0.0);
    assert_eq!(recorder.gauge("old", "paced_waiters"), 0.0);
    assert_eq!(recorder.counter("new", "paced_grants_total"), 1);
    assert_eq!(recorder.counter("old", "paced_grants_total"), 1);
    drop(limiter);
}

#[tokio::test(start_paused = true)]
async fn keyed_stagger_and_adaptive_take_the_last_name_too() {
    let recorder = Reader(Arc::new(Registry::atomic()));
    let _guard = metrics::set_default_local_recorder(&recorder);
    let keyed = KeyedRateLimiter::<u8>::new(Rate::per_second(10), 10)
        .with_metrics("k1")
        .with_metrics("k2");
    keyed.try_acquire(&1, 1).unwrap();
    assert_eq!(recorder.counter("k2", "paced_grants_total"), 1);
    assert_eq!(recorder.counter("k1", "paced_grants_total"), 0);

    let stagger = Stagger::new(5, Duration::from_secs(1))
        .with_metrics("s1")
        .with_metrics("s2");
    stagger.try_acquire().unwrap();
    assert_eq!(recorder.counter("s2", "paced_grants_total"), 1);
    assert_eq!(recorder.counter("s1", "paced_grants_total"), 0);

    let limiter = RateLimiter::new(Rate::per_second(10), 1);
    let adaptive = Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(10))
        .with_metrics("a1")
        .with_metrics("a2");
    adaptive.limiter().try_acquire(1).unwrap();
    adaptive.on_throttled(None);
    assert_eq!(recorder.counter("a2", "paced_adaptive_decreases_total"), 1);
    assert_eq!(recorder.counter("a1", "paced_adaptive_decreases_total"), 0);
    assert_eq!(recorder.counter("a2", "paced_grants_total"), 1);
    assert_eq!(recorder.counter("a1", "paced_grants_total"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_name_given_while_requests_wait_counts_them() {
    let recorder = Reader(Arc::new(Registry::atomic()));
    let _guard = metrics::set_default_local_recorder(&recorder);
    let limiter = RateLimiter::new(Rate::per_second(10), 1);
    limiter.try_acquire(1).unwrap();
    let waiting = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire(1).await })
    };
    sleep(Duration::from_millis(10)).await;
    let limiter = limiter.with_metrics("late");
    assert_eq!(recorder.gauge("late", "paced_waiters"), 1.0);
    waiting.await.unwrap();
    let name = "late";
    assert_eq!(recorder.gauge(name, "paced_waiters"), 0.0);
    assert_eq!(recorder.counter(name, "paced_grants_total"), 1);
    assert_close(&recorder.histogram(name, "paced_wait_seconds"), &[0.1]);
    drop(limiter);
}

#[tokio::test(start_paused = true)]
async fn a_limiter_without_a_name_records_nothing() {
    let recorder = Reader(Arc::new(Registry::atomic()));
    let _guard = metrics::set_default_local_recorder(&recorder);
    let limiter = RateLimiter::new(Rate::per_second(10), 1);
    limiter.try_acquire(1).unwrap();
    limiter.try_acquire(1).unwrap_err();
    assert_eq!(recorder.0.get_counter_handles().len(), 0);
    assert_eq!(recorder.0.get_histogram_handles().len(), 0);
}

#[tokio::test(start_paused = true)]
async fn keyed_counts_over_all_keys() {
    let recorder = Reader(Arc::new(Registry::atomic()));
    let _guard = metrics::set_default_local_recorder(&recorder);
    let limiter = KeyedRateLimiter::new(Rate::per_second(10), 1).with_metrics("tenants");
    limiter.try_acquire("a", 1).unwrap();
    limiter.try_acquire("a", 1).unwrap_err();
    limiter.try_acquire("b", 1).unwrap();
    let tasks: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|key| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.acquire(key, 1).await })
        })
        .collect();
    sleep(Duration::from_millis(50)).await;
    assert_eq!(recorder.gauge("tenants", "paced_waiters"), 2.0);
    for task in tasks {
        task.await.unwrap();
    }
    timeout(Duration::from_millis(10), limiter.acquire("a", 1))
        .await
        .unwrap_err();
    let name = "tenants";
    assert_eq!(recorder.counter(name, "paced_grants_total"), 4);
    assert_eq!(recorder.counter(name, "paced_tokens_granted_total"), 4);
    assert_eq!(recorder.counter(name, "paced_refusals_total"), 1);
    assert_eq!(recorder.counter(name, "paced_cancellations_total"), 1);
    assert_eq!(recorder.gauge(name, "paced_waiters"), 0.0);
    let waits = recorder.histogram(name, "paced_wait_seconds");
    assert_close(&waits, &[0.0, 0.0, 0.1, 0.1]);
}

#[tokio::test(start_paused = true)]
async fn stagger_counts_starts() {
    let recorder = Reader(Arc::new(Registry::atomic()));
    let _guard = metrics::set_default_local_recorder(&recorder);
    let stagger = Stagger::new(1, Duration::from_secs(1)).with_metrics("starts");
    stagger.acquire().await;
    stagger.try_acquire().unwrap_err();
    stagger.acquire().await;
    let name = "starts";
    assert_eq!(recorder.counter(name, "paced_grants_total"), 2);
    assert_eq!(recorder.counter(name, "paced_refusals_total"), 1);
    assert_close(&recorder.histogram(name, "paced_wait_seconds"), &[0.0, 1.0]);
}

#[tokio::test(start_paused = true)]
async fn adaptive_rate_and_decreases() {
    let recorder = Reader(Arc::new(Registry::atomic()));
    let _guard = metrics::set_default_local_recorder(&recorder);
    let limiter = RateLimiter::new(Rate::per_second(10), 1);
    let adaptive =
        Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(10)).with_metrics("partner");
    let name = "partner";
    assert_eq!(recorder.gauge(name, "paced_adaptive_rate"), 10.0);
    assert_eq!(recorder.counter(name, "paced_adaptive_decreases_total"), 0);

    adaptive.limiter().acquire(1).await;
    adaptive.on_throttled(None);
    adaptive.on_throttled(None);
    let name = "partner";
    let rate = adaptive.rate();
    let per_second = rate.tokens() as f64 / rate.per().as_secs_f64();
    assert!(per_second < 10.0);
    assert!((recorder.gauge(name, "paced_adaptive_rate") - per_second).abs() < 1e-9);
    assert_eq!(
        recorder.counter(name, "paced_adaptive_decreases_total"),
        adaptive.stats().decreases
    );
    assert!(adaptive.stats().decreases >= 1);
    // The limiter is named too.
    assert_eq!(recorder.counter(name, "paced_grants_total"), 1);
}

/// The gauge of the rate the controller set moves on every kind of report: `on_quota` too.
#[tokio::test(start_paused = true)]
async fn adaptive_rate_gauge_follows_every_report() {
    let recorder = Reader(Arc::new(Registry::atomic()));
    let _guard = metrics::set_default_local_recorder(&recorder);
    let limiter = RateLimiter::new(Rate::per_second(100), 10);
    let adaptive =
        Adaptive::new(limiter, Rate::per_second(1), Rate::per_second(100)).with_metrics("quota");
    let gauge = || recorder.gauge("quota", "paced_adaptive_rate");
    let rate = |a: &Adaptive| {
        let r = a.rate();
        r.tokens() as f64 / r.per().as_secs_f64()
    };
    assert_eq!(gauge(), 100.0);

    // A token bucket of 600 per 60 s: its refill rate, 10/s.
    let window = Duration::from_secs(60);
    adaptive.on_quota(paced::limiter::Announced::new(0, window).with_policy(600, window));
    assert_eq!(adaptive.rate(), Rate::per_second(10));
    assert_eq!(gauge(), 10.0);

    // A fixed window: 199 left after this call, 20 s to go: 10/s again, then 40 left: 2/s.
    adaptive.on_quota(paced::limiter::Announced::new(39, Duration::from_secs(20)));
    assert_eq!(gauge(), rate(&adaptive));
    assert_eq!(gauge(), 2.0);

    sleep(Duration::from_secs(3)).await; // past the hold: successes probe again
    adaptive.on_throttled(None);
    assert_eq!(gauge(), rate(&adaptive));
    for _ in 0..50 {
        sleep(Duration::from_millis(100)).await;
        adaptive.on_success();
        assert_eq!(gauge(), rate(&adaptive));
    }
}

#[tokio::test(start_paused = true)]
async fn a_multi_limiter_records_as_a_rate_limiter_does_and_the_last_name_wins() {
    let recorder = Reader(Arc::new(Registry::atomic()));
    let _guard = metrics::set_default_local_recorder(&recorder);
    let limiter: RateLimiter<[u64; 2]> = RateLimiter::builder(["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_second(10), 2))
        .limit("tokens", Limit::bucket(Rate::per_second(100), 100))
        .build()
        .unwrap()
        .with_metrics("old");
    let limiter = limiter.with_metrics("llm");
    limiter.try_acquire([1, 40]).unwrap();
    limiter.try_acquire([1, 70]).unwrap_err(); // tokens refuse
    let waiter = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.acquire([1, 70]).await }
    });
    sleep(Duration::from_millis(1)).await;
    assert_eq!(recorder.gauge("llm", "paced_waiters"), 1.0);
    let dropped = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.acquire([1, 1]).await }
    });
    sleep(Duration::from_millis(1)).await;
    dropped.abort();
    let _ = dropped.await;
    timeout(Duration::from_secs(1), waiter)
        .await
        .unwrap()
        .unwrap();
    let name = "llm";
    assert_eq!(recorder.counter(name, "paced_grants_total"), 2);
    // A grant's cost summed over the dimensions.
    assert_eq!(
        recorder.counter(name, "paced_tokens_granted_total"),
        41 + 71
    );
    assert_eq!(recorder.counter(name, "paced_refusals_total"), 1);
    assert_eq!(recorder.counter(name, "paced_cancellations_total"), 1);
    assert_eq!(recorder.gauge(name, "paced_waiters"), 0.0);
    assert_close(&recorder.histogram(name, "paced_wait_seconds"), &[0.0, 0.1]);
    assert_eq!(recorder.count("old"), 6);
    assert_eq!(recorder.counter("old", "paced_grants_total"), 0);
}

/// `Adaptive<[u64; N]>`: one `paced_adaptive_rate` gauge and one decreases counter per adapted
/// limit, told apart by the label `limit` (the limit's index).
#[tokio::test(start_paused = true)]
async fn adaptive_multi_rate_and_decreases_per_limit() {
    use paced::{Adaptive, Limit, RateLimiter};

    let recorder = Reader(Arc::new(Registry::atomic()));
    let _guard = metrics::set_default_local_recorder(&recorder);
    let of = |key: &Key, limit: &str| {
        labelled(key, "llm")
            && key
                .labels()
                .any(|l| l.key() == "limit" && l.value() == limit)
    };
    let gauge = |limit: &str| {
        recorder
            .0
            .get_gauge_handles()
            .into_iter()
            .find(|(k, _)| k.name() == "paced_adaptive_rate" && of(k, limit))
            .map(|(_, g)| f64::from_bits(g.load(std::sync::atomic::Ordering::SeqCst)))
            .unwrap()
    };
    let decreases = |limit: &str| {
        recorder
            .0
            .get_counter_handles()
            .into_iter()
            .find(|(k, _)| k.name() == "paced_adaptive_decreases_total" && of(k, limit))
            .map(|(_, c)| c.load(std::sync::atomic::Ordering::SeqCst))
            .unwrap()
    };
    let limiter = RateLimiter::builder(["requests", "tokens"])
        .limit("requests", Limit::bucket(Rate::per_second(10), 10))
        .limit("tokens", Limit::bucket(Rate::per_second(1_000), 1_000))
        .build()
        .unwrap();
    let adaptive = Adaptive::builder(limiter)
        .adapt(0, Rate::per_second(1), Rate::per_second(10))
        .adapt(1, Rate::per_second(10), Rate::per_second(1_000))
        .build()
        .unwrap()
        .with_metrics("llm");
    assert_eq!((gauge("0"), gauge("1")), (10.0, 1_000.0));
    adaptive.acquire([1, 100]).await;
    adaptive.on_throttled_limit(1, None);
    assert_eq!((gauge("0"), gauge("1")), (10.0, 800.0));
    assert_eq!((decreases("0"), decreases("1")), (0, 1));
    assert_eq!(recorder.counter("llm", "paced_grants_total"), 1);
}
