//! The write handlers: fence by epoch, find the primary store, apply. With `fua` the store
//! acknowledges only after the data is durable (group-committed with concurrent writes).
//!
//! Replication (primary forwarding to the other members of the acting set) joins here.

use crate::error::engine_to_wire;
use crate::service::NodeShared;
use basalt_engine::WriteOptions;
use basalt_proto::{Response, WireError};
use basalt_types::{Epoch, ObjectId, Version};
use bytes::Bytes;

fn options(fua: bool, version: Version) -> WriteOptions {
    WriteOptions {
        durable: fua,
        version: (version != Version::NONE).then_some(version),
    }
}

pub(crate) async fn write(
    node: &NodeShared,
    epoch: Epoch,
    oid: ObjectId,
    offset: u32,
    version: Version,
    fua: bool,
    data: Bytes,
) -> Result<Response, WireError> {
    let version = node
        .maps
        .route(epoch, &oid, true)
        .await?
        .write(oid, offset, data, options(fua, version))
        .await
        .map_err(engine_to_wire)?;
    Ok(Response::Written { version })
}

pub(crate) async fn write_zeroes(
    node: &NodeShared,
    epoch: Epoch,
    oid: ObjectId,
    offset: u32,
    len: u32,
    fua: bool,
) -> Result<Response, WireError> {
    let version = node
        .maps
        .route(epoch, &oid, true)
        .await?
        .write_zeroes(oid, offset, len, options(fua, Version::NONE))
        .await
        .map_err(engine_to_wire)?;
    Ok(Response::Written { version })
}

pub(crate) async fn trim(
    node: &NodeShared,
    epoch: Epoch,
    oid: ObjectId,
    offset: u32,
    len: u32,
) -> Result<Response, WireError> {
    let version = node
        .maps
        .route(epoch, &oid, true)
        .await?
        .trim(oid, offset, len, options(false, Version::NONE))
        .await
        .map_err(engine_to_wire)?;
    Ok(Response::Written { version })
}
