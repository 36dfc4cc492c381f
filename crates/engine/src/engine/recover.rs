//! Opening a store: find the superblock (repairing one damaged copy from the other), choose the
//! I/O backend, load the tables, replay the journal.
//!
//! Replay stops at the first record that is not entirely on disk: wrong sequence number, broken
//! chain (previous-record CRC), bad header CRC, a data block whose CRC does not match, or (for
//! records newer than any record known durable) a whole-object write whose data in its slot
//! does not match. Acks are given in journal order, so everything after that point was never
//! acknowledged as durable — unless a later record of the same run proves the broken one had
//! been flushed (its `durable_seq` covers it): then the break is media damage, not a torn tail,
//! and the store refuses to open rather than silently drop acknowledged writes.

use super::journal::{Journal, RecState, Record};
use super::state::{Obj, PgIndex, State};
use super::writeback::WriteBack;
use super::{Config, Engine, Msg, Shared, Slab};
use crate::alloc::{FreeBits, SlotAlloc};
use crate::buf::{AlignedBuf, SharedBuf};
use crate::clock::Clock;
use crate::crc::crc32c;
use crate::error::EngineError;
use crate::hash::FxHashMap;
use crate::io::Backend;
use crate::io::file::Dev;
use crate::io::psync::PsyncBackend;
use crate::io::sim::{SimBackend, SimDisk};
use crate::io::uring::{self, UringBackend};
use crate::layout::{BLOCK, NO_SLOT, Superblock, TableGeom, max_single_record};
use crate::meta::SlotTable;
use crate::pgtable::PgTable;
use crate::record::{
    Bounds, EntryKind, JournalHeader, PEEKED_BYTES, RecordHeader, decode_record_header, peek_record,
};
use crate::tombs::TombTable;
use crate::{IoMode, OpenOptions, ReplayCut, StoreInfo};
use basalt_types::{ObjectId, PoolId, Version};
use crossbeam_channel::Receiver;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

const B: usize = BLOCK as usize;
/// How far past a broken record recovery looks for a later record that proves it was durable.
const SALVAGE_WINDOW: u64 = 64 << 20;

/// A record found valid in the journal, with its data blocks.
struct Found {
    hdr: RecordHeader,
    pos: u64,
    blocks: Vec<SharedBuf>,
}

/// What the two superblock copies of a device say.
pub(crate) struct Superblocks {
    pub sb: Superblock,
    /// The first copy is valid (else it must be rewritten from the backup).
    pub primary_ok: bool,
    /// The backup copy is valid (else it must be rewritten from the first).
    pub backup_ok: bool,
}

/// Reads both superblock copies. A store whose first block was damaged is found by its backup
/// and never reads as "not formatted"; a block with the magic but no valid copy is `Corrupt`.
pub(crate) fn read_superblocks(dev: &Dev, path: &Path) -> Result<Superblocks, EngineError> {
    let size = dev.size()?;
    if size < BLOCK {
        return Err(EngineError::NotFormatted(path.to_path_buf()));
    }
    let mut first = AlignedBuf::zeroed(B);
    dev.read_at(0, &mut first)?;
    let mut last = AlignedBuf::zeroed(B);
    dev.read_at(size / BLOCK * BLOCK - BLOCK, &mut last)?;
    let primary = Superblock::decode(&first);
    let backup = Superblock::decode(&last);
    match (primary, backup) {
        (Ok(Some(sb)), Ok(Some(b))) if b.uuid == sb.uuid && b.device_size == sb.device_size => {
            Ok(Superblocks {
                sb,
                primary_ok: true,
                backup_ok: true,
            })
        }
        (Ok(Some(sb)), _) => Ok(Superblocks {
            // The backup lives at the end of the device as formatted; check it there.
            backup_ok: backup_at(dev, &sb)?,
            sb,
            primary_ok: true,
        }),
        (Err(e @ EngineError::UnsupportedFormat { .. }), _) => Err(e),
        (_, Ok(Some(sb))) => {
            tracing::warn!(
                path = %path.display(),
                "the first superblock is damaged; using the backup copy at the end of the device"
            );
            Ok(Superblocks {
                sb,
                primary_ok: false,
                backup_ok: true,
            })
        }
        (Ok(None), Ok(None)) => Err(EngineError::NotFormatted(path.to_path_buf())),
        (Err(e), _) | (_, Err(e)) => Err(EngineError::Corrupt(format!(
            "{} holds a damaged Basalt store: no valid superblock copy ({e}); it cannot be \
             opened (and is never formatted without force)",
            path.display()
        ))),
    }
}

/// Whether the backup copy at the end of `sb`'s device is valid and matches.
fn backup_at(dev: &Dev, sb: &Superblock) -> Result<bool, EngineError> {
    if dev.size()? < sb.device_size {
        return Ok(false);
    }
    let mut buf = AlignedBuf::zeroed(B);
    dev.read_at(sb.backup_offset(), &mut buf)?;
    Ok(matches!(Superblock::decode(&buf), Ok(Some(b)) if b == *sb))
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
        IoMode::Uring => Box::new(UringBackend::new(file, clock)?),
        _ => Box::new(PsyncBackend::new(file, opts.psync_threads, clock)?),
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
        let sbs = read_superblocks(&dev, path)?;
        let sb = sbs.sb.clone();
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
            replay_cut: None,
        };
        let waker = be.waker();
        let max_record = (sb.ring_size() / 4)
            .min(8 << 20)
            .max(max_single_record(sb.object_size));
        let mut engine = Engine {
            jr: Journal::new(sb.ring_size(), max_record, dev.random_u64()),
            st: State {
                objs: FxHashMap::default(),
                pgs: BTreeMap::new(),
                d: SlotTable::new(&sb),
                t: TombTable::new(&sb),
                p: PgTable::new(&sb),
                alloc: SlotAlloc::new(sb.slot_count as u32),
                tomb_alloc: FreeBits::all_free(sb.tombs.capacity()),
                pg_alloc: FreeBits::all_free(sb.pgs.capacity()),
                replaying: false,
            },
            sb,
            info,
            be,
            waker,
            rx,
            shared: Arc::new(Shared {
                io_age: super::inflight::IoAge::new(clock),
                ..Shared::default()
            }),
            cfg: Config {
                writeback_idle: opts.writeback_idle,
            },
            wb: WriteBack::default(),
            ios: super::inflight::InFlight::new(),
            reads: Slab::new(),
            blocked: FxHashMap::default(),
            held_reads: FxHashMap::default(),
            waiting: VecDeque::new(),
            poisoned: None,
            closing: false,
            close_replies: Vec::new(),
            last_write: clock.now(),
            clock,
            bad_seen: Default::default(),
            unrecorded: Default::default(),
            settle: Default::default(),
        };
        engine.recover(&dev)?;
        repair_superblocks(&dev, &sbs)?;
        engine.publish_gauges();
        Ok(engine)
    }

    fn recover(&mut self, dev: &Dev) -> Result<(), EngineError> {
        let jh = read_journal_header(dev, &self.sb)?;
        let interrupted = self.load_tables(dev, &jh)?;
        let bounds = self.bounds();
        let (mut found, broke_at) = scan_journal(dev, &self.sb, &jh, bounds)?;
        let mut cut = None;
        if let Some((pos, seq)) = broke_at {
            check_not_durable(dev, &self.sb, bounds, pos, seq)?;
            let prev = found.last().map_or(jh.start_prev_crc, |f| f.hdr.crc);
            cut = torn_record(dev, &self.sb, bounds, pos, seq, prev)?;
        }
        if let Some(dropped) = self.verify_tail(dev, &mut found)? {
            cut = Some(ReplayCut {
                seq: dropped.seq,
                pgs: cut.map_or(dropped.pgs.clone(), |c| {
                    c.pgs
                        .zip(dropped.pgs)
                        .map(|(a, b)| a.union(&b).copied().collect())
                }),
            });
        }
        if let Some(c) = &cut {
            tracing::warn!(
                device = %self.sb.device_id, seq = c.seq, pgs = ?c.pgs,
                "journal replay dropped records as a torn tail (writes that never completed, or damage to the newest records)"
            );
        }
        self.info.replay_cut = cut;
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
        self.rebuild_allocators(&found);
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
        self.wb.tables_hash = jh.tables_hash;
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
                durable: false,
                nd_waiters: Vec::new(),
                d_waiters: Vec::new(),
            });
        }
        self.erase_stale_records(dev)?;
        erase_interrupted_pages(dev, &interrupted)?;
        // What we replayed may still sit in a volatile cache (a process crash, not a power
        // loss): make it durable before anything new is acknowledged on top of it.
        dev.sync()?;
        Ok(())
    }

    fn bounds(&self) -> Bounds {
        bounds_of(&self.sb)
    }

    /// Loads the slot, tombstone and PG tables as of journal header `jh`, and checks that no
    /// page fell back to an older copy than the header expects (see `pages.rs`).
    /// Returns the copies an interrupted batch wrote, to erase. Only the batch right after the
    /// header can have been interrupted (a batch starts once the previous header is durable):
    /// a copy of a later batch proves a newer header was durable and is gone (`Corrupt`).
    fn load_tables(
        &mut self,
        dev: &Dev,
        jh: &JournalHeader,
    ) -> Result<Vec<Interrupted>, EngineError> {
        let (uuid, g) = (self.sb.uuid, jh.generation);
        let st = &mut self.st;
        let mut erase = Vec::new();
        let e = &mut erase;
        load_pages(dev, &self.sb.slots, e, |p, c| {
            st.d.load_page(p, c, &uuid, g)
        })?;
        load_pages(dev, &self.sb.tombs, e, |p, c| {
            st.t.load_page(p, c, &uuid, g)
        })?;
        load_pages(dev, &self.sb.pgs, e, |p, c| st.p.load_page(p, c, &uuid, g))?;
        let hash = st.d.gens.hash() ^ st.t.gens.hash() ^ st.p.gens.hash();
        if hash != jh.tables_hash {
            return Err(EngineError::Corrupt(format!(
                "a table page is damaged or lost (tables hash {hash:#018x}, the journal header \
                 expects {:#018x}): the newest copy of a page written back earlier no longer \
                 reads back; refusing to serve older state",
                jh.tables_hash
            )));
        }
        if let Some(c) = erase.iter().find(|c| c.batch > g + 1) {
            return Err(EngineError::Corrupt(format!(
                "a table page copy written by write-back batch {} is newer than the journal \
                 header's next batch ({}): a newer journal header was lost; refusing to serve \
                 older state",
                c.batch,
                g + 1
            )));
        }
        Ok(erase)
    }

    /// Records newer than the newest durable claim may have lost the data of their
    /// whole-object writes; check it and cut the journal at the first record that did.
    /// Blocks rewritten by a later entry of a kept record (a later record, or a later entry of
    /// the same record) are excused: write-back may already have written that later content in
    /// place, and replay takes it from the journal anyway. A cut can remove the records that
    /// excused blocks of earlier ones, so the check is repeated on what is kept until no
    /// record is cut.
    /// Returns what it cut.
    fn verify_tail(
        &self,
        dev: &Dev,
        found: &mut Vec<Found>,
    ) -> Result<Option<ReplayCut>, EngineError> {
        let missing = self.missing_blocks(dev, found)?;
        let mut keep = found.len();
        while let Some(i) = first_unexcused(&found[..keep], &missing) {
            keep = i;
        }
        if keep == found.len() {
            return Ok(None);
        }
        tracing::info!(
            "journal replay stops at record {}: its object data is not on disk",
            found[keep].hdr.seq
        );
        let cut = ReplayCut {
            seq: found[keep].hdr.seq,
            pgs: Some(found[keep..].iter().flat_map(|f| pgs_of(&f.hdr)).collect()),
        };
        found.truncate(keep);
        Ok(Some(cut))
    }

    /// For each whole-object write of a record newer than the newest durable claim (keyed by
    /// record and entry index), the allocated blocks whose data in the slot does not match.
    fn missing_blocks(&self, dev: &Dev, found: &[Found]) -> Result<Missing, EngineError> {
        let durable = found.iter().map(|f| f.hdr.durable_seq).max().unwrap_or(0);
        let mut missing = Missing::new();
        let mut buf = AlignedBuf::zeroed(self.sb.object_size as usize);
        for (i, f) in found.iter().enumerate() {
            if f.hdr.seq <= durable {
                continue;
            }
            for (j, e) in f.hdr.entries.iter().enumerate() {
                let EntryKind::Full { crcs, alloc } = &e.kind else {
                    continue;
                };
                dev.read_at(self.sb.slot_offset(e.slot, 0), &mut buf)?;
                let bad: Vec<u16> = buf
                    .chunks(B)
                    .zip(crcs.iter())
                    .enumerate()
                    .filter(|(b, (blk, c))| {
                        let allocated = alloc
                            .as_ref()
                            .is_none_or(|w| w[b / 64] & (1 << (b % 64)) != 0);
                        allocated && crc32c(blk) != **c
                    })
                    .map(|(b, _)| b as u16)
                    .collect();
                if !bad.is_empty() {
                    missing.insert((i, j), bad);
                }
            }
        }
        Ok(missing)
    }

    /// The live index from the table images: objects from the slot table (newest claim of each
    /// object wins), tombstones, PG records.
    fn build_index(&mut self) {
        let mut live: FxHashMap<ObjectId, Obj> = FxHashMap::default();
        let d = &self.st.d;
        for s in 0..d.slots() {
            if !d.is_used(s) {
                continue;
            }
            let oid = d.owner(s);
            if let Some(o) = live.get(&oid)
                && d.seq(o.slot) >= d.seq(s)
            {
                continue;
            }
            let mut obj = Obj::live(d.pg(s), s);
            obj.version = d.version(s);
            live.insert(oid, obj);
        }
        let tombs: Vec<(u32, crate::tombs::TombRec)> =
            self.st.t.iter().map(|(i, r)| (i, *r)).collect();
        for (i, r) in tombs {
            match live.get(&r.oid) {
                Some(o) if o.version >= r.version => {
                    tracing::warn!(oid = %r.oid, "tombstone older than the live object; ignored");
                    continue;
                }
                Some(_) => tracing::warn!(oid = %r.oid, "live object older than its tombstone"),
                None => {}
            }
            let mut obj = Obj::live(r.pg, NO_SLOT);
            obj.tomb = i;
            obj.version = r.version;
            live.insert(r.oid, obj);
        }
        for (oid, obj) in live {
            self.st.insert_loaded(oid, obj);
        }
        let records: Vec<(u32, crate::pgtable::PgRec)> =
            self.st.p.iter().map(|(i, r)| (i, *r)).collect();
        for (i, r) in records {
            let p = self.st.pgs.entry(r.pg).or_insert_with(PgIndex::new);
            p.record = i;
            p.log_tail = r.log_tail;
            p.blob = r.blob;
        }
    }

    fn rebuild_allocators(&mut self, found: &[Found]) {
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
            .flat_map(|f| f.hdr.entries.iter())
            .filter(|e| !matches!(e.kind, EntryKind::Pg { .. }))
            .flat_map(|e| [e.slot, e.old_slot])
            .filter(|&s| s != NO_SLOT)
            .collect();
        let d = &self.st.d;
        self.wb.orphans = (0..slots)
            .filter(|s| d.is_used(*s) && !claimed.contains(s) && !mentioned.contains(s))
            .collect();
        self.st.alloc = SlotAlloc::rebuild(
            slots,
            |s| claimed.contains(&s),
            |s| d.is_used(s) || mentioned.contains(&s),
        );
        let mut tombs = FreeBits::all_free(self.sb.tombs.capacity());
        for o in self.st.objs.values().filter(|o| o.tomb != NO_SLOT) {
            tombs.take_at(u64::from(o.tomb));
        }
        self.st.tomb_alloc = tombs;
        let mut pgs = FreeBits::all_free(self.sb.pgs.capacity());
        for p in self.st.pgs.values().filter(|p| p.record != NO_SLOT) {
            pgs.take_at(u64::from(p.record));
        }
        self.st.pg_alloc = pgs;
    }

    /// Overwrites what follows the replayed journal if it looks like a record we would expect
    /// next, so that a record we refused cannot be accepted by a later recovery. With ones,
    /// not zeros: a crash may land only some sectors of the erase, and zeros landing on the
    /// stale sectors of a torn record whose own sectors there are zero padding would complete
    /// it (store simulation seed 18365044038992805799); a landed sector of ones never matches
    /// a record, and none landed leaves the record as refused, erased by the next recovery.
    fn erase_stale_records(&self, dev: &Dev) -> Result<(), EngineError> {
        let mut positions = vec![self.jr.head];
        if self.jr.head != 0 {
            positions.push(0);
        }
        let mut erased = AlignedBuf::zeroed(B);
        erased.fill(0xff);
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
                dev.write_at(off, &erased)?;
            }
        }
        Ok(())
    }
}

/// Rewrites a damaged superblock copy from the good one, durably.
fn repair_superblocks(dev: &Dev, sbs: &Superblocks) -> Result<(), EngineError> {
    if sbs.primary_ok && sbs.backup_ok {
        return Ok(());
    }
    if !sbs.primary_ok {
        dev.write_at(0, &AlignedBuf::copy_from(&sbs.sb.encode(false)))?;
    }
    if !sbs.backup_ok {
        dev.write_at(
            sbs.sb.backup_offset(),
            &AlignedBuf::copy_from(&sbs.sb.encode(true)),
        )?;
    }
    dev.sync()?;
    tracing::warn!("repaired a damaged superblock copy");
    Ok(())
}

/// Blocks of whole-object writes whose data in the slot does not match, by (record index,
/// entry index) in the found records.
type Missing = HashMap<(usize, usize), Vec<u16>>;

/// The first of `kept` records holding a whole-object write with a block that is not on disk
/// and that no later entry of `kept` rewrites. Walks the entries backwards, so it is linear in
/// their number.
fn first_unexcused(kept: &[Found], missing: &Missing) -> Option<usize> {
    let mut rewritten: HashMap<u32, HashSet<u16>> = HashMap::new();
    let mut cut = None;
    for (i, f) in kept.iter().enumerate().rev() {
        for (j, e) in f.hdr.entries.iter().enumerate().rev() {
            if let EntryKind::Write(items) = &e.kind {
                let r = rewritten.entry(e.slot).or_default();
                r.extend(items.iter().map(|it| it.block));
            } else if let Some(bad) = missing.get(&(i, j)) {
                let later = rewritten.get(&e.slot);
                if bad.iter().any(|b| !later.is_some_and(|l| l.contains(b))) {
                    cut = Some(i);
                }
            }
        }
    }
    cut
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

/// Erases page copies an interrupted batch wrote (`pages::pick` says why). Made durable by
/// recovery's closing sync, before any batch can write a journal header again; a crash before
/// that leaves them as they were, still newer than the header and erased by the next recovery.
fn erase_interrupted_pages(dev: &Dev, copies: &[Interrupted]) -> Result<(), EngineError> {
    for c in copies {
        dev.write_at(c.off, &AlignedBuf::zeroed(c.len as usize))?;
    }
    if !copies.is_empty() {
        tracing::info!(
            pages = copies.len(),
            "erased table page copies of an interrupted write-back batch"
        );
    }
    Ok(())
}

/// A page copy written by a batch newer than the journal header loaded.
struct Interrupted {
    off: u64,
    len: u64,
    batch: u64,
}

/// Reads every page of a table (both copies, a few MiB at a time) into `load`; adds the copies
/// of an interrupted batch to `interrupted`.
fn load_pages(
    dev: &Dev,
    geom: &TableGeom,
    interrupted: &mut Vec<Interrupted>,
    mut load: impl FnMut(u64, [&[u8]; 2]) -> crate::pages::Loaded,
) -> Result<(), EngineError> {
    let page = u64::from(geom.page_size);
    let per_chunk = ((4u64 << 20) / (2 * page)).max(1);
    let mut p = 0;
    while p < geom.pages {
        let n = per_chunk.min(geom.pages - p);
        let mut buf = AlignedBuf::zeroed((2 * n * page) as usize);
        dev.read_at(geom.copy_offset(p, 0), &mut buf)?;
        for k in 0..n {
            let a = (2 * k * page) as usize;
            let (c0, c1) = (
                &buf[a..a + page as usize],
                &buf[a + page as usize..a + 2 * page as usize],
            );
            let loaded = load(p + k, [c0, c1]);
            for (copy, batch) in loaded.interrupted.iter().enumerate() {
                if let Some(batch) = *batch {
                    let off = geom.copy_offset(p + k, copy as u64);
                    interrupted.push(Interrupted {
                        off,
                        len: page,
                        batch,
                    });
                }
            }
        }
        p += n;
    }
    Ok(())
}

/// Follows the record chain from the journal header. Returns the valid records and, if the
/// chain ended, where the next record was expected (position, sequence number).
#[allow(clippy::type_complexity)]
fn scan_journal(
    dev: &Dev,
    sb: &Superblock,
    jh: &JournalHeader,
    bounds: Bounds,
) -> Result<(Vec<Found>, Option<(u64, u64)>), EngineError> {
    let mut found = Vec::new();
    let (mut pos, mut expect, mut prev) = (jh.start_offset, jh.start_seq, jh.start_prev_crc);
    let mut scanned = 0u64;
    loop {
        let mut rec = read_record(dev, sb, bounds, pos, expect, prev)?;
        if rec.is_none() && pos != 0 {
            rec = read_record(dev, sb, bounds, 0, expect, prev)?;
        }
        let Some(f) = rec else {
            return Ok((found, Some((pos, expect))));
        };
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
}

/// The chain broke where record `seq` was expected (at `pos`, or at 0). If a later record
/// says record `seq` had been flushed before it was written, the break is damage to durable
/// (maybe acknowledged) data, not a torn tail: refuse to open.
///
/// Any run's record counts, not only the run of the newest record found before the break
/// (there may be none: the first record after the journal's start damaged; or the damaged
/// record is the first of a later run). A record left over from an earlier run past a cut at
/// `x` (a torn tail's later records, never chained) was written while `x` was not durable, so
/// its `durable_seq` is below `x`, and every later run numbers its records from `x` on: such a
/// record never proves a later run's record durable. (Before a review of 2026-11-29 only
/// records of the run of the newest record found counted, and a damaged first record, or one
/// whose run began after the last record found, was cut silently with every later one.)
fn check_not_durable(
    dev: &Dev,
    sb: &Superblock,
    bounds: Bounds,
    pos: u64,
    seq: u64,
) -> Result<(), EngineError> {
    let ring = sb.ring_size();
    for start in [pos, 0] {
        let end = (start + SALVAGE_WINDOW).min(ring);
        let mut at = start;
        'direction: while at + BLOCK <= end {
            let n = (end - at).min(1 << 20);
            let mut chunk = AlignedBuf::zeroed(n as usize);
            dev.read_at(sb.ring_offset() + at, &mut chunk)?;
            for k in 0..(n / BLOCK) {
                let blk = &chunk[(k * BLOCK) as usize..((k + 1) * BLOCK) as usize];
                let Some((s, hb, _)) = peek_record(blk, &sb.uuid) else {
                    continue;
                };
                if s < seq {
                    // An older record: this run wrote nothing here or beyond.
                    break 'direction;
                }
                let p = at + k * BLOCK;
                if p + u64::from(hb) * BLOCK > ring {
                    continue;
                }
                let mut hdr = AlignedBuf::zeroed(hb as usize * B);
                dev.read_at(sb.ring_offset() + p, &mut hdr)?;
                if let Some(h) = decode_record_header(&hdr, &sb.uuid, bounds)
                    && h.seq > seq
                    && h.durable_seq >= seq
                {
                    return Err(EngineError::Corrupt(format!(
                        "journal record {seq} is damaged, but record {} written after it says \
                         it was durable: acknowledged writes would be lost; the store is not \
                         opened (recover it from a replica)",
                        h.seq
                    )));
                }
            }
            at += n;
        }
    }
    Ok(())
}

/// Simulation: the device offset and header of the newest record a reopen of `disk` would
/// replay; `None` when the journal holds no record.
fn newest_found(disk: &SimDisk) -> Option<(u64, RecordHeader)> {
    let dev = Dev::Sim(disk.clone());
    let sb = read_superblocks(&dev, Path::new("<sim>")).ok()?.sb;
    let jh = read_journal_header(&dev, &sb).ok()?;
    let (found, _) = scan_journal(&dev, &sb, &jh, bounds_of(&sb)).ok()?;
    let last = found.into_iter().last()?;
    Some((sb.ring_offset() + last.pos, last.hdr))
}

/// The limits a record of a store with superblock `sb` must respect.
fn bounds_of(sb: &Superblock) -> Bounds {
    Bounds {
        blocks: sb.blocks_per_object(),
        slots: sb.slot_count,
        tombs: sb.tombs.capacity(),
        pgs: sb.pgs.capacity(),
    }
}

/// Simulation (tests that damage a journal): the newest record a reopen of `disk` would replay,
/// as (object, version, device offsets of its journaled data blocks) per entry; `None` when the
/// journal holds no record, or its newest holds anything but journaled block writes.
pub fn newest_record(disk: &SimDisk) -> Option<Vec<(ObjectId, Version, Vec<u64>)>> {
    let (start, hdr) = newest_found(disk)?;
    let mut next = start + u64::from(hdr.header_blocks) * BLOCK;
    let mut out = Vec::new();
    for e in &hdr.entries {
        let EntryKind::Write(items) = &e.kind else {
            return None;
        };
        let mut blocks = Vec::new();
        for _ in items.iter().filter(|i| i.data) {
            blocks.push(next);
            next += BLOCK;
        }
        out.push((e.oid, e.version, blocks));
    }
    Some(out)
}

/// Simulation: the newest journal record, for damage to its header ([`newest_record_header`]).
#[derive(Clone, Debug)]
pub struct NewestHeader {
    /// The device range of the header past the fields a journal scan reads to find a record:
    /// damage there fails the header's checksum (the record is torn, what it held unknown).
    pub damageable: Range<u64>,
    pub entries: Vec<NewestEntry>,
}

/// One entry of [`NewestHeader`].
#[derive(Clone, Copy, Debug)]
pub struct NewestEntry {
    pub oid: ObjectId,
    pub pg: u32,
    pub version: Version,
    /// A PG record (`oid.pool` and `pg` name the PG); else a change of object `oid`.
    pub pg_record: bool,
}

/// Simulation: the newest record a reopen of `disk` would replay, for damage to its header;
/// `None` when the journal holds no record.
pub fn newest_record_header(disk: &SimDisk) -> Option<NewestHeader> {
    let (start, hdr) = newest_found(disk)?;
    let entries = hdr
        .entries
        .iter()
        .map(|e| NewestEntry {
            oid: e.oid,
            pg: e.pg,
            version: e.version,
            pg_record: matches!(e.kind, EntryKind::Pg { .. }),
        })
        .collect();
    Some(NewestHeader {
        damageable: start + PEEKED_BYTES..start + u64::from(hdr.header_blocks) * BLOCK,
        entries,
    })
}

/// The placement groups a record's entries belong to.
fn pgs_of(hdr: &RecordHeader) -> impl Iterator<Item = (PoolId, u32)> + '_ {
    hdr.entries.iter().map(|e| (e.oid.pool, e.pg))
}

/// The chain broke where record `seq` was expected (at `pos`, or at 0 after a wrap), after a
/// record whose CRC is `prev`: if a record header claiming that number is there, the record
/// was (partly) written and replay drops it, with any record written after it (whose
/// acknowledgement need not have waited for this one's flush): every PG may have lost writes
/// (`pgs: None`). `None` when no such record was begun (the clean end of the journal), also
/// when the header there is whole and links to another record than `prev`: one left over from
/// an earlier boot past an earlier cut, whose number this boot reused (every record of this
/// chain links to the one before; the boot id in each record makes an earlier boot's differ).
/// Before a review of 2026-11-29 its number alone made it a torn record, and its node marked
/// every PG of the device suspect for good.
fn torn_record(
    dev: &Dev,
    sb: &Superblock,
    bounds: Bounds,
    pos: u64,
    seq: u64,
    prev: u32,
) -> Result<Option<ReplayCut>, EngineError> {
    let ring = sb.ring_size();
    for start in [pos, 0] {
        if start + BLOCK > ring {
            continue;
        }
        let mut first = AlignedBuf::zeroed(B);
        dev.read_at(sb.ring_offset() + start, &mut first)?;
        let Some((s, hb, _)) = peek_record(&first, &sb.uuid) else {
            continue;
        };
        if s != seq {
            continue;
        }
        if start + u64::from(hb) * BLOCK <= ring {
            let mut hdr = AlignedBuf::zeroed(hb as usize * B);
            dev.read_at(sb.ring_offset() + start, &mut hdr)?;
            if decode_record_header(&hdr, &sb.uuid, bounds).is_some_and(|h| h.prev_crc != prev) {
                continue;
            }
        }
        return Ok(Some(ReplayCut { seq, pgs: None }));
    }
    Ok(None)
}

/// Reads and fully verifies the record expected at `pos`; `None` if it is not there intact.
fn read_record(
    dev: &Dev,
    sb: &Superblock,
    bounds: Bounds,
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
    let Some(hdr) = decode_record_header(&buf, &sb.uuid, bounds) else {
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
