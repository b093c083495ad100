//! The sink adapters, one per file, over the engine in `paced`.

/// What every sink adapter forwards to its `PacedSink` field `inner`: `Sink`, a pass-through
/// `Stream` (for a framed socket paced on its writing side), the accessors and `Debug`.
/// `$pace` bounds what pacing needs (the cost function's type); `$make` is the expression that
/// builds the adapter over a `Vec<u32>` in the doctests.
macro_rules! sink_adapter {
    (
        $adapter:ident [$($bound:tt)*] [$($param:tt)*],
        where [$($pace:tt)*],
        $make:literal
    ) => {
        impl<$($bound)*> $adapter<$($param)*> {
            /// A reference to the underlying sink.
            ///
            /// # Examples
            ///
            /// ```
            /// use std::time::Duration;
            /// use pacer::{PaceSinkExt, Rate};
            ///
            #[doc = concat!("let sink = ", $make, ";")]
            /// assert!(sink.get_ref().is_empty());
            /// ```
            pub fn get_ref(&self) -> &Si {
                self.inner.get_ref()
            }

            /// A mutable reference to the underlying sink. Items given to it directly are not
            /// paced.
            ///
            /// # Examples
            ///
            /// ```
            /// use std::time::Duration;
            /// use pacer::{PaceSinkExt, Rate};
            ///
            #[doc = concat!("let mut sink = ", $make, ";")]
            /// sink.get_mut().push(7);
            /// assert_eq!(sink.get_ref(), &[7]);
            /// ```
            pub fn get_mut(&mut self) -> &mut Si {
                self.inner.get_mut()
            }

            /// A pinned mutable reference to the underlying sink. Items given to it directly
            /// are not paced.
            ///
            /// # Examples
            ///
            /// ```
            /// use std::time::Duration;
            /// use pacer::{PaceSinkExt, Rate};
            ///
            #[doc = concat!("let mut sink = std::pin::pin!(", $make, ");")]
            /// assert!(sink.as_mut().get_pin_mut().is_empty());
            /// ```
            pub fn get_pin_mut(self: std::pin::Pin<&mut Self>) -> std::pin::Pin<&mut Si> {
                self.project().inner.get_pin_mut()
            }

            /// The underlying sink. An item still held is dropped, charged nothing.
            ///
            /// # Examples
            ///
            /// ```
            /// use std::time::Duration;
            /// use pacer::{PaceSinkExt, Rate};
            ///
            #[doc = concat!("let sink = ", $make, ";")]
            /// let vec: Vec<u32> = sink.into_inner();
            /// assert!(vec.is_empty());
            /// ```
            pub fn into_inner(self) -> Si {
                self.inner.into_inner()
            }

            /// The item given to `start_send` that waits for its time, if any.
            ///
            /// # Examples
            ///
            /// ```
            /// use std::time::Duration;
            /// use futures_util::SinkExt;
            /// use pacer::{PaceSinkExt, Rate};
            ///
            /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
            /// # async fn main() {
            #[doc = concat!("let mut sink = std::pin::pin!(", $make, ");")]
            /// sink.feed(1).await.unwrap(); // conforms: handed on at once
            /// sink.feed(2).await.unwrap(); // held until its time
            /// assert_eq!(sink.get_ref(), &[1]);
            /// assert_eq!(sink.held(), Some(&2));
            /// # }
            /// ```
            pub fn held(&self) -> Option<&Item> {
                self.inner.held()
            }

            /// Takes back the item that waits for its time, if any, charging nothing for it:
            /// to reroute it after the inner sink failed, for instance. The sink is then ready
            /// for another item.
            ///
            /// # Examples
            ///
            /// ```
            /// use std::time::Duration;
            /// use futures_util::SinkExt;
            /// use pacer::{PaceSinkExt, Rate};
            ///
            /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
            /// # async fn main() {
            #[doc = concat!("let mut sink = std::pin::pin!(", $make, ");")]
            /// sink.feed(1).await.unwrap();
            /// sink.feed(2).await.unwrap();
            /// assert_eq!(sink.as_mut().take_held(), Some(2));
            /// assert_eq!(sink.held(), None);
            /// # }
            /// ```
            pub fn take_held(self: std::pin::Pin<&mut Self>) -> Option<Item>
            where
                $($pace)*
            {
                self.project().inner.take_held()
            }
        }

        impl<$($bound)*> futures_sink::Sink<Item> for $adapter<$($param)*>
        where
            Si: futures_sink::Sink<Item>,
            $($pace)*
        {
            type Error = Si::Error;

            fn poll_ready(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Result<(), Si::Error>> {
                self.project().inner.poll_ready(cx)
            }

            fn start_send(self: std::pin::Pin<&mut Self>, item: Item) -> Result<(), Si::Error> {
                self.project().inner.start_send(item)
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Result<(), Si::Error>> {
                self.project().inner.poll_flush(cx)
            }

            fn poll_close(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Result<(), Si::Error>> {
                self.project().inner.poll_close(cx)
            }
        }

        /// The underlying sink's items, unpaced: pacing one side of a framed socket leaves
        /// the other readable.
        impl<$($bound)*> futures_core::Stream for $adapter<$($param)*>
        where
            Si: futures_core::Stream,
        {
            type Item = Si::Item;

            fn poll_next(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<Si::Item>> {
                self.project().inner.poll_next(cx)
            }

            fn size_hint(&self) -> (usize, Option<usize>) {
                self.inner.size_hint()
            }
        }

        impl<$($bound)*> std::fmt::Debug for $adapter<$($param)*>
        where
            Si: std::fmt::Debug,
            Item: std::fmt::Debug,
        {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($adapter))
                    .field("inner", &self.inner)
                    .finish()
            }
        }
    };
}

mod min_interval;
pub(crate) mod paced;
mod throttle;
mod throttle_with;

pub use min_interval::SinkMinInterval;
pub use throttle::SinkThrottle;
pub use throttle_with::SinkThrottleWith;
