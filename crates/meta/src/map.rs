//! The cluster map under [`keys::MAP`]: a header key and chunk keys, as cut by a [`MapCodec`]
//! (in practice `basalt_placement::ClusterMap`; meta does not depend on placement).
//!
//! Publishing: chunks are written under keys that name the epoch that wrote them, so new chunks
//! are invisible until a header names them. The header goes last, in a transaction that
//! compares the previous header's revision (and the leadership); chunks that do not fit in that
//! transaction (etcd limits a transaction to 128 operations and a request to 1.5 MiB by default)
//! go first, in transactions guarded the same way. Superseded chunks are deleted with the
//! header or right after it; a left-over (a publication that died half-way) is deleted by the
//! next one. Reading: one listing of the prefix is one consistent snapshot.

use crate::catalog::Catalog;
use crate::error::MetaError;
use crate::keys;
use crate::leader::Leadership;
use crate::store::{Compare, KeyValue, MetaStore, Revision, Txn, TxnOp, TxnOpResult, WatchEvent};
use crate::watch::Backoff;
use basalt_types::{ChunkId, MapCodec, MapParts};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The most value bytes one publication transaction carries (etcd refuses requests above
/// `--max-request-bytes`, 1.5 MiB by default).
pub const MAP_TXN_BYTES: usize = 1 << 20;

/// How long a watcher waits for the chunks of a header it has seen before it re-lists.
const CHUNK_WAIT: Duration = Duration::from_secs(2);

/// A map as stored: its parts (with any left-over chunks) and the header's `mod_revision`,
/// the `prev` of the next publication.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredMap {
    pub parts: MapParts,
    pub revision: Revision,
}

impl Catalog {
    /// The published map's parts, read in one listing. Fails with [`MetaError::LegacyMap`]
    /// when the store holds a map of format 1.
    pub async fn get_map_parts(&self) -> Result<Option<StoredMap>, MetaError> {
        refuse_legacy(self.store().as_ref()).await?;
        let listing = self.store().list(keys::MAP).await?;
        let mut parts = MapParts::default();
        let mut revision = None;
        for kv in listing.kvs {
            if kv.key == keys::MAP_HEADER {
                parts.header = kv.value;
                revision = Some(kv.mod_revision);
            } else if let Some(id) = keys::parse_map_chunk(&kv.key) {
                parts.chunks.insert(id, kv.value);
            }
        }
        Ok(revision.map(|revision| StoredMap { parts, revision }))
    }

    /// The published map and the revision of its header.
    pub async fn get_map<M: MapCodec>(&self) -> Result<Option<(M, Revision)>, MetaError> {
        let Some(stored) = self.get_map_parts().await? else {
            return Ok(None);
        };
        let map = decode(&stored.parts)?;
        Ok(Some((map, stored.revision)))
    }

    /// Publishes `map` if the published one is still `prev` (`None` = no map may exist yet).
    /// Otherwise fails with [`MetaError::MapConflict`] and the published map stays as it was
    /// (chunks already written for this publication are invisible left-overs).
    pub async fn put_map<M: MapCodec>(
        &self,
        map: &M,
        prev: Option<&StoredMap>,
    ) -> Result<StoredMap, MetaError> {
        self.publish(map, prev, None).await
    }

    /// Like [`Catalog::put_map`], and only while `leadership` still holds the leader key: a
    /// deposed leader cannot publish (fails with [`MetaError::NotLeader`]).
    pub async fn put_map_as_leader<M: MapCodec>(
        &self,
        map: &M,
        prev: Option<&StoredMap>,
        leadership: &Leadership,
    ) -> Result<StoredMap, MetaError> {
        self.publish(map, prev, Some(leadership)).await
    }

    /// Deletes the chunks of `stored` its header does not name (`named`), as the leader.
    /// Returns the map as stored afterwards.
    pub async fn remove_stray_map_chunks(
        &self,
        stored: &StoredMap,
        named: &BTreeSet<ChunkId>,
        leadership: &Leadership,
    ) -> Result<StoredMap, MetaError> {
        let strays: Vec<ChunkId> = stored
            .parts
            .chunks
            .keys()
            .filter(|c| !named.contains(c))
            .copied()
            .collect();
        let mut after = stored.clone();
        for batch in strays.chunks(Txn::MAX_OPS) {
            let txn = Txn::new()
                .when([
                    Compare::mod_revision_is(keys::MAP_HEADER, stored.revision),
                    leadership.holds_key(),
                ])
                .and_then(batch.iter().map(|c| TxnOp::delete(keys::map_chunk(*c))));
            if !self.store().txn(txn).await?.succeeded {
                break;
            }
            for c in batch {
                after.parts.chunks.remove(c);
            }
        }
        Ok(after)
    }

    async fn publish<M: MapCodec>(
        &self,
        map: &M,
        prev: Option<&StoredMap>,
        leadership: Option<&Leadership>,
    ) -> Result<StoredMap, MetaError> {
        let parts = map.to_parts(prev.map(|p| &p.parts));
        let expected = prev.map(|p| p.revision);
        let mut guard = vec![Compare::mod_revision_is(
            keys::MAP_HEADER,
            expected.unwrap_or(0),
        )];
        guard.extend(leadership.map(Leadership::holds_key));
        let old = prev.map(|p| &p.parts.chunks);
        let puts: Vec<(ChunkId, &Vec<u8>)> = parts
            .chunks
            .iter()
            .filter(|(id, bytes)| old.and_then(|o| o.get(id)) != Some(*bytes))
            .map(|(id, bytes)| (*id, bytes))
            .collect();
        let deletes: Vec<ChunkId> = old
            .map(|o| {
                o.keys()
                    .filter(|id| !parts.chunks.contains_key(id))
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        let mut batches = batch_puts(&puts, parts.header.len());
        let last = batches.pop().unwrap_or_default();
        for batch in batches {
            let ops = batch
                .iter()
                .map(|(id, v)| TxnOp::put(keys::map_chunk(*id), v.to_vec()));
            self.guarded(guard.clone(), ops.collect(), expected).await?;
        }
        let mut ops: Vec<TxnOp> = last
            .iter()
            .map(|(id, v)| TxnOp::put(keys::map_chunk(*id), v.to_vec()))
            .collect();
        ops.push(TxnOp::put(keys::MAP_HEADER, parts.header.clone()));
        let room = Txn::MAX_OPS.saturating_sub(ops.len());
        let (now, later) = deletes.split_at(room.min(deletes.len()));
        ops.extend(now.iter().map(|id| TxnOp::delete(keys::map_chunk(*id))));
        let revision = self.guarded(guard, ops, expected).await?;
        let mut stored = StoredMap { parts, revision };
        self.delete_superseded(later, &mut stored, leadership).await;
        Ok(stored)
    }

    /// Runs one publication transaction; a failed comparison becomes `MapConflict` (the header
    /// moved) or `NotLeader`.
    async fn guarded(
        &self,
        guard: Vec<Compare>,
        ops: Vec<TxnOp>,
        expected: Option<Revision>,
    ) -> Result<Revision, MetaError> {
        let txn = Txn::new()
            .when(guard)
            .and_then(ops)
            .or_else([TxnOp::get(keys::MAP_HEADER)]);
        let result = self.store().txn(txn).await?;
        if result.succeeded {
            return Ok(result.revision);
        }
        let found = match result.results.first() {
            Some(TxnOpResult::Get(kv)) => kv.as_ref().map(|kv| kv.mod_revision),
            _ => None,
        };
        if found != expected {
            return Err(MetaError::MapConflict { expected, found });
        }
        Err(MetaError::NotLeader)
    }

    /// Deletes superseded chunks that did not fit in the header's transaction. Best effort: a
    /// chunk left behind stays in `stored` (unnamed), so the next publication deletes it.
    async fn delete_superseded(
        &self,
        ids: &[ChunkId],
        stored: &mut StoredMap,
        leadership: Option<&Leadership>,
    ) {
        for (n, batch) in ids.chunks(Txn::MAX_OPS).enumerate() {
            let mut guard = vec![Compare::mod_revision_is(keys::MAP_HEADER, stored.revision)];
            guard.extend(leadership.map(Leadership::holds_key));
            let txn = Txn::new()
                .when(guard)
                .and_then(batch.iter().map(|id| TxnOp::delete(keys::map_chunk(*id))));
            let done = match self.store().txn(txn).await {
                Ok(r) => r.succeeded,
                Err(e) => {
                    tracing::warn!("deleting superseded map chunks: {e}; the next map retries");
                    false
                }
            };
            if !done {
                for id in &ids[n * Txn::MAX_OPS..] {
                    stored.parts.chunks.entry(*id).or_default();
                }
                return;
            }
        }
    }

    /// Follows the published map: the receiver yields the current map (if any) and then every
    /// newly published one, in order. Lost watches and store outages are handled inside (it
    /// re-reads and re-watches, so no publication is skipped except ones superseded while the
    /// store was unreachable). Ends when the receiver is dropped.
    pub async fn watch_map<M>(&self) -> Result<mpsc::Receiver<M>, MetaError>
    where
        M: MapCodec + Send + 'static,
    {
        // Fail early (and visibly) when the store is unreachable now.
        self.store().revision().await?;
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(follow_map(self.store().clone(), tx));
        Ok(rx)
    }
}

/// Cuts the chunk puts into transactions: each at most [`Txn::MAX_OPS`] operations (one kept
/// for the header in the last) and [`MAP_TXN_BYTES`] of values (the header's bytes counted in
/// the last). A chunk larger than the budget travels alone.
fn batch_puts<'a>(
    puts: &[(ChunkId, &'a Vec<u8>)],
    header: usize,
) -> Vec<Vec<(ChunkId, &'a Vec<u8>)>> {
    let mut batches: Vec<Vec<(ChunkId, &Vec<u8>)>> = vec![Vec::new()];
    let mut bytes = 0;
    // Fill from the end so that the last batch (with the header) is the one with room left.
    for (id, v) in puts.iter().rev() {
        let reserve = if batches.len() == 1 { header } else { 0 };
        let cur = batches.last().expect("one batch");
        let full = cur.len() + 2 > Txn::MAX_OPS || bytes + v.len() + reserve > MAP_TXN_BYTES;
        if full && !cur.is_empty() {
            batches.push(Vec::new());
            bytes = 0;
        }
        batches.last_mut().expect("one batch").push((*id, *v));
        bytes += v.len();
    }
    batches.reverse();
    for b in &mut batches {
        b.reverse();
    }
    batches
}

fn decode<M: MapCodec>(parts: &MapParts) -> Result<M, MetaError> {
    M::from_parts(parts).map_err(|e| MetaError::corrupt(keys::MAP_HEADER, e))
}

async fn refuse_legacy(store: &dyn MetaStore) -> Result<(), MetaError> {
    match store.get(keys::LEGACY_MAP).await? {
        Some(_) => Err(MetaError::LegacyMap {
            key: keys::LEGACY_MAP.to_string(),
        }),
        None => Ok(()),
    }
}

async fn follow_map<M: MapCodec + Send + 'static>(store: Arc<dyn MetaStore>, tx: mpsc::Sender<M>) {
    let mut last: Revision = 0;
    let mut backoff = Backoff::default();
    while backoff
        .after(
            follow_once(&*store, &tx, &mut last).await,
            "the cluster map",
            &tx,
        )
        .await
    {}
}

/// The watcher's copy of the stored map: updated by every event, decoded when the header
/// changes (and once the chunks it names have arrived).
struct Mirror {
    parts: MapParts,
    header_rev: Revision,
    /// A header not yet delivered (its chunks may still be on their way).
    pending: bool,
}

impl Mirror {
    fn apply(&mut self, kv: &KeyValue, deleted: bool) {
        if kv.key == keys::MAP_HEADER {
            if !deleted {
                self.parts.header = kv.value.clone();
                self.header_rev = kv.mod_revision;
                self.pending = true;
            }
        } else if let Some(id) = keys::parse_map_chunk(&kv.key) {
            if deleted {
                self.parts.chunks.remove(&id);
            } else {
                self.parts.chunks.insert(id, kv.value.clone());
            }
        }
    }

    /// Sends the map if a new header is complete. Returns false while chunks are missing.
    async fn deliver<M: MapCodec>(&mut self, tx: &mpsc::Sender<M>, last: &mut Revision) -> bool {
        if !self.pending {
            return true;
        }
        if self.header_rev <= *last {
            self.pending = false;
            return true;
        }
        match M::from_parts(&self.parts) {
            Ok(map) => {
                self.pending = false;
                *last = self.header_rev;
                let _ = tx.send(map).await;
                true
            }
            Err(e) => {
                tracing::debug!("map header at {} not complete yet: {e}", self.header_rev);
                false
            }
        }
    }
}

/// Reads the current map, then watches until the watch is lost or the receiver goes away.
async fn follow_once<M: MapCodec>(
    store: &dyn MetaStore,
    tx: &mpsc::Sender<M>,
    last: &mut Revision,
) -> Result<(), MetaError> {
    refuse_legacy(store).await?;
    let listing = store.list(keys::MAP).await?;
    let mut mirror = Mirror {
        parts: MapParts::default(),
        header_rev: 0,
        pending: false,
    };
    for kv in &listing.kvs {
        mirror.apply(kv, false);
    }
    if !mirror.deliver(tx, last).await {
        tracing::warn!(
            "the cluster map at revision {} is incomplete or unreadable; waiting for the next",
            mirror.header_rev
        );
        mirror.pending = false;
    }
    let mut events = store.watch_prefix(keys::MAP, listing.revision + 1).await?;
    loop {
        let wait = async {
            if mirror.pending {
                tokio::time::timeout(CHUNK_WAIT, events.recv()).await.ok()
            } else {
                Some(events.recv().await)
            }
        };
        let event = tokio::select! {
            biased;
            ev = wait => ev,
            _ = tx.closed() => return Ok(()),
        };
        let Some(event) = event else {
            tracing::debug!("map header without its chunks; re-reading");
            return Ok(());
        };
        let mut next = event;
        loop {
            // Events of a later publication are queued behind this one's header: deliver it
            // first (its chunks came at or before its revision), so none is skipped.
            if let Some(WatchEvent::Put(kv) | WatchEvent::Delete(kv)) = &next
                && mirror.pending
                && kv.mod_revision > mirror.header_rev
            {
                mirror.deliver(tx, last).await;
            }
            match next {
                Some(WatchEvent::Put(kv)) => mirror.apply(&kv, false),
                Some(WatchEvent::Delete(kv)) => mirror.apply(&kv, true),
                Some(WatchEvent::Lost(reason)) => {
                    tracing::debug!("map watch lost ({reason}); re-reading");
                    return Ok(());
                }
                None => return Err(MetaError::Backend("the map watch ended".into())),
            }
            // Take every event already here (this publication's keys) before decoding.
            match events.try_recv() {
                Ok(ev) => next = Some(ev),
                Err(_) => break,
            }
        }
        mirror.deliver(tx, last).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_types::{Epoch, PoolId};

    fn chunk(index: u32) -> ChunkId {
        ChunkId {
            pool: PoolId(1),
            index,
            written: Epoch(1),
        }
    }

    #[test]
    fn puts_are_cut_by_ops_and_bytes_with_room_for_the_header() {
        let small = vec![0u8; 100];
        let puts: Vec<_> = (0..300).map(|i| (chunk(i), &small)).collect();
        let batches = batch_puts(&puts, 10);
        assert!(batches.iter().all(|b| b.len() < Txn::MAX_OPS));
        assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), 300);
        let order: Vec<u32> = batches.iter().flatten().map(|(c, _)| c.index).collect();
        assert_eq!(order, (0..300).collect::<Vec<_>>(), "order is kept");

        let big = vec![0u8; 400 << 10];
        let puts: Vec<_> = (0..5).map(|i| (chunk(i), &big)).collect();
        let batches = batch_puts(&puts, 300 << 10);
        let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
        assert_eq!(
            sizes,
            vec![2, 2, 1],
            "the last batch leaves room for the header"
        );

        let huge = vec![0u8; 3 << 20];
        let puts = vec![(chunk(0), &huge)];
        assert_eq!(batch_puts(&puts, 10).len(), 1, "a huge chunk travels alone");
        assert_eq!(batch_puts(&[], 10), vec![Vec::new()]);
    }
}
