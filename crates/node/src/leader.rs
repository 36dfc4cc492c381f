//! The leader: one node at a time (elected through a lease on `/basalt/leader`) computes the
//! placement of every pool from the registered pools, devices and live nodes, and publishes a new
//! cluster map whenever that placement changes.

use basalt_meta::{Catalog, DeviceState, Leadership, MetaError, WatchEvent, keys};
use basalt_placement::{ClusterMap, DeviceInfo, NodeInfo, PlacementInput, PoolSpec, compute};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::sync::watch;

/// Campaigns for leadership until `stop`; while leader, keeps the map up to date.
pub(crate) async fn run(
    catalog: Catalog,
    name: String,
    ttl: Duration,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let elected = tokio::select! {
            l = catalog.elect(&name, ttl) => l,
            _ = stop.wait_for(|s| *s) => return,
        };
        let leadership = match elected {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("leader election failed: {e}; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        };
        tracing::info!(%name, "became the cluster leader");
        if let Err(e) = lead(&catalog, &leadership, &mut stop).await {
            tracing::warn!("leading failed: {e}; campaigning again");
        }
        let stopping = *stop.borrow();
        let _ = leadership.resign().await;
        if stopping {
            return;
        }
    }
}

async fn lead(
    catalog: &Catalog,
    leadership: &Leadership,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), MetaError> {
    // Watch first, then compute: no change can slip between the two.
    let mut events = catalog.store().watch_prefix(keys::ROOT, 0).await?;
    loop {
        publish_if_changed(catalog, leadership).await?;
        let event = tokio::select! {
            ev = events.recv() => ev,
            _ = leadership.lost() => return Ok(()),
            _ = stop.wait_for(|s| *s) => return Ok(()),
        };
        match event {
            Some(WatchEvent::Put(_)) | Some(WatchEvent::Delete(_)) => {
                // Coalesce a burst of changes into one recomputation.
                while events.try_recv().is_ok() {}
            }
            Some(WatchEvent::Lost(why)) => {
                tracing::debug!("leader watch lost ({why}); re-watching");
                events = catalog.store().watch_prefix(keys::ROOT, 0).await?;
            }
            None => events = catalog.store().watch_prefix(keys::ROOT, 0).await?,
        }
    }
}

/// Computes the placement from the catalog and publishes it if it differs from the current map.
pub(crate) async fn publish_if_changed(
    catalog: &Catalog,
    leadership: &Leadership,
) -> Result<(), MetaError> {
    let prev = catalog.get_map::<ClusterMap>().await?;
    let input = gather(catalog).await?;
    let next = compute(prev.as_ref().map(|(m, _)| m), &input);
    let prev_epoch = prev.as_ref().map(|(m, _)| m.epoch);
    if prev_epoch == Some(next.epoch) {
        return Ok(());
    }
    match catalog
        .put_map_as_leader(&next, prev.map(|(_, rev)| rev), leadership)
        .await
    {
        Ok(_) => {
            tracing::info!(epoch = %next.epoch, "published cluster map");
            Ok(())
        }
        // Someone changed the map meanwhile; the watch brings us back here.
        Err(MetaError::MapConflict { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The placement input: every pool, every device (up when its node is alive and its state is
/// Up), every live node.
async fn gather(catalog: &Catalog) -> Result<PlacementInput, MetaError> {
    let nodes = catalog.list_nodes().await?;
    let alive: BTreeSet<_> = nodes.iter().map(|n| n.id).collect();
    let mut input = PlacementInput::default();
    for n in nodes {
        input.nodes.insert(n.id, NodeInfo { addr: n.addr });
    }
    for d in catalog.list_devices().await? {
        input.devices.insert(
            d.id,
            DeviceInfo {
                node: d.node,
                class: d.class,
                weight: d.weight,
                up: alive.contains(&d.node) && d.state == DeviceState::Up,
                r#in: d.state != DeviceState::Out,
            },
        );
    }
    for p in catalog.list_pools().await? {
        input.pools.insert(
            p.id,
            PoolSpec {
                pg_count: p.pg_count,
                replicas: p.replicas,
                object_size: p.object_size,
                failure_domain: p.failure_domain,
                device_class: p.device_class,
            },
        );
    }
    Ok(input)
}
