//! Journal records and the journal header (formats in docs/design/on-disk-format.md).
//!
//! A record is one group commit: a header of whole 4 KiB blocks listing entries (one per
//! operation) followed by the data blocks those entries carry. The header CRC covers the header
//! blocks; each data block is covered by the CRC in its entry item, so a record is valid only if
//! every byte of it reached the disk.

use crate::buf::AlignedBuf;
use crate::codec::{Le, LeMut};
use crate::crc::{crc32c, crc32c_skipping};
use crate::layout::{BLOCK, NO_SLOT, PG_BLOB};
use basalt_types::{ObjectId, PoolId, Version, VolumeId};

pub(crate) const REC_MAGIC: u32 = u32::from_le_bytes(*b"BJRN");
pub(crate) const JHDR_MAGIC: u32 = u32::from_le_bytes(*b"BJHD");
pub(crate) const REC_VERSION: u16 = 2;
pub(crate) const REC_HEADER_FIXED: usize = 72;
pub(crate) const REC_CRC_AT: usize = 60;
pub(crate) const ENTRY_FIXED: usize = 64;
/// Upper bound on header blocks, so a damaged length field cannot make recovery read far.
pub(crate) const MAX_HEADER_BLOCKS: u32 = 256;
const JHDR_CRC_AT: usize = 4092;
const PG_PAYLOAD: usize = 16 + PG_BLOB;

const KIND_WRITE: u8 = 1;
const KIND_FULL: u8 = 2;
const KIND_DELETE: u8 = 3;
const KIND_PURGE: u8 = 4;
const KIND_PG: u8 = 5;
/// Full entry: an allocation bitmap follows the CRCs (some blocks are unallocated).
const FLAG_SPARSE: u8 = 1;
/// PG entry: the record is removed.
const FLAG_REMOVE: u8 = 2;

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
    /// record carries only the CRCs; `old_slot`/`old_tomb` are released. `alloc`: which blocks
    /// are allocated, when not all are (an object installed by recovery).
    Full {
        crcs: Box<[u32]>,
        alloc: Option<Box<[u64]>>,
    },
    /// The object becomes a tombstone in record `tomb` (its version is kept); `old_slot` is
    /// released.
    Delete,
    /// The object is forgotten entirely (no tombstone): `old_slot` / `old_tomb` are released.
    Purge,
    /// PG record `slot` of PG (`oid.pool`, `pg`) is set (or removed).
    Pg {
        remove: bool,
        log_tail: Version,
        blob: Box<[u8; PG_BLOB]>,
    },
}

/// One operation in a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub oid: ObjectId,
    pub pg: u32,
    pub version: Version,
    pub slot: u32,
    pub old_slot: u32,
    pub tomb: u32,
    pub old_tomb: u32,
    pub kind: EntryKind,
}

/// The bounds a decoded entry's indices must respect.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    pub blocks: u32,
    pub slots: u64,
    pub tombs: u64,
    pub pgs: u64,
}

impl Entry {
    /// An entry with no slots or tombstone records involved; set what the operation uses.
    pub fn new(oid: ObjectId, pg: u32, version: Version, kind: EntryKind) -> Entry {
        Entry {
            oid,
            pg,
            version,
            slot: NO_SLOT,
            old_slot: NO_SLOT,
            tomb: NO_SLOT,
            old_tomb: NO_SLOT,
            kind,
        }
    }

    pub fn encoded_len(&self) -> usize {
        ENTRY_FIXED
            + match &self.kind {
                EntryKind::Write(items) => 8 * items.len(),
                EntryKind::Full { crcs, alloc } => {
                    4 * crcs.len() + alloc.as_ref().map_or(0, |a| 8 * a.len())
                }
                EntryKind::Delete | EntryKind::Purge => 0,
                EntryKind::Pg { .. } => PG_PAYLOAD,
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
        let (kind, flags, n) = match &self.kind {
            EntryKind::Write(items) => (KIND_WRITE, 0, items.len()),
            EntryKind::Full { crcs, alloc } => (
                KIND_FULL,
                if alloc.is_some() { FLAG_SPARSE } else { 0 },
                crcs.len(),
            ),
            EntryKind::Delete => (KIND_DELETE, 0, 0),
            EntryKind::Purge => (KIND_PURGE, 0, 0),
            EntryKind::Pg { remove, .. } => (KIND_PG, if *remove { FLAG_REMOVE } else { 0 }, 0),
        };
        w.u8(0, kind);
        w.u8(1, flags);
        w.u16(2, n as u16);
        w.u32(4, self.oid.pool.0);
        w.u32(8, self.pg);
        w.u64(16, self.oid.volume.0);
        w.u64(24, self.oid.index);
        w.u64(32, self.version.epoch);
        w.u64(40, self.version.seq);
        w.u32(48, self.slot);
        w.u32(52, self.old_slot);
        w.u32(56, self.tomb);
        w.u32(60, self.old_tomb);
        match &self.kind {
            EntryKind::Write(items) => {
                for (i, it) in items.iter().enumerate() {
                    let at = ENTRY_FIXED + 8 * i;
                    w.u16(at, it.block);
                    w.u8(at + 2, if it.data { 0 } else { 1 });
                    w.u32(at + 4, it.crc);
                }
            }
            EntryKind::Full { crcs, alloc } => {
                for (i, c) in crcs.iter().enumerate() {
                    w.u32(ENTRY_FIXED + 4 * i, *c);
                }
                let at = ENTRY_FIXED + 4 * crcs.len();
                for (i, word) in alloc.iter().flat_map(|a| a.iter()).enumerate() {
                    w.u64(at + 8 * i, *word);
                }
            }
            EntryKind::Delete | EntryKind::Purge => {}
            EntryKind::Pg { log_tail, blob, .. } => {
                w.u64(ENTRY_FIXED, log_tail.epoch);
                w.u64(ENTRY_FIXED + 8, log_tail.seq);
                w.bytes(ENTRY_FIXED + 16, &blob[..]);
            }
        }
    }

    /// Decodes one entry; returns it and its length, or `None` if anything is out of bounds.
    fn decode(buf: &[u8], b: Bounds) -> Option<(Entry, usize)> {
        let r = Le(buf);
        let kind = r.u8(0)?;
        let flags = r.u8(1)?;
        let n = r.u16(2)? as usize;
        let mut e = Entry {
            oid: ObjectId::new(PoolId(r.u32(4)?), VolumeId(r.u64(16)?), r.u64(24)?),
            pg: r.u32(8)?,
            version: Version::new(r.u64(32)?, r.u64(40)?),
            slot: r.u32(48)?,
            old_slot: r.u32(52)?,
            tomb: r.u32(56)?,
            old_tomb: r.u32(60)?,
            kind: EntryKind::Purge,
        };
        let within = |i: u32, max: u64| i == NO_SLOT || u64::from(i) < max;
        let object_kind = matches!(kind, KIND_WRITE | KIND_FULL | KIND_DELETE | KIND_PURGE);
        if object_kind
            && !(within(e.slot, b.slots)
                && within(e.old_slot, b.slots)
                && within(e.tomb, b.tombs)
                && within(e.old_tomb, b.tombs))
        {
            return None;
        }
        let len = match kind {
            KIND_WRITE => {
                let mut items = Vec::with_capacity(n);
                for i in 0..n {
                    let at = ENTRY_FIXED + 8 * i;
                    let block = r.u16(at)?;
                    let state = r.u8(at + 2)?;
                    if u32::from(block) >= b.blocks || state > 1 {
                        return None;
                    }
                    items.push(Item {
                        block,
                        data: state == 0,
                        crc: r.u32(at + 4)?,
                    });
                }
                if e.slot == NO_SLOT || n == 0 || e.version.is_none() || flags != 0 {
                    return None;
                }
                e.kind = EntryKind::Write(items);
                ENTRY_FIXED + 8 * n
            }
            KIND_FULL => {
                if n != b.blocks as usize || e.slot == NO_SLOT || e.version.is_none() {
                    return None;
                }
                let crcs = (0..n)
                    .map(|i| r.u32(ENTRY_FIXED + 4 * i))
                    .collect::<Option<Vec<u32>>>()?;
                let words = n.div_ceil(64);
                let at = ENTRY_FIXED + 4 * n;
                let alloc = match flags {
                    0 => None,
                    FLAG_SPARSE => Some(
                        (0..words)
                            .map(|i| r.u64(at + 8 * i))
                            .collect::<Option<Vec<u64>>>()?
                            .into_boxed_slice(),
                    ),
                    _ => return None,
                };
                let len = at + alloc.as_ref().map_or(0, |a| 8 * a.len());
                e.kind = EntryKind::Full {
                    crcs: crcs.into_boxed_slice(),
                    alloc,
                };
                len
            }
            KIND_DELETE if n == 0 && flags == 0 && e.tomb != NO_SLOT && !e.version.is_none() => {
                e.kind = EntryKind::Delete;
                ENTRY_FIXED
            }
            KIND_PURGE if n == 0 && flags == 0 => ENTRY_FIXED,
            KIND_PG if n == 0 && flags & !FLAG_REMOVE == 0 && u64::from(e.slot) < b.pgs => {
                let mut blob = Box::new([0u8; PG_BLOB]);
                blob.copy_from_slice(buf.get(ENTRY_FIXED + 16..ENTRY_FIXED + PG_PAYLOAD)?);
                e.kind = EntryKind::Pg {
                    remove: flags & FLAG_REMOVE != 0,
                    log_tail: Version::new(r.u64(ENTRY_FIXED)?, r.u64(ENTRY_FIXED + 8)?),
                    blob,
                };
                ENTRY_FIXED + PG_PAYLOAD
            }
            _ => return None,
        };
        Some((e, len))
    }
}

/// The decoded header of a journal record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    pub seq: u64,
    /// Every record with a sequence number up to this one was durable (flushed, or written with
    /// `RWF_DSYNC`) before this record was written; recovery need not re-verify their data.
    pub durable_seq: u64,
    /// Header CRC of the previous record (chains records so stale ones from before a crash
    /// cannot be mistaken for new ones).
    pub prev_crc: u32,
    /// Random per opening of the store: records written after a recovery never chain to records
    /// the recovery discarded, even when their contents are identical.
    pub boot: u64,
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

/// What a record header says about its place in the journal.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecordPlace {
    pub seq: u64,
    pub durable_seq: u64,
    pub prev_crc: u32,
    pub boot: u64,
}

/// Header blocks needed for entries totalling `entries_len` bytes.
pub(crate) fn header_blocks_for(entries_len: usize) -> u32 {
    (REC_HEADER_FIXED + entries_len).div_ceil(BLOCK as usize) as u32
}

/// Encodes a record header into whole blocks and returns it with its CRC.
pub(crate) fn encode_record_header(
    uuid: &[u8; 16],
    place: RecordPlace,
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
        w.u64(8, place.seq);
        w.u64(16, place.durable_seq);
        w.u32(24, place.prev_crc);
        w.u32(28, entries.len() as u32);
        w.bytes(32, uuid);
        w.u32(48, header_blocks);
        w.u32(52, data_blocks as u32);
        w.u32(56, entries_len as u32);
        w.u64(64, place.boot);
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

/// [`peek_record`] reads no byte of a record at or past this offset.
pub(crate) const PEEKED_BYTES: u64 = 56;

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
    bounds: Bounds,
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
        let (e, len) = Entry::decode(buf.get(at..end)?, bounds)?;
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
        boot: r.u64(64)?,
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
    /// The tables hash (see `pages.rs`) after the write-back batch that wrote this header.
    pub tables_hash: u64,
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
        w.u64(56, self.tables_hash);
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
            tables_hash: r.u64(56)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds {
        blocks: 32,
        slots: 100,
        tombs: 100,
        pgs: 10,
    };

    fn place(seq: u64) -> RecordPlace {
        RecordPlace {
            seq,
            durable_seq: seq - 2,
            prev_crc: 1234,
            boot: 0xb007,
        }
    }

    fn sample_entries() -> Vec<Entry> {
        let oid = ObjectId::new(PoolId(1), VolumeId(2), 3);
        let v = |s| Version::new(4, s);
        let mut blob = Box::new([0u8; PG_BLOB]);
        blob[5] = 5;
        vec![
            Entry {
                slot: 7,
                ..Entry::new(
                    oid,
                    11,
                    v(5),
                    EntryKind::Write(vec![
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
                )
            },
            Entry {
                slot: 9,
                old_slot: 7,
                ..Entry::new(
                    oid,
                    11,
                    v(6),
                    EntryKind::Full {
                        crcs: vec![1u32; 32].into(),
                        alloc: None,
                    },
                )
            },
            Entry {
                slot: 8,
                old_tomb: 3,
                ..Entry::new(
                    oid,
                    11,
                    v(7),
                    EntryKind::Full {
                        crcs: vec![2u32; 32].into(),
                        alloc: Some(vec![0b1011].into()),
                    },
                )
            },
            Entry {
                tomb: 4,
                old_slot: 8,
                ..Entry::new(oid, 11, v(8), EntryKind::Delete)
            },
            Entry {
                old_tomb: 4,
                ..Entry::new(oid, 11, Version::NONE, EntryKind::Purge)
            },
            Entry {
                slot: 2,
                ..Entry::new(
                    ObjectId::new(PoolId(1), VolumeId(0), 0),
                    11,
                    Version::NONE,
                    EntryKind::Pg {
                        remove: false,
                        log_tail: v(3),
                        blob,
                    },
                )
            },
        ]
    }

    #[test]
    fn record_roundtrip() {
        let uuid = [9u8; 16];
        let entries = sample_entries();
        let (buf, crc) = encode_record_header(&uuid, place(42), &entries);
        assert_eq!(peek_record(&buf, &uuid), Some((42, 1, 1)));
        let h = decode_record_header(&buf, &uuid, BOUNDS).unwrap();
        assert_eq!(h.entries, entries);
        assert_eq!(
            (h.seq, h.durable_seq, h.prev_crc, h.boot, h.crc),
            (42, 40, 1234, 0xb007, crc)
        );
        assert!(decode_record_header(&buf, &[8u8; 16], BOUNDS).is_none());
        // Every single-byte flip in the used part of the header is detected.
        let used = REC_HEADER_FIXED + entries.iter().map(Entry::encoded_len).sum::<usize>();
        for at in 0..used {
            let mut b = AlignedBuf::copy_from(&buf);
            b[at] ^= 0x40;
            assert!(
                decode_record_header(&b, &uuid, BOUNDS).is_none(),
                "flip at {at}"
            );
        }
    }

    #[test]
    fn out_of_bounds_indices_are_refused() {
        let uuid = [9u8; 16];
        let oid = ObjectId::new(PoolId(1), VolumeId(2), 3);
        for e in [
            Entry {
                tomb: 100,
                ..Entry::new(oid, 0, Version::new(1, 1), EntryKind::Delete)
            },
            Entry {
                slot: 10,
                ..Entry::new(
                    oid,
                    0,
                    Version::NONE,
                    EntryKind::Pg {
                        remove: true,
                        log_tail: Version::NONE,
                        blob: Box::new([0; PG_BLOB]),
                    },
                )
            },
            // A delete without a tombstone record, and a write without a version.
            Entry::new(oid, 0, Version::new(1, 1), EntryKind::Delete),
            Entry {
                slot: 1,
                ..Entry::new(
                    oid,
                    0,
                    Version::NONE,
                    EntryKind::Write(vec![Item {
                        block: 0,
                        data: false,
                        crc: 0,
                    }]),
                )
            },
        ] {
            let (buf, _) = encode_record_header(&uuid, place(5), std::slice::from_ref(&e));
            assert!(
                decode_record_header(&buf, &uuid, BOUNDS).is_none(),
                "{e:?} decoded"
            );
        }
    }

    #[test]
    fn large_header_spans_blocks() {
        let oid = ObjectId::new(PoolId(1), VolumeId(2), 3);
        let entries: Vec<Entry> = (0..300)
            .map(|i| Entry {
                slot: 1,
                ..Entry::new(
                    oid,
                    0,
                    Version::new(0, i + 1),
                    EntryKind::Write(vec![Item {
                        block: 1,
                        data: true,
                        crc: i as u32,
                    }]),
                )
            })
            .collect();
        let (buf, _) = encode_record_header(&[1; 16], place(3), &entries);
        assert!(buf.len() > 4096);
        let h = decode_record_header(&buf, &[1; 16], BOUNDS).unwrap();
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
            tables_hash: 0xfeed,
        };
        let buf = h.encode(&[5; 16]);
        assert_eq!(JournalHeader::decode(&buf, &[5; 16]), Some(h));
        assert_eq!(JournalHeader::decode(&buf, &[6; 16]), None);
        let mut b = AlignedBuf::copy_from(&buf);
        b[33] ^= 1;
        assert_eq!(JournalHeader::decode(&b, &[5; 16]), None);
    }
}
