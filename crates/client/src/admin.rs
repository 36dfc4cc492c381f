//! Volume administration: create, list, inspect, resize, delete. Metadata changes go through the
//! catalog; data changes (deleting a volume's objects, cutting them after a shrink) go to the
//! primaries of the pool's PGs.

use crate::cluster::Cluster;
use crate::error::ClientError;
use crate::meta::{PoolRecord, VolumeRecord};
use crate::retry::call_node_with_retry;
use basalt_proto::{Request, Response};
use basalt_types::VolumeId;
use basalt_types::size::format_size;
use std::collections::BTreeSet;

impl Cluster {
    /// Creates a volume of `size` bytes in `pool` (by name).
    pub async fn create_volume(
        &self,
        name: &str,
        size: u64,
        pool: &str,
    ) -> Result<VolumeRecord, ClientError> {
        Ok(self.catalog().create_volume(name, size, pool).await?)
    }

    pub async fn list_volumes(&self) -> Result<Vec<VolumeRecord>, ClientError> {
        Ok(self.catalog().list_volumes().await?)
    }

    pub async fn volume_info(&self, name: &str) -> Result<VolumeRecord, ClientError> {
        self.catalog()
            .get_volume(name)
            .await?
            .ok_or_else(|| ClientError::NoSuchVolume(name.to_string()))
    }

    pub async fn list_pools(&self) -> Result<Vec<PoolRecord>, ClientError> {
        Ok(self.catalog().list_pools().await?)
    }

    /// Changes a volume's size. Shrinking needs `allow_shrink` and discards the data past the
    /// new end. Growing first discards whatever lies past the old end (a handle that had not yet
    /// seen a shrink may have written there), so the new range always reads as zeros.
    pub async fn resize_volume(
        &self,
        name: &str,
        new_size: u64,
        allow_shrink: bool,
    ) -> Result<VolumeRecord, ClientError> {
        let current = self.volume_info(name).await?;
        if new_size < current.size && !allow_shrink {
            return Err(ClientError::InvalidArgument(format!(
                "shrinking '{name}' from {} to {} discards the data past the new end; \
                 pass --allow-shrink to do it",
                format_size(current.size),
                format_size(new_size)
            )));
        }
        crate::meta::validate_volume_size(name, new_size)?;
        if new_size > current.size {
            self.discard(&current, current.size, new_size).await?;
        }
        // Committed only if nobody resized it since `current` was read (the discard above was
        // prepared for that size).
        let record = self
            .catalog()
            .resize_volume_from(name, Some(current.size), new_size)
            .await?;
        if new_size < current.size {
            self.discard(&record, new_size, current.size).await?;
        }
        Ok(record)
    }

    /// Deletes a volume and its data. The record is marked deleting first, so an interrupted
    /// delete can be finished by running it again.
    pub async fn delete_volume(&self, name: &str) -> Result<u64, ClientError> {
        let record = self.catalog().mark_volume_deleting(name).await?;
        let objects = self.delete_objects(&record, 0).await?;
        self.catalog().remove_volume(name).await?;
        Ok(objects)
    }

    /// Makes `[from, upto)` of a volume read as zeros: deletes every object after the one
    /// holding `from`, then zeroes the part of that object that lies in the range. The delete
    /// goes first: each node brings its view of the volume up to date before it deletes (and
    /// from then on refuses a stale writer's writes past the committed end), so the zeroing
    /// after it is final.
    async fn discard(
        &self,
        record: &VolumeRecord,
        from: u64,
        upto: u64,
    ) -> Result<(), ClientError> {
        let pool = self
            .catalog()
            .get_pool(record.pool)
            .await?
            .ok_or_else(|| ClientError::NoSuchPool(record.pool.to_string()))?;
        let os = pool.object_size as u64;
        let keep_objects = from.div_ceil(os);
        let partial = from % os;
        self.delete_objects(record, keep_objects).await?;
        if partial != 0 {
            let oid = basalt_types::ObjectId::new(record.pool, record.id, keep_objects - 1);
            let len = (os - partial).min(upto - from);
            crate::retry::call_primary(self, oid, |epoch| Request::WriteZeroes {
                epoch,
                oid,
                offset: partial as u32,
                len: len as u32,
                fua: true,
                session: basalt_proto::Session::NONE,
            })
            .await?;
        }
        Ok(())
    }

    /// Deletes the objects of a volume with index >= `from_index`: every node that is the
    /// primary of some PG of the pool deletes the objects its PGs hold, as replicated writes.
    /// A PG with no up member makes this wait and then fail (its data must not come back when
    /// its devices return). If the map changes during a pass (a primary moved), the pass runs
    /// again: deleting is idempotent.
    async fn delete_objects(
        &self,
        record: &VolumeRecord,
        from_index: u64,
    ) -> Result<u64, ClientError> {
        let (pool, volume): (_, VolumeId) = (record.pool, record.id);
        loop {
            let map = self.map();
            let nodes = primary_nodes(&map, pool)?;
            let mut total = 0;
            for node in nodes {
                let resp = call_node_with_retry(self, node, |epoch| Request::DeleteVolume {
                    epoch,
                    pool,
                    volume,
                    from_index,
                })
                .await?;
                match resp {
                    Response::Deleted { objects } => total += objects,
                    other => {
                        return Err(ClientError::Protocol(format!(
                            "unexpected answer to DeleteVolume: {other:?}"
                        )));
                    }
                }
            }
            if self.map().epoch == map.epoch {
                return Ok(total);
            }
        }
    }
}

/// The nodes holding the primary of some PG of `pool`; `Unavailable` when a PG has no up member.
fn primary_nodes(
    map: &basalt_placement::ClusterMap,
    pool: basalt_types::PoolId,
) -> Result<BTreeSet<basalt_types::NodeId>, ClientError> {
    let Some(p) = map.pools.get(&pool) else {
        return Ok(BTreeSet::new());
    };
    let mut nodes = BTreeSet::new();
    for (i, entry) in p.pgs.iter().enumerate() {
        let node = map
            .pg_primary(entry)
            .and_then(|d| map.device_node(d))
            .ok_or_else(|| {
                ClientError::Unavailable(format!(
                    "pg.{}.{i} has no up device holding its data; its objects cannot be deleted now",
                    pool.0
                ))
            })?;
        nodes.insert(node);
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use crate::testing::{FakeNode, fixture, map};
    use crate::{ClusterConfig, meta::Catalog};
    use basalt_proto::Request;
    use parking_lot::Mutex;
    use std::sync::Arc;

    const OS: u64 = 128 << 10;

    /// Makes `node` record the volume's size in the catalog when its next request arrives.
    fn size_at_next_request(node: &FakeNode, catalog: &Catalog) -> Arc<Mutex<Option<u64>>> {
        let seen = Arc::new(Mutex::new(None));
        let (catalog, out) = (catalog.clone(), seen.clone());
        *node.before_answer.lock() = Some(Box::pin(async move {
            *out.lock() = Some(catalog.get_volume("v").await.unwrap().unwrap().size);
        }));
        seen
    }

    /// What a discard from `keep` bytes sends, in order: the delete of the objects past the
    /// one holding `keep` (each node then sees the volume's current records before deleting),
    /// then the zeroing of that object's tail.
    fn discard(node: &FakeNode, keep: u64) {
        let seen: Vec<Request> = node.seen.lock().drain(..).collect();
        assert!(
            matches!(
                seen.as_slice(),
                [
                    Request::DeleteVolume { from_index, .. },
                    Request::WriteZeroes { oid, offset, len, .. },
                ] if *from_index == keep.div_ceil(OS)
                    && oid.index == keep / OS
                    && u64::from(*offset) == keep % OS
                    && u64::from(*len) == OS - keep % OS
            ),
            "{seen:?}"
        );
    }

    #[tokio::test]
    async fn a_resize_deletes_before_it_zeroes_and_commits_around_its_discard() {
        let fx = fixture(1, ClusterConfig::default()).await;
        let node = FakeNode::install(&fx.cluster, 1);
        fx.cluster.inner.maps.offer(map(1, &[1]));
        let keep = 3 * OS + 4096;
        // Shrink: the new size is committed before the discard.
        let at_delete = size_at_next_request(&node, &fx.catalog);
        fx.cluster.resize_volume("v", keep, true).await.unwrap();
        discard(&node, keep);
        assert_eq!(*at_delete.lock(), Some(keep));
        // Grow: the discard runs while the old size is still the committed one.
        let at_delete = size_at_next_request(&node, &fx.catalog);
        fx.cluster.resize_volume("v", 1 << 20, false).await.unwrap();
        discard(&node, keep);
        assert_eq!(*at_delete.lock(), Some(keep));
        assert_eq!(fx.cluster.volume_info("v").await.unwrap().size, 1 << 20);
    }
}
