//! Deleting a volume's objects (volume delete, and the tail after a shrink) on every local store.

use crate::error::engine_to_wire;
use crate::service::NodeShared;
use basalt_engine::{Store, WriteOptions};
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
    if from_index == 0 {
        return store.delete_volume(pool, volume).await;
    }
    let victims: Vec<_> = store
        .list_objects()
        .await?
        .into_iter()
        .filter(|o| o.oid.pool == pool && o.oid.volume == volume && o.oid.index >= from_index)
        .collect();
    let lazy = WriteOptions {
        durable: false,
        version: None,
    };
    for o in &victims {
        store.delete(o.oid, lazy).await?;
    }
    // One flush makes every delete above durable.
    store.flush().await?;
    Ok(victims.len() as u64)
}
