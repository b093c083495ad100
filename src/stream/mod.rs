//! The stream adapters, one per file, over the engine in `paced` and the core.

/// `get_ref`, `get_mut`, `get_pin_mut` and `into_inner` for an adapter whose underlying stream
/// is reached through its pinned field `$field` (a `Paced`, or the stream itself when `direct`).
/// `$make` is the expression that builds the adapter in the doctests.
macro_rules! accessors {
    ($adapter:ident [$($bound:tt)*] [$($param:tt)*], $field:ident $(($via:ident))?, $make:literal) => {
        impl<$($bound)*> $adapter<$($param)*> {
            /// A reference to the underlying stream.
            ///
            /// # Examples
            ///
            /// ```
            /// use futures_util::Stream;
            /// use pacer::{PaceExt, Rate, Shaping};
            /// use std::time::Duration;
            ///
            #[doc = concat!("let s = ", $make, ";")]
            /// assert_eq!(s.get_ref().size_hint(), (3, Some(3)));
            /// ```
            pub fn get_ref(&self) -> &S {
                accessors!(@ref self.$field $(, $via)?)
            }

            /// A mutable reference to the underlying stream. Items taken from it directly are
            /// not paced.
            ///
            /// # Examples
            ///
            /// ```
            /// use futures_util::Stream;
            /// use pacer::{PaceExt, Rate, Shaping};
            /// use std::time::Duration;
            ///
            #[doc = concat!("let mut s = ", $make, ";")]
            /// assert_eq!(s.get_mut().size_hint(), (3, Some(3)));
            /// ```
            pub fn get_mut(&mut self) -> &mut S {
                accessors!(@mut self.$field $(, $via)?)
            }

            /// A pinned mutable reference to the underlying stream. Items taken from it
            /// directly are not paced.
            ///
            /// # Examples
            ///
            /// ```
            /// use futures_util::Stream;
            /// use pacer::{PaceExt, Rate, Shaping};
            /// use std::time::Duration;
            ///
            #[doc = concat!("let mut s = std::pin::pin!(", $make, ");")]
            /// assert_eq!(s.as_mut().get_pin_mut().size_hint(), (3, Some(3)));
            /// ```
            pub fn get_pin_mut(self: std::pin::Pin<&mut Self>) -> std::pin::Pin<&mut S> {
                accessors!(@pin self.project().$field $(, $via)?)
            }

            /// The underlying stream. Whatever the adapter holds is dropped with it.
            ///
            /// # Examples
            ///
            /// ```
            /// use futures_util::Stream;
            /// use pacer::{PaceExt, Rate, Shaping};
            /// use std::time::Duration;
            ///
            #[doc = concat!("let s = ", $make, ";")]
            /// assert_eq!(s.into_inner().size_hint(), (3, Some(3)));
            /// ```
            pub fn into_inner(self) -> S {
                accessors!(@into self.$field $(, $via)?)
            }
        }
    };
    (@ref $e:expr) => { $e.get_ref() };
    (@mut $e:expr) => { $e.get_mut() };
    (@pin $e:expr) => { $e.get_pin_mut() };
    (@into $e:expr) => { $e.into_inner() };
    (@ref $e:expr, direct) => { &$e };
    (@mut $e:expr, direct) => { &mut $e };
    (@pin $e:expr, direct) => { $e };
    (@into $e:expr, direct) => { $e };
}

mod batched_interval;
mod min_interval;
mod paced;
mod shared_paced;
mod staggered_start;
mod staggered_start_with;
mod throttle;
mod throttle_by_key;
mod throttle_with;
mod upstream;

pub use batched_interval::BatchedInterval;
pub use min_interval::MinInterval;
pub(crate) use paced::{Costed, Pace};
pub use staggered_start::StaggeredStart;
pub use staggered_start_with::StaggeredStartWith;
pub use throttle::{Enforcing, RateExceeded, Shaping, Throttle, ThrottleMode};
pub use throttle_by_key::ThrottleByKey;
pub use throttle_with::ThrottleWith;
