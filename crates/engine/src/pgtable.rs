//! The PG table: one record per placement group the store holds data of. A record carries the
//! PG's log tail (the newest version of a tombstone that was trimmed away: changes up to it can
//! no longer be listed) and a fixed-size blob that belongs to the store's user (the node keeps
//! its per-PG replication state there, persisted atomically with the writes it describes).

use crate::buf::AlignedBuf;
use crate::codec::{Le, LeMut};
use crate::layout::{PAGE_HEADER, PG_BLOB, Superblock, TableGeom};
use crate::pages::{self, PG_PAGES, PageGens, PageStamp};
use basalt_types::{PgId, PoolId, Version};

/// One PG record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PgRec {
    pub pg: PgId,
    pub log_tail: Version,
    pub blob: [u8; PG_BLOB],
}

pub(crate) struct PgTable {
    recs: Vec<Option<PgRec>>,
    pub gens: PageGens,
    geom: TableGeom,
}

impl PgTable {
    pub fn new(sb: &Superblock) -> PgTable {
        PgTable {
            recs: vec![None; sb.pgs.capacity() as usize],
            gens: PageGens::new(PG_PAGES, sb.pgs.pages),
            geom: sb.pgs,
        }
    }

    pub fn page_of(&self, i: u32) -> u64 {
        u64::from(i / self.geom.per_page)
    }

    pub fn set(&mut self, i: u32, rec: Option<PgRec>) {
        self.recs[i as usize] = rec;
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, &PgRec)> {
        self.recs
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.as_ref().map(|r| (i as u32, r)))
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
        let first = page as usize * g.per_page as usize;
        for k in 0..g.per_page as usize {
            if let Some(Some(rec)) = self.recs.get(first + k) {
                let at = PAGE_HEADER + k * g.record as usize;
                encode(rec, &mut buf[at..at + g.record as usize]);
            }
        }
        pages::seal_page(
            &mut buf,
            &PageStamp {
                kind: PG_PAGES,
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
        let states = copies.map(|c| pages::classify(c, PG_PAGES, page, uuid, &g));
        let (chosen, loaded) = pages::pick(states, header_gen);
        let Some((i, generation)) = chosen else {
            return loaded;
        };
        self.gens.set_loaded(page, generation);
        let first = page as usize * g.per_page as usize;
        for k in 0..g.per_page as usize {
            let at = PAGE_HEADER + k * g.record as usize;
            if let Some(slot) = self.recs.get_mut(first + k) {
                *slot = decode(&copies[i][at..at + g.record as usize]);
            }
        }
        loaded
    }
}

fn encode(rec: &PgRec, out: &mut [u8]) {
    let mut w = LeMut(out);
    w.u8(0, 1);
    w.u32(4, rec.pg.pool.0);
    w.u32(8, rec.pg.pg);
    w.u64(16, rec.log_tail.epoch);
    w.u64(24, rec.log_tail.seq);
    w.bytes(32, &rec.blob);
}

fn decode(buf: &[u8]) -> Option<PgRec> {
    let r = Le(buf);
    if r.u8(0)? != 1 {
        return None;
    }
    let mut blob = [0u8; PG_BLOB];
    blob.copy_from_slice(buf.get(32..32 + PG_BLOB)?);
    Some(PgRec {
        pg: PgId {
            pool: PoolId(r.u32(4)?),
            pg: r.u32(8)?,
        },
        log_tail: Version::new(r.u64(16)?, r.u64(24)?),
        blob,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_types::DeviceId;

    #[test]
    fn page_roundtrip() {
        let sb = Superblock::plan([2; 16], DeviceId(1), 128 * 1024, 64 << 20, None).unwrap();
        let mut t = PgTable::new(&sb);
        let mut blob = [0u8; PG_BLOB];
        blob[0] = 9;
        blob[PG_BLOB - 1] = 7;
        let rec = PgRec {
            pg: PgId {
                pool: PoolId(2),
                pg: 77,
            },
            log_tail: Version::new(4, 40),
            blob,
        };
        t.set(3, Some(rec));
        let page = t.encode_page(0, 5, 5, &sb.uuid);
        let mut u = PgTable::new(&sb);
        assert_eq!(u.load_page(0, [&page, &page], &sb.uuid, 5).generation, 5);
        assert_eq!(u.iter().collect::<Vec<_>>(), vec![(3, &rec)]);
    }
}
