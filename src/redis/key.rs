//! How a Redis limiter names its keys in Redis: escaping, prefix and Cluster hash tag.

use std::fmt::{self, Display, Write as _};

/// How a limiter turns its keys into Redis keys.
#[derive(Debug)]
pub(super) enum Naming {
    /// [`RedisKeyedRateLimiter`](super::RedisKeyedRateLimiter)'s: key `k` under prefix `p`
    /// is `{p:k}`, both escaped (the prefix is kept escaped).
    Prefixed(String),
    /// [`RedisRateLimiter`](super::RedisRateLimiter)'s: its one bucket is the Redis key it
    /// was given, as it is.
    Exact(String),
}

impl Naming {
    /// The naming of a keyed limiter under `prefix`.
    pub(super) fn prefixed(prefix: &str) -> Naming {
        Naming::Prefixed(escape(prefix))
    }

    /// The name the limiter was built with, as it appears in Redis (escaped for a prefix).
    pub(super) fn name(&self) -> &str {
        match self {
            Naming::Prefixed(name) | Naming::Exact(name) => name,
        }
    }

    /// The Redis key of `key`'s bucket (and of its own limit, if any).
    pub(super) fn redis_key<Q: Display + ?Sized>(&self, key: &Q) -> String {
        match self {
            Naming::Exact(name) => name.clone(),
            Naming::Prefixed(prefix) => {
                let mut out = String::with_capacity(prefix.len() + 24);
                out.push('{');
                out.push_str(prefix);
                out.push(':');
                // Writing to a `String` cannot fail.
                let _ = write!(Escaping(&mut out), "{key}");
                out.push('}');
                out
            }
        }
    }
}

/// `s` with `%`, `{`, `}` and `:` percent-encoded, so that neither a hash tag nor the
/// separator can be forged.
pub(super) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let _ = Escaping(&mut out).write_str(s);
    out
}

/// Writes into a `String` with `%`, `{`, `}` and `:` percent-encoded (see [`escape`]).
struct Escaping<'a>(&'a mut String);

impl fmt::Write for Escaping<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            match c {
                '%' => self.0.push_str("%25"),
                '{' => self.0.push_str("%7B"),
                '}' => self.0.push_str("%7D"),
                ':' => self.0.push_str("%3A"),
                c => self.0.push(c),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{escape, Naming};

    #[test]
    fn keys_are_escaped() {
        assert_eq!(escape("plain-key_1"), "plain-key_1");
        assert_eq!(escape("a:b{c}%d"), "a%3Ab%7Bc%7D%25d");
        assert_eq!(escape("é"), "é");
    }

    #[test]
    fn a_prefixed_key_is_one_hash_tag_and_an_exact_name_is_kept() {
        assert_eq!(Naming::prefixed("t:1").redis_key("a}b"), "{t%3A1:a%7Db}");
        assert_eq!(Naming::Exact("a:{b}".into()).redis_key(&7), "a:{b}");
    }
}
