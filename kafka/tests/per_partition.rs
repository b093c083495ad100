//! A stream per partition against a real broker: a backlog on one partition holds up no other,
//! each partition keeps its bound at the sink, and so does the global bound: both are charged
//! at the instant of delivery.

mod common;

use std::time::Duration;

use common::{check_bound, needed_slack_us, of_partition, temp_path, wait_for, TICK_US};
use paced::{Limit, Rate};
use paced_kafka::pipeline::{consume, now_micros, produce, read_sink, subscribe, FileSink, Limits};
use paced_kafka::Broker;

const BACKLOG: usize = 10_000;
const FRESH: usize = 30;
const RATE: u64 = 50;
const BURST: u64 = 5;
const GLOBAL_RATE: u64 = 80;
const GLOBAL_BURST: u64 = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_holds_up_no_other_partition() {
    let Some(broker) = Broker::for_test() else {
        return;
    };
    let brokers = broker.address();
    broker.create_topic("hol", 4).unwrap();
    let started = std::time::Instant::now();
    let b = brokers.clone();
    tokio::task::spawn_blocking(move || produce(&b, "hol", 0, BACKLOG))
        .await
        .unwrap();
    eprintln!(
        "produced the backlog of {BACKLOG} in {:?}",
        started.elapsed()
    );

    let path = temp_path("hol");
    let sink = FileSink::open(&path, "one").unwrap();
    // Four partitions and the topic.
    let limits: Limits<5> = Limits::new(
        Limit::bucket(Rate::per_second(RATE), BURST),
        Limit::bucket(Rate::per_second(GLOBAL_RATE), GLOBAL_BURST),
    );
    let consumer = subscribe(&brokers, "hol-group", "hol");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();

    // The driver, on a thread of its own: it waits for the consumer to deliver, produces the
    // fresh messages while the backlog is far from drained, waits for them, and stops it.
    let driver = {
        let (path, brokers) = (path.clone(), brokers.clone());
        std::thread::spawn(move || {
            let joined = std::time::Instant::now();
            wait_for(&path, Duration::from_secs(30), "the first delivery", |a| {
                !a.is_empty()
            });
            eprintln!("first delivery {:?} after subscribing", joined.elapsed());
            std::thread::sleep(Duration::from_secs(1));
            // When each fresh partition's producing began.
            let fresh_from: Vec<u64> = (1..4)
                .map(|partition| {
                    let from = now_micros();
                    produce(&brokers, "hol", partition, FRESH);
                    from
                })
                .collect();
            wait_for(&path, Duration::from_secs(30), "every fresh message", |a| {
                a.iter().filter(|a| a.partition != 0).count() >= 3 * FRESH
            });
            std::thread::sleep(Duration::from_millis(500));
            let _ = stop.send(());
            fresh_from
        })
    };
    let stopped = async move {
        let _ = stopped.await;
    };
    consume(consumer, "hol", &limits, &sink, stopped).await;
    let fresh_from = driver.join().unwrap();

    let arrivals = read_sink(&path);
    let _ = std::fs::remove_file(&path);
    // Each partition: its own bound at the sink, in every window; every message once, in order.
    for partition in 0..4 {
        let of = of_partition(&arrivals, partition);
        let micros: Vec<u64> = of.iter().map(|a| a.micros).collect();
        check_bound(&micros, RATE as f64, BURST as f64, TICK_US)
            .unwrap_or_else(|e| panic!("partition {partition}: {e}"));
        eprintln!(
            "partition {partition}: tightest window needs {} µs of slack",
            needed_slack_us(&micros, RATE as f64, BURST as f64)
        );
        let offsets: Vec<i64> = of.iter().map(|a| a.offset).collect();
        assert_eq!(
            offsets,
            (0..of.len() as i64).collect::<Vec<_>>(),
            "partition {partition}"
        );
    }
    // The global bound, with the same slack: no item held after its grant.
    let micros: Vec<u64> = arrivals.iter().map(|a| a.micros).collect();
    check_bound(&micros, GLOBAL_RATE as f64, GLOBAL_BURST as f64, TICK_US)
        .unwrap_or_else(|e| panic!("global: {e}"));
    eprintln!(
        "global: tightest window needs {} µs of slack",
        needed_slack_us(&micros, GLOBAL_RATE as f64, GLOBAL_BURST as f64),
    );

    // The fresh partitions left at their share of the global rate, not behind the backlog.
    let backlog = of_partition(&arrivals, 0).len();
    let share = GLOBAL_RATE as f64 / 4.0;
    let allowed_s = FRESH as f64 / share + 1.0;
    let behind_backlog_s = (BACKLOG - backlog) as f64 / GLOBAL_RATE as f64;
    for partition in 1..4 {
        let of = of_partition(&arrivals, partition);
        assert_eq!(of.len(), FRESH, "partition {partition}");
        let from = fresh_from[partition as usize - 1];
        let first = (of[0].micros - from) as f64 / 1e6;
        let last = (of[FRESH - 1].micros - from) as f64 / 1e6;
        eprintln!(
            "partition {partition}: first fresh message {first:.3} s, last {last:.3} s after \
             its producing began (allowed {allowed_s:.2} s; behind the backlog: \
             {behind_backlog_s:.0} s)"
        );
        assert!(
            last <= allowed_s,
            "partition {partition}: last fresh message after {last:.3} s"
        );
    }
    assert!(
        backlog < BACKLOG / 10,
        "the backlog drained too far to prove anything: {backlog}"
    );
    let span = |of: &[paced_kafka::pipeline::Arrival]| {
        (of[of.len() - 1].micros - of[0].micros) as f64 / 1e6
    };
    let of0 = of_partition(&arrivals, 0);
    eprintln!(
        "backlog partition: {} delivered in {:.2} s ({:.1}/s, bound {RATE}/s); all: {} in {:.2} s",
        of0.len(),
        span(&of0),
        (of0.len() - 1) as f64 / span(&of0),
        arrivals.len(),
        span(&{
            let mut a = arrivals.clone();
            a.sort_by_key(|a| a.micros);
            a
        }),
    );
}
