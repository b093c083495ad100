//! The obviously correct limits of `tests/paced/multi.rs` and `tests/paced/keyed_multi.rs`, in whole
//! milliseconds: a bucket as a level (in milliseconds of refill: one token is `per` of them)
//! that grows by one per millisecond up to the burst, a fixed window as its own list of
//! charges with the carry computed window by window.
#![allow(dead_code, unreachable_pub)]

/// One token per `per` ms, at most `burst`; `level` (in ms of refill) as of `at`; `full`:
/// since when it has been full, if it was full at `at`.
#[derive(Clone, Debug)]
pub struct Bucket {
    per: u64,
    burst: u64,
    level: i128,
    at: u64,
    full: u64,
}

impl Bucket {
    fn max(&self) -> i128 {
        i128::from(self.per * self.burst)
    }

    fn level(&self, t: u64) -> i128 {
        (self.level + i128::from(t.saturating_sub(self.at))).min(self.max())
    }

    /// Since when the bucket is full (or will be, if nothing more is taken).
    fn full_at(&self) -> u64 {
        if self.level < self.max() {
            self.at + (self.max() - self.level) as u64
        } else {
            self.full
        }
    }

    fn earliest(&self, since: u64, c: u64) -> u64 {
        if c > self.burst {
            // Full, then the rest flows in, counted from when it heads the queue.
            return self.full_at().max(since) + (c - self.burst) * self.per;
        }
        let need = i128::from(c * self.per);
        let now = self.level(self.at);
        let ready = if now >= need {
            self.at
        } else {
            self.at + (need - now) as u64
        };
        since.max(ready)
    }

    /// Sets the level at `t`, keeping when it became full if it stays full since.
    fn set_level(&mut self, t: u64, level: i128, full: u64) {
        self.level = level;
        self.at = t;
        self.full = full;
    }
}

use super::naive_window::NaiveWindow as Window;

#[derive(Clone, Debug)]
pub enum Rule {
    Bucket(Bucket),
    Window(Window),
}

impl Rule {
    pub fn window(quota: u64, len: u64, phase: u64) -> Rule {
        Rule::Window(Window::new(quota, len, phase))
    }

    pub fn bucket(per: u64, burst: u64) -> Rule {
        Rule::Bucket(Bucket {
            per,
            burst,
            level: i128::from(per * burst),
            at: 0,
            full: 0,
        })
    }

    /// When a request of `c` heading the queue since `since` may go.
    pub fn earliest(&self, since: u64, c: u64) -> u64 {
        match self {
            Rule::Bucket(b) => b.earliest(since, c),
            Rule::Window(w) => w.earliest(since, c),
        }
    }

    /// Charges `c` at `t`: a grant (`debt == false`: a cost above a bucket's burst leaves
    /// it empty) or a debt.
    pub fn charge(&mut self, t: u64, c: u64, debt: bool) {
        match self {
            Rule::Bucket(b) => {
                let c = if debt { c } else { c.min(b.burst) };
                let level = b.level(t) - i128::from(c * b.per);
                b.set_level(t, level, t);
            }
            Rule::Window(w) => w.charge(t, c),
        }
    }

    /// Corrects a grant of `c` made at `granted` to `a < c`, at `t`.
    pub fn refund(&mut self, t: u64, granted: u64, c: u64, a: u64) {
        match self {
            Rule::Bucket(b) => {
                // What the bucket gave (the rest of a cost above the burst was waited for).
                let d = c.min(b.burst) - a.min(b.burst);
                let (was_full, now) = (b.full_at(), b.level(t));
                let level = (now + i128::from(d * b.per)).min(b.max());
                // Full already: since then; full by this refund: from now.
                b.set_level(t, level, if now >= b.max() { was_full } else { t });
            }
            Rule::Window(w) => w.refund(t, granted, c - a),
        }
    }

    /// A new burst (a bucket) or quota (a window), keeping the level or the use.
    pub fn set(&mut self, t: u64, to: u64) {
        match self {
            Rule::Bucket(b) => {
                let now = b.level(t);
                b.burst = to;
                let level = now.min(b.max());
                b.set_level(t, level, t);
            }
            Rule::Window(w) => w.set_quota(t, to),
        }
    }

    /// Whether the limit is as good as new at `t`: a bucket full, a window with nothing used
    /// (nor carried) in the window in force.
    pub fn is_new_at(&self, t: u64) -> bool {
        match self {
            Rule::Bucket(b) => b.level(t) >= b.max(),
            Rule::Window(w) => w.is_unused_at(t),
        }
    }

    /// What the limit holds at `t`: a bucket's whole tokens (none in debt), what is left of
    /// a window's quota.
    pub fn available(&self, t: u64) -> u64 {
        match self {
            Rule::Bucket(b) => u64::try_from(b.level(t).max(0)).unwrap() / b.per,
            Rule::Window(w) => w.available(t),
        }
    }

    /// Whether `c` is above a bucket's burst (only to be had by waiting).
    pub fn is_above_burst(&self, c: u64) -> bool {
        matches!(self, Rule::Bucket(b) if c > b.burst)
    }
}

/// One queue in front of several limits over two dimensions: the limits, the requests
/// waiting in arrival order, and the instant before which nothing is granted.
#[derive(Clone, Debug)]
pub struct Queue {
    pub limits: Vec<(usize, Rule)>,
    /// (id, cost, since)
    pub queue: std::collections::VecDeque<(usize, [u64; 2], u64)>,
    /// No grant before this (the last time the head was woken by a change).
    pub floor: u64,
}

impl Queue {
    pub fn new(limits: Vec<(usize, Rule)>) -> Queue {
        Queue {
            limits,
            queue: std::collections::VecDeque::new(),
            floor: 0,
        }
    }

    /// When a request of `cost` heading the queue since `since` may go: the latest of the
    /// limits' own times.
    pub fn earliest(&self, since: u64, cost: [u64; 2]) -> u64 {
        let mut at = since;
        for (dim, rule) in &self.limits {
            if cost[*dim] > 0 {
                at = at.max(rule.earliest(since, cost[*dim]));
            }
        }
        at
    }

    /// Charges a grant of `cost` at `t` on every limit.
    pub fn commit(&mut self, t: u64, cost: [u64; 2]) {
        for (dim, rule) in &mut self.limits {
            if cost[*dim] > 0 {
                rule.charge(t, cost[*dim], false);
            }
        }
    }

    /// Grants whoever may go by `t`, in order, noting each in `grants` as (id, at).
    pub fn advance_to(&mut self, t: u64, grants: &mut Vec<(usize, u64)>) {
        while let Some(&(id, cost, since)) = self.queue.front() {
            let g = self.earliest(since, cost).max(self.floor);
            if g > t {
                break;
            }
            self.commit(g, cost);
            grants.push((id, g));
            self.queue.pop_front();
            if let Some(next) = self.queue.front_mut() {
                next.2 = g;
            }
        }
    }

    /// Per dimension, the least any limit holds at `t` (`u64::MAX` for a dimension with none).
    pub fn available(&self, t: u64) -> [u64; 2] {
        let mut out = [u64::MAX; 2];
        for (dim, rule) in &self.limits {
            out[*dim] = out[*dim].min(rule.available(t));
        }
        out
    }

    /// Whether nobody waits and every limit is as good as new at `t`.
    pub fn is_new_at(&self, t: u64) -> bool {
        self.queue.is_empty() && self.limits.iter().all(|(_, r)| r.is_new_at(t))
    }
}
