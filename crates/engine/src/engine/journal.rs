//! Group commit: operations accumulate in an open batch; a batch is sealed into one journal
//! record (one vectored write at the ring head); a single flush then covers every record
//! written before it. A record written alone for a durable writer is written with `RWF_DSYNC`
//! instead, durable when its write completes (`Engine::lone`). Acks go out strictly in
//! journal order, so a crash can only lose a suffix of unacknowledged records.

use super::{Engine, IoCtx, Waiter};
use crate::buf::{IoBuf, SharedBuf};
use crate::io::IoReq;
use crate::layout::BLOCK;
use crate::record::{Entry, MAX_HEADER_BLOCKS as DECODE_MAX_HEADER_BLOCKS, RecordPlace};
use crate::record::{encode_record_header, header_blocks_for};
use basalt_types::ObjectId;
use std::collections::VecDeque;

/// Most iovecs per vectored write (IOV_MAX is 1024).
const MAX_IOV: usize = 512;
/// Records being written at once.
const MAX_WRITING: usize = 4;
/// Seal a batch early (while another record is being written) once it is this large.
const SEAL_EARLY_BYTES: u64 = 256 * 1024;
/// Flushes in flight at once.
const MAX_FLUSHES: usize = 1;
/// Header blocks a batch may grow to.
const MAX_HEADER_BLOCKS: u32 = 64;

/// Operations collected for the next record.
pub(crate) struct Batch {
    pub seq: u64,
    pub entries: Vec<Entry>,
    pub blocks: Vec<SharedBuf>,
    /// Whole-object writes: object, slot, data (written directly into the slot).
    pub fulls: Vec<(ObjectId, u32, SharedBuf)>,
    pub waiters: Vec<Waiter>,
    pub entry_bytes: usize,
}

impl Batch {
    pub fn bytes(&self) -> u64 {
        u64::from(header_blocks_for(self.entry_bytes)) * BLOCK + self.blocks.len() as u64 * BLOCK
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecState {
    Writing,
    Written,
    Flushed,
}

/// A sealed record, kept until write-back has copied its effects into the slots.
pub(crate) struct Record {
    pub seq: u64,
    pub pos: u64,
    /// Header CRC of the previous record (what this record chains to).
    pub prev_crc: u32,
    pub entries: Vec<Entry>,
    pub blocks: Vec<SharedBuf>,
    pub pending: u32,
    pub state: RecState,
    /// Number of the first flush issued after this record was written (0: none yet).
    pub cover: u64,
    /// Written durable by itself (`IoReq::Write::durable`): durable once written, no flush.
    pub durable: bool,
    pub nd_waiters: Vec<Waiter>,
    pub d_waiters: Vec<Waiter>,
}

pub(crate) struct Journal {
    pub ring: u64,
    pub head: u64,
    pub next_seq: u64,
    pub prev_crc: u32,
    pub recs: VecDeque<Record>,
    pub open: Option<Batch>,
    /// Every record with seq < written_upto is written; < flushed_upto is durable.
    pub written_upto: u64,
    pub flushed_upto: u64,
    pub writing: usize,
    pub flushes_inflight: usize,
    /// Flushes are numbered from 1 in issue order.
    pub flushes_issued: u64,
    /// Highest number of a completed flush: every write completed before it was issued is
    /// durable.
    pub flushed_no: u64,
    /// Someone (write-back, close) wants the front records durable.
    pub want_durable: bool,
    /// A flush numbered at least this is wanted regardless of records (write-back).
    pub want_flush_no: u64,
    pub durable_waiting: usize,
    pub header_gen: u64,
    pub max_record: u64,
    /// Random per opening of the store, in every record header (see `record.rs`).
    pub boot: u64,
}

impl Journal {
    /// `boot`: this run's id, stamped in every record header.
    pub fn new(ring: u64, max_record: u64, boot: u64) -> Journal {
        Journal {
            ring,
            head: 0,
            next_seq: 1,
            prev_crc: 0,
            recs: VecDeque::new(),
            open: None,
            written_upto: 1,
            flushed_upto: 1,
            writing: 0,
            flushes_inflight: 0,
            flushes_issued: 0,
            flushed_no: 0,
            want_durable: false,
            want_flush_no: 0,
            durable_waiting: 0,
            header_gen: 0,
            max_record,
            boot,
        }
    }

    /// Ring offset of the oldest live record (or the head when there is none).
    pub fn start(&self) -> u64 {
        self.recs.front().map_or(self.head, |r| r.pos)
    }

    /// Bytes of the ring in use.
    pub fn used(&self) -> u64 {
        if self.recs.is_empty() {
            return 0;
        }
        let (s, h) = (self.start(), self.head);
        if h > s { h - s } else { self.ring - s + h }
    }

    /// Where a record of `len` bytes can go, if there is room. Records never wrap: one that does
    /// not fit before the end of the ring starts at offset 0 (recovery looks there too).
    pub fn place(&self, len: u64) -> Option<u64> {
        if self.recs.is_empty() {
            return Some(if self.head + len <= self.ring {
                self.head
            } else {
                0
            });
        }
        let (s, h) = (self.start(), self.head);
        if h > s {
            if h + len <= self.ring {
                Some(h)
            } else if len <= s {
                Some(0)
            } else {
                None
            }
        } else if h + len <= s {
            Some(h)
        } else {
            None
        }
    }

    pub fn rec_mut(&mut self, seq: u64) -> Option<&mut Record> {
        let first = self.recs.front()?.seq;
        let i = seq.checked_sub(first)? as usize;
        self.recs.get_mut(i)
    }

    /// Removes every waiter (for poisoning).
    pub fn take_all_waiters(&mut self) -> Vec<Waiter> {
        let mut all = Vec::new();
        if let Some(b) = &mut self.open {
            all.append(&mut b.waiters);
        }
        for r in &mut self.recs {
            all.append(&mut r.nd_waiters);
            all.append(&mut r.d_waiters);
        }
        self.durable_waiting = 0;
        all
    }
}

impl Engine {
    /// Would an operation of up to `data_blocks` blocks and `entry_bytes` of entry fit in the
    /// open batch?
    pub fn batch_has_room(&self, entry_bytes: usize, data_blocks: usize) -> bool {
        let Some(b) = &self.jr.open else { return true };
        let hb = header_blocks_for(b.entry_bytes + entry_bytes);
        let bytes = u64::from(hb) * BLOCK + (b.blocks.len() + data_blocks) as u64 * BLOCK;
        hb <= MAX_HEADER_BLOCKS && bytes <= self.jr.max_record
    }

    fn open_batch(&mut self) -> &mut Batch {
        let seq = self.jr.next_seq;
        self.jr.open.get_or_insert_with(|| Batch {
            seq,
            entries: Vec::new(),
            blocks: Vec::new(),
            fulls: Vec::new(),
            waiters: Vec::new(),
            entry_bytes: 0,
        })
    }

    /// Adds an entry to the open batch and applies it to the live state, so later operations
    /// and reads see it at once. The waiter (if any) is answered when the record is written or
    /// flushed.
    pub fn add_entry(
        &mut self,
        entry: Entry,
        blocks: Vec<SharedBuf>,
        full: Option<(ObjectId, u32, SharedBuf)>,
        waiter: Option<Waiter>,
    ) {
        assert!(self.poisoned.is_none(), "entry added to a poisoned store");
        let seq = self.open_batch().seq;
        self.st
            .apply(seq, &entry, &blocks, full.as_ref().map(|f| f.2.clone()));
        if waiter.as_ref().is_some_and(|w| w.durable) {
            self.jr.durable_waiting += 1;
        }
        let b = self.open_batch();
        b.entry_bytes += entry.encoded_len();
        assert!(
            header_blocks_for(b.entry_bytes) <= DECODE_MAX_HEADER_BLOCKS,
            "batch header outgrew what recovery accepts"
        );
        b.entries.push(entry);
        b.blocks.extend(blocks);
        b.fulls.extend(full);
        b.waiters.extend(waiter);
    }

    /// An operation with nothing to write (flush, no-op delete): answered once everything
    /// before it is written (or durable, for a durable waiter).
    pub fn add_barrier(&mut self, w: Waiter) {
        if w.durable {
            self.jr.durable_waiting += 1;
        }
        if let Some(b) = &mut self.jr.open {
            b.waiters.push(w);
            return;
        }
        let (wu, fu) = (self.jr.written_upto, self.jr.flushed_upto);
        match self.jr.recs.back_mut() {
            Some(r) if (w.durable && r.seq >= fu) || (!w.durable && r.seq >= wu) => {
                if w.durable {
                    r.d_waiters.push(w)
                } else {
                    r.nd_waiters.push(w)
                }
            }
            _ => {
                if w.durable {
                    self.jr.durable_waiting = dec(self.jr.durable_waiting, 1, "durable waiters");
                }
                w.reply.ok(w.version);
            }
        }
    }

    /// Seals the open batch into a record when the journal pipeline has room. Returns whether
    /// it sealed one.
    pub fn maybe_seal(&mut self) -> bool {
        let Some(b) = &self.jr.open else { return false };
        if self.poisoned.is_some() || self.jr.writing >= MAX_WRITING {
            return false;
        }
        if self.jr.writing > 0 && b.bytes() < SEAL_EARLY_BYTES && self.waiting.is_empty() {
            return false;
        }
        if b.entries.is_empty() {
            // Only barriers: attach them to the last record (or answer them).
            let b = self.jr.open.take().expect("checked");
            for w in b.waiters {
                if w.durable {
                    self.jr.durable_waiting = dec(self.jr.durable_waiting, 1, "durable waiters");
                }
                self.add_barrier(w);
            }
            return true;
        }
        let Some(pos) = self.jr.place(b.bytes()) else {
            return false;
        };
        let b = self.jr.open.take().expect("checked");
        self.seal(b, pos);
        true
    }

    fn seal(&mut self, b: Batch, pos: u64) {
        assert_eq!(b.seq, self.jr.next_seq, "records are sealed in sequence");
        let place = RecordPlace {
            seq: b.seq,
            durable_seq: self.jr.flushed_upto.saturating_sub(1),
            prev_crc: self.jr.prev_crc,
            boot: self.jr.boot,
        };
        let (header, crc) = encode_record_header(&self.sb.uuid, place, &b.entries);
        let len = header.len() as u64 + b.blocks.len() as u64 * BLOCK;
        let mut bufs: Vec<IoBuf> = Vec::with_capacity(1 + b.blocks.len());
        bufs.push(IoBuf::Owned(header));
        bufs.extend(b.blocks.iter().cloned().map(IoBuf::Shared));
        self.shared
            .journal_records
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let durable = self.lone(&b, bufs.len());
        if durable {
            self.shared
                .durable_records
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let mut pending = 0;
        let mut off = self.sb.ring_offset() + pos;
        let mut rest = bufs;
        while !rest.is_empty() {
            let tail = rest.split_off(rest.len().min(MAX_IOV));
            let chunk_len: u64 = rest.iter().map(|x| x.len() as u64).sum();
            self.submit(
                IoCtx::Record { seq: b.seq },
                IoReq::Write {
                    off,
                    bufs: rest,
                    durable,
                },
            );
            off += chunk_len;
            pending += 1;
            rest = tail;
        }
        for (oid, slot, data) in b.fulls {
            let off = self.sb.slot_offset(slot, 0);
            self.submit(
                IoCtx::FullData {
                    seq: b.seq,
                    oid,
                    slot,
                },
                IoReq::Write {
                    off,
                    bufs: vec![IoBuf::Shared(data)],
                    durable: false,
                },
            );
            pending += 1;
        }
        let (mut nd, mut d) = (Vec::new(), Vec::new());
        for w in b.waiters {
            if w.durable { d.push(w) } else { nd.push(w) }
        }
        self.jr.recs.push_back(Record {
            seq: b.seq,
            pos,
            prev_crc: self.jr.prev_crc,
            entries: b.entries,
            blocks: b.blocks,
            pending,
            state: RecState::Writing,
            cover: 0,
            durable,
            nd_waiters: nd,
            d_waiters: d,
        });
        self.jr.head = pos + len;
        self.jr.next_seq = b.seq + 1;
        self.jr.prev_crc = crc;
        self.jr.writing += 1;
    }

    /// Whether batch `b`, sealed into a record of `bufs` buffers, is written durable by itself
    /// (`RWF_DSYNC`): one device request where a write, a wake-up and a flush were (a
    /// client's lone durable write). Only when it is alone: nothing else is being written and
    /// every earlier record is durable (so acks stay in journal order without a flush), it
    /// carries no whole-object data (written apart, which its durability would not cover),
    /// and it is one write. Any other record waits for a flush, as before (group commit).
    fn lone(&self, b: &Batch, bufs: usize) -> bool {
        self.jr.writing == 0
            && self.jr.flushed_upto == b.seq
            && b.fulls.is_empty()
            && b.waiters.iter().any(|w| w.durable)
            && bufs <= MAX_IOV
    }

    /// The data of the whole-object write of record `seq` into `slot` reached the device:
    /// reads may now go there. A record may hold two whole-object writes to one object (in
    /// different slots: a released slot is not reused before the slot table says it is free),
    /// so the slot must match too, or the first one's completion would drop the in-memory copy
    /// of the second while its data is still in flight.
    pub fn full_data_done(&mut self, seq: u64, oid: ObjectId, slot: u32) {
        if let Some(obj) = self.st.objs.get_mut(&oid)
            && obj.slot == slot
            && let Some(base) = &mut obj.base
            && base.seq == seq
        {
            base.inflight = None;
        }
    }

    pub fn record_io_done(&mut self, seq: u64, res: std::io::Result<()>) {
        if let Err(e) = res {
            self.poison(format!("journal write failed: {e}"));
        }
        let Some(r) = self.jr.rec_mut(seq) else {
            return;
        };
        r.pending = dec(r.pending, 1, "record writes");
        if r.pending > 0 || r.state != RecState::Writing {
            return;
        }
        // A failed write poisoned the store (above): its record never counts as durable.
        r.state = if r.durable && self.poisoned.is_none() {
            RecState::Flushed
        } else {
            RecState::Written
        };
        self.jr.writing = dec(self.jr.writing, 1, "records being written");
        if self.poisoned.is_none() {
            self.advance_acks();
        }
    }

    /// Index in `recs` of the first record not yet known durable.
    fn first_unflushed(&self) -> usize {
        let first = self.jr.recs.front().map_or(0, |r| r.seq);
        (self.jr.flushed_upto.saturating_sub(first) as usize).min(self.jr.recs.len())
    }

    /// Issues a flush when it would make a waiting record durable, or write-back wants one.
    /// Up to `MAX_FLUSHES` flushes may be in flight: records written while one is in flight
    /// need not wait for it to finish before their own flush starts.
    pub fn maybe_flush(&mut self) {
        if self.jr.flushes_inflight >= MAX_FLUSHES || self.poisoned.is_some() {
            return;
        }
        // The oldest record no flush covers yet must be written, or a flush now would not move
        // the durable prefix. Group commit: while another record is still being written, wait
        // for it so that one flush covers both, unless two records are already waiting.
        let skip = self.first_unflushed();
        let mut uncovered = self
            .jr
            .recs
            .range(skip..)
            .filter(|r| r.cover == 0)
            .peekable();
        let front_written = uncovered
            .peek()
            .is_some_and(|r| r.state == RecState::Written);
        let uncovered_written = uncovered.filter(|r| r.state == RecState::Written).count();
        let front_ready = front_written && (self.jr.writing == 0 || uncovered_written >= 2);
        let for_records =
            front_ready && (self.jr.durable_waiting > 0 || self.jr.want_durable || self.closing);
        let for_wb = self.jr.flushes_issued < self.jr.want_flush_no;
        if !for_records && !for_wb {
            return;
        }
        let no = self.jr.flushes_issued + 1;
        self.jr.flushes_issued = no;
        for r in self.jr.recs.range_mut(skip..) {
            if r.state == RecState::Written && r.cover == 0 {
                r.cover = no;
            }
        }
        self.jr.flushes_inflight += 1;
        self.shared
            .flushes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.submit(IoCtx::Flush { no }, IoReq::Flush);
    }

    /// Flush number `no` completed: every write completed before it was issued is durable,
    /// whatever became of flushes issued earlier.
    pub fn flush_done(&mut self, no: u64, res: std::io::Result<()>) {
        self.jr.flushes_inflight = dec(self.jr.flushes_inflight, 1, "flushes in flight");
        if let Err(e) = res {
            self.poison(format!("flush failed: {e}"));
            return;
        }
        self.jr.flushed_no = self.jr.flushed_no.max(no);
        let skip = self.first_unflushed();
        for r in self.jr.recs.range_mut(skip..) {
            if r.cover != 0 && r.cover <= no {
                r.state = RecState::Flushed;
            }
        }
        self.advance_acks();
    }

    /// Moves the written and flushed prefixes forward and answers their waiters, in order.
    pub fn advance_acks(&mut self) {
        loop {
            let wu = self.jr.written_upto;
            let Some(r) = self.jr.rec_mut(wu) else { break };
            if r.state == RecState::Writing {
                break;
            }
            let ws = std::mem::take(&mut r.nd_waiters);
            self.jr.written_upto += 1;
            for w in ws {
                w.reply.ok(w.version);
            }
        }
        loop {
            let fu = self.jr.flushed_upto;
            let Some(r) = self.jr.rec_mut(fu) else { break };
            if r.state != RecState::Flushed {
                break;
            }
            let ws = std::mem::take(&mut r.d_waiters);
            self.jr.flushed_upto += 1;
            assert!(
                self.jr.flushed_upto <= self.jr.written_upto,
                "a record is durable before it is written"
            );
            self.jr.durable_waiting = dec(self.jr.durable_waiting, ws.len(), "durable waiters");
            for w in ws {
                w.reply.ok(w.version);
            }
        }
        if self.jr.recs.is_empty() || self.jr.rec_mut(self.jr.flushed_upto).is_none() {
            // Everything is durable: nobody can be waiting.
            self.jr.want_durable = false;
        }
    }
}

/// `n - k` for counters that must never go below zero: an accounting bug stops the store
/// instead of wrapping around (release builds included).
pub(crate) fn dec<T>(n: T, k: T, what: &str) -> T
where
    T: std::ops::Sub<Output = T> + PartialOrd + Copy + std::fmt::Display,
{
    assert!(n >= k, "{what}: {n} - {k} would go below zero");
    n - k
}
