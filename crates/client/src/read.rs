//! The read path: [`Volume::read`].

use crate::error::ClientError;
use crate::retry::{call_primary, call_read};
use crate::split::{Piece, split};
use crate::volume::Volume;
use basalt_placement::ClusterMap;
use basalt_proto::{Request, Response};
use basalt_types::{DeviceId, NodeId, ObjectId};
use bytes::{Bytes, BytesMut};

impl Volume {
    /// Reads `len` bytes at `offset`. Never-written ranges read as zeros.
    pub async fn read(&self, offset: u64, len: u32) -> Result<Bytes, ClientError> {
        self.check_range(offset, len as u64)?;
        let mut pieces = split(offset, len as u64, self.object_size);
        let Some(first) = pieces.next() else {
            return Ok(Bytes::new());
        };
        let Some(second) = pieces.next() else {
            // The common case: the range lies inside one object; no copy.
            return self.read_piece(first).await;
        };
        let all: Vec<Piece> = [first, second].into_iter().chain(pieces).collect();
        let parts = futures::future::try_join_all(all.iter().map(|p| self.read_piece(*p))).await?;
        let mut out = BytesMut::with_capacity(len as usize);
        for part in parts {
            out.extend_from_slice(&part);
        }
        Ok(out.freeze())
    }

    async fn read_piece(&self, p: Piece) -> Result<Bytes, ClientError> {
        let oid = ObjectId::new(self.pool, self.id, p.index);
        let read = |epoch| Request::Read {
            epoch,
            oid,
            offset: p.offset,
            len: p.len,
        };
        let resp = match self.cluster.reads_near() {
            false => call_primary(&self.cluster, oid, read).await?,
            true => {
                let near = |map: &ClusterMap| self.near_copy(map, oid, p);
                call_read(&self.cluster, oid, &near, read).await?
            }
        };
        match resp {
            Response::Read { data, .. } if data.len() == p.len as usize => Ok(data),
            Response::Read { data, .. } => Err(ClientError::Protocol(format!(
                "node returned {} bytes for a {}-byte read of {oid}",
                data.len(),
                p.len
            ))),
            other => Err(ClientError::Protocol(format!(
                "unexpected answer to Read: {other:?}"
            ))),
        }
    }

    /// The near node ([`crate::Cluster::read_near`]) holding a copy of `oid` as a serving
    /// member of its PG in `map` that is not the primary, and the request for that copy;
    /// `None` when there is none (or the primary is near itself).
    fn near_copy(&self, map: &ClusterMap, oid: ObjectId, p: Piece) -> Option<(NodeId, Request)> {
        let cluster = &self.cluster;
        let (_, entry) = map.locate(&oid)?;
        let near = |d: &DeviceId| map.device_node(*d).is_some_and(|n| cluster.is_near(n));
        let mut serving = map.serving(entry);
        if near(&serving.next()?) {
            return None;
        }
        let node = map.device_node(serving.find(near)?)?;
        let req = Request::ReadReplica {
            epoch: map.epoch,
            oid,
            offset: p.offset,
            len: p.len,
        };
        Some((node, req))
    }
}
