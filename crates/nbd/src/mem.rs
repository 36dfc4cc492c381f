//! [`MemExport`] and [`MemCatalog`]: a RAM-backed backend for tests and benchmarks.
//!
//! The export is sparse (64 KiB chunks allocated on first write) and counts every operation.
//! [`MemExport::volatile`] models a disk with a write-back cache: writes are visible at once
//! but survive [`MemExport::crash`] only after a flush (or with FUA), so tests can check that
//! the server's FLUSH and FUA replies come only after the data is durable.

use crate::export::{Catalog, Export, ExportError, ExportErrorKind, ExportInfo};
use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const CHUNK: u64 = 64 << 10;

#[derive(Default)]
struct Chunk {
    /// Current contents; `None` reads as zeroes (a hole).
    data: Option<Box<[u8]>>,
    /// Contents that survive a crash (volatile exports only).
    durable: Option<Box<[u8]>>,
    dirty: bool,
}

/// Operation counts of a [`MemExport`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemStats {
    pub reads: u64,
    pub writes: u64,
    pub fua_writes: u64,
    pub flushes: u64,
    pub trims: u64,
    pub write_zeroes: u64,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    fua_writes: AtomicU64,
    flushes: AtomicU64,
    trims: AtomicU64,
    write_zeroes: AtomicU64,
}

/// A RAM-backed export.
pub struct MemExport {
    size: u64,
    chunks: Vec<RwLock<Chunk>>,
    volatile: bool,
    read_only: bool,
    description: Option<String>,
    counters: Counters,
    has_delay: AtomicBool,
    delay: Mutex<Option<(Range<u64>, Duration)>>,
    in_flight: AtomicU64,
}

/// Counts an operation as in flight until dropped.
struct InFlight<'a>(&'a AtomicU64);

impl<'a> InFlight<'a> {
    fn start(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::AcqRel);
        InFlight(gauge)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for MemExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemExport")
            .field("size", &self.size)
            .field("volatile", &self.volatile)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

impl MemExport {
    /// A zero-filled export whose writes are durable as soon as they complete.
    pub fn new(size: u64) -> Self {
        let chunks = size.div_ceil(CHUNK) as usize;
        MemExport {
            size,
            chunks: (0..chunks).map(|_| RwLock::new(Chunk::default())).collect(),
            volatile: false,
            read_only: false,
            description: None,
            counters: Counters::default(),
            has_delay: AtomicBool::new(false),
            delay: Mutex::new(None),
            in_flight: AtomicU64::new(0),
        }
    }

    /// An export with a write-back cache: see [`MemExport::crash`].
    pub fn volatile(size: u64) -> Self {
        MemExport {
            volatile: true,
            ..MemExport::new(size)
        }
    }

    pub fn with_read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// Fills the export from `data` (starting at offset 0), bypassing counters and caches.
    pub fn fill(&self, data: &[u8]) {
        self.copy_in(0, data, true);
    }

    /// Makes every operation touching `range` wait `delay` before it starts (tests of
    /// out-of-order replies and of shutdown with requests in flight).
    pub fn set_delay(&self, range: Range<u64>, delay: Duration) {
        *self.delay.lock() = Some((range, delay));
        self.has_delay.store(true, Ordering::Release);
    }

    pub fn clear_delay(&self) {
        self.has_delay.store(false, Ordering::Release);
        *self.delay.lock() = None;
    }

    /// Forgets every write not yet made durable (volatile exports; no-op otherwise).
    pub fn crash(&self) {
        if !self.volatile {
            return;
        }
        for chunk in &self.chunks {
            let mut c = chunk.write();
            c.data = c.durable.clone();
            c.dirty = false;
        }
    }

    pub fn stats(&self) -> MemStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MemStats {
            reads: get(&c.reads),
            writes: get(&c.writes),
            fua_writes: get(&c.fua_writes),
            flushes: get(&c.flushes),
            trims: get(&c.trims),
            write_zeroes: get(&c.write_zeroes),
        }
    }

    /// Operations started and not yet finished.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Number of 64 KiB chunks holding data (holes are not counted).
    pub fn allocated_chunks(&self) -> usize {
        self.chunks
            .iter()
            .filter(|c| c.read().data.is_some())
            .count()
    }

    /// A copy of `len` bytes at `offset` (test helper, no counters, no delay).
    pub fn snapshot(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        self.copy_out(offset, len, &mut out);
        out
    }

    async fn maybe_delay(&self, offset: u64, len: u64) {
        if !self.has_delay.load(Ordering::Acquire) {
            return;
        }
        let delay = self.delay.lock().clone();
        if let Some((range, d)) = delay
            && offset < range.end
            && range.start < offset + len.max(1)
        {
            tokio::time::sleep(d).await;
        }
    }

    /// Visits the chunks under `offset..offset+len` as (chunk index, range within the chunk).
    fn spans(offset: u64, len: u64) -> impl Iterator<Item = (usize, Range<usize>)> {
        let end = offset + len;
        let mut pos = offset;
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            let idx = pos / CHUNK;
            let start = (pos % CHUNK) as usize;
            let stop = ((end - idx * CHUNK).min(CHUNK)) as usize;
            pos = (idx + 1) * CHUNK;
            Some((idx as usize, start..stop))
        })
    }

    fn chunk_len(&self, idx: usize) -> usize {
        (self.size - idx as u64 * CHUNK).min(CHUNK) as usize
    }

    fn copy_out(&self, offset: u64, len: usize, out: &mut Vec<u8>) {
        for (idx, r) in Self::spans(offset, len as u64) {
            match &self.chunks[idx].read().data {
                Some(data) => out.extend_from_slice(&data[r]),
                None => out.resize(out.len() + r.len(), 0),
            }
        }
    }

    fn copy_in(&self, offset: u64, data: &[u8], durable: bool) {
        let mut src = data;
        for (idx, r) in Self::spans(offset, data.len() as u64) {
            let (now, rest) = src.split_at(r.len());
            src = rest;
            let mut c = self.chunks[idx].write();
            let len = self.chunk_len(idx);
            c.data
                .get_or_insert_with(|| vec![0; len].into_boxed_slice())[r]
                .copy_from_slice(now);
            self.settle(&mut c, durable);
        }
    }

    /// Zeroes a range; without `keep_allocated`, whole chunks become holes.
    fn zero(&self, offset: u64, len: u64, keep_allocated: bool, durable: bool) {
        for (idx, r) in Self::spans(offset, len) {
            let mut c = self.chunks[idx].write();
            let whole = r.len() == self.chunk_len(idx);
            if whole && !keep_allocated {
                c.data = None;
            } else if let Some(data) = c.data.as_mut() {
                data[r].fill(0);
            } else if keep_allocated {
                c.data = Some(vec![0; self.chunk_len(idx)].into_boxed_slice());
            }
            self.settle(&mut c, durable);
        }
    }

    /// After a change: durable now (FUA, or a non-volatile export), or dirty until a flush.
    fn settle(&self, c: &mut Chunk, durable: bool) {
        if !self.volatile {
            return;
        }
        if durable {
            c.durable = c.data.clone();
            c.dirty = false;
        } else {
            c.dirty = true;
        }
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(ExportError::new(
                ExportErrorKind::InvalidArgument,
                format!("{len} bytes at {offset} pass the end ({})", self.size),
            ));
        }
        Ok(())
    }

    fn check_write(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        if self.read_only {
            return Err(ExportError::new(
                ExportErrorKind::ReadOnly,
                "export is read-only",
            ));
        }
        self.check(offset, len)
    }
}

impl Export for MemExport {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn can_multi_conn(&self) -> bool {
        // One shared memory image: every connection sees every write, and a flush covers all.
        true
    }

    fn description(&self) -> Option<String> {
        self.description.clone()
    }

    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, ExportError> {
        let _op = InFlight::start(&self.in_flight);
        self.check(offset, len as u64)?;
        self.maybe_delay(offset, len as u64).await;
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        let mut out = Vec::with_capacity(len as usize);
        self.copy_out(offset, len as usize, &mut out);
        Ok(Bytes::from(out))
    }

    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), ExportError> {
        let _op = InFlight::start(&self.in_flight);
        self.check_write(offset, data.len() as u64)?;
        self.maybe_delay(offset, data.len() as u64).await;
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        if fua {
            self.counters.fua_writes.fetch_add(1, Ordering::Relaxed);
        }
        self.copy_in(offset, &data, fua);
        Ok(())
    }

    async fn flush(&self) -> Result<(), ExportError> {
        let _op = InFlight::start(&self.in_flight);
        self.maybe_delay(0, self.size).await;
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        if self.volatile {
            for chunk in &self.chunks {
                let mut c = chunk.write();
                if c.dirty {
                    c.durable = c.data.clone();
                    c.dirty = false;
                }
            }
        }
        Ok(())
    }

    async fn trim(&self, offset: u64, len: u32) -> Result<(), ExportError> {
        let _op = InFlight::start(&self.in_flight);
        self.check_write(offset, len as u64)?;
        self.maybe_delay(offset, len as u64).await;
        self.counters.trims.fetch_add(1, Ordering::Relaxed);
        self.zero(offset, len as u64, false, false);
        Ok(())
    }

    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
        no_hole: bool,
    ) -> Result<(), ExportError> {
        let _op = InFlight::start(&self.in_flight);
        self.check_write(offset, len as u64)?;
        self.maybe_delay(offset, len as u64).await;
        self.counters.write_zeroes.fetch_add(1, Ordering::Relaxed);
        self.zero(offset, len as u64, no_hole, fua);
        Ok(())
    }
}

/// A set of named [`MemExport`]s.
#[derive(Debug, Default)]
pub struct MemCatalog {
    exports: RwLock<BTreeMap<String, Arc<MemExport>>>,
    default: Option<String>,
}

impl MemCatalog {
    pub fn new() -> Self {
        MemCatalog::default()
    }

    /// Makes `name` the export an empty export name opens.
    pub fn with_default(mut self, name: impl Into<String>) -> Self {
        self.default = Some(name.into());
        self
    }

    /// Adds (or replaces) an export and returns it.
    pub fn add(&self, name: impl Into<String>, export: MemExport) -> Arc<MemExport> {
        let export = Arc::new(export);
        self.exports
            .write()
            .insert(name.into(), Arc::clone(&export));
        export
    }

    pub fn get(&self, name: &str) -> Option<Arc<MemExport>> {
        self.exports.read().get(name).cloned()
    }
}

impl Catalog for MemCatalog {
    type Export = MemExport;

    async fn list(&self) -> Result<Vec<ExportInfo>, ExportError> {
        Ok(self
            .exports
            .read()
            .iter()
            .map(|(name, e)| ExportInfo {
                name: name.clone(),
                size: e.size,
                description: e.description.clone().unwrap_or_default(),
            })
            .collect())
    }

    async fn open(&self, name: &str) -> Result<Arc<MemExport>, ExportError> {
        self.get(name).ok_or_else(|| ExportError::not_found(name))
    }

    fn default_export(&self) -> Option<String> {
        self.default.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    #[test]
    fn spans_cover_the_range_exactly() {
        let spans: Vec<_> = MemExport::spans(CHUNK - 10, CHUNK + 20).collect();
        assert_eq!(
            spans,
            vec![
                (0, (CHUNK - 10) as usize..CHUNK as usize),
                (1, 0..CHUNK as usize),
                (2, 0..10)
            ]
        );
        assert_eq!(MemExport::spans(5, 0).count(), 0);
    }

    #[test]
    fn reads_see_writes_across_chunks_and_holes_read_as_zero() {
        block_on(async {
            let e = MemExport::new(3 * CHUNK + 100);
            let data: Vec<u8> = (0..CHUNK + 50).map(|i| (i % 251) as u8).collect();
            e.write(CHUNK - 25, Bytes::from(data.clone()), false)
                .await
                .unwrap();
            let got = e.read(CHUNK - 25, data.len() as u32).await.unwrap();
            assert_eq!(&got[..], &data[..]);
            let tail = e.read(3 * CHUNK, 100).await.unwrap();
            assert_eq!(&tail[..], &[0u8; 100][..]);
            assert!(e.read(3 * CHUNK, 101).await.is_err());
            // The write touched chunks 0, 1 and 2; chunk 3 is still a hole.
            assert_eq!(e.allocated_chunks(), 3);
        });
    }

    #[test]
    fn volatile_export_loses_unflushed_writes_on_crash() {
        block_on(async {
            let e = MemExport::volatile(CHUNK * 2);
            e.write(0, Bytes::from_static(b"flushed"), false)
                .await
                .unwrap();
            e.flush().await.unwrap();
            e.write(CHUNK, Bytes::from_static(b"fua"), true)
                .await
                .unwrap();
            e.write(100, Bytes::from_static(b"lost"), false)
                .await
                .unwrap();
            e.crash();
            assert_eq!(e.snapshot(0, 7), b"flushed");
            assert_eq!(e.snapshot(CHUNK, 3), b"fua");
            assert_eq!(e.snapshot(100, 4), [0u8; 4]);
            assert_eq!(e.stats().flushes, 1);
            assert_eq!(e.stats().fua_writes, 1);
        });
    }

    #[test]
    fn write_zeroes_keeps_allocation_only_with_no_hole() {
        block_on(async {
            let e = MemExport::new(CHUNK * 2);
            e.fill(&vec![1u8; (CHUNK * 2) as usize]);
            e.write_zeroes(0, CHUNK as u32, false, true).await.unwrap();
            assert_eq!(e.allocated_chunks(), 2);
            e.write_zeroes(CHUNK, CHUNK as u32, false, false)
                .await
                .unwrap();
            assert_eq!(e.allocated_chunks(), 1);
            assert!(e.snapshot(0, (CHUNK * 2) as usize).iter().all(|&b| b == 0));
        });
    }
}
