//! The slot table: what is durably on disk for every slot (owner, version, last record applied,
//! allocation bitmap, CRC per block), and its encoding as meta pages.
//!
//! In memory this is the "disk image" `D` the write-back updates; on disk each page has two
//! copies written alternately with a generation counter, so a torn page write leaves the
//! previous copy intact. Format in docs/design/on-disk-format.md.

use crate::buf::AlignedBuf;
use crate::codec::{Le, LeMut};
use crate::crc::crc32c_skipping;
use crate::error::EngineError;
use crate::layout::{ENTRY_FIXED, PAGE_HEADER, Superblock};
use basalt_types::{ObjectId, PoolId, VolumeId};

pub(crate) const PAGE_MAGIC: u32 = u32::from_le_bytes(*b"BMPG");
pub(crate) const PAGE_VERSION: u16 = 1;
const PAGE_CRC_AT: usize = 60;

/// The durable state of every slot, as of the last completed write-back (plus the batch being
/// written back). Memory: per slot 24 (owner) + 8 (version) + 8 (seq) + 1 (used) + 8 per 64
/// blocks (bitmap) + 4 per block (CRCs): 177 bytes for 128 KiB objects.
pub(crate) struct SlotTable {
    pub blocks: u32,
    words: usize,
    owner: Vec<ObjectId>,
    used: Vec<bool>,
    version: Vec<u64>,
    seq: Vec<u64>,
    bitmap: Vec<u64>,
    crcs: Vec<u32>,
    /// Generation of the newest copy of each page.
    pub page_gen: Vec<u64>,
    entries_per_page: u32,
    entry_size: usize,
    page_size: usize,
}

/// What a meta-page copy turned out to be when read back.
enum CopyState {
    Valid(u64),
    /// Has our magic, uuid and page number but a bad CRC: a torn write (or damage).
    Torn(u64),
    /// Never written by this store (zeros, or left over from an earlier format).
    Foreign,
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
            version: vec![0; n],
            seq: vec![0; n],
            bitmap: vec![0; n * words],
            crcs: vec![0; n * blocks as usize],
            page_gen: vec![0; sb.meta_pages as usize],
            entries_per_page: sb.entries_per_page,
            entry_size: sb.entry_size(),
            page_size: sb.meta_page_size as usize,
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
    pub fn version(&self, s: u32) -> u64 {
        self.version[s as usize]
    }
    pub fn seq(&self, s: u32) -> u64 {
        self.seq[s as usize]
    }
    pub fn page_of(&self, s: u32) -> u64 {
        u64::from(s / self.entries_per_page)
    }
    pub fn allocated(&self, s: u32, b: u32) -> bool {
        let w = self.bitmap[s as usize * self.words + b as usize / 64];
        w & (1u64 << (b % 64)) != 0
    }
    pub fn crc(&self, s: u32, b: u32) -> u32 {
        self.crcs[s as usize * self.blocks as usize + b as usize]
    }
    /// Makes `s` owned by `oid` at `version`, last touched by record `seq`.
    pub fn claim(&mut self, s: u32, oid: ObjectId, version: u64, seq: u64) {
        let i = s as usize;
        if !self.used[i] || self.owner[i] != oid {
            self.clear_blocks(s);
        }
        self.used[i] = true;
        self.owner[i] = oid;
        self.version[i] = version;
        self.seq[i] = seq;
    }

    /// Releases `s` (no owner, no blocks) as of record `seq`.
    pub fn release(&mut self, s: u32, seq: u64) {
        let i = s as usize;
        self.used[i] = false;
        self.owner[i] = ObjectId::default();
        self.version[i] = 0;
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

    /// Encodes page `page` with generation `generation`.
    pub fn encode_page(&self, page: u64, generation: u64, uuid: &[u8; 16]) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(self.page_size);
        let first = page as usize * self.entries_per_page as usize;
        let last = (first + self.entries_per_page as usize).min(self.used.len());
        {
            let mut w = LeMut(&mut buf);
            w.u32(0, PAGE_MAGIC);
            w.u16(4, PAGE_VERSION);
            w.u64(8, page);
            w.u64(16, generation);
            w.bytes(24, uuid);
            w.u32(40, (last - first) as u32);
            w.u32(44, self.entry_size as u32);
        }
        for (k, s) in (first..last).enumerate() {
            let at = PAGE_HEADER + k * self.entry_size;
            self.encode_entry(s, &mut buf[at..at + self.entry_size]);
        }
        let crc = crc32c_skipping(&buf, PAGE_CRC_AT);
        LeMut(&mut buf).u32(PAGE_CRC_AT, crc);
        buf
    }

    fn encode_entry(&self, s: usize, out: &mut [u8]) {
        let mut w = LeMut(out);
        w.u8(0, u8::from(self.used[s]));
        w.u32(4, self.owner[s].pool.0);
        w.u64(8, self.owner[s].volume.0);
        w.u64(16, self.owner[s].index);
        w.u64(24, self.version[s]);
        w.u64(32, self.seq[s]);
        for k in 0..self.words {
            w.u64(ENTRY_FIXED + 8 * k, self.bitmap[s * self.words + k]);
        }
        let crc_at = ENTRY_FIXED + 8 * self.words;
        let b = self.blocks as usize;
        for k in 0..b {
            w.u32(crc_at + 4 * k, self.crcs[s * b + k]);
        }
    }

    fn classify(&self, buf: &[u8], page: u64, uuid: &[u8; 16]) -> CopyState {
        let r = Le(buf);
        let ours = r.u32(0) == Some(PAGE_MAGIC)
            && r.u16(4) == Some(PAGE_VERSION)
            && r.u64(8) == Some(page)
            && r.bytes16(24).as_ref() == Some(uuid);
        if !ours || buf.len() < self.page_size {
            return CopyState::Foreign;
        }
        let generation = r.u64(16).unwrap_or(0);
        let crc_ok =
            r.u32(PAGE_CRC_AT) == Some(crc32c_skipping(&buf[..self.page_size], PAGE_CRC_AT));
        let shape_ok = r.u32(44) == Some(self.entry_size as u32);
        if crc_ok && shape_ok {
            CopyState::Valid(generation)
        } else {
            CopyState::Torn(generation)
        }
    }

    /// Loads page `page` from its two copies: the valid copy with the higher generation wins.
    /// No valid copy is an empty page if it was never completely written, `Corrupt` otherwise.
    pub fn load_page(
        &mut self,
        page: u64,
        copies: [&[u8]; 2],
        uuid: &[u8; 16],
    ) -> Result<(), EngineError> {
        let states = [
            self.classify(copies[0], page, uuid),
            self.classify(copies[1], page, uuid),
        ];
        let mut best: Option<(u64, usize)> = None;
        for (i, st) in states.iter().enumerate() {
            if let CopyState::Valid(g) = st
                && best.is_none_or(|(bg, _)| *g > bg)
            {
                best = Some((*g, i));
            }
        }
        let Some((generation, i)) = best else {
            // A torn first-ever write (generation 1) leaves nothing valid and is an empty page; a torn
            // later generation means the previous copy, which must have been valid, is damaged.
            if states
                .iter()
                .any(|s| matches!(s, CopyState::Torn(g) if *g > 1))
            {
                return Err(EngineError::Corrupt(format!(
                    "meta page {page}: both copies are damaged; the slot table cannot be rebuilt"
                )));
            }
            return Ok(());
        };
        self.page_gen[page as usize] = generation;
        let buf = copies[i];
        let first = page as usize * self.entries_per_page as usize;
        let last = (first + self.entries_per_page as usize).min(self.used.len());
        for (k, s) in (first..last).enumerate() {
            let at = PAGE_HEADER + k * self.entry_size;
            self.decode_entry(s, &buf[at..at + self.entry_size]);
        }
        Ok(())
    }

    fn decode_entry(&mut self, s: usize, buf: &[u8]) {
        let r = Le(buf);
        let get64 = |at| r.u64(at).unwrap_or(0);
        self.used[s] = r.u8(0) == Some(1);
        self.owner[s] = ObjectId::new(PoolId(r.u32(4).unwrap_or(0)), VolumeId(get64(8)), get64(16));
        self.version[s] = get64(24);
        self.seq[s] = get64(32);
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
    fn page_roundtrip_and_ab_choice() {
        let (sb, mut t) = table();
        let oid = ObjectId::new(PoolId(1), VolumeId(9), 4);
        t.claim(2, oid, 7, 100);
        t.set_block(2, 5, Some(0xdead));
        let a = t.encode_page(0, 1, &sb.uuid);
        t.set_block(2, 6, Some(0xbeef));
        let b = t.encode_page(0, 2, &sb.uuid);
        let mut u = SlotTable::new(&sb);
        u.load_page(0, [&a, &b], &sb.uuid).unwrap();
        assert_eq!((u.owner(2), u.version(2), u.seq(2)), (oid, 7, 100));
        assert_eq!(u.crc(2, 6), 0xbeef);
        assert!(u.allocated(2, 5) && !u.allocated(2, 4));
        // Torn newest copy: the older one is used.
        let mut torn = AlignedBuf::copy_from(&b);
        torn[3000] ^= 1;
        let mut v = SlotTable::new(&sb);
        v.load_page(0, [&a, &torn], &sb.uuid).unwrap();
        assert!(!v.allocated(2, 6) && v.allocated(2, 5));
        // A torn first write next to a never-written copy is an empty page.
        let zero = AlignedBuf::zeroed(4096);
        let mut first = AlignedBuf::copy_from(&a);
        first[2000] ^= 1;
        let mut w = SlotTable::new(&sb);
        w.load_page(0, [&first, &zero], &sb.uuid).unwrap();
        assert!(!w.is_used(2));
        // Both copies damaged past generation 1: corrupt.
        let mut torn_a = AlignedBuf::copy_from(&a);
        torn_a[2000] ^= 1;
        assert!(w.load_page(0, [&torn_a, &torn], &sb.uuid).is_err());
    }
}
