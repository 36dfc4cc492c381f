//! Read leases: a deposed primary whose map lags must not answer reads after a newer term of
//! its PG may have acknowledged writes.
//!
//! Rule 2 of the failure model (docs/design/failure-model.md) fences writes: a member that
//! promised a newer term refuses the old primary's sub-operations. A read touches no member, so
//! a primary cut off from its members (marked down by their reports, still reaching etcd and
//! clients) could answer a client whose map is as old as its own until its map watch brings
//! the new map. The leases close that window, on the heartbeats (`heartbeat.rs`):
//!
//! - **Grant.** A node answers a lease ping of a peer whose map epoch is at least its own (read
//!   under the grants' lock, so a map installed meanwhile is seen by the answer or by the
//!   promise below) with a grant: it records (its clock) that that process of the peer may
//!   count on it until `now + length`, with the peer's epoch, and says its `length`. A peer
//!   behind its map gets no grant.
//! - **Hold.** The pinging node holds the lease until `sent + min(length, granter's) * 7/8`
//!   (its clock, from when it *sent* the ping, so never past the grant whatever either node's
//!   settings; the eighth is for clock rates).
//! - **Read.** A primary answers a read only while the read's generation is current, it holds
//!   a lease of every other node that holds a serving member of the PG's term (or a backfill
//!   target that completed in it), and then the map still names it the primary of that
//!   interval (`pg/primary.rs::Pg::answerable`): else `Busy`. A member answering a read of its
//!   own copy needs the same of every other serving member (`pg/replica_read.rs`).
//! - **Promise.** A member answers a peering query of a new term carrying the querying
//!   primary's epoch `e` only once its own map is at `e`, the grants its previous processes
//!   may have made have run out (forgotten at a restart: after a crash the longer of a lease
//!   length and the bound the last start wrote, `leasebound.rs`, after the start; else what a
//!   clean stop's mark says, `stopmark.rs`; none when its id was allocated at this start), and
//!   no grant it made is still
//!   running to a node whose epoch at the grant was older than `e` (it waits for that node's
//!   next ping or for the grant to run out: `pg/replica.rs`).
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
//! once, as before. A node without leases (heartbeats off, or a version before them: it echoes
//! the ping) says so, and its lease is not required: rule 9 holds only between nodes that have
//! them.

use basalt_types::{Epoch, NodeId};
use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Marks a heartbeat ping that asks for (or releases) a read lease; any other ping payload is
/// echoed as it is (network probes).
const MAGIC: &[u8; 8] = b"BSLTRL02";
/// Ping: magic, pinger node id (u64 LE), pinger map epoch (u64 LE), pinger incarnation (u64
/// LE), kind (u8).
const PING_LEN: usize = 8 + 8 + 8 + 8 + 1;
/// Answer: magic, status (u8), grant length in milliseconds (u32 LE).
const ANSWER_LEN: usize = 8 + 1 + 4;
const ASK: u8 = 0;
const RELEASE: u8 = 1;
/// Answer statuses.
const REFUSED: u8 = 0;
const GRANTED: u8 = 1;
/// The answering node has no leases (heartbeats off): it never waits before a promise, so
/// its lease protects nothing and is not required.
const NONE_HERE: u8 = 2;

/// A grant this node made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Grant {
    until: Instant,
    /// The peer's map epoch when it asked.
    epoch: Epoch,
    /// Which process of the peer asked (a release of an earlier one leaves it alone).
    incarnation: u64,
}

/// This node's read leases, given and held.
#[derive(Debug)]
pub struct ReadLeases {
    /// How long a grant runs (the heartbeat grace); zero: leases are off.
    length: Duration,
    /// This process (a node restarted under the same id is another incarnation).
    incarnation: u64,
    /// When the grants an earlier process of this node may have made have surely run out (they
    /// are forgotten at a restart): no promise before. `None`: none can still run.
    earlier_run_out: Option<Instant>,
    granted: Mutex<Grants>,
    held: Mutex<Held>,
    /// Notified when a grant changes (a peer pinged again, or released).
    regranted: Notify,
}

/// The grants this node made, and whom it grants nothing more.
#[derive(Debug, Default)]
struct Grants {
    to: BTreeMap<NodeId, Grant>,
    /// The last process of each node that released its leases (it is stopping): a lease ping
    /// of it that arrives after the release (sent earlier, on another connection) gets no
    /// grant.
    released: BTreeMap<NodeId, u64>,
    /// This node is stopping: no more grants (`close`).
    closed: bool,
}

#[derive(Debug, Default)]
struct Held {
    until: BTreeMap<NodeId, Instant>,
    /// Peers without leases (heartbeats off there, or a version without them): nothing to
    /// hold, until when their answer said so (as long as a grant: a node started again with
    /// leases since, and cut off from this one, must not count as without them for good).
    none: BTreeMap<NodeId, Instant>,
}

impl ReadLeases {
    /// Leases of `length` (the heartbeat grace); zero turns them off. Grants earlier processes
    /// of the node made run out within `earlier` (zero when the node never ran before, what a
    /// clean stop said, else the longer of a length and the last start's bound:
    /// `node.rs::earlier_grants`); no promise before.
    pub fn new(length: Duration, earlier: Duration) -> ReadLeases {
        ReadLeases {
            length,
            incarnation: incarnation(),
            earlier_run_out: (!earlier.is_zero()).then(|| Instant::now() + earlier),
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
    /// releases every lease this process of `me` holds (`release`: it is stopping and answers
    /// no more reads).
    pub fn ping(&self, me: NodeId, epoch: Epoch, release: bool) -> Bytes {
        let mut b = BytesMut::with_capacity(PING_LEN);
        b.put_slice(MAGIC);
        b.put_u64_le(u64::from(me.0));
        b.put_u64_le(epoch.0);
        b.put_u64_le(self.incarnation);
        b.put_u8(if release { RELEASE } else { ASK });
        b.freeze()
    }

    /// Answers a ping payload; `mine` gives this node's map epoch, read under the grants' lock
    /// (a map installed meanwhile is seen either by this answer or by the promise's wait). A
    /// lease ping gets a grant for this node's lease length when the pinger's map is not
    /// behind, else a refusal; a release of the same incarnation drops the pinger's grant, and
    /// that incarnation gets none any more (a ping of it may arrive after its release).
    /// Anything else is echoed.
    pub fn answer(&self, data: Bytes, mine: impl FnOnce() -> Epoch) -> Bytes {
        let Some(ping) = parse_ping(&data) else {
            return data;
        };
        let status = if !self.enabled() {
            NONE_HERE
        } else {
            let mut granted = self.granted.lock();
            match ping.kind {
                RELEASE => {
                    if granted
                        .to
                        .get(&ping.node)
                        .is_some_and(|g| g.incarnation == ping.incarnation)
                    {
                        granted.to.remove(&ping.node);
                    }
                    granted.released.insert(ping.node, ping.incarnation);
                    REFUSED
                }
                _ if granted.closed => REFUSED,
                _ if granted.released.get(&ping.node) == Some(&ping.incarnation) => REFUSED,
                _ if ping.epoch >= mine() => {
                    let grant = Grant {
                        until: Instant::now() + self.length,
                        epoch: ping.epoch,
                        incarnation: ping.incarnation,
                    };
                    granted.to.insert(ping.node, grant);
                    GRANTED
                }
                _ => REFUSED,
            }
        };
        self.regranted.notify_waiters();
        let ms = u32::try_from(self.length.as_millis()).unwrap_or(u32::MAX);
        let mut b = BytesMut::with_capacity(ANSWER_LEN);
        b.put_slice(MAGIC);
        b.put_u8(status);
        b.put_u32_le(ms);
        b.freeze()
    }

    /// Records the answer of `peer` to lease ping `ping`, sent at `sent`: a grant is held
    /// until 7/8 of the shorter of the two nodes' lease lengths after `sent` (never past the
    /// grant, whatever either node's settings). A refusal holds nothing more: what was held
    /// runs out as granted. A peer without leases (or that echoed the ping: a version without
    /// them) is not required.
    pub fn answered(&self, peer: NodeId, sent: Instant, ping: &[u8], pong: &[u8]) {
        let mut held = self.held.lock();
        let without = |held: &mut Held| {
            let until = sent + self.length / 8 * 7;
            let e = held.none.entry(peer).or_insert(until);
            *e = (*e).max(until);
        };
        if pong == ping {
            without(&mut held);
            return;
        }
        if pong.len() != ANSWER_LEN || !pong.starts_with(MAGIC) {
            return;
        }
        match pong[8] {
            NONE_HERE => without(&mut held),
            GRANTED => {
                held.none.remove(&peer);
                let ms = u32::from_le_bytes(pong[9..13].try_into().expect("4 bytes"));
                let length = self.length.min(Duration::from_millis(u64::from(ms)));
                let until = sent + length / 8 * 7;
                let e = held.until.entry(peer).or_insert(until);
                *e = (*e).max(until);
            }
            _ => {
                held.none.remove(&peer);
            }
        }
    }

    /// Whether this node holds a lease of `peer` now (always, when leases are off here or
    /// there).
    pub fn holds(&self, peer: NodeId) -> bool {
        if !self.enabled() {
            return true;
        }
        let held = self.held.lock();
        let now = Instant::now();
        let running = |at: Option<&Instant>| at.is_some_and(|until| *until > now);
        running(held.none.get(&peer)) || running(held.until.get(&peer))
    }

    /// Whether this node holds a lease `peer` granted that still runs: unlike [`Self::holds`],
    /// a peer without leases does not count (it promises without waiting for any), nor do
    /// leases that are off here.
    pub fn holds_granted(&self, peer: NodeId) -> bool {
        self.enabled()
            && self
                .held
                .lock()
                .until
                .get(&peer)
                .is_some_and(|until| *until > Instant::now())
    }

    /// Waits until no grant is running to a node (other than `except`) whose epoch at the
    /// grant was older than `epoch`: each such node pings again with a newer epoch or its grant
    /// runs out (at most the lease length). Also until the grants an earlier process of this
    /// node may have made (forgotten at the restart) have run out.
    pub async fn wait_grants_before(&self, epoch: Epoch, except: Option<NodeId>) {
        if let Some(at) = self.earlier_run_out {
            tokio::time::sleep_until(at).await;
        }
        loop {
            let regranted = self.regranted.notified();
            tokio::pin!(regranted);
            regranted.as_mut().enable();
            let now = Instant::now();
            let last = self
                .granted
                .lock()
                .to
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

/// A node's read leases as `basalt status --json` shows them: the grants it made that are
/// still running, and the peers whose lease it holds now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadLeaseStatus {
    /// Lease length (ms; 0: leases off, heartbeats off).
    pub length_ms: u64,
    /// Running grants: the peer, its map epoch when it asked, the ms left.
    pub granted: Vec<LeaseGrant>,
    /// Peers whose lease this node holds now.
    pub held: Vec<NodeId>,
    /// Peers that grant no leases (heartbeats off there): not required for a read.
    pub without: Vec<NodeId>,
    /// How long this node's promises still wait for grants its previous process may have made
    /// (ms; after a clean stop only what was left of them: `stopmark.rs`).
    #[serde(default)]
    pub restart_wait_ms: u64,
}

/// One running grant in [`ReadLeaseStatus`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseGrant {
    pub node: NodeId,
    pub epoch: Epoch,
    pub left_ms: u64,
}

impl ReadLeases {
    /// The node is stopping: grants no more leases. Returns when the last grant of this node
    /// runs out: its own, and those an earlier process may have made (now, when none runs).
    pub fn close(&self) -> Instant {
        let mut granted = self.granted.lock();
        granted.closed = true;
        let now = Instant::now();
        let earlier = self.earlier_run_out.unwrap_or(now).max(now);
        granted
            .to
            .values()
            .map(|g| g.until)
            .fold(earlier, Instant::max)
    }

    /// How long a promise still waits for the grants an earlier process of this node may have
    /// made.
    pub fn restart_wait(&self) -> Duration {
        self.earlier_run_out.map_or(Duration::ZERO, |at| {
            at.saturating_duration_since(Instant::now())
        })
    }

    /// The grants running now and the leases held now.
    pub fn status(&self) -> ReadLeaseStatus {
        let now = Instant::now();
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let granted = self
            .granted
            .lock()
            .to
            .iter()
            .filter(|(_, g)| g.until > now)
            .map(|(n, g)| LeaseGrant {
                node: *n,
                epoch: g.epoch,
                left_ms: ms(g.until - now),
            })
            .collect();
        let held = self.held.lock();
        ReadLeaseStatus {
            length_ms: ms(self.length),
            granted,
            held: held
                .until
                .iter()
                .filter(|(n, until)| **until > now && !held.none.contains_key(n))
                .map(|(n, _)| *n)
                .collect(),
            without: held
                .none
                .iter()
                .filter(|(_, until)| **until > now)
                .map(|(n, _)| *n)
                .collect(),
            restart_wait_ms: ms(self.restart_wait()),
        }
    }
}

/// A lease ping, parsed.
struct Ping {
    node: NodeId,
    epoch: Epoch,
    incarnation: u64,
    kind: u8,
}

fn parse_ping(data: &[u8]) -> Option<Ping> {
    if data.len() != PING_LEN || !data.starts_with(MAGIC) {
        return None;
    }
    let word = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().expect("8 bytes"));
    let kind = data[32];
    (kind == ASK || kind == RELEASE).then_some(())?;
    Some(Ping {
        node: NodeId(u32::try_from(word(8)).ok()?),
        epoch: Epoch(word(16)),
        incarnation: word(24),
        kind,
    })
}

/// A number no other process of this node (nor another node in this process: the simulator)
/// has: the process id, the start time and a counter.
fn incarnation() -> u64 {
    basalt_types::unique_u64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const L: Duration = Duration::from_secs(2);

    /// `granter` answers a lease ping of node `peer` (incarnation of `asker`) at `epoch`, its
    /// own map at `mine`; `asker` records the answer. Returns whether it was a grant.
    fn ask(granter: &ReadLeases, asker: &ReadLeases, peer: u32, epoch: u64, mine: u64) -> bool {
        let ping = asker.ping(NodeId(peer), Epoch(epoch), false);
        let pong = granter.answer(ping.clone(), || Epoch(mine));
        asker.answered(NodeId(99), Instant::now(), &ping, &pong);
        pong[8] == GRANTED
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_behind_this_nodes_map_gets_no_grant() {
        let (m, a) = (ReadLeases::new(L, L), ReadLeases::new(L, L));
        assert!(!ask(&m, &a, 1, 4, 5));
        assert!(!a.holds(NodeId(99)));
        assert!(ask(&m, &a, 1, 5, 5));
        assert!(ask(&m, &a, 1, 6, 5));
        assert!(a.holds(NodeId(99)));
        // Other payloads (network probes) are echoed.
        let probe = Bytes::from_static(b"probe payload");
        assert_eq!(m.answer(probe.clone(), || Epoch(5)), probe);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_held_from_the_ping_for_seven_eighths_of_the_shorter_length() {
        let (m, a) = (ReadLeases::new(L, L), ReadLeases::new(L, L));
        let sent = Instant::now();
        let ping = a.ping(NodeId(1), Epoch(3), false);
        tokio::time::advance(Duration::from_millis(100)).await;
        let pong = m.answer(ping.clone(), || Epoch(3));
        a.answered(NodeId(2), sent, &ping, &pong);
        assert!(a.holds(NodeId(2)));
        assert!(!a.holds(NodeId(3)), "no lease of a node never asked");
        tokio::time::advance(L / 8 * 7 - Duration::from_millis(101)).await;
        assert!(a.holds(NodeId(2)));
        tokio::time::advance(Duration::from_millis(2)).await;
        assert!(!a.holds(NodeId(2)), "held past sent + 7/8 of the length");
        // A granter with a shorter lease: held for 7/8 of that one.
        let short = ReadLeases::new(L / 4, L / 4);
        let (sent, ping) = (Instant::now(), a.ping(NodeId(1), Epoch(3), false));
        let pong = short.answer(ping.clone(), || Epoch(3));
        a.answered(NodeId(4), sent, &ping, &pong);
        tokio::time::advance(L / 4 / 8 * 7 + Duration::from_millis(1)).await;
        assert!(!a.holds(NodeId(4)), "held past the granter's shorter lease");
    }

    #[tokio::test(start_paused = true)]
    async fn peers_without_leases_are_not_required() {
        let (off, a) = (
            ReadLeases::new(Duration::ZERO, Duration::ZERO),
            ReadLeases::new(L, L),
        );
        let ping = a.ping(NodeId(1), Epoch(3), false);
        let pong = off.answer(ping.clone(), || Epoch(3));
        a.answered(NodeId(2), Instant::now(), &ping, &pong);
        assert!(a.holds(NodeId(2)), "heartbeats off there");
        // An older version echoes the payload.
        a.answered(NodeId(3), Instant::now(), &ping, &ping);
        assert!(a.holds(NodeId(3)), "a version without leases");
        assert!(off.holds(NodeId(7)), "leases off here");
        // Not for good: a peer that said so and answers no more (started again with leases
        // since, and cut off from this node) is required again once a lease would have run
        // out, as one that granted.
        tokio::time::sleep(L / 8 * 7 - Duration::from_millis(1)).await;
        assert!(a.holds(NodeId(2)) && a.holds(NodeId(3)));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(!a.holds(NodeId(2)), "still taken as without leases");
        assert!(!a.holds(NodeId(3)), "still taken as an old version");
        assert!(a.status().without.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_promise_waits_for_grants_at_older_epochs_to_run_out_or_be_renewed() {
        let (m, a) = (
            Arc::new(ReadLeases::new(L, L)),
            Arc::new(ReadLeases::new(L, L)),
        );
        // Past the wait for an earlier process's grants.
        tokio::time::advance(L).await;
        assert!(ask(&m, &a, 1, 5, 5));
        assert!(ask(&m, &a, 2, 5, 5));
        let start = Instant::now();
        // Node 2 pings again at epoch 6 after 300 ms; node 1 never does: its grant runs out.
        let (m2, a2) = (m.clone(), a.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(ask(&m2, &a2, 2, 6, 6));
        });
        m.wait_grants_before(Epoch(6), None).await;
        assert_eq!(start.elapsed(), L, "waited for node 1's grant");
        // Grants at the epoch or newer, or to the querying node, do not hold a promise.
        let start = Instant::now();
        assert!(ask(&m, &a, 1, 6, 6));
        assert!(ask(&m, &a, 3, 5, 5));
        m.wait_grants_before(Epoch(6), Some(NodeId(3))).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_node_promises_only_once_its_earlier_grants_ran_out() {
        let (restarted, fresh) = (ReadLeases::new(L, L), ReadLeases::new(L, Duration::ZERO));
        let start = Instant::now();
        fresh.wait_grants_before(Epoch(1), None).await;
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "a node that never ran waits for nothing"
        );
        restarted.wait_grants_before(Epoch(1), None).await;
        assert_eq!(start.elapsed(), L);
        // After a clean stop, what its mark said was left (more than this process's length
        // when the grace was longer before).
        let start = Instant::now();
        let (marked, longer) = (ReadLeases::new(L, L / 4), ReadLeases::new(L, L * 3));
        marked.wait_grants_before(Epoch(1), None).await;
        assert_eq!(start.elapsed(), L / 4);
        longer.wait_grants_before(Epoch(1), None).await;
        assert_eq!(start.elapsed(), L * 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_ends_the_grant_of_its_own_incarnation_at_once() {
        let (m, a) = (Arc::new(ReadLeases::new(L, L)), ReadLeases::new(L, L));
        tokio::time::advance(L).await;
        assert!(ask(&m, &a, 1, 5, 5));
        // A release from another process of node 1 (a restart) leaves the grant alone.
        let earlier = ReadLeases::new(L, L);
        m.answer(earlier.ping(NodeId(1), Epoch(5), true), || Epoch(6));
        let start = Instant::now();
        let m2 = m.clone();
        let release = a.ping(NodeId(1), Epoch(5), true);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            m2.answer(release, || Epoch(6));
        });
        m.wait_grants_before(Epoch(6), None).await;
        assert_eq!(start.elapsed(), Duration::from_millis(200));
        // A ping the released process sent before its release, arriving after it (on another
        // connection), gets no grant; its next process does.
        assert!(!ask(&m, &a, 1, 6, 6), "a ping of a released process");
        let next = ReadLeases::new(L, L);
        assert!(ask(&m, &next, 1, 6, 6), "the node's next process");
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_node_grants_nothing_and_knows_when_its_last_grant_ends() {
        let (m, a, b) = (
            ReadLeases::new(L, Duration::ZERO),
            ReadLeases::new(L, Duration::ZERO),
            ReadLeases::new(L, Duration::ZERO),
        );
        assert!(ask(&m, &a, 1, 5, 5));
        tokio::time::advance(L / 2).await;
        assert!(ask(&m, &b, 2, 5, 5));
        let last = Instant::now() + L;
        tokio::time::advance(L / 4).await;
        assert_eq!(m.close(), last, "the later grant's end");
        assert!(!ask(&m, &a, 1, 5, 5), "no grant once closed");
        tokio::time::advance(L).await;
        assert_eq!(m.close(), Instant::now(), "nothing runs");
        // A process that granted nothing yet still answers for its predecessor's grants.
        let restarted = ReadLeases::new(L, L);
        tokio::time::advance(L / 4).await;
        assert_eq!(restarted.close(), Instant::now() + L * 3 / 4);
    }

    #[tokio::test(start_paused = true)]
    async fn off_without_heartbeats() {
        let m = ReadLeases::new(Duration::ZERO, Duration::ZERO);
        let a = ReadLeases::new(L, L);
        assert!(m.holds(NodeId(9)));
        assert!(!ask(&m, &a, 1, 5, 5));
        let start = Instant::now();
        m.wait_grants_before(Epoch(99), None).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
