//! The upstream side every stream adapter shares: the inner stream, fused ([`Source`]: polled
//! no more once it has ended, with its size hint plus what the adapter holds), and for the
//! one-item-at-a-time adapters the item taken from it that has not left yet ([`Upstream`]).

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures_core::Stream;
use pin_project_lite::pin_project;

pin_project! {
    /// The inner stream, and whether it has ended.
    #[derive(Debug)]
    pub(crate) struct Source<S> {
        #[pin]
        stream: S,
        // Upstream has returned `None` and is never polled again.
        done: bool,
    }
}

impl<S: Stream> Source<S> {
    pub(crate) const fn new(stream: S) -> Self {
        Source {
            stream,
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

    /// Whether upstream has ended.
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// Upstream's hint plus the `held` items the adapter still has to deliver.
    pub(crate) fn size_hint(&self, held: usize) -> (usize, Option<usize>) {
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

pin_project! {
    /// The inner stream and what is held from it (`H`: the item with its bookkeeping).
    #[derive(Debug)]
    pub(crate) struct Upstream<S, H> {
        #[pin]
        source: Source<S>,
        pub(crate) held: Option<H>,
    }
}

impl<S: Stream, H> Upstream<S, H> {
    pub(crate) const fn new(stream: S) -> Self {
        Upstream {
            source: Source::new(stream),
            held: None,
        }
    }

    pub(crate) fn get_ref(&self) -> &S {
        self.source.get_ref()
    }

    pub(crate) fn get_mut(&mut self) -> &mut S {
        self.source.get_mut()
    }

    pub(crate) fn get_pin_mut(self: Pin<&mut Self>) -> Pin<&mut S> {
        self.project().source.get_pin_mut()
    }

    pub(crate) fn into_inner(self) -> S {
        self.source.into_inner()
    }

    /// What is held, to take or fill.
    pub(crate) fn held(self: Pin<&mut Self>) -> &mut Option<H> {
        self.project().held
    }

    pub(crate) fn is_terminated(&self) -> bool {
        self.source.is_done() && self.held.is_none()
    }

    /// Upstream's hint plus what is held.
    pub(crate) fn size_hint(&self) -> (usize, Option<usize>) {
        self.source.size_hint(usize::from(self.held.is_some()))
    }

    /// The next upstream item, or `None` once upstream has ended.
    pub(crate) fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        self.project().source.poll_next(cx)
    }
}
