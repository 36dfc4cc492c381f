//! The write handlers: fence by epoch, find the PG this node is the primary of, check the volume
//! (it exists, and a write ends within its size: `volumes/mod.rs`), and let the PG order,
//! version and replicate the write (`pg/primary.rs`). With `fua`, or when the PG has other
//! members, the write is acknowledged only once it is durable on every one of them. The
//! client's session is noted first (`sessions.rs`): its older attempts are not versioned after.

use crate::pg::WriteKind;
use crate::service::NodeShared;
use basalt_proto::{Response, Session, WireError};
use basalt_types::{Epoch, ObjectId, Version};
use bytes::Bytes;

pub(crate) async fn write(
    node: &NodeShared,
    epoch: Epoch,
    oid: ObjectId,
    offset: u32,
    fua: bool,
    data: Bytes,
    session: Session,
) -> Result<Response, WireError> {
    // First: the client's older attempts are over before this one waits for anything.
    node.pgs.ctx.sessions.arrived(session);
    let pg = node.primary_pg(epoch, &oid).await?;
    let object_size = pg.store.info().object_size;
    // Held until the write is done: a volume delete waits for admitted writes.
    let _admitted = node
        .volumes
        .admit_write(&oid, offset, data.len(), object_size)
        .await?;
    let kind = WriteKind::Data { offset, data };
    let (version, durable) = pg
        .write(&node.pgs.ctx, epoch, session, oid, kind, fua)
        .await?;
    Ok(node.written(version, durable))
}

pub(crate) async fn write_zeroes(
    node: &NodeShared,
    epoch: Epoch,
    oid: ObjectId,
    offset: u32,
    len: u32,
    fua: bool,
    session: Session,
) -> Result<Response, WireError> {
    let kind = WriteKind::Zeroes { offset, len };
    zero(node, epoch, session, oid, kind, fua).await
}

pub(crate) async fn trim(
    node: &NodeShared,
    epoch: Epoch,
    oid: ObjectId,
    offset: u32,
    len: u32,
    session: Session,
) -> Result<Response, WireError> {
    let kind = WriteKind::Zeroes { offset, len };
    zero(node, epoch, session, oid, kind, false).await
}

/// Write-zeroes and trim may reach past a shrunk end (a discard does): only the volume's
/// existence is checked.
async fn zero(
    node: &NodeShared,
    epoch: Epoch,
    session: Session,
    oid: ObjectId,
    kind: WriteKind,
    fua: bool,
) -> Result<Response, WireError> {
    node.pgs.ctx.sessions.arrived(session);
    let pg = node.primary_pg(epoch, &oid).await?;
    // Held until the write is done, as a data write's.
    let _admitted = node.volumes.admit_discard(&oid).await?;
    let (version, durable) = pg
        .write(&node.pgs.ctx, epoch, session, oid, kind, fua)
        .await?;
    Ok(node.written(version, durable))
}

impl NodeShared {
    /// A write's answer: its version, and the node's incarnation it was acknowledged in, or 0
    /// when it is durable already (no flush owes it anything).
    fn written(&self, version: Version, durable: bool) -> Response {
        Response::Written {
            version,
            incarnation: if durable { 0 } else { self.incarnation },
        }
    }
}
