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
        // The four are ASCII: every run between them is whole characters, copied at once.
        let mut rest = s;
        while let Some(at) = rest
            .bytes()
            .position(|b| matches!(b, b'%' | b'{' | b'}' | b':'))
        {
            self.0.push_str(&rest[..at]);
            self.0.push_str(match rest.as_bytes()[at] {
                b'%' => "%25",
                b'{' => "%7B",
                b'}' => "%7D",
                _ => "%3A",
            });
            rest = &rest[at + 1..];
        }
        self.0.push_str(rest);
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
        assert_eq!(escape(""), "");
        assert_eq!(escape("%"), "%25");
        assert_eq!(escape("::}{"), "%3A%3A%7D%7B");
        assert_eq!(escape("é}ü:"), "é%7Dü%3A");
    }

    #[test]
    fn a_prefixed_key_is_one_hash_tag() {
        assert_eq!(Prefix(escape("t:1")).redis_key("a}b"), "{t%3A1:a%7Db}");
        assert_eq!(Prefix(escape("t")).redis_key(&7), "{t:7}");
    }
}
