//! A simulated disk that behaves like a real one with a volatile write cache, for deterministic
//! simulation, crash and fault tests.
//!
//! - Every request completes after a latency drawn from the disk's seed (in the time of the
//!   store's clock: virtual under a paused tokio runtime), so completions come out of order.
//!   Reads see the data as it is when they complete; a write is seen once it completes.
//! - A flush makes durable exactly the writes that had completed before it was issued. Writes
//!   completing later (even before the flush completes) stay volatile. A durable write
//!   (`IoReq::Write::durable`, `RWF_DSYNC`) is durable itself when it completes, and nothing
//!   else is (as a FUA write); with flushes failing, it fails and stays volatile.
//! - [`SimDisk::crash_image`] builds what a power loss now could leave: the durable image plus,
//!   for each write not yet durable (completed, or still in flight: the middle of a vectored
//!   write), nothing, all, or any subset of its 512-byte sectors.
//! - Faults: failing writes or flushes, bit flips in durable data, read errors on chosen
//!   ranges (latent sector errors), and a device that hangs ([`SimDisk::stall`]: requests are
//!   taken and never complete until the stall ends).
//! - A crash can be armed at the n-th device event (write or flush issued or completed,
//!   blocking write or sync): the disk takes the crash image at that instant and halts, so
//!   nothing it does afterwards counts (reads still complete, so a test can look at what the
//!   store holds). This reaches instants inside the blocking I/O of recovery as well as inside
//!   write-back.
//!
//! With zero latency (the default) every request completes at the next poll, in submission
//! order.

use super::{Backend, IoDone, IoReq, Waker};
use crate::clock::Clock;
pub use crate::engine::{NewestEntry, NewestHeader, newest_record, newest_record_header};
use crate::layout::{BLOCK, Superblock};
use parking_lot::Mutex;
use rand::RngCore;
use state::{Kind, SimState};
use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

mod state;
#[cfg(test)]
mod tests;

/// A shared handle to one simulated disk.
#[derive(Clone)]
pub struct SimDisk(Arc<Shared>);

struct Shared {
    state: Mutex<SimState>,
    /// Signalled when the disk crashes (see [`SimDisk::arm_crash`]).
    crashed: Notify,
    /// Signalled when a store lets go of the disk.
    released: Notify,
}

/// The latency of one kind of request: uniform between `min` and `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spread {
    pub min: Duration,
    pub max: Duration,
}

impl Spread {
    pub const ZERO: Spread = Spread::fixed(Duration::ZERO);

    pub const fn fixed(d: Duration) -> Spread {
        Spread { min: d, max: d }
    }

    pub const fn between(min: Duration, max: Duration) -> Spread {
        Spread { min, max }
    }
}

/// Per-request latencies of a simulated disk.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Latency {
    pub read: Spread,
    pub write: Spread,
    pub flush: Spread,
    /// Probability that a request takes `slow_factor` times its drawn latency (a slow tail).
    pub slow: f64,
    pub slow_factor: u32,
}

impl Latency {
    /// Every request completes at the next poll, in submission order.
    pub const ZERO: Latency = Latency {
        read: Spread::ZERO,
        write: Spread::ZERO,
        flush: Spread::ZERO,
        slow: 0.0,
        slow_factor: 1,
    };
}

/// Counters of a simulated disk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    pub reads: u64,
    pub writes: u64,
    /// Flushes completed successfully (blocking syncs included).
    pub flushes: u64,
    /// Completions delivered while a request submitted earlier was still in flight.
    pub out_of_order: u64,
    /// Most requests in flight at once.
    pub max_in_flight: u64,
    /// Device events so far (see [`SimDisk::arm_crash`]).
    pub events: u64,
    /// Blocking writes (format, recovery) that took effect.
    pub blocking_writes: u64,
}

/// Where the areas of a formatted store lie on the disk (byte ranges).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Regions {
    pub superblock: Range<u64>,
    /// Journal header copies and the ring.
    pub journal: Range<u64>,
    /// Slot-table pages (both copies).
    pub meta: Range<u64>,
    /// Object slots.
    pub slots: Range<u64>,
}

impl std::fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimDisk({} bytes)", self.size())
    }
}

impl SimDisk {
    /// A zero-filled disk of `size` bytes with seed 0 and zero latency.
    pub fn new(size: u64) -> SimDisk {
        SimDisk::seeded(size, 0)
    }

    /// A zero-filled disk of `size` bytes whose latencies (and the uuid `format_sim` gives
    /// it) come from `seed`.
    pub fn seeded(size: u64, seed: u64) -> SimDisk {
        SimDisk::from_image(vec![0; size as usize], seed)
    }

    fn from_image(image: Vec<u8>, seed: u64) -> SimDisk {
        SimDisk(Arc::new(Shared {
            state: Mutex::new(SimState::new(image, seed)),
            crashed: Notify::new(),
            released: Notify::new(),
        }))
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, SimState> {
        self.0.state.lock()
    }

    /// Runs `f` on the state, then tells waiters if an armed crash happened meanwhile.
    fn with<R>(&self, f: impl FnOnce(&mut SimState) -> R) -> R {
        let (r, announce) = {
            let mut s = self.lock();
            let r = f(&mut s);
            (r, std::mem::take(&mut s.announce))
        };
        if announce {
            self.0.crashed.notify_waiters();
        }
        r
    }

    /// Prints every request issued and completed to stderr (debugging a seed).
    pub fn set_log(&self, on: bool) {
        self.lock().log = on;
    }

    /// Sets the latency of every later request.
    pub fn set_latency(&self, latency: Latency) {
        self.lock().latency = latency;
    }

    /// Sets a fixed latency for every later flush, like a real device's cache flush (group
    /// commit can only batch writers that arrive while a flush is in flight).
    pub fn set_flush_latency(&self, latency: Duration) {
        self.lock().latency.flush = Spread::fixed(latency);
    }

    pub fn size(&self) -> u64 {
        self.lock().durable.len() as u64
    }

    /// Number of successful flushes so far.
    pub fn flushes(&self) -> u64 {
        self.lock().stats.flushes
    }

    pub fn stats(&self) -> SimStats {
        self.lock().stats.clone()
    }

    /// Writes not yet durable: in flight, or completed and not covered by a completed flush.
    pub fn unflushed_writes(&self) -> usize {
        self.lock().volatile.len()
    }

    /// Writes handed to the disk and not completed.
    pub fn writes_in_flight(&self) -> usize {
        self.lock()
            .volatile
            .values()
            .filter(|w| w.done.is_none())
            .count()
    }

    /// Makes every later flush fail with EIO (until switched off).
    pub fn fail_flushes(&self, on: bool) {
        self.lock().fail_flushes = on;
    }

    /// Makes every later write fail with EIO (until switched off).
    pub fn fail_writes(&self, on: bool) {
        self.lock().fail_writes = on;
    }

    /// Hangs the disk (`true`) like a drive whose firmware stalls or whose path died: requests
    /// the store hands it from now on, and those already in flight, do not complete (no error
    /// either) until the stall is switched off; then each completes at its due time (at once
    /// if that has passed). Blocking I/O (format, recovery) is not affected.
    pub fn stall(&self, on: bool) {
        let waker = {
            let mut s = self.lock();
            s.stalled = on;
            s.waker.clone()
        };
        if !on && let Some(w) = waker {
            w.wake();
        }
    }

    /// Makes every read overlapping `range` fail with EIO (a latent sector error), until a
    /// write over it completes (the drive remaps what it writes; a crash image has no such
    /// sectors).
    pub fn fail_reads(&self, range: Range<u64>) {
        self.lock().bad_reads.push(range);
    }

    /// Makes every read overlapping `range` fail with EIO for good, also after writes over it (a
    /// drive that can no longer remap the sectors).
    pub fn fail_reads_always(&self, range: Range<u64>) {
        self.lock().dead_reads.push(range);
    }

    /// Flips the bits of one byte, durably (simulates media corruption).
    pub fn corrupt(&self, offset: u64) {
        let mut s = self.lock();
        let o = offset as usize;
        s.durable[o] ^= 0xff;
        for w in s.volatile.values_mut() {
            let start = w.off as usize;
            if (start..start + w.data.len()).contains(&o) {
                w.data[o - start] ^= 0xff;
            }
        }
    }

    /// Flips bit `bit` (0-7) of the byte at `offset` in the durable data (and in what reads see
    /// unless a volatile write covers it): media corruption.
    pub fn flip_bit(&self, offset: u64, bit: u8) {
        self.lock().durable[offset as usize] ^= 1u8 << (bit % 8);
    }

    /// Writes `data` at `offset`, durably (another program writing to the device): volatile
    /// writes that overlap it are changed too, so reads see `data`.
    pub fn overwrite(&self, offset: u64, data: &[u8]) {
        let mut s = self.lock();
        let o = offset as usize;
        s.durable[o..o + data.len()].copy_from_slice(data);
        s.remap(offset, data.len() as u64);
        for w in s.volatile.values_mut() {
            let (start, end) = (w.off as usize, w.off as usize + w.data.len());
            for (i, b) in data.iter().enumerate() {
                if (start..end).contains(&(o + i)) {
                    w.data[o + i - start] = *b;
                }
            }
        }
    }

    /// What reads currently return at `offset`.
    pub fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.lock().view(offset as usize, &mut v);
        v
    }

    /// The durable image (what survives a power loss for certain).
    pub fn durable(&self) -> Vec<u8> {
        self.lock().durable.clone()
    }

    /// A hash of the durable image (CRC-32C and length), to compare runs.
    pub fn durable_hash(&self) -> u64 {
        let s = self.lock();
        u64::from(crate::crc::crc32c(&s.durable)) | ((s.durable.len() as u64) << 32)
    }

    /// The disk a power loss now could leave (see the module documentation). Its own seed comes
    /// from `seed`; it has zero latency and no faults.
    pub fn crash_image(&self, seed: u64) -> SimDisk {
        self.lock().image(seed)
    }

    /// Loses power now: takes the crash image and halts (no write or flush completes any more,
    /// blocking writes and syncs have no effect; reads still work). Returns the image.
    pub fn crash(&self, seed: u64) -> SimDisk {
        let image = {
            let mut s = self.lock();
            if let Some(img) = &s.crash {
                return img.clone();
            }
            let img = s.image(seed);
            s.crash = Some(img.clone());
            img
        };
        self.0.crashed.notify_waiters();
        image
    }

    /// Loses power at the `n`-th device event from now (1 = the next one): a write or flush
    /// issued or completed, or a blocking write or sync. Until then the disk works normally.
    pub fn arm_crash(&self, n: u64, seed: u64) {
        let mut s = self.lock();
        let at = s.stats.events + n.max(1);
        s.armed = Some((at, seed));
    }

    /// The crash image if the disk has crashed.
    pub fn crashed(&self) -> Option<SimDisk> {
        self.lock().crash.clone()
    }

    /// Waits until the disk crashes ([`SimDisk::crash`] or an armed crash).
    pub async fn wait_crash(&self) {
        loop {
            let n = self.0.crashed.notified();
            if self.crashed().is_some() {
                return;
            }
            n.await;
        }
    }

    /// Waits until no store has the disk open.
    pub async fn released(&self) {
        loop {
            let n = self.0.released.notified();
            if !self.lock().attached {
                return;
            }
            n.await;
        }
    }

    /// The areas of the store formatted on this disk, if any.
    pub fn regions(&self) -> Option<Regions> {
        let sb = Superblock::decode(&self.read(0, BLOCK as usize)).ok()??;
        // The tables (slots, tombstones, PGs) lie back to back after the journal.
        Some(Regions {
            superblock: 0..BLOCK,
            journal: sb.journal_offset..sb.journal_offset + sb.journal_size,
            meta: sb.slots.offset..sb.pgs.end(),
            slots: sb.data_offset..sb.data_offset + sb.capacity_bytes(),
        })
    }

    /// A uuid drawn from the disk's seed (for `format_sim`).
    pub(crate) fn uuid(&self) -> [u8; 16] {
        let mut u = [0u8; 16];
        self.lock().rng.fill_bytes(&mut u);
        u
    }

    /// A random number drawn from the disk's seed.
    pub(crate) fn random_u64(&self) -> u64 {
        self.lock().rng.next_u64()
    }

    pub(crate) fn read_into(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.lock().read(off, buf)
    }

    /// A blocking write (format, recovery): completes at once, not durable until a flush.
    pub(crate) fn write(&self, off: u64, data: &[u8]) -> io::Result<()> {
        self.with(|s| s.write_now(off, data))
    }

    /// A blocking flush: every completed write becomes durable.
    pub(crate) fn flush(&self) -> io::Result<()> {
        self.with(|s| {
            if !s.event() {
                return Ok(());
            }
            let covers = s.completions;
            s.flush(covers)
        })
    }

    fn attach(&self, waker: &Waker) -> io::Result<()> {
        let mut s = self.lock();
        if s.attached {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                "the sim disk is open in another store",
            ));
        }
        s.attached = true;
        s.waker = Some(waker.clone());
        Ok(())
    }

    fn detach(&self) {
        {
            let mut s = self.lock();
            s.attached = false;
            s.waker = None;
        }
        self.0.released.notify_waiters();
    }
}

/// The backend over a [`SimDisk`]: requests go to the disk at submission and complete, at their
/// due time on the store's clock, in the first poll after it.
pub(crate) struct SimBackend {
    disk: SimDisk,
    clock: Clock,
    waker: Waker,
}

impl SimBackend {
    /// Fails if another store has the disk open.
    pub fn new(disk: SimDisk, clock: Clock) -> io::Result<SimBackend> {
        let waker = match clock {
            Clock::Os => Waker::condvar(),
            Clock::Runtime => Waker::notify(),
        };
        disk.attach(&waker)?;
        Ok(SimBackend { disk, clock, waker })
    }
}

impl Drop for SimBackend {
    fn drop(&mut self) {
        self.disk.detach();
    }
}

impl Backend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn submit(&mut self, token: u64, req: IoReq) {
        let now = self.clock.now();
        self.disk.with(|s| s.submit(now, token, req));
    }

    fn poll(&mut self, out: &mut Vec<IoDone>, wait: Option<Option<Duration>>) {
        let now = self.clock.now();
        self.disk.with(|s| s.complete_due(now, out));
        if !out.is_empty() {
            return;
        }
        let Some(timeout) = wait else { return };
        let next = self.next_event().map(|t| t.saturating_duration_since(now));
        let timeout = match (timeout, next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.waker.wait_cond(timeout);
        let now = self.clock.now();
        self.disk.with(|s| s.complete_due(now, out));
    }

    fn next_event(&self) -> Option<Instant> {
        let s = self.disk.lock();
        if s.stalled {
            return None;
        }
        let halted = s.halted();
        s.queue
            .iter()
            .filter(|r| !halted || matches!(r.kind, Kind::Read))
            .map(|r| r.due)
            .min()
    }

    fn waker(&self) -> Waker {
        self.waker.clone()
    }
}
