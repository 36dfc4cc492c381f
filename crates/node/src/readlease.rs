//! Read leases: a deposed primary whose map lags must not answer reads after a newer term of
//! its PG may have acknowledged writes.
//!
//! Rule 2 of the failure model (docs/design/failure-model.md) fences writes: a member that
//! promised a newer term refuses the old primary's sub-operations. A read touches no member, so
//! a primary cut off from its members (marked down by their reports, still reaching etcd and
//! clients) could answer a client whose map is as old as its own until its map watch brings
//! the new map. The leases close that window, on the heartbeats (`heartbeat.rs`):
//!
//! - **Grant.** A node answers a lease ping of a peer whose map epoch is at least its own with a
//!   grant: it records (its clock) that the peer may count on it until `now + length`, with the
//!   peer's epoch. A peer behind its map gets no grant.
//! - **Hold.** The pinging node holds the lease until `sent + length * 7/8` (its clock, from
//!   when it *sent* the ping, so never past the grant; the eighth is for clock rates).
//! - **Read.** A primary answers a read only while it holds a lease of every other node that
//!   holds a serving member of the PG's term (`pg/primary.rs::Pg::read`): else `Busy`.
//! - **Promise.** A member answers a peering query of a new term carrying the querying
//!   primary's epoch `e` only once its own map is at `e` and no grant it made is still running
//!   to a node whose epoch at the grant was older than `e` (it waits for that node's next ping
//!   or for the grant to run out: `pg/replica.rs`).
//!
//! Why it holds: a newer term goes active only with the promise of a member of the old term's
//! interval (or of an interval after it, which itself needed one: rule 5), or of the old
//! primary itself (which then stops serving). After that promise, every lease the old primary
//! can still hold from that member was granted at an epoch at least `e`: so the old primary's
//! map is at least `e`, a map that no longer gives it the PG in the old term, and requests with
//! older epochs are refused (`StaleEpoch`). A node stopping cleanly releases its leases first
//! (its peers drop their grants), so its PGs fail over without waiting for them.
//!
//! Without heartbeats (`grace` 0) there are no leases: reads are answered and promises given at
//! once, as before.

use basalt_types::{Epoch, NodeId};
use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Marks a heartbeat ping that asks for (or releases) a read lease; any other ping payload is
/// echoed as it is (network probes).
const MAGIC: &[u8; 8] = b"BSLTRL01";
/// Ping: magic, pinger node id (u64 LE), pinger map epoch (u64 LE), kind (u8).
const PING_LEN: usize = 8 + 8 + 8 + 1;
const ASK: u8 = 0;
const RELEASE: u8 = 1;

/// A grant this node made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Grant {
    until: Instant,
    /// The peer's map epoch when it asked.
    epoch: Epoch,
}

/// This node's read leases, given and held.
#[derive(Debug)]
pub struct ReadLeases {
    /// How long a grant runs (the heartbeat grace); zero: leases are off.
    length: Duration,
    granted: Mutex<BTreeMap<NodeId, Grant>>,
    held: Mutex<BTreeMap<NodeId, Instant>>,
    /// Notified when a grant changes (a peer pinged again, or released).
    regranted: Notify,
}

impl ReadLeases {
    /// Leases of `length` (the heartbeat grace); zero turns them off.
    pub fn new(length: Duration) -> ReadLeases {
        ReadLeases {
            length,
            granted: Mutex::default(),
            held: Mutex::default(),
            regranted: Notify::new(),
        }
    }

    pub fn enabled(&self) -> bool {
        !self.length.is_zero()
    }

    /// How long a grant runs.
    pub fn length(&self) -> Duration {
        self.length
    }

    /// The payload of a heartbeat ping from node `me` at map `epoch`: asks for a lease, or
    /// releases every lease `me` holds (`release`: it is stopping and answers no more reads).
    pub fn ping(me: NodeId, epoch: Epoch, release: bool) -> Bytes {
        let mut b = BytesMut::with_capacity(PING_LEN);
        b.put_slice(MAGIC);
        b.put_u64_le(u64::from(me.0));
        b.put_u64_le(epoch.0);
        b.put_u8(if release { RELEASE } else { ASK });
        b.freeze()
    }

    /// Answers a ping payload at this node's map epoch `mine`: a lease ping gets a grant (one
    /// byte after the magic: 1) when the pinger's map is not behind, else a refusal (0); a
    /// release drops the pinger's grant. Anything else is echoed.
    pub fn answer(&self, data: Bytes, mine: Epoch) -> Bytes {
        let Some((peer, epoch, kind)) = parse_ping(&data) else {
            return data;
        };
        let granted = match kind {
            RELEASE => {
                self.granted.lock().remove(&peer);
                false
            }
            _ if epoch >= mine && self.enabled() => {
                let until = Instant::now() + self.length;
                self.granted.lock().insert(peer, Grant { until, epoch });
                true
            }
            _ => false,
        };
        self.regranted.notify_waiters();
        let mut b = BytesMut::with_capacity(MAGIC.len() + 1);
        b.put_slice(MAGIC);
        b.put_u8(u8::from(granted));
        b.freeze()
    }

    /// Records the answer of `peer` to a lease ping sent at `sent`.
    pub fn answered(&self, peer: NodeId, sent: Instant, pong: &[u8]) {
        // Refused: whatever was held still runs out as granted, no later.
        let granted = pong.len() == MAGIC.len() + 1 && pong.starts_with(MAGIC) && pong[8] == 1;
        if granted {
            let until = sent + self.length / 8 * 7;
            let mut held = self.held.lock();
            let e = held.entry(peer).or_insert(until);
            *e = (*e).max(until);
        }
    }

    /// Whether this node holds a lease of `peer` now (always, when leases are off).
    pub fn holds(&self, peer: NodeId) -> bool {
        !self.enabled()
            || self
                .held
                .lock()
                .get(&peer)
                .is_some_and(|until| *until > Instant::now())
    }

    /// Waits until no grant is running to a node (other than `except`) whose epoch at the
    /// grant was older than `epoch`: each such node pings again with a newer epoch or its grant
    /// runs out (at most the lease length).
    pub async fn wait_grants_before(&self, epoch: Epoch, except: Option<NodeId>) {
        loop {
            let regranted = self.regranted.notified();
            tokio::pin!(regranted);
            regranted.as_mut().enable();
            let now = Instant::now();
            let last = self
                .granted
                .lock()
                .iter()
                .filter(|(n, g)| Some(**n) != except && g.epoch < epoch && g.until > now)
                .map(|(_, g)| g.until)
                .max();
            let Some(until) = last else { return };
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {}
                _ = regranted => {}
            }
        }
    }
}

fn parse_ping(data: &[u8]) -> Option<(NodeId, Epoch, u8)> {
    if data.len() != PING_LEN || !data.starts_with(MAGIC) {
        return None;
    }
    let word = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().expect("8 bytes"));
    let kind = data[24];
    let node = NodeId(u32::try_from(word(8)).ok()?);
    (kind == ASK || kind == RELEASE).then(|| (node, Epoch(word(16)), kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Duration = Duration::from_secs(2);

    fn grant(leases: &ReadLeases, peer: u32, epoch: u64, mine: u64) -> bool {
        let pong = leases.answer(
            ReadLeases::ping(NodeId(peer), Epoch(epoch), false),
            Epoch(mine),
        );
        pong[8] == 1
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_behind_this_nodes_map_gets_no_grant() {
        let m = ReadLeases::new(L);
        assert!(!grant(&m, 1, 4, 5));
        assert!(grant(&m, 1, 5, 5));
        assert!(grant(&m, 1, 6, 5));
        // Other payloads (network probes) are echoed.
        let probe = Bytes::from_static(b"probe payload");
        assert_eq!(m.answer(probe.clone(), Epoch(5)), probe);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_held_from_the_ping_for_seven_eighths_of_its_length() {
        let (m, a) = (ReadLeases::new(L), ReadLeases::new(L));
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(100)).await;
        let pong = m.answer(ReadLeases::ping(NodeId(1), Epoch(3), false), Epoch(3));
        a.answered(NodeId(2), sent, &pong);
        assert!(a.holds(NodeId(2)));
        assert!(!a.holds(NodeId(3)), "no lease of a node never asked");
        tokio::time::advance(L / 8 * 7 - Duration::from_millis(101)).await;
        assert!(a.holds(NodeId(2)));
        tokio::time::advance(Duration::from_millis(2)).await;
        assert!(!a.holds(NodeId(2)), "held past sent + 7/8 of the length");
        // A refusal holds nothing.
        let refused = m.answer(ReadLeases::ping(NodeId(1), Epoch(2), false), Epoch(3));
        a.answered(NodeId(2), Instant::now(), &refused);
        assert!(!a.holds(NodeId(2)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_promise_waits_for_grants_at_older_epochs_to_run_out_or_be_renewed() {
        let m = std::sync::Arc::new(ReadLeases::new(L));
        assert!(grant(&m, 1, 5, 5));
        assert!(grant(&m, 2, 5, 5));
        let start = Instant::now();
        // Node 2 pings again at epoch 6 after 300 ms; node 1 never does: its grant runs out.
        let m2 = m.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(grant(&m2, 2, 6, 6));
        });
        m.wait_grants_before(Epoch(6), None).await;
        assert_eq!(start.elapsed(), L, "waited for node 1's grant");
        // Grants at the epoch or newer, or to the querying node, do not hold a promise.
        let start = Instant::now();
        assert!(grant(&m, 1, 6, 6));
        assert!(grant(&m, 3, 5, 5));
        m.wait_grants_before(Epoch(6), Some(NodeId(3))).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_ends_the_grant_at_once() {
        let m = std::sync::Arc::new(ReadLeases::new(L));
        assert!(grant(&m, 1, 5, 5));
        let start = Instant::now();
        let m2 = m.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            m2.answer(ReadLeases::ping(NodeId(1), Epoch(5), true), Epoch(6));
        });
        m.wait_grants_before(Epoch(6), None).await;
        assert_eq!(start.elapsed(), Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn off_without_heartbeats() {
        let m = ReadLeases::new(Duration::ZERO);
        assert!(m.holds(NodeId(9)));
        assert!(!grant(&m, 1, 5, 5));
        m.wait_grants_before(Epoch(99), None).await;
    }
}
