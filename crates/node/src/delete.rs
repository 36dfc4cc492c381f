//! Deleting a volume's objects (volume delete, and the tail after a shrink) on every local store.

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
    node.maps.admit(epoch).await?;
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
