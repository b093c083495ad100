//! What a destination announced about one of its limits, by name and by what it counts: the
//! values `paced::tower::limits_from_headers` reads and [`Adaptive`](crate::Adaptive)
//! of several limits learns from (feature `http`; re-exported from `paced::tower`).

use crate::limiter::Announced;

/// What a limit counts.
///
/// An [`Adaptive`](crate::Adaptive) paces requests: it takes only the limits that count
/// requests ([`Requests`](Dimension::Requests), and [`Units`](Dimension::Units), which a
/// destination charges per request). Limits of tokens are for a limiter of several dimensions,
/// which charges each call its tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dimension {
    /// Calls (`x-ratelimit-*-requests`, `anthropic-ratelimit-requests-*`, a GitHub resource, an
    /// IETF policy whose quota unit is `requests`, its default).
    Requests,
    /// Tokens, input and output together (`x-ratelimit-*-tokens`,
    /// `anthropic-ratelimit-tokens-*`, an IETF policy whose quota unit is `tokens`).
    Tokens,
    /// Input (prompt) tokens (`anthropic-ratelimit-input-tokens-*`).
    InputTokens,
    /// Output (completion) tokens (`anthropic-ratelimit-output-tokens-*`).
    OutputTokens,
    /// Units the destination charges per request, by a cost of its own or unsaid: the plain
    /// `X-RateLimit-*` trio, GitHub's `graphql` points, an IETF policy with another quota unit
    /// (`qu`).
    Units,
}

impl Dimension {
    /// Whether the limit counts requests (or units charged per request), so that a
    /// request-rate [`Adaptive`](crate::Adaptive) can pace at it: `Requests` and `Units`.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::tower::Dimension;
    ///
    /// assert!(Dimension::Requests.counts_requests());
    /// assert!(!Dimension::InputTokens.counts_requests());
    /// ```
    #[must_use]
    pub const fn counts_requests(self) -> bool {
        matches!(self, Dimension::Requests | Dimension::Units)
    }
}

/// One limit a response announced: its name, what it counts and where it stands.
///
/// The name is the IETF policy's (`"minute"`), GitHub's resource (`"core"`, `"search"`,
/// `"graphql"`), the counted thing for OpenAI's and Anthropic's headers (`"requests"`,
/// `"tokens"`, `"input-tokens"`, `"output-tokens"`), and `"default"` for the plain
/// `X-RateLimit-*` trio.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct AnnouncedLimit {
    /// The limit's name, as the destination gives it.
    pub name: String,
    /// What it counts.
    pub dimension: Dimension,
    /// Where it stands: `remaining` until `reset`, and its `limit` (and `window`) if announced.
    pub announced: Announced,
}

impl AnnouncedLimit {
    /// A limit named `name` of `dimension`, standing at `announced`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use paced::tower::{AnnouncedLimit, Dimension};
    /// use paced::limiter::Announced;
    ///
    /// let tokens = AnnouncedLimit::new("tokens", Dimension::Tokens, Announced::new(9000, Duration::from_secs(6)));
    /// assert_eq!(tokens.name, "tokens");
    /// ```
    #[must_use]
    pub fn new(name: impl Into<String>, dimension: Dimension, announced: Announced) -> Self {
        AnnouncedLimit {
            name: name.into(),
            dimension,
            announced,
        }
    }
}
