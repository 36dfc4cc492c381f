//! The write path: [`Volume::write`], [`Volume::write_zeroes`], [`Volume::trim`],
//! [`Volume::flush`].

use crate::error::ClientError;
use crate::retry::{call_node_with_retry, call_primary};
use crate::split::split;
use crate::volume::{Durability, Volume};
use basalt_proto::{Request, Response};
use basalt_types::{NodeId, ObjectId};
use bytes::Bytes;
use std::collections::BTreeSet;

impl Volume {
    /// Writes `data` at `offset`. With `fua`, or in [`Durability::Sync`], the data is durable when
    /// this returns. Each object-sized piece is atomic; a write spanning objects is not.
    pub async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), ClientError> {
        self.check_range(offset, data.len() as u64)?;
        let fua = fua || self.durability == Durability::Sync;
        let pieces = split(offset, data.len() as u64, self.object_size).map(|p| {
            let oid = ObjectId::new(self.pool, self.id, p.index);
            let start = p.range_offset as usize;
            let slice = data.slice(start..start + p.len as usize);
            async move {
                let resp = call_primary(&self.cluster, oid, |epoch| Request::Write {
                    epoch,
                    oid,
                    offset: p.offset,
                    version: basalt_types::Version::NONE,
                    fua,
                    data: slice.clone(),
                })
                .await?;
                expect_written(resp)
            }
        });
        join_pieces(pieces).await
    }

    /// Makes `[offset, offset + len)` read as zeros without sending zeros (space is released).
    pub async fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), ClientError> {
        self.check_range(offset, len)?;
        let fua = fua || self.durability == Durability::Sync;
        let pieces = split(offset, len, self.object_size).map(|p| {
            let oid = ObjectId::new(self.pool, self.id, p.index);
            async move {
                let resp = call_primary(&self.cluster, oid, |epoch| Request::WriteZeroes {
                    epoch,
                    oid,
                    offset: p.offset,
                    len: p.len,
                    fua,
                })
                .await?;
                expect_written(resp)
            }
        });
        join_pieces(pieces).await
    }

    /// Discards `[offset, offset + len)`: afterwards the range reads as zeros and its space is free.
    pub async fn trim(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        self.check_range(offset, len)?;
        let pieces = split(offset, len, self.object_size).map(|p| {
            let oid = ObjectId::new(self.pool, self.id, p.index);
            async move {
                let resp = call_primary(&self.cluster, oid, |epoch| Request::Trim {
                    epoch,
                    oid,
                    offset: p.offset,
                    len: p.len,
                })
                .await?;
                expect_written(resp)
            }
        });
        join_pieces(pieces).await
    }

    /// Makes every write acknowledged before this call durable, on every node that holds a
    /// primary of this volume's pool.
    pub async fn flush(&self) -> Result<(), ClientError> {
        let nodes = primary_nodes(&self.cluster.map(), self.pool);
        let flushes = nodes.into_iter().map(|node| async move {
            match call_node_with_retry(&self.cluster, node, |epoch| Request::Flush { epoch })
                .await?
            {
                Response::Flushed => Ok(()),
                other => Err(ClientError::Protocol(format!(
                    "unexpected answer to Flush: {other:?}"
                ))),
            }
        });
        join_pieces(flushes).await
    }
}

/// Every node that is the primary of at least one placement group of `pool` (the first up
/// member of its acting set).
pub(crate) fn primary_nodes(
    map: &basalt_placement::ClusterMap,
    pool: basalt_types::PoolId,
) -> BTreeSet<NodeId> {
    let Some(p) = map.pools.get(&pool) else {
        return BTreeSet::new();
    };
    p.pgs
        .iter()
        .filter_map(|pg| map.pg_primary(pg))
        .filter_map(|d| map.device_node(d))
        .collect()
}

/// Every node holding a device of the acting set of some placement group of `pool`, up or
/// down: where the pool's data is.
pub(crate) fn holder_nodes(
    map: &basalt_placement::ClusterMap,
    pool: basalt_types::PoolId,
) -> BTreeSet<NodeId> {
    let Some(p) = map.pools.get(&pool) else {
        return BTreeSet::new();
    };
    p.pgs
        .iter()
        .flat_map(|pg| pg.acting.iter().copied())
        .filter_map(|d| map.device_node(d))
        .collect()
}

/// Runs the pieces concurrently in this task; a single piece (the common case) is awaited
/// directly, without the bookkeeping of a join.
async fn join_pieces<F>(mut pieces: impl Iterator<Item = F>) -> Result<(), ClientError>
where
    F: std::future::Future<Output = Result<(), ClientError>>,
{
    let Some(first) = pieces.next() else {
        return Ok(());
    };
    let Some(second) = pieces.next() else {
        return first.await;
    };
    let all = [first, second].into_iter().chain(pieces);
    futures::future::try_join_all(all).await.map(|_| ())
}

fn expect_written(resp: Response) -> Result<(), ClientError> {
    match resp {
        Response::Written { .. } => Ok(()),
        other => Err(ClientError::Protocol(format!(
            "unexpected answer to a write: {other:?}"
        ))),
    }
}
