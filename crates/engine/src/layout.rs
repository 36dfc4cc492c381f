//! The superblock and the placement of every area on the device.
//!
//! ```text
//! | superblock 4K | journal: 2 header blocks + ring | slot table | tombstone table | PG table |
//! | slots ... | backup superblock 4K |
//! ```
//! The superblock is written once, at format time, after everything else is durable, so a store
//! whose format was interrupted has no valid superblock. A copy sits in the last 4 KiB of the
//! device: a damaged first copy is repaired from it, and a device whose first block was damaged
//! is never mistaken for a blank one. See docs/design/on-disk-format.md.

use crate::codec::{Le, LeMut};
use crate::crc::crc32c;
use crate::error::EngineError;
use basalt_types::{BLOCK_SIZE, DeviceId};

pub(crate) const SB_MAGIC: &[u8; 8] = b"BASALTSB";
/// Version of the whole on-disk format; bumped on any incompatible change.
pub const FORMAT_VERSION: u32 = 2;
pub(crate) const BLOCK: u64 = BLOCK_SIZE;
pub(crate) const SB_CRC_AT: usize = 4092;
/// Marker for "no slot" (and "no tombstone record", "no PG record") in records and the index.
pub(crate) const NO_SLOT: u32 = u32::MAX;
/// Size of a table-page header; records follow it.
pub(crate) const PAGE_HEADER: usize = 64;
/// Size of the fixed part of a slot-table entry; the bitmap and CRCs follow it.
pub(crate) const ENTRY_FIXED: usize = 56;
/// Size of one tombstone record.
pub(crate) const TOMB_RECORD: usize = 48;
/// Size of one PG record.
pub(crate) const PG_RECORD: usize = 128;
/// Bytes of a PG record that belong to the store's user (the node's per-PG state).
pub const PG_BLOB: usize = 96;
/// PG records per store: how many placement groups one device can hold data of.
pub(crate) const PG_CAPACITY: u64 = 4096;
/// Superblock flag: this block is the backup copy at the end of the device.
const FLAG_BACKUP: u32 = 1;

/// One paged table on the device (slot table, tombstone table, PG table): `pages` pages of
/// `page_size` bytes, two copies each, adjacent; `per_page` records of `record` bytes per page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TableGeom {
    pub offset: u64,
    pub page_size: u32,
    pub per_page: u32,
    pub pages: u64,
    pub record: u32,
}

impl TableGeom {
    fn plan(offset: u64, record: usize, records: u64) -> TableGeom {
        let page_size = (PAGE_HEADER + record).next_multiple_of(BLOCK as usize) as u32;
        let per_page = ((page_size as usize - PAGE_HEADER) / record) as u32;
        TableGeom {
            offset,
            page_size,
            per_page,
            pages: records.div_ceil(u64::from(per_page)),
            record: record as u32,
        }
    }

    /// Bytes the table occupies (both copies of every page).
    pub fn bytes(&self) -> u64 {
        2 * self.pages * u64::from(self.page_size)
    }

    pub fn end(&self) -> u64 {
        self.offset + self.bytes()
    }

    /// Device offset of copy `copy` (0 or 1) of page `page`.
    pub fn copy_offset(&self, page: u64, copy: u64) -> u64 {
        self.offset + (2 * page + copy) * u64::from(self.page_size)
    }

    pub fn capacity(&self) -> u64 {
        self.pages * u64::from(self.per_page)
    }

    fn valid(&self, record: usize) -> bool {
        self.page_size as usize >= PAGE_HEADER + record
            && u64::from(self.page_size).is_multiple_of(BLOCK)
            && self.record as usize == record
            && self.per_page as usize == (self.page_size as usize - PAGE_HEADER) / record
            && self.pages > 0
    }
}

/// The decoded superblock: identity and geometry of a store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Superblock {
    pub uuid: [u8; 16],
    pub device_id: DeviceId,
    pub object_size: u32,
    pub device_size: u64,
    pub journal_offset: u64,
    pub journal_size: u64,
    /// The slot table: one entry per slot (object metadata, allocation bitmap, block CRCs).
    pub slots: TableGeom,
    /// Tombstones: deleted objects whose version is kept.
    pub tombs: TableGeom,
    /// Per-PG records (log tail, the node's PG state).
    pub pgs: TableGeom,
    pub data_offset: u64,
    pub slot_count: u64,
    pub created_secs: u64,
}

impl Superblock {
    /// Computes the geometry of a new store. `journal_size` includes the two header blocks.
    pub fn plan(
        uuid: [u8; 16],
        device_id: DeviceId,
        object_size: u32,
        device_size: u64,
        journal_size: Option<u64>,
    ) -> Result<Superblock, EngineError> {
        check_object_size(object_size)?;
        let device_size = device_size / BLOCK * BLOCK;
        let min_journal = min_journal_size(object_size);
        let journal_size = match journal_size {
            Some(j) => j.next_multiple_of(BLOCK),
            None => default_journal_size(device_size, object_size),
        };
        if journal_size < min_journal {
            return Err(EngineError::invalid(format!(
                "journal of {journal_size} bytes is too small for {object_size}-byte objects; use at least {min_journal}"
            )));
        }
        let journal_offset = BLOCK;
        let meta_offset = journal_offset + journal_size;
        let entry = entry_size(object_size);
        // The last block holds the backup superblock.
        let usable_end = device_size.saturating_sub(BLOCK);
        // Each slot costs its data, its share of two slot-table page copies and of two
        // tombstone page copies (one tombstone record per slot); shrink until it fits.
        let probe_slots = TableGeom::plan(0, entry, 1);
        let probe_tombs = TableGeom::plan(0, TOMB_RECORD, 1);
        let per_slot = u64::from(object_size)
            + 2 * u64::from(probe_slots.page_size) / u64::from(probe_slots.per_page)
            + 2 * u64::from(probe_tombs.page_size) / u64::from(probe_tombs.per_page)
            + 1;
        let geometry = |slots: u64| Tables::plan(meta_offset, object_size, slots);
        let mut slots = usable_end.saturating_sub(meta_offset) / per_slot;
        while slots > 0 && geometry(slots).data_end > usable_end {
            slots -= 1;
        }
        if slots == 0 {
            return Err(EngineError::invalid(format!(
                "device of {device_size} bytes is too small for a {journal_size}-byte journal and one {object_size}-byte object"
            )));
        }
        let Tables {
            slots: st,
            tombs: tt,
            pgs: pt,
            data_offset,
            ..
        } = geometry(slots);
        Ok(Superblock {
            uuid,
            device_id,
            object_size,
            device_size,
            journal_offset,
            journal_size,
            slots: st,
            tombs: tt,
            pgs: pt,
            data_offset,
            slot_count: slots,
            created_secs: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        })
    }

    pub fn blocks_per_object(&self) -> u32 {
        self.object_size / BLOCK as u32
    }
    /// Device offset of block `block` of `slot`.
    pub fn slot_offset(&self, slot: u32, block: u32) -> u64 {
        self.data_offset + u64::from(slot) * u64::from(self.object_size) + u64::from(block) * BLOCK
    }
    /// Device offset of journal header copy `copy` (0 or 1).
    pub fn journal_header_offset(&self, copy: u64) -> u64 {
        self.journal_offset + copy * BLOCK
    }
    /// Device offset of the journal ring (after the two header blocks).
    pub fn ring_offset(&self) -> u64 {
        self.journal_offset + 2 * BLOCK
    }
    pub fn ring_size(&self) -> u64 {
        self.journal_size - 2 * BLOCK
    }
    pub fn capacity_bytes(&self) -> u64 {
        self.slot_count * u64::from(self.object_size)
    }
    /// Device offset of the backup superblock.
    pub fn backup_offset(&self) -> u64 {
        self.device_size - BLOCK
    }

    /// Encodes the superblock; `backup` marks the copy for the end of the device.
    pub fn encode(&self, backup: bool) -> Vec<u8> {
        let mut buf = vec![0u8; BLOCK as usize];
        let mut w = LeMut(&mut buf);
        w.bytes(0, SB_MAGIC);
        w.u32(8, FORMAT_VERSION);
        w.u32(12, BLOCK as u32);
        w.bytes(16, &self.uuid);
        w.u32(32, self.device_id.0);
        w.u32(36, self.object_size);
        w.u32(40, BLOCK as u32);
        w.u32(44, if backup { FLAG_BACKUP } else { 0 });
        w.u64(48, self.device_size);
        w.u64(56, self.journal_offset);
        w.u64(64, self.journal_size);
        put_table(&mut w, 72, &self.slots);
        put_table(&mut w, 96, &self.tombs);
        put_table(&mut w, 120, &self.pgs);
        w.u64(144, self.data_offset);
        w.u64(152, self.slot_count);
        w.u64(160, self.created_secs);
        w.u64(168, self.backup_offset());
        let crc = crc32c(&buf[..SB_CRC_AT]);
        LeMut(&mut buf).u32(SB_CRC_AT, crc);
        buf
    }

    /// Decodes a superblock copy. `Ok(None)` means "no Basalt magic here"; a block with the magic
    /// but a bad CRC, version or geometry is `Corrupt`.
    pub fn decode(buf: &[u8]) -> Result<Option<Superblock>, EngineError> {
        if !has_magic(buf) {
            return Ok(None);
        }
        let r = Le(buf);
        let bad = |what: &str| EngineError::Corrupt(format!("superblock: {what}"));
        // The CRC covers bytes 0..4092, everything before the CRC field itself.
        if r.u32(SB_CRC_AT) != Some(crc32c(&buf[..SB_CRC_AT])) {
            return Err(bad("CRC mismatch (damaged superblock)"));
        }
        let version = r.u32(8).unwrap_or(0);
        if version != FORMAT_VERSION {
            return Err(EngineError::UnsupportedFormat {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let get64 = |at| r.u64(at).unwrap_or(0);
        let get32 = |at| r.u32(at).unwrap_or(0);
        let sb = Superblock {
            uuid: r.bytes16(16).unwrap_or_default(),
            device_id: DeviceId(get32(32)),
            object_size: get32(36),
            device_size: get64(48),
            journal_offset: get64(56),
            journal_size: get64(64),
            slots: get_table(&r, 72, entry_size(get32(36))),
            tombs: get_table(&r, 96, TOMB_RECORD),
            pgs: get_table(&r, 120, PG_RECORD),
            data_offset: get64(144),
            slot_count: get64(152),
            created_secs: get64(160),
        };
        sb.validate().map_err(|e| bad(&e))?;
        if get64(168) != sb.backup_offset() {
            return Err(bad("backup offset does not match the device size"));
        }
        Ok(Some(sb))
    }

    /// Checks that the geometry is self-consistent (so a damaged-but-checksummed block, or a
    /// future writer's bug, cannot make us index outside the device).
    fn validate(&self) -> Result<(), String> {
        check_object_size(self.object_size).map_err(|e| e.to_string())?;
        let ok = self.slots.valid(entry_size(self.object_size))
            && self.tombs.valid(TOMB_RECORD)
            && self.pgs.valid(PG_RECORD)
            && self.journal_offset == BLOCK
            && self.journal_size >= 4 * BLOCK
            && self.journal_size.is_multiple_of(BLOCK)
            && self.device_size.is_multiple_of(BLOCK)
            && self.slots.offset == self.journal_offset + self.journal_size
            && self.tombs.offset == self.slots.end()
            && self.pgs.offset == self.tombs.end()
            && self.slot_count > 0
            && self.slot_count < u64::from(NO_SLOT)
            && self.slots.pages == self.slot_count.div_ceil(u64::from(self.slots.per_page))
            && self.tombs.capacity() >= tomb_capacity(self.slot_count)
            && self.tombs.capacity() < u64::from(NO_SLOT)
            && self.pgs.capacity() >= PG_CAPACITY
            && self.data_offset >= self.pgs.end()
            && self
                .data_offset
                .checked_add(self.slot_count * u64::from(self.object_size))
                .is_some_and(|end| end <= self.device_size.saturating_sub(BLOCK));
        if ok {
            Ok(())
        } else {
            Err("inconsistent geometry".into())
        }
    }
}

/// Whether `buf` starts with the superblock magic (a Basalt store, maybe damaged).
pub(crate) fn has_magic(buf: &[u8]) -> bool {
    buf.len() >= BLOCK as usize && &buf[..8] == SB_MAGIC
}

fn put_table(w: &mut LeMut<'_>, at: usize, t: &TableGeom) {
    w.u64(at, t.offset);
    w.u32(at + 8, t.page_size);
    w.u32(at + 12, t.per_page);
    w.u64(at + 16, t.pages);
}

/// Reads a table's geometry; the record size is implied by which table it is (checked by
/// `TableGeom::valid` against the page size and records per page).
fn get_table(r: &Le<'_>, at: usize, record: usize) -> TableGeom {
    TableGeom {
        offset: r.u64(at).unwrap_or(0),
        page_size: r.u32(at + 8).unwrap_or(0),
        per_page: r.u32(at + 12).unwrap_or(0),
        pages: r.u64(at + 16).unwrap_or(0),
        record: record as u32,
    }
}

/// Where the tables and the slots of a store lie, after the journal.
struct Tables {
    slots: TableGeom,
    tombs: TableGeom,
    pgs: TableGeom,
    data_offset: u64,
    data_end: u64,
}

impl Tables {
    fn plan(meta_offset: u64, object_size: u32, slots: u64) -> Tables {
        let st = TableGeom::plan(meta_offset, entry_size(object_size), slots);
        let tt = TableGeom::plan(st.end(), TOMB_RECORD, tomb_capacity(slots));
        let pgs = TableGeom::plan(tt.end(), PG_RECORD, PG_CAPACITY);
        let slot_align = u64::from(object_size).min(1 << 20);
        let data_offset = pgs.end().next_multiple_of(slot_align);
        Tables {
            slots: st,
            tombs: tt,
            pgs,
            data_offset,
            data_end: data_offset + slots * u64::from(object_size),
        }
    }
}

/// The smallest device on which [`crate::format`] makes a store of exactly `slots` slots of
/// `object_size` bytes with a `journal_size`-byte journal (tests that fill a store).
pub fn device_size_for(object_size: u32, journal_size: u64, slots: u64) -> u64 {
    let journal_offset = BLOCK;
    let meta_offset = journal_offset + journal_size.next_multiple_of(BLOCK);
    Tables::plan(meta_offset, object_size, slots).data_end + BLOCK
}

/// Tombstone records a store of `slots` slots has room for: one per slot, at least 1024.
pub(crate) fn tomb_capacity(slots: u64) -> u64 {
    slots.max(1024)
}

pub(crate) fn check_object_size(object_size: u32) -> Result<(), EngineError> {
    if !object_size.is_power_of_two() || !(4096..=4 << 20).contains(&object_size) {
        return Err(EngineError::invalid(format!(
            "object size {object_size} must be a power of two between 4KiB and 4MiB"
        )));
    }
    Ok(())
}

/// Bytes of one slot-table entry: fixed part, allocation bitmap (8-byte aligned), one CRC per
/// block.
pub(crate) fn entry_size(object_size: u32) -> usize {
    let blocks = (object_size / BLOCK as u32) as usize;
    ENTRY_FIXED + blocks.div_ceil(8).next_multiple_of(8) + 4 * blocks
}

/// Largest record the store ever builds for one operation: a whole object journaled plus a
/// generous header.
pub(crate) fn max_single_record(object_size: u32) -> u64 {
    u64::from(object_size) + 64 * 1024
}

/// The journal must hold several of the largest records so group commit and write-back overlap.
pub(crate) fn min_journal_size(object_size: u32) -> u64 {
    (2 * BLOCK + 8 * max_single_record(object_size)).max(1 << 20)
}

fn default_journal_size(device_size: u64, object_size: u32) -> u64 {
    let j = (device_size / 32)
        .clamp(16 << 20, 1 << 30)
        .min(device_size / 4);
    j.max(min_journal_size(object_size))
        .next_multiple_of(1 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_fits_and_roundtrips() {
        for (size, obj) in [
            (64u64 << 20, 128 * 1024u32),
            (2 << 30, 128 * 1024),
            (256 << 20, 4 << 20),
            (16 << 20, 4096),
        ] {
            let sb = Superblock::plan([7; 16], DeviceId(3), obj, size, None).unwrap();
            assert!(sb.data_offset + sb.capacity_bytes() <= sb.backup_offset());
            assert_eq!(sb.data_offset % u64::from(obj).min(1 << 20), 0);
            assert!(sb.tombs.capacity() >= sb.slot_count);
            for backup in [false, true] {
                let enc = sb.encode(backup);
                assert_eq!(Superblock::decode(&enc).unwrap(), Some(sb.clone()));
            }
        }
    }

    #[test]
    fn device_size_for_gives_exactly_that_many_slots() {
        for (obj, journal, slots) in [(8192u32, 1u64 << 20, 18u64), (128 << 10, 4 << 20, 300)] {
            let size = device_size_for(obj, journal, slots);
            let sb = Superblock::plan([1; 16], DeviceId(1), obj, size, Some(journal)).unwrap();
            assert_eq!(sb.slot_count, slots);
            assert!(sb.validate().is_ok());
            let smaller = Superblock::plan([1; 16], DeviceId(1), obj, size - BLOCK, Some(journal));
            assert_eq!(smaller.unwrap().slot_count, slots - 1);
        }
    }

    #[test]
    fn decode_rejects_damage_and_other_versions() {
        let sb = Superblock::plan([1; 16], DeviceId(1), 131072, 64 << 20, None).unwrap();
        let mut enc = sb.encode(false);
        enc[40] ^= 1;
        assert!(matches!(
            Superblock::decode(&enc),
            Err(EngineError::Corrupt(_))
        ));
        assert!(Superblock::decode(&[0u8; 4096]).unwrap().is_none());
        let mut v1 = sb.encode(false);
        v1[8..12].copy_from_slice(&1u32.to_le_bytes());
        let crc = crc32c(&v1[..SB_CRC_AT]);
        v1[SB_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            Superblock::decode(&v1),
            Err(EngineError::UnsupportedFormat { found: 1, .. })
        ));
    }

    #[test]
    fn entry_sizes() {
        assert_eq!(entry_size(128 * 1024), 56 + 8 + 128);
        assert_eq!(entry_size(4 << 20), 56 + 128 + 4096);
        assert_eq!(entry_size(4096), 56 + 8 + 4);
    }
}
