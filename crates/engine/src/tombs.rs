//! The tombstone table: deleted objects whose version is kept, so that a replica that missed a
//! delete (or a trim that emptied an object) can tell "deleted at version v" from "never
//! written", and a re-created object is never mistaken for an older one.
//!
//! Like the slot table, its image here is what is durably on disk as of the last write-back;
//! records are indexed by a record number handed out by [`crate::alloc::FreeBits`]. Only used
//! records are held in memory (tombstones are few while a PG is healthy: they are trimmed once
//! every member has seen them), so the table costs memory only for tombstones that exist.

use crate::buf::AlignedBuf;
use crate::codec::{Le, LeMut};
use crate::hash::FxHashMap;
use crate::layout::{PAGE_HEADER, Superblock, TableGeom};
use crate::pages::{self, PageGens, PageStamp, TOMB_PAGES};
use basalt_types::{ObjectId, PoolId, Version, VolumeId};

/// One tombstone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TombRec {
    pub oid: ObjectId,
    pub pg: u32,
    pub version: Version,
}

pub(crate) struct TombTable {
    recs: FxHashMap<u32, TombRec>,
    pub gens: PageGens,
    geom: TableGeom,
}

impl TombTable {
    pub fn new(sb: &Superblock) -> TombTable {
        TombTable {
            recs: FxHashMap::default(),
            gens: PageGens::new(TOMB_PAGES, sb.tombs.pages),
            geom: sb.tombs,
        }
    }

    pub fn capacity(&self) -> u64 {
        self.geom.capacity()
    }

    pub fn page_of(&self, i: u32) -> u64 {
        u64::from(i / self.geom.per_page)
    }

    pub fn set(&mut self, i: u32, rec: TombRec) {
        self.recs.insert(i, rec);
    }

    pub fn clear(&mut self, i: u32) {
        self.recs.remove(&i);
    }

    /// Every used record.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &TombRec)> {
        self.recs.iter().map(|(i, r)| (*i, r))
    }

    pub fn encode_page(
        &self,
        page: u64,
        generation: u64,
        batch: u64,
        uuid: &[u8; 16],
    ) -> AlignedBuf {
        let g = self.geom;
        let mut buf = AlignedBuf::zeroed(g.page_size as usize);
        let first = page * u64::from(g.per_page);
        for k in 0..u64::from(g.per_page) {
            if let Some(rec) = self.recs.get(&((first + k) as u32)) {
                let at = PAGE_HEADER + k as usize * g.record as usize;
                encode(rec, &mut buf[at..at + g.record as usize]);
            }
        }
        pages::seal_page(
            &mut buf,
            &PageStamp {
                kind: TOMB_PAGES,
                page,
                generation,
                batch,
                uuid,
                records: g.per_page,
                record_size: g.record,
            },
        );
        buf
    }

    /// Loads page `page` (see `pages::pick`); returns the generation loaded and the copies of
    /// an interrupted batch.
    pub fn load_page(
        &mut self,
        page: u64,
        copies: [&[u8]; 2],
        uuid: &[u8; 16],
        header_gen: u64,
    ) -> pages::Loaded {
        let g = self.geom;
        let states = copies.map(|c| pages::classify(c, TOMB_PAGES, page, uuid, &g));
        let (chosen, loaded) = pages::pick(states, header_gen);
        let Some((i, generation)) = chosen else {
            return loaded;
        };
        self.gens.set_loaded(page, generation);
        let first = page * u64::from(g.per_page);
        for k in 0..u64::from(g.per_page) {
            let at = PAGE_HEADER + k as usize * g.record as usize;
            if let Some(rec) = decode(&copies[i][at..at + g.record as usize]) {
                self.recs.insert((first + k) as u32, rec);
            }
        }
        loaded
    }
}

fn encode(rec: &TombRec, out: &mut [u8]) {
    let mut w = LeMut(out);
    w.u8(0, 1);
    w.u32(4, rec.oid.pool.0);
    w.u32(8, rec.pg);
    w.u64(16, rec.oid.volume.0);
    w.u64(24, rec.oid.index);
    w.u64(32, rec.version.epoch);
    w.u64(40, rec.version.seq);
}

fn decode(buf: &[u8]) -> Option<TombRec> {
    let r = Le(buf);
    if r.u8(0)? != 1 {
        return None;
    }
    Some(TombRec {
        oid: ObjectId::new(PoolId(r.u32(4)?), VolumeId(r.u64(16)?), r.u64(24)?),
        pg: r.u32(8)?,
        version: Version::new(r.u64(32)?, r.u64(40)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_types::DeviceId;

    #[test]
    fn page_roundtrip() {
        let sb = Superblock::plan([2; 16], DeviceId(1), 128 * 1024, 64 << 20, None).unwrap();
        let mut t = TombTable::new(&sb);
        let rec = TombRec {
            oid: ObjectId::new(PoolId(3), VolumeId(4), 5),
            pg: 6,
            version: Version::new(7, 8),
        };
        let per_page = sb.tombs.per_page;
        t.set(per_page + 2, rec);
        let page = t.encode_page(1, 1, 1, &sb.uuid);
        let empty = AlignedBuf::zeroed(page.len());
        let mut u = TombTable::new(&sb);
        assert_eq!(u.load_page(1, [&empty, &page], &sb.uuid, 1).generation, 1);
        assert_eq!(u.iter().collect::<Vec<_>>(), vec![(per_page + 2, &rec)]);
        assert_eq!(u.page_of(per_page + 2), 1);
    }
}
