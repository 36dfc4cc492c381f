//! Deleting a volume's objects (volume delete, and the tail after a shrink) on every local store.
//!
//! Before removing anything the node brings its view of the volume records up to date and
//! waits for the writes it admitted under an older view (`volumes/mod.rs`,
//! `Volumes::before_delete`): the client marked the volume deleting (or committed the shrink)
//! before sending this, so from here on a stale writer's writes to the range are refused, and
//! none admitted before can land after the removal. A delete that would remove data inside an active volume's current size
//! (a discard prepared for a size a concurrent resize has since changed) is refused.

use crate::error::engine_to_wire;
use crate::service::NodeShared;
use basalt_engine::Store;
use basalt_proto::{Response, WireError};
use basalt_types::{Epoch, PoolId, VolumeId};

pub(crate) async fn delete_volume(
    node: &NodeShared,
    epoch: Epoch,
    pool: PoolId,
    volume: VolumeId,
    from_index: u64,
) -> Result<Response, WireError> {
    let map = node.maps.admit(epoch).await?;
    let object_size = map.pools.get(&pool).map(|p| p.object_size);
    node.volumes
        .before_delete(pool, volume, from_index, object_size)
        .await?;
    let mut objects = 0;
    for store in node.maps.stores().values() {
        objects += delete_from(store, pool, volume, from_index)
            .await
            .map_err(engine_to_wire)?;
    }
    Ok(Response::Deleted { objects })
}

async fn delete_from(
    store: &Store,
    pool: PoolId,
    volume: VolumeId,
    from_index: u64,
) -> Result<u64, basalt_engine::EngineError> {
    // Pages through the volume's objects (never the whole store) and flushes once at the end.
    store.delete_volume_from(pool, volume, from_index).await
}
