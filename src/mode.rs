//! What a paced does with an item or request that does not conform: [`Shaping`] delays it,
//! [`Enforcing`] hands it back at once.

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Shaping {}
    impl Sealed for super::Enforcing {}
}

/// What [`throttle`](crate::PaceExt::throttle) does with an item that does not conform:
/// [`Shaping`] delays it, [`Enforcing`] hands it back at once.
///
/// This trait is sealed: those two are the only modes.
///
/// # Examples
///
/// ```
/// use paced::stream::ThrottleMode;
/// use paced::{Enforcing, Shaping};
///
/// fn mode_name<M: ThrottleMode + std::fmt::Debug>(mode: M) -> String {
///     format!("{mode:?}")
/// }
/// assert_eq!(mode_name(Shaping), "Shaping");
/// assert_eq!(mode_name(Enforcing), "Enforcing");
/// ```
pub trait ThrottleMode: sealed::Sealed {}

/// Delay each item until the bucket holds its cost; every item comes out, in order.
///
/// # Examples
///
/// ```
/// use futures_util::StreamExt;
/// use paced::{PaceExt, Rate, Shaping};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let start = tokio::time::Instant::now();
/// let items: Vec<_> = futures_util::stream::iter(1..=3)
///     .throttle(Rate::per_second(1), |_| 1, 1, Shaping)
///     .collect()
///     .await;
/// assert_eq!(items, [1, 2, 3]);
/// assert_eq!(start.elapsed().as_secs(), 2);
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Shaping;

/// Never delay: an item that does not conform comes out at once as
/// `Err(`[`RateExceeded`](crate::stream::RateExceeded)`)`, which holds the item and says when it would have conformed.
///
/// # Examples
///
/// ```
/// use futures_util::StreamExt;
/// use paced::{Enforcing, PaceExt, Rate};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let out: Vec<_> = futures_util::stream::iter(["a", "b"])
///     .throttle(Rate::per_second(1), |_| 1, 1, Enforcing)
///     .collect()
///     .await;
/// assert_eq!(out[0].as_ref().ok(), Some(&"a"));
/// let refused = out[1].as_ref().unwrap_err();
/// assert_eq!(refused.get_ref(), &"b");
/// assert_eq!(refused.retry_after().as_secs(), 1);
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Enforcing;

impl ThrottleMode for Shaping {}
impl ThrottleMode for Enforcing {}
