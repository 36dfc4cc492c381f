//! The public handle: a cheap, cloneable front for the store's I/O thread. Every method sends
//! one message to the thread and awaits its reply; nothing here touches the device.

use crate::engine::{Msg, Reply, Shared, WKind, WriteOp};
use crate::error::EngineError;
use crate::io::Waker;
use crate::io::file::Dev;
use crate::io::sim::SimDisk;
use crate::layout::PG_BLOB;
use crate::{
    LogEntry, ObjectImage, ObjectInfo, OpenOptions, PgInfo, StoreInfo, StoreStats, WriteOptions,
};
use basalt_types::{ObjectId, PgId, PoolId, Version, VolumeId};
use bytes::Bytes;
use crossbeam_channel::Sender;
use parking_lot::Mutex;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use tokio::sync::oneshot;

/// An open store. Clones share one I/O thread; the thread stops when the last clone is
/// dropped (after finishing queued work) or on [`Store::close`].
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    tx: Sender<Msg>,
    waker: Waker,
    info: StoreInfo,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Ask the thread to finish queued work and stop, then wait for it.
        if self.tx.send(Msg::Close { reply: None }).is_ok() {
            self.waker.wake();
        }
        if let Some(t) = self.thread.lock().take() {
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

impl Store {
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

    /// Opens a store on a simulated disk (tests).
    pub fn open_sim(disk: &SimDisk, opts: &OpenOptions) -> Result<Store, EngineError> {
        Store::start(Dev::Sim(disk.clone()), Path::new("<sim>"), opts)
    }

    fn start(dev: Dev, path: &Path, opts: &OpenOptions) -> Result<Store, EngineError> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let engine = crate::engine::Engine::open(dev, path, opts, rx)?;
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
                thread: Mutex::new(Some(thread)),
            }),
        })
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
            writeback_batches: get(&s.writeback_batches),
        }
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

    /// Reads `len` bytes at `offset` of `oid`. Never-written, trimmed and deleted ranges read
    /// as zeros. Waits while the object has held (uncommitted) writes.
    pub async fn read(&self, oid: ObjectId, offset: u32, len: u32) -> Result<Bytes, EngineError> {
        Ok(self.read_versioned(oid, offset, len).await?.0)
    }

    /// [`Store::read`], with the object's version the bytes were read at.
    pub async fn read_versioned(
        &self,
        oid: ObjectId,
        offset: u32,
        len: u32,
    ) -> Result<(Bytes, Version), EngineError> {
        self.check_range(offset, u64::from(len))?;
        if len == 0 {
            let v = self
                .object_info(oid)
                .await?
                .map_or(Version::NONE, |o| o.version);
            return Ok((Bytes::new(), v));
        }
        self.call(|reply| Msg::Read {
            oid,
            offset,
            len,
            reply,
        })
        .await?
    }

    /// The whole object with its version and allocation, read atomically (recovery).
    pub async fn read_object(&self, oid: ObjectId) -> Result<ObjectImage, EngineError> {
        self.call(|reply| Msg::ReadObject { oid, reply }).await?
    }

    async fn write_op(
        &self,
        oid: ObjectId,
        offset: u32,
        kind: WKind,
        opts: WriteOptions,
    ) -> Result<Version, EngineError> {
        self.call(|tx| Msg::Write(WriteOp::new(oid, offset, kind, opts, Reply::Version(tx))))
            .await?
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
        self.check_range(offset, data.len() as u64)?;
        if data.is_empty() {
            return Err(EngineError::invalid("empty write"));
        }
        self.write_op(oid, offset, WKind::Data(data), opts).await
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
        self.check_range(offset, u64::from(len))?;
        if len == 0 {
            return Err(EngineError::invalid("empty write-zeroes"));
        }
        self.write_op(oid, offset, WKind::Zero(len), opts).await
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
        self.write_op(oid, 0, WKind::Delete, opts).await
    }

    /// Forgets an object entirely, tombstone included (a PG or volume that goes away).
    pub async fn purge(&self, oid: ObjectId, opts: WriteOptions) -> Result<(), EngineError> {
        let kind = WKind::Purge {
            only_tombstone_upto: None,
        };
        self.write_op(oid, 0, kind, opts).await.map(|_| ())
    }

    /// Replaces an object with `image` whatever its current version (recovery, and rolling
    /// back a write that peering rejected). Held writes of the object are dropped.
    pub async fn install(
        &self,
        oid: ObjectId,
        image: ObjectImage,
        opts: WriteOptions,
    ) -> Result<(), EngineError> {
        self.write_op(oid, 0, WKind::Install(image), opts)
            .await
            .map(|_| ())
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
        self.call(|reply| Msg::Flush { reply }).await?
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
        self.call(|reply| Msg::SetPg {
            pg,
            blob: blob.map(Box::new),
            durable,
            reply,
        })
        .await?
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

    /// Finishes queued work, writes the journal back, flushes and stops the I/O thread.
    /// Idempotent; afterwards every call returns [`EngineError::Closed`]. When it returns, the
    /// device is closed (and its lock released): it can be opened again at once.
    pub async fn close(&self) -> Result<(), EngineError> {
        let result = match self.call(|tx| Msg::Close { reply: Some(tx) }).await {
            Ok(r) => r,
            Err(EngineError::Closed) => Ok(()),
            Err(e) => Err(e),
        };
        // The thread answers, then drops the device: wait for that (it is about to happen).
        let thread = self.inner.thread.lock().take();
        if let Some(t) = thread {
            let _ = t.join();
        }
        result
    }
}
