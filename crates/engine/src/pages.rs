//! Pages of the store's three tables (slot table, tombstone table, PG table): the common page
//! header, the choice between a page's two copies, and the tables hash that proves no page fell
//! back to an older copy.
//!
//! Every page has two copies; write-back writes generation `g` of a page into copy `g % 2`, so the
//! other copy keeps generation `g - 1` intact while `g` is written. Each copy also records the
//! *batch* (the journal-header generation that write-back will write once the copy is durable).
//! Loading takes, per page, the valid copy with the highest generation whose batch is not newer
//! than the journal header found: copies of an interrupted batch are ignored (the journal still
//! holds that batch's records and replays them), and recovery erases them ([`pick`]).
//!
//! A torn or damaged copy is then indistinguishable from "this page was not rewritten" — unless
//! the journal header says which generations to expect. It does, compactly: the header carries
//! the XOR over every page of `mix(table, page, generation)`. A page that silently fell back to
//! an older copy (media damage on the newest one after its batch completed) changes the hash, and
//! the store refuses to open (`Corrupt`) instead of serving state from before the damage.

use crate::codec::{Le, LeMut};
use crate::crc::crc32c_skipping;
use crate::layout::TableGeom;

pub(crate) const PAGE_VERSION: u16 = 2;
const CRC_AT: usize = 60;

/// Which table a page belongs to: its magic and its tag in the tables hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PageKind {
    pub magic: u32,
    pub tag: u64,
    pub name: &'static str,
}

pub(crate) const SLOT_PAGES: PageKind = PageKind {
    magic: u32::from_le_bytes(*b"BMPG"),
    tag: 1,
    name: "slot table",
};
pub(crate) const TOMB_PAGES: PageKind = PageKind {
    magic: u32::from_le_bytes(*b"BTPG"),
    tag: 2,
    name: "tombstone table",
};
pub(crate) const PG_PAGES: PageKind = PageKind {
    magic: u32::from_le_bytes(*b"BPPG"),
    tag: 3,
    name: "PG table",
};

/// The identity of one page copy as written.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PageStamp<'a> {
    pub kind: PageKind,
    pub page: u64,
    pub generation: u64,
    pub batch: u64,
    pub uuid: &'a [u8; 16],
    pub records: u32,
    pub record_size: u32,
}

/// Writes the header of a page copy (records must already be in `buf`) and seals it with the CRC.
pub(crate) fn seal_page(buf: &mut [u8], s: &PageStamp<'_>) {
    {
        let mut w = LeMut(buf);
        w.u32(0, s.kind.magic);
        w.u16(4, PAGE_VERSION);
        w.u64(8, s.page);
        w.u64(16, s.generation);
        w.bytes(24, s.uuid);
        w.u32(40, s.records);
        w.u32(44, s.record_size);
        w.u64(48, s.batch);
    }
    let crc = crc32c_skipping(buf, CRC_AT);
    LeMut(buf).u32(CRC_AT, crc);
}

/// What one copy of a page turned out to be when read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CopyState {
    Valid {
        generation: u64,
        batch: u64,
    },
    /// Not a complete copy of this page written by this store: never written, torn, damaged,
    /// or left over from an earlier format (another uuid).
    Invalid,
}

pub(crate) fn classify(
    buf: &[u8],
    kind: PageKind,
    page: u64,
    uuid: &[u8; 16],
    geom: &TableGeom,
) -> CopyState {
    let r = Le(buf);
    let record_size = geom.record;
    let ours = buf.len() == geom.page_size as usize
        && r.u32(0) == Some(kind.magic)
        && r.u16(4) == Some(PAGE_VERSION)
        && r.u64(8) == Some(page)
        && r.bytes16(24).as_ref() == Some(uuid)
        && r.u32(44) == Some(record_size)
        && r.u32(CRC_AT) == Some(crc32c_skipping(buf, CRC_AT));
    match (ours, r.u64(16), r.u64(48)) {
        (true, Some(generation), Some(batch)) if generation > 0 => {
            CopyState::Valid { generation, batch }
        }
        _ => CopyState::Invalid,
    }
}

/// The copy to load: the valid one with the highest generation written by a batch that
/// completed (`batch <= header_gen`). `None`: the page holds nothing (generation 0).
pub(crate) fn choose(states: [CopyState; 2], header_gen: u64) -> Option<(usize, u64)> {
    let mut best: Option<(usize, u64)> = None;
    for (i, st) in states.iter().enumerate() {
        if let CopyState::Valid { generation, batch } = *st
            && batch <= header_gen
            && best.is_none_or(|(_, g)| generation > g)
        {
            best = Some((i, generation));
        }
    }
    best
}

/// What loading one page found: the generation loaded (0: the page holds nothing) and the
/// batch of each copy an interrupted batch wrote (`batch > header_gen`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Loaded {
    pub generation: u64,
    pub interrupted: [Option<u64>; 2],
}

/// The copy to load ([`choose`]) and the copies of an interrupted batch. Recovery erases the
/// latter: the next batch after it completes with the same number as the interrupted one, and
/// if that batch does not rewrite the page (the records that changed it were cut as a torn
/// tail) such a copy would count from then on, newer than the tables hash expects.
pub(crate) fn pick(states: [CopyState; 2], header_gen: u64) -> (Option<(usize, u64)>, Loaded) {
    let chosen = choose(states, header_gen);
    let interrupted = states.map(|st| match st {
        CopyState::Valid { batch, .. } if batch > header_gen => Some(batch),
        _ => None,
    });
    let generation = chosen.map_or(0, |(_, g)| g);
    (
        chosen,
        Loaded {
            generation,
            interrupted,
        },
    )
}

/// This page's share of the tables hash at `generation` (0 = never written: no share).
pub(crate) fn page_hash(kind: PageKind, page: u64, generation: u64) -> u64 {
    if generation == 0 {
        return 0;
    }
    mix(mix(kind.tag << 56 ^ page) ^ generation)
}

/// The splitmix64 finaliser: a cheap, well-mixing 64-bit permutation.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Generations of one table's pages, and the running hash over them.
#[derive(Clone, Debug)]
pub(crate) struct PageGens {
    pub kind: PageKind,
    gens: Vec<u64>,
}

impl PageGens {
    pub fn new(kind: PageKind, pages: u64) -> PageGens {
        PageGens {
            kind,
            gens: vec![0; pages as usize],
        }
    }

    pub fn set_loaded(&mut self, page: u64, generation: u64) {
        self.gens[page as usize] = generation;
    }

    /// Moves `page` to its next generation; returns it and the change to the tables hash.
    pub fn bump(&mut self, page: u64) -> (u64, u64) {
        let old = self.gens[page as usize];
        let new = old.checked_add(1).expect("page generation overflow");
        self.gens[page as usize] = new;
        (
            new,
            page_hash(self.kind, page, old) ^ page_hash(self.kind, page, new),
        )
    }

    /// The XOR of every page's share.
    pub fn hash(&self) -> u64 {
        self.gens
            .iter()
            .enumerate()
            .fold(0, |h, (p, g)| h ^ page_hash(self.kind, p as u64, *g))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(generation: u64, batch: u64) -> Vec<u8> {
        let mut buf = vec![0u8; 4096];
        buf[100] = generation as u8;
        seal_page(
            &mut buf,
            &PageStamp {
                kind: SLOT_PAGES,
                page: 3,
                generation,
                batch,
                uuid: &[4; 16],
                records: 1,
                record_size: 64,
            },
        );
        buf
    }

    fn geom(record: u32) -> TableGeom {
        TableGeom {
            offset: 0,
            page_size: 4096,
            per_page: 1,
            pages: 8,
            record,
        }
    }

    fn state(buf: &[u8]) -> CopyState {
        classify(buf, SLOT_PAGES, 3, &[4; 16], &geom(64))
    }

    #[test]
    fn newest_completed_copy_wins() {
        let (a, b) = (copy(4, 10), copy(5, 11));
        // Batch 11 completed: generation 5.
        assert_eq!(choose([state(&a), state(&b)], 11), Some((1, 5)));
        // Batch 11 did not complete (header still at 10): generation 4, replay redoes 11.
        assert_eq!(choose([state(&a), state(&b)], 10), Some((0, 4)));
        // A flipped bit, another page number, kind, uuid or record size: invalid.
        let mut torn = b.clone();
        torn[2000] ^= 1;
        assert_eq!(state(&torn), CopyState::Invalid);
        let g = geom(64);
        assert_eq!(
            classify(&b, TOMB_PAGES, 3, &[4; 16], &g),
            CopyState::Invalid
        );
        assert_eq!(
            classify(&b, SLOT_PAGES, 2, &[4; 16], &g),
            CopyState::Invalid
        );
        assert_eq!(
            classify(&b, SLOT_PAGES, 3, &[5; 16], &g),
            CopyState::Invalid
        );
        assert_eq!(
            classify(&b, SLOT_PAGES, 3, &[4; 16], &geom(48)),
            CopyState::Invalid
        );
        assert_eq!(
            classify(&b[..2048], SLOT_PAGES, 3, &[4; 16], &g),
            CopyState::Invalid
        );
        assert_eq!(choose([state(&a), state(&torn)], 11), Some((0, 4)));
        assert_eq!(choose([CopyState::Invalid; 2], 11), None);
    }

    #[test]
    fn hash_sees_a_fallback() {
        let mut g = PageGens::new(SLOT_PAGES, 8);
        let mut running = 0;
        for p in [1, 3, 3, 7, 1] {
            running ^= g.bump(p).1;
        }
        assert_eq!(running, g.hash());
        // The same page at an older generation gives another hash.
        let mut older = g.clone();
        older.set_loaded(3, 1);
        assert_ne!(older.hash(), g.hash());
        // Never-written pages have no share.
        assert_eq!(PageGens::new(SLOT_PAGES, 8).hash(), 0);
        // The kinds do not cancel each other out.
        let mut t = PageGens::new(TOMB_PAGES, 8);
        t.bump(1);
        let mut s = PageGens::new(SLOT_PAGES, 8);
        s.bump(1);
        assert_ne!(t.hash() ^ s.hash(), 0);
    }
}
