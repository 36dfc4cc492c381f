//! The write handlers: fence by epoch, find the PG this node is the primary of, and let it
//! order, version and replicate the write (`pg/primary.rs`). With `fua`, or when the PG has other
//! members, the write is acknowledged only once it is durable on every one of them.

use crate::pg::WriteKind;
use crate::service::NodeShared;
use basalt_proto::{Response, WireError};
use basalt_types::{Epoch, ObjectId, Version};
use bytes::Bytes;

pub(crate) async fn write(
    node: &NodeShared,
    epoch: Epoch,
    oid: ObjectId,
    offset: u32,
    _version: Version,
    fua: bool,
    data: Bytes,
) -> Result<Response, WireError> {
    let kind = WriteKind::Data { offset, data };
    apply(node, epoch, oid, kind, fua).await
}

pub(crate) async fn write_zeroes(
    node: &NodeShared,
    epoch: Epoch,
    oid: ObjectId,
    offset: u32,
    len: u32,
    fua: bool,
) -> Result<Response, WireError> {
    let kind = WriteKind::Zeroes { offset, len };
    apply(node, epoch, oid, kind, fua).await
}

pub(crate) async fn trim(
    node: &NodeShared,
    epoch: Epoch,
    oid: ObjectId,
    offset: u32,
    len: u32,
) -> Result<Response, WireError> {
    let kind = WriteKind::Zeroes { offset, len };
    apply(node, epoch, oid, kind, false).await
}

async fn apply(
    node: &NodeShared,
    epoch: Epoch,
    oid: ObjectId,
    kind: WriteKind,
    fua: bool,
) -> Result<Response, WireError> {
    let pg = node.primary_pg(epoch, &oid).await?;
    let version = pg.write(&node.pgs.ctx, epoch, oid, kind, fua).await?;
    Ok(Response::Written { version })
}
