//! [`AdaptiveFuture`]: a response on its way, reported to an [`Adaptive`] when it completes.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;

use super::feedback::Feedback;
use crate::Adaptive;

pin_project! {
    /// Response future of [`AdaptiveService`]: the inner future, whose result is classified
    /// and reported when it completes, then returned unchanged. Dropped before that, it
    /// reports nothing.
    ///
    /// [`AdaptiveService`]: super::AdaptiveService
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use paced::tower::{AdaptiveLayer, Outcome};
    /// use paced::{Adaptive, Rate, RateLimiter};
    /// use tower::ServiceExt;
    /// use tower_layer::Layer;
    /// use tower_service::Service;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let adaptive = Adaptive::new(
    ///     RateLimiter::new(Rate::per_second(10), 1), Rate::per_second(1), Rate::per_second(10));
    /// let echo = tower::service_fn(|n: u32| async move { Ok::<_, Infallible>(n) });
    /// let mut service =
    ///     AdaptiveLayer::new(&adaptive, |_: &Result<u32, Infallible>| Outcome::Success).layer(echo);
    /// let answered = service.ready().await.unwrap().call(1);
    /// let dropped = service.ready().await.unwrap().call(2);
    /// drop(dropped); // never completed, never reported
    /// assert_eq!(answered.await.unwrap(), 1);
    /// assert_eq!(adaptive.stats().successes, 1);
    /// # }
    /// ```
    #[must_use = "futures do nothing unless polled"]
    pub struct AdaptiveFuture<Fut, F, A = Adaptive> {
        #[pin]
        response: Fut,
        // Taken when the response is reported, so that it is reported once.
        report: Option<(A, F)>,
    }
}

impl<Fut, F, A> AdaptiveFuture<Fut, F, A> {
    pub(super) fn new(response: Fut, adaptive: A, classify: F) -> Self {
        AdaptiveFuture {
            response,
            report: Some((adaptive, classify)),
        }
    }
}

impl<Fut, F, A, T, E> Future for AdaptiveFuture<Fut, F, A>
where
    Fut: Future<Output = Result<T, E>>,
    A: Feedback,
    F: Fn(&Result<T, E>) -> A::Outcome,
{
    type Output = Result<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let me = self.project();
        let result = ready!(me.response.poll(cx));
        if let Some((adaptive, classify)) = me.report.take() {
            adaptive.report(classify(&result));
        }
        Poll::Ready(result)
    }
}

impl<Fut, F, A> fmt::Debug for AdaptiveFuture<Fut, F, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveFuture")
            .field("reported", &self.report.is_none())
            .finish_non_exhaustive()
    }
}
