//! How a [`ClusterMap`] is stored: a small JSON header and the PG tables in chunks of
//! [`CHUNK_PGS`] PGs, each a JSON array of compact entries (docs/design/metadata-keys.md).
//!
//! Header (`"v"` is the format version; a reader refuses any other):
//! ```json
//! {"v":2,"epoch":12,
//!  "devices":[[5,2,"ssd",100,131072,3,0],...],
//!  "nodes":[[2,"10.0.0.2:7000"],...],
//!  "pools":[{"id":1,"pg_count":128,"replicas":3,"min_size":2,"object_size":131072,
//!            "failure_domain":"host","device_class":null,"chunk_pgs":1024,"chunks":[12]}]}
//! ```
//! A device is `[id, node, class, weight, object_size, flags, down_since]` with flags
//! 1 = up, 2 = in, 4 = out automatically, and `down_since` 0 while up. `chunks[i]` is the epoch
//! that wrote chunk `i` of the pool (its stored key names it).
//!
//! A chunk is `[entry, ...]`, one entry per PG: `[up, since]` when `acting == up`, else
//! `[up, acting, since]`, device lists as arrays of ids.

use crate::map::{ClusterMap, DeviceInfo, FailureDomain, NodeInfo, PgMap, PoolMap};
use basalt_types::{ChunkId, DeviceId, Epoch, MapCodec, MapParts, NodeId, PoolId};
use serde::de::{self, SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeSet;

/// The format version of the stored map. Version 1 was one JSON value under `/basalt/map`.
pub const MAP_FORMAT: u32 = 2;
/// PGs per stored chunk.
pub const CHUNK_PGS: u32 = 1024;

const UP: u8 = 1;
const IN: u8 = 2;
const AUTO_OUT: u8 = 4;

#[derive(Serialize, Deserialize)]
struct Header {
    v: u32,
    epoch: Epoch,
    devices: Vec<DeviceEntry>,
    nodes: Vec<(NodeId, String)>,
    pools: Vec<PoolHeader>,
}

/// `[id, node, class, weight, object_size, flags, down_since]`.
#[derive(Serialize, Deserialize)]
struct DeviceEntry(DeviceId, NodeId, String, u32, u32, u8, u64);

#[derive(Serialize, Deserialize)]
struct PoolHeader {
    id: PoolId,
    pg_count: u32,
    replicas: u8,
    min_size: u8,
    object_size: u32,
    failure_domain: FailureDomain,
    device_class: Option<String>,
    chunk_pgs: u32,
    chunks: Vec<Epoch>,
}

#[derive(Deserialize)]
struct Probe {
    v: u32,
}

impl MapCodec for ClusterMap {
    fn to_parts(&self, prev: Option<&MapParts>) -> MapParts {
        let prev_header = prev.and_then(|p| parse_header(&p.header).ok());
        let mut parts = MapParts::default();
        let mut pools = Vec::new();
        for (id, pool) in &self.pools {
            let before = prev_header.as_ref().and_then(|h| {
                h.pools
                    .iter()
                    .find(|p| p.id == *id && p.pg_count == pool.pg_count)
            });
            let mut written = Vec::new();
            for (index, pgs) in pool.pgs.chunks(CHUNK_PGS as usize).enumerate() {
                let bytes = encode_chunk(pgs);
                let index = index as u32;
                let reuse = before
                    .and_then(|b| b.chunks.get(index as usize))
                    .filter(|e| {
                        let old = ChunkId {
                            pool: *id,
                            index,
                            written: **e,
                        };
                        prev.and_then(|p| p.chunks.get(&old)) == Some(&bytes)
                    });
                let epoch = reuse.copied().unwrap_or(self.epoch);
                written.push(epoch);
                let chunk = ChunkId {
                    pool: *id,
                    index,
                    written: epoch,
                };
                parts.chunks.insert(chunk, bytes);
            }
            pools.push(PoolHeader {
                id: *id,
                pg_count: pool.pg_count,
                replicas: pool.replicas,
                min_size: pool.min_size,
                object_size: pool.object_size,
                failure_domain: pool.failure_domain,
                device_class: pool.device_class.clone(),
                chunk_pgs: CHUNK_PGS,
                chunks: written,
            });
        }
        let header = Header {
            v: MAP_FORMAT,
            epoch: self.epoch,
            devices: self.devices.iter().map(device_entry).collect(),
            nodes: self
                .nodes
                .iter()
                .map(|(id, n)| (*id, n.addr.clone()))
                .collect(),
            pools,
        };
        // Plain structs of numbers and strings always serialise.
        parts.header = serde_json::to_vec(&header).unwrap_or_default();
        parts
    }

    fn from_parts(parts: &MapParts) -> Result<ClusterMap, String> {
        let header = parse_header(&parts.header)?;
        let mut map = ClusterMap {
            epoch: header.epoch,
            ..ClusterMap::default()
        };
        for DeviceEntry(id, node, class, weight, object_size, flags, down) in header.devices {
            let info = DeviceInfo {
                node,
                class,
                weight,
                object_size,
                up: flags & UP != 0,
                r#in: flags & IN != 0,
                auto_out: flags & AUTO_OUT != 0,
                down_since: (down != 0).then_some(down),
            };
            map.devices.insert(id, info);
        }
        for (id, addr) in header.nodes {
            map.nodes.insert(id, NodeInfo { addr });
        }
        for p in header.pools {
            let pgs = pool_table(&p, parts, header.epoch)?;
            map.pools.insert(
                p.id,
                PoolMap {
                    pg_count: p.pg_count,
                    replicas: p.replicas,
                    min_size: p.min_size,
                    object_size: p.object_size,
                    failure_domain: p.failure_domain,
                    device_class: p.device_class,
                    pgs,
                },
            );
        }
        Ok(map)
    }

    fn epoch(&self) -> Epoch {
        self.epoch
    }
}

fn device_entry((id, d): (&DeviceId, &DeviceInfo)) -> DeviceEntry {
    let flag = |on: bool, bit: u8| if on { bit } else { 0 };
    let flags = flag(d.up, UP) | flag(d.r#in, IN) | flag(d.auto_out, AUTO_OUT);
    DeviceEntry(
        *id,
        d.node,
        d.class.clone(),
        d.weight,
        d.object_size,
        flags,
        d.down_since.unwrap_or(0),
    )
}

fn parse_header(bytes: &[u8]) -> Result<Header, String> {
    let probe: Probe =
        serde_json::from_slice(bytes).map_err(|e| format!("unreadable map header: {e}"))?;
    if probe.v != MAP_FORMAT {
        return Err(format!(
            "cluster map format version {} is not supported by this build (it reads version \
             {MAP_FORMAT}); upgrade basalt",
            probe.v
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| format!("unreadable map header: {e}"))
}

fn pool_table(p: &PoolHeader, parts: &MapParts, epoch: Epoch) -> Result<Vec<PgMap>, String> {
    let per = p.chunk_pgs.max(1) as usize;
    if p.chunks.len() != (p.pg_count as usize).div_ceil(per) {
        return Err(format!(
            "map epoch {epoch}: {} has {} PGs in {} chunks of {per}",
            p.id,
            p.pg_count,
            p.chunks.len()
        ));
    }
    let mut pgs = Vec::with_capacity(p.pg_count as usize);
    for (index, written) in p.chunks.iter().enumerate() {
        let id = ChunkId {
            pool: p.id,
            index: index as u32,
            written: *written,
        };
        let bytes = parts.chunks.get(&id).ok_or_else(|| {
            format!(
                "map epoch {epoch}: chunk {index} of {} (written at epoch {written}) is missing",
                p.id
            )
        })?;
        let entries: Vec<PgEntry> = serde_json::from_slice(bytes)
            .map_err(|e| format!("map epoch {epoch}: chunk {index} of {}: {e}", p.id))?;
        let want = per.min(p.pg_count as usize - index * per);
        if entries.len() != want {
            return Err(format!(
                "map epoch {epoch}: chunk {index} of {} holds {} PGs, expected {want}",
                p.id,
                entries.len()
            ));
        }
        pgs.extend(entries.into_iter().map(|e| e.0));
    }
    Ok(pgs)
}

fn encode_chunk(pgs: &[PgMap]) -> Vec<u8> {
    let entries: Vec<PgEntryRef<'_>> = pgs.iter().map(PgEntryRef).collect();
    serde_json::to_vec(&entries).unwrap_or_default()
}

/// One PG as `[up, since]` or `[up, acting, since]`.
struct PgEntryRef<'a>(&'a PgMap);
struct PgEntry(PgMap);

impl Serialize for PgEntryRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let pg = self.0;
        let same = pg.acting == pg.up;
        let mut seq = s.serialize_seq(Some(if same { 2 } else { 3 }))?;
        seq.serialize_element(&pg.up)?;
        if !same {
            seq.serialize_element(&pg.acting)?;
        }
        seq.serialize_element(&pg.since)?;
        seq.end()
    }
}

impl<'de> Deserialize<'de> for PgEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PgEntry, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PgEntry;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a PG entry [up, since] or [up, acting, since]")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PgEntry, A::Error> {
                let missing = || de::Error::custom("a PG entry needs 2 or 3 elements");
                let up: Vec<DeviceId> = seq.next_element()?.ok_or_else(missing)?;
                let second: Second = seq.next_element()?.ok_or_else(missing)?;
                let (acting, since) = match second {
                    Second::Since(e) => (up.clone(), e),
                    Second::Acting(a) => (a, seq.next_element()?.ok_or_else(missing)?),
                };
                if seq.next_element::<de::IgnoredAny>()?.is_some() {
                    return Err(de::Error::custom("a PG entry has at most 3 elements"));
                }
                Ok(PgEntry(PgMap { up, acting, since }))
            }
        }
        d.deserialize_seq(V)
    }
}

/// The second element of an entry: the epoch (acting = up) or the acting set.
#[derive(Deserialize)]
#[serde(untagged)]
enum Second {
    Since(Epoch),
    Acting(Vec<DeviceId>),
}

/// The ids of the chunks `parts`' header names (any others in `parts` are left-overs of a
/// publication that did not finish).
pub fn named_chunks(parts: &MapParts) -> Result<BTreeSet<ChunkId>, String> {
    let header = parse_header(&parts.header)?;
    let mut out = BTreeSet::new();
    for p in header.pools {
        for (index, written) in p.chunks.iter().enumerate() {
            out.insert(ChunkId {
                pool: p.id,
                index: index as u32,
                written: *written,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::tests::small_map;

    fn big_map(pgs: u32) -> ClusterMap {
        let mut map = small_map();
        let pool = map.pools.get_mut(&PoolId(1)).expect("pool");
        pool.pg_count = pgs;
        pool.pgs = (0..pgs)
            .map(|i| PgMap {
                up: vec![DeviceId(1 + i % 2), DeviceId(2 - i % 2)],
                acting: if i % 7 == 0 {
                    vec![DeviceId(2)]
                } else {
                    vec![DeviceId(1 + i % 2), DeviceId(2 - i % 2)]
                },
                since: Epoch(u64::from(i % 3)),
            })
            .collect();
        map.devices.get_mut(&DeviceId(2)).expect("dev").up = false;
        map.devices.get_mut(&DeviceId(2)).expect("dev").down_since = Some(77);
        map
    }

    #[test]
    fn parts_round_trip_and_unchanged_chunks_keep_their_key() {
        let map = big_map(2500);
        let parts = map.to_parts(None);
        assert_eq!(parts.chunks.len(), 3);
        assert!(parts.chunks.keys().all(|c| c.written == map.epoch));
        let header = String::from_utf8(parts.header.clone()).expect("utf8");
        assert!(header.starts_with(r#"{"v":2,"epoch":3,"#), "{header}");
        assert!(header.contains(r#"[2,1,"ssd",1,131072,2,77]"#), "{header}");
        let back = ClusterMap::from_parts(&parts).expect("decode");
        assert_eq!(back, map);

        // One PG of the last chunk changes in the next epoch: only that chunk is new.
        let mut next = map.clone();
        next.epoch = Epoch(4);
        let pool = next.pools.get_mut(&PoolId(1)).expect("pool");
        pool.pgs[2400].acting = vec![DeviceId(1)];
        let next_parts = next.to_parts(Some(&parts));
        let fresh: Vec<u32> = next_parts
            .chunks
            .keys()
            .filter(|c| c.written == Epoch(4))
            .map(|c| c.index)
            .collect();
        assert_eq!(fresh, vec![2]);
        // Read back with a left-over chunk of another epoch beside them: ignored.
        let mut stored = next_parts.clone();
        stored.chunks.extend(parts.chunks.clone());
        assert_eq!(ClusterMap::from_parts(&stored).expect("decode"), next);
        assert_eq!(named_chunks(&stored).expect("header").len(), 3);
    }

    #[test]
    fn entries_are_compact_arrays() {
        let map = big_map(8);
        let parts = map.to_parts(None);
        let chunk = String::from_utf8(parts.chunks.values().next().expect("chunk").clone());
        let chunk = chunk.expect("utf8");
        assert!(chunk.starts_with(r#"[[[1,2],[2],0],[[2,1],1],"#), "{chunk}");
    }

    #[test]
    fn bad_parts_are_refused_with_a_reason() {
        let parts = big_map(2500).to_parts(None);
        let mut missing = parts.clone();
        let first = *missing.chunks.keys().next().expect("chunk");
        missing.chunks.remove(&first);
        let e = ClusterMap::from_parts(&missing).expect_err("missing chunk");
        assert!(
            e.contains("chunk 0 of pool.1") && e.contains("missing"),
            "{e}"
        );
        let mut future = parts.clone();
        future.header = String::from_utf8(parts.header.clone())
            .expect("utf8")
            .replacen(r#""v":2"#, r#""v":3"#, 1)
            .into_bytes();
        let e = ClusterMap::from_parts(&future).expect_err("v3");
        assert!(e.contains("upgrade basalt"), "{e}");
        let mut short = parts.clone();
        short.chunks.insert(first, b"[[[1],1]]".to_vec());
        let e = ClusterMap::from_parts(&short).expect_err("short chunk");
        assert!(e.contains("holds 1 PGs, expected 1024"), "{e}");
        let mut junk = parts;
        junk.chunks.insert(first, b"[[[1],1,2,3]]".to_vec());
        assert!(ClusterMap::from_parts(&junk).is_err());
    }
}
