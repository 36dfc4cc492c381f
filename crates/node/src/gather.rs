//! The leader's view of the cluster: the placement input read from the catalog.

use basalt_meta::{Catalog, MetaError, OutReason, Revision};
use basalt_placement::{DeviceInfo, NodeInfo, PlacementInput, PoolSpec};
use basalt_types::{Epoch, NodeId, PgId};

/// The placement input, and the PG-ready reports it includes (with their revisions, so that
/// exactly those are deleted once considered; and the interval each holds for, if it names
/// one), and the failure reports (reporter, accused).
pub(crate) struct Gathered {
    pub input: PlacementInput,
    pub reports: Vec<(PgId, Revision)>,
    pub intervals: Vec<(PgId, Epoch)>,
    pub failures: Vec<(NodeId, NodeId)>,
}

/// Every pool, every device (reported up or down by its node, in or out), every live node,
/// every PG-ready report, every failure report; `now` in unix seconds.
pub(crate) async fn gather(catalog: &Catalog, now: u64) -> Result<Gathered, MetaError> {
    let mut input = PlacementInput {
        now,
        ..PlacementInput::default()
    };
    for n in catalog.list_nodes().await? {
        input.nodes.insert(n.id, NodeInfo { addr: n.addr });
    }
    for d in catalog.list_devices().await? {
        let info = DeviceInfo {
            node: d.node,
            up: d.reported_up(),
            r#in: d.is_in(),
            auto_out: d.out == Some(OutReason::Auto),
            down_since: None,
            weight: d.weight,
            object_size: d.object_size,
            class: d.class,
        };
        input.devices.insert(d.id, info);
    }
    for p in catalog.list_pools().await? {
        let spec = PoolSpec {
            pg_count: p.pg_count,
            replicas: p.replicas,
            min_size: p.min_size,
            object_size: p.object_size,
            failure_domain: p.failure_domain,
            device_class: p.device_class,
        };
        input.pools.insert(p.id, spec);
    }
    let (mut reports, mut intervals) = (Vec::new(), Vec::new());
    for (r, revision) in catalog.list_pg_ready().await? {
        reports.push((r.pg, revision));
        intervals.extend(r.interval.map(|i| (r.pg, i)));
        input.ready.insert(r.pg, r.up);
    }
    let failures = catalog
        .list_failure_reports()
        .await?
        .into_iter()
        .map(|r| (r.reporter, r.accused))
        .collect();
    Ok(Gathered {
        input,
        reports,
        intervals,
        failures,
    })
}

/// Drops from `input` the PG-ready reports made in another interval than the PG's in `map` (the
/// leader's current map): a primary of an older term finished its backfill after the PG moved
/// on, and the newer interval's primary reports for itself. (Applied, such a report could put
/// into the acting set a device that missed what the newer interval wrote, after that
/// interval's history no longer names the older one.)
pub(crate) fn drop_stale_reports(
    input: &mut PlacementInput,
    intervals: &[(PgId, Epoch)],
    map: Option<&basalt_placement::ClusterMap>,
) {
    for (pg, interval) in intervals {
        let current = map.and_then(|m| m.pg(*pg)).map(|e| e.since);
        if current != Some(*interval) && input.ready.remove(pg).is_some() {
            tracing::info!(%pg, %interval, ?current, "a PG-ready report of an older interval: not applied");
        }
    }
}
