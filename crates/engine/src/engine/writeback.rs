//! Write-back: copies the effects of durable journal records into the slots and the slot
//! table, then frees their journal space. One batch at a time:
//!
//! 1. apply a prefix of durable records to the slot-table image, collect the newest image of
//!    every touched block, and write blocks and dirty meta pages (each page to its older copy);
//! 2. flush, so slots and pages are durable;
//! 3. write the journal header with the new start, then flush again;
//! 4. only now drop the records, clear the cache entries they covered, and let released slots
//!    be reused.
//!
//! A batch is large (up to a quarter of the journal) so that many blocks share each slot-table
//! page write and the two flushes; its writes are handed to the device a few at a time
//! (`feed`), more as the journal fills, so that foreground I/O never queues behind a whole
//! batch and each foreground flush carries only a share of the write-back data.
//!
//! Why replay may simply redo a batch: a batch's records stay in the journal until step 3 is
//! durable, and slots it releases are reused only after step 4. So the records recovery finds
//! belong to at most one interrupted batch plus records not yet written back, and none of
//! them targets a slot that was reused since.

use super::journal::RecState;
use super::{Engine, IoCtx};
use crate::buf::{AlignedBuf, IoBuf, SharedBuf};
use crate::io::IoReq;
use crate::layout::{BLOCK, NO_SLOT};
use crate::pgtable::PgRec;
use crate::record::{EntryKind, JournalHeader};
use crate::tombs::TombRec;
use basalt_types::ObjectId;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::Ordering;

/// Blocks written back per batch: a quarter of the journal ring, within these bounds.
const MIN_BATCH_BLOCKS: usize = 4096;
const MAX_BATCH_BLOCKS: usize = 32768;
const MAX_BATCH_RECORDS: usize = 8192;
/// Bufs per vectored write.
const MAX_IOV: usize = 256;
/// Records kept before write-back is forced (bounds recovery work).
const MAX_LIVE_RECORDS: usize = 16384;
/// Write-back requests in flight: while foreground I/O is waiting and the journal is less than
/// half full, then up to three quarters, then (or when nothing else is going on) at most.
const DEPTH_CALM: usize = 4;
const DEPTH_FILLING: usize = 16;
const DEPTH_MAX: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Writing,
    DataFlush(u64),
    Header,
    HeaderFlush(u64),
}

struct Batch {
    records: usize,
    last_seq: u64,
    pending: u32,
    phase: Phase,
    released: Vec<u32>,
    touched: Vec<ObjectId>,
}

/// Which table a dirty page belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Table {
    Slots,
    Tombs,
    Pgs,
}

/// What applying a prefix of records to the table images produced.
#[derive(Default)]
struct Applied {
    /// The newest image of every block to write into its slot.
    writes: BTreeMap<(u32, u32), SharedBuf>,
    dirty: BTreeSet<(Table, u64)>,
    released: Vec<u32>,
    touched: Vec<ObjectId>,
    last_seq: u64,
}

#[derive(Default)]
pub(crate) struct WriteBack {
    /// The tables hash including the batch being written back (the journal header carries
    /// it once the batch's pages are durable).
    pub tables_hash: u64,
    batch: Option<Batch>,
    /// Slots the slot table claims but nothing live uses (found by recovery); released by the
    /// next batch.
    pub orphans: Vec<u32>,
    /// Writes of the current batch not yet handed to the backend.
    queue: VecDeque<(u64, Vec<IoBuf>)>,
    /// Writes of the current batch handed to the backend and not completed.
    inflight: usize,
}

impl WriteBack {
    pub fn active(&self) -> bool {
        self.batch.is_some()
    }
}

impl Engine {
    fn writeback_due(&self) -> bool {
        if self.jr.recs.is_empty() {
            // Orphan slots found by recovery are released by a batch of their own, so an idle
            // store does not keep them (and a full device does not wait for space forever).
            return !self.wb.orphans.is_empty();
        }
        self.closing
            || self.writeback_urgent()
            || self.jr.used() * 4 >= self.jr.ring
            || self.jr.recs.len() >= MAX_LIVE_RECORDS
            || (self.foreground_idle()
                && self.clock.since(self.last_write) >= self.cfg.writeback_idle)
    }

    /// Foreground work waits for write-back: a full journal or no free slot.
    fn writeback_urgent(&self) -> bool {
        let journal_full = self
            .jr
            .open
            .as_ref()
            .is_some_and(|b| !b.entries.is_empty() && self.jr.place(b.bytes()).is_none());
        journal_full
            || self.waiting.iter().any(|o| {
                self.blocked
                    .get(o)
                    .is_some_and(|b| b.reason == super::Reason::Space)
            })
    }

    /// Nothing in the foreground is waiting on the device: no batch, record, flush waiter,
    /// queued operation or read. (Clients stuck behind a slow flush are not idle.)
    fn foreground_idle(&self) -> bool {
        self.jr.open.is_none()
            && self.jr.writing == 0
            && self.jr.durable_waiting == 0
            && self.blocked.is_empty()
            && self.reads.len() == 0
    }

    /// How many write-back requests may be in flight now.
    fn writeback_depth(&self) -> usize {
        if self.closing || self.writeback_urgent() || self.foreground_idle() {
            return DEPTH_MAX;
        }
        match self.jr.used() * 4 / self.jr.ring.max(1) {
            0 | 1 => DEPTH_CALM,
            2 => DEPTH_FILLING,
            _ => DEPTH_MAX,
        }
    }

    /// Hands queued write-back writes to the backend up to the allowed depth.
    fn feed_writeback(&mut self) -> bool {
        let depth = self.writeback_depth();
        let mut fed = false;
        while self.wb.inflight < depth {
            let Some((off, bufs)) = self.wb.queue.pop_front() else {
                break;
            };
            self.wb.inflight += 1;
            let req = IoReq::Write {
                off,
                bufs,
                durable: false,
            };
            self.submit(IoCtx::WriteBack, req);
            fed = true;
        }
        fed
    }

    /// Starts or advances write-back. Returns whether anything changed.
    pub fn pump_writeback(&mut self) -> bool {
        if self.poisoned.is_some() {
            return false;
        }
        let Some(b) = &self.wb.batch else {
            if !self.writeback_due() {
                return false;
            }
            return self.start_batch();
        };
        match b.phase {
            Phase::Writing => self.feed_writeback(),
            Phase::DataFlush(n) if self.jr.flushed_no >= n => {
                self.write_header();
                true
            }
            Phase::HeaderFlush(n) if self.jr.flushed_no >= n => {
                self.finish_batch();
                true
            }
            _ => false,
        }
    }

    fn start_batch(&mut self) -> bool {
        let max_blocks =
            ((self.jr.ring / 4 / BLOCK) as usize).clamp(MIN_BATCH_BLOCKS, MAX_BATCH_BLOCKS);
        let mut n = 0;
        let mut blocks = 0;
        for r in &self.jr.recs {
            if r.state != RecState::Flushed
                || n >= MAX_BATCH_RECORDS
                || (n > 0 && blocks + r.blocks.len() > max_blocks)
            {
                break;
            }
            n += 1;
            blocks += r.blocks.len();
        }
        if n == 0 && self.wb.orphans.is_empty() {
            // Records must be durable before they are written back.
            self.jr.want_durable = true;
            return false;
        }
        let Applied {
            writes,
            dirty,
            released,
            touched,
            last_seq,
        } = self.apply_to_tables(n);
        let mut pending = 0;
        for run in merge_runs(&self.sb, writes) {
            self.wb.queue.push_back(run);
            pending += 1;
        }
        // The header written at the end of this batch has the next generation: every page copy
        // written now names it, so recovery ignores the copies if the batch does not complete.
        let batch = self.jr.header_gen + 1;
        for (table, page) in dirty {
            let (off, buf) = self.encode_dirty(table, page, batch);
            self.wb.queue.push_back((off, vec![IoBuf::Owned(buf)]));
            pending += 1;
        }
        self.wb.batch = Some(Batch {
            records: n,
            last_seq,
            pending,
            phase: Phase::Writing,
            released,
            touched,
        });
        if pending == 0 {
            self.writeback_io_done(Ok(()));
        }
        self.feed_writeback();
        true
    }

    /// Moves a dirty page to its next generation and encodes it into its older copy (the other
    /// copy keeps the previous generation intact).
    fn encode_dirty(&mut self, table: Table, page: u64, batch: u64) -> (u64, AlignedBuf) {
        let uuid = self.sb.uuid;
        let (generation, delta, buf, geom) = match table {
            Table::Slots => {
                let (g, d) = self.st.d.gens.bump(page);
                (
                    g,
                    d,
                    self.st.d.encode_page(page, g, batch, &uuid),
                    self.sb.slots,
                )
            }
            Table::Tombs => {
                let (g, d) = self.st.t.gens.bump(page);
                (
                    g,
                    d,
                    self.st.t.encode_page(page, g, batch, &uuid),
                    self.sb.tombs,
                )
            }
            Table::Pgs => {
                let (g, d) = self.st.p.gens.bump(page);
                (
                    g,
                    d,
                    self.st.p.encode_page(page, g, batch, &uuid),
                    self.sb.pgs,
                )
            }
        };
        self.wb.tables_hash ^= delta;
        (geom.copy_offset(page, generation % 2), buf)
    }

    /// Applies the first `n` records to the table images.
    fn apply_to_tables(&mut self, n: usize) -> Applied {
        let mut a = Applied::default();
        let st = &mut self.st;
        let (d, t, p) = (&mut st.d, &mut st.t, &mut st.p);
        for r in self.jr.recs.iter().take(n) {
            let seq = r.seq;
            a.last_seq = seq;
            let mut data = r.blocks.iter();
            for e in &r.entries {
                if !matches!(e.kind, EntryKind::Pg { .. }) {
                    a.touched.push(e.oid);
                }
                match &e.kind {
                    EntryKind::Write(items) => {
                        d.claim(e.slot, e.oid, e.pg, e.version, seq);
                        a.dirty.insert((Table::Slots, d.page_of(e.slot)));
                        for it in items {
                            let b = u32::from(it.block);
                            d.set_block(e.slot, b, it.data.then_some(it.crc));
                            match it.data.then(|| data.next()).flatten() {
                                Some(buf) => a.writes.insert((e.slot, b), buf.clone()),
                                None => a.writes.remove(&(e.slot, b)),
                            };
                        }
                    }
                    EntryKind::Full { crcs, alloc } => {
                        d.claim(e.slot, e.oid, e.pg, e.version, seq);
                        for (b, c) in crcs.iter().enumerate() {
                            let allocated = alloc
                                .as_ref()
                                .is_none_or(|w| w[b / 64] & (1 << (b % 64)) != 0);
                            d.set_block(e.slot, b as u32, allocated.then_some(*c));
                        }
                        // The data is already in the slot; older journaled blocks must not be
                        // written over it.
                        drop_slot(&mut a.writes, e.slot);
                        a.dirty.insert((Table::Slots, d.page_of(e.slot)));
                    }
                    EntryKind::Delete => {
                        t.set(
                            e.tomb,
                            TombRec {
                                oid: e.oid,
                                pg: e.pg,
                                version: e.version,
                            },
                        );
                        a.dirty.insert((Table::Tombs, t.page_of(e.tomb)));
                    }
                    EntryKind::Purge => {}
                    EntryKind::Pg {
                        remove,
                        log_tail,
                        blob,
                    } => {
                        let rec = PgRec {
                            pg: basalt_types::PgId {
                                pool: e.oid.pool,
                                pg: e.pg,
                            },
                            log_tail: *log_tail,
                            blob: **blob,
                        };
                        p.set(e.slot, (!remove).then_some(rec));
                        a.dirty.insert((Table::Pgs, p.page_of(e.slot)));
                    }
                }
                if e.old_slot != NO_SLOT {
                    d.release(e.old_slot, seq);
                    drop_slot(&mut a.writes, e.old_slot);
                    a.dirty.insert((Table::Slots, d.page_of(e.old_slot)));
                    a.released.push(e.old_slot);
                }
                if e.old_tomb != NO_SLOT && e.old_tomb != e.tomb {
                    t.clear(e.old_tomb);
                    a.dirty.insert((Table::Tombs, t.page_of(e.old_tomb)));
                }
            }
        }
        for s in std::mem::take(&mut self.wb.orphans) {
            let seq = d.seq(s).max(a.last_seq);
            d.release(s, seq);
            drop_slot(&mut a.writes, s);
            a.dirty.insert((Table::Slots, d.page_of(s)));
            a.released.push(s);
        }
        a.touched.sort_unstable();
        a.touched.dedup();
        a
    }

    pub fn writeback_io_done(&mut self, res: std::io::Result<()>) {
        if let Err(e) = res {
            self.poison(format!("write-back failed: {e}"));
            return;
        }
        let issued = self.jr.flushes_issued;
        let Some(b) = &mut self.wb.batch else { return };
        if b.phase == Phase::Writing && self.wb.inflight > 0 {
            // (0 only for a batch with nothing to write, completed inline.)
            self.wb.inflight -= 1;
        }
        if b.pending > 0 {
            b.pending -= 1;
            if b.pending > 0 {
                return;
            }
        }
        // A flush issued after these writes completed makes them durable.
        let target = issued + 1;
        b.phase = match b.phase {
            Phase::Writing => Phase::DataFlush(target),
            Phase::Header => Phase::HeaderFlush(target),
            p => p,
        };
        self.jr.want_flush_no = self.jr.want_flush_no.max(target);
    }

    fn write_header(&mut self) {
        let Some(b) = &mut self.wb.batch else { return };
        let next = self.jr.recs.get(b.records);
        let (start_offset, start_seq, start_prev_crc) = match next {
            Some(r) => (r.pos, r.seq, r.prev_crc),
            None => (self.jr.head, self.jr.next_seq, self.jr.prev_crc),
        };
        b.phase = Phase::Header;
        b.pending = 1;
        self.jr.header_gen += 1;
        let h = JournalHeader {
            generation: self.jr.header_gen,
            start_offset,
            start_seq,
            start_prev_crc,
            tables_hash: self.wb.tables_hash,
        };
        let buf = h.encode(&self.sb.uuid);
        // Alternate copies: a torn header write leaves the previous start, which is still valid
        // because its records' space is not reused before this header is durable.
        let off = self.sb.journal_header_offset(h.generation % 2);
        self.submit(
            IoCtx::WriteBack,
            IoReq::Write {
                off,
                bufs: vec![IoBuf::Owned(buf)],
                durable: false,
            },
        );
    }

    fn finish_batch(&mut self) {
        let Some(b) = self.wb.batch.take() else {
            return;
        };
        for _ in 0..b.records {
            self.jr.recs.pop_front();
        }
        for oid in b.touched {
            if let Some(obj) = self.st.objs.get_mut(&oid) {
                obj.cache.retain(|_, c| c.seq > b.last_seq);
                if obj.base.as_ref().is_some_and(|x| x.seq <= b.last_seq) {
                    obj.base = None;
                }
            }
        }
        for s in b.released {
            self.st.alloc.written_back_free(s);
        }
        self.shared
            .writeback_batches
            .fetch_add(1, Ordering::Relaxed);
    }
}

/// Forgets block images queued for slot `s` (its object moved or went away).
fn drop_slot(writes: &mut BTreeMap<(u32, u32), SharedBuf>, s: u32) {
    let keys: Vec<(u32, u32)> = writes.range((s, 0)..(s + 1, 0)).map(|(k, _)| *k).collect();
    for k in keys {
        writes.remove(&k);
    }
}

/// Groups block writes that are contiguous on the device into vectored writes.
fn merge_runs(
    sb: &crate::layout::Superblock,
    writes: BTreeMap<(u32, u32), SharedBuf>,
) -> Vec<(u64, Vec<IoBuf>)> {
    let mut out: Vec<(u64, Vec<IoBuf>)> = Vec::new();
    let mut next_off = u64::MAX;
    for ((slot, block), buf) in writes {
        let off = sb.slot_offset(slot, block);
        match out.last_mut() {
            Some((_, bufs)) if off == next_off && bufs.len() < MAX_IOV => {
                bufs.push(IoBuf::Shared(buf))
            }
            _ => out.push((off, vec![IoBuf::Shared(buf)])),
        }
        next_off = off + BLOCK;
    }
    out
}
