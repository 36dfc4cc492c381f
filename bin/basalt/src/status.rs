//! `basalt status`: the cluster's health, every node (registered or not) with its devices,
//! placement groups by state, pools and volumes. `--json` prints the same as one document,
//! described in docs/design/status.md.

use crate::clusterfile::{self, ClusterFile};
use crate::connect::Common;
use crate::health::{Facts, Health, NodeState, PgCounts};
use crate::output;
use basalt_client::Cluster;
use basalt_meta::{FailureDomain, NodeRecord};
use basalt_node::{AdminRequest, DeviceStatus, NodeStatus, PgSummary};
use basalt_placement::ClusterMap;
use basalt_proto::{Request, Response};
use basalt_types::NodeId;
use basalt_types::size::{format_size, format_size_approx};
use clap::Args;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    common: Common,
}

#[derive(Serialize)]
struct ClusterStatus {
    health: Health,
    /// The epoch of the cluster map everything below is read from.
    epoch: u64,
    /// The node that computes and publishes maps, if one leads.
    leader: Option<String>,
    nodes: Vec<NodeView>,
    devices: DeviceCounts,
    /// Placement groups of every pool, by state.
    pgs: PgCounts,
    /// Recovery progress, summed over what the nodes report.
    recovery: RecoveryView,
    pools: Vec<PoolView>,
    volumes: usize,
    provisioned_bytes: u64,
}

/// Recovery across the cluster: what the primaries report of their PGs, and the nodes' rates.
#[derive(Serialize, Default)]
struct RecoveryView {
    /// Copies of objects missing on serving members (being recovered).
    degraded_objects: u64,
    /// Objects still to be copied to devices placement moved PGs to (being backfilled).
    misplaced_objects: u64,
    /// Objects no good copy of was found (every copy fails its checksum): their I/O fails.
    unfound_objects: u64,
    /// Active PGs with nothing missing whose primary has not yet told every serving member
    /// that it holds every acknowledged write (`members_complete`): until it has, a later
    /// peering still needs a member of the older intervals, so stopping another node now may
    /// leave such a PG waiting for it. Normally zero within moments of recovery ending.
    completing_pgs: u64,
    /// Objects and bytes recovery and backfill moved per second, over the last seconds.
    objects_per_sec: f64,
    bytes_per_sec: f64,
    /// Seconds until nothing is degraded or misplaced at that rate; null when nothing is left
    /// or nothing moves.
    eta_secs: Option<u64>,
    /// Objects and bytes moved since the nodes started.
    recovered_objects: u64,
    recovered_bytes: u64,
    /// The cluster-wide throttle (`basalt config`): bytes per second per device (0:
    /// unlimited) and percent of a device's time; null: the nodes' defaults.
    rate_limit: Option<u64>,
    share_limit: Option<u8>,
}

impl RecoveryView {
    fn of(nodes: &[NodeView], settings: &basalt_meta::ClusterSettings) -> RecoveryView {
        let mut r = RecoveryView {
            rate_limit: settings.recovery_bytes_per_sec,
            share_limit: settings.recovery_share_percent,
            ..RecoveryView::default()
        };
        for s in nodes.iter().filter_map(|n| n.status.as_ref()) {
            for p in &s.pgs {
                r.degraded_objects += p.degraded_objects;
                r.misplaced_objects += p.misplaced_objects;
                r.unfound_objects += p.unfound_objects;
                r.completing_pgs += u64::from(completing(p));
            }
            r.objects_per_sec += s.recovery.rate.objects_per_sec;
            r.bytes_per_sec += s.recovery.rate.bytes_per_sec;
            r.recovered_objects += s.recovery.rate.objects;
            r.recovered_bytes += s.recovery.rate.bytes;
        }
        let left = r.degraded_objects + r.misplaced_objects;
        if left > 0 && r.objects_per_sec > 0.0 {
            r.eta_secs = Some((left as f64 / r.objects_per_sec).ceil() as u64);
        }
        r
    }

    fn print(&self) {
        if self.degraded_objects == 0
            && self.misplaced_objects == 0
            && self.objects_per_sec == 0.0
            && self.completing_pgs == 0
        {
            println!("recovery: nothing degraded or misplaced");
            return;
        }
        let eta = match self.eta_secs {
            Some(s) => format!("{s} s"),
            None if self.degraded_objects + self.misplaced_objects == 0 => "none".to_string(),
            None => "unknown".to_string(),
        };
        let unfound = match self.unfound_objects {
            0 => String::new(),
            n => format!(" ({n} unfound: no good copy)"),
        };
        let completing = match self.completing_pgs {
            0 => String::new(),
            n => format!("; {n} recovered PG(s) still telling their members they are complete"),
        };
        println!(
            "recovery: {} degraded{unfound}, {} misplaced object(s); {:.1} objects/s, {}/s; \
             time left {eta}{completing}",
            self.degraded_objects,
            self.misplaced_objects,
            self.objects_per_sec,
            format_size_approx(self.bytes_per_sec as u64),
        );
    }
}

/// Whether a primary's PG is recovered (active, nothing missing) but its members were not yet
/// all told they are complete (`recovery.rs::publish_complete`).
fn completing(p: &PgSummary) -> bool {
    p.status.state == "active" && p.missing_objects == 0 && !p.members_complete
}

#[derive(Serialize)]
struct NodeView {
    id: u32,
    name: Option<String>,
    addr: Option<String>,
    state: NodeState,
    /// Its process id: as the node reports it, else from the `cluster.json` of a local
    /// `basalt up` while that process runs.
    pid: Option<u32>,
    /// Its devices as the map knows them.
    devices: Vec<DeviceView>,
    /// The node's own report, when it answered.
    status: Option<NodeStatus>,
    error: Option<String>,
    /// The live nodes that report they cannot reach it (failure reports); the leader marks
    /// its devices down when enough of them do.
    reported_by: Vec<u32>,
}

#[derive(Serialize)]
struct DeviceView {
    id: u32,
    class: String,
    up: bool,
    #[serde(rename = "in")]
    is_in: bool,
}

#[derive(Serialize)]
struct DeviceCounts {
    total: usize,
    up: usize,
    /// Ids of the devices that are down (their node is gone, or reports them failed).
    down: Vec<u32>,
    /// Ids of the devices that are out (they get no new data).
    out: Vec<u32>,
    /// The devices their node found faulty, and why (down until `basalt device clear-fault`).
    faulty: Vec<FaultyDevice>,
    /// The devices much slower than the others of their class over the last 10 s
    /// (`slow.rs`), with their and their peers' mean milliseconds per I/O.
    slow: Vec<crate::slow::SlowDevice>,
}

#[derive(Serialize)]
struct FaultyDevice {
    id: u32,
    fault: String,
    /// Declared lost by an operator (`basalt device lost`): never cleared.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    lost: bool,
}

#[derive(Serialize)]
struct PoolView {
    id: u32,
    name: String,
    replicas: u8,
    min_size: u8,
    pg_count: u32,
    object_size: u32,
    failure_domain: FailureDomain,
    pgs: PgCounts,
}

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let cluster = args.common.cluster.connect().await?;
    let file = args.common.cluster.cluster_file();
    let map = cluster.map();
    let records = cluster.catalog().list_nodes().await?;
    let leader = cluster.catalog().leader().await?.map(|l| l.name);
    let mut nodes = nodes(&cluster, &map, records, file.as_ref()).await;
    for r in cluster.catalog().list_failure_reports().await? {
        if let Some(n) = nodes.iter_mut().find(|n| n.id == r.accused.0) {
            n.reported_by.push(r.reporter.0);
        }
    }
    let pools: Vec<PoolView> = cluster
        .list_pools()
        .await?
        .into_iter()
        .map(|p| PoolView {
            pgs: map
                .pools
                .get(&p.id)
                .map(|m| PgCounts::of_pool(m, &map))
                .unwrap_or_default(),
            id: p.id.0,
            name: p.name,
            replicas: p.replicas,
            min_size: p.min_size,
            pg_count: p.pg_count,
            object_size: p.object_size,
            failure_domain: p.failure_domain,
        })
        .collect();
    let mut pgs = PgCounts::default();
    for p in &pools {
        pgs.add(&p.pgs);
    }
    let ids = |f: &dyn Fn(&basalt_placement::DeviceInfo) -> bool| -> Vec<u32> {
        map.devices
            .iter()
            .filter(|(_, d)| f(d))
            .map(|(id, _)| id.0)
            .collect()
    };
    let devices = DeviceCounts {
        total: map.devices.len(),
        up: ids(&|d| d.up).len(),
        down: ids(&|d| !d.up),
        out: ids(&|d| !d.r#in),
        faulty: cluster
            .catalog()
            .list_devices()
            .await?
            .into_iter()
            .filter_map(|d| {
                let lost = d.lost;
                d.fault.map(|fault| FaultyDevice {
                    id: d.id.0,
                    fault,
                    lost,
                })
            })
            .collect(),
        slow: crate::slow::slow_devices(&latencies(&nodes)),
    };
    let volumes = cluster.list_volumes().await?;
    let (settings, _) = cluster.catalog().get_settings().await?;
    let recovery = RecoveryView::of(&nodes, &settings);
    let mut facts = facts(map.epoch.0, &nodes, &devices, pgs, recovery.unfound_objects);
    facts.noout = settings.noout;
    let health = Health::judge(&facts);
    let status = ClusterStatus {
        health,
        epoch: map.epoch.0,
        leader,
        nodes,
        devices,
        pgs,
        recovery,
        pools,
        volumes: volumes.len(),
        provisioned_bytes: volumes.iter().map(|v| v.size).sum(),
    };
    if args.common.json {
        return output::json(&status);
    }
    print(&status);
    Ok(())
}

/// Every node the cluster knows: registered ones (asked for their status), and those that own
/// devices in the map or were started by a local `basalt up` but are not registered (down).
async fn nodes(
    cluster: &Cluster,
    map: &ClusterMap,
    records: Vec<NodeRecord>,
    file: Option<&ClusterFile>,
) -> Vec<NodeView> {
    let records: BTreeMap<NodeId, NodeRecord> = records.into_iter().map(|r| (r.id, r)).collect();
    let started: BTreeMap<u32, &clusterfile::NodeEntry> = file
        .map(|f| f.nodes.iter().map(|n| (n.id, n)).collect())
        .unwrap_or_default();
    let mut ids: BTreeSet<NodeId> = records.keys().copied().collect();
    ids.extend(map.nodes.keys().copied());
    ids.extend(map.devices.values().map(|d| d.node));
    for id in started.keys().map(|id| NodeId(*id)) {
        // A node `basalt node remove` forgot is gone, also from a local cluster's listing.
        if !matches!(cluster.catalog().removed_node(id).await, Ok(Some(_))) {
            ids.insert(id);
        }
    }
    let mut asked = tokio::task::JoinSet::new();
    for id in ids.iter().filter(|id| records.contains_key(id)) {
        let (cluster, id) = (cluster.clone(), *id);
        asked.spawn(async move { (id, node_status(&cluster, id).await) });
    }
    let mut reports = BTreeMap::new();
    while let Some(Ok((id, report))) = asked.join_next().await {
        reports.insert(id, report);
    }
    ids.into_iter()
        .map(|id| {
            let record = records.get(&id);
            let entry = started.get(&id.0).copied();
            let report = reports.remove(&id);
            let (status, error) = match report {
                Some(Ok(s)) => (Some(s), None),
                Some(Err(e)) => (None, Some(e.to_string())),
                None => (None, None),
            };
            let state = match (&status, record) {
                (_, None) => NodeState::Down,
                (Some(s), _) if s.fenced => NodeState::Fenced,
                (Some(_), _) => NodeState::Up,
                (None, _) => NodeState::Unreachable,
            };
            let pid = status.as_ref().and_then(|s| s.pid).or_else(|| {
                entry
                    .map(|e| e.pid)
                    .filter(|pid| clusterfile::is_running(*pid, "basalt"))
            });
            NodeView {
                id: id.0,
                name: record
                    .map(|r| r.name.clone())
                    .or_else(|| entry.map(|e| e.name.clone())),
                addr: record
                    .map(|r| r.addr.clone())
                    .or_else(|| map.nodes.get(&id).map(|n| n.addr.clone()))
                    .or_else(|| entry.map(|e| e.addr.clone())),
                state,
                pid,
                devices: map
                    .devices
                    .iter()
                    .filter(|(_, d)| d.node == id)
                    .map(|(d, info)| DeviceView {
                        id: d.0,
                        class: info.class.clone(),
                        up: info.up,
                        is_in: info.r#in,
                    })
                    .collect(),
                status,
                error,
                reported_by: Vec::new(),
            }
        })
        .collect()
}

/// Every device the nodes that answered reported on.
fn reported_devices(nodes: &[NodeView]) -> impl Iterator<Item = &DeviceStatus> {
    nodes
        .iter()
        .filter_map(|n| n.status.as_ref())
        .flat_map(|s| &s.devices)
}

/// A per-device count, for the devices where it is not zero: (device id, count).
fn nonzero(nodes: &[NodeView], count: impl Fn(&DeviceStatus) -> u64) -> Vec<(u32, u64)> {
    reported_devices(nodes)
        .map(|d| (d.id.0, count(d)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn facts(
    epoch: u64,
    nodes: &[NodeView],
    devices: &DeviceCounts,
    pgs: PgCounts,
    unfound_objects: u64,
) -> Facts {
    Facts {
        unfound_objects,
        epoch,
        nodes: nodes.iter().map(|n| (label(n), n.state)).collect(),
        devices: devices.total,
        devices_down: devices.down.clone(),
        devices_out: devices.out.clone(),
        faulty: devices
            .faulty
            .iter()
            .filter(|d| !d.lost)
            .map(|d| (d.id, d.fault.clone()))
            .collect(),
        lost: devices
            .faulty
            .iter()
            .filter(|d| d.lost)
            .map(|d| d.id)
            .collect(),
        pgs,
        checksum_errors: nonzero(nodes, |d| d.checksum_errors),
        read_errors: nonzero(nodes, |d| d.read_errors),
        stalled_io: stalled_io(reported_devices(nodes)),
        slow_requests: nodes
            .iter()
            .filter_map(|n| Some((n.id, n.status.as_ref()?)))
            .filter(|(_, s)| s.slow_requests > 0)
            .map(|(id, s)| (id, s.slow_requests, s.oldest_request_ms.unwrap_or(0)))
            .collect(),
        suspect: nonzero(nodes, |d| d.suspect_pgs),
        slow_devices: devices.slow.clone(),
        used: reported_devices(nodes)
            .map(|d| {
                (
                    d.id.0,
                    basalt_types::size::percent(d.used_bytes, d.capacity_bytes),
                )
            })
            .collect(),
        backfill_toofull: nodes
            .iter()
            .filter_map(|n| n.status.as_ref())
            .flat_map(|s| &s.pgs)
            .filter(|p| p.backfill_toofull)
            .count(),
        noout: false,
    }
}

/// The recent latency of every device whose node reported one, with its class from the map.
fn latencies(nodes: &[NodeView]) -> Vec<crate::slow::DeviceLatency> {
    nodes
        .iter()
        .filter_map(|n| Some((n, n.status.as_ref()?)))
        .flat_map(|(n, s)| {
            s.devices.iter().filter_map(|d| {
                let class = n.devices.iter().find(|v| v.id == d.id.0)?.class.clone();
                Some(crate::slow::DeviceLatency {
                    id: d.id.0,
                    class,
                    io_ms: d.io_latency_ms?,
                    ios: d.recent_ios,
                })
            })
        })
        .collect()
}

/// `(device, ms)` for the devices whose oldest I/O in flight has waited at least
/// [`crate::health::SLOW_IO_MS`].
fn stalled_io<'a>(devices: impl Iterator<Item = &'a DeviceStatus>) -> Vec<(u32, u64)> {
    devices
        .filter_map(|d| Some((d.id.0, d.oldest_io_ms?)))
        .filter(|(_, ms)| *ms >= crate::health::SLOW_IO_MS)
        .collect()
}

/// `node.2 (node2)`, or `node.2` when it has no name.
fn label(n: &NodeView) -> String {
    match &n.name {
        Some(name) => format!("node.{} ({name})", n.id),
        None => format!("node.{}", n.id),
    }
}

pub(crate) async fn node_status(cluster: &Cluster, node: NodeId) -> anyhow::Result<NodeStatus> {
    let body = serde_json::to_vec(&AdminRequest::Status)?;
    match cluster
        .call_node(node, Request::Admin { body: body.into() })
        .await?
    {
        Response::Admin { body } => Ok(serde_json::from_slice(&body)?),
        other => anyhow::bail!("unexpected answer to a status request: {other:?}"),
    }
}

fn print(s: &ClusterStatus) {
    println!(
        "health: {}",
        format!("{:?}", s.health.status).to_uppercase()
    );
    for r in &s.health.reasons {
        println!(
            "  {}: {}",
            format!("{:?}", r.severity).to_lowercase(),
            r.message
        );
    }
    let up = s.nodes.iter().filter(|n| n.state == NodeState::Up).count();
    println!(
        "cluster map epoch {}, leader {}: {} node(s) ({up} up), {} device(s) ({} up, {} down, \
         {} out), {} volume(s), {} provisioned",
        s.epoch,
        s.leader.as_deref().unwrap_or("none"),
        s.nodes.len(),
        s.devices.total,
        s.devices.up,
        s.devices.down.len(),
        s.devices.out.len(),
        s.volumes,
        format_size_approx(s.provisioned_bytes)
    );
    let p = &s.pgs;
    println!(
        "placement groups: {} total, {} active+clean, {} degraded, {} below min_size, {} \
         unavailable, {} remapped",
        p.total, p.active_clean, p.degraded, p.below_min_size, p.unavailable, p.remapped
    );
    s.recovery.print();
    print_nodes(s);
    print_pools(s);
}

/// `up`, `down`, ...; a registered node whose devices the leader marked down because its peers
/// report it: `down (reported by N peers)`.
fn state_label(n: &NodeView) -> String {
    let marked_down = !n.devices.is_empty() && n.devices.iter().all(|d| !d.up);
    if n.state != NodeState::Down && marked_down && !n.reported_by.is_empty() {
        return format!("down (reported by {} peers)", n.reported_by.len());
    }
    format!("{:?}", n.state).to_lowercase()
}

fn print_nodes(s: &ClusterStatus) {
    let mut t = output::table(&[
        "NODE", "NAME", "STATE", "PID", "ADDRESS", "DEVICE", "I/O", "CAPACITY", "USED", "OBJECTS",
        "JOURNAL",
    ]);
    for n in &s.nodes {
        let head = [
            format!("node.{}", n.id),
            n.name.clone().unwrap_or_default(),
            state_label(n),
            n.pid.map(|p| p.to_string()).unwrap_or_default(),
            n.addr.clone().unwrap_or_default(),
        ];
        let reported = n.status.as_ref().map(|st| &st.devices);
        for d in &n.devices {
            let mut row: Vec<String> = head.to_vec();
            let state = match (d.up, d.is_in) {
                (true, true) => "",
                (true, false) => " (out)",
                (false, true) => " (down)",
                (false, false) => " (down, out)",
            };
            let r = reported.and_then(|r| r.iter().find(|r| r.id.0 == d.id));
            let mut stall = match r.and_then(|r| r.oldest_io_ms) {
                Some(ms) if ms >= crate::health::SLOW_IO_MS => {
                    format!(" (I/O waiting {:.1} s)", ms as f64 / 1000.0)
                }
                _ => String::new(),
            };
            if let Some(slow) = s.devices.slow.iter().find(|x| x.id == d.id) {
                stall.push_str(&format!(" (slow: {:.1} ms per I/O)", slow.io_ms));
            }
            row.push(format!("dev.{}{state}{stall}", d.id));
            if let Some(r) = r {
                row.extend([
                    r.io_backend.clone(),
                    format_size_approx(r.capacity_bytes),
                    format_size_approx(r.used_bytes),
                    r.objects.to_string(),
                    format!(
                        "{}/{}",
                        format_size_approx(r.journal_used),
                        format_size_approx(r.journal_size)
                    ),
                ]);
            }
            t.add_row(row);
        }
        if n.devices.is_empty() {
            t.add_row(head.to_vec());
        }
    }
    println!("{t}");
    for n in &s.nodes {
        if let Some(e) = &n.error {
            println!("node.{} did not answer: {e}", n.id);
        }
    }
}

fn print_pools(s: &ClusterStatus) {
    let mut t = output::table(&[
        "POOL",
        "REPLICAS",
        "MIN SIZE",
        "PGS",
        "OBJECT SIZE",
        "ACTIVE+CLEAN",
        "DEGRADED",
        "UNAVAILABLE",
        "REMAPPED",
    ]);
    for p in &s.pools {
        t.add_row([
            p.name.clone(),
            p.replicas.to_string(),
            p.min_size.to_string(),
            p.pg_count.to_string(),
            format_size(u64::from(p.object_size)),
            p.pgs.active_clean.to_string(),
            p.pgs.degraded.to_string(),
            p.pgs.unavailable.to_string(),
            p.pgs.remapped.to_string(),
        ]);
    }
    println!("{t}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(id: u32, oldest_io_ms: Option<u64>) -> DeviceStatus {
        DeviceStatus {
            id: basalt_types::DeviceId(id),
            io_backend: "sim".into(),
            object_size: 4096,
            capacity_bytes: 0,
            used_bytes: 0,
            free_bytes: 0,
            objects: 0,
            tombstones: 0,
            journal_used: 0,
            journal_size: 0,
            reads: 0,
            writes: 0,
            flushes: 0,
            bytes_written: 0,
            device_bytes_written: 0,
            journal_records: 0,
            durable_records: 0,
            checksum_errors: 0,
            read_errors: 0,
            oldest_io_ms,
            io_latency_ms: None,
            recent_ios: 0,
            flush_latency_ms: None,
            suspect_pgs: 0,
        }
    }

    fn summary(state: &str, missing: u64, members_complete: bool) -> PgSummary {
        serde_json::from_value(serde_json::json!({
            "pg": {"pool": 1, "pg": 0}, "device": 1, "interval": 3, "round": 0, "state": state,
            "missing_objects": missing, "backfilling": 0, "clean": missing == 0,
            "members_complete": members_complete, "recovered_objects": 0, "recovered_bytes": 0,
        }))
        .unwrap()
    }

    #[test]
    fn a_recovered_pg_whose_members_were_not_yet_told_is_completing() {
        assert!(completing(&summary("active", 0, false)));
        assert!(!completing(&summary("active", 0, true)), "told: done");
        assert!(
            !completing(&summary("active", 2, false)),
            "still recovering"
        );
        assert!(
            !completing(&summary("peering", 0, false)),
            "not serving yet"
        );
    }

    #[test]
    fn a_device_whose_oldest_io_waited_a_second_is_stalled() {
        let devices = [
            device(1, None),
            device(2, Some(999)),
            device(3, Some(1000)),
            device(4, Some(12_345)),
        ];
        assert_eq!(
            stalled_io(devices.iter()),
            [(3, 1000), (4, 12_345)],
            "nothing in flight or under a second is not a stall"
        );
    }
}
