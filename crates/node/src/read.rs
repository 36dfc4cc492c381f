//! The read handlers: fence by epoch, then read on the PG's primary (the store verifies every
//! 4 KiB block's CRC-32C; a read of an object with a write not yet on every member waits for
//! it; a copy that fails its checksum is repaired from another member first: `pg/repair.rs`),
//! or from this node's own copy as a serving member (`pg/replica_read.rs`: refused unless that
//! copy may answer now; the client then reads from the primary).

use crate::service::NodeShared;
use basalt_proto::{ErrorCode, Response, WireError};
use basalt_types::{Epoch, ObjectId};
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) async fn read(
    node: &NodeShared,
    epoch: Epoch,
    oid: ObjectId,
    offset: u32,
    len: u32,
) -> Result<Response, WireError> {
    let pg = node.primary_pg(epoch, &oid).await?;
    let data = pg.read(&node.pgs.ctx, oid, offset, len).await?;
    Ok(Response::Read { data })
}

pub(crate) async fn read_replica(
    node: &NodeShared,
    epoch: Epoch,
    oid: ObjectId,
    offset: u32,
    len: u32,
) -> Result<Response, WireError> {
    // No wait for a newer map, as `admit` does: the client reads from the primary at once.
    let map = node.maps.map();
    let answer = match (map.epoch == epoch)
        .then_some(())
        .ok_or_else(|| {
            WireError::new(
                ErrorCode::Busy,
                format!("at map epoch {}, not {}", map.epoch.0, epoch.0),
            )
        })
        .and_then(|()| node.pgs.replica_of(&map, &oid))
    {
        Ok(pg) => pg.read_replica(&node.pgs.ctx, oid, offset, len).await,
        Err(e) => Err(e),
    };
    let counter = match &answer {
        Ok(_) => &node.replica_reads.served,
        Err(e) => {
            tracing::debug!(%oid, "read of this node's copy refused: {}", e.message);
            &node.replica_reads.refused
        }
    };
    counter.fetch_add(1, Ordering::Relaxed);
    Ok(Response::Read { data: answer? })
}

/// Reads this node answered from its own copies as a serving member (`ReadReplica`), and
/// those it refused (the client read them from the primary instead).
#[derive(Debug, Default)]
pub(crate) struct ReplicaReads {
    pub served: AtomicU64,
    pub refused: AtomicU64,
}
