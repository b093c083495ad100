//! The upstream side every one-item-at-a-time adapter shares: the inner stream, the item taken
//! from it that has not left yet, and whether it has ended.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures_core::Stream;
use pin_project_lite::pin_project;

pin_project! {
    /// The inner stream and what is held from it (`H`: the item with its bookkeeping).
    #[derive(Debug)]
    pub(crate) struct Upstream<S, H> {
        #[pin]
        stream: S,
        pub(crate) held: Option<H>,
        // Upstream has returned `None` and is never polled again.
        done: bool,
    }
}

impl<S: Stream, H> Upstream<S, H> {
    pub(crate) const fn new(stream: S) -> Self {
        Upstream {
            stream,
            held: None,
            done: false,
        }
    }

    pub(crate) fn get_ref(&self) -> &S {
        &self.stream
    }

    pub(crate) fn get_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    pub(crate) fn get_pin_mut(self: Pin<&mut Self>) -> Pin<&mut S> {
        self.project().stream
    }

    pub(crate) fn into_inner(self) -> S {
        self.stream
    }

    /// What is held, to take or fill.
    pub(crate) fn held(self: Pin<&mut Self>) -> &mut Option<H> {
        self.project().held
    }

    pub(crate) fn is_terminated(&self) -> bool {
        self.done && self.held.is_none()
    }

    /// Upstream's hint plus what is held.
    pub(crate) fn size_hint(&self) -> (usize, Option<usize>) {
        let held = usize::from(self.held.is_some());
        if self.done {
            return (held, Some(held));
        }
        let (lower, upper) = self.stream.size_hint();
        (
            lower.saturating_add(held),
            upper.and_then(|u| u.checked_add(held)),
        )
    }

    /// The next upstream item, or `None` once upstream has ended (and on every later call,
    /// without polling it again).
    pub(crate) fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let me = self.project();
        if *me.done {
            return Poll::Ready(None);
        }
        let item = ready!(me.stream.poll_next(cx));
        *me.done = item.is_none();
        Poll::Ready(item)
    }
}
