//! Clock-free pacing arithmetic: every function takes `now` and answers with a time.
//!
//! The stream adapters only read the clock and turn the answers into timers; everything
//! that decides *when* (and, for `Adaptive`, *which rate*) lives here and is unit-tested with
//! plain numbers.

pub(crate) mod adaptive_law;
mod bucket;
mod fixed_window;
mod limits;
mod nanos;
mod pace;
mod warmup;
mod window;

pub(crate) use bucket::{Bucket, Decision, Packed};
pub(crate) use fixed_window::FixedWindow;
pub(crate) use limits::{Limits, Rule, Tagged};
pub(crate) use nanos::Nanos;
pub(crate) use pace::{Amount, ByItem, Cost, One, Pace};
pub(crate) use warmup::WarmingUp;
pub(crate) use window::Window;
