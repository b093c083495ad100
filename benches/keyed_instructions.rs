//! A fixed number of keyed calls, to count instructions per call with callgrind (noise-free on
//! a loaded machine, where wall-clock figures move by ±10 %). Run it twice with different
//! counts and divide the difference of the totals by the difference of the counts:
//!
//! ```sh
//! cargo bench -p paced-benches --bench keyed_instructions --no-run
//! B=$(ls -t target/release/deps/keyed_instructions-* | grep -v '\.d$' | head -1)
//! for n in 100000 200000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null $B paced_try 10 $n 2>&1 | grep refs
//! done
//! ```
//!
//! Cases (first argument): `paced_try` / `governor_check` (`try_acquire(&key, 1)` /
//! `check_key(&key)` cycling over `KEYS` `u64` keys, slow refill: an existing key),
//! `paced_acquire` / `governor_until_ready` (`acquire(&key, 1).await` / `until_key_ready(&key).await` on a current-thread runtime, never waiting), `tokio_clock` / `quanta_clock` (one clock read), `throttle` / `throttle_by_key` (items of
//! `stream::iter` through `throttle(.., Shaping)` / `throttle_by_key` with 4 keys, drained on a
//! current-thread runtime), `mutex` / `rwlock_cas` (one word changed
//! under a shard's `Mutex`, or by compare-and-swap under its `RwLock`'s read lock: the two
//! lock designs alone), `contended_paced` / `contended_governor` (two threads calling
//! `try_acquire` / `check_key` over 1,000 keys, printing wall and CPU ns per call: not for
//! callgrind). Second argument: keys (`paced_try`, `governor_check`); third: calls.

use std::hint::black_box;
use std::num::NonZeroU32;

use futures_util::StreamExt;
use governor::Quota;
use paced::{KeyedRateLimiter, PaceExt, Rate, Shaping};

/// The process's CPU time (user + system) in seconds, from `/proc/self/stat` (100 Hz ticks).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the command.
    (ticks(11) + ticks(12)) / 100.0
}

/// Two threads, `n` calls each over `CONTENDED_KEYS` keys (thread `t` asks key
/// `(t * 7 + i) % CONTENDED_KEYS`), released together: prints wall and CPU nanoseconds per
/// call, the CPU time counting what both threads spent, descheduled time not included.
fn contended(n: u64, attempt: impl Fn(&u64) -> bool + Sync) {
    const CONTENDED_KEYS: u64 = 1_000;
    let barrier = std::sync::Barrier::new(2);
    let (cpu, start) = (cpu_seconds(), std::time::Instant::now());
    let refused: u64 = std::thread::scope(|s| {
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                let (attempt, barrier) = (&attempt, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    (0..n)
                        .map(|i| u64::from(!attempt(black_box(&((t * 7 + i) % CONTENDED_KEYS)))))
                        .sum::<u64>()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap_or(1)).sum()
    });
    let (wall, cpu) = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu);
    assert_eq!(refused, 0);
    #[allow(clippy::cast_precision_loss)]
    let calls = (2 * n) as f64;
    println!(
        "{:.1} ns wall, {:.1} ns CPU per call ({} calls on 2 threads)",
        wall * 1e9 / calls,
        cpu * 1e9 / calls,
        2 * n
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let case = args.get(1).map_or("paced_try", String::as_str);
    let keys: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10);
    let n: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    // Inside the runtime, as paced reads its clock in use.
    let _guard = rt.enter();
    // Each case is a function of its own, never inlined: a change to one case (or to this
    // dispatch) does not move another's code, nor its count.
    match case {
        "paced_try" => paced_try(keys, n),
        "governor_check" => governor_check(keys, n),
        "paced_acquire" => paced_acquire(&rt, keys, n),
        "governor_until_ready" => governor_until_ready(&rt, keys, n),
        "contended_paced" => {
            let limiter = KeyedRateLimiter::<u64>::new(RATE, BURST);
            contended(n, |key| limiter.try_acquire(key, 1).is_ok());
        }
        "contended_governor" => {
            let limiter = governor::RateLimiter::keyed(quota());
            contended(n, |key| limiter.check_key(key).is_ok());
        }
        "contended_mutex" => {
            let shards: Vec<PaddedMutex> = (0..8)
                .map(|_| PaddedMutex(std::sync::Mutex::new(0)))
                .collect();
            contended(n, |key| {
                let shard = &shards[(*key & 7) as usize].0;
                let mut word = shard
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                *word = black_box(*word + 1);
                true
            });
        }
        "contended_rwlock" => {
            use std::sync::atomic::{AtomicU64, Ordering};
            let shards: Vec<PaddedRwLock> = (0..8)
                .map(|_| PaddedRwLock(std::sync::RwLock::new(AtomicU64::new(0))))
                .collect();
            contended(n, |key| {
                let shard = &shards[(*key & 7) as usize].0;
                let word = shard
                    .read()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let old = word.load(Ordering::Acquire);
                let _ = word.compare_exchange(old, old + 1, Ordering::AcqRel, Ordering::Acquire);
                true
            });
        }
        "mutex" => mutex_word(n),
        "rwlock_cas" => rwlock_cas(n),
        "tokio_clock" => tokio_clock(n),
        "quanta_clock" => quanta_clock(n),
        "throttle" => throttle(&rt, n),
        "throttle_by_key" => throttle_by_key(&rt, n),
        other => panic!("unknown case {other}"),
    }
}

/// The slow refill of `keyed.rs`: it never binds.
const RATE: Rate = Rate::per_second(1);
const BURST: u64 = u32::MAX as u64;

fn quota() -> Quota {
    Quota::per_second(NonZeroU32::MIN).allow_burst(NonZeroU32::MAX)
}

#[inline(never)]
fn paced_try(keys: u64, n: u64) {
    let limiter = KeyedRateLimiter::<u64>::new(RATE, BURST);
    for key in 0..keys {
        assert!(limiter.try_acquire(&key, 1).is_ok());
    }
    let mut refused = 0u64;
    for i in 0..n {
        refused += u64::from(limiter.try_acquire(black_box(&(i % keys)), 1).is_err());
    }
    assert_eq!(refused, 0);
}

#[inline(never)]
fn governor_check(keys: u64, n: u64) {
    let limiter = governor::RateLimiter::keyed(quota());
    for key in 0..keys {
        assert!(limiter.check_key(&key).is_ok());
    }
    let mut refused = 0u64;
    for i in 0..n {
        refused += u64::from(limiter.check_key(black_box(&(i % keys))).is_err());
    }
    assert_eq!(refused, 0);
}

#[inline(never)]
fn paced_acquire(rt: &tokio::runtime::Runtime, keys: u64, n: u64) {
    let limiter = KeyedRateLimiter::<u64>::new(RATE, BURST);
    rt.block_on(async {
        for i in 0..n {
            limiter.acquire(black_box(&(i % keys)), 1).await;
        }
    });
    assert_eq!(limiter.stats().rejected, 0);
}

#[inline(never)]
fn governor_until_ready(rt: &tokio::runtime::Runtime, keys: u64, n: u64) {
    let limiter = governor::RateLimiter::keyed(quota());
    rt.block_on(async {
        for i in 0..n {
            limiter.until_key_ready(black_box(&(i % keys))).await;
        }
    });
}

/// A shard's mutex, padded as paced's are.
#[repr(align(128))]
struct PaddedMutex(std::sync::Mutex<u64>);

/// A shard's read-write lock over a word, padded the same.
#[repr(align(128))]
struct PaddedRwLock(std::sync::RwLock<std::sync::atomic::AtomicU64>);

/// The lock of the design in use: a word changed under a shard's mutex (std's, with its
/// poison checks), 8 shards.
#[inline(never)]
fn mutex_word(n: u64) {
    let shards: Vec<PaddedMutex> = (0..8)
        .map(|_| PaddedMutex(std::sync::Mutex::new(0)))
        .collect();
    for i in 0..n {
        let shard = &shards[black_box(i as usize) & 7].0;
        let mut word = shard
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *word = black_box(*word + 1);
    }
}

/// governor's design: a shared read lock on the shard, the word changed by compare-and-swap.
#[inline(never)]
fn rwlock_cas(n: u64) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let shards: Vec<PaddedRwLock> = (0..8)
        .map(|_| PaddedRwLock(std::sync::RwLock::new(AtomicU64::new(0))))
        .collect();
    for i in 0..n {
        let shard = &shards[black_box(i as usize) & 7].0;
        let word = shard
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let old = word.load(Ordering::Acquire);
        let _ = black_box(word.compare_exchange(
            old,
            black_box(old + 1),
            Ordering::AcqRel,
            Ordering::Acquire,
        ));
    }
}

#[inline(never)]
fn tokio_clock(n: u64) {
    for _ in 0..n {
        black_box(tokio::time::Instant::now());
    }
}

#[inline(never)]
fn quanta_clock(n: u64) {
    let clock = quanta::Clock::new();
    for _ in 0..n {
        black_box(clock.now());
    }
}

#[inline(never)]
fn throttle(rt: &tokio::runtime::Runtime, n: u64) {
    rt.block_on(async {
        let s = futures_util::stream::iter(0..n).throttle(RATE, |_| 1, BURST, Shaping);
        assert_eq!(s.fold(0u64, |c, _| async move { c + 1 }).await, n);
    });
}

#[inline(never)]
fn throttle_by_key(rt: &tokio::runtime::Runtime, n: u64) {
    let limiter = KeyedRateLimiter::<u64>::new(RATE, BURST);
    rt.block_on(async {
        let s = futures_util::stream::iter(0..n).throttle_by_key(&limiter, |x| x % 4, |_| 1, 64);
        assert_eq!(s.fold(0u64, |c, _| async move { c + 1 }).await, n);
    });
    assert_eq!(limiter.stats().rejected, 0);
}
