//! The write path: [`Volume::write`], [`Volume::write_zeroes`], [`Volume::trim`],
//! [`Volume::flush`].

use crate::error::ClientError;
use crate::flushset::Owed;
use crate::retry::{call_node_with_retry, call_primary_at};
use crate::split::split;
use crate::volume::{Durability, Volume};
use basalt_proto::{Request, Response, Session};
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
                let answer = call_primary_at(&self.cluster, oid, |epoch| Request::Write {
                    epoch,
                    oid,
                    offset: p.offset,
                    version: basalt_types::Version::NONE,
                    fua,
                    data: slice.clone(),
                    session: Session::NONE,
                })
                .await?;
                self.written(answer, fua)
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
                let answer = call_primary_at(&self.cluster, oid, |epoch| Request::WriteZeroes {
                    epoch,
                    oid,
                    offset: p.offset,
                    len: p.len,
                    fua,
                    session: Session::NONE,
                })
                .await?;
                self.written(answer, fua)
            }
        });
        join_pieces(pieces).await
    }

    /// Discards `[offset, offset + len)`: afterwards the range reads as zeros and its space is free.
    /// In [`Durability::Sync`] durable when acknowledged, like every write there: sent as a
    /// write-zeroes with FUA (which a node runs exactly as a trim, durably).
    pub async fn trim(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        if self.durability == Durability::Sync {
            return self.write_zeroes(offset, len, true).await;
        }
        self.check_range(offset, len)?;
        let pieces = split(offset, len, self.object_size).map(|p| {
            let oid = ObjectId::new(self.pool, self.id, p.index);
            async move {
                let answer = call_primary_at(&self.cluster, oid, |epoch| Request::Trim {
                    epoch,
                    oid,
                    offset: p.offset,
                    len: p.len,
                    session: Session::NONE,
                })
                .await?;
                self.written(answer, false)
            }
        });
        join_pieces(pieces).await
    }

    /// Makes every write acknowledged before this call durable: flushes every node that
    /// acknowledged a non-durable write of this volume and was not flushed since (through any
    /// handle of this cluster, even if the map has moved its placement groups away since, and
    /// even if another flush is flushing it right now), and every node that is now a primary
    /// of the volume's pool. A node that cannot be flushed fails the flush (its writes may be
    /// lost) and stays owed for the next one. A node that answers in another incarnation than
    /// it acknowledged the writes in (it crashed and started again in between) lost them: the
    /// flush fails with [`ClientError::WritesLost`], and so does the next flush of every other
    /// handle of the volume that was open then (`flushset.rs`).
    pub async fn flush(&self) -> Result<(), ClientError> {
        let unflushed = &self.cluster.inner.unflushed;
        let mut owed = unflushed.owed(self.id);
        self.forget_removed(&mut owed).await;
        let mut nodes = primary_nodes(&self.cluster.map(), self.pool);
        nodes.extend(owed.keys().copied());
        let flushes = nodes.into_iter().map(|node| async move {
            let answer =
                call_node_with_retry(&self.cluster, node, |epoch| Request::Flush { epoch }).await;
            match answer {
                Ok(Response::Flushed { incarnation }) => Ok((node, incarnation)),
                Ok(other) => Err(ClientError::Protocol(format!(
                    "unexpected answer to Flush: {other:?}"
                ))),
                Err(e) => Err(e),
            }
        });
        let mut first_error = None;
        for result in futures::future::join_all(flushes).await {
            match result {
                Ok((node, incarnation)) => {
                    if let Some(o) = owed.get(&node) {
                        // A loss is reported below, to every handle once.
                        let _ = unflushed.flushed(self.id, node, *o, incarnation);
                    }
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some((count, why)) = unflushed.loss_since(self.id, self.losses_seen()) {
            self.saw_losses(count);
            return Err(ClientError::WritesLost {
                volume: self.name.clone(),
                why,
            });
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Takes out of `owed`, and out of the volume's flush set, the nodes removed from the
    /// cluster (`basalt node remove`): they cannot be asked any more. What such a node held
    /// was moved off it durably or given up by the operator before it could be removed, but
    /// the writes it owed may have been lost before that (a crash, then the drain): the flush
    /// fails once (`WritesLost`), as for a node that started again, and the next ones do not
    /// wait for it. (Before, every later flush of the volume waited for it until the operation
    /// timeout and failed.) A node merely absent from the map (down, or restarting) is still
    /// waited for.
    async fn forget_removed(&self, owed: &mut std::collections::BTreeMap<NodeId, Owed>) {
        let map = self.cluster.map();
        let absent: Vec<NodeId> = owed
            .keys()
            .filter(|n| !map.nodes.contains_key(n))
            .copied()
            .collect();
        for node in absent {
            if let Ok(Some(_)) = self.cluster.catalog().removed_node(node).await {
                tracing::warn!(volume = %self.name, %node, "removed from the cluster before a flush reached it");
                self.cluster.inner.unflushed.removed(self.id, node);
                owed.remove(&node);
            }
        }
    }

    /// Checks a write's answer and, for one that is not durable yet, records the node that
    /// acknowledged it, in its incarnation, for the next flush. (Incarnation 0: the node made
    /// it durable anyway, as a replicated PG does every write.)
    fn written(&self, (node, resp): (NodeId, Response), durable: bool) -> Result<(), ClientError> {
        let Response::Written { incarnation, .. } = resp else {
            return Err(ClientError::Protocol(format!(
                "unexpected answer to a write: {resp:?}"
            )));
        };
        if !durable && incarnation != 0 {
            self.cluster
                .inner
                .unflushed
                .record(self.id, node, incarnation);
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use crate::testing::{FakeNode, map, two_nodes};
    use crate::{ClusterConfig, Durability, VolumeOptions};
    use basalt_proto::ErrorCode;
    use bytes::Bytes;

    fn options(durability: Durability) -> VolumeOptions {
        VolumeOptions { durability }
    }

    /// A handle of volume "v" whose writes are durable only once flushed.
    async fn open_flushed(fx: &crate::testing::Fixture) -> crate::Volume {
        fx.cluster
            .open_volume("v", options(Durability::Flush))
            .await
            .unwrap()
    }

    /// A flush-durability volume with one write acknowledged by node 1, not durable yet,
    /// whose PG the map has since moved to node 2.
    async fn written_then_moved() -> (
        crate::testing::Fixture,
        std::sync::Arc<FakeNode>,
        std::sync::Arc<FakeNode>,
        crate::Volume,
    ) {
        written_then_moved_in(1).await
    }

    /// [`written_then_moved`], node 1 answering the write in `incarnation` (0: durable).
    async fn written_then_moved_in(
        incarnation: u64,
    ) -> (
        crate::testing::Fixture,
        std::sync::Arc<FakeNode>,
        std::sync::Arc<FakeNode>,
        crate::Volume,
    ) {
        let (fx, n1, n2) = two_nodes(ClusterConfig::default()).await;
        *n1.incarnation.lock() = incarnation;
        let vol = open_flushed(&fx).await;
        vol.write(0, Bytes::from(vec![1u8; 4096]), false)
            .await
            .unwrap();
        fx.cluster.inner.maps.offer(map(2, &[2]));
        (fx, n1, n2, vol)
    }

    #[tokio::test]
    async fn a_flush_reaches_the_old_primary_after_the_map_moved() {
        // The PG moves to node 2 before the flush: node 1 holds an acknowledged, unflushed write.
        let (fx, n1, n2, vol) = written_then_moved().await;
        vol.flush().await.unwrap();
        assert_eq!(
            n1.flushes(),
            1,
            "the node that acknowledged the write was not flushed"
        );
        assert_eq!(n2.flushes(), 1, "the current primary is flushed too");
        // Nothing new on node 1 since: the next flush goes to the current primary only.
        vol.flush().await.unwrap();
        assert_eq!((n1.flushes(), n2.flushes()), (1, 2));
        // A handle opened later still owes node 1 a flush for writes made through another one.
        vol.trim(0, 4096).await.unwrap();
        fx.cluster.inner.maps.offer(map(3, &[1]));
        vol.write_zeroes(0, 4096, false).await.unwrap();
        fx.cluster.inner.maps.offer(map(4, &[3]));
        let n3 = FakeNode::install(&fx.cluster, 3);
        let other = open_flushed(&fx).await;
        other.flush().await.unwrap();
        assert_eq!((n1.flushes(), n2.flushes(), n3.flushes()), (2, 3, 1));
    }

    #[tokio::test]
    async fn a_node_that_could_not_be_flushed_is_flushed_next_time() {
        let (_fx, n1, n2, vol) = written_then_moved().await;
        *n1.fail_flushes.lock() = Some(ErrorCode::DeviceFailed);
        let e = vol.flush().await.unwrap_err();
        assert!(e.to_string().contains("flush failed"), "{e}");
        *n1.fail_flushes.lock() = None;
        vol.flush().await.unwrap();
        assert_eq!((n1.flushes(), n2.flushes()), (2, 2));
        vol.flush().await.unwrap();
        assert_eq!((n1.flushes(), n2.flushes()), (2, 3), "owed once only");
    }

    /// A flush beside another that is still flushing a node flushes that node too: it must
    /// not return before the writes that node acknowledged are durable. Before, the first
    /// flush took the node out of the set as it began, and the second returned at once.
    #[tokio::test]
    async fn a_flush_beside_one_in_progress_flushes_its_nodes_too() {
        let (fx, n1, n2, vol) = written_then_moved().await;
        // Node 1's next answer (the first flush's) waits until the test lets it go.
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        *n1.before_answer.lock() = Some(Box::pin(async move {
            let _ = wait.await;
        }));
        let vol = std::sync::Arc::new(vol);
        let first = tokio::spawn({
            let vol = vol.clone();
            async move { vol.flush().await }
        });
        while n1.flushes() == 0 {
            tokio::task::yield_now().await;
        }
        let other = open_flushed(&fx).await;
        other.flush().await.unwrap();
        assert_eq!(
            n1.flushes(),
            2,
            "the second flush returned without flushing the node the first one still was"
        );
        let _ = go.send(());
        first.await.unwrap().unwrap();
        // Both succeeded there: nothing owed any more.
        vol.flush().await.unwrap();
        assert_eq!((n1.flushes(), n2.flushes()), (2, 3));
    }

    /// A node that answers the flush in another incarnation than it acknowledged the write in
    /// (it crashed and started again in between) lost it: the flush fails, and so does the
    /// next flush of every other handle open at the time, once; a handle opened later, and
    /// later flushes, do not.
    #[tokio::test]
    async fn a_flush_fails_when_a_node_started_again_since_it_acknowledged_a_write() {
        let (fx, n1, _n2, vol) = written_then_moved().await;
        let other = open_flushed(&fx).await;
        *n1.incarnation.lock() = 2;
        match vol.flush().await {
            Err(crate::ClientError::WritesLost { why, .. }) => {
                assert!(
                    why.contains("node.1") && why.contains("may be lost"),
                    "{why}"
                );
            }
            other => panic!("the flush answered {other:?}"),
        }
        let later = open_flushed(&fx).await;
        later.flush().await.unwrap();
        assert!(other.flush().await.is_err(), "a handle open at the loss");
        other.flush().await.unwrap();
        vol.flush().await.unwrap();
        // Written and flushed in the same incarnation: nothing lost.
        fx.cluster.inner.maps.offer(map(3, &[1]));
        vol.write(0, Bytes::from(vec![3u8; 4096]), false)
            .await
            .unwrap();
        vol.flush().await.unwrap();
        // Node 1 was owed nothing between its first flush and the write.
        assert_eq!(n1.flushes(), 2);
    }

    /// A write node 1 acknowledged in its old incarnation while a flush was at it, the flush
    /// answered in the new one (the node crashed in between): that flush fails, and so must
    /// the next, which the write completed before (found by a review: the next one succeeded).
    #[tokio::test]
    async fn a_write_acknowledged_while_a_flush_was_at_a_node_that_restarted_fails_the_next_flush()
    {
        let (fx, n1, _n2) = two_nodes(ClusterConfig::default()).await;
        let vol = std::sync::Arc::new(open_flushed(&fx).await);
        vol.write(0, Bytes::from(vec![1u8; 4096]), false)
            .await
            .unwrap();
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        *n1.before_answer.lock() = Some(Box::pin(async move {
            let _ = wait.await;
        }));
        let flush = tokio::spawn({
            let vol = vol.clone();
            async move { vol.flush().await }
        });
        while n1.flushes() == 0 {
            tokio::task::yield_now().await;
        }
        vol.write(4096, Bytes::from(vec![2u8; 4096]), false)
            .await
            .unwrap();
        *n1.incarnation.lock() = 2;
        let _ = go.send(());
        assert!(flush.await.unwrap().is_err(), "the first write is lost");
        assert!(
            vol.flush().await.is_err(),
            "the second write, acknowledged in the old incarnation, is lost too"
        );
        vol.flush().await.unwrap();
    }

    /// A write the node made durable anyway (answered with incarnation 0: a replicated PG)
    /// owes no flush: the node is not flushed for it once the map moved its PG, and no restart
    /// of it fails a flush.
    #[tokio::test]
    async fn a_write_the_node_made_durable_owes_no_flush() {
        let (_fx, n1, n2, vol) = written_then_moved_in(0).await;
        *n1.incarnation.lock() = 5;
        vol.flush().await.unwrap();
        assert_eq!((n1.flushes(), n2.flushes()), (0, 1));
    }

    /// A node removed from the cluster before a flush reached it is not asked any more: the
    /// next flush fails once (what it owed may be lost), the later ones succeed (before, every
    /// flush of the volume failed for good). One merely absent from the map is still asked.
    #[tokio::test]
    async fn a_node_removed_from_the_cluster_fails_one_flush_only() {
        let (fx, n1, n2, vol) = written_then_moved().await;
        *n1.fail_flushes.lock() = Some(ErrorCode::DeviceFailed);
        assert!(vol.flush().await.is_err(), "not removed: still owed");
        let node = basalt_types::NodeId(1);
        let devices = fx.catalog.node_devices(node).await.unwrap();
        assert!(fx.catalog.remove_node(&devices).await.unwrap());
        match vol.flush().await {
            Err(crate::ClientError::WritesLost { why, .. }) => {
                assert!(why.contains("removed"), "{why}");
            }
            other => panic!("the flush answered {other:?}"),
        }
        vol.flush().await.unwrap();
        assert_eq!(n1.flushes(), 1, "the removed node was asked again");
        assert_eq!(n2.flushes(), 3);
    }

    #[tokio::test]
    async fn durable_writes_owe_no_flush() {
        let (fx, n1, n2) = two_nodes(ClusterConfig::default()).await;
        let vol = fx
            .cluster
            .open_volume("v", options(Durability::Sync))
            .await
            .unwrap();
        vol.write(0, Bytes::from(vec![1u8; 4096]), false)
            .await
            .unwrap();
        let flush = vol.write_zeroes(0, 4096, true).await;
        flush.unwrap();
        vol.trim(0, 8192).await.unwrap();
        fx.cluster.inner.maps.offer(map(2, &[2]));
        vol.flush().await.unwrap();
        assert_eq!((n1.flushes(), n2.flushes()), (0, 1));
    }
}
