//! The live in-memory state the I/O thread owns: the object index, the journaled-block cache,
//! and the slot allocator. Applying a journal entry here is the same code live and in replay.

use crate::buf::SharedBuf;
use crate::hash::FxHashMap;
use crate::layout::{BLOCK, NO_SLOT};
use crate::meta::SlotTable;
use crate::record::{Entry, EntryKind};
use basalt_types::ObjectId;
use std::collections::BTreeMap;

/// A block journaled but not yet written back. `data == None`: unallocated (reads as zeros).
#[derive(Clone, Debug)]
pub(crate) struct Cached {
    pub seq: u64,
    pub data: Option<SharedBuf>,
}

/// A whole-object write redirected into a fresh slot and not yet written back to the slot
/// table: the CRCs live here until then, and the data stays in memory until its write completes.
#[derive(Debug)]
pub(crate) struct Base {
    pub seq: u64,
    pub crcs: Box<[u32]>,
    pub inflight: Option<SharedBuf>,
}

/// One live object. Memory: ~100 bytes in the map plus its cached blocks.
#[derive(Debug, Default)]
pub(crate) struct Obj {
    pub version: u64,
    pub slot: u32,
    pub base: Option<Box<Base>>,
    pub cache: BTreeMap<u16, Cached>,
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

const FREE: u8 = 0;
const CLAIMED: u8 = 1;
const LIMBO: u8 = 2;

/// Slot allocation. A slot is FREE (allocatable), CLAIMED (used by a live object) or in LIMBO
/// (released by a live object, but the release is not yet written back to the slot table; it
/// must not be reused before, or a crash could replay old records onto new data).
pub(crate) struct Allocator {
    state: Vec<u8>,
    cursor: usize,
    pub free: u64,
    pub claimed: u64,
    pub limbo: u64,
}

impl Allocator {
    pub fn new(slots: u32) -> Allocator {
        Allocator {
            state: vec![FREE; slots as usize],
            cursor: 0,
            free: u64::from(slots),
            claimed: 0,
            limbo: 0,
        }
    }

    /// Takes a free slot (next-fit from the last allocation, so fresh objects land in order).
    pub fn take(&mut self) -> Option<u32> {
        if self.free == 0 {
            return None;
        }
        let n = self.state.len();
        for k in 0..n {
            let i = (self.cursor + k) % n;
            if self.state[i] == FREE {
                self.state[i] = CLAIMED;
                self.cursor = i + 1;
                self.free -= 1;
                self.claimed += 1;
                return Some(i as u32);
            }
        }
        None
    }

    /// A live object stopped using `s`.
    pub fn release(&mut self, s: u32) {
        if self.state[s as usize] == CLAIMED {
            self.state[s as usize] = LIMBO;
            self.claimed -= 1;
            self.limbo += 1;
        }
    }

    /// The slot table durably records `s` as free: it may be reused.
    pub fn written_back_free(&mut self, s: u32) {
        if self.state[s as usize] == LIMBO {
            self.state[s as usize] = FREE;
            self.limbo -= 1;
            self.free += 1;
        }
    }

    /// Rebuilds the allocator after recovery.
    pub fn rebuild(
        slots: u32,
        claimed: impl Fn(u32) -> bool,
        limbo: impl Fn(u32) -> bool,
    ) -> Allocator {
        let mut a = Allocator::new(slots);
        a.free = 0;
        for s in 0..slots {
            let st = if claimed(s) {
                a.claimed += 1;
                CLAIMED
            } else if limbo(s) {
                a.limbo += 1;
                LIMBO
            } else {
                a.free += 1;
                FREE
            };
            a.state[s as usize] = st;
        }
        a
    }
}

/// The object index plus the slot table image and the allocator.
pub(crate) struct State {
    pub objs: FxHashMap<ObjectId, Obj>,
    pub d: SlotTable,
    pub alloc: Allocator,
    /// During replay the allocator is rebuilt afterwards, so apply does not touch it.
    pub replaying: bool,
}

impl State {
    /// Current content location of block `b` of `oid`.
    pub fn block_src(&self, oid: &ObjectId, obj: &Obj, b: u32) -> Src {
        if let Some(c) = obj.cache.get(&(b as u16)) {
            return match &c.data {
                Some(buf) => Src::Mem(buf.clone(), 0),
                None => Src::Zero,
            };
        }
        if let Some(base) = &obj.base {
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
        (0..self.d.blocks)
            .filter(|&b| self.is_allocated(oid, obj, b))
            .count() as u64
            * BLOCK
    }

    fn set_slot(&mut self, obj_slot: &mut u32, new: u32) {
        if *obj_slot != new {
            if *obj_slot != NO_SLOT && !self.replaying {
                self.alloc.release(*obj_slot);
            }
            *obj_slot = new;
        }
    }

    /// Takes `e`'s object out of the index (a new one if absent) with the entry's slot and
    /// version applied; the caller puts it back.
    fn take_for_write(&mut self, e: &Entry) -> Obj {
        let mut obj = self.objs.remove(&e.oid).unwrap_or(Obj {
            slot: NO_SLOT,
            ..Obj::default()
        });
        let mut slot = obj.slot;
        self.set_slot(&mut slot, e.slot);
        obj.slot = slot;
        obj.version = e.version;
        obj
    }

    /// Applies one journal entry of record `seq` to the live state. `blocks` are the data
    /// blocks of this entry's data items in order; `full` is the object buffer of a full write
    /// whose data write has not completed yet. Every effect is absolute, so replaying records
    /// whose write-back was interrupted gives the same state again.
    pub fn apply(&mut self, seq: u64, e: &Entry, blocks: &[SharedBuf], full: Option<SharedBuf>) {
        match &e.kind {
            EntryKind::Write(items) => {
                let mut obj = self.take_for_write(e);
                let mut data = blocks.iter();
                for it in items {
                    let buf = if it.data { data.next().cloned() } else { None };
                    obj.cache.insert(it.block, Cached { seq, data: buf });
                }
                self.objs.insert(e.oid, obj);
            }
            EntryKind::Full(crcs) => {
                let mut obj = self.take_for_write(e);
                obj.cache.clear();
                obj.base = Some(Box::new(Base {
                    seq,
                    crcs: crcs.clone(),
                    inflight: full,
                }));
                self.objs.insert(e.oid, obj);
            }
            EntryKind::Delete => {
                if let Some(obj) = self.objs.remove(&e.oid)
                    && obj.slot != NO_SLOT
                    && !self.replaying
                {
                    self.alloc.release(obj.slot);
                }
            }
        }
    }
}
