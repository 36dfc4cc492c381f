//! The split cluster map (header + chunks) in both backends: compare-and-swap, watches, batched
//! publication of only the changed chunks, clean-up of left-overs, refusal of format 1.

use crate::common::Harness;
use anyhow::{Context, Result, ensure};
use basalt_meta::{MetaError, StoredMap, keys};
use basalt_types::{ChunkId, Epoch, MapCodec, MapParts, PoolId};
use std::time::Duration;

/// A map of one pool whose PG table is `chunks` (opaque bytes). The header names the epoch
/// that wrote each chunk, like the real codec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TestMap {
    pub epoch: u64,
    pub chunks: Vec<Vec<u8>>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Header {
    epoch: u64,
    written: Vec<u64>,
}

impl TestMap {
    pub(crate) fn new(epoch: u64, chunks: &[&[u8]]) -> TestMap {
        TestMap {
            epoch,
            chunks: chunks.iter().map(|c| c.to_vec()).collect(),
        }
    }
}

fn chunk_id(index: usize, written: u64) -> ChunkId {
    ChunkId {
        pool: PoolId(1),
        index: index as u32,
        written: Epoch(written),
    }
}

impl MapCodec for TestMap {
    fn to_parts(&self, prev: Option<&MapParts>) -> MapParts {
        let before: Option<Header> = prev.and_then(|p| serde_json::from_slice(&p.header).ok());
        let mut parts = MapParts::default();
        let mut written = Vec::new();
        for (i, bytes) in self.chunks.iter().enumerate() {
            let old = before.as_ref().and_then(|h| h.written.get(i)).copied();
            let same =
                old.filter(|w| prev.and_then(|p| p.chunks.get(&chunk_id(i, *w))) == Some(bytes));
            let w = same.unwrap_or(self.epoch);
            written.push(w);
            parts.chunks.insert(chunk_id(i, w), bytes.clone());
        }
        let header = Header {
            epoch: self.epoch,
            written,
        };
        parts.header = serde_json::to_vec(&header).expect("header");
        parts
    }

    fn from_parts(parts: &MapParts) -> Result<TestMap, String> {
        let h: Header = serde_json::from_slice(&parts.header).map_err(|e| e.to_string())?;
        let chunks = h
            .written
            .iter()
            .enumerate()
            .map(|(i, w)| {
                parts
                    .chunks
                    .get(&chunk_id(i, *w))
                    .cloned()
                    .ok_or(format!("chunk {i} missing"))
            })
            .collect::<Result<_, _>>()?;
        Ok(TestMap {
            epoch: h.epoch,
            chunks,
        })
    }

    fn epoch(&self) -> Epoch {
        Epoch(self.epoch)
    }
}

async fn chunk_keys(h: &Harness) -> Result<Vec<ChunkId>> {
    let listing = h.store.list(keys::MAP_CHUNKS).await?;
    Ok(listing
        .kvs
        .iter()
        .filter_map(|kv| keys::parse_map_chunk(&kv.key))
        .collect())
}

/// Publications made faster than the watcher reads them (its events queue up) all arrive, in
/// order: none is skipped for a later one whose events came in the same batch.
pub(crate) async fn catalog_map_watch_delivers_every_publication(h: Harness) -> Result<()> {
    let c = h.catalog();
    let mut state = c.put_map(&TestMap::new(1, &[b"a", b"b"]), None).await?;
    let mut maps = c.watch_map::<TestMap>().await?;
    let first = tokio::time::timeout(Duration::from_secs(10), maps.recv()).await?;
    ensure!(first.as_ref().map(|m| m.epoch) == Some(1), "{first:?}");
    let last = 40u64;
    for epoch in 2..=last {
        let body = epoch.to_le_bytes();
        let map = TestMap::new(epoch, &[b"a", &body]);
        state = c.put_map(&map, Some(&state)).await?;
    }
    for epoch in 2..=last {
        let got = tokio::time::timeout(Duration::from_secs(10), maps.recv()).await?;
        ensure!(
            got.as_ref().map(|m| m.epoch) == Some(epoch),
            "want {epoch}, got {got:?}"
        );
    }
    Ok(())
}

pub(crate) async fn catalog_map_cas_and_watch(h: Harness) -> Result<()> {
    let c = h.catalog();
    ensure!(c.get_map::<TestMap>().await?.is_none());
    let one = TestMap::new(1, &[b"a", b"b"]);
    let s1 = c.put_map(&one, None).await?;
    let again = c.put_map(&TestMap::new(9, &[b"z"]), None).await;
    ensure!(
        matches!(&again, Err(MetaError::MapConflict { expected: None, found: Some(f) }) if *f == s1.revision),
        "{again:?}"
    );
    let mut maps = c.watch_map::<TestMap>().await?;
    let first = tokio::time::timeout(Duration::from_secs(10), maps.recv()).await?;
    ensure!(first == Some(one), "the current map comes first: {first:?}");
    let two = TestMap::new(2, &[b"a", b"c"]);
    let s2 = c.put_map(&two, Some(&s1)).await?;
    let stale = c.put_map(&TestMap::new(3, &[b"q"]), Some(&s1)).await;
    ensure!(
        matches!(stale, Err(MetaError::MapConflict { .. })),
        "{stale:?}"
    );
    let three = TestMap::new(3, &[b"d", b"c", b"e"]);
    c.put_map(&three, Some(&s2)).await?;
    for want in [&two, &three] {
        let got = tokio::time::timeout(Duration::from_secs(10), maps.recv()).await?;
        ensure!(got.as_ref() == Some(want), "{got:?}");
    }
    let (map, rev) = c.get_map::<TestMap>().await?.context("map")?;
    ensure!(map == three && rev > s2.revision);
    // Only the named chunks are stored: b (replaced at 2), a (replaced at 3) are gone.
    let mut ids = chunk_keys(&h).await?;
    ids.sort();
    ensure!(
        ids == vec![chunk_id(0, 3), chunk_id(1, 2), chunk_id(2, 3)],
        "{ids:?}"
    );
    Ok(())
}

/// 300 chunks of 8 KiB: more than one transaction may hold (128 operations), so the chunks go
/// first in batches and the header last. A second map that changes one chunk writes one chunk.
/// A left-over chunk (a publication that died half-way) is ignored by readers and deleted by
/// the next publication.
pub(crate) async fn catalog_map_writes_changed_chunks_in_batches_and_cleans_up(
    h: Harness,
) -> Result<()> {
    let c = h.catalog();
    let blob = |i: usize, tag: u8| {
        let mut v = vec![tag; 8 << 10];
        v[..8].copy_from_slice(&(i as u64).to_le_bytes());
        v
    };
    let first = TestMap {
        epoch: 1,
        chunks: (0..300).map(|i| blob(i, 1)).collect(),
    };
    let s1 = c.put_map(&first, None).await?;
    ensure!(chunk_keys(&h).await?.len() == 300);
    let mut maps = c.watch_map::<TestMap>().await?;
    let got = tokio::time::timeout(Duration::from_secs(10), maps.recv()).await?;
    ensure!(got.as_ref() == Some(&first), "the watcher rebuilds the map");

    let mut second = first.clone();
    second.epoch = 2;
    second.chunks[123] = blob(123, 2);
    let before = h.store.revision().await?;
    let s2 = c.put_map(&second, Some(&s1)).await?;
    if h.exclusive {
        ensure!(
            s2.revision == before + 1,
            "one changed chunk: one transaction"
        );
    }
    let ids = chunk_keys(&h).await?;
    ensure!(ids.len() == 300, "{} chunk keys", ids.len());
    let fresh: Vec<_> = ids.iter().filter(|i| i.written == Epoch(2)).collect();
    ensure!(fresh == vec![&chunk_id(123, 2)], "{fresh:?}");
    let got = tokio::time::timeout(Duration::from_secs(10), maps.recv()).await?;
    ensure!(got.as_ref() == Some(&second));

    // A publication of epoch 3 died after writing one chunk: readers do not see it.
    let stray = chunk_id(5, 3);
    h.store
        .put(&keys::map_chunk(stray), b"half".to_vec(), None)
        .await?;
    let read: StoredMap = c.get_map_parts().await?.context("map")?;
    ensure!(read.parts.chunks.contains_key(&stray));
    ensure!(c.get_map::<TestMap>().await?.context("map")?.0 == second);
    let mut third = second.clone();
    third.epoch = 3;
    third.chunks[0] = blob(0, 3);
    c.put_map(&third, Some(&read)).await?;
    let ids = chunk_keys(&h).await?;
    ensure!(
        ids.len() == 300 && !ids.contains(&stray),
        "the left-over is gone"
    );
    let got = tokio::time::timeout(Duration::from_secs(10), maps.recv()).await?;
    ensure!(got.as_ref() == Some(&third));
    Ok(())
}

pub(crate) async fn catalog_map_refuses_format_1(h: Harness) -> Result<()> {
    let c = h.catalog();
    h.store
        .put(keys::LEGACY_MAP, br#"{"v":1,"epoch":4}"#.to_vec(), None)
        .await?;
    let e = c.get_map::<TestMap>().await;
    ensure!(matches!(&e, Err(MetaError::LegacyMap { .. })), "{e:?}");
    let msg = e.err().context("error")?.to_string();
    ensure!(
        msg.contains("format version 1") && msg.contains("older basalt"),
        "{msg}"
    );
    Ok(())
}
