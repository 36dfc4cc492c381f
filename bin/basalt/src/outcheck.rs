//! The checks `basalt node drain` and `basalt device out` make before they mark devices out:
//! refused, unless `--force`, when placement would then leave a pool's placement groups short
//! of copies (their move never finishes: they keep serving from where they are) or with copies
//! sharing a failure domain (`basalt_placement::shortfalls_if_out`), or when a device placement
//! would move copies to has too little room for them below the backfill-full limit (the moves
//! would stop at that full device: `backfill_toofull`).

use anyhow::bail;
use basalt_client::Cluster;
use basalt_node::{HeldPg, NodeStatus};
use basalt_placement::{ClusterMap, FailureDomain, Shortfall, arrivals_if_out, shortfalls_if_out};
use basalt_types::size::format_size_approx;
use basalt_types::{DeviceId, NodeId, PgId, PoolId};
use std::collections::BTreeMap;
use std::time::Duration;

/// How long the check waits for a node's report of its devices.
const ASK_LIMIT: Duration = Duration::from_secs(5);

/// Refuses `what` (e.g. "draining node.3") when marking `out` out would leave a pool worse
/// placed, or move more data than the other devices have room for; with `force` it warns.
pub async fn check(
    cluster: &Cluster,
    out: &[DeviceId],
    what: &str,
    force: bool,
) -> anyhow::Result<()> {
    let map = cluster.map();
    if map.epoch.0 == 0 {
        return Ok(());
    }
    let mut problems = placement(cluster, &map, out).await?;
    problems.extend(room(cluster, &map, out).await);
    if problems.is_empty() {
        return Ok(());
    }
    let problems = problems.join("; ");
    if force {
        eprintln!("warning: {what} leaves {problems}; going ahead (--force)");
        return Ok(());
    }
    bail!(
        "{what} would leave {problems}. Add a node or devices first (or pass --force to do it \
         anyway); nothing was marked out"
    )
}

/// The pools placement would leave worse off, described.
async fn placement(
    cluster: &Cluster,
    map: &ClusterMap,
    out: &[DeviceId],
) -> anyhow::Result<Vec<String>> {
    let found = shortfalls_if_out(map, out);
    if found.is_empty() {
        return Ok(Vec::new());
    }
    let catalog = cluster.catalog();
    let names: BTreeMap<PoolId, String> = catalog
        .list_pools()
        .await?
        .into_iter()
        .map(|p| (p.id, p.name))
        .collect();
    Ok(found
        .iter()
        .map(|s| describe(s, names.get(&s.pool)))
        .collect())
}

/// Where placement would move copies were `out` marked out (`arrivals_if_out`), against the
/// room each receiving device has below its node's backfill-full limit, from the reports of
/// the nodes that answer (a device whose node does not answer counts for nothing); `None`
/// when every device has room for what it would receive. A PG's size is estimated from each
/// device holding it: that device's used bytes shared among the PGs it holds by their object
/// counts (the largest such estimate).
async fn room(cluster: &Cluster, map: &ClusterMap, out: &[DeviceId]) -> Option<String> {
    let mut asked = tokio::task::JoinSet::new();
    for node in map.nodes.keys().copied() {
        let cluster = cluster.clone();
        asked.spawn(async move { tokio::time::timeout(ASK_LIMIT, report(&cluster, node)).await });
    }
    let mut devices: BTreeMap<DeviceId, Room> = BTreeMap::new();
    let mut sizes: BTreeMap<PgId, u64> = BTreeMap::new();
    while let Some(joined) = asked.join_next().await {
        let Ok(Ok(Some((status, held)))) = joined else {
            continue;
        };
        let full = status.recovery.limits.backfill_full_percent;
        for d in &status.devices {
            let room = Room {
                used: d.used_bytes,
                limit: d.capacity_bytes / 100 * u64::from(full),
                full,
            };
            devices.insert(d.id, room);
            let Some(pgs) = held.get(&d.id) else {
                continue;
            };
            let objects: u64 = pgs.iter().map(|h| h.objects).sum();
            for h in pgs {
                let share =
                    d.used_bytes as u128 * u128::from(h.objects) / u128::from(objects.max(1));
                let size = sizes.entry(h.pg).or_default();
                *size = (*size).max(u64::try_from(share).unwrap_or(u64::MAX));
            }
        }
    }
    let mut short: Vec<String> = Vec::new();
    for (dest, pgs) in arrivals_if_out(map, out) {
        let Some(room) = devices.get(&dest) else {
            continue;
        };
        let incoming: u64 = pgs.iter().filter_map(|pg| sizes.get(pg)).sum();
        let free = room.limit.saturating_sub(room.used);
        if incoming > free {
            short.push(format!(
                "{dest} would receive about {} ({} placement groups) with {} free below its \
                 backfill-full limit ({}%)",
                format_size_approx(incoming),
                pgs.len(),
                format_size_approx(free),
                room.full
            ));
        }
    }
    (!short.is_empty()).then(|| {
        format!(
            "too little room: {}; placement groups would stop moving at full devices \
             (backfill_toofull)",
            short.join(", ")
        )
    })
}

/// A node's report and, for each of its devices, what it holds of each PG; `None` when the
/// node does not answer.
async fn report(
    cluster: &Cluster,
    node: NodeId,
) -> Option<(NodeStatus, BTreeMap<DeviceId, Vec<HeldPg>>)> {
    let status = crate::status::node_status(cluster, node).await.ok()?;
    let mut held = BTreeMap::new();
    for d in &status.devices {
        if let Ok(pgs) = crate::device::held_pgs(cluster, node, d.id).await {
            held.insert(d.id, pgs);
        }
    }
    Some((status, held))
}

/// A device's use and room from its node's report.
struct Room {
    used: u64,
    /// Bytes it may hold below its node's backfill-full limit.
    limit: u64,
    full: u8,
}

fn describe(s: &Shortfall, name: Option<&String>) -> String {
    let domain = match s.failure_domain {
        FailureDomain::Host => "host",
        FailureDomain::Device => "device",
    };
    let pool = name.map_or_else(|| s.pool.to_string(), |n| format!("'{n}'"));
    let mut why = Vec::new();
    if s.short > 0 {
        why.push(format!(
            "{} placement groups could not get all their copies (they would stay where they \
             are: the move would never finish)",
            s.short
        ));
    }
    if s.shared > 0 {
        why.push(format!(
            "{} placement groups would keep copies on the same {domain}",
            s.shared
        ));
    }
    format!(
        "pool {pool} ({} copies, failure domain {domain}) with {} {domain}s to use: {}",
        s.replicas,
        s.domains,
        why.join(", and ")
    )
}
