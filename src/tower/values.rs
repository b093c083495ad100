//! The values inside rate-limit headers (feature `http`): non-negative numbers of seconds,
//! leading integers, and structured-field lists with integer parameters. Shared by
//! `headers.rs` (`Retry-After`, the binding request quota) and `dialects.rs` (every limit).

use std::time::Duration;

/// The longest delay the parsers return: a longer `Retry-After` or reset reads as a year.
pub const MAX_DELAY: Duration = Duration::from_secs(365 * 86_400);

/// An `X-RateLimit-Reset` above this many seconds is an epoch time (Unix seconds), not a delta:
/// 10⁹ s is 2001 as a date, and 31 years as a delta.
pub const EPOCH_THRESHOLD_SECS: f64 = 1e9;

/// A non-negative number of seconds (`30`, `1.5`); infinite if it overflows.
pub(crate) fn non_negative(value: &str) -> Option<f64> {
    let value = value.trim();
    // `f64::from_str` also takes `inf`, `NaN` and exponents: digits and one dot only.
    if value.is_empty()
        || !value.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        || value.bytes().filter(|&b| b == b'.').count() > 1
    {
        return None;
    }
    value.parse::<f64>().ok()
}

/// The integer a value starts with (`100` in `100, 100;w=60`), if it starts with digits.
pub(crate) fn leading_u64(value: &str) -> Option<u64> {
    let value = value.trim();
    let end = value
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(value.len());
    if end == 0 {
        return None;
    }
    value[..end].parse().ok()
}

/// The items of a structured-field list (`"a";q=1;w=2, "b";q=3`): each item's name (a quoted
/// string or a token, as written) and its parameters as `(key, value)` pairs. Splitting on `,`
/// and `;` outside quotes is all the parsing the four integer parameters need.
pub(crate) fn sf_items(value: &str) -> impl Iterator<Item = (&str, Vec<(&str, &str)>)> {
    split_outside_quotes(value, b',').map(|item| {
        let mut members = split_outside_quotes(item, b';');
        let name = members.next().unwrap_or("").trim().trim_matches('"');
        let params = members
            .filter_map(|m| {
                let (k, v) = m.split_once('=')?;
                Some((k.trim(), v.trim()))
            })
            .collect();
        (name, params)
    })
}

/// A structured-field integer parameter: digits only (no sign), at most 15 of them (the
/// format's limit).
pub(crate) fn param(params: &[(&str, &str)], key: &str) -> Option<u64> {
    let (_, v) = params.iter().find(|(k, _)| *k == key)?;
    if v.is_empty() || v.len() > 15 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

/// `value` split on `sep`, except inside double quotes (with `\` escapes).
pub(crate) fn split_outside_quotes(value: &str, sep: u8) -> impl Iterator<Item = &str> {
    let bytes = value.as_bytes();
    let mut start = 0;
    let mut pos = 0;
    let mut quoted = false;
    let mut escaped = false;
    let mut done = false;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        while pos < bytes.len() {
            let b = bytes[pos];
            pos += 1;
            if escaped {
                escaped = false;
            } else if quoted && b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                quoted = !quoted;
            } else if b == sep && !quoted {
                // `sep` is ASCII: `pos - 1` is a char boundary.
                let piece = &value[start..pos - 1];
                start = pos;
                return Some(piece);
            }
        }
        done = true;
        Some(&value[start..])
    })
}
