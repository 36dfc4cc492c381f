//! The slot table: what is durably on disk for every slot (owner, its PG and version, last
//! record applied, allocation bitmap, CRC per block), and its encoding as pages.
//!
//! In memory this is the "disk image" `D` the write-back updates; on disk each page has two
//! copies written alternately (see `pages.rs`). Format in docs/design/on-disk-format.md.

use crate::buf::AlignedBuf;
use crate::codec::{Le, LeMut};
use crate::layout::{ENTRY_FIXED, PAGE_HEADER, Superblock, TableGeom};
use crate::pages::{self, PageGens, PageStamp, SLOT_PAGES};
use basalt_types::{ObjectId, PoolId, Version, VolumeId};

/// The durable state of every slot, as of the last completed write-back (plus the batch being
/// written back). Memory per slot: 24 (owner) + 16 (version) + 8 (seq) + 4 (PG) + 1 (used)
/// + 8 per 64 blocks (bitmap) + 4 per block (CRCs): 189 bytes for 128 KiB objects.
pub(crate) struct SlotTable {
    pub blocks: u32,
    words: usize,
    owner: Vec<ObjectId>,
    used: Vec<bool>,
    version: Vec<Version>,
    seq: Vec<u64>,
    pg: Vec<u32>,
    bitmap: Vec<u64>,
    crcs: Vec<u32>,
    pub gens: PageGens,
    geom: TableGeom,
}

impl SlotTable {
    pub fn new(sb: &Superblock) -> SlotTable {
        let n = sb.slot_count as usize;
        let blocks = sb.blocks_per_object();
        let words = (blocks as usize).div_ceil(64);
        SlotTable {
            blocks,
            words,
            owner: vec![ObjectId::default(); n],
            used: vec![false; n],
            version: vec![Version::NONE; n],
            seq: vec![0; n],
            pg: vec![0; n],
            bitmap: vec![0; n * words],
            crcs: vec![0; n * blocks as usize],
            gens: PageGens::new(SLOT_PAGES, sb.slots.pages),
            geom: sb.slots,
        }
    }

    pub fn slots(&self) -> u32 {
        self.used.len() as u32
    }
    pub fn is_used(&self, s: u32) -> bool {
        self.used[s as usize]
    }
    pub fn owner(&self, s: u32) -> ObjectId {
        self.owner[s as usize]
    }
    pub fn version(&self, s: u32) -> Version {
        self.version[s as usize]
    }
    pub fn pg(&self, s: u32) -> u32 {
        self.pg[s as usize]
    }
    pub fn seq(&self, s: u32) -> u64 {
        self.seq[s as usize]
    }
    pub fn page_of(&self, s: u32) -> u64 {
        u64::from(s / self.geom.per_page)
    }
    pub fn allocated(&self, s: u32, b: u32) -> bool {
        let w = self.bitmap[s as usize * self.words + b as usize / 64];
        w & (1u64 << (b % 64)) != 0
    }
    pub fn crc(&self, s: u32, b: u32) -> u32 {
        self.crcs[s as usize * self.blocks as usize + b as usize]
    }
    /// Allocated blocks of `s`.
    pub fn allocated_blocks(&self, s: u32) -> u32 {
        let i = s as usize * self.words;
        self.bitmap[i..i + self.words]
            .iter()
            .map(|w| w.count_ones())
            .sum()
    }

    /// Makes `s` owned by `oid` (of PG `pg`) at `version`, last touched by record `seq`.
    pub fn claim(&mut self, s: u32, oid: ObjectId, pg: u32, version: Version, seq: u64) {
        let i = s as usize;
        if !self.used[i] || self.owner[i] != oid {
            self.clear_blocks(s);
        }
        self.used[i] = true;
        self.owner[i] = oid;
        self.pg[i] = pg;
        self.version[i] = version;
        self.seq[i] = seq;
    }

    /// Releases `s` (no owner, no blocks) as of record `seq`.
    pub fn release(&mut self, s: u32, seq: u64) {
        let i = s as usize;
        self.used[i] = false;
        self.owner[i] = ObjectId::default();
        self.pg[i] = 0;
        self.version[i] = Version::NONE;
        self.seq[i] = seq;
        self.clear_blocks(s);
    }

    fn clear_blocks(&mut self, s: u32) {
        let i = s as usize;
        self.bitmap[i * self.words..(i + 1) * self.words].fill(0);
        let b = self.blocks as usize;
        self.crcs[i * b..(i + 1) * b].fill(0);
    }

    /// Sets block `b` of `s`: `Some(crc)` = allocated with that CRC, `None` = unallocated.
    pub fn set_block(&mut self, s: u32, b: u32, crc: Option<u32>) {
        let wi = s as usize * self.words + b as usize / 64;
        let bit = 1u64 << (b % 64);
        let ci = s as usize * self.blocks as usize + b as usize;
        match crc {
            Some(c) => {
                self.bitmap[wi] |= bit;
                self.crcs[ci] = c;
            }
            None => {
                self.bitmap[wi] &= !bit;
                self.crcs[ci] = 0;
            }
        }
    }

    /// Encodes page `page` at `generation`, for write-back batch `batch`.
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
        let last = (first + g.per_page as usize).min(self.used.len());
        for (k, s) in (first..last).enumerate() {
            let at = PAGE_HEADER + k * g.record as usize;
            self.encode_entry(s, &mut buf[at..at + g.record as usize]);
        }
        pages::seal_page(
            &mut buf,
            &PageStamp {
                kind: SLOT_PAGES,
                page,
                generation,
                batch,
                uuid,
                records: (last - first) as u32,
                record_size: g.record,
            },
        );
        buf
    }

    fn encode_entry(&self, s: usize, out: &mut [u8]) {
        let mut w = LeMut(out);
        w.u8(0, u8::from(self.used[s]));
        w.u32(4, self.owner[s].pool.0);
        w.u64(8, self.owner[s].volume.0);
        w.u64(16, self.owner[s].index);
        w.u64(24, self.version[s].epoch);
        w.u64(32, self.version[s].seq);
        w.u64(40, self.seq[s]);
        w.u32(48, self.pg[s]);
        for k in 0..self.words {
            w.u64(ENTRY_FIXED + 8 * k, self.bitmap[s * self.words + k]);
        }
        let crc_at = ENTRY_FIXED + 8 * self.words;
        let b = self.blocks as usize;
        for k in 0..b {
            w.u32(crc_at + 4 * k, self.crcs[s * b + k]);
        }
    }

    /// Loads page `page` from its two copies (see `pages::pick`); returns the generation
    /// loaded (0: nothing valid, the page's slots stay empty) and the copies of an interrupted
    /// batch.
    pub fn load_page(
        &mut self,
        page: u64,
        copies: [&[u8]; 2],
        uuid: &[u8; 16],
        header_gen: u64,
    ) -> pages::Loaded {
        let g = self.geom;
        let states = copies.map(|c| pages::classify(c, SLOT_PAGES, page, uuid, &g));
        let (chosen, loaded) = pages::pick(states, header_gen);
        let Some((i, generation)) = chosen else {
            return loaded;
        };
        self.gens.set_loaded(page, generation);
        let buf = copies[i];
        let first = page as usize * g.per_page as usize;
        let last = (first + g.per_page as usize).min(self.used.len());
        for (k, s) in (first..last).enumerate() {
            let at = PAGE_HEADER + k * g.record as usize;
            self.decode_entry(s, &buf[at..at + g.record as usize]);
        }
        loaded
    }

    fn decode_entry(&mut self, s: usize, buf: &[u8]) {
        let r = Le(buf);
        let get64 = |at| r.u64(at).unwrap_or(0);
        self.used[s] = r.u8(0) == Some(1);
        self.owner[s] = ObjectId::new(PoolId(r.u32(4).unwrap_or(0)), VolumeId(get64(8)), get64(16));
        self.version[s] = Version::new(get64(24), get64(32));
        self.seq[s] = get64(40);
        self.pg[s] = r.u32(48).unwrap_or(0);
        for k in 0..self.words {
            self.bitmap[s * self.words + k] = get64(ENTRY_FIXED + 8 * k);
        }
        let crc_at = ENTRY_FIXED + 8 * self.words;
        let b = self.blocks as usize;
        for k in 0..b {
            self.crcs[s * b + k] = r.u32(crc_at + 4 * k).unwrap_or(0);
        }
        if !self.used[s] {
            self.clear_blocks(s as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_types::DeviceId;

    fn table() -> (Superblock, SlotTable) {
        let sb =
            Superblock::plan([3; 16], DeviceId(1), 128 * 1024, 64 << 20, Some(4 << 20)).unwrap();
        let t = SlotTable::new(&sb);
        (sb, t)
    }

    #[test]
    fn page_roundtrip_and_copy_choice() {
        let (sb, mut t) = table();
        let oid = ObjectId::new(PoolId(1), VolumeId(9), 4);
        t.claim(2, oid, 17, Version::new(3, 7), 100);
        t.set_block(2, 5, Some(0xdead));
        let a = t.encode_page(0, 1, 1, &sb.uuid);
        t.set_block(2, 6, Some(0xbeef));
        let b = t.encode_page(0, 2, 2, &sb.uuid);
        let mut u = SlotTable::new(&sb);
        assert_eq!(u.load_page(0, [&a, &b], &sb.uuid, 2).generation, 2);
        assert_eq!(
            (u.owner(2), u.pg(2), u.version(2), u.seq(2)),
            (oid, 17, Version::new(3, 7), 100)
        );
        assert_eq!(u.crc(2, 6), 0xbeef);
        assert!(u.allocated(2, 5) && !u.allocated(2, 4));
        assert_eq!(u.allocated_blocks(2), 2);
        // A copy from an interrupted batch (3 > header 2) is not used.
        let c = t.encode_page(0, 3, 3, &sb.uuid);
        let mut v = SlotTable::new(&sb);
        let loaded = v.load_page(0, [&c, &b], &sb.uuid, 2);
        assert_eq!(loaded.generation, 2);
        assert_eq!(
            loaded.interrupted,
            [Some(3), None],
            "recovery erases copy 0"
        );
        // A torn newest copy: the older one is loaded (the tables hash decides whether that
        // is allowed, see recover.rs).
        let mut torn = AlignedBuf::copy_from(&b);
        torn[3000] ^= 1;
        let mut w = SlotTable::new(&sb);
        assert_eq!(w.load_page(0, [&a, &torn], &sb.uuid, 2).generation, 1);
        assert!(!w.allocated(2, 6) && w.allocated(2, 5));
    }
}
