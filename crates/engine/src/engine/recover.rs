//! Opening a store: choose the I/O backend, load the slot table, replay the journal.
//!
//! Replay stops at the first record that is not entirely on disk: wrong sequence number, broken
//! chain (previous-record CRC), bad header CRC, a data block whose CRC does not match, or (for
//! records newer than any record known durable) a whole-object write whose data in its slot
//! does not match. Acks are given in journal order, so everything after that point was never
//! acknowledged as durable.

use super::journal::{Journal, RecState, Record};
use super::state::{Allocator, Obj, State};
use super::writeback::WriteBack;
use super::{Config, Engine, Msg, Shared, Slab};
use crate::buf::{AlignedBuf, SharedBuf};
use crate::clock::Clock;
use crate::crc::crc32c;
use crate::error::EngineError;
use crate::hash::FxHashMap;
use crate::io::Backend;
use crate::io::file::Dev;
use crate::io::psync::PsyncBackend;
use crate::io::sim::SimBackend;
use crate::io::uring::{self, UringBackend};
use crate::layout::{BLOCK, NO_SLOT, Superblock, max_single_record};
use crate::meta::SlotTable;
use crate::record::{EntryKind, JournalHeader, RecordHeader, decode_record_header, peek_record};
use crate::{IoMode, OpenOptions, StoreInfo};
use crossbeam_channel::Receiver;
use std::collections::{HashSet, VecDeque};
use std::path::Path;
use std::sync::Arc;

const B: usize = BLOCK as usize;

/// A record found valid in the journal, with its data blocks.
struct Found {
    hdr: RecordHeader,
    pos: u64,
    blocks: Vec<SharedBuf>,
}

pub(crate) fn read_superblock(dev: &Dev, path: &Path) -> Result<Superblock, EngineError> {
    let mut buf = AlignedBuf::zeroed(B);
    if dev.size()? < BLOCK {
        return Err(EngineError::NotFormatted(path.to_path_buf()));
    }
    dev.read_at(0, &mut buf)?;
    Superblock::decode(&buf)?.ok_or_else(|| EngineError::NotFormatted(path.to_path_buf()))
}

fn choose_backend(
    dev: &Dev,
    opts: &OpenOptions,
    clock: Clock,
) -> Result<Box<dyn Backend>, EngineError> {
    let file = match dev {
        Dev::Sim(disk) => return Ok(Box::new(SimBackend::new(disk.clone(), clock)?)),
        Dev::File { file, .. } => file.clone(),
    };
    let mode = match opts.io {
        IoMode::Auto => match std::env::var("BASALT_IO").as_deref() {
            Ok("psync") => IoMode::Psync,
            Ok("uring") | Ok("io_uring") => IoMode::Uring,
            Ok(other) if !other.is_empty() => {
                return Err(EngineError::invalid(format!(
                    "BASALT_IO={other}: use psync or uring"
                )));
            }
            _ if uring::available() => IoMode::Uring,
            _ => IoMode::Psync,
        },
        m => m,
    };
    Ok(match mode {
        IoMode::Uring => Box::new(UringBackend::new(file)?),
        _ => Box::new(PsyncBackend::new(file, opts.psync_threads)?),
    })
}

impl Engine {
    /// Opens the device: superblock, backend, recovery. Blocking. Every time read of the
    /// engine goes to `clock`.
    pub fn open(
        dev: Dev,
        path: &Path,
        opts: &OpenOptions,
        rx: Receiver<Msg>,
        clock: Clock,
    ) -> Result<Engine, EngineError> {
        let sb = read_superblock(&dev, path)?;
        let size = dev.size()?;
        if size < sb.device_size {
            return Err(EngineError::Corrupt(format!(
                "device is {size} bytes but the store was formatted for {} bytes",
                sb.device_size
            )));
        }
        let be = choose_backend(&dev, opts, clock)?;
        let direct = matches!(dev, Dev::File { direct: true, .. });
        let info = StoreInfo {
            device_id: sb.device_id,
            uuid: sb.uuid,
            object_size: sb.object_size,
            capacity_bytes: sb.capacity_bytes(),
            device_size: sb.device_size,
            journal_size: sb.journal_size,
            format_version: crate::layout::FORMAT_VERSION,
            io_backend: be.name(),
            direct_io: direct,
        };
        let waker = be.waker();
        let max_record = (sb.ring_size() / 4)
            .min(8 << 20)
            .max(max_single_record(sb.object_size));
        let mut engine = Engine {
            jr: Journal::new(sb.ring_size(), max_record),
            st: State {
                objs: FxHashMap::default(),
                d: SlotTable::new(&sb),
                alloc: Allocator::new(sb.slot_count as u32),
                replaying: false,
            },
            sb,
            info,
            be,
            waker,
            rx,
            shared: Arc::new(Shared::default()),
            cfg: Config {
                writeback_idle: opts.writeback_idle,
            },
            wb: WriteBack::default(),
            ios: Slab::new(),
            reads: Slab::new(),
            blocked: FxHashMap::default(),
            waiting: VecDeque::new(),
            poisoned: None,
            closing: false,
            close_replies: Vec::new(),
            last_write: clock.now(),
            clock,
        };
        engine.recover(&dev)?;
        engine.publish_gauges();
        Ok(engine)
    }

    fn recover(&mut self, dev: &Dev) -> Result<(), EngineError> {
        let jh = read_journal_header(dev, &self.sb)?;
        load_slot_table(dev, &self.sb, &mut self.st.d)?;
        let mut found = scan_journal(dev, &self.sb, &jh)?;
        self.verify_tail(dev, &mut found)?;
        self.build_index();
        self.st.replaying = true;
        for f in &found {
            let mut data = f.blocks.iter();
            for e in &f.hdr.entries {
                let n = e.data_blocks();
                let blocks: Vec<SharedBuf> = data.by_ref().take(n).cloned().collect();
                self.st.apply(f.hdr.seq, e, &blocks, None);
            }
        }
        self.st.replaying = false;
        self.rebuild_allocator(&found);
        let (head, next_seq, prev_crc) = match found.last() {
            Some(f) => (f.pos + f.hdr.len(), f.hdr.seq + 1, f.hdr.crc),
            None => (jh.start_offset, jh.start_seq, jh.start_prev_crc),
        };
        self.jr.head = head.min(self.sb.ring_size());
        self.jr.next_seq = next_seq;
        self.jr.prev_crc = prev_crc;
        self.jr.written_upto = next_seq;
        self.jr.flushed_upto = next_seq;
        self.jr.header_gen = jh.generation;
        for f in found {
            self.jr.recs.push_back(Record {
                seq: f.hdr.seq,
                pos: f.pos,
                prev_crc: f.hdr.prev_crc,
                entries: f.hdr.entries,
                blocks: f.blocks,
                pending: 0,
                state: RecState::Flushed,
                cover: 0,
                nd_waiters: Vec::new(),
                d_waiters: Vec::new(),
            });
        }
        self.erase_stale_records(dev)?;
        // What we replayed may still sit in a volatile cache (a process crash, not a power
        // loss): make it durable before anything new is acknowledged on top of it.
        dev.sync()?;
        Ok(())
    }

    /// Records newer than the newest durable claim may have lost the data of their
    /// whole-object writes; check it and cut the journal at the first record that did.
    /// Blocks rewritten by a later record are not checked: write-back may already have written
    /// that later content in place, and replay takes it from the journal anyway.
    fn verify_tail(&self, dev: &Dev, found: &mut Vec<Found>) -> Result<(), EngineError> {
        let durable = found.iter().map(|f| f.hdr.durable_seq).max().unwrap_or(0);
        let mut cut = None;
        'records: for (i, f) in found.iter().enumerate() {
            if f.hdr.seq <= durable {
                continue;
            }
            for e in &f.hdr.entries {
                let EntryKind::Full(crcs) = &e.kind else {
                    continue;
                };
                let rewritten: HashSet<u16> = found[i + 1..]
                    .iter()
                    .flat_map(|g| g.hdr.entries.iter())
                    .filter(|g| g.slot == e.slot)
                    .flat_map(|g| match &g.kind {
                        EntryKind::Write(items) => {
                            items.iter().map(|it| it.block).collect::<Vec<_>>()
                        }
                        _ => Vec::new(),
                    })
                    .collect();
                let mut buf = AlignedBuf::zeroed(self.sb.object_size as usize);
                dev.read_at(self.sb.slot_offset(e.slot, 0), &mut buf)?;
                let bad = buf
                    .chunks(B)
                    .zip(crcs.iter())
                    .enumerate()
                    .any(|(b, (blk, c))| !rewritten.contains(&(b as u16)) && crc32c(blk) != *c);
                if bad {
                    cut = Some(i);
                    break 'records;
                }
            }
        }
        if let Some(i) = cut {
            tracing::info!(
                "journal replay stops at record {}: its object data is not on disk",
                found[i].hdr.seq
            );
            found.truncate(i);
        }
        Ok(())
    }

    /// The live index from the slot table: newest claim of each object wins.
    fn build_index(&mut self) {
        let d = &self.st.d;
        for s in 0..d.slots() {
            if !d.is_used(s) {
                continue;
            }
            let oid = d.owner(s);
            if let Some(o) = self.st.objs.get(&oid)
                && d.seq(o.slot) >= d.seq(s)
            {
                continue;
            }
            self.st.objs.insert(
                oid,
                Obj {
                    version: d.version(s),
                    slot: s,
                    ..Obj::default()
                },
            );
        }
    }

    fn rebuild_allocator(&mut self, found: &[Found]) {
        let slots = self.sb.slot_count as u32;
        let claimed: HashSet<u32> = self
            .st
            .objs
            .values()
            .map(|o| o.slot)
            .filter(|&s| s != NO_SLOT)
            .collect();
        let mentioned: HashSet<u32> = found
            .iter()
            .flat_map(|f| f.hdr.entries.iter().flat_map(|e| [e.slot, e.old_slot]))
            .filter(|&s| s != NO_SLOT)
            .collect();
        let d = &self.st.d;
        self.wb.orphans = (0..slots)
            .filter(|s| d.is_used(*s) && !claimed.contains(s) && !mentioned.contains(s))
            .collect();
        self.st.alloc = Allocator::rebuild(
            slots,
            |s| claimed.contains(&s),
            |s| d.is_used(s) || mentioned.contains(&s),
        );
    }

    /// Overwrites what follows the replayed journal if it looks like a record we would expect
    /// next, so that a record we refused cannot be accepted by a later recovery.
    fn erase_stale_records(&self, dev: &Dev) -> Result<(), EngineError> {
        let mut positions = vec![self.jr.head];
        if self.jr.head != 0 {
            positions.push(0);
        }
        let mut buf = AlignedBuf::zeroed(B);
        for pos in positions {
            if pos + BLOCK > self.sb.ring_size() {
                continue;
            }
            let off = self.sb.ring_offset() + pos;
            dev.read_at(off, &mut buf)?;
            if let Some((seq, _, _)) = peek_record(&buf, &self.sb.uuid)
                && seq >= self.jr.next_seq
            {
                dev.write_at(off, &AlignedBuf::zeroed(B))?;
            }
        }
        Ok(())
    }
}

fn read_journal_header(dev: &Dev, sb: &Superblock) -> Result<JournalHeader, EngineError> {
    let mut best: Option<JournalHeader> = None;
    let mut buf = AlignedBuf::zeroed(B);
    for copy in 0..2 {
        dev.read_at(sb.journal_header_offset(copy), &mut buf)?;
        if let Some(h) = JournalHeader::decode(&buf, &sb.uuid)
            && best.is_none_or(|b| h.generation > b.generation)
        {
            best = Some(h);
        }
    }
    let h = best.ok_or_else(|| {
        EngineError::Corrupt("no valid journal header; the store cannot be recovered".into())
    })?;
    if h.start_offset % BLOCK != 0 || h.start_offset > sb.ring_size() {
        return Err(EngineError::Corrupt(format!(
            "journal header start {} is outside the ring",
            h.start_offset
        )));
    }
    Ok(h)
}

fn load_slot_table(dev: &Dev, sb: &Superblock, d: &mut SlotTable) -> Result<(), EngineError> {
    let page = u64::from(sb.meta_page_size);
    let per_chunk = ((4u64 << 20) / (2 * page)).max(1);
    let mut p = 0;
    while p < sb.meta_pages {
        let n = per_chunk.min(sb.meta_pages - p);
        let mut buf = AlignedBuf::zeroed((2 * n * page) as usize);
        dev.read_at(sb.meta_copy_offset(p, 0), &mut buf)?;
        for k in 0..n {
            let a = (2 * k * page) as usize;
            let (c0, c1) = (
                &buf[a..a + page as usize],
                &buf[a + page as usize..a + 2 * page as usize],
            );
            d.load_page(p + k, [c0, c1], &sb.uuid)?;
        }
        p += n;
    }
    Ok(())
}

fn scan_journal(dev: &Dev, sb: &Superblock, jh: &JournalHeader) -> Result<Vec<Found>, EngineError> {
    let mut found = Vec::new();
    let (mut pos, mut expect, mut prev) = (jh.start_offset, jh.start_seq, jh.start_prev_crc);
    let mut scanned = 0u64;
    loop {
        let mut rec = read_record(dev, sb, pos, expect, prev)?;
        if rec.is_none() && pos != 0 {
            rec = read_record(dev, sb, 0, expect, prev)?;
        }
        let Some(f) = rec else { break };
        pos = f.pos + f.hdr.len();
        expect += 1;
        prev = f.hdr.crc;
        scanned += f.hdr.len();
        found.push(f);
        if scanned > sb.ring_size() {
            return Err(EngineError::Corrupt(
                "journal scan ran past the ring size".into(),
            ));
        }
    }
    Ok(found)
}

/// Reads and fully verifies the record expected at `pos`; `None` if it is not there intact.
fn read_record(
    dev: &Dev,
    sb: &Superblock,
    pos: u64,
    expect: u64,
    prev: u32,
) -> Result<Option<Found>, EngineError> {
    let ring = sb.ring_size();
    if pos + BLOCK > ring {
        return Ok(None);
    }
    let mut first = AlignedBuf::zeroed(B);
    dev.read_at(sb.ring_offset() + pos, &mut first)?;
    let Some((seq, hb, db)) = peek_record(&first, &sb.uuid) else {
        return Ok(None);
    };
    let len = u64::from(hb) + u64::from(db);
    if seq != expect || pos + len * BLOCK > ring {
        return Ok(None);
    }
    let mut buf = AlignedBuf::zeroed((len * BLOCK) as usize);
    dev.read_at(sb.ring_offset() + pos, &mut buf)?;
    let Some(hdr) = decode_record_header(&buf, &sb.uuid, sb.blocks_per_object(), sb.slot_count)
    else {
        return Ok(None);
    };
    if hdr.prev_crc != prev {
        return Ok(None);
    }
    let crcs = hdr.entries.iter().flat_map(|e| match &e.kind {
        EntryKind::Write(items) => items
            .iter()
            .filter(|i| i.data)
            .map(|i| i.crc)
            .collect::<Vec<_>>(),
        _ => Vec::new(),
    });
    let mut blocks = Vec::with_capacity(db as usize);
    for (k, crc) in crcs.enumerate() {
        let at = (hb as usize + k) * B;
        let blk = &buf[at..at + B];
        if crc32c(blk) != crc {
            return Ok(None);
        }
        blocks.push(SharedBuf::new(AlignedBuf::copy_from(blk)));
    }
    Ok(Some(Found { hdr, pos, blocks }))
}
