//! Helpers shared by the integration tests: scheduled sources, emission timelines and a
//! naive token bucket to check the adapters against.
#![allow(dead_code)]

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use futures_util::{stream, Stream, StreamExt};
use tokio::time::Instant;

pub const MS: u64 = 1_000_000;

/// A stream that yields `items[i]` at `start + arrivals_ms[i]`: each item is ready from its
/// arrival on, whenever it is polled.
pub fn arriving<T: Clone>(start: Instant, schedule: &[(u64, T)]) -> impl Stream<Item = T> + use<T> {
    let schedule = schedule.to_vec();
    stream::unfold(0, move |i| {
        let next = schedule.get(i).cloned();
        async move {
            let (at_ms, item) = next?;
            tokio::time::sleep_until(start + Duration::from_millis(at_ms)).await;
            Some((item, i + 1))
        }
    })
}

/// Drains `s`, returning each item with the nanoseconds since `start` at which it came out.
pub async fn collect_timed<S: Stream>(start: Instant, s: S) -> Vec<(S::Item, u64)> {
    let mut s = std::pin::pin!(s);
    let mut out = Vec::new();
    while let Some(item) = s.next().await {
        out.push((item, nanos_since(start)));
    }
    out
}

pub fn nanos_since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).expect("test ran for centuries")
}

/// Renders a timeline as `"0ms:a 0ms:b 1000ms:c"`, so a failing schedule reads at a glance.
pub fn timeline<T: Display>(events: &[(T, u64)]) -> String {
    events
        .iter()
        .map(|(item, at)| {
            if at % MS == 0 {
                format!("{}ms:{item}", at / MS)
            } else {
                format!("{}ns:{item}", at)
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `f` on a fresh paused current-thread runtime: how proptests get paused time.
pub fn paused<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
        .block_on(f)
}

/// Rounds `nanos` up to tokio's next 1 ms tick: the latest a timer for `nanos` may fire.
pub fn tick_ceil(nanos: u64) -> u64 {
    nanos.div_ceil(MS) * MS
}

/// The obviously correct token bucket, replayed over actual emission times.
///
/// The level is kept in units of `1 / per_ns` token, so one nanosecond refills exactly
/// `tokens` units and every step is exact integer arithmetic.
#[derive(Clone, Debug)]
pub struct NaiveBucket {
    tokens: u128,
    per: u128,
    burst: u128,
    level: u128,
    at: u128,
}

impl NaiveBucket {
    pub fn new(tokens: u64, per: Duration, burst: u64) -> Self {
        let per = per.as_nanos();
        NaiveBucket {
            tokens: tokens.into(),
            per,
            burst: burst.into(),
            level: u128::from(burst) * per,
            at: 0,
        }
    }

    fn level_at(&self, now: u64) -> u128 {
        let now = u128::from(now);
        assert!(now >= self.at, "time went backwards");
        (self.level + (now - self.at) * self.tokens).min(self.burst * self.per)
    }

    /// The earliest time an item of `cost`, offered at `offered`, conforms.
    pub fn earliest(&self, offered: u64, cost: u64) -> u64 {
        let need = u128::from(cost) * self.per;
        let level = self.level_at(offered);
        if level >= need {
            return offered;
        }
        let wait = (need - level).div_ceil(self.tokens);
        offered + u64::try_from(wait).expect("wait fits")
    }

    /// Records an emission at `at`; panics if the item did not conform then.
    pub fn emit(&mut self, at: u64, cost: u64) {
        let level = self.level_at(at);
        let need = u128::from(cost) * self.per;
        if u128::from(cost) > self.burst {
            // A dear item leaves once its whole cost has flowed in, then the bucket is empty.
            self.level = 0;
        } else {
            assert!(
                level >= need,
                "item of cost {cost} left at {at} ns without its tokens"
            );
            self.level = level - need;
        }
        self.at = u128::from(at);
    }
}

/// Awaits `f`, failing the test (instead of hanging it) if it takes longer than an hour of
/// paused time: under paused time a lost wake-up would otherwise park the runtime forever.
pub async fn within_an_hour<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(3600), f)
        .await
        .expect("still pending after an hour: a lost wake-up?")
}
