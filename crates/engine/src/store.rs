//! The public handle: a cheap, cloneable front for the store's I/O loop. Every method sends
//! one message to the loop and awaits its reply; nothing here touches the device.
//!
//! The loop runs on its own OS thread ([`Store::open`]), or as a task on the current tokio
//! runtime ([`Store::spawn`]: a node serves requests and drives its stores on the same
//! threads; [`Store::spawn_sim`] over a simulated disk: the deterministic simulation).
//! `submit_*` methods enqueue an operation at call time and return a [`Pending`] reply, so a
//! caller fixes the order in which operations arrive without depending on when a future is
//! first polled; the `async` methods are thin wrappers over them.

use crate::clock::Clock;
use crate::engine::{Msg, ReadReply, Reply, Shared, WKind, WriteOp};
use crate::error::EngineError;
use crate::io::Waker;
use crate::io::file::Dev;
use crate::io::sim::SimDisk;
use crate::layout::PG_BLOB;
use crate::{
    LogEntry, ObjectImage, ObjectInfo, OpenOptions, PgInfo, Salvage, StoreInfo, StoreStats,
    WriteOptions,
};
use basalt_types::{ObjectId, PgId, PoolId, Version, VolumeId};
use bytes::Bytes;
use crossbeam_channel::Sender;
use parking_lot::Mutex;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::{oneshot, watch};

/// An open store. Clones share one I/O loop; the loop stops when the last clone is dropped
/// (after finishing queued work) or on [`Store::close`].
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

/// Where the I/O loop runs.
enum Runner {
    Thread(Mutex<Option<JoinHandle<()>>>),
    /// A task; for a real device ([`Store::spawn`]), a watch that turns true once the loop
    /// has finished and let go of the device.
    Task(tokio::task::AbortHandle, Option<watch::Receiver<bool>>),
}

struct Inner {
    tx: Sender<Msg>,
    waker: Waker,
    info: StoreInfo,
    shared: Arc<Shared>,
    runner: Runner,
    /// Set by [`Store::detach`]: the last handle does not wait for the I/O thread.
    detached: AtomicBool,
    /// Set by [`Store::close`].
    closing: AtomicBool,
    /// Set once a [`Store::close`] finished the loop's work.
    closed: AtomicBool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Ask the loop to finish queued work and stop; wait for a thread (a task finishes on
        // its runtime), unless it was let go (its device hangs).
        if self.tx.send(Msg::Close { reply: None }).is_ok() {
            self.waker.wake();
        }
        if let Runner::Thread(t) = &self.runner
            && !self.detached.load(Ordering::Acquire)
            && let Some(t) = t.lock().take()
        {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("info", &self.inner.info)
            .finish()
    }
}

/// The reply to an operation already handed to the store (see [`Store::submit_write`]).
/// Dropping it does not cancel the operation.
#[must_use = "the operation is submitted; await the reply to learn its outcome"]
pub struct Pending<T> {
    state: PendingState<T>,
}

enum PendingState<T> {
    Ready(Option<Result<T, EngineError>>),
    Waiting(oneshot::Receiver<Result<T, EngineError>>),
}

impl<T> Pending<T> {
    fn ready(r: Result<T, EngineError>) -> Pending<T> {
        Pending {
            state: PendingState::Ready(Some(r)),
        }
    }
}

impl<T> std::fmt::Debug for Pending<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pending")
    }
}

// Nothing is pinned structurally: the receiver is Unpin and the ready value is moved out.
impl<T> Unpin for Pending<T> {}

impl<T> Future for Pending<T> {
    type Output = Result<T, EngineError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().state {
            PendingState::Ready(r) => {
                Poll::Ready(r.take().expect("Pending polled after completion"))
            }
            PendingState::Waiting(rx) => Pin::new(rx)
                .poll(cx)
                .map(|r| r.unwrap_or(Err(EngineError::Closed))),
        }
    }
}

/// A store this process runs as a task ([`Store::spawn`]): its handles (gone once every one
/// was dropped) and a watch that turns true once its loop has finished and let go of the
/// device.
struct Running {
    store: std::sync::Weak<Inner>,
    done: watch::Receiver<bool>,
}

/// The stores this process runs as tasks, by device path.
fn running() -> &'static Mutex<std::collections::HashMap<std::path::PathBuf, Running>> {
    static RUNNING: std::sync::OnceLock<
        Mutex<std::collections::HashMap<std::path::PathBuf, Running>>,
    > = std::sync::OnceLock::new();
    RUNNING.get_or_init(Default::default)
}

impl Store {
    /// Waits until a store this process ran as a task ([`Store::spawn`]) on the device at
    /// `path`, and that is closing ([`Store::close`]) or was dropped, has finished its queued
    /// work and let go of the device. A store still in use is not waited for (opening the
    /// device again then fails with [`EngineError::InUse`]).
    pub async fn released(path: &Path) {
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let done = {
            let running = running().lock();
            let Some(r) = running.get(&key) else { return };
            let live = r
                .store
                .upgrade()
                .is_some_and(|s| !s.closing.load(Ordering::Acquire));
            if live {
                return;
            }
            r.done.clone()
        };
        // An error means the task is gone (aborted or its runtime stopped): released too.
        let _ = done.clone().wait_for(|done| *done).await;
    }

    /// Opens a formatted file or block device: runs recovery (blocking), then starts the I/O
    /// thread.
    pub fn open(path: &Path, opts: &OpenOptions) -> Result<Store, EngineError> {
        let dev = Dev::open(path, false, opts.direct_io).map_err(|e| match e {
            EngineError::Io(e) if e.kind() == std::io::ErrorKind::NotFound => {
                EngineError::NotFormatted(path.to_path_buf())
            }
            e => e,
        })?;
        Store::start(dev, path, opts)
    }

    /// Opens a formatted file or block device like [`Store::open`] (recovery runs on a blocking
    /// thread), then runs its I/O loop as a task on the current tokio runtime instead of a
    /// thread of its own: requests and completions are handled by whichever runtime thread
    /// polls the task, so a caller on the same thread hands work to the store, and gets the
    /// answer, without waking another thread. Must be called within a runtime.
    pub async fn spawn(path: &Path, opts: &OpenOptions) -> Result<Store, EngineError> {
        // A store of this device dropped in this process may still be finishing its queued
        // work (a dropped handle cannot wait for its task); it holds the device's lock until
        // then.
        Store::released(path).await;
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let (tx, rx) = crossbeam_channel::unbounded();
        let (path, opts) = (path.to_path_buf(), opts.clone());
        let engine = tokio::task::spawn_blocking(move || {
            let dev = Dev::open(&path, false, opts.direct_io).map_err(|e| match e {
                EngineError::Io(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    EngineError::NotFormatted(path.clone())
                }
                e => e,
            })?;
            crate::engine::Engine::open(dev, &path, &opts, rx, Clock::Runtime)
        })
        .await
        .map_err(|e| EngineError::Io(std::io::Error::other(format!("open task failed: {e}"))))??;
        let (info, shared, waker) = (engine.info(), engine.shared(), engine.waker());
        let (done_tx, done_rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            engine.drive().await;
            // The engine (its device and lock) is dropped by now.
            let _ = done_tx.send(true);
        });
        let inner = Arc::new(Inner {
            tx,
            waker,
            info,
            shared,
            runner: Runner::Task(task.abort_handle(), Some(done_rx.clone())),
            detached: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        });
        let running = Running {
            store: Arc::downgrade(&inner),
            done: done_rx,
        };
        self::running().lock().insert(key, running);
        Ok(Store { inner })
    }

    /// Opens a store on a simulated disk with its own I/O thread and the OS clock (tests).
    pub fn open_sim(disk: &SimDisk, opts: &OpenOptions) -> Result<Store, EngineError> {
        Store::start(Dev::Sim(disk.clone()), Path::new("<sim>"), opts)
    }

    /// Opens a store on a simulated disk with its I/O loop as a task on the current tokio
    /// runtime (no thread); every time read is the runtime's clock. On a current-thread
    /// runtime with paused time this is the deterministic simulation: the disk's latencies and
    /// the write-back timer run in virtual time, and the same inputs give the same run.
    /// Recovery runs (blocking) before this returns. Fails if another store has the disk open
    /// ([`SimDisk::released`] waits for that one to stop). Must be called within a runtime.
    pub fn spawn_sim(disk: &SimDisk, opts: &OpenOptions) -> Result<Store, EngineError> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let dev = Dev::Sim(disk.clone());
        let engine =
            crate::engine::Engine::open(dev, Path::new("<sim>"), opts, rx, Clock::Runtime)?;
        let (info, shared, waker) = (engine.info(), engine.shared(), engine.waker());
        let task = tokio::spawn(engine.drive());
        Ok(Store {
            inner: Arc::new(Inner {
                tx,
                waker,
                info,
                shared,
                runner: Runner::Task(task.abort_handle(), None),
                detached: AtomicBool::new(false),
                closing: AtomicBool::new(false),
                closed: AtomicBool::new(false),
            }),
        })
    }

    fn start(dev: Dev, path: &Path, opts: &OpenOptions) -> Result<Store, EngineError> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let engine = crate::engine::Engine::open(dev, path, opts, rx, Clock::Os)?;
        let info = engine.info();
        let shared = engine.shared();
        let waker = engine.waker();
        let thread = std::thread::Builder::new()
            .name(format!("basalt-io-{}", info.device_id.0))
            .spawn(move || engine.run())?;
        Ok(Store {
            inner: Arc::new(Inner {
                tx,
                waker,
                info,
                shared,
                runner: Runner::Thread(Mutex::new(Some(thread))),
                detached: AtomicBool::new(false),
                closing: AtomicBool::new(false),
                closed: AtomicBool::new(false),
            }),
        })
    }

    /// Simulation: stops a store made by [`Store::spawn_sim`] at once, as a power cut would
    /// (take the disk's crash image first). Nothing queued is finished; every caller still
    /// waiting gets [`EngineError::Closed`]. A store on an I/O thread is not affected.
    pub fn crash(&self) {
        if let Runner::Task(t, _) = &self.inner.runner {
            t.abort();
        }
    }

    pub fn info(&self) -> &StoreInfo {
        &self.inner.info
    }

    pub fn stats(&self) -> StoreStats {
        let s = &self.inner.shared;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let capacity = self.inner.info.capacity_bytes;
        let used = get(&s.used_slots) * u64::from(self.inner.info.object_size);
        StoreStats {
            capacity_bytes: capacity,
            used_bytes: used,
            free_bytes: capacity.saturating_sub(used),
            objects: get(&s.objects),
            tombstones: get(&s.tombstones),
            held_reads: get(&s.held_reads),
            journal_used: get(&s.journal_used),
            journal_size: self.inner.info.journal_size,
            reads: get(&s.reads),
            writes: get(&s.writes),
            flushes: get(&s.flushes),
            bytes_read: get(&s.bytes_read),
            bytes_written: get(&s.bytes_written),
            device_bytes_written: get(&s.device_bytes_written),
            checksum_errors: get(&s.checksum_errors),
            read_errors: get(&s.read_errors),
            bad_blocks: get(&s.bad_blocks),
            writeback_batches: get(&s.writeback_batches),
            journal_records: get(&s.journal_records),
            durable_records: get(&s.durable_records),
            ios_done: get(&s.ios_done),
            io_micros: get(&s.io_micros),
            flushes_done: get(&s.flushes_done),
            flush_micros: get(&s.flush_micros),
            oldest_io_age: s.io_age.age(),
        }
    }

    /// How long the oldest device request in flight (a read, write or flush handed to the
    /// device and not completed, by io_uring, psync or the simulated disk) has waited; `None`
    /// when nothing is in flight. A device that hangs without returning errors (firmware
    /// stall, dead path) shows only as this age growing: the node reports such a device down
    /// (`crates/node/src/faults.rs`). Read on the store's clock (virtual time in the
    /// simulation); one atomic load, callable from any thread or task.
    pub fn oldest_io_age(&self) -> Option<Duration> {
        self.inner.shared.io_age.age()
    }

    /// Lets the store's I/O thread go: dropping the last handle no longer waits for it to
    /// finish. For a device that hangs (see [`Store::oldest_io_age`]): the thread waits for
    /// requests the device may never complete and keeps their buffers (the kernel may still
    /// use them) until they complete or the process exits; waiting for it would hang whoever
    /// drops the store, e.g. a node that stops. The device stays locked meanwhile. A store
    /// whose loop runs as a task is not affected.
    pub fn detach(&self) {
        self.inner.detached.store(true, Ordering::Release);
    }

    /// Whether an earlier write or flush failed: the store refuses every read, write and flush
    /// from then on (see [`EngineError::Poisoned`]); only reopening it (recovery) ends that.
    pub fn is_poisoned(&self) -> bool {
        self.inner.shared.poisoned.load(Ordering::Acquire)
    }

    fn send(&self, msg: Msg) -> Result<(), EngineError> {
        self.inner.tx.send(msg).map_err(|_| EngineError::Closed)?;
        self.inner.waker.wake();
        Ok(())
    }

    async fn call<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Msg,
    ) -> Result<T, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.send(make(tx))?;
        rx.await.map_err(|_| EngineError::Closed)
    }

    fn check_range(&self, offset: u32, len: u64) -> Result<(), EngineError> {
        let size = u64::from(self.inner.info.object_size);
        if u64::from(offset) + len > size {
            return Err(EngineError::invalid(format!(
                "range {offset}+{len} is past the object size {size}"
            )));
        }
        Ok(())
    }

    /// Sends a message whose reply is a `Result`, at call time.
    fn submit_msg<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, EngineError>>) -> Msg,
    ) -> Pending<T> {
        let (tx, rx) = oneshot::channel();
        match self.send(make(tx)) {
            Ok(()) => Pending {
                state: PendingState::Waiting(rx),
            },
            Err(e) => Pending::ready(Err(e)),
        }
    }

    fn submit_write_op(
        &self,
        oid: ObjectId,
        offset: u32,
        kind: WKind,
        opts: WriteOptions,
    ) -> Pending<Version> {
        self.submit_msg(|tx| Msg::Write(WriteOp::new(oid, offset, kind, opts, Reply::Version(tx))))
    }

    /// [`Store::read_versioned`], enqueued now.
    pub fn submit_read_versioned(
        &self,
        oid: ObjectId,
        offset: u32,
        len: u32,
    ) -> Pending<(Bytes, Version)> {
        if let Err(e) = self.check_range(offset, u64::from(len)) {
            return Pending::ready(Err(e));
        }
        if len == 0 {
            return Pending::ready(Err(EngineError::invalid("empty read")));
        }
        self.submit_msg(|tx| Msg::Read {
            oid,
            offset,
            len,
            reply: ReadReply::Versioned(tx),
        })
    }

    /// [`Store::read`], enqueued now.
    pub fn submit_read(&self, oid: ObjectId, offset: u32, len: u32) -> Pending<Bytes> {
        if let Err(e) = self.check_range(offset, u64::from(len)) {
            return Pending::ready(Err(e));
        }
        if len == 0 {
            return Pending::ready(Ok(Bytes::new()));
        }
        self.submit_msg(|tx| Msg::Read {
            oid,
            offset,
            len,
            reply: ReadReply::Bytes(tx),
        })
    }

    /// [`Store::write`], enqueued now: operations on one object apply in the order of these
    /// calls.
    pub fn submit_write(
        &self,
        oid: ObjectId,
        offset: u32,
        data: Bytes,
        opts: WriteOptions,
    ) -> Pending<Version> {
        if let Err(e) = self.check_range(offset, data.len() as u64) {
            return Pending::ready(Err(e));
        }
        if data.is_empty() {
            return Pending::ready(Err(EngineError::invalid("empty write")));
        }
        self.submit_write_op(oid, offset, WKind::Data(data), opts)
    }

    /// [`Store::write_zeroes`] (and [`Store::trim`]), enqueued now.
    pub fn submit_write_zeroes(
        &self,
        oid: ObjectId,
        offset: u32,
        len: u32,
        opts: WriteOptions,
    ) -> Pending<Version> {
        if let Err(e) = self.check_range(offset, u64::from(len)) {
            return Pending::ready(Err(e));
        }
        if len == 0 {
            return Pending::ready(Err(EngineError::invalid("empty write-zeroes")));
        }
        self.submit_write_op(oid, offset, WKind::Zero(len), opts)
    }

    /// [`Store::delete`], enqueued now.
    pub fn submit_delete(&self, oid: ObjectId, opts: WriteOptions) -> Pending<Version> {
        self.submit_write_op(oid, 0, WKind::Delete, opts)
    }

    /// [`Store::flush`], enqueued now: covers every write acknowledged before this call.
    pub fn submit_flush(&self) -> Pending<()> {
        self.submit_msg(|reply| Msg::Flush {
            settle: false,
            reply,
        })
    }

    /// [`Store::settle`], enqueued now.
    pub fn submit_settle(&self) -> Pending<()> {
        self.submit_msg(|reply| Msg::Flush {
            settle: true,
            reply,
        })
    }

    /// Reads `len` bytes at `offset` of `oid`. Never-written, trimmed and deleted ranges read
    /// as zeros. Waits while the object has held (uncommitted) writes.
    pub async fn read(&self, oid: ObjectId, offset: u32, len: u32) -> Result<Bytes, EngineError> {
        self.submit_read(oid, offset, len).await
    }

    /// [`Store::read`], with the object's version the bytes were read at.
    pub async fn read_versioned(
        &self,
        oid: ObjectId,
        offset: u32,
        len: u32,
    ) -> Result<(Bytes, Version), EngineError> {
        if len == 0 {
            self.check_range(offset, 0)?;
            let v = self
                .object_info(oid)
                .await?
                .map_or(Version::NONE, |o| o.version);
            return Ok((Bytes::new(), v));
        }
        self.submit_read_versioned(oid, offset, len).await
    }

    /// The whole object with its version and allocation, read atomically (recovery).
    pub async fn read_object(&self, oid: ObjectId) -> Result<ObjectImage, EngineError> {
        self.submit_msg(|reply| Msg::ReadObject { oid, reply })
            .await
    }

    /// The whole object as [`Store::read_object`] reads it, except that blocks failing their
    /// checksum, or that the device could not read, do not fail the read: they read as zeros
    /// and are listed (each still counts among the device's distinct bad blocks, and errors
    /// count as other reads count them). For repair by merging copies of one version.
    pub async fn read_object_salvage(&self, oid: ObjectId) -> Result<Salvage, EngineError> {
        self.submit_msg(|reply| Msg::SalvageObject { oid, reply })
            .await
    }

    /// Writes `data` at `offset` of `oid` (any alignment; at most the object size). All or
    /// nothing across a crash. Returns the object's new version.
    pub async fn write(
        &self,
        oid: ObjectId,
        offset: u32,
        data: Bytes,
        opts: WriteOptions,
    ) -> Result<Version, EngineError> {
        self.submit_write(oid, offset, data, opts).await
    }

    /// Makes `len` bytes at `offset` read as zeros. Whole 4 KiB blocks are unallocated
    /// (metadata only); partial blocks at the edges are rewritten. An object left with no
    /// allocated block becomes a tombstone at the new version and its slot is freed. On an
    /// object that does not exist (or is a tombstone) this changes nothing and returns its
    /// current version.
    pub async fn write_zeroes(
        &self,
        oid: ObjectId,
        offset: u32,
        len: u32,
        opts: WriteOptions,
    ) -> Result<Version, EngineError> {
        self.submit_write_zeroes(oid, offset, len, opts).await
    }

    /// Discards a range: same semantics as [`Store::write_zeroes`].
    pub async fn trim(
        &self,
        oid: ObjectId,
        offset: u32,
        len: u32,
        opts: WriteOptions,
    ) -> Result<Version, EngineError> {
        self.write_zeroes(oid, offset, len, opts).await
    }

    /// Deletes an object: it becomes a tombstone at the new version (so a replica that missed
    /// the delete can tell it from "never written"). No-op (returning `Version::NONE`) if the
    /// store knows nothing of it.
    pub async fn delete(&self, oid: ObjectId, opts: WriteOptions) -> Result<Version, EngineError> {
        self.submit_delete(oid, opts).await
    }

    /// Forgets an object entirely, tombstone included (a PG or volume that goes away).
    pub async fn purge(&self, oid: ObjectId, opts: WriteOptions) -> Result<(), EngineError> {
        self.submit_purge(oid, opts).await.map(|_| ())
    }

    /// [`Store::purge`], enqueued now.
    pub fn submit_purge(&self, oid: ObjectId, opts: WriteOptions) -> Pending<Version> {
        let kind = WKind::Purge {
            only_tombstone_upto: None,
        };
        self.submit_write_op(oid, 0, kind, opts)
    }

    /// Replaces an object with `image` whatever its current version (recovery, and rolling
    /// back a write that peering rejected), unless `opts.keep_since` keeps a newer one
    /// ([`WriteOptions::keep_since`]). Held writes of the object are dropped.
    pub async fn install(
        &self,
        oid: ObjectId,
        image: ObjectImage,
        opts: WriteOptions,
    ) -> Result<(), EngineError> {
        self.submit_install(oid, image, opts).await.map(|_| ())
    }

    /// [`Store::install`], enqueued now (so a caller can check a condition and submit under
    /// one lock).
    pub fn submit_install(
        &self,
        oid: ObjectId,
        image: ObjectImage,
        opts: WriteOptions,
    ) -> Pending<Version> {
        self.submit_write_op(oid, 0, WKind::Install(image), opts)
    }

    /// Commits one held write of `oid` (see [`WriteOptions::pending`]): once every held write
    /// of the object is committed, reads of it go on.
    pub fn commit(&self, oid: ObjectId, version: Version) -> Result<(), EngineError> {
        self.send(Msg::Commit { oid, version })
    }

    /// Removes every object of a volume, durably. Returns how many were removed.
    pub async fn delete_volume(&self, pool: PoolId, volume: VolumeId) -> Result<u64, EngineError> {
        self.delete_volume_from(pool, volume, 0).await
    }

    /// Removes the objects of a volume whose index is `from` or more (the tail after a
    /// shrink), tombstones included, durably. Returns how many live objects went. Pages
    /// through the volume's objects; never scans the whole store.
    pub async fn delete_volume_from(
        &self,
        pool: PoolId,
        volume: VolumeId,
        from: u64,
    ) -> Result<u64, EngineError> {
        let mut count = 0;
        loop {
            let page = self
                .call(|reply| Msg::ListVolume {
                    pool,
                    volume,
                    from,
                    limit: 1024,
                    reply,
                })
                .await?;
            if page.is_empty() {
                break;
            }
            count += page.iter().filter(|o| !o.deleted).count() as u64;
            let purges = page
                .iter()
                .map(|o| self.purge(o.oid, WriteOptions::buffered().in_pg(o.pg)));
            for r in futures::future::join_all(purges).await {
                r?;
            }
        }
        self.flush().await?;
        Ok(count)
    }

    /// Makes every previously acknowledged write durable.
    pub async fn flush(&self) -> Result<(), EngineError> {
        self.submit_flush().await
    }

    /// A flush that answers only once every operation submitted before it was applied (or
    /// failed), even one still waiting in the store (for the old block of a partial write,
    /// journal room, a free slot), and then is durable: nothing submitted before it lands
    /// after it (`engine/settle.rs`; a member's promise of a newer term).
    pub async fn settle(&self) -> Result<(), EngineError> {
        self.submit_settle().await
    }

    /// Version, PG, state and allocation of one object; `None` if the store knows nothing of it.
    pub async fn object_info(&self, oid: ObjectId) -> Result<Option<ObjectInfo>, EngineError> {
        self.call(|reply| Msg::ObjectInfo { oid, reply }).await
    }

    /// Up to `limit` objects and tombstones of `pg`, in object order, after `after`.
    pub async fn list(
        &self,
        pg: PgId,
        after: Option<ObjectId>,
        limit: usize,
    ) -> Result<Vec<ObjectInfo>, EngineError> {
        self.call(|reply| Msg::List {
            pg,
            after,
            limit,
            reply,
        })
        .await
    }

    /// Up to `limit` entries of `pg`'s log after `since`, oldest first: the newest change of
    /// every object and tombstone changed since. [`EngineError::LogTrimmed`] when tombstones
    /// after `since` may have been forgotten.
    pub async fn list_since(
        &self,
        pg: PgId,
        since: Version,
        limit: usize,
    ) -> Result<Vec<LogEntry>, EngineError> {
        self.call(|reply| Msg::ListSince {
            pg,
            since,
            limit,
            reply,
        })
        .await?
    }

    /// Every PG the store holds objects, tombstones or a record of.
    pub async fn pgs(&self) -> Result<Vec<PgInfo>, EngineError> {
        self.call(|reply| Msg::Pgs { reply }).await
    }

    /// Sets (`Some`) or removes (`None`) the user's record of `pg`, in journal order with the
    /// writes submitted before it (so state and data it describes are durable together).
    pub async fn set_pg(
        &self,
        pg: PgId,
        blob: Option<[u8; PG_BLOB]>,
        durable: bool,
    ) -> Result<(), EngineError> {
        self.submit_set_pg(pg, blob, durable).await
    }

    /// [`Store::set_pg`], enqueued now (so a caller can check a condition and submit under
    /// one lock).
    pub fn submit_set_pg(
        &self,
        pg: PgId,
        blob: Option<[u8; PG_BLOB]>,
        durable: bool,
    ) -> Pending<()> {
        self.submit_msg(|reply| Msg::SetPg {
            pg,
            blob: blob.map(Box::new),
            durable,
            reply,
        })
    }

    /// Forgets `pg`'s tombstones up to `upto` and raises its log tail to `upto`. Returns how
    /// many tombstones were queued for removal.
    pub async fn trim_log(&self, pg: PgId, upto: Version) -> Result<u64, EngineError> {
        self.call(|reply| Msg::TrimLog { pg, upto, reply }).await?
    }

    /// Every object and tombstone on the device, PG by PG (tests and tools: it walks the whole
    /// index, a page at a time).
    pub async fn list_objects(&self) -> Result<Vec<ObjectInfo>, EngineError> {
        let mut all = Vec::new();
        for p in self.pgs().await? {
            let mut after = None;
            loop {
                let page = self.list(p.pg, after, 4096).await?;
                let Some(last) = page.last() else { break };
                after = Some(last.oid);
                all.extend(page);
            }
        }
        Ok(all)
    }

    /// Finishes queued work, writes the journal back, flushes and stops the I/O loop.
    /// Idempotent (a call after one that succeeded returns `Ok`); afterwards every other call
    /// returns [`EngineError::Closed`]. When it returns, the device is closed (and its lock
    /// released): it can be opened again at once. `Ok` only when this close, or an earlier
    /// one, finished the loop's work: a loop that had ended otherwise (its thread panicked,
    /// its task was aborted) gives [`EngineError::Closed`], since what it had acknowledged may
    /// not be durable.
    pub async fn close(&self) -> Result<(), EngineError> {
        self.inner.closing.store(true, Ordering::Release);
        let mut result = match self.call(|tx| Msg::Close { reply: Some(tx) }).await {
            Ok(r) => r,
            Err(EngineError::Closed) if self.inner.closed.load(Ordering::Acquire) => Ok(()),
            Err(e) => Err(e),
        };
        // The loop answers, then drops the device: wait for that (it is about to happen).
        match &self.inner.runner {
            Runner::Thread(t) => {
                let thread = t.lock().take();
                if let Some(t) = thread
                    && t.join().is_err()
                {
                    result = result.and(Err(EngineError::Closed));
                }
            }
            Runner::Task(_, Some(done)) => {
                // An error means the task is gone (aborted, or its runtime stopped): released.
                if done.clone().wait_for(|d| *d).await.is_err() {
                    result = result.and(Err(EngineError::Closed));
                }
            }
            Runner::Task(_, None) => {}
        }
        if result.is_ok() {
            self.inner.closed.store(true, Ordering::Release);
        }
        result
    }
}
