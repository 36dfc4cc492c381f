//! Removing devices and nodes for good (`basalt device remove`, `basalt node remove`): refused,
//! saying why, while anything may still need their data; done by one compare-and-swap
//! transaction of the catalog that also leaves a mark, so the removed ids never register again
//! (`basalt_meta`'s `remove.rs`).

use crate::cluster::Cluster;
use crate::error::ClientError;
use basalt_meta::{Catalog, DeviceRecord, DeviceState, IdKind};
use basalt_placement::ClusterMap;
use basalt_types::{DeviceId, NodeId, PgId};

impl Cluster {
    /// Forgets device `id` for good (`basalt device remove`): a drive replaced or retired, once
    /// nothing needs it. Refused (`InvalidArgument`, saying why) unless it is out, down (in its
    /// record and in the current map), left behind by its node (the node started without it:
    /// a drive still attached would fail the node's next start), in no placement group's `up`
    /// or acting set, and named by no placement group's history (a PG that is not clean yet may
    /// need its data to peer). Returns its last record.
    pub async fn remove_device(&self, id: DeviceId) -> Result<DeviceRecord, ClientError> {
        let catalog = self.catalog();
        let refuse = |why: String| ClientError::InvalidArgument(format!("{id} stays: {why}"));
        let Some(rec) = catalog.get_device(id).await? else {
            return Err(refuse(match catalog.removed_device(id).await? {
                Some(_) => "it was removed already".into(),
                None => "there is no such device".into(),
            }));
        };
        let map = current_map(catalog).await?;
        if map.is_up(id) || rec.state != DeviceState::Down {
            return Err(refuse(
                "it is up: its node still serves it (take it off the node first)".into(),
            ));
        }
        if !rec.left_behind() {
            return Err(refuse(
                "its node has not started without it: take it off the node (out of the node's \
                 devices, then restart the node) first"
                    .into(),
            ));
        }
        if let Some((_, why)) = needed(catalog, &map, &[&rec]).await? {
            return Err(refuse(why));
        }
        match catalog.remove_device(&rec).await? {
            true => Ok(rec),
            false => Err(refuse("its record changed meanwhile; try again".into())),
        }
    }

    /// Forgets node `id` and every device of it for good (`basalt node remove`): a host that
    /// died or was retired, once nothing needs it. Refused (`InvalidArgument`, saying why)
    /// unless the node is not registered (not running, or its lease ran out) and each of its
    /// devices is out, down in the current map, in no placement group's `up` or acting set
    /// and named by no placement group's history. Returns the devices' last records.
    pub async fn remove_node(&self, id: NodeId) -> Result<Vec<DeviceRecord>, ClientError> {
        let catalog = self.catalog();
        let refuse = |why: String| ClientError::InvalidArgument(format!("{id} stays: {why}"));
        if catalog.removed_node(id).await?.is_some() {
            return Err(refuse("it was removed already".into()));
        }
        if u64::from(id.0) > catalog.last_id(IdKind::Node).await? || id.0 == 0 {
            return Err(refuse("there is no such node".into()));
        }
        if catalog.get_node(id).await?.is_some() {
            return Err(refuse(format!(
                "it is running (registered); move its data off (`basalt node drain {0}`), \
                 then stop it first",
                id.0
            )));
        }
        let listed = catalog.node_devices(id).await?;
        let map = current_map(catalog).await?;
        if let Some(d) = listed.devices.iter().find(|d| map.is_up(d.id)) {
            return Err(refuse(format!(
                "its device {} is still up in the cluster map (a node that just stopped is \
                 marked down within its lease TTL); try again",
                d.id
            )));
        }
        let devices: Vec<&DeviceRecord> = listed.devices.iter().collect();
        if let Some((d, why)) = needed(catalog, &map, &devices).await? {
            return Err(refuse(format!("its device {d}: {why}")));
        }
        match catalog.remove_node(&listed).await? {
            true => Ok(listed.devices),
            false => Err(refuse(
                "it registered, or one of its devices changed or was added, meanwhile; try again"
                    .into(),
            )),
        }
    }
}

impl Cluster {
    /// The placement groups whose history (intervals since they were last clean) names one of
    /// `devices`: until none does, a PG may still need their copies to peer (a drain is done
    /// only then).
    pub async fn pgs_naming(&self, devices: &[DeviceId]) -> Result<usize, ClientError> {
        let catalog = self.catalog();
        let map = current_map(catalog).await?;
        Ok(named_in_histories(catalog, &map, devices).await?.len())
    }
}

async fn current_map(catalog: &Catalog) -> Result<ClusterMap, ClientError> {
    Ok(catalog
        .get_map::<ClusterMap>()
        .await?
        .map(|(m, _)| m)
        .unwrap_or_default())
}

/// Which one of `devices` may still be needed (its data, or its place), if one may, and why:
/// it is in, a placement group maps it (up or acting), or a PG's history names it (a PG that
/// is not clean yet may need its data to peer).
async fn needed(
    catalog: &Catalog,
    map: &ClusterMap,
    devices: &[&DeviceRecord],
) -> Result<Option<(DeviceId, String)>, ClientError> {
    if let Some(d) = devices.iter().find(|d| d.out.is_none()) {
        let why = format!(
            "it is in; mark it out first (`basalt device out {}`, or `basalt node drain` for \
             all of a node's) and wait until its placement groups have moved",
            d.id.0
        );
        return Ok(Some((d.id, why)));
    }
    let ids: Vec<DeviceId> = devices.iter().map(|d| d.id).collect();
    for (pg, entry) in pgs(map) {
        let placed = entry.up.iter().chain(&entry.acting);
        if let Some(d) = placed.into_iter().find(|d| ids.contains(d)) {
            return Ok(Some((*d, format!("{pg} still maps it (up or acting)"))));
        }
    }
    let named = named_in_histories(catalog, map, &ids).await?;
    Ok(named.first().map(|(pg, d)| {
        let why = format!("{pg}'s history still names it (the PG is not clean yet)");
        (*d, why)
    }))
}

/// Every placement group of `map`.
fn pgs(map: &ClusterMap) -> impl Iterator<Item = (PgId, &basalt_placement::PgMap)> {
    map.pools.iter().flat_map(|(pool, p)| {
        p.pgs.iter().enumerate().map(|(i, entry)| {
            let pg = PgId {
                pool: *pool,
                pg: i as u32,
            };
            (pg, entry)
        })
    })
}

/// Each placement group whose history (intervals since it was last clean) names one of `ids`,
/// with the first such device; every PG's history is read once.
async fn named_in_histories(
    catalog: &Catalog,
    map: &ClusterMap,
    ids: &[DeviceId],
) -> Result<Vec<(PgId, DeviceId)>, ClientError> {
    let mut found = Vec::new();
    for (pg, _) in pgs(map) {
        let (history, _) = catalog.get_pg_history(pg).await?;
        if let Some(d) = history.devices().into_iter().find(|d| ids.contains(d)) {
            found.push((pg, d));
        }
    }
    Ok(found)
}
