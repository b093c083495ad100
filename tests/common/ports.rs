//! Loopback ports for the servers that tests start, and for addresses where none listens.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::ops::Range;
use std::sync::Mutex;

/// A loopback port in `range`, free when chosen, with `port + d` free too for each `d` of
/// `also` (a Redis Cluster node's bus port), that no other caller of this module in this
/// process was given: the tests of one binary run at once, and a port free when chosen stays
/// unused until its server binds it. Keep `range` below Linux's ports for outgoing connections
/// (32768 and up), so that no client's socket holds it, even while its server is down between
/// a kill and a restart. `None` once the range has no free port.
pub fn free_port_in(range: Range<u16>, also: &[u16]) -> Option<u16> {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let count = u32::from(range.end.saturating_sub(range.start));
    if count == 0 {
        return None;
    }
    // Each process starts somewhere else in the range, so that two rarely try the same ports.
    let start = std::process::id().wrapping_mul(2_654_435_761) % count;
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let free = |port: u16| TcpListener::bind(("127.0.0.1", port)).is_ok();
    for n in 0..count {
        let port = range.start + ((start + n) % count) as u16;
        let others = also.iter().map(|d| port.checked_add(*d));
        if !given.contains(&port) && free(port) && others.clone().all(|p| p.is_some_and(free)) {
            given.insert(port);
            return Some(port);
        }
    }
    None
}
