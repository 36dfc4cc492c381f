//! Client sessions: a write its client stopped waiting for is never versioned after a write
//! that client sent later.
//!
//! A client gives up on an attempt without knowing whether the node will still run it: its
//! timeout ran out, its connection broke, or a new map sent it elsewhere. The node may still
//! hold the request (queued behind its connection's budget, waiting for the volume records or
//! for its object's gate, retransmitted by TCP after a partition healed). Run later, it would
//! land after a write to the same block that the client sent since and had acknowledged: the
//! newer data replaced by the write the client was told had failed (`EIO`), or by an earlier
//! attempt of a write it retried.
//!
//! So each write carries its client's [`Session`]: the client's random id and a generation the
//! client raises for a node whenever an attempt there ends without an answer
//! (`client/src/retry.rs`). The node keeps the newest generation each client sent it
//! ([`Sessions::arrived`], before the write waits for anything) and the PG's primary versions
//! a write only while its generation is still the newest ([`Sessions::current`], under the
//! PG's lock in `pg/primary.rs::Pg::write_as`). A later write of the client reaches the node
//! with the raised generation, before it is versioned: an abandoned one is either versioned
//! before it (ordered first) or refused (`Busy`; if its client still waits, it sends the
//! write again under the new generation).
//!
//! The table holds at most [`CAPACITY`] clients; past that the one heard from least recently
//! is forgotten (its old writes would pass again: a node serves far fewer clients). A node
//! that restarts forgets every client, and every request its earlier process held with it.

use basalt_proto::Session;
use parking_lot::Mutex;
use std::collections::HashMap;

/// Clients remembered at most.
pub(crate) const CAPACITY: usize = 4096;

#[derive(Default)]
pub(crate) struct Sessions(Mutex<Table>);

#[derive(Default)]
struct Table {
    /// Per client: its newest generation, and when it was last heard from (`clock`).
    newest: HashMap<u64, (u64, u64)>,
    clock: u64,
}

impl Sessions {
    /// A write of session `s` reached the node: its client's older generations are over.
    pub(crate) fn arrived(&self, s: Session) {
        if s.client == 0 {
            return;
        }
        let mut t = self.0.lock();
        t.clock = t.clock.checked_add(1).expect("fewer than 2^64 writes");
        let now = t.clock;
        if !t.newest.contains_key(&s.client) && t.newest.len() >= CAPACITY {
            let oldest = t.newest.iter().min_by_key(|(_, (_, heard))| *heard);
            if let Some((&client, _)) = oldest {
                t.newest.remove(&client);
            }
        }
        let entry = t.newest.entry(s.client).or_insert((s.generation, now));
        entry.0 = entry.0.max(s.generation);
        entry.1 = now;
    }

    /// Whether a write of session `s` may still be versioned: its client sent this node no
    /// newer generation since.
    pub(crate) fn current(&self, s: Session) -> bool {
        if s.client == 0 {
            return true;
        }
        let t = self.0.lock();
        t.newest
            .get(&s.client)
            .is_none_or(|(newest, _)| *newest <= s.generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(client: u64, generation: u64) -> Session {
        Session { client, generation }
    }

    #[test]
    fn a_newer_generation_ends_the_older_ones_of_its_client_only() {
        let t = Sessions::default();
        t.arrived(s(7, 1));
        assert!(t.current(s(7, 1)));
        t.arrived(s(7, 3));
        assert!(!t.current(s(7, 1)) && !t.current(s(7, 2)));
        assert!(t.current(s(7, 3)));
        // An older generation arriving late does not lower it.
        t.arrived(s(7, 2));
        assert!(!t.current(s(7, 2)) && t.current(s(7, 3)));
        // Other clients, and writes without a session (client 0, whatever its generation:
        // the node's own deletes), are not concerned.
        assert!(t.current(s(8, 0)) && t.current(Session::NONE));
        t.arrived(Session::NONE);
        t.arrived(s(0, 5));
        assert!(t.current(s(7, 3)) && t.current(Session::NONE));
    }

    #[test]
    fn the_client_heard_from_least_recently_is_forgotten_when_full() {
        let t = Sessions::default();
        for client in 1..=CAPACITY as u64 {
            t.arrived(s(client, 5));
        }
        t.arrived(s(1, 5)); // heard from again: client 2 is now the oldest
        t.arrived(s(u64::MAX, 1));
        assert!(t.current(s(2, 4)), "client 2 was forgotten");
        assert!(!t.current(s(1, 4)) && !t.current(s(3, 4)));
        assert!(!t.current(s(u64::MAX, 0)));
    }
}
