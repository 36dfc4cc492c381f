//! Applying writes, write-zeroes/trims and deletes, in arrival order per object.
//!
//! An operation runs as soon as its object has no earlier operation waiting. It may have to
//! wait for: old contents of partial edge blocks (read-modify-write reads), room in the open
//! journal batch, or a free slot that write-back is about to release. Waiting operations queue
//! per object, so operations on other objects keep flowing.

use super::state::Src;
use super::{Blocked, Engine, IoCtx, Reason, WKind, Waiter, WriteOp};
use crate::buf::{AlignedBuf, SharedBuf};
use crate::crc::crc32c;
use crate::error::EngineError;
use crate::io::{IoDone, IoReq};
use crate::layout::{BLOCK, NO_SLOT};
use crate::record::{Entry, EntryKind, Item};
use basalt_types::{ObjectId, Version};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

const B: usize = BLOCK as usize;

/// `Err` hands an operation back with the reason it must wait (boxed: waiting is rare).
type Step = Result<(), Box<(WriteOp, Reason)>>;

/// The old content of a block needed for read-modify-write.
enum Old {
    Zero,
    Buf(AlignedBuf),
    NeedRead { slot: u32, block: u32, crc: u32 },
}

impl Engine {
    pub fn handle_write(&mut self, op: WriteOp) {
        self.last_write = self.clock.now();
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
                Some(Reason::Room) => {
                    let blocks = self.sb.blocks_per_object() as usize;
                    self.batch_has_room(40 + 8 * blocks, blocks)
                }
                Some(Reason::Space) => self.st.alloc.free > 0 || self.st.alloc.limbo == 0,
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

    /// Tries to apply one operation. `Err` hands it back with the reason it must wait.
    fn try_op(&mut self, mut op: WriteOp) -> Step {
        if let Some(e) = op.failed.take() {
            op.reply.err(e);
            return Ok(());
        }
        if let Some(p) = &self.poisoned {
            op.reply.err(EngineError::Poisoned(p.clone()));
            return Ok(());
        }
        let current = self.st.objs.get(&op.oid).map_or(0, |o| o.version);
        let version = match op.opts.version {
            Some(v) if v.0 <= current => {
                op.reply.err(EngineError::StaleVersion {
                    current: Version(current),
                    requested: v,
                });
                return Ok(());
            }
            Some(v) => v.0,
            None => current + 1,
        };
        let blocks = self.sb.blocks_per_object() as usize;
        if !self.batch_has_room(40 + 8 * blocks, blocks) {
            return Err(Box::new((op, Reason::Room)));
        }
        match &op.kind {
            WKind::Delete => {
                self.op_delete(op, version);
                Ok(())
            }
            WKind::Data(d) if op.offset == 0 && d.len() == self.sb.object_size as usize => {
                self.op_full(op, version)
            }
            _ => self.op_partial(op, version),
        }
    }

    fn waiter(op: &WriteOp, version: u64) -> (bool, Version) {
        (op.opts.durable, Version(version))
    }

    fn op_delete(&mut self, op: WriteOp, version: u64) {
        let (durable, v) = Self::waiter(&op, version);
        let Some(obj) = self.st.objs.get(&op.oid) else {
            // Nothing to delete; still ordered after earlier operations.
            self.add_barrier(Waiter {
                durable,
                reply: op.reply,
                version: v,
            });
            return;
        };
        let entry = Entry {
            oid: op.oid,
            version,
            slot: NO_SLOT,
            old_slot: obj.slot,
            kind: EntryKind::Delete,
        };
        self.shared.writes.fetch_add(1, Ordering::Relaxed);
        self.add_entry(
            entry,
            Vec::new(),
            None,
            Waiter {
                durable,
                reply: op.reply,
                version: v,
            },
        );
    }

    /// A whole-object write: redirect-on-write into a fresh slot, so the data is written once
    /// and the journal carries only CRCs. Without a free slot it is journaled in place.
    fn op_full(&mut self, op: WriteOp, version: u64) -> Step {
        let old_slot = self.st.objs.get(&op.oid).map_or(NO_SLOT, |o| o.slot);
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
            oid: op.oid,
            version,
            slot,
            old_slot,
            kind: EntryKind::Full(crcs),
        };
        self.count_write(data.len());
        let (durable, v) = Self::waiter(&op, version);
        self.add_entry(
            entry,
            Vec::new(),
            Some((op.oid, slot, buf)),
            Waiter {
                durable,
                reply: op.reply,
                version: v,
            },
        );
        Ok(())
    }

    fn count_write(&self, bytes: usize) {
        self.shared.writes.fetch_add(1, Ordering::Relaxed);
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
    fn op_partial(&mut self, mut op: WriteOp, version: u64) -> Step {
        let len = match &op.kind {
            WKind::Data(d) => d.len() as u32,
            WKind::Zero(n) => *n,
            WKind::Delete => 0,
        };
        let (start, end) = (op.offset as usize, (op.offset + len) as usize);
        let mut items = Vec::new();
        let mut bufs = Vec::new();
        let mut need = Vec::new();
        for b in (start / B) as u32..=((end - 1) / B) as u32 {
            let (bs, be) = (b as usize * B, b as usize * B + B);
            let (lo, hi) = (start.max(bs), end.min(be));
            let whole = lo == bs && hi == be;
            if whole && matches!(op.kind, WKind::Zero(_)) {
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
                    Old::Zero if matches!(op.kind, WKind::Zero(_)) => continue, // already zeros
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
        let existing = self.st.objs.get(&op.oid).map(|o| o.slot);
        let (durable, v) = Self::waiter(&op, version);
        let slot = match existing {
            Some(s) if s != NO_SLOT => s,
            _ if !has_data => {
                // Zeroing an object that does not exist: nothing to record.
                self.add_barrier(Waiter {
                    durable,
                    reply: op.reply,
                    version: Version::NONE,
                });
                return Ok(());
            }
            _ => match self.st.alloc.take() {
                Some(s) => s,
                None => return self.no_space(op),
            },
        };
        if items.is_empty() {
            // Zeroing blocks that are already unallocated: record the version bump only.
            items.push(Item {
                block: (start / B) as u16,
                data: false,
                crc: 0,
            });
        }
        self.count_write(len as usize);
        let kind = if !has_data && self.empties_object(&op.oid, &items) {
            // Nothing allocated would remain: the object goes away and frees its slot.
            EntryKind::Delete
        } else {
            EntryKind::Write(items)
        };
        let entry = match kind {
            EntryKind::Delete => Entry {
                oid: op.oid,
                version,
                slot: NO_SLOT,
                old_slot: slot,
                kind,
            },
            kind => Entry {
                oid: op.oid,
                version,
                slot,
                old_slot: NO_SLOT,
                kind,
            },
        };
        self.add_entry(
            entry,
            bufs,
            None,
            Waiter {
                durable,
                reply: op.reply,
                version: v,
            },
        );
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
        op.reads_pending -= 1;
        let IoReq::Read { buf, .. } = d.req else {
            return;
        };
        match d.res {
            Err(e) => op.failed = Some(EngineError::Io(e)),
            Ok(()) if crc32c(&buf) != crc => {
                self.shared.checksum_errors.fetch_add(1, Ordering::Relaxed);
                op.failed = Some(EngineError::Checksum {
                    oid,
                    offset: u64::from(block) * BLOCK,
                });
            }
            Ok(()) => op.old.push((block, buf)),
        }
        if op.reads_pending == 0 {
            self.resume(oid);
        }
    }
}
