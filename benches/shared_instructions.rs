//! A fixed number of calls on one shared limiter whose limit never binds, to count
//! instructions per call with callgrind (noise-free on a loaded machine). Run it twice with
//! different counts and divide the difference of the totals by the difference of the counts:
//!
//! ```sh
//! cargo bench -p paced-benches --bench shared_instructions --no-run
//! B=$(ls -t target/release/deps/shared_instructions-* | grep -v '\.d$' | head -1)
//! for n in 100000 200000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null $B try $n 2>&1 | grep refs
//! done
//! ```
//!
//! Cases (first argument): `clock` (one read of tokio's clock), `try` (`RateLimiter::
//! try_acquire(1)`), `acquire` (`acquire(1).await` on a current-thread runtime, never
//! waiting), `throttle_with` (items of `stream::iter` through `throttle_with(.., Shaping)`),
//! `two_limits` (`try_acquire([1, 1])` on a `RateLimiter<[u64; 2]>` of two buckets). The
//! buckets of those stay full (a rate of 10^9/s refills each grant before the next); in
//! `try_draining` and `two_limits_draining` (the same grants at 1/s, burst 10^9) every grant
//! leaves its bucket emptier, so the check weighs the level against the cost. Second argument:
//! calls.

use std::hint::black_box;

use futures_util::StreamExt;
use paced::{Limit, PaceExt, Rate, RateLimiter, Shaping};

const RATE: Rate = Rate::per_second(1_000_000_000);
const BURST: u64 = u64::MAX / 2;

#[inline(never)]
fn clock(n: u64) {
    for _ in 0..n {
        black_box(tokio::time::Instant::now());
    }
}

#[inline(never)]
fn try_acquire(n: u64) {
    let limiter = RateLimiter::new(RATE, BURST);
    let granted = (0..n)
        .filter(|_| limiter.try_acquire(black_box(1)).is_ok())
        .count();
    assert_eq!(granted as u64, n);
}

#[inline(never)]
fn acquire(rt: &tokio::runtime::Runtime, n: u64) {
    let limiter = RateLimiter::new(RATE, BURST);
    rt.block_on(async {
        for _ in 0..n {
            limiter.acquire(black_box(1)).await;
        }
    });
    assert_eq!(limiter.stats().granted, n);
}

#[inline(never)]
fn throttle_with(rt: &tokio::runtime::Runtime, n: u64) {
    let limiter = RateLimiter::new(RATE, BURST);
    let items = rt.block_on(
        futures_util::stream::iter(0..n)
            .throttle_with(&limiter, |_| 1, Shaping)
            .count(),
    );
    assert_eq!(items as u64, n);
}

#[inline(never)]
fn two_limits(n: u64) {
    let limiter: RateLimiter<[u64; 2]> = RateLimiter::builder(["requests", "tokens"])
        .limit("requests", Limit::bucket(RATE, BURST))
        .limit("tokens", Limit::bucket(RATE, BURST))
        .build()
        .expect("valid limits");
    let granted = (0..n)
        .filter(|_| limiter.try_acquire(black_box([1, 1])).is_ok())
        .count();
    assert_eq!(granted as u64, n);
}

/// A rate that never refills a bucket within the run, and a burst that outlasts it.
const SLOW: Rate = Rate::per_second(1);
const DEEP: u64 = 1_000_000_000;

#[inline(never)]
fn try_draining(n: u64) {
    let limiter = RateLimiter::new(SLOW, DEEP);
    let granted = (0..n)
        .filter(|_| limiter.try_acquire(black_box(1)).is_ok())
        .count();
    assert_eq!(granted as u64, n);
}

#[inline(never)]
fn two_limits_draining(n: u64) {
    let limiter: RateLimiter<[u64; 2]> = RateLimiter::builder(["requests", "tokens"])
        .limit("requests", Limit::bucket(SLOW, DEEP))
        .limit("tokens", Limit::bucket(SLOW, DEEP))
        .build()
        .expect("valid limits");
    let granted = (0..n)
        .filter(|_| limiter.try_acquire(black_box([1, 1])).is_ok())
        .count();
    assert_eq!(granted as u64, n);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let case = args.get(1).map_or("try", String::as_str);
    let n: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    // Inside the runtime, as paced reads its clock in use.
    let _guard = rt.enter();
    match case {
        "clock" => clock(n),
        "try" => try_acquire(n),
        "acquire" => acquire(&rt, n),
        "throttle_with" => throttle_with(&rt, n),
        "two_limits" => two_limits(n),
        "try_draining" => try_draining(n),
        "two_limits_draining" => two_limits_draining(n),
        other => panic!("unknown case {other}"),
    }
}
