//! The check `basalt node drain` and `basalt device out` make before they mark devices out:
//! refused, unless `--force`, when placement would then leave a pool's placement groups short
//! of copies (their move never finishes: they keep serving from where they are) or with copies
//! sharing a failure domain (`basalt_placement::shortfalls_if_out`).

use anyhow::bail;
use basalt_meta::Catalog;
use basalt_placement::{ClusterMap, FailureDomain, Shortfall, shortfalls_if_out};
use basalt_types::{DeviceId, PoolId};
use std::collections::BTreeMap;

/// Refuses `what` (e.g. "draining node.3") when marking `out` out would leave a pool worse
/// placed; with `force` it only warns.
pub async fn check(
    catalog: &Catalog,
    out: &[DeviceId],
    what: &str,
    force: bool,
) -> anyhow::Result<()> {
    let Some((map, _)) = catalog.get_map::<ClusterMap>().await? else {
        return Ok(());
    };
    let found = shortfalls_if_out(&map, out);
    if found.is_empty() {
        return Ok(());
    }
    let names: BTreeMap<PoolId, String> = catalog
        .list_pools()
        .await?
        .into_iter()
        .map(|p| (p.id, p.name))
        .collect();
    let pools: Vec<String> = found
        .iter()
        .map(|s| describe(s, names.get(&s.pool)))
        .collect();
    let pools = pools.join("; ");
    if force {
        eprintln!("warning: {what} leaves {pools}; going ahead (--force)");
        return Ok(());
    }
    bail!(
        "{what} would leave {pools}. Add a node or devices first (or pass --force to do it \
         anyway); nothing was marked out"
    )
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
