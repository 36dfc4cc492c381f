//! The public handle: a cheap, cloneable front for the store's I/O thread. Every method sends
//! one message to the thread and awaits its reply; nothing here touches the device.

use crate::engine::{Msg, Reply, Shared, WKind, WriteOp};
use crate::error::EngineError;
use crate::io::Waker;
use crate::io::file::Dev;
use crate::io::sim::SimDisk;
use crate::{ObjectInfo, OpenOptions, StoreInfo, StoreStats, WriteOptions};
use basalt_types::{ObjectId, PoolId, Version, VolumeId};
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

    /// Reads `len` bytes at `offset` of `oid`. Never-written and trimmed ranges read as zeros.
    pub async fn read(&self, oid: ObjectId, offset: u32, len: u32) -> Result<Bytes, EngineError> {
        self.check_range(offset, u64::from(len))?;
        if len == 0 {
            return Ok(Bytes::new());
        }
        self.call(|reply| Msg::Read {
            oid,
            offset,
            len,
            reply,
        })
        .await?
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
    /// allocated block is removed and its slot freed. On an object that does not exist this is
    /// a no-op returning version 0.
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

    /// Removes an object (no-op if it does not exist). Its version is forgotten.
    pub async fn delete(&self, oid: ObjectId, opts: WriteOptions) -> Result<(), EngineError> {
        self.call(|tx| Msg::Write(WriteOp::new(oid, 0, WKind::Delete, opts, Reply::Unit(tx))))
            .await?
    }

    /// Removes every object of a volume, durably. Returns how many were removed.
    pub async fn delete_volume(&self, pool: PoolId, volume: VolumeId) -> Result<u64, EngineError> {
        let oids = self
            .call(|reply| Msg::List {
                filter: Some((pool, volume)),
                reply,
            })
            .await?;
        let count = oids.len() as u64;
        for chunk in oids.chunks(1024) {
            let deletes = chunk
                .iter()
                .map(|o| self.delete(o.oid, WriteOptions::buffered()));
            for r in futures::future::join_all(deletes).await {
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

    /// Version and allocation of one object; `None` if it does not exist.
    pub async fn object_info(&self, oid: ObjectId) -> Result<Option<ObjectInfo>, EngineError> {
        self.call(|reply| Msg::ObjectInfo { oid, reply }).await
    }

    /// Every object on the device, in no particular order.
    pub async fn list_objects(&self) -> Result<Vec<ObjectInfo>, EngineError> {
        self.call(|reply| Msg::List {
            filter: None,
            reply,
        })
        .await
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
