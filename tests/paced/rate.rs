//! `Rate` is a value: reduced on construction, equal and hashed by value, ordered exactly.

use std::cmp::Ordering;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use paced::{ConfigError, Rate};
use proptest::prelude::*;

const NANOS_PER_SEC: u128 = 1_000_000_000;
const MAX_NANOS: u128 = Duration::MAX.as_nanos();

fn duration(nanos: u128) -> Duration {
    Duration::new(
        (nanos / NANOS_PER_SEC) as u64,
        (nanos % NANOS_PER_SEC) as u32,
    )
}

fn hash_of(rate: &Rate) -> u64 {
    let mut hasher = DefaultHasher::new();
    rate.hash(&mut hasher);
    hasher.finish()
}

/// `a / b` against `c / d` (`b`, `d` > 0) by their continued fractions: compare the whole
/// parts, and if they tie, compare the reciprocals of the remainders the other way round.
/// Independent of the crate's cross multiplication, and never overflows.
fn cmp_fractions(mut a: u128, mut b: u128, mut c: u128, mut d: u128) -> Ordering {
    // `flip` is whether the fractions being compared now are reciprocals of the original ones
    // an odd number of times.
    let mut flip = false;
    loop {
        let (qa, ra) = (a / b, a % b);
        let (qc, rc) = (c / d, c % d);
        let ord = match (qa.cmp(&qc), ra, rc) {
            (Ordering::Equal, 0, 0) => Ordering::Equal,
            (Ordering::Equal, 0, _) => Ordering::Less,
            (Ordering::Equal, _, 0) => Ordering::Greater,
            (Ordering::Equal, _, _) => {
                // a/b = q + ra/b, c/d = q + rc/d: ra/b < rc/d iff b/ra > d/rc.
                (a, b, c, d) = (b, ra, d, rc);
                flip = !flip;
                continue;
            }
            (ord, _, _) => ord,
        };
        return if flip { ord.reverse() } else { ord };
    }
}

/// The reference order of two rates, from the values they were built with.
fn reference(t1: u64, p1: u128, t2: u64, p2: u128) -> Ordering {
    cmp_fractions(u128::from(t1), p1, u128::from(t2), p2)
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Tokens over the whole range, with small and round values often enough to tie.
fn tokens() -> impl Strategy<Value = u64> {
    prop_oneof![
        1..=u64::MAX,
        1..=1_000u64,
        (1..=1_000u64).prop_map(|t| t * 1_000_000),
        (u64::MAX - 1_000..=u64::MAX),
    ]
}

/// Periods in nanoseconds up to `Duration::MAX`, with small and round values often enough.
fn per_nanos() -> impl Strategy<Value = u128> {
    prop_oneof![
        1..=MAX_NANOS,
        1..=1_000_000u128,
        (1..=3_600u128).prop_map(|s| s * NANOS_PER_SEC),
        (MAX_NANOS - 1_000..=MAX_NANOS),
    ]
}

/// A rate `t` per `p` ns and a factor `k` such that `t k` and `p k` still fit.
fn scaled() -> impl Strategy<Value = (u64, u128, u64)> {
    prop_oneof![1..=1u64 << 24, 1..=1_000u64, Just(1)].prop_flat_map(|k| {
        let t = prop_oneof![1..=u64::MAX / k, 1..=1_000u64];
        let p = prop_oneof![1..=MAX_NANOS / u128::from(k), 1..=1_000_000u128];
        (t, p, Just(k))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Scaling both terms by `k` gives the same value, the same hash and the same parts.
    #[test]
    fn equal_and_hashed_by_value((t, p, k) in scaled()) {
        let base = Rate::new(t, duration(p));
        let scaled = Rate::new(t * k, duration(p * u128::from(k)));
        prop_assert_eq!(base, scaled);
        prop_assert_eq!(hash_of(&base), hash_of(&scaled));
        prop_assert_eq!(base.cmp(&scaled), Ordering::Equal);
        prop_assert_eq!((base.tokens(), base.per()), (scaled.tokens(), scaled.per()));
    }

    /// The stored parts are the fraction in lowest terms.
    #[test]
    fn reduced_to_lowest_terms(t in tokens(), p in per_nanos()) {
        let rate = Rate::new(t, duration(p));
        let (rt, rp) = (rate.tokens(), rate.per().as_nanos());
        prop_assert_eq!(gcd(u128::from(rt), rp), 1);
        prop_assert_eq!(reference(t, p, rt, rp), Ordering::Equal);
        let g = gcd(u128::from(t), p);
        prop_assert_eq!((u128::from(rt) * g, rp * g), (u128::from(t), p));
        prop_assert_eq!(Rate::try_new(t, duration(p)), Ok(rate));
    }

    /// The order is that of the fractions, over the whole range; `==` agrees with it.
    #[test]
    fn order_is_exact(t1 in tokens(), p1 in per_nanos(), t2 in tokens(), p2 in per_nanos()) {
        let (a, b) = (Rate::new(t1, duration(p1)), Rate::new(t2, duration(p2)));
        let expected = reference(t1, p1, t2, p2);
        prop_assert_eq!(a.cmp(&b), expected);
        prop_assert_eq!(a.partial_cmp(&b), Some(expected));
        prop_assert_eq!(a == b, expected == Ordering::Equal);
        prop_assert_eq!(b.cmp(&a), expected.reverse());
        prop_assert_eq!(a.cmp(&a), Ordering::Equal);
    }

    /// Neighbours differ by one token or one nanosecond: far below what a float could see.
    #[test]
    fn order_separates_neighbours(t in tokens(), p in per_nanos()) {
        let rate = Rate::new(t, duration(p));
        if t < u64::MAX {
            let more = Rate::new(t + 1, duration(p));
            prop_assert!(more > rate);
            prop_assert_eq!(more.cmp(&rate), reference(t + 1, p, t, p));
        }
        if p < MAX_NANOS {
            let slower = Rate::new(t, duration(p + 1));
            prop_assert!(slower < rate);
        }
        if t > 1 && p > 1 {
            // (t - 1) / (p - 1) against t / p: greater exactly when t > p.
            let both = Rate::new(t - 1, duration(p - 1));
            // (t - 1) p - t (p - 1) = t - p.
            prop_assert_eq!(both.cmp(&rate), u128::from(t).cmp(&p));
            prop_assert_eq!(both.cmp(&rate), reference(t - 1, p - 1, t, p));
        }
    }

    /// Antisymmetric and transitive, checked by sorting against the reference.
    #[test]
    fn order_is_total(rates in prop::collection::vec((tokens(), per_nanos()), 3..12)) {
        let built: Vec<Rate> = rates.iter().map(|&(t, p)| Rate::new(t, duration(p))).collect();
        for (i, a) in built.iter().enumerate() {
            for (j, b) in built.iter().enumerate() {
                prop_assert_eq!(a.cmp(b), b.cmp(a).reverse());
                for c in &built {
                    if a <= b && b <= c {
                        prop_assert!(a <= c);
                    }
                    if a < b && b < c {
                        prop_assert!(a < c);
                    }
                }
                let (ti, pi) = rates[i];
                let (tj, pj) = rates[j];
                prop_assert_eq!(a.cmp(b), reference(ti, pi, tj, pj));
            }
        }
        let mut sorted = built.clone();
        sorted.sort();
        for pair in sorted.windows(2) {
            prop_assert!(pair[0] <= pair[1]);
        }
        let mut by_reference = rates.clone();
        by_reference.sort_by(|&(t1, p1), &(t2, p2)| reference(t1, p1, t2, p2));
        let by_reference: Vec<Rate> =
            by_reference.iter().map(|&(t, p)| Rate::new(t, duration(p))).collect();
        prop_assert_eq!(sorted, by_reference);
    }

    /// `n/unit` reads back as `n` per unit; anything else as tokens per the reduced period.
    #[test]
    fn display_reads_back(t in tokens(), p in per_nanos()) {
        let rate = Rate::new(t, duration(p));
        let shown = rate.to_string();
        if let Some((n, unit)) = shown.split_once('/') {
            let unit = match unit {
                "ms" => Duration::from_millis(1),
                "s" => Duration::from_secs(1),
                "min" => Duration::from_secs(60),
                "h" => Duration::from_secs(3600),
                other => return Err(TestCaseError::fail(format!("unit {other} in {shown}"))),
            };
            let n: u128 = n.parse().unwrap();
            prop_assert_eq!(
                cmp_fractions(u128::from(rate.tokens()), rate.per().as_nanos(), n, unit.as_nanos()),
                Ordering::Equal
            );
            if let Ok(n) = u64::try_from(n) {
                prop_assert_eq!(Rate::new(n, unit), rate);
            }
        } else {
            prop_assert_eq!(shown, format!("{} per {:?}", rate.tokens(), rate.per()));
            // Not a whole number of tokens in any of the units.
            for unit in [1_000_000, NANOS_PER_SEC, 60 * NANOS_PER_SEC, 3600 * NANOS_PER_SEC] {
                prop_assert_ne!((u128::from(rate.tokens()) * unit) % rate.per().as_nanos(), 0);
            }
        }
    }
}

#[test]
fn equal_by_value() {
    assert_eq!(Rate::new(2, Duration::from_secs(2)), Rate::per_second(1));
    assert_eq!(
        Rate::new(80_000, Duration::from_secs(1000)),
        Rate::per_second(80)
    );
    assert_eq!(Rate::new(60, Duration::from_secs(60)), Rate::per_second(1));
    assert_eq!(Rate::per_minute(120), Rate::per_second(2));
    assert_eq!(Rate::per_hour(3600), Rate::per_second(1));
    assert_eq!(
        hash_of(&Rate::new(80_000, Duration::from_secs(1000))),
        hash_of(&Rate::per_second(80))
    );
    assert_ne!(Rate::new(61, Duration::from_secs(60)), Rate::per_second(1));
    let rate = Rate::new(2, Duration::from_secs(2));
    assert_eq!((rate.tokens(), rate.per()), (1, Duration::from_secs(1)));
}

#[test]
fn faster_is_greater() {
    assert!(Rate::per_second(2) > Rate::per_second(1));
    assert!(Rate::per_minute(61) > Rate::per_second(1));
    assert!(Rate::per_minute(59) < Rate::per_second(1));
    assert!(Rate::per_hour(1) < Rate::per_minute(1));
    assert_eq!(
        Rate::per_second(1).max(Rate::per_minute(100)),
        Rate::per_second(2).min(Rate::per_minute(100))
    );
}

#[test]
fn const_constructors() {
    const NEW: Rate = Rate::new(10, Duration::from_secs(60));
    const TRY: Result<Rate, ConfigError> = Rate::try_new(10, Duration::from_secs(60));
    const ZERO: Result<Rate, ConfigError> = Rate::try_new(0, Duration::from_secs(60));
    const INSTANT: Result<Rate, ConfigError> = Rate::try_new(1, Duration::ZERO);
    const SECOND: Rate = Rate::per_second(10);
    const MINUTE: Rate = Rate::per_minute(10);
    const HOUR: Rate = Rate::per_hour(10);
    const TOKENS: u64 = NEW.tokens();
    const PER: Duration = NEW.per();
    static STATIC: Rate = Rate::per_second(3);

    assert_eq!(NEW, MINUTE);
    assert_eq!(TRY, Ok(MINUTE));
    assert_eq!(ZERO, Err(ConfigError::ZeroTokens));
    assert_eq!(INSTANT, Err(ConfigError::ZeroPeriod));
    assert_eq!((TOKENS, PER), (1, Duration::from_secs(6)));
    assert_eq!(SECOND, Rate::new(10, Duration::from_secs(1)));
    assert_eq!(HOUR, Rate::new(1, Duration::from_secs(360)));
    assert_eq!(STATIC.tokens(), 3);
}

#[test]
fn per_minute_and_per_hour() {
    assert_eq!(Rate::per_minute(7), Rate::new(7, Duration::from_secs(60)));
    assert_eq!(Rate::per_hour(7), Rate::new(7, Duration::from_secs(3600)));
    assert_eq!(Rate::per_minute(60), Rate::per_second(1));
    assert_eq!(Rate::per_hour(60), Rate::per_minute(1));
    let hourly = Rate::per_hour(u64::MAX);
    assert!(hourly > Rate::per_minute(u64::MAX / 60));
    assert!(hourly < Rate::per_minute(u64::MAX / 60 + 1));
}

#[test]
#[should_panic(expected = "invalid rate: `tokens` is 0")]
fn per_minute_panics_on_zero() {
    let _ = Rate::per_minute(0);
}

#[test]
#[should_panic(expected = "invalid rate: `tokens` is 0")]
fn per_hour_panics_on_zero() {
    let _ = Rate::per_hour(0);
}

#[test]
fn display() {
    let cases = [
        (Rate::per_second(80), "80/s"),
        (Rate::per_second(3), "3/s"),
        (Rate::per_minute(3), "3/min"),
        (Rate::per_hour(5), "5/h"),
        (Rate::new(7, Duration::from_millis(1)), "7/ms"),
        (Rate::new(7, Duration::from_millis(1300)), "7 per 1.3s"),
        (Rate::new(120, Duration::from_secs(60)), "2/s"),
        (Rate::new(80_000, Duration::from_secs(1000)), "80/s"),
        (Rate::new(100, Duration::from_secs(60)), "100/min"),
        (Rate::per_second(1000), "1/ms"),
        (Rate::new(1, Duration::from_secs(7200)), "1 per 7200s"),
        (Rate::new(1, Duration::from_micros(1)), "1000/ms"),
        (Rate::new(3, Duration::from_secs(7)), "3 per 7s"),
    ];
    for (rate, shown) in cases {
        assert_eq!(rate.to_string(), shown, "{rate:?}");
    }
}

#[test]
fn extreme_values() {
    let fastest = Rate::new(u64::MAX, Duration::from_nanos(1));
    let slowest = Rate::new(1, Duration::MAX);
    let both = Rate::new(u64::MAX, Duration::MAX);

    assert_eq!(
        (fastest.tokens(), fastest.per()),
        (u64::MAX, Duration::from_nanos(1))
    );
    assert_eq!((slowest.tokens(), slowest.per()), (1, Duration::MAX));
    let g = gcd(u128::from(u64::MAX), MAX_NANOS);
    assert_eq!(u128::from(both.tokens()) * g, u128::from(u64::MAX));
    assert_eq!(both.per().as_nanos() * g, MAX_NANOS);

    assert!(slowest < both && both < fastest);
    assert!(slowest < Rate::new(1, Duration::MAX - Duration::from_nanos(1)));
    assert!(fastest > Rate::new(u64::MAX - 1, Duration::from_nanos(1)));
    assert!(both > Rate::new(u64::MAX - 1, Duration::MAX));
    assert!(both < Rate::new(u64::MAX, Duration::MAX - Duration::from_nanos(1)));
    // u64::MAX per Duration::MAX is a hair under 1 per second.
    assert!(both < Rate::per_second(1));
    assert!(both > Rate::new(999_999_999, Duration::from_secs(1_000_000_000)));
    for (a, b) in [(slowest, both), (both, fastest), (slowest, fastest)] {
        assert_eq!(
            a.cmp(&b),
            reference(
                a.tokens(),
                a.per().as_nanos(),
                b.tokens(),
                b.per().as_nanos()
            )
        );
    }

    assert_eq!(fastest.to_string(), "18446744073709551615000000/ms");
    assert_eq!(slowest.to_string(), "1 per 18446744073709551615.999999999s");
    assert_eq!(
        both.to_string(),
        format!("{} per {:?}", both.tokens(), both.per())
    );
}

#[test]
fn reference_comparison_is_sound() {
    assert_eq!(cmp_fractions(1, 3, 2, 6), Ordering::Equal);
    assert_eq!(cmp_fractions(1, 3, 1, 2), Ordering::Less);
    assert_eq!(cmp_fractions(7, 5, 4, 3), Ordering::Greater); // 1.4 > 1.33
    assert_eq!(cmp_fractions(3, 7, 4, 9), Ordering::Less); // 0.4286 < 0.4444
    assert_eq!(cmp_fractions(5, 2, 5, 2), Ordering::Equal);
    assert_eq!(
        cmp_fractions(u128::MAX, u128::MAX - 1, u128::MAX - 1, u128::MAX - 2),
        Ordering::Less
    );
}
