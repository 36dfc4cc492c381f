//! The checks `basalt node drain` and `basalt device out` make before they mark devices out:
//! refused, unless `--force`, when placement would then leave a pool's placement groups short
//! of copies (their move never finishes: they keep serving from where they are) or with copies
//! sharing a failure domain (`basalt_placement::shortfalls_if_out`), or when the data the
//! devices hold would not fit in the room the other devices have below the backfill-full
//! limit (the moves would stop at full devices: `backfill_toofull`).

use anyhow::bail;
use basalt_client::Cluster;
use basalt_placement::{ClusterMap, FailureDomain, Shortfall, shortfalls_if_out};
use basalt_types::size::format_size;
use basalt_types::{DeviceId, NodeId, PoolId};
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

/// What the devices going out hold, against the room the other devices that are in have below
/// their node's backfill-full limit, from the reports of the nodes that answer (a device whose
/// node does not answer counts for nothing on either side); `None` when it fits.
async fn room(cluster: &Cluster, map: &ClusterMap, out: &[DeviceId]) -> Option<String> {
    let mut asked = tokio::task::JoinSet::new();
    for node in map.nodes.keys().copied() {
        let cluster = cluster.clone();
        asked.spawn(async move {
            let status =
                tokio::time::timeout(ASK_LIMIT, crate::status::node_status(&cluster, node)).await;
            (node, status)
        });
    }
    let mut reports: BTreeMap<NodeId, _> = BTreeMap::new();
    while let Some(joined) = asked.join_next().await {
        if let Ok((node, Ok(Ok(status)))) = joined {
            reports.insert(node, status);
        }
    }
    let (mut moving, mut free, mut limit) = (0u64, 0u64, 0u8);
    for status in reports.values() {
        let full = status.recovery.limits.backfill_full_percent;
        limit = limit.max(full);
        for d in &status.devices {
            let is_in = map.devices.get(&d.id).is_some_and(|i| i.r#in);
            if out.contains(&d.id) {
                moving += if is_in { d.used_bytes } else { 0 };
            } else if is_in {
                let cap = d.capacity_bytes / 100 * u64::from(full);
                free += cap.saturating_sub(d.used_bytes);
            }
        }
    }
    (moving > free).then(|| {
        format!(
            "too little room: its devices hold {} and the other devices have {} free below \
             the backfill-full limit ({limit}%), so placement groups would stop moving at full \
             devices (backfill_toofull)",
            format_size(moving),
            format_size(free)
        )
    })
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
