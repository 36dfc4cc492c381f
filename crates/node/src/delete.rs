//! Deleting a volume's objects (volume delete, and the tail after a shrink): every PG whose
//! primary is a device of this node deletes the volume's objects it holds, as replicated
//! writes, so every member keeps the same tombstones at the same versions.
//!
//! Before removing anything the node brings its view of the volume records up to date and
//! waits for the writes it admitted under an older view (`volumes/mod.rs`,
//! `Volumes::before_delete`): the client marked the volume deleting (or committed the shrink)
//! before sending this, so from here on a stale writer's writes to the range are refused, and
//! none admitted before can land after the removal. A delete that would remove data inside an
//! active volume's current size (a discard prepared for a size a concurrent resize has since
//! changed) is refused, checked again before each page of objects it removes (a discard whose
//! client gave up goes on in its task while the volume may be grown again), and a delete
//! counts in flight while it removes, so a later one (a grow's discard) waits for it.

use crate::service::NodeShared;
use basalt_proto::{Response, WireError};
use basalt_types::{Epoch, PgId, PoolId, VolumeId};

pub(crate) async fn delete_volume(
    node: &NodeShared,
    epoch: Epoch,
    pool: PoolId,
    volume: VolumeId,
    from_index: u64,
) -> Result<Response, WireError> {
    let map = node.maps.admit(epoch).await?;
    let object_size = map.pools.get(&pool).map(|p| p.object_size);
    let _removing = node
        .volumes
        .before_delete(pool, volume, from_index, object_size)
        .await?;
    let still = || {
        node.volumes
            .admit_delete(pool, volume, from_index, object_size)
    };
    let mut objects = 0;
    let Some(p) = map.pools.get(&pool) else {
        return Ok(Response::Deleted { objects });
    };
    for (i, entry) in p.pgs.iter().enumerate() {
        let id = PgId { pool, pg: i as u32 };
        let Some(dev) = map.pg_primary(entry) else {
            continue;
        };
        if node.maps.stores().contains_key(&dev) {
            let pg = node.pgs.get(dev, id).expect("a local device");
            objects += pg
                .delete_volume(&node.pgs.ctx, epoch, volume, from_index, &still)
                .await?;
        }
    }
    Ok(Response::Deleted { objects })
}
