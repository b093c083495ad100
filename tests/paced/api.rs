//! The 1.0 surface: every fallible form of a setter, borrowed keys, the one refusal type, and
//! nothing hidden that can be reached from outside.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher, Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use futures_util::StreamExt;
use paced::stream::RateExceeded;
use paced::{
    Adaptive, ConfigError, Enforcing, KeyedRateLimiter, NotUntil, PaceExt, PaceSinkExt, Rate,
    RateLimiter, Stagger,
};

#[test]
fn every_try_form_refuses_with_a_config_error_and_changes_nothing() {
    let second = Duration::from_secs(1);
    assert_eq!(Rate::try_new(0, second), Err(ConfigError::ZeroTokens));
    assert_eq!(
        Rate::try_new(1, Duration::ZERO),
        Err(ConfigError::ZeroPeriod)
    );
    assert_eq!(
        RateLimiter::try_new(Rate::per_second(1), 0).err(),
        Some(ConfigError::ZeroBurst)
    );
    assert_eq!(
        RateLimiter::try_warming_up(Rate::per_second(1), Duration::ZERO, 3.0).err(),
        Some(ConfigError::ZeroWarmup)
    );
    assert_eq!(
        RateLimiter::try_warming_up(Rate::per_second(1), second, 0.5).err(),
        Some(ConfigError::ColdFactor)
    );
    assert_eq!(
        RateLimiter::try_warming_up(Rate::per_second(1), second, f64::NAN).err(),
        Some(ConfigError::ColdFactor)
    );

    let limiter = RateLimiter::new(Rate::per_second(1), 3);
    assert_eq!(limiter.try_set_burst(0), Err(ConfigError::ZeroBurst));
    assert_eq!(limiter.burst(), Some(3));
    assert_eq!(limiter.try_set_burst(5), Ok(()));
    assert_eq!(limiter.burst(), Some(5));
    let warming = RateLimiter::warming_up(Rate::per_second(1), second, 3.0);
    assert_eq!(warming.try_set_burst(5), Err(ConfigError::NoBurst));
    assert_eq!(warming.try_set_burst(0), Err(ConfigError::ZeroBurst));
    assert_eq!(warming.burst(), None);

    assert_eq!(
        Stagger::try_new(0, second).err(),
        Some(ConfigError::ZeroStarts)
    );
    let stagger = Stagger::try_new(2, second).unwrap();
    assert_eq!(
        stagger.try_set_limit(0, second),
        Err(ConfigError::ZeroStarts)
    );
    assert_eq!(stagger.available(), 2);
    assert_eq!(stagger.try_set_limit(3, second), Ok(()));
    assert_eq!(stagger.available(), 3);

    assert_eq!(
        KeyedRateLimiter::<String>::try_new(Rate::per_second(1), 0).err(),
        Some(ConfigError::ZeroBurst)
    );
    assert_eq!(
        KeyedRateLimiter::<u64, u64, _>::try_with_hasher(
            Rate::per_second(1),
            0,
            RandomState::new()
        )
        .err(),
        Some(ConfigError::ZeroBurst)
    );
    let keyed = KeyedRateLimiter::<String>::new(Rate::per_second(1), 2);
    assert_eq!(
        keyed.try_set_limit("a", Rate::per_second(9), 0),
        Err(ConfigError::ZeroBurst)
    );
    assert_eq!(keyed.available("a"), 2);
    assert_eq!(keyed.try_set_limit("a", Rate::per_second(9), 7), Ok(()));
    assert_eq!(keyed.available("a"), 7);

    let ones = || futures_util::stream::iter([1u32, 2]);
    assert_eq!(
        ones()
            .try_throttle(Rate::per_second(1), |_| 1, 0, Enforcing)
            .err(),
        Some(ConfigError::ZeroBurst)
    );
    assert!(ones()
        .try_throttle(Rate::per_second(1), |_| 1, 1, Enforcing)
        .is_ok());
    assert_eq!(
        ones().try_batched_interval(0, second).err(),
        Some(ConfigError::ZeroBatch)
    );
    assert!(ones().try_batched_interval(1, second).is_ok());
    assert_eq!(
        ones().try_staggered_start(0, second).err(),
        Some(ConfigError::ZeroStarts)
    );
    assert!(ones().try_staggered_start(1, second).is_ok());
    let by_key = KeyedRateLimiter::<u32>::new(Rate::per_second(1), 1);
    assert_eq!(
        ones()
            .try_throttle_by_key(&by_key, |n| *n, |_| 1, 0)
            .err()
            .map(|e| e.to_string()),
        Some(ConfigError::ZeroCapacity.to_string())
    );
    assert!(ones()
        .try_throttle_by_key(&by_key, |n| *n, |_| 1, 1)
        .is_ok());
    assert_eq!(
        Vec::<u32>::new()
            .try_throttle(Rate::per_second(1), |_| 1, 0)
            .err(),
        Some(ConfigError::ZeroBurst)
    );
    assert!(Vec::<u32>::new()
        .try_throttle(Rate::per_second(1), |_| 1, 1)
        .is_ok());

    let adaptive = Adaptive::try_new(
        RateLimiter::new(Rate::per_second(10), 2),
        Rate::per_second(20),
        Rate::per_second(10),
    );
    assert_eq!(adaptive.err(), Some(ConfigError::MinAboveMax));
}

/// The message `f` panics with.
fn message(f: &dyn Fn()) -> String {
    let err = catch_unwind(AssertUnwindSafe(f)).unwrap_err();
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap()
}

#[test]
fn the_panicking_forms_panic_with_the_config_errors_text() {
    let limiter = RateLimiter::new(Rate::per_second(1), 3);
    assert!(message(&|| limiter.set_burst(0)).contains(&ConfigError::ZeroBurst.to_string()));
    let warming = RateLimiter::warming_up(Rate::per_second(1), Duration::from_secs(1), 3.0);
    assert!(message(&|| warming.set_burst(2)).contains(&ConfigError::NoBurst.to_string()));
    let second = Duration::from_secs(1);
    assert!(
        message(&|| drop(Stagger::new(0, second))).contains(&ConfigError::ZeroStarts.to_string())
    );
    let stagger = Stagger::new(1, second);
    assert!(
        message(&|| stagger.set_limit(0, second)).contains(&ConfigError::ZeroStarts.to_string())
    );
    let keyed = KeyedRateLimiter::<u64>::new(Rate::per_second(1), 1);
    assert!(message(&|| keyed.set_limit(&1, Rate::per_second(1), 0))
        .contains(&ConfigError::ZeroBurst.to_string()));
    assert!(message(&|| limiter.set_limit(Rate::per_second(1), 0))
        .contains(&ConfigError::ZeroBurst.to_string()));
    assert!(message(&|| warming.set_limit(Rate::per_second(1), 2))
        .contains(&ConfigError::NoBurst.to_string()));
}

/// Every programmer-error panic says where it came from: `"Type::method: {error}"`.
#[test]
fn panic_messages_name_the_type_and_the_method() {
    let rate = Rate::per_second(1);
    let second = Duration::from_secs(1);
    let zero_burst = ConfigError::ZeroBurst.to_string();
    let cases: Vec<(String, String)> = vec![
        (
            message(&|| drop(RateLimiter::new(rate, 0))),
            format!("RateLimiter::new: {zero_burst}"),
        ),
        (
            message(&|| drop(RateLimiter::warming_up(rate, Duration::ZERO, 3.0))),
            format!("RateLimiter::warming_up: {}", ConfigError::ZeroWarmup),
        ),
        (
            message(&|| RateLimiter::new(rate, 1).set_burst(0)),
            format!("RateLimiter::set_burst: {zero_burst}"),
        ),
        (
            message(&|| RateLimiter::new(rate, 1).set_limit(rate, 0)),
            format!("RateLimiter::set_limit: {zero_burst}"),
        ),
        (
            message(&|| drop(KeyedRateLimiter::<u8>::new(rate, 0))),
            format!("KeyedRateLimiter::new: {zero_burst}"),
        ),
        (
            message(&|| {
                drop(KeyedRateLimiter::<u8, u64, RandomState>::with_hasher(
                    rate,
                    0,
                    RandomState::new(),
                ))
            }),
            format!("KeyedRateLimiter::with_hasher: {zero_burst}"),
        ),
        (
            message(&|| KeyedRateLimiter::<u8>::new(rate, 1).set_limit(&1, rate, 0)),
            format!("KeyedRateLimiter::set_limit: {zero_burst}"),
        ),
        (
            message(&|| drop(Stagger::new(0, second))),
            format!("Stagger::new: {}", ConfigError::ZeroStarts),
        ),
        (
            message(&|| Stagger::new(1, second).set_limit(0, second)),
            format!("Stagger::set_limit: {}", ConfigError::ZeroStarts),
        ),
        (
            message(&|| {
                let limiter = RateLimiter::new(Rate::per_second(5), 1);
                drop(Adaptive::new(limiter, Rate::per_second(2), rate));
            }),
            format!("Adaptive::new: {}", ConfigError::MinAboveMax),
        ),
        (
            message(&|| drop(futures_util::stream::iter([1]).throttle(rate, |_| 1, 0, Enforcing))),
            format!("PaceExt::throttle: {zero_burst}"),
        ),
        (
            message(&|| drop(futures_util::stream::iter([1]).staggered_start(0, second))),
            format!("PaceExt::staggered_start: {}", ConfigError::ZeroStarts),
        ),
        (
            message(&|| drop(futures_util::sink::drain().throttle(rate, |_: &u8| 1, 0))),
            format!("PaceSinkExt::throttle: {zero_burst}"),
        ),
    ];
    for (got, want) in cases {
        assert_eq!(got, want);
    }
}

#[tokio::test(start_paused = true)]
async fn string_keys_are_asked_with_str_and_found_without_an_owned_key() {
    let limiter = KeyedRateLimiter::<String>::new(Rate::per_second(10), 1);
    assert!(limiter.try_acquire("tenant-a", 1).is_ok());
    assert_eq!(limiter.available("tenant-a"), 0);
    let refused = limiter.try_acquire("tenant-a", 1).unwrap_err();
    assert_eq!(refused.retry_after(), Duration::from_millis(100));
    limiter.acquire("tenant-a", 1).await;
    assert!(limiter
        .acquire_timeout("tenant-a", 1, Duration::from_millis(99))
        .await
        .is_err());
    assert!(limiter
        .acquire_timeout("tenant-a", 1, Duration::from_millis(100))
        .await
        .is_ok());
    limiter.set_limit(&"tenant-b".to_string(), Rate::per_second(1), 3);
    assert_eq!(limiter.available("tenant-b"), 3);
    limiter.clear_limit("tenant-b");
    assert_eq!(limiter.available("tenant-b"), 1);
    assert_eq!(limiter.stats().granted, 3);
}

/// A hasher that counts the keys it hashed, to show where hashing happens.
#[derive(Clone, Default)]
struct Counting(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl BuildHasher for Counting {
    type Hasher = DefaultHasher;
    fn build_hasher(&self) -> DefaultHasher {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        DefaultHasher::new()
    }
}

#[test]
fn a_given_hasher_hashes_every_key_once_per_call() {
    let counting = Counting::default();
    let hashed = || counting.0.load(std::sync::atomic::Ordering::Relaxed);
    let limiter =
        KeyedRateLimiter::<u64, u64, _>::with_hasher(Rate::per_second(1), 1, counting.clone());
    for key in 0..100 {
        limiter.try_acquire(&key, 1).unwrap();
    }
    assert_eq!(limiter.tracked_keys(), 100);
    // One hash per call, plus the keys moved when a table grew (a table holds the keys, not
    // their hashes: 8 bytes less per key).
    let grown = hashed();
    assert!((100..=300).contains(&grown), "{grown}");
    // Calls on keys already there hash their key once each, nothing more.
    for key in 0..100 {
        assert!(limiter.try_acquire(&key, 1).is_err());
        assert_eq!(limiter.available(&key), 0);
    }
    assert_eq!(hashed(), grown + 200);
    let fixed = KeyedRateLimiter::<u64, u64, _>::with_hasher(
        Rate::per_second(1),
        1,
        BuildHasherDefault::<DefaultHasher>::default(),
    );
    assert!(fixed.try_acquire(&7, 1).is_ok());
    assert!(fixed.try_acquire(&7, 1).is_err());
}

/// A key whose `Hash` or `Eq` panics on demand: user code the limiter runs.
#[derive(Clone, Debug)]
struct Touchy {
    id: u32,
    panic_in_eq: bool,
}

impl PartialEq for Touchy {
    fn eq(&self, other: &Self) -> bool {
        if self.panic_in_eq || other.panic_in_eq {
            panic!("Eq of a touchy key");
        }
        self.id == other.id
    }
}
impl Eq for Touchy {}
impl Hash for Touchy {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

/// A hasher that sends every key to the same hash, so that `Eq` runs on every look-up.
#[derive(Clone, Default)]
struct Collide;

struct Constant;
impl Hasher for Constant {
    fn finish(&self) -> u64 {
        42
    }
    fn write(&mut self, _: &[u8]) {}
}
impl BuildHasher for Collide {
    type Hasher = Constant;
    fn build_hasher(&self) -> Constant {
        Constant
    }
}

#[tokio::test(start_paused = true)]
async fn a_key_whose_eq_panics_leaves_every_key_consistent() {
    let limiter = KeyedRateLimiter::<Touchy, u64, _>::with_hasher(Rate::per_second(1), 1, Collide);
    let key = |id| Touchy {
        id,
        panic_in_eq: false,
    };
    for id in 0..10 {
        limiter.try_acquire(&key(id), 1).unwrap();
    }
    let touchy = Touchy {
        id: 99,
        panic_in_eq: true,
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| limiter.try_acquire(&touchy, 1)));
    assert!(outcome.is_err());
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        limiter.set_limit(&touchy.clone(), Rate::per_second(5), 5)
    }));
    assert!(outcome.is_err());
    // Every key is as it was: empty until its token flows in, then forgotten.
    assert_eq!(limiter.tracked_keys(), 10);
    for id in 0..10 {
        assert_eq!(limiter.available(&key(id)), 0);
        assert!(limiter.try_acquire(&key(id), 1).is_err());
    }
    assert_eq!(limiter.stats().granted, 10);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(limiter.tracked_keys(), 0);
    for id in 0..10 {
        assert!(limiter.try_acquire(&key(id), 1).is_ok());
    }
}

#[tokio::test(start_paused = true)]
async fn one_refusal_type_from_an_enforcing_stream() {
    let out: Vec<Result<u64, RateExceeded<u64>>> = futures_util::stream::iter([1, 1, 9])
        .throttle(Rate::per_second(4), |&n| n, 2, Enforcing)
        .collect()
        .await;
    assert!(out[0].is_ok() && out[1].is_ok());
    let refused: NotUntil = out[2].as_ref().unwrap_err().not_until();
    assert!(refused.is_never());
    assert_eq!(refused.retry_after_secs(), u64::MAX);
    assert_eq!(out[2].as_ref().unwrap_err().get_ref(), &9);

    let out: Vec<_> = futures_util::stream::iter([1, 1, 1])
        .throttle(Rate::per_second(4), |&n| n, 2, Enforcing)
        .collect()
        .await;
    let refused = out[2].as_ref().unwrap_err();
    assert_eq!(refused.retry_after(), Duration::from_millis(250));
    assert_eq!(refused.not_until().retry_after_secs(), 1);
    assert!(!refused.not_until().is_never());
    assert_eq!(refused.to_string(), refused.not_until().to_string());
    assert_eq!(refused.to_string(), "rate limited: retry after 250ms");
}

/// Every `#[doc(hidden)]` in the crate's source, outside tests: none may be reachable.
#[test]
fn nothing_is_hidden_from_the_docs() {
    fn walk(dir: &std::path::Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (n, line) in text.lines().enumerate() {
                    if line.contains("doc(hidden)") {
                        found.push(format!("{}:{}", path.display(), n + 1));
                    }
                }
            }
        }
    }
    let mut found = Vec::new();
    walk(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut found,
    );
    assert!(found.is_empty(), "doc(hidden) items: {found:?}");
}

#[test]
fn rates_are_values() {
    assert_eq!(Rate::new(2, Duration::from_secs(2)), Rate::per_second(1));
    assert_eq!(
        Rate::new(80_000, Duration::from_secs(1000)),
        Rate::per_second(80)
    );
    assert_eq!(Rate::per_minute(60), Rate::per_second(1));
    assert!(Rate::per_hour(3601) > Rate::per_second(1));
    assert_eq!(Rate::per_second(80).to_string(), "80/s");
    const QUOTA: Rate = Rate::per_minute(3);
    assert_eq!(QUOTA.to_string(), "3/min");
}

/// `throttle_by_key` and `RateLimitLayer::keyed` take any `KeyedQuota` now; the types they
/// returned before (named with the in-process limiter's hasher) are still what they return.
#[tokio::test(start_paused = true)]
async fn the_keyed_adapters_keep_their_types_with_a_given_hasher() {
    type Fixed = BuildHasherDefault<DefaultHasher>;
    let limiter =
        KeyedRateLimiter::<u64, u64, Fixed>::with_hasher(Rate::per_second(1), 1, Fixed::default());
    let key = |n: &u64| *n % 2;
    let cost = |_: &u64| 1;
    let paced: paced::stream::ThrottleByKey<_, u64, _, _, Fixed> =
        futures_util::stream::iter([1u64, 2, 3]).throttle_by_key(&limiter, key, cost, 4);
    let start = tokio::time::Instant::now();
    let out: Vec<_> = paced
        .map(|n| (n, start.elapsed().as_secs()))
        .collect()
        .await;
    assert_eq!(out, [(1, 0), (2, 0), (3, 1)]);
    let default: paced::stream::ThrottleByKey<_, u64, _, _> = futures_util::stream::iter([1u64])
        .throttle_by_key(&KeyedRateLimiter::new(Rate::per_second(1), 1), key, cost, 4);
    assert_eq!(default.held(), 0);
    #[cfg(feature = "tower")]
    {
        let _: paced::tower::RateLimitLayer<paced::tower::ByKey<u64, _, Fixed>> =
            paced::tower::RateLimitLayer::keyed(&limiter, key);
    }
}

/// The operations of the 1.0 vocabulary, on the handles that gained them.
#[tokio::test(start_paused = true)]
async fn the_shared_verbs_on_every_in_process_handle() {
    // Stagger: `available` is a u64, and `acquire_timeout` as on the other handles.
    let stagger = Stagger::new(2, Duration::from_secs(1));
    let free: u64 = stagger.available();
    assert_eq!(free, 2);
    stagger.acquire().await;
    assert!(stagger.acquire_timeout(Duration::ZERO).await.is_ok());
    assert_eq!(stagger.available(), 0);
    let refused = stagger.acquire_timeout(Duration::from_millis(999)).await;
    assert_eq!(refused.unwrap_err().retry_after(), Duration::from_secs(1));
    assert_eq!(stagger.stats().rejected, 1);
    let start = tokio::time::Instant::now();
    assert!(stagger
        .acquire_timeout(Duration::from_secs(1))
        .await
        .is_ok());
    assert_eq!(start.elapsed(), Duration::from_secs(1));

    // RateLimiter: rate and burst in one step.
    let limiter = RateLimiter::new(Rate::per_second(1), 1);
    limiter.set_limit(Rate::per_second(4), 3);
    assert_eq!(limiter.rate(), Rate::per_second(4));
    assert_eq!(limiter.burst(), Some(3));
    assert_eq!(limiter.available(), 1); // the level is kept
    assert_eq!(
        limiter.try_set_limit(Rate::per_second(9), 0),
        Err(ConfigError::ZeroBurst)
    );
    assert_eq!(limiter.rate(), Rate::per_second(4));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(limiter.available(), 3);

    // KeyedRateLimiter: a limit set by a borrowed key.
    let keyed = KeyedRateLimiter::<String>::new(Rate::per_second(1), 1);
    assert_eq!(
        keyed.try_set_limit("k", Rate::per_second(10), 0),
        Err(ConfigError::ZeroBurst)
    );
    keyed.set_limit("k", Rate::per_second(10), 4);
    assert_eq!(keyed.available("k"), 4);

    // Adaptive: the limiter's verbs, delegated.
    let adaptive = Adaptive::new(
        RateLimiter::new(Rate::per_second(10), 2),
        Rate::per_second(1),
        Rate::per_second(10),
    );
    assert_eq!(adaptive.available(), 2);
    adaptive.acquire(1).await;
    assert!(adaptive.try_acquire(1).is_ok());
    let refused = adaptive.acquire_timeout(1, Duration::from_millis(10)).await;
    assert_eq!(
        refused.unwrap_err().retry_after(),
        Duration::from_millis(100)
    );
    let start = tokio::time::Instant::now();
    adaptive.acquire(1).await;
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    assert_eq!(adaptive.limiter().stats().granted, 3);
    adaptive.on_throttled(None);
    assert_eq!(adaptive.stats().throttled, 1);
}

/// The crate root names at most 20 items (with every feature): the limiters, the operators'
/// traits, `Rate`, `Limit`, the modes, the errors and the modules; the rest lives in modules.
#[test]
fn the_root_has_at_most_twenty_items() {
    let lib = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/lib.rs"))
        .expect("src/lib.rs");
    let mut names = Vec::new();
    let mut statement = String::new();
    for line in lib.lines().map(str::trim) {
        if let Some(module) = line.strip_prefix("pub mod ") {
            names.push(module.trim_end_matches(';').to_owned());
        } else if line.starts_with("pub use ") || !statement.is_empty() {
            statement.push_str(line);
            if line.ends_with(';') {
                let list = statement
                    .rsplit("::")
                    .next()
                    .unwrap_or_default()
                    .trim_matches(|c| c == '{' || c == '}' || c == ';');
                names.extend(
                    list.split(',')
                        .map(|n| n.trim().to_owned())
                        .filter(|n| !n.is_empty()),
                );
                statement.clear();
            }
        }
    }
    assert!(
        names.len() <= 20,
        "{} items at the root: {names:?}",
        names.len()
    );
    assert!(names.contains(&"RateLimiter".to_owned()), "{names:?}");
}
