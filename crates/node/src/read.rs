//! The read handler: fence by epoch, find the PG this node is the primary of, read (the store
//! verifies every 4 KiB block's CRC-32C; a read of an object with a write not yet on every
//! member waits for it; a copy that fails its checksum is repaired from another member first:
//! `pg/repair.rs`).

use crate::service::NodeShared;
use basalt_proto::{Response, WireError};
use basalt_types::{Epoch, ObjectId};

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
