//! Applying writes, write-zeroes/trims, deletes, purges and installs, in arrival order per
//! object.
//!
//! An operation runs as soon as its object has no earlier operation waiting. It may have to
//! wait for: old contents of partial edge blocks (read-modify-write reads), room in the open
//! journal batch, or a free slot that write-back is about to release. Waiting operations queue
//! per object, so operations on other objects keep flowing.
//!
//! Versions: every operation that changes an object gives it a new version, newer than its
//! current one (a tombstone keeps the version of the delete, so a re-created object is always
//! newer). Install (recovery) sets any version: it replaces the object as a whole.

use super::state::Src;
use super::{Blocked, Engine, IoCtx, Reason, WKind, Waiter, WriteOp};
use crate::buf::{AlignedBuf, SharedBuf};
use crate::crc::crc32c;
use crate::error::EngineError;
use crate::io::{IoDone, IoReq};
use crate::layout::{BLOCK, NO_SLOT, PG_BLOB};
use crate::record::{Entry, EntryKind, Item};
use crate::{ObjectContent, ObjectImage};
use basalt_types::{ObjectId, PgId, Version};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

const B: usize = BLOCK as usize;

/// `Err` hands an operation back with the reason it must wait (boxed: waiting is rare).
type Step = Result<(), Box<(WriteOp, Reason)>>;

/// Entry bytes one operation may add to a batch beyond its own entry: a tombstone eviction
/// (purge + PG record).
const EVICTION_ROOM: usize = 256;

/// The old content of a block needed for read-modify-write.
enum Old {
    Zero,
    Buf(AlignedBuf),
    NeedRead { slot: u32, block: u32, crc: u32 },
}

impl Engine {
    pub fn handle_write(&mut self, mut op: WriteOp) {
        self.last_write = self.clock.now();
        self.number(&mut op);
        if self.closing {
            op.reply.err(EngineError::Closed);
            return;
        }
        if let Some(b) = self.blocked.get_mut(&op.oid) {
            b.ops.push_back(op);
            return;
        }
        if let Err(b) = self.try_op(op) {
            let (op, reason) = *b;
            self.block(op, reason);
        }
    }

    fn block(&mut self, op: WriteOp, reason: Reason) {
        let oid = op.oid;
        let b = self.blocked.entry(oid).or_insert_with(|| Blocked {
            ops: VecDeque::new(),
            reason,
        });
        b.reason = reason;
        b.ops.push_front(op);
        if reason != Reason::Reads {
            self.waiting.push_back(oid);
        }
    }

    /// Runs the queued operations of `oid` until one has to wait again.
    pub fn resume(&mut self, oid: ObjectId) {
        while let Some(b) = self.blocked.get_mut(&oid) {
            let Some(op) = b.ops.pop_front() else {
                self.blocked.remove(&oid);
                return;
            };
            if let Err(w) = self.try_op(op) {
                let (op, reason) = *w;
                let b = self.blocked.get_mut(&oid).expect("still blocked");
                b.reason = reason;
                b.ops.push_front(op);
                if reason != Reason::Reads {
                    self.waiting.push_back(oid);
                }
                return;
            }
        }
    }

    /// Retries objects waiting for batch room or free slots (once per pump).
    pub fn retry_waiting(&mut self) {
        let n = self.waiting.len();
        for _ in 0..n {
            let Some(oid) = self.waiting.pop_front() else {
                break;
            };
            let ready = match self.blocked.get(&oid).map(|b| b.reason) {
                Some(Reason::Room) => self.op_fits(),
                Some(Reason::Space) => self.st.alloc.free() > 0 || self.st.alloc.limbo == 0,
                _ => false,
            };
            if ready {
                self.resume(oid);
            } else if self
                .blocked
                .get(&oid)
                .is_some_and(|b| b.reason != Reason::Reads)
            {
                self.waiting.push_back(oid);
            }
        }
    }

    /// Whether the largest single operation fits in the open batch.
    fn op_fits(&self) -> bool {
        let blocks = self.sb.blocks_per_object() as usize;
        self.batch_has_room(64 + 8 * blocks + EVICTION_ROOM, blocks)
    }

    /// The version `op` gives its object, or the error that refuses it.
    fn new_version(&self, op: &WriteOp) -> Result<Version, EngineError> {
        let obj = self.st.objs.get(&op.oid);
        if let Some(o) = obj
            && o.pg != op.opts.pg
        {
            return Err(EngineError::invalid(format!(
                "{} belongs to PG {}, not PG {}",
                op.oid, o.pg, op.opts.pg
            )));
        }
        let current = obj.map_or(Version::NONE, |o| o.version);
        if let Some(since) = op.opts.keep_since {
            let left = match &op.kind {
                WKind::Install(img) => img.version,
                _ => Version::NONE,
            };
            if current > since && current > left {
                return Err(EngineError::StaleVersion {
                    current,
                    requested: left,
                });
            }
        }
        if let WKind::Install(img) = &op.kind {
            return Ok(img.version);
        }
        if let Some(expected) = op.opts.prior
            && expected != current
            && !self.unrecorded.reached(&op.oid, expected, current)
        {
            return Err(EngineError::PriorVersion { current, expected });
        }
        match op.opts.version {
            Some(v) if v <= current => Err(EngineError::StaleVersion {
                current,
                requested: v,
            }),
            Some(v) => Ok(v),
            None => Ok(current.next()),
        }
    }

    /// Tries to apply one operation. `Err` hands it back with the reason it must wait.
    fn try_op(&mut self, mut op: WriteOp) -> Step {
        if let Some(e) = op.failed.take() {
            op.reply.err(*e);
            return Ok(());
        }
        if let Some(p) = &self.poisoned {
            op.reply.err(EngineError::Poisoned(p.clone()));
            return Ok(());
        }
        let version = match self.new_version(&op) {
            Ok(v) => v,
            Err(e) => {
                op.reply.err(e);
                return Ok(());
            }
        };
        if !self.op_fits() {
            return Err(Box::new((op, Reason::Room)));
        }
        match &op.kind {
            WKind::Delete => self.op_delete(op, version),
            WKind::Purge {
                only_tombstone_upto,
            } => {
                let upto = *only_tombstone_upto;
                self.op_purge(op, upto);
                Ok(())
            }
            WKind::Install(_) => self.op_install(op),
            WKind::Data(d) if op.offset == 0 && d.len() == self.sb.object_size as usize => {
                self.op_full(op, version)
            }
            _ => self.op_partial(op, version),
        }
    }

    /// The current version of `oid` (tombstones included), `NONE` if unknown.
    fn current(&self, oid: &ObjectId) -> Version {
        self.st.objs.get(oid).map_or(Version::NONE, |o| o.version)
    }

    /// Answers an operation that changes nothing, in order with earlier ones.
    fn noop(&mut self, op: WriteOp) {
        let version = self.current(&op.oid);
        if let Some(v) = op.opts.version
            && matches!(op.kind, WKind::Zero(_) | WKind::Delete)
        {
            // What a write sent behind it follows (`WriteOptions::prior`).
            self.unrecorded.note(op.oid, v, version);
        }
        self.add_barrier(Waiter {
            durable: op.opts.durable,
            reply: op.reply,
            version,
        });
    }

    /// Adds `entry` for `op` and, when the write is held, counts it on its object.
    fn commit_entry(
        &mut self,
        op: WriteOp,
        entry: Entry,
        blocks: Vec<SharedBuf>,
        full: Option<(ObjectId, u32, SharedBuf)>,
    ) {
        let (oid, version, held) = (entry.oid, entry.version, op.opts.pending);
        self.shared.writes.fetch_add(1, Ordering::Relaxed);
        self.add_entry(
            entry,
            blocks,
            full,
            Some(Waiter {
                durable: op.opts.durable,
                reply: op.reply,
                version,
            }),
        );
        if held && let Some(obj) = self.st.objs.get_mut(&oid) {
            obj.pending = obj.pending.checked_add(1).expect("held writes overflow");
        }
    }

    fn op_delete(&mut self, op: WriteOp, version: Version) -> Step {
        let Some(obj) = self.st.objs.get(&op.oid) else {
            // Nothing to delete; still ordered after earlier operations.
            self.noop(op);
            return Ok(());
        };
        let (slot, tomb) = (obj.slot, obj.tomb);
        let tomb = if tomb != NO_SLOT {
            tomb
        } else {
            match self.reserve_tomb(op.oid, op.opts.pg) {
                Ok(t) => t,
                Err(e) => {
                    op.reply.err(e);
                    return Ok(());
                }
            }
        };
        let entry = Entry {
            tomb,
            old_slot: slot,
            ..Entry::new(op.oid, op.opts.pg, version, EntryKind::Delete)
        };
        self.commit_entry(op, entry, Vec::new(), None);
        Ok(())
    }

    /// Forgets an object entirely. `only_tombstone_upto`: only if it is a tombstone no newer
    /// than that (log trimming must never remove a live object or a newer delete).
    pub fn op_purge(&mut self, op: WriteOp, only_tombstone_upto: Option<Version>) {
        let Some(obj) = self.st.objs.get(&op.oid) else {
            self.noop(op);
            return;
        };
        if let Some(upto) = only_tombstone_upto
            && (!obj.is_tombstone() || obj.version > upto)
        {
            self.noop(op);
            return;
        }
        let entry = Entry {
            old_slot: obj.slot,
            old_tomb: obj.tomb,
            ..Entry::new(op.oid, obj.pg, Version::NONE, EntryKind::Purge)
        };
        let oid = op.oid;
        self.commit_entry(op, entry, Vec::new(), None);
        self.release_held_reads(oid);
    }

    /// Replaces the object with an image, whatever its current version (`new_version` has
    /// checked `WriteOptions::keep_since`).
    fn op_install(&mut self, op: WriteOp) -> Step {
        let WKind::Install(ObjectImage { version, content }) = &op.kind else {
            unreachable!("op_install is only called for installs")
        };
        let (version, oid, pg) = (*version, op.oid, op.opts.pg);
        let (slot, tomb) = self
            .st
            .objs
            .get(&oid)
            .map_or((NO_SLOT, NO_SLOT), |o| (o.slot, o.tomb));
        let entry = match content {
            ObjectContent::Absent => {
                self.op_purge(op, None);
                return Ok(());
            }
            ObjectContent::Tombstone => {
                let tomb = if tomb != NO_SLOT {
                    tomb
                } else {
                    match self.reserve_tomb(oid, pg) {
                        Ok(t) => t,
                        Err(e) => {
                            op.reply.err(e);
                            return Ok(());
                        }
                    }
                };
                Entry {
                    tomb,
                    old_slot: slot,
                    ..Entry::new(oid, pg, version, EntryKind::Delete)
                }
            }
            ObjectContent::Data { data, allocated } => {
                if data.len() != self.sb.object_size as usize {
                    op.reply.err(EngineError::invalid(format!(
                        "install of {oid}: {} bytes, the object size is {}",
                        data.len(),
                        self.sb.object_size
                    )));
                    return Ok(());
                }
                let Some(new_slot) = self.st.alloc.take() else {
                    return self.no_space(op);
                };
                let buf = SharedBuf::of(data);
                let crcs: Box<[u32]> = buf.chunks(B).map(crc32c).collect();
                let words = (self.sb.blocks_per_object() as usize).div_ceil(64);
                let mut bits = allocated.clone();
                bits.resize(words, 0);
                let all = (0..self.sb.blocks_per_object())
                    .all(|b| bits[b as usize / 64] & (1 << (b % 64)) != 0);
                let entry = Entry {
                    slot: new_slot,
                    old_slot: slot,
                    old_tomb: tomb,
                    ..Entry::new(
                        oid,
                        pg,
                        version,
                        EntryKind::Full {
                            crcs,
                            alloc: (!all).then(|| bits.into_boxed_slice()),
                        },
                    )
                };
                let full = Some((oid, new_slot, buf));
                self.count_bytes(data.len());
                self.commit_entry(op, entry, Vec::new(), full);
                self.reset_held(oid);
                return Ok(());
            }
        };
        self.commit_entry(op, entry, Vec::new(), None);
        self.reset_held(oid);
        Ok(())
    }

    /// An install replaces whatever held writes the object had: reads may go on.
    fn reset_held(&mut self, oid: ObjectId) {
        if let Some(obj) = self.st.objs.get_mut(&oid) {
            obj.pending = 0;
        }
        self.release_held_reads(oid);
    }

    /// A whole-object write: redirect-on-write into a fresh slot, so the data is written once
    /// and the journal carries only CRCs. Without a free slot it is journaled in place.
    fn op_full(&mut self, op: WriteOp, version: Version) -> Step {
        let (old_slot, old_tomb) = self
            .st
            .objs
            .get(&op.oid)
            .map_or((NO_SLOT, NO_SLOT), |o| (o.slot, o.tomb));
        let Some(slot) = self.st.alloc.take() else {
            if old_slot != NO_SLOT {
                return self.op_partial(op, version);
            }
            return self.no_space(op);
        };
        let WKind::Data(data) = &op.kind else {
            unreachable!("op_full is only called for data")
        };
        // Data received into an aligned buffer goes to the device as is (no copy). Only here:
        // it is written at once, while blocks of partial writes stay cached until write-back
        // and are copied, so that they never pin a large payload buffer.
        let buf = SharedBuf::of(data);
        let crcs: Box<[u32]> = buf.chunks(B).map(crc32c).collect();
        let entry = Entry {
            slot,
            old_slot,
            old_tomb,
            ..Entry::new(
                op.oid,
                op.opts.pg,
                version,
                EntryKind::Full { crcs, alloc: None },
            )
        };
        self.count_bytes(data.len());
        let full = Some((op.oid, slot, buf));
        self.commit_entry(op, entry, Vec::new(), full);
        Ok(())
    }

    fn count_bytes(&self, bytes: usize) {
        self.shared
            .bytes_written
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    fn no_space(&mut self, op: WriteOp) -> Step {
        if self.st.alloc.limbo > 0 {
            // Slots are being released by write-back; wait for it.
            return Err(Box::new((op, Reason::Space)));
        }
        op.reply.err(EngineError::OutOfSpace {
            needed: u64::from(self.sb.object_size),
            free: 0,
        });
        Ok(())
    }

    /// A tombstone record for `oid` of `pg`. When the table is full, the oldest tombstone (of
    /// this PG if it has one, else of any PG) is forgotten first and its PG's log tail raised
    /// to its version, in the same batch: a replica that needs changes older than the tail
    /// then compares full listings instead.
    ///
    /// A tombstone of a held delete (not yet committed by the store's user) is never the one
    /// forgotten: reads of its object wait for the commit, which would find no object to
    /// release them, and a read after the eviction would see the delete before its commit.
    fn reserve_tomb(&mut self, oid: ObjectId, pg: u32) -> Result<u32, EngineError> {
        if let Some(t) = self.st.tomb_alloc.take() {
            return Ok(t as u32);
        }
        let own = PgId { pool: oid.pool, pg };
        let Some((victim_pg, victim, version)) = self
            .oldest_free_tomb(own)
            .or_else(|| self.st.pgs.keys().find_map(|p| self.oldest_free_tomb(*p)))
        else {
            // Every record holds a delete still in flight: none may go yet.
            return Err(EngineError::OutOfSpace {
                needed: crate::layout::TOMB_RECORD as u64,
                free: 0,
            });
        };
        self.raise_log_tail(victim_pg, version)?;
        // Gone from here, still what a write behind its delete follows.
        self.unrecorded.note(victim, version, Version::NONE);
        let t = self.st.objs[&victim].tomb;
        let purge = Entry {
            old_tomb: t,
            ..Entry::new(victim, victim_pg.pg, Version::NONE, EntryKind::Purge)
        };
        self.add_entry(purge, Vec::new(), None, None);
        let t = self
            .st
            .tomb_alloc
            .take()
            .expect("a tombstone record was just freed");
        Ok(t as u32)
    }

    /// The oldest tombstone of `pg` whose delete is not held, and its version.
    fn oldest_free_tomb(&self, pg: PgId) -> Option<(PgId, ObjectId, Version)> {
        let tombs = &self.st.pgs.get(&pg)?.tombs;
        tombs.iter().find_map(|(version, volume, index)| {
            let oid = ObjectId::new(pg.pool, *volume, *index);
            let held = self.st.objs.get(&oid).is_some_and(|o| o.pending > 0);
            (!held).then_some((pg, oid, *version))
        })
    }

    /// Adds a PG-record entry raising `pg`'s log tail to at least `tail`.
    pub fn raise_log_tail(&mut self, pg: PgId, tail: Version) -> Result<(), EngineError> {
        let (record, old_tail, blob) = match self.st.pgs.get(&pg) {
            Some(p) => (p.record, p.log_tail, p.blob),
            None => (NO_SLOT, Version::NONE, [0; PG_BLOB]),
        };
        if tail <= old_tail {
            return Ok(());
        }
        let record = self.pg_record(record)?;
        self.add_entry(
            pg_entry(pg, record, false, tail, blob),
            Vec::new(),
            None,
            None,
        );
        Ok(())
    }

    /// `record`, or a new PG record when `NO_SLOT`.
    pub fn pg_record(&mut self, record: u32) -> Result<u32, EngineError> {
        if record != NO_SLOT {
            return Ok(record);
        }
        match self.st.pg_alloc.take() {
            Some(r) => Ok(r as u32),
            None => Err(EngineError::TooManyPgs {
                limit: self.sb.pgs.capacity(),
            }),
        }
    }

    /// The old content of block `b` for a partial update.
    fn old_block(&self, op: &WriteOp, b: u32) -> Old {
        // Blocks fetched by earlier read-modify-write reads are kept until the operation is
        // applied, so a retry that still waits for another block does not lose them.
        if let Some((_, buf)) = op.old.iter().find(|(blk, _)| *blk == b) {
            return Old::Buf(AlignedBuf::copy_from(buf));
        }
        let Some(obj) = self.st.objs.get(&op.oid) else {
            return Old::Zero;
        };
        match self.st.block_src(&op.oid, obj, b) {
            Src::Zero => Old::Zero,
            Src::Mem(buf, off) => Old::Buf(AlignedBuf::copy_from(&buf[off..off + B])),
            Src::Disk { slot, block, crc } => Old::NeedRead { slot, block, crc },
        }
    }

    /// Writes and write-zeroes below the object size: new 4 KiB block images journaled in the
    /// record and kept in the cache until write-back.
    fn op_partial(&mut self, mut op: WriteOp, version: Version) -> Step {
        let len = match &op.kind {
            WKind::Data(d) => d.len() as u32,
            WKind::Zero(n) => *n,
            _ => unreachable!("op_partial is only called for data and zeroes"),
        };
        let zero = matches!(op.kind, WKind::Zero(_));
        let (start, end) = (op.offset as usize, (op.offset + len) as usize);
        let mut items = Vec::new();
        let mut bufs = Vec::new();
        let mut need = Vec::new();
        for b in (start / B) as u32..=((end - 1) / B) as u32 {
            let (bs, be) = (b as usize * B, b as usize * B + B);
            let (lo, hi) = (start.max(bs), end.min(be));
            let whole = lo == bs && hi == be;
            if whole && zero {
                items.push(Item {
                    block: b as u16,
                    data: false,
                    crc: 0,
                });
                continue;
            }
            let mut block = if whole {
                AlignedBuf::for_read(B)
            } else {
                match self.old_block(&op, b) {
                    Old::Buf(buf) => buf,
                    Old::Zero if zero => continue, // already zeros
                    Old::Zero => AlignedBuf::zeroed(B),
                    Old::NeedRead { slot, block, crc } => {
                        need.push((slot, block, crc));
                        continue;
                    }
                }
            };
            match &op.kind {
                WKind::Data(d) => {
                    block[lo - bs..hi - bs].copy_from_slice(&d[lo - start..hi - start])
                }
                _ => block[lo - bs..hi - bs].fill(0),
            }
            items.push(Item {
                block: b as u16,
                data: true,
                crc: crc32c(&block),
            });
            bufs.push(SharedBuf::new(block));
        }
        if !need.is_empty() {
            op.reads_pending = need.len() as u32;
            for (slot, block, crc) in need {
                let req = IoReq::Read {
                    off: self.sb.slot_offset(slot, block),
                    buf: AlignedBuf::for_read(B),
                };
                self.submit(
                    IoCtx::Rmw {
                        oid: op.oid,
                        block,
                        crc,
                    },
                    req,
                );
            }
            return Err(Box::new((op, Reason::Reads)));
        }
        let has_data = !bufs.is_empty();
        let (live_slot, tomb) = self
            .st
            .objs
            .get(&op.oid)
            .map_or((NO_SLOT, NO_SLOT), |o| (o.slot, o.tomb));
        let slot = if live_slot != NO_SLOT {
            live_slot
        } else if !has_data {
            // Zeroing an object that does not exist (or is deleted): nothing to record.
            self.noop(op);
            return Ok(());
        } else {
            match self.st.alloc.take() {
                Some(s) => s,
                None => return self.no_space(op),
            }
        };
        if items.is_empty() {
            // Zeroing blocks that are already unallocated: record the version bump only.
            items.push(Item {
                block: (start / B) as u16,
                data: false,
                crc: 0,
            });
        }
        self.count_bytes(len as usize);
        let entry = if !has_data && self.empties_object(&op.oid, &items) {
            // Nothing allocated would remain: the object becomes a tombstone.
            let tomb = match self.reserve_tomb(op.oid, op.opts.pg) {
                Ok(t) => t,
                Err(e) => {
                    op.reply.err(e);
                    return Ok(());
                }
            };
            Entry {
                tomb,
                old_slot: slot,
                ..Entry::new(op.oid, op.opts.pg, version, EntryKind::Delete)
            }
        } else {
            Entry {
                slot,
                old_tomb: tomb,
                ..Entry::new(op.oid, op.opts.pg, version, EntryKind::Write(items))
            }
        };
        self.commit_entry(op, entry, bufs, None);
        Ok(())
    }

    /// Would unallocating `items` leave `oid` without any allocated block?
    fn empties_object(&self, oid: &ObjectId, items: &[Item]) -> bool {
        let Some(obj) = self.st.objs.get(oid) else {
            return true;
        };
        (0..self.sb.blocks_per_object()).all(|b| {
            items.iter().any(|i| u32::from(i.block) == b) || !self.st.is_allocated(oid, obj, b)
        })
    }

    /// A read-modify-write read finished: verify it and resume the object when all are in.
    pub fn rmw_done(&mut self, oid: ObjectId, block: u32, crc: u32, d: IoDone) {
        let Some(b) = self.blocked.get_mut(&oid) else {
            return;
        };
        let Some(op) = b.ops.front_mut() else { return };
        op.reads_pending = op
            .reads_pending
            .checked_sub(1)
            .expect("more read-modify-write completions than reads");
        let IoReq::Read { buf, off } = d.req else {
            return;
        };
        match d.res {
            Err(e) if !super::media_error(&e) => op.failed = Some(Box::new(EngineError::Io(e))),
            Err(e) => {
                op.failed = Some(Box::new(EngineError::Unreadable {
                    oid,
                    offset: u64::from(block) * BLOCK,
                    detail: e.to_string(),
                }));
                super::read_error(&self.shared, &mut self.bad_seen, off, crc);
            }
            Ok(()) if crc32c(&buf) != crc => {
                op.failed = Some(Box::new(EngineError::Checksum {
                    oid,
                    offset: u64::from(block) * BLOCK,
                }));
                super::checksum_error(&self.shared, &mut self.bad_seen, off, crc);
            }
            Ok(()) => op.old.push((block, buf)),
        }
        if op.reads_pending == 0 {
            self.resume(oid);
        }
    }

    /// The user committed a held write of `oid`: once none is left, waiting reads go on.
    pub fn commit(&mut self, oid: ObjectId, version: Version) {
        let Some(obj) = self.st.objs.get_mut(&oid) else {
            return;
        };
        // An install (recovery) or purge since the write resets the count: late commits of
        // the writes it replaced are ignored.
        if obj.pending == 0 {
            tracing::debug!(%oid, %version, "commit of a write an install replaced");
            return;
        }
        obj.pending -= 1;
        if obj.pending == 0 {
            self.release_held_reads(oid);
        }
    }
}

/// A PG-record entry.
pub(crate) fn pg_entry(
    pg: PgId,
    record: u32,
    remove: bool,
    log_tail: Version,
    blob: [u8; PG_BLOB],
) -> Entry {
    Entry {
        slot: record,
        ..Entry::new(
            ObjectId::new(pg.pool, basalt_types::VolumeId(0), 0),
            pg.pg,
            Version::NONE,
            EntryKind::Pg {
                remove,
                log_tail,
                blob: Box::new(blob),
            },
        )
    }
}
