//! The write handlers: fence by epoch, find the primary store, check the volume (it exists, and
//! a write ends within its size: `volumes/mod.rs`), apply. With `fua` the store acknowledges
//! only after the data is durable (group-committed with concurrent writes).
//!
//! Replication (primary forwarding to the other members of the acting set) joins here.

use crate::error::engine_to_wire;
use crate::service::NodeShared;
use basalt_engine::WriteOptions;
use basalt_proto::{Response, WireError};
use basalt_types::{Epoch, ObjectId, Version};
use bytes::Bytes;

/// The store options of a client write: durable with FUA, the version if the sender set one,
/// and the object's PG (an object's PG never changes: a pool's PG count is fixed).
fn options(node: &NodeShared, oid: &ObjectId, fua: bool, version: Version) -> WriteOptions {
    let pg = node.maps.map().locate(oid).map_or(0, |(pg, _)| pg.pg);
    WriteOptions {
        durable: fua,
        version: (version != Version::NONE).then_some(version),
        pg,
        pending: false,
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
    let store = node.maps.route(epoch, &oid, true).await?;
    let object_size = store.info().object_size;
    let _admitted = node
        .volumes
        .admit_write(&oid, offset, data.len(), object_size)
        .await?;
    let version = store
        .write(oid, offset, data, options(node, &oid, fua, version))
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
    let store = node.maps.route(epoch, &oid, true).await?;
    node.volumes.admit_discard(&oid).await?;
    let version = store
        .write_zeroes(oid, offset, len, options(node, &oid, fua, Version::NONE))
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
    let store = node.maps.route(epoch, &oid, true).await?;
    node.volumes.admit_discard(&oid).await?;
    let version = store
        .trim(oid, offset, len, options(node, &oid, false, Version::NONE))
        .await
        .map_err(engine_to_wire)?;
    Ok(Response::Written { version })
}
