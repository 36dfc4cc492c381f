//! The store's I/O thread: owns the device backend, the index, the journal and write-back.
//! No locks: every piece of state below is touched only by this thread.
//!
//! The loop (`run.rs`): take messages from the handle, apply them (`write.rs`, `read.rs`),
//! decide what to seal, flush or write back (`journal.rs`, `writeback.rs`), hand requests to
//! the backend, handle completions, and sleep when nothing is left to do.

mod inflight;
mod journal;
mod query;
mod read;
mod recover;
pub(crate) use recover::read_superblocks;
pub use recover::{NewestEntry, NewestHeader, newest_record, newest_record_header};
mod run;
mod settle;
mod state;
mod unrecorded;
mod write;
mod writeback;

use crate::buf::AlignedBuf;
use crate::clock::Clock;
use crate::error::EngineError;
use crate::hash::FxHashMap;
use crate::io::{Backend, IoDone, IoReq, Waker};
use crate::layout::{PG_BLOB, Superblock};
use crate::{LogEntry, ObjectImage, ObjectInfo, PgInfo, StoreInfo, Version};
use basalt_types::{ObjectId, PgId, PoolId, VolumeId};
use bytes::Bytes;
use crossbeam_channel::Receiver;
use journal::Journal;
use read::ReadCtx;
use state::State;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use writeback::WriteBack;

/// Counters shared with the handles (relaxed atomics; read by `Store::stats`).
#[derive(Default)]
pub(crate) struct Shared {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub flushes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub device_bytes_written: AtomicU64,
    pub checksum_errors: AtomicU64,
    /// Device reads of object data that failed (`EngineError::Unreadable`).
    pub read_errors: AtomicU64,
    /// Distinct bad blocks behind those errors ([`Engine::checksum_error`],
    /// [`Engine::read_error`]).
    pub bad_blocks: AtomicU64,
    pub writeback_batches: AtomicU64,
    /// Journal records written (each carries one or more writes: `bytes_written` over this
    /// shows how well concurrent writes share records).
    pub journal_records: AtomicU64,
    /// Of those, records written alone with `RWF_DSYNC` (`journal.rs::Engine::lone`).
    pub durable_records: AtomicU64,
    /// Device requests completed (reads and writes; flushes apart) and the microseconds they
    /// took in sum, from submission to completion: their mean latency over any interval is
    /// the quotient of two differences (the node's window in `crates/node/src/latency.rs`).
    pub ios_done: AtomicU64,
    pub io_micros: AtomicU64,
    pub flushes_done: AtomicU64,
    pub flush_micros: AtomicU64,
    pub used_slots: AtomicU64,
    pub objects: AtomicU64,
    pub tombstones: AtomicU64,
    pub held_reads: AtomicU64,
    pub journal_used: AtomicU64,
    /// Set once the store is poisoned (never cleared: reopening makes a new store).
    pub poisoned: std::sync::atomic::AtomicBool,
    /// When the oldest device request in flight was submitted (`inflight.rs`).
    pub io_age: inflight::IoAge,
}

/// Where a read's answer goes: the bytes, with or without the object's version they were read
/// at.
pub(crate) enum ReadReply {
    Versioned(oneshot::Sender<Result<(Bytes, Version), EngineError>>),
    Bytes(oneshot::Sender<Result<Bytes, EngineError>>),
}

impl ReadReply {
    pub fn send(self, r: Result<(Bytes, Version), EngineError>) {
        match self {
            ReadReply::Versioned(tx) => drop(tx.send(r)),
            ReadReply::Bytes(tx) => drop(tx.send(r.map(|(b, _)| b))),
        }
    }
}

/// A message from a handle to the I/O thread.
pub(crate) enum Msg {
    Read {
        oid: ObjectId,
        offset: u32,
        len: u32,
        reply: ReadReply,
    },
    ReadObject {
        oid: ObjectId,
        reply: oneshot::Sender<Result<ObjectImage, EngineError>>,
    },
    SalvageObject {
        oid: ObjectId,
        reply: oneshot::Sender<Result<crate::Salvage, EngineError>>,
    },
    Write(WriteOp),
    /// The user committed a held (pending) write of `oid`: reads may see it.
    Commit {
        oid: ObjectId,
        version: Version,
    },
    Flush {
        /// Also waits for the operations submitted before it that still wait (`settle.rs`).
        settle: bool,
        reply: oneshot::Sender<Result<(), EngineError>>,
    },
    ObjectInfo {
        oid: ObjectId,
        reply: oneshot::Sender<Option<ObjectInfo>>,
    },
    /// Objects (and tombstones) of one PG in object order, after `after`.
    List {
        pg: PgId,
        after: Option<ObjectId>,
        limit: usize,
        reply: oneshot::Sender<Vec<ObjectInfo>>,
    },
    /// Objects of one volume in one pool, index `from` and up (every PG).
    ListVolume {
        pool: PoolId,
        volume: VolumeId,
        from: u64,
        limit: usize,
        reply: oneshot::Sender<Vec<ObjectInfo>>,
    },
    /// The PG's log after `since`, oldest first.
    ListSince {
        pg: PgId,
        since: Version,
        limit: usize,
        reply: oneshot::Sender<Result<Vec<LogEntry>, EngineError>>,
    },
    Pgs {
        reply: oneshot::Sender<Vec<PgInfo>>,
    },
    /// Sets (`Some`) or removes (`None`) a PG's record.
    SetPg {
        pg: PgId,
        blob: Option<Box<[u8; PG_BLOB]>>,
        durable: bool,
        reply: oneshot::Sender<Result<(), EngineError>>,
    },
    /// Forgets the PG's tombstones up to `upto` and raises its log tail to it.
    TrimLog {
        pg: PgId,
        upto: Version,
        reply: oneshot::Sender<Result<u64, EngineError>>,
    },
    Close {
        reply: Option<oneshot::Sender<Result<(), EngineError>>>,
    },
}

/// What a write-class operation does.
pub(crate) enum WKind {
    Data(Bytes),
    Zero(u32),
    /// Leaves a tombstone at the new version.
    Delete,
    /// Forgets the object entirely (no tombstone); with `only_tombstone_upto`, only if it is a
    /// tombstone no newer than that (log trimming).
    Purge {
        only_tombstone_upto: Option<Version>,
    },
    /// Replaces the object with this image whatever its current version (recovery).
    Install(ObjectImage),
}

/// Where the result of a write-class operation goes.
pub(crate) enum Reply {
    Version(oneshot::Sender<Result<Version, EngineError>>),
    Unit(oneshot::Sender<Result<(), EngineError>>),
    /// Answers with a count fixed when the operation was queued.
    Count(oneshot::Sender<Result<u64, EngineError>>, u64),
}

impl Reply {
    pub fn ok(self, v: Version) {
        match self {
            Reply::Version(tx) => drop(tx.send(Ok(v))),
            Reply::Unit(tx) => drop(tx.send(Ok(()))),
            Reply::Count(tx, n) => drop(tx.send(Ok(n))),
        }
    }
    pub fn err(self, e: EngineError) {
        match self {
            Reply::Version(tx) => drop(tx.send(Err(e))),
            Reply::Unit(tx) => drop(tx.send(Err(e))),
            Reply::Count(tx, _) => drop(tx.send(Err(e))),
        }
    }
}

/// A write, write-zeroes/trim, delete, purge or install, queued per object until it can be
/// applied.
pub(crate) struct WriteOp {
    pub oid: ObjectId,
    pub offset: u32,
    pub kind: WKind,
    pub opts: crate::WriteOptions,
    pub reply: Reply,
    /// Old contents of partial edge blocks, read from disk for read-modify-write.
    pub old: Vec<(u32, AlignedBuf)>,
    pub reads_pending: u32,
    /// Why a read of an old block failed (boxed: rare, and it keeps the message small).
    pub failed: Option<Box<EngineError>>,
    /// Arrival number (`settle.rs`).
    pub seq: u64,
}

impl WriteOp {
    pub fn new(
        oid: ObjectId,
        offset: u32,
        kind: WKind,
        opts: crate::WriteOptions,
        reply: Reply,
    ) -> WriteOp {
        WriteOp {
            oid,
            offset,
            kind,
            opts,
            reply,
            old: Vec::new(),
            reads_pending: 0,
            failed: None,
            seq: 0,
        }
    }
}

/// A client waiting for a record: acked when the record is written (non-durable) or flushed.
pub(crate) struct Waiter {
    pub durable: bool,
    pub reply: Reply,
    pub version: Version,
}

/// What a device request belongs to.
pub(crate) enum IoCtx {
    /// Blocks `first..first + n` of read `rid`; `alone`: one block read again by itself after
    /// its run failed (`read.rs::Engine::read_again_alone`).
    Read {
        rid: usize,
        first: usize,
        n: usize,
        alone: bool,
    },
    Rmw {
        oid: ObjectId,
        block: u32,
        crc: u32,
    },
    Record {
        seq: u64,
    },
    FullData {
        seq: u64,
        oid: ObjectId,
        slot: u32,
    },
    Flush {
        no: u64,
    },
    WriteBack,
}

/// Why an object's queue is waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    /// Read-modify-write reads in flight.
    Reads,
    /// The open journal batch is full.
    Room,
    /// No free slot until write-back frees some.
    Space,
}

pub(crate) struct Blocked {
    pub ops: VecDeque<WriteOp>,
    pub reason: Reason,
}

/// A tiny slab: stable indices for in-flight contexts.
pub(crate) struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<usize>,
    len: usize,
}

impl<T> Slab<T> {
    pub fn new() -> Self {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
    pub fn insert(&mut self, v: T) -> usize {
        self.len += 1;
        match self.free.pop() {
            Some(i) => {
                self.items[i] = Some(v);
                i
            }
            None => {
                self.items.push(Some(v));
                self.items.len() - 1
            }
        }
    }
    pub fn remove(&mut self, i: usize) -> Option<T> {
        let v = self.items.get_mut(i)?.take();
        if v.is_some() {
            self.len -= 1;
            self.free.push(i);
        }
        v
    }
    pub fn get(&self, i: usize) -> Option<&T> {
        self.items.get(i)?.as_ref()
    }
    pub fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        self.items.get_mut(i)?.as_mut()
    }
    pub fn len(&self) -> usize {
        self.len
    }
}

pub(crate) struct Config {
    pub writeback_idle: Duration,
}

pub(crate) struct Engine {
    pub sb: Superblock,
    pub info: StoreInfo,
    pub be: Box<dyn Backend>,
    pub waker: Waker,
    pub rx: Receiver<Msg>,
    pub shared: Arc<Shared>,
    pub cfg: Config,
    pub st: State,
    pub jr: Journal,
    pub wb: WriteBack,
    /// Device requests in flight, by token, with the age of the oldest.
    pub ios: inflight::InFlight,
    pub reads: Slab<ReadCtx>,
    pub blocked: FxHashMap<ObjectId, Blocked>,
    /// Reads waiting for a held (pending) write of their object to be committed.
    pub held_reads: FxHashMap<ObjectId, Vec<read::HeldRead>>,
    /// Objects whose queue waits for room in the open batch or for free slots.
    pub waiting: VecDeque<ObjectId>,
    pub poisoned: Option<String>,
    pub closing: bool,
    pub close_replies: Vec<oneshot::Sender<Result<(), EngineError>>>,
    pub last_write: Instant,
    /// Where every time read of the engine goes (the OS clock, or virtual time in simulation).
    pub clock: Clock,
    /// Blocks that failed their checksum, by device offset and the checksum they should have
    /// (at most [`BAD_BLOCKS_KEPT`]): a block read again and again counts once.
    pub bad_seen: std::collections::HashSet<(u64, u32)>,
    /// Versions objects reached here without a record (`unrecorded.rs`).
    pub unrecorded: unrecorded::Unrecorded,
    /// Flushes waiting for operations that arrived before them (`settle.rs`).
    pub settle: settle::Settling,
}

/// The most distinct bad blocks an engine remembers; past it every new one counts anew.
const BAD_BLOCKS_KEPT: usize = 65536;

/// [`Engine::checksum_error`] on the engine's counters and memory of bad blocks.
pub(crate) fn checksum_error(
    shared: &Shared,
    seen: &mut std::collections::HashSet<(u64, u32)>,
    off: u64,
    crc: u32,
) {
    shared.checksum_errors.fetch_add(1, Ordering::Relaxed);
    note_bad_block(shared, seen, off, crc);
}

/// Whether a failed device request failed on the medium (the data cannot be read there: a
/// latent sector error, a failing drive), as opposed to a device gone, a refused request or
/// an interrupted one: only then is the copy there bad.
pub(crate) fn media_error(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO | libc::ENODATA | libc::EILSEQ | libc::EBADMSG)
    )
}

/// Counts a failed device read of object data (the block at `off`, whose checksum is `crc`):
/// a read error, and a distinct bad block.
pub(crate) fn read_error(
    shared: &Shared,
    seen: &mut std::collections::HashSet<(u64, u32)>,
    off: u64,
    crc: u32,
) {
    shared.read_errors.fetch_add(1, Ordering::Relaxed);
    note_bad_block(shared, seen, off, crc);
}

/// Counts a block that failed its checksum (or could not be read) among the distinct bad
/// blocks (once per block).
pub(crate) fn note_bad_block(
    shared: &Shared,
    seen: &mut std::collections::HashSet<(u64, u32)>,
    off: u64,
    crc: u32,
) {
    if seen.contains(&(off, crc)) {
        return;
    }
    if seen.len() < BAD_BLOCKS_KEPT {
        seen.insert((off, crc));
    }
    shared.bad_blocks.fetch_add(1, Ordering::Relaxed);
}

impl Engine {
    pub fn info(&self) -> StoreInfo {
        self.info.clone()
    }
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }
    pub fn waker(&self) -> Waker {
        self.waker.clone()
    }

    /// A read failed its checksum at the block at device offset `off`, which should have
    /// checksum `crc`: counted as a checksum error, and as a bad block unless that block (with
    /// that content) failed before. A device's health is judged by the bad blocks
    /// (`StoreStats::bad_blocks`), so one damaged object read again and again (by clients
    /// retrying, recovery trying it as a source) does not look like a dying drive.
    pub fn checksum_error(&mut self, off: u64, crc: u32) {
        checksum_error(&self.shared, &mut self.bad_seen, off, crc);
    }

    pub fn read_error(&mut self, off: u64, crc: u32) {
        read_error(&self.shared, &mut self.bad_seen, off, crc);
    }

    /// A further bad block met by the same read: a distinct bad block, not another error.
    pub fn note_bad_block(&mut self, off: u64, crc: u32) {
        note_bad_block(&self.shared, &mut self.bad_seen, off, crc);
    }

    /// Adds a completed request's time on the device to the latency counters.
    fn count_latency(&self, ctx: &IoCtx, submitted: Instant) {
        let took = self.clock.now().saturating_duration_since(submitted);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let (done, sum) = match ctx {
            IoCtx::Flush { .. } => (&self.shared.flushes_done, &self.shared.flush_micros),
            _ => (&self.shared.ios_done, &self.shared.io_micros),
        };
        done.fetch_add(1, Ordering::Relaxed);
        let before = sum.fetch_add(micros, Ordering::Relaxed);
        // Counters never wrap silently (half a million years of device time in sum).
        assert!(
            before.checked_add(micros).is_some(),
            "device latency counter overflow"
        );
    }

    /// Hands a request to the backend under a fresh token.
    pub fn submit(&mut self, ctx: IoCtx, req: IoReq) {
        if let IoReq::Write { .. } = &req {
            self.shared
                .device_bytes_written
                .fetch_add(req.len() as u64, Ordering::Relaxed);
        }
        let now = self.clock.now();
        let (token, oldest) = self.ios.insert(ctx, now);
        if oldest {
            self.shared.io_age.set(Some(now));
        }
        self.be.submit(token as u64, req);
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Read {
                oid,
                offset,
                len,
                reply,
            } => self.start_read(
                oid,
                read::Want::Range { offset, len },
                read::Out::Range(reply),
            ),
            Msg::ReadObject { oid, reply } => {
                let len = self.sb.object_size;
                self.start_read(
                    oid,
                    read::Want::Range { offset: 0, len },
                    read::Out::Image(reply),
                )
            }
            Msg::SalvageObject { oid, reply } => {
                let len = self.sb.object_size;
                self.start_read(
                    oid,
                    read::Want::Range { offset: 0, len },
                    read::Out::Salvage(reply),
                )
            }
            Msg::Write(op) => self.handle_write(op),
            Msg::Commit { oid, version } => self.commit(oid, version),
            Msg::Flush { settle, reply } => {
                if self.closing {
                    let _ = reply.send(Err(EngineError::Closed));
                } else if let Some(p) = &self.poisoned {
                    let _ = reply.send(Err(EngineError::Poisoned(p.clone())));
                } else {
                    let w = Waiter {
                        durable: true,
                        reply: Reply::Unit(reply),
                        version: Version::NONE,
                    };
                    match settle {
                        true => self.settled_flush(w),
                        false => self.add_barrier(w),
                    }
                }
            }
            Msg::ObjectInfo { oid, reply } => {
                let _ = reply.send(self.object_info(&oid));
            }
            Msg::List {
                pg,
                after,
                limit,
                reply,
            } => {
                let _ = reply.send(self.list(pg, after, limit));
            }
            Msg::ListVolume {
                pool,
                volume,
                from,
                limit,
                reply,
            } => {
                let _ = reply.send(self.list_volume(pool, volume, from, limit));
            }
            Msg::ListSince {
                pg,
                since,
                limit,
                reply,
            } => {
                let _ = reply.send(self.list_since(pg, since, limit));
            }
            Msg::Pgs { reply } => {
                let _ = reply.send(self.pg_infos());
            }
            Msg::SetPg {
                pg,
                blob,
                durable,
                reply,
            } => self.set_pg(pg, blob, durable, reply),
            Msg::TrimLog { pg, upto, reply } => self.trim_log(pg, upto, reply),
            Msg::Close { reply } => {
                self.closing = true;
                self.fail_held_reads(&EngineError::Closed);
                if let Some(r) = reply {
                    self.close_replies.push(r);
                }
            }
        }
    }

    /// Makes progress that needs no new input: retries waiting objects, seals, flushes,
    /// starts or advances write-back, and publishes gauges. Returns true when it stopped while
    /// still making progress (the round limit keeps completions flowing): the caller must not
    /// sleep, or e.g. a flush a new write-back batch wants, or writers waiting for the journal
    /// space a finished batch freed, would wait for the next message.
    fn pump(&mut self) -> bool {
        let mut more = true;
        for _ in 0..4 {
            self.retry_waiting();
            self.release_settled();
            let sealed = self.maybe_seal();
            self.maybe_flush();
            let wb = self.pump_writeback();
            if !sealed && !wb {
                more = false;
                break;
            }
        }
        self.publish_gauges();
        more
    }

    fn publish_gauges(&self) {
        let a = &self.st.alloc;
        self.shared
            .used_slots
            .store(a.claimed + a.limbo, Ordering::Relaxed);
        let tombs = self.st.tomb_alloc_used();
        self.shared
            .objects
            .store(self.st.objs.len() as u64 - tombs, Ordering::Relaxed);
        self.shared.tombstones.store(tombs, Ordering::Relaxed);
        let held = self.held_reads.values().map(Vec::len).sum::<usize>();
        self.shared.held_reads.store(held as u64, Ordering::Relaxed);
        self.shared
            .journal_used
            .store(self.jr.used(), Ordering::Relaxed);
    }

    fn complete(&mut self, d: IoDone) {
        let Some((ctx, submitted, oldest)) = self.ios.remove(d.token as usize) else {
            return;
        };
        if oldest {
            self.shared.io_age.set(self.ios.oldest());
        }
        self.count_latency(&ctx, submitted);
        match ctx {
            IoCtx::Read {
                rid,
                first,
                n,
                alone,
            } => self.read_done(rid, first, n, alone, d),
            IoCtx::Rmw { oid, block, crc } => self.rmw_done(oid, block, crc, d),
            IoCtx::Record { seq } => self.record_io_done(seq, d.res),
            IoCtx::FullData { seq, oid, slot } => {
                self.full_data_done(seq, oid, slot);
                self.record_io_done(seq, d.res);
            }
            IoCtx::Flush { no } => self.flush_done(no, d.res),
            IoCtx::WriteBack => self.writeback_io_done(d.res),
        }
    }

    /// A write or flush failed: nothing after this point can be trusted to be durable, so
    /// every pending and future write or flush fails (redb's PreviousIo idea).
    pub fn poison(&mut self, why: String) {
        if self.poisoned.is_some() {
            return;
        }
        tracing::error!(device = self.info.device_id.0, "store poisoned: {why}");
        self.poisoned = Some(why.clone());
        self.shared.poisoned.store(true, Ordering::Release);
        let err = EngineError::Poisoned(why);
        for w in self.jr.take_all_waiters() {
            w.reply.err(err.duplicate());
        }
        let blocked: Vec<ObjectId> = self.blocked.keys().copied().collect();
        for oid in blocked {
            if let Some(b) = self.blocked.get_mut(&oid) {
                // Keep an op whose RMW reads are in flight; its completion will fail it.
                let keep = if b.reason == Reason::Reads {
                    b.ops.pop_front()
                } else {
                    None
                };
                for op in b.ops.drain(..) {
                    op.reply.err(err.duplicate());
                }
                match keep {
                    Some(op) => b.ops.push_back(op),
                    None => {
                        self.blocked.remove(&oid);
                    }
                }
            }
        }
        self.waiting.clear();
        self.fail_settling(&err);
        self.fail_held_reads(&err);
    }
}

#[cfg(test)]
mod tests {
    use super::media_error;
    use std::io::Error;

    #[test]
    fn only_errors_of_the_medium_make_a_copy_bad() {
        for errno in [libc::EIO, libc::ENODATA, libc::EILSEQ, libc::EBADMSG] {
            assert!(media_error(&Error::from_raw_os_error(errno)), "{errno}");
        }
        for errno in [libc::ENXIO, libc::ENODEV, libc::EINVAL, libc::ECANCELED] {
            assert!(!media_error(&Error::from_raw_os_error(errno)), "{errno}");
        }
        assert!(!media_error(&Error::other("not from the kernel")));
    }
}
