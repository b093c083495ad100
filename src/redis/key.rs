//! How a Redis limiter names its keys in Redis: escaping, prefix and Cluster hash tag.

use std::fmt::{self, Display, Write as _};

/// How a keyed limiter turns its keys into Redis keys: key `k` under prefix `p` is `{p:k}`,
/// both escaped (the prefix is kept escaped), one Cluster hash tag.
#[derive(Debug)]
pub(super) struct Prefix(pub(super) String);

impl Prefix {
    /// The Redis key of `key`'s quota (its limits' state, and the limits set for it, if any).
    pub(super) fn redis_key<Q: Display + ?Sized>(&self, key: &Q) -> String {
        let mut out = String::with_capacity(self.0.len() + 24);
        out.push('{');
        out.push_str(&self.0);
        out.push(':');
        // Writing to a `String` cannot fail.
        let _ = write!(Escaping(&mut out), "{key}");
        out.push('}');
        out
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
    use super::{escape, Prefix};

    #[test]
    fn keys_are_escaped() {
        assert_eq!(escape("plain-key_1"), "plain-key_1");
        assert_eq!(escape("a:b{c}%d"), "a%3Ab%7Bc%7D%25d");
        assert_eq!(escape("é"), "é");
    }

    #[test]
    fn a_prefixed_key_is_one_hash_tag() {
        assert_eq!(Prefix(escape("t:1")).redis_key("a}b"), "{t%3A1:a%7Db}");
        assert_eq!(Prefix(escape("t")).redis_key(&7), "{t:7}");
    }
}
