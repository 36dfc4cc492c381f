//! The superblock and the placement of every area on the device.
//!
//! ```text
//! | superblock 4K | journal: 2 header blocks + ring | meta pages (2 copies each) | slots ... |
//! ```
//! The superblock is written once, at format time, after everything else is durable, so a store
//! whose format was interrupted has no valid superblock. See docs/design/on-disk-format.md.

use crate::codec::{Le, LeMut};
use crate::crc::crc32c;
use crate::error::EngineError;
use basalt_types::{BLOCK_SIZE, DeviceId};

pub(crate) const SB_MAGIC: &[u8; 8] = b"BASALTSB";
/// Version of the whole on-disk format; bumped on any incompatible change.
pub const FORMAT_VERSION: u32 = 1;
pub(crate) const BLOCK: u64 = BLOCK_SIZE;
pub(crate) const SB_CRC_AT: usize = 4092;
/// Marker for "no slot" in records and the index.
pub(crate) const NO_SLOT: u32 = u32::MAX;
/// Size of a meta-page header; entries follow it.
pub(crate) const PAGE_HEADER: usize = 64;
/// Size of the fixed part of a meta entry; the bitmap and CRCs follow it.
pub(crate) const ENTRY_FIXED: usize = 48;

/// The decoded superblock: identity and geometry of a store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Superblock {
    pub uuid: [u8; 16],
    pub device_id: DeviceId,
    pub object_size: u32,
    pub device_size: u64,
    pub journal_offset: u64,
    pub journal_size: u64,
    pub meta_offset: u64,
    pub meta_page_size: u32,
    pub entries_per_page: u32,
    pub meta_pages: u64,
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
        let meta_page_size = (PAGE_HEADER + entry).next_multiple_of(BLOCK as usize) as u32;
        let entries_per_page = ((meta_page_size as usize - PAGE_HEADER) / entry) as u32;
        let slot_align = u64::from(object_size).min(1 << 20);
        let avail = device_size.saturating_sub(meta_offset);
        // Each slot costs its data plus its share of two meta-page copies; shrink until it fits.
        let per_slot = u64::from(object_size)
            + 2 * u64::from(meta_page_size) / u64::from(entries_per_page)
            + 1;
        let mut slots = avail / per_slot;
        let geometry = |slots: u64| {
            let pages = slots.div_ceil(u64::from(entries_per_page));
            let data_offset =
                (meta_offset + 2 * pages * u64::from(meta_page_size)).next_multiple_of(slot_align);
            (
                pages,
                data_offset,
                data_offset + slots * u64::from(object_size),
            )
        };
        while slots > 0 && geometry(slots).2 > device_size {
            slots -= 1;
        }
        if slots == 0 {
            return Err(EngineError::invalid(format!(
                "device of {device_size} bytes is too small for a {journal_size}-byte journal and one {object_size}-byte object"
            )));
        }
        let (meta_pages, data_offset, _) = geometry(slots);
        Ok(Superblock {
            uuid,
            device_id,
            object_size,
            device_size,
            journal_offset,
            journal_size,
            meta_offset,
            meta_page_size,
            entries_per_page,
            meta_pages,
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
    pub fn entry_size(&self) -> usize {
        entry_size(self.object_size)
    }
    /// Device offset of block `block` of `slot`.
    pub fn slot_offset(&self, slot: u32, block: u32) -> u64 {
        self.data_offset + u64::from(slot) * u64::from(self.object_size) + u64::from(block) * BLOCK
    }
    /// Device offset of copy `copy` (0 or 1) of meta page `page`.
    pub fn meta_copy_offset(&self, page: u64, copy: u64) -> u64 {
        self.meta_offset + (2 * page + copy) * u64::from(self.meta_page_size)
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

    pub fn encode(&self) -> Vec<u8> {
        let mut buf = vec![0u8; BLOCK as usize];
        let mut w = LeMut(&mut buf);
        w.bytes(0, SB_MAGIC);
        w.u32(8, FORMAT_VERSION);
        w.u32(12, BLOCK as u32);
        w.bytes(16, &self.uuid);
        w.u32(32, self.device_id.0);
        w.u32(36, self.object_size);
        w.u32(40, BLOCK as u32);
        w.u32(44, 0);
        w.u64(48, self.device_size);
        w.u64(56, self.journal_offset);
        w.u64(64, self.journal_size);
        w.u64(72, self.meta_offset);
        w.u32(80, self.meta_page_size);
        w.u32(84, self.entries_per_page);
        w.u64(88, self.meta_pages);
        w.u64(96, self.data_offset);
        w.u64(104, self.slot_count);
        w.u64(112, self.created_secs);
        let crc = crc32c(&buf[..SB_CRC_AT]);
        LeMut(&mut buf).u32(SB_CRC_AT, crc);
        buf
    }

    /// Decodes a superblock. `Ok(None)` means "no Basalt magic here" (not formatted); a block
    /// with the magic but a bad CRC, version or geometry is `Corrupt`.
    pub fn decode(buf: &[u8]) -> Result<Option<Superblock>, EngineError> {
        if buf.len() < BLOCK as usize || &buf[..8] != SB_MAGIC {
            return Ok(None);
        }
        let r = Le(buf);
        let bad = |what: &str| EngineError::Corrupt(format!("superblock: {what}"));
        // The CRC covers bytes 0..4092, everything before the CRC field itself.
        if r.u32(SB_CRC_AT) != Some(crc32c(&buf[..SB_CRC_AT])) {
            return Err(bad(
                "CRC mismatch (damaged superblock); reformat with force if the data is not needed",
            ));
        }
        let version = r.u32(8).unwrap_or(0);
        if version != FORMAT_VERSION {
            return Err(bad(&format!(
                "format version {version} is not supported (this build reads version {FORMAT_VERSION})"
            )));
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
            meta_offset: get64(72),
            meta_page_size: get32(80),
            entries_per_page: get32(84),
            meta_pages: get64(88),
            data_offset: get64(96),
            slot_count: get64(104),
            created_secs: get64(112),
        };
        sb.validate().map_err(|e| bad(&e))?;
        Ok(Some(sb))
    }

    /// Checks that the geometry is self-consistent (so a damaged-but-checksummed block, or a
    /// future writer's bug, cannot make us index outside the device).
    fn validate(&self) -> Result<(), String> {
        check_object_size(self.object_size).map_err(|e| e.to_string())?;
        let entry = entry_size(self.object_size);
        let ok = self.meta_page_size as usize >= PAGE_HEADER + entry
            && u64::from(self.meta_page_size).is_multiple_of(BLOCK)
            && self.entries_per_page as usize
                == (self.meta_page_size as usize - PAGE_HEADER) / entry
            && self.journal_offset == BLOCK
            && self.journal_size >= 4 * BLOCK
            && self.journal_size.is_multiple_of(BLOCK)
            && self.meta_offset == self.journal_offset + self.journal_size
            && self.slot_count > 0
            && self.slot_count < u64::from(NO_SLOT)
            && self.meta_pages == self.slot_count.div_ceil(u64::from(self.entries_per_page))
            && self.data_offset
                >= self.meta_offset + 2 * self.meta_pages * u64::from(self.meta_page_size)
            && self
                .data_offset
                .checked_add(self.slot_count * u64::from(self.object_size))
                .is_some_and(|end| end <= self.device_size);
        if ok {
            Ok(())
        } else {
            Err("inconsistent geometry".into())
        }
    }
}

pub(crate) fn check_object_size(object_size: u32) -> Result<(), EngineError> {
    if !object_size.is_power_of_two() || !(4096..=4 << 20).contains(&object_size) {
        return Err(EngineError::invalid(format!(
            "object size {object_size} must be a power of two between 4KiB and 4MiB"
        )));
    }
    Ok(())
}

/// Bytes of one meta entry: fixed part, allocation bitmap (8-byte aligned), one CRC per block.
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
            assert!(sb.data_offset + sb.capacity_bytes() <= size);
            assert_eq!(sb.data_offset % u64::from(obj).min(1 << 20), 0);
            let enc = sb.encode();
            assert_eq!(Superblock::decode(&enc).unwrap(), Some(sb));
        }
    }

    #[test]
    fn decode_rejects_damage() {
        let sb = Superblock::plan([1; 16], DeviceId(1), 131072, 64 << 20, None).unwrap();
        let mut enc = sb.encode();
        enc[40] ^= 1;
        assert!(matches!(
            Superblock::decode(&enc),
            Err(EngineError::Corrupt(_))
        ));
        assert!(Superblock::decode(&[0u8; 4096]).unwrap().is_none());
    }

    #[test]
    fn entry_sizes() {
        assert_eq!(entry_size(128 * 1024), 48 + 8 + 128);
        assert_eq!(entry_size(4 << 20), 48 + 128 + 4096);
        assert_eq!(entry_size(4096), 48 + 8 + 4);
    }
}
