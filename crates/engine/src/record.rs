//! Journal records and the journal header (formats in docs/design/on-disk-format.md).
//!
//! A record is one group commit: a header of whole 4 KiB blocks listing entries (one per
//! operation) followed by the data blocks those entries carry. The header CRC covers the header
//! blocks; each data block is covered by the CRC in its entry item, so a record is valid only if
//! every byte of it reached the disk.

use crate::buf::AlignedBuf;
use crate::codec::{Le, LeMut};
use crate::crc::{crc32c, crc32c_skipping};
use crate::layout::{BLOCK, NO_SLOT};
use basalt_types::{ObjectId, PoolId, VolumeId};

pub(crate) const REC_MAGIC: u32 = u32::from_le_bytes(*b"BJRN");
pub(crate) const JHDR_MAGIC: u32 = u32::from_le_bytes(*b"BJHD");
pub(crate) const REC_VERSION: u16 = 1;
pub(crate) const REC_HEADER_FIXED: usize = 64;
pub(crate) const REC_CRC_AT: usize = 60;
pub(crate) const ENTRY_FIXED: usize = 40;
/// Upper bound on header blocks, so a damaged length field cannot make recovery read far.
pub(crate) const MAX_HEADER_BLOCKS: u32 = 256;
const JHDR_CRC_AT: usize = 4092;

const KIND_WRITE: u8 = 1;
const KIND_FULL: u8 = 2;
const KIND_DELETE: u8 = 3;

/// One block touched by a journaled write: its new CRC, and whether data follows in the record
/// (`data == false` means the block becomes unallocated: trim / write-zeroes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Item {
    pub block: u16,
    pub data: bool,
    pub crc: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EntryKind {
    /// Blocks journaled in this record, written back in place into `slot` later.
    Write(Vec<Item>),
    /// The whole object was written directly into the fresh `slot` (redirect-on-write); the
    /// record carries only the CRCs; `old_slot` is released.
    Full(Box<[u32]>),
    /// The object is removed; `old_slot` is released.
    Delete,
}

/// One operation in a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub oid: ObjectId,
    pub version: u64,
    pub slot: u32,
    pub old_slot: u32,
    pub kind: EntryKind,
}

impl Entry {
    pub fn encoded_len(&self) -> usize {
        ENTRY_FIXED
            + match &self.kind {
                EntryKind::Write(items) => 8 * items.len(),
                EntryKind::Full(crcs) => 4 * crcs.len(),
                EntryKind::Delete => 0,
            }
    }

    pub fn data_blocks(&self) -> usize {
        match &self.kind {
            EntryKind::Write(items) => items.iter().filter(|i| i.data).count(),
            _ => 0,
        }
    }

    fn encode(&self, out: &mut [u8]) {
        let mut w = LeMut(out);
        let (kind, n) = match &self.kind {
            EntryKind::Write(items) => (KIND_WRITE, items.len()),
            EntryKind::Full(crcs) => (KIND_FULL, crcs.len()),
            EntryKind::Delete => (KIND_DELETE, 0),
        };
        w.u8(0, kind);
        w.u8(1, 0);
        w.u16(2, n as u16);
        w.u32(4, self.oid.pool.0);
        w.u64(8, self.oid.volume.0);
        w.u64(16, self.oid.index);
        w.u64(24, self.version);
        w.u32(32, self.slot);
        w.u32(36, self.old_slot);
        match &self.kind {
            EntryKind::Write(items) => {
                for (i, it) in items.iter().enumerate() {
                    let at = ENTRY_FIXED + 8 * i;
                    w.u16(at, it.block);
                    w.u8(at + 2, if it.data { 0 } else { 1 });
                    w.u32(at + 4, it.crc);
                }
            }
            EntryKind::Full(crcs) => {
                for (i, c) in crcs.iter().enumerate() {
                    w.u32(ENTRY_FIXED + 4 * i, *c);
                }
            }
            EntryKind::Delete => {}
        }
    }

    /// Decodes one entry; returns it and its length. `blocks` and `slots` bound the indices.
    fn decode(buf: &[u8], blocks: u32, slots: u64) -> Option<(Entry, usize)> {
        let r = Le(buf);
        let kind = r.u8(0)?;
        let n = r.u16(2)? as usize;
        let oid = ObjectId::new(PoolId(r.u32(4)?), VolumeId(r.u64(8)?), r.u64(16)?);
        let version = r.u64(24)?;
        let slot = r.u32(32)?;
        let old_slot = r.u32(36)?;
        let slot_ok = |s: u32| s == NO_SLOT || u64::from(s) < slots;
        if !slot_ok(slot) || !slot_ok(old_slot) || version == 0 {
            return None;
        }
        let (kind, len) = match kind {
            KIND_WRITE => {
                let mut items = Vec::with_capacity(n);
                for i in 0..n {
                    let at = ENTRY_FIXED + 8 * i;
                    let block = r.u16(at)?;
                    let state = r.u8(at + 2)?;
                    if u32::from(block) >= blocks || state > 1 {
                        return None;
                    }
                    items.push(Item {
                        block,
                        data: state == 0,
                        crc: r.u32(at + 4)?,
                    });
                }
                if slot == NO_SLOT || n == 0 {
                    return None;
                }
                (EntryKind::Write(items), ENTRY_FIXED + 8 * n)
            }
            KIND_FULL => {
                if n != blocks as usize || slot == NO_SLOT {
                    return None;
                }
                let crcs = (0..n)
                    .map(|i| r.u32(ENTRY_FIXED + 4 * i))
                    .collect::<Option<Vec<u32>>>()?;
                (
                    EntryKind::Full(crcs.into_boxed_slice()),
                    ENTRY_FIXED + 4 * n,
                )
            }
            KIND_DELETE if n == 0 => (EntryKind::Delete, ENTRY_FIXED),
            _ => return None,
        };
        Some((
            Entry {
                oid,
                version,
                slot,
                old_slot,
                kind,
            },
            len,
        ))
    }
}

/// The decoded header of a journal record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    pub seq: u64,
    /// Every record with a sequence number up to this one was flushed before this record was
    /// written; recovery need not re-verify their data.
    pub durable_seq: u64,
    /// Header CRC of the previous record (chains records so stale ones from before a crash
    /// cannot be mistaken for new ones).
    pub prev_crc: u32,
    pub header_blocks: u32,
    pub data_blocks: u32,
    pub crc: u32,
    pub entries: Vec<Entry>,
}

impl RecordHeader {
    /// Bytes the record occupies in the ring.
    pub fn len(&self) -> u64 {
        u64::from(self.header_blocks + self.data_blocks) * BLOCK
    }
}

/// Header blocks needed for entries totalling `entries_len` bytes.
pub(crate) fn header_blocks_for(entries_len: usize) -> u32 {
    (REC_HEADER_FIXED + entries_len).div_ceil(BLOCK as usize) as u32
}

/// Encodes a record header into whole blocks and returns it with its CRC.
pub(crate) fn encode_record_header(
    uuid: &[u8; 16],
    seq: u64,
    durable_seq: u64,
    prev_crc: u32,
    entries: &[Entry],
) -> (AlignedBuf, u32) {
    let entries_len: usize = entries.iter().map(Entry::encoded_len).sum();
    let header_blocks = header_blocks_for(entries_len);
    let data_blocks: usize = entries.iter().map(Entry::data_blocks).sum();
    let mut buf = AlignedBuf::zeroed(header_blocks as usize * BLOCK as usize);
    {
        let mut w = LeMut(&mut buf);
        w.u32(0, REC_MAGIC);
        w.u16(4, REC_VERSION);
        w.u64(8, seq);
        w.u64(16, durable_seq);
        w.u32(24, prev_crc);
        w.u32(28, entries.len() as u32);
        w.bytes(32, uuid);
        w.u32(48, header_blocks);
        w.u32(52, data_blocks as u32);
        w.u32(56, entries_len as u32);
    }
    let mut at = REC_HEADER_FIXED;
    for e in entries {
        let len = e.encoded_len();
        e.encode(&mut buf[at..at + len]);
        at += len;
    }
    let crc = crc32c_skipping(&buf, REC_CRC_AT);
    LeMut(&mut buf).u32(REC_CRC_AT, crc);
    (buf, crc)
}

/// Looks at the first block of a would-be record: `Some((seq, header_blocks, data_blocks))` if
/// it carries our magic, version and store uuid. The full header must still be decoded.
pub(crate) fn peek_record(first: &[u8], uuid: &[u8; 16]) -> Option<(u64, u32, u32)> {
    let r = Le(first);
    if r.u32(0)? != REC_MAGIC || r.u16(4)? != REC_VERSION || &r.bytes16(32)? != uuid {
        return None;
    }
    let hb = r.u32(48)?;
    if hb == 0 || hb > MAX_HEADER_BLOCKS {
        return None;
    }
    Some((r.u64(8)?, hb, r.u32(52)?))
}

/// Decodes and verifies a complete record header (all `header_blocks` blocks).
pub(crate) fn decode_record_header(
    buf: &[u8],
    uuid: &[u8; 16],
    blocks_per_object: u32,
    slots: u64,
) -> Option<RecordHeader> {
    let (seq, header_blocks, data_blocks) = peek_record(buf, uuid)?;
    let hlen = header_blocks as usize * BLOCK as usize;
    if buf.len() < hlen {
        return None;
    }
    let buf = &buf[..hlen];
    let r = Le(buf);
    let crc = r.u32(REC_CRC_AT)?;
    if crc32c_skipping(buf, REC_CRC_AT) != crc {
        return None;
    }
    let n_entries = r.u32(28)? as usize;
    let entries_len = r.u32(56)? as usize;
    if REC_HEADER_FIXED + entries_len > hlen {
        return None;
    }
    let mut entries = Vec::with_capacity(n_entries.min(4096));
    let mut at = REC_HEADER_FIXED;
    let end = REC_HEADER_FIXED + entries_len;
    for _ in 0..n_entries {
        let (e, len) = Entry::decode(buf.get(at..end)?, blocks_per_object, slots)?;
        at += len;
        entries.push(e);
    }
    if at != end || entries.iter().map(Entry::data_blocks).sum::<usize>() != data_blocks as usize {
        return None;
    }
    Some(RecordHeader {
        seq,
        durable_seq: r.u64(16)?,
        prev_crc: r.u32(24)?,
        header_blocks,
        data_blocks,
        crc,
        entries,
    })
}

/// The journal header: where replay starts. Two copies; the valid one with the higher
/// generation wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct JournalHeader {
    pub generation: u64,
    /// Offset of the first live record, relative to the ring start.
    pub start_offset: u64,
    /// Sequence number expected at `start_offset`.
    pub start_seq: u64,
    /// Header CRC of the record before the start: the first record must chain to it, so a
    /// stale record left at the start position by an earlier crash is never replayed.
    pub start_prev_crc: u32,
}

impl JournalHeader {
    pub fn encode(&self, uuid: &[u8; 16]) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(BLOCK as usize);
        let mut w = LeMut(&mut buf);
        w.u32(0, JHDR_MAGIC);
        w.u16(4, REC_VERSION);
        w.u64(8, self.generation);
        w.bytes(16, uuid);
        w.u64(32, self.start_offset);
        w.u64(40, self.start_seq);
        w.u32(48, self.start_prev_crc);
        let crc = crc32c(&buf[..JHDR_CRC_AT]);
        LeMut(&mut buf).u32(JHDR_CRC_AT, crc);
        buf
    }

    pub fn decode(buf: &[u8], uuid: &[u8; 16]) -> Option<JournalHeader> {
        let r = Le(buf);
        let ok = r.u32(0)? == JHDR_MAGIC
            && r.u16(4)? == REC_VERSION
            && &r.bytes16(16)? == uuid
            && r.u32(JHDR_CRC_AT)? == crc32c(buf.get(..JHDR_CRC_AT)?);
        ok.then_some(JournalHeader {
            generation: r.u64(8)?,
            start_offset: r.u64(32)?,
            start_seq: r.u64(40)?,
            start_prev_crc: r.u32(48)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_entries() -> Vec<Entry> {
        let oid = ObjectId::new(PoolId(1), VolumeId(2), 3);
        vec![
            Entry {
                oid,
                version: 5,
                slot: 7,
                old_slot: NO_SLOT,
                kind: EntryKind::Write(vec![
                    Item {
                        block: 0,
                        data: true,
                        crc: 11,
                    },
                    Item {
                        block: 4,
                        data: false,
                        crc: 0,
                    },
                ]),
            },
            Entry {
                oid,
                version: 6,
                slot: 9,
                old_slot: 7,
                kind: EntryKind::Full(vec![1u32; 32].into()),
            },
            Entry {
                oid,
                version: 7,
                slot: NO_SLOT,
                old_slot: 9,
                kind: EntryKind::Delete,
            },
        ]
    }

    #[test]
    fn record_roundtrip() {
        let uuid = [9u8; 16];
        let entries = sample_entries();
        let (buf, crc) = encode_record_header(&uuid, 42, 40, 1234, &entries);
        assert_eq!(peek_record(&buf, &uuid), Some((42, 1, 1)));
        let h = decode_record_header(&buf, &uuid, 32, 100).unwrap();
        assert_eq!(h.entries, entries);
        assert_eq!(
            (h.seq, h.durable_seq, h.prev_crc, h.crc),
            (42, 40, 1234, crc)
        );
        assert!(decode_record_header(&buf, &[8u8; 16], 32, 100).is_none());
        // Every single-byte flip in the used part of the header is detected.
        for at in 0..(REC_HEADER_FIXED + 400) {
            let mut b = AlignedBuf::copy_from(&buf);
            b[at] ^= 0x40;
            assert!(
                decode_record_header(&b, &uuid, 32, 100).is_none(),
                "flip at {at}"
            );
        }
    }

    #[test]
    fn large_header_spans_blocks() {
        let oid = ObjectId::new(PoolId(1), VolumeId(2), 3);
        let entries: Vec<Entry> = (0..300)
            .map(|i| Entry {
                oid,
                version: i + 1,
                slot: 1,
                old_slot: NO_SLOT,
                kind: EntryKind::Write(vec![Item {
                    block: 1,
                    data: true,
                    crc: i as u32,
                }]),
            })
            .collect();
        let (buf, _) = encode_record_header(&[1; 16], 1, 0, 0, &entries);
        assert!(buf.len() > 4096);
        let h = decode_record_header(&buf, &[1; 16], 32, 10).unwrap();
        assert_eq!(h.entries.len(), 300);
        assert_eq!(h.data_blocks, 300);
    }

    #[test]
    fn journal_header_roundtrip() {
        let h = JournalHeader {
            generation: 3,
            start_offset: 8192,
            start_seq: 77,
            start_prev_crc: 5,
        };
        let buf = h.encode(&[5; 16]);
        assert_eq!(JournalHeader::decode(&buf, &[5; 16]), Some(h));
        assert_eq!(JournalHeader::decode(&buf, &[6; 16]), None);
        let mut b = AlignedBuf::copy_from(&buf);
        b[33] ^= 1;
        assert_eq!(JournalHeader::decode(&b, &[5; 16]), None);
    }
}
