//! The inside of a simulated disk: durable data, writes not yet durable, requests in flight,
//! and what a crash leaves.

use super::{Latency, SimDisk, SimStats, Spread};
use crate::io::{IoDone, IoReq, Waker};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use std::collections::BTreeMap;
use std::io;
use std::ops::Range;
use std::time::{Duration, Instant};

const SECTOR: usize = 512;

/// A write that is not durable yet.
pub(super) struct Volatile {
    pub(super) off: u64,
    pub(super) data: Vec<u8>,
    /// Completion number; `None` while in flight.
    pub(super) done: Option<u64>,
}

pub(super) enum Kind {
    Read,
    /// Key of the write in `volatile`; `None` if it fails.
    Write(Option<u64>),
    /// Writes with a completion number up to this one are covered.
    Flush(u64),
}

/// A request handed to the disk and not completed.
pub(super) struct InFlight {
    pub(super) due: Instant,
    pub(super) order: u64,
    pub(super) token: u64,
    pub(super) req: IoReq,
    pub(super) kind: Kind,
}

pub(super) struct SimState {
    /// What survives a power loss for certain. Reads see it with the completed volatile
    /// writes laid over it in completion order.
    pub(super) durable: Vec<u8>,
    /// Writes not yet durable, keyed by submission number (so in submission order).
    pub(super) volatile: BTreeMap<u64, Volatile>,
    pub(super) queue: Vec<InFlight>,
    pub(super) submitted: u64,
    pub(super) completions: u64,
    pub(super) rng: SmallRng,
    pub(super) latency: Latency,
    pub(super) fail_flushes: bool,
    pub(super) fail_writes: bool,
    /// No request completes while set (a device that hangs; see [`SimDisk::stall`]).
    pub(super) stalled: bool,
    /// Wakes the loop of the store that has the disk open (when a stall ends).
    pub(super) waker: Option<Waker>,
    pub(super) bad_reads: Vec<Range<u64>>,
    /// Reads overlapping these fail even after a write over them ([`SimDisk::fail_reads_always`]).
    pub(super) dead_reads: Vec<Range<u64>>,
    pub(super) stats: SimStats,
    /// Crash at this event number with this image seed.
    pub(super) armed: Option<(u64, u64)>,
    /// The image taken when the disk crashed; the disk is halted from then on.
    pub(super) crash: Option<SimDisk>,
    /// An armed crash happened and waiters have not been told yet.
    pub(super) announce: bool,
    /// Print every request to stderr.
    pub(super) log: bool,
    pub(super) attached: bool,
}

impl SimState {
    pub(super) fn new(image: Vec<u8>, seed: u64) -> SimState {
        SimState {
            durable: image,
            volatile: BTreeMap::new(),
            queue: Vec::new(),
            submitted: 0,
            completions: 0,
            rng: SmallRng::seed_from_u64(seed),
            latency: Latency::ZERO,
            fail_flushes: false,
            fail_writes: false,
            stalled: false,
            waker: None,
            bad_reads: Vec::new(),
            dead_reads: Vec::new(),
            stats: SimStats::default(),
            armed: None,
            crash: None,
            announce: false,
            log: false,
            attached: false,
        }
    }

    pub(super) fn halted(&self) -> bool {
        self.crash.is_some()
    }

    /// Counts a device event; takes the crash image first if one is armed for it. Returns
    /// false when the disk is (now) halted and the event must have no effect.
    pub(super) fn event(&mut self) -> bool {
        if self.halted() {
            return false;
        }
        self.stats.events += 1;
        match self.armed {
            Some((at, seed)) if self.stats.events >= at => {
                self.armed = None;
                self.crash = Some(self.image(seed));
                self.announce = true;
                if self.log {
                    eprintln!("sim disk: event {at}: power lost (armed)");
                }
                false
            }
            _ => true,
        }
    }

    pub(super) fn image(&self, seed: u64) -> SimDisk {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut image = self.durable.clone();
        for w in self.volatile.values() {
            let off = w.off as usize;
            match rng.random_range(0..3) {
                0 => {}
                1 => image[off..off + w.data.len()].copy_from_slice(&w.data),
                _ => {
                    for (i, sector) in w.data.chunks(SECTOR).enumerate() {
                        if rng.random_bool(0.5) {
                            let at = off + i * SECTOR;
                            image[at..at + sector.len()].copy_from_slice(sector);
                        }
                    }
                }
            }
        }
        SimDisk::from_image(image, rng.next_u64())
    }

    pub(super) fn check_range(&self, off: u64, len: usize) -> io::Result<usize> {
        let o = off as usize;
        if o.checked_add(len)
            .is_none_or(|end| end > self.durable.len())
        {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "I/O past the end of the sim disk",
            ));
        }
        Ok(o)
    }

    pub(super) fn read(&mut self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let o = self.check_range(off, buf.len())?;
        let end = off + buf.len() as u64;
        let overlaps = |r: &Range<u64>| r.start < end && off < r.end;
        if self.bad_reads.iter().chain(&self.dead_reads).any(overlaps) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.stats.reads += 1;
        self.view(o, buf);
        Ok(())
    }

    /// What reads see at `o`: the durable data, then every completed write not yet durable,
    /// in completion order.
    pub(super) fn view(&self, o: usize, buf: &mut [u8]) {
        let end = o + buf.len();
        buf.copy_from_slice(&self.durable[o..end]);
        let mut over: Vec<(u64, &Volatile)> = self
            .volatile
            .values()
            .filter_map(|w| w.done.map(|d| (d, w)))
            .filter(|(_, w)| (w.off as usize) < end && o < w.off as usize + w.data.len())
            .collect();
        over.sort_unstable_by_key(|(d, _)| *d);
        for (_, w) in over {
            let (ws, we) = (w.off as usize, w.off as usize + w.data.len());
            let (lo, hi) = (ws.max(o), we.min(end));
            buf[lo - o..hi - o].copy_from_slice(&w.data[lo - ws..hi - ws]);
        }
    }

    pub(super) fn draw(&mut self, s: Spread) -> Duration {
        let mut d = if s.max > s.min {
            let span = (s.max - s.min).as_nanos() as u64;
            s.min + Duration::from_nanos(self.rng.random_range(0..=span))
        } else {
            s.min
        };
        if self.latency.slow > 0.0 && self.rng.random_bool(self.latency.slow.min(1.0)) {
            d *= self.latency.slow_factor;
        }
        d
    }

    pub(super) fn submit(&mut self, now: Instant, token: u64, req: IoReq) {
        let order = self.submitted;
        self.submitted += 1;
        let (spread, kind) = match &req {
            IoReq::Read { .. } => (self.latency.read, Kind::Read),
            IoReq::Write { off, bufs, .. } => {
                let ok = self.event() && !self.fail_writes;
                let key = ok.then(|| {
                    let mut data = Vec::with_capacity(bufs.iter().map(|b| b.len()).sum());
                    for b in bufs {
                        data.extend_from_slice(b);
                    }
                    let w = Volatile {
                        off: *off,
                        data,
                        done: None,
                    };
                    self.volatile.insert(order, w);
                    order
                });
                (self.latency.write, Kind::Write(key))
            }
            IoReq::Flush => {
                self.event();
                (self.latency.flush, Kind::Flush(self.completions))
            }
        };
        let mut due = now + self.draw(spread);
        if let IoReq::Write { durable: true, .. } = &req {
            // A write and then a flush of the cache (a disk without FUA).
            due += self.draw(self.latency.flush);
        }
        if self.log {
            let (kind, off, len) = match &req {
                IoReq::Read { off, buf } => ("read", *off, buf.len()),
                IoReq::Write { off, bufs, .. } => {
                    ("write", *off, bufs.iter().map(|b| b.len()).sum())
                }
                IoReq::Flush => ("flush", 0, 0),
            };
            eprintln!(
                "sim disk: event {} issue #{order} {kind} {off}+{len}, completes in {:?}",
                self.stats.events,
                due - now
            );
        }
        self.queue.push(InFlight {
            due,
            order,
            token,
            req,
            kind,
        });
        self.stats.max_in_flight = self.stats.max_in_flight.max(self.queue.len() as u64);
    }

    /// Completes every request due by `now`, in order of due time then submission. A halted
    /// disk only completes reads (so a test can still look at what the store recovered); a
    /// stalled one completes nothing.
    pub(super) fn complete_due(&mut self, now: Instant, out: &mut Vec<IoDone>) {
        if self.stalled {
            return;
        }
        loop {
            let halted = self.halted();
            let Some(i) = (0..self.queue.len())
                .filter(|&i| {
                    let r = &self.queue[i];
                    r.due <= now && (!halted || matches!(r.kind, Kind::Read))
                })
                .min_by_key(|&i| (self.queue[i].due, self.queue[i].order))
            else {
                return;
            };
            if self.queue.iter().any(|r| r.order < self.queue[i].order) {
                self.stats.out_of_order += 1;
            }
            let r = self.queue.swap_remove(i);
            if self.log {
                eprintln!(
                    "sim disk: event {} complete #{}",
                    self.stats.events, r.order
                );
            }
            if let Some(d) = self.complete(r) {
                out.push(d);
            }
        }
    }

    pub(super) fn complete(&mut self, r: InFlight) -> Option<IoDone> {
        let InFlight {
            token,
            mut req,
            kind,
            ..
        } = r;
        let res = match (&mut req, kind) {
            (IoReq::Read { off, buf }, _) => self.read(*off, buf),
            (IoReq::Write { durable, .. }, Kind::Write(key)) => {
                if !self.event() {
                    // The crash happened first: this write never completes.
                    return None;
                }
                let res = self.write_done(key);
                match res {
                    // A durable write is a write and a flush on a disk without FUA: its flush
                    // may fail, leaving the write completed but volatile.
                    Ok(()) if *durable && self.fail_flushes => {
                        Err(io::Error::other("simulated flush failure"))
                    }
                    Ok(()) if *durable => {
                        self.harden(key.expect("a write that completed has a key"));
                        Ok(())
                    }
                    res => res,
                }
            }
            (IoReq::Flush, Kind::Flush(covers)) => {
                if !self.event() {
                    return None;
                }
                self.flush(covers)
            }
            _ => unreachable!("request and kind match"),
        };
        Some(IoDone { token, req, res })
    }

    pub(super) fn write_done(&mut self, key: Option<u64>) -> io::Result<()> {
        let Some(w) = key.and_then(|k| self.volatile.get_mut(&k)) else {
            return Err(io::Error::other("simulated write failure"));
        };
        self.completions += 1;
        w.done = Some(self.completions);
        let (off, len) = (w.off, w.data.len() as u64);
        self.stats.writes += 1;
        self.remap(off, len);
        Ok(())
    }

    /// A completed write over sectors that failed to read remaps them, as a drive does: reads
    /// of what it wrote succeed from then on.
    pub(super) fn remap(&mut self, off: u64, len: u64) {
        let end = off + len;
        self.bad_reads = std::mem::take(&mut self.bad_reads)
            .into_iter()
            .flat_map(|r| {
                if r.end <= off || end <= r.start {
                    return vec![r];
                }
                [r.start..off.max(r.start), end.min(r.end)..r.end]
                    .into_iter()
                    .filter(|p| !p.is_empty())
                    .collect()
            })
            .collect();
    }

    /// Makes durable the writes with a completion number up to `covers`, in completion order.
    pub(super) fn flush(&mut self, covers: u64) -> io::Result<()> {
        if self.fail_flushes {
            return Err(io::Error::other("simulated flush failure"));
        }
        let mut done: Vec<(u64, u64)> = self
            .volatile
            .iter()
            .filter_map(|(k, w)| w.done.filter(|&d| d <= covers).map(|d| (d, *k)))
            .collect();
        done.sort_unstable();
        for (_, k) in done {
            let w = self.volatile.remove(&k).expect("listed above");
            let o = w.off as usize;
            self.durable[o..o + w.data.len()].copy_from_slice(&w.data);
        }
        self.stats.flushes += 1;
        Ok(())
    }

    /// Makes one completed write durable by itself (a FUA write): no other write is. A real
    /// cache keeps only the newest data of a sector, so an older write not yet durable over the
    /// same sectors would be lost, never applied over it later; the store never has one (a
    /// journal record's place is reused only after a flush), and this disk checks it.
    fn harden(&mut self, key: u64) {
        let w = self
            .volatile
            .remove(&key)
            .expect("the write just completed");
        let (lo, hi) = (w.off, w.off + w.data.len() as u64);
        assert!(
            !self
                .volatile
                .values()
                .any(|o| o.off < hi && lo < o.off + o.data.len() as u64),
            "a durable write over another write not yet durable"
        );
        let o = w.off as usize;
        self.durable[o..o + w.data.len()].copy_from_slice(&w.data);
    }

    pub(super) fn write_now(&mut self, off: u64, data: &[u8]) -> io::Result<()> {
        self.check_range(off, data.len())?;
        if !self.event() {
            return Ok(());
        }
        if self.fail_writes {
            return Err(io::Error::other("simulated write failure"));
        }
        let key = self.submitted;
        self.submitted += 1;
        self.completions += 1;
        self.stats.blocking_writes += 1;
        self.volatile.insert(
            key,
            Volatile {
                off,
                data: data.to_vec(),
                done: Some(self.completions),
            },
        );
        self.stats.writes += 1;
        self.remap(off, data.len() as u64);
        Ok(())
    }
}
