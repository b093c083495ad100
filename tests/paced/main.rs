//! paced's default test suite, in one binary: one build and one link for every file below
//! instead of one each. Each file is a module named after what it tests
//! (`cargo test --test paced throttle::` runs one of them).
//!
//! Kept apart, as binaries of their own: `hires_timer` and `hires_timer_no_io` (they watch the
//! process's timer thread, which any other test here could wake), and the tests behind a
//! feature (`redis*`, `tower*`).

#[path = "../common/mod.rs"]
mod common;
// The models more than one file checks against, compiled once.
#[path = "../common/exact.rs"]
mod exact;
#[path = "../common/multi_model.rs"]
mod multi_model;
#[path = "../common/naive_window.rs"]
mod naive_window;

mod adaptive;
mod api;
mod batched_interval;
mod coop;
mod keyed;
mod keyed_multi;
mod manners;
mod min_interval;
mod multi;
mod off_grid;
mod precise;
mod properties;
mod rate;
mod rate_limiter;
mod shared_properties;
mod sink;
mod stagger;
mod staggered_start;
mod throttle;
mod throttle_by_key;
mod throttle_with;
