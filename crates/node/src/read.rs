//! The read handler: fence by epoch, find the primary store, read and verify (the store checks
//! every 4 KiB block's CRC-32C before returning it).

use crate::error::engine_to_wire;
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
    let data = node
        .maps
        .route(epoch, &oid, false)
        .await?
        .read(oid, offset, len)
        .await
        .map_err(engine_to_wire)?;
    Ok(Response::Read { data })
}
