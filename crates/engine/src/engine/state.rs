//! The live in-memory state the I/O thread owns: the object index (live objects and
//! tombstones), the per-PG ordered index and log, the journaled-block cache, the table images
//! and the allocators. Applying a journal entry here is the same code live and in replay.

use crate::alloc::{FreeBits, SlotAlloc};
use crate::buf::SharedBuf;
use crate::hash::FxHashMap;
use crate::layout::{BLOCK, NO_SLOT, PG_BLOB};
use crate::meta::SlotTable;
use crate::pgtable::PgTable;
use crate::record::{Entry, EntryKind, Item};
use crate::tombs::TombTable;
use basalt_types::{ObjectId, PgId, Version, VolumeId};
use std::collections::{BTreeMap, BTreeSet};

/// A block journaled but not yet written back. `data == None`: unallocated (reads as zeros).
#[derive(Clone, Debug)]
pub(crate) struct Cached {
    pub seq: u64,
    pub data: Option<SharedBuf>,
}

/// A whole-object write redirected into a fresh slot and not yet written back to the slot
/// table: the CRCs (and which blocks are allocated) live here until then, and the data stays in
/// memory until its write completes.
#[derive(Debug)]
pub(crate) struct Base {
    pub seq: u64,
    pub crcs: Box<[u32]>,
    pub alloc: Option<Box<[u64]>>,
    pub inflight: Option<SharedBuf>,
}

impl Base {
    fn allocated(&self, b: u32) -> bool {
        self.alloc
            .as_ref()
            .is_none_or(|a| a[b as usize / 64] & (1 << (b % 64)) != 0)
    }
}

/// One object the store knows: live (it has a slot) or a tombstone (deleted at `version`, no
/// slot, a tombstone record `tomb`). Never both.
#[derive(Debug)]
pub(crate) struct Obj {
    pub version: Version,
    pub pg: u32,
    pub slot: u32,
    pub tomb: u32,
    /// Writes applied but not yet committed by the store's user: reads of the object wait.
    pub pending: u32,
    pub base: Option<Box<Base>>,
    pub cache: BTreeMap<u16, Cached>,
}

impl Obj {
    /// An object of `pg` in `slot` (`NO_SLOT`: none yet), version unset.
    pub fn live(pg: u32, slot: u32) -> Obj {
        Obj {
            slot,
            ..Obj::new(pg)
        }
    }

    fn new(pg: u32) -> Obj {
        Obj {
            version: Version::NONE,
            pg,
            slot: NO_SLOT,
            tomb: NO_SLOT,
            pending: 0,
            base: None,
            cache: BTreeMap::new(),
        }
    }

    pub fn is_tombstone(&self) -> bool {
        self.tomb != NO_SLOT
    }
}

/// Where the current content of one block is.
#[derive(Clone, Debug)]
pub(crate) enum Src {
    Zero,
    /// In memory: the buffer and the byte offset of the block inside it.
    Mem(SharedBuf, usize),
    Disk {
        slot: u32,
        block: u32,
        crc: u32,
    },
}

impl PartialEq for Src {
    fn eq(&self, other: &Src) -> bool {
        match (self, other) {
            (Src::Zero, Src::Zero) => true,
            (Src::Mem(a, x), Src::Mem(b, y)) => a.same(b) && x == y,
            (
                Src::Disk {
                    slot: a,
                    block: b,
                    crc: c,
                },
                Src::Disk {
                    slot: x,
                    block: y,
                    crc: z,
                },
            ) => a == x && b == y && c == z,
            _ => false,
        }
    }
}

/// Everything the store knows about one PG: its objects in order, the same by version (the PG
/// log: the newest change of every object and tombstone), and its PG record.
#[derive(Debug)]
pub(crate) struct PgIndex {
    pub objects: BTreeSet<(VolumeId, u64)>,
    pub log: BTreeSet<(Version, VolumeId, u64)>,
    /// Tombstones only, oldest first (what a trim or an eviction takes first).
    pub tombs: BTreeSet<(Version, VolumeId, u64)>,
    /// PG-table record index, or `NO_SLOT` while the PG has no record.
    pub record: u32,
    pub log_tail: Version,
    pub blob: [u8; PG_BLOB],
}

impl PgIndex {
    pub fn new() -> PgIndex {
        PgIndex {
            objects: BTreeSet::new(),
            log: BTreeSet::new(),
            tombs: BTreeSet::new(),
            record: NO_SLOT,
            log_tail: Version::NONE,
            blob: [0; PG_BLOB],
        }
    }

    fn is_empty(&self) -> bool {
        self.objects.is_empty() && self.record == NO_SLOT
    }

    /// The newest version in the PG's log (objects and tombstones), or its log tail.
    pub fn last_version(&self) -> Version {
        self.log
            .last()
            .map_or(self.log_tail, |(v, _, _)| *v)
            .max(self.log_tail)
    }
}

/// The object index plus the table images and the allocators.
pub(crate) struct State {
    pub objs: FxHashMap<ObjectId, Obj>,
    pub pgs: BTreeMap<PgId, PgIndex>,
    pub d: SlotTable,
    pub t: TombTable,
    pub p: PgTable,
    pub alloc: SlotAlloc,
    pub tomb_alloc: FreeBits,
    pub pg_alloc: FreeBits,
    /// During replay the allocators are rebuilt afterwards, so apply does not touch them.
    pub replaying: bool,
}

/// Puts the blocks of a write's items in the object's cache (`blocks`: the data of the items
/// that carry data, in order; the others read as zeros).
fn cache_items(obj: &mut Obj, seq: u64, items: &[Item], blocks: &[SharedBuf]) {
    let mut data = blocks.iter();
    for it in items {
        let buf = if it.data { data.next().cloned() } else { None };
        obj.cache.insert(it.block, Cached { seq, data: buf });
    }
}

fn pg_id(oid: &ObjectId, pg: u32) -> PgId {
    PgId { pool: oid.pool, pg }
}

impl State {
    /// Current content location of block `b` of `obj`.
    pub fn block_src(&self, oid: &ObjectId, obj: &Obj, b: u32) -> Src {
        if let Some(c) = obj.cache.get(&(b as u16)) {
            return match &c.data {
                Some(buf) => Src::Mem(buf.clone(), 0),
                None => Src::Zero,
            };
        }
        if let Some(base) = &obj.base {
            if !base.allocated(b) {
                return Src::Zero;
            }
            return match &base.inflight {
                Some(buf) => Src::Mem(buf.clone(), (u64::from(b) * BLOCK) as usize),
                None => Src::Disk {
                    slot: obj.slot,
                    block: b,
                    crc: base.crcs[b as usize],
                },
            };
        }
        let s = obj.slot;
        if s != NO_SLOT && self.d.is_used(s) && self.d.owner(s) == *oid && self.d.allocated(s, b) {
            return Src::Disk {
                slot: s,
                block: b,
                crc: self.d.crc(s, b),
            };
        }
        Src::Zero
    }

    /// Is block `b` allocated (holds data) right now?
    pub fn is_allocated(&self, oid: &ObjectId, obj: &Obj, b: u32) -> bool {
        !matches!(self.block_src(oid, obj, b), Src::Zero)
    }

    /// Allocated bytes of an object.
    pub fn allocated_bytes(&self, oid: &ObjectId, obj: &Obj) -> u64 {
        if obj.slot == NO_SLOT {
            return 0;
        }
        if obj.cache.is_empty() && obj.base.is_none() && self.d.owner(obj.slot) == *oid {
            return u64::from(self.d.allocated_blocks(obj.slot)) * BLOCK;
        }
        (0..self.d.blocks)
            .filter(|&b| self.is_allocated(oid, obj, b))
            .count() as u64
            * BLOCK
    }

    /// The allocation bitmap of an object right now (one bit per block).
    pub fn alloc_bitmap(&self, oid: &ObjectId, obj: &Obj) -> Vec<u64> {
        let mut words = vec![0u64; (self.d.blocks as usize).div_ceil(64)];
        for b in 0..self.d.blocks {
            if self.is_allocated(oid, obj, b) {
                words[b as usize / 64] |= 1 << (b % 64);
            }
        }
        words
    }

    /// Removes `oid` (known at `version`) from its PG's ordered index and log.
    fn unindex(&mut self, oid: &ObjectId, pg: u32, version: Version, tomb: bool) {
        let key = pg_id(oid, pg);
        let Some(p) = self.pgs.get_mut(&key) else {
            panic!("{oid} is indexed but {key} is not");
        };
        let k = (version, oid.volume, oid.index);
        assert!(
            p.objects.remove(&(oid.volume, oid.index)),
            "{oid} missing from {key}"
        );
        assert!(
            p.log.remove(&k),
            "{oid} at {version} missing from the log of {key}"
        );
        if tomb {
            assert!(p.tombs.remove(&k), "tombstone {oid} missing from {key}");
        }
        if p.is_empty() {
            self.pgs.remove(&key);
        }
    }

    fn index(&mut self, oid: &ObjectId, pg: u32, version: Version, tomb: bool) {
        let p = self.pgs.entry(pg_id(oid, pg)).or_insert_with(PgIndex::new);
        p.objects.insert((oid.volume, oid.index));
        p.log.insert((version, oid.volume, oid.index));
        if tomb {
            p.tombs.insert((version, oid.volume, oid.index));
        }
    }

    /// Takes `e`'s object out of the index (a new one if absent), so the caller can change it
    /// and put it back with [`State::put`].
    fn take(&mut self, e: &Entry) -> Obj {
        match self.objs.remove(&e.oid) {
            Some(obj) => {
                assert_eq!(
                    obj.pg, e.pg,
                    "{} changes PG from {} to {}",
                    e.oid, obj.pg, e.pg
                );
                self.unindex(&e.oid, obj.pg, obj.version, obj.is_tombstone());
                obj
            }
            None => Obj::new(e.pg),
        }
    }

    /// Adds an object loaded from the tables (recovery).
    pub fn insert_loaded(&mut self, oid: ObjectId, obj: Obj) {
        assert!(!self.objs.contains_key(&oid), "{oid} loaded twice");
        self.put(oid, obj);
    }

    /// Tombstone records in use.
    pub fn tomb_alloc_used(&self) -> u64 {
        self.t.capacity() - self.tomb_alloc.free()
    }

    fn put(&mut self, oid: ObjectId, obj: Obj) {
        self.index(&oid, obj.pg, obj.version, obj.is_tombstone());
        self.objs.insert(oid, obj);
    }

    /// The object stops using its slot and tombstone record (released to the allocators).
    fn drop_storage(&mut self, obj: &mut Obj) {
        if obj.slot != NO_SLOT {
            if !self.replaying {
                self.alloc.release(obj.slot);
            }
            obj.slot = NO_SLOT;
        }
        if obj.tomb != NO_SLOT {
            if !self.replaying {
                self.tomb_alloc.put(u64::from(obj.tomb));
            }
            obj.tomb = NO_SLOT;
        }
        obj.base = None;
        obj.cache.clear();
    }

    /// A write to a live object in the slot it lives in (the common case): only its version
    /// moves in its PG's log; what [`State::take`] and [`State::put`] would remove and insert
    /// again (the object, its place in the PG's ordered index) stays. False when the object is
    /// absent, a tombstone, or moves to another slot: the caller takes the general way.
    fn write_in_place(
        &mut self,
        seq: u64,
        e: &Entry,
        items: &[Item],
        blocks: &[SharedBuf],
    ) -> bool {
        let Some(obj) = self.objs.get_mut(&e.oid) else {
            return false;
        };
        if obj.slot == NO_SLOT || obj.slot != e.slot {
            return false;
        }
        assert_eq!(
            obj.pg, e.pg,
            "{} changes PG from {} to {}",
            e.oid, obj.pg, e.pg
        );
        assert!(!obj.is_tombstone(), "{} is live and a tombstone", e.oid);
        let key = pg_id(&e.oid, e.pg);
        let Some(p) = self.pgs.get_mut(&key) else {
            panic!("{} is indexed but {key} is not", e.oid);
        };
        assert!(
            p.log.remove(&(obj.version, e.oid.volume, e.oid.index)),
            "{} at {} missing from the log of {key}",
            e.oid,
            obj.version
        );
        p.log.insert((e.version, e.oid.volume, e.oid.index));
        obj.version = e.version;
        cache_items(obj, seq, items, blocks);
        true
    }

    /// Applies one journal entry of record `seq` to the live state. `blocks` are the data
    /// blocks of this entry's data items in order; `full` is the object buffer of a full write
    /// whose data write has not completed yet. Every effect is absolute, so replaying records
    /// whose write-back was interrupted gives the same state again.
    pub fn apply(&mut self, seq: u64, e: &Entry, blocks: &[SharedBuf], full: Option<SharedBuf>) {
        match &e.kind {
            EntryKind::Write(items) => {
                if self.write_in_place(seq, e, items, blocks) {
                    return;
                }
                let mut obj = self.take(e);
                if obj.slot != e.slot {
                    // A tombstone (or nothing) becomes live in a fresh slot.
                    assert!(
                        obj.slot == NO_SLOT,
                        "{}: journaled write to slot {} while it lives in slot {}",
                        e.oid,
                        e.slot,
                        obj.slot
                    );
                    self.drop_storage(&mut obj);
                    obj.slot = e.slot;
                }
                obj.version = e.version;
                cache_items(&mut obj, seq, items, blocks);
                self.put(e.oid, obj);
            }
            EntryKind::Full { crcs, alloc } => {
                let mut obj = self.take(e);
                let pending = obj.pending;
                self.drop_storage(&mut obj);
                obj.slot = e.slot;
                obj.version = e.version;
                obj.pending = pending;
                obj.base = Some(Box::new(Base {
                    seq,
                    crcs: crcs.clone(),
                    alloc: alloc.clone(),
                    inflight: full,
                }));
                self.put(e.oid, obj);
            }
            EntryKind::Delete => {
                let mut obj = self.take(e);
                if obj.tomb == e.tomb {
                    // A tombstone moves to another version in the same record.
                    assert_eq!(obj.slot, NO_SLOT, "{} is a tombstone with a slot", e.oid);
                } else {
                    self.drop_storage(&mut obj);
                    obj.tomb = e.tomb;
                }
                obj.version = e.version;
                self.put(e.oid, obj);
            }
            EntryKind::Purge => {
                if self.objs.contains_key(&e.oid) {
                    let mut obj = self.take(e);
                    self.drop_storage(&mut obj);
                }
            }
            EntryKind::Pg {
                remove,
                log_tail,
                blob,
            } => {
                let key = pg_id(&e.oid, e.pg);
                let p = self.pgs.entry(key).or_insert_with(PgIndex::new);
                assert!(
                    p.record == NO_SLOT || p.record == e.slot,
                    "{key} has PG record {} but an entry names {}",
                    p.record,
                    e.slot
                );
                if *remove {
                    if p.record != NO_SLOT && !self.replaying {
                        self.pg_alloc.put(u64::from(p.record));
                    }
                    p.record = NO_SLOT;
                    p.log_tail = Version::NONE;
                    p.blob = [0; PG_BLOB];
                    if p.is_empty() {
                        self.pgs.remove(&key);
                    }
                } else {
                    p.record = e.slot;
                    p.log_tail = *log_tail;
                    p.blob = **blob;
                }
            }
        }
    }
}
