//! The fail-open fallback: the local limiter that stands in for a quota in Redis during an
//! outage.

use std::time::Duration;

use tokio::time::Instant;

/// Under `FailOpen`, during an outage: the local limiter (kept for the whole outage, so that
/// probing Redis again does not refill it) and, while it is in charge, until when.
pub(super) struct Fallback<F> {
    limiter: Option<F>,
    until: Option<Instant>,
    /// When it was last in charge until, kept after its second.
    last: Option<Instant>,
}

impl<F> Default for Fallback<F> {
    fn default() -> Self {
        Fallback {
            limiter: None,
            until: None,
            last: None,
        }
    }
}

impl<F: Clone> Fallback<F> {
    /// The fallback, while it is in charge; after its second, `None` (time to try Redis
    /// again), keeping its state in case Redis still fails.
    pub(super) fn current(&mut self) -> Option<F> {
        self.current_until().map(|(limiter, _)| limiter)
    }

    /// [`current`](Self::current), with the instant its second ends: a waiter on it waits no
    /// longer, so that once Redis is back nobody is granted by the fallback any more.
    pub(super) fn current_until(&mut self) -> Option<(F, Instant)> {
        match self.until {
            Some(until) if Instant::now() < until => Some((self.limiter.clone()?, until)),
            Some(_) => {
                self.until = None;
                None
            }
            None => None,
        }
    }

    /// Puts the fallback in charge for a second, made by `make` if the outage is new.
    pub(super) fn open(&mut self, make: impl FnOnce() -> F) {
        if self.limiter.is_none() {
            self.limiter = Some(make());
        }
        let until = Instant::now() + Duration::from_secs(1);
        self.until = Some(until);
        self.last = Some(until);
    }

    /// Whether the fallback could differ from a new one: it was in charge less than `full`
    /// ago (the time its limits take to be full again, unused; asked for only while there is
    /// a fallback). Until then a quota that forgot it would start the outage again with a
    /// full one.
    pub(super) fn is_kept(&self, full: impl FnOnce() -> Duration) -> bool {
        match (&self.limiter, self.last) {
            (Some(_), Some(last)) => last
                .checked_add(full())
                .is_none_or(|end| Instant::now() < end),
            _ => false,
        }
    }

    /// Redis answered: the outage, if any, is over.
    pub(super) fn recovered(&mut self) {
        self.limiter = None;
        self.until = None;
        self.last = None;
    }
}
