//! Peer heartbeats and failure reports: each node pings every other live node of the map
//! every `interval` (a node new in the map, and every node after a new map, at once) on a
//! connection of its own (not the data links, so that a long queue of
//! writes never delays a ping); a peer that has not answered for `grace` is suspected, and
//! the node writes a failure report of it (`meta/src/report.rs`: one key per (reporter,
//! accused) under this node's lease). When the peer answers again (or leaves the map) the
//! report is withdrawn. The leader marks a node down when enough live peers report it
//! (`reports.rs`), which closes the gap the lease leaves: a node cut off from the other nodes
//! but not from the metadata store keeps its lease.
//!
//! When a peer becomes suspected, and again when it answers again, the node's data link to it
//! is dropped (`peers.rs`): a connection whose packets were dropped for a while may stay stuck
//! long after the network healed (TCP retransmissions back off to many seconds), and peering
//! and recovery must not wait on it.
//!
//! The node also notices when the map marks it down although it is registered (its peers
//! report it) and logs it; its primaries stop serving like on any map that takes their PGs.

use crate::filed::Filed;
use crate::peers::Peers;
use crate::service::NodeShared;
use basalt_link::{Connector, Link};
use basalt_meta::{Catalog, MetaError};
use basalt_proto::{Request, Response};
use basalt_types::NodeId;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How a node watches its peers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatConfig {
    /// Time between two pings of one peer.
    pub interval: Duration,
    /// How long a peer may leave every ping unanswered before this node reports it (zero: no
    /// heartbeats, no reports).
    pub grace: Duration,
}

impl Default for HeartbeatConfig {
    /// A ping every 0.5 s, a report after 2 s of silence: with the leader's reaction and
    /// peering, I/O resumes about 3 s after a node is cut off (the lease alone takes its TTL).
    fn default() -> HeartbeatConfig {
        HeartbeatConfig {
            interval: Duration::from_millis(500),
            grace: Duration::from_secs(2),
        }
    }
}

impl HeartbeatConfig {
    /// How long a read lease runs (`readlease.rs`): the grace, so that a peer silent long
    /// enough to be reported holds no lease of this node any more; zero (no heartbeats): no
    /// leases.
    pub(crate) fn lease_length(&self) -> Duration {
        if self.interval.is_zero() {
            return Duration::ZERO;
        }
        self.grace
    }
}

/// When each peer last answered (or when this node started pinging it).
type Heard = Arc<Mutex<BTreeMap<NodeId, Instant>>>;

/// A peer's pinging task.
struct Pinger {
    addr: String,
    task: JoinHandle<()>,
}

impl Drop for Pinger {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The heartbeat loop of one node.
struct Watcher {
    catalog: Catalog,
    shared: Arc<NodeShared>,
    connector: Arc<dyn Connector>,
    peers: Arc<Peers>,
    cfg: HeartbeatConfig,
    heard: Heard,
    /// The peers suspected in the last round.
    suspected: BTreeSet<NodeId>,
    pingers: BTreeMap<NodeId, Pinger>,
    /// The failure reports this node filed.
    filed: Filed,
    /// Whether the last map marked this node down while it was registered.
    marked_down: bool,
}

/// Pings the map's other nodes and keeps this node's failure reports up to date, until `stop`.
pub(crate) async fn run(
    catalog: Catalog,
    shared: Arc<NodeShared>,
    connector: Arc<dyn Connector>,
    peers: Arc<Peers>,
    cfg: HeartbeatConfig,
    mut stop: watch::Receiver<bool>,
) {
    if cfg.grace.is_zero() || cfg.interval.is_zero() {
        return;
    }
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut w = Watcher {
        catalog,
        shared,
        connector,
        peers,
        cfg,
        heard: Arc::default(),
        suspected: BTreeSet::new(),
        pingers: BTreeMap::new(),
        filed: Filed::default(),
        marked_down: false,
    };
    // A node new in the map gets its pinger at once, not at the next tick: its first ping
    // grants it a read lease (without which its PGs' reads wait) and starts its watch.
    let mut epochs = w.shared.maps.subscribe();
    loop {
        let stopping = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => true,
            _ = tick.tick() => false,
            Ok(()) = epochs.changed() => {
                w.sync_pingers();
                continue;
            }
        };
        if stopping {
            w.release_leases().await;
            return;
        }
        w.sync_pingers();
        let suspects = w.suspects();
        for peer in suspects.symmetric_difference(&w.suspected) {
            w.peers.drop_link(*peer);
        }
        w.suspected.clone_from(&suspects);
        if let Err(e) = w.report(&suspects).await {
            tracing::debug!("updating failure reports: {e}");
        }
        w.notice_marked_down().await;
    }
}

impl Watcher {
    /// One pinger per other node of the map (a node that moved gets a new one).
    fn sync_pingers(&mut self) {
        let map = self.shared.maps.map();
        let me = self.shared.id;
        self.pingers
            .retain(|id, p| map.nodes.get(id).is_some_and(|n| n.addr == p.addr));
        self.heard
            .lock()
            .retain(|id, _| self.pingers.contains_key(id));
        for (id, info) in &map.nodes {
            if *id == me || self.pingers.contains_key(id) {
                continue;
            }
            self.heard.lock().insert(*id, Instant::now());
            let task = tokio::spawn(ping_loop(
                *id,
                format!("{me}-heartbeat"),
                info.addr.clone(),
                self.connector.clone(),
                self.cfg.clone(),
                self.heard.clone(),
                self.shared.clone(),
            ));
            let addr = info.addr.clone();
            self.pingers.insert(*id, Pinger { addr, task });
        }
    }

    /// Tells every peer this node is stopping (it answers no more reads): they drop the read
    /// leases they granted it, so its PGs' new terms need not wait for them to run out. Best
    /// effort, a short while (a peer not told lets its grant run out).
    async fn release_leases(&mut self) {
        let leases = self.shared.pgs.ctx.leases.clone();
        if !leases.enabled() {
            return;
        }
        // No answer goes out once a peer may have dropped its grant: a read still in flight
        // (past the drain limit) could return data older than a write a new term acknowledged.
        // (The lease task closes the fence too as it stops; this one may run first.)
        self.shared.fence.close();
        let me = self.shared.id;
        let data = leases.ping(me, self.shared.maps.epoch(), true);
        let name = format!("{me}-heartbeat");
        let limit = self.cfg.interval.min(Duration::from_millis(500));
        // The pingers stop first: a lease ping answered after the release would grant again.
        let addrs: Vec<String> = std::mem::take(&mut self.pingers)
            .into_values()
            .map(|p| p.addr.clone())
            .collect();
        let sends = addrs.into_iter().map(|addr| {
            let mut link = None;
            let (connector, data, name) = (self.connector.clone(), data.clone(), name.clone());
            async move {
                let sent = ping(&connector, &addr, &name, limit, &mut link, data);
                let _ = tokio::time::timeout(limit, sent).await;
            }
        });
        futures::future::join_all(sends).await;
    }

    /// The peers silent for longer than the grace.
    fn suspects(&self) -> BTreeSet<NodeId> {
        let now = Instant::now();
        self.heard
            .lock()
            .iter()
            .filter(|(_, t)| now.duration_since(**t) > self.cfg.grace)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Files a report of each suspect, withdraws the reports of peers that answer again or
    /// left the map (`filed.rs`).
    async fn report(&mut self, suspects: &BTreeSet<NodeId>) -> Result<(), MetaError> {
        let silent: BTreeMap<NodeId, Duration> = {
            let heard = self.heard.lock();
            let since = |p: &NodeId| heard.get(p).map_or(Duration::ZERO, |t| t.elapsed());
            suspects.iter().map(|p| (*p, since(p))).collect()
        };
        self.filed
            .sync(&self.catalog, self.shared.id, &silent)
            .await
    }

    /// Logs when the map marks this registered node down (its peers report it) and when it
    /// is up again.
    async fn notice_marked_down(&mut self) {
        let map = self.shared.maps.map();
        let me = self.shared.id;
        let devices: Vec<_> = self.shared.maps.stores().keys().copied().collect();
        let down = map.nodes.contains_key(&me)
            && !devices.is_empty()
            && devices
                .iter()
                .all(|d| map.devices.get(d).is_some_and(|i| !i.up));
        if down == self.marked_down {
            return;
        }
        self.marked_down = down;
        if !down {
            tracing::info!(epoch = %map.epoch, "this node's devices are up in the map again");
            return;
        }
        let reporters = match self.catalog.list_failure_reports().await {
            Ok(r) => r.iter().filter(|r| r.accused == me).count().to_string(),
            Err(e) => format!("(unknown: {e})"),
        };
        if reporters == "0" {
            // Not the peers' doing: this node reported its devices faulty (`faults.rs`, logged
            // there), or an operator's or the leader's record says down.
            tracing::warn!(
                epoch = %map.epoch,
                "the map marks this node's devices down and no peer reports it (device faults \
                 this node reported, or their records were set down); it serves none of its \
                 PGs until they are up in the map again"
            );
            return;
        }
        tracing::warn!(
            epoch = %map.epoch,
            reporters,
            "the map marks this node's devices down although it holds its lease (reporters: \
             the peers that report they cannot reach it); it serves none of its PGs until it \
             is up in the map again"
        );
    }
}

/// Pings `addr` every `interval` (each attempt, connecting included, bounded by the grace),
/// and at once when this node installs a newer map (the peer then renews its read lease at
/// the new epoch, which peering may wait for: `readlease.rs`); records every answer in `heard`
/// and the lease it grants. A failed attempt drops the connection, so the next one connects
/// afresh (a connection whose packets were dropped may stay stuck long after).
async fn ping_loop(
    peer: NodeId,
    name: String,
    addr: String,
    connector: Arc<dyn Connector>,
    cfg: HeartbeatConfig,
    heard: Heard,
    shared: Arc<NodeShared>,
) {
    let mut link: Option<Arc<dyn Link>> = None;
    let mut epochs = shared.maps.subscribe();
    let leases = shared.pgs.ctx.leases.clone();
    loop {
        let started = Instant::now();
        epochs.borrow_and_update();
        let data = leases.ping(shared.id, shared.maps.epoch(), false);
        let attempt = ping(&connector, &addr, &name, cfg.grace, &mut link, data.clone());
        match tokio::time::timeout(cfg.grace, attempt).await {
            Ok(Ok(pong)) => {
                heard.lock().insert(peer, Instant::now());
                leases.answered(peer, started, &data, &pong);
            }
            Ok(Err(e)) => {
                tracing::debug!(%peer, "heartbeat failed: {e}");
                link = None;
            }
            Err(_) => {
                tracing::debug!(%peer, "heartbeat unanswered within {:?}", cfg.grace);
                link = None;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep_until(started + cfg.interval) => {}
            Ok(()) = epochs.changed() => {}
        }
    }
}

async fn ping(
    connector: &Arc<dyn Connector>,
    addr: &str,
    name: &str,
    timeout: Duration,
    link: &mut Option<Arc<dyn Link>>,
    data: Bytes,
) -> Result<Bytes, String> {
    let current = match link.as_ref().filter(|l| l.is_open()) {
        Some(l) => l.clone(),
        None => {
            let l = connector.connect(addr, name, timeout).await?;
            *link = Some(l.clone());
            l
        }
    };
    match current.call(Request::Ping { data }).await {
        Ok(Response::Pong { data }) => Ok(data),
        Ok(other) => Err(format!("unexpected answer {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}
