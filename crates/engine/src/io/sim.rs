//! A simulated disk with a volatile write cache, for crash and fault tests.
//!
//! Every write lands in the "current" image (what reads see) and in a list of unflushed
//! writes; a flush makes them durable. [`SimDisk::crash_image`] builds what a power loss could
//! leave behind: the durable image plus a random subset of the unflushed writes, some of them
//! torn at 512-byte granularity. Faults (failing flushes or writes) can be switched on at any
//! time to test the store's poisoning.

use super::{Backend, IoDone, IoReq, Waker};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A shared handle to one simulated disk.
#[derive(Clone)]
pub struct SimDisk(Arc<Mutex<SimState>>);

struct SimState {
    current: Vec<u8>,
    durable: Vec<u8>,
    unflushed: Vec<(u64, Vec<u8>)>,
    fail_flushes: bool,
    fail_writes: bool,
    flushes: u64,
    flush_latency: Duration,
}

const SECTOR: usize = 512;

impl std::fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimDisk({} bytes)", self.size())
    }
}

impl SimDisk {
    /// A zero-filled disk of `size` bytes.
    pub fn new(size: u64) -> SimDisk {
        let size = size as usize;
        SimDisk(Arc::new(Mutex::new(SimState {
            current: vec![0; size],
            durable: vec![0; size],
            unflushed: Vec::new(),
            fail_flushes: false,
            fail_writes: false,
            flushes: 0,
            flush_latency: Duration::ZERO,
        })))
    }

    /// Delays the completion of every later flush, like a real device's cache flush (group
    /// commit can only batch writers that arrive while a flush is in flight).
    pub fn set_flush_latency(&self, latency: Duration) {
        self.0.lock().flush_latency = latency;
    }

    pub fn size(&self) -> u64 {
        self.0.lock().current.len() as u64
    }

    /// Number of successful flushes so far.
    pub fn flushes(&self) -> u64 {
        self.0.lock().flushes
    }

    /// Writes not yet flushed.
    pub fn unflushed_writes(&self) -> usize {
        self.0.lock().unflushed.len()
    }

    /// Makes every later flush fail with EIO (until switched off).
    pub fn fail_flushes(&self, on: bool) {
        self.0.lock().fail_flushes = on;
    }

    /// Makes every later write fail with EIO (until switched off).
    pub fn fail_writes(&self, on: bool) {
        self.0.lock().fail_writes = on;
    }

    /// Flips the bits of one byte, durably (simulates media corruption).
    pub fn corrupt(&self, offset: u64) {
        let mut s = self.0.lock();
        let o = offset as usize;
        s.current[o] ^= 0xff;
        s.durable[o] ^= 0xff;
        for (off, data) in s.unflushed.iter_mut() {
            let start = *off as usize;
            if (start..start + data.len()).contains(&o) {
                data[o - start] ^= 0xff;
            }
        }
    }

    /// Writes `data` at `offset`, durably (another program writing to the device).
    pub fn overwrite(&self, offset: u64, data: &[u8]) {
        let mut s = self.0.lock();
        let o = offset as usize;
        s.current[o..o + data.len()].copy_from_slice(data);
        s.durable[o..o + data.len()].copy_from_slice(data);
    }

    /// What reads currently return at `offset`.
    pub fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let s = self.0.lock();
        s.current[offset as usize..offset as usize + len].to_vec()
    }

    /// The disk a power loss now could leave: durable data plus, for each unflushed write in
    /// order, either nothing, all of it, or a random subset of its 512-byte sectors.
    pub fn crash_image(&self, seed: u64) -> SimDisk {
        let s = self.0.lock();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut image = s.durable.clone();
        for (off, data) in &s.unflushed {
            let off = *off as usize;
            match rng.random_range(0..3) {
                0 => {}
                1 => image[off..off + data.len()].copy_from_slice(data),
                _ => {
                    for (i, sector) in data.chunks(SECTOR).enumerate() {
                        if rng.random_bool(0.5) {
                            let at = off + i * SECTOR;
                            image[at..at + sector.len()].copy_from_slice(sector);
                        }
                    }
                }
            }
        }
        SimDisk(Arc::new(Mutex::new(SimState {
            current: image.clone(),
            durable: image,
            unflushed: Vec::new(),
            fail_flushes: false,
            fail_writes: false,
            flushes: 0,
            flush_latency: Duration::ZERO,
        })))
    }

    pub(crate) fn read_into(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let s = self.0.lock();
        let o = off as usize;
        let src = s.current.get(o..o + buf.len()).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the sim disk",
            )
        })?;
        buf.copy_from_slice(src);
        Ok(())
    }

    pub(crate) fn write(&self, off: u64, data: &[u8]) -> io::Result<()> {
        self.write_parts(off, &[data])
    }

    fn write_parts(&self, off: u64, parts: &[&[u8]]) -> io::Result<()> {
        let mut s = self.0.lock();
        if s.fail_writes {
            return Err(io::Error::other("simulated write failure"));
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let o = off as usize;
        if o + len > s.current.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "write past the end of the sim disk",
            ));
        }
        let mut all = Vec::with_capacity(len);
        for p in parts {
            all.extend_from_slice(p);
        }
        s.current[o..o + len].copy_from_slice(&all);
        s.unflushed.push((off, all));
        Ok(())
    }

    pub(crate) fn flush(&self) -> io::Result<()> {
        let mut s = self.0.lock();
        if s.fail_flushes {
            return Err(io::Error::other("simulated flush failure"));
        }
        let pending = std::mem::take(&mut s.unflushed);
        for (off, data) in pending {
            let o = off as usize;
            s.durable[o..o + data.len()].copy_from_slice(&data);
        }
        s.flushes += 1;
        Ok(())
    }
}

/// The backend over a [`SimDisk`]: requests execute at submission, completions are delivered
/// by the next poll.
pub(crate) struct SimBackend {
    disk: SimDisk,
    done: Vec<IoDone>,
    /// Completions held back until their time (flush latency).
    delayed: Vec<(Instant, IoDone)>,
    waker: Waker,
}

impl SimBackend {
    pub fn new(disk: SimDisk) -> SimBackend {
        SimBackend {
            disk,
            done: Vec::new(),
            delayed: Vec::new(),
            waker: Waker::condvar(),
        }
    }
}

impl Backend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn submit(&mut self, token: u64, mut req: IoReq) {
        let res = match &mut req {
            IoReq::Read { off, buf } => self.disk.read_into(*off, buf),
            IoReq::Write { off, bufs } => {
                let parts: Vec<&[u8]> = bufs.iter().map(|b| &**b).collect();
                self.disk.write_parts(*off, &parts)
            }
            IoReq::Flush => {
                let latency = self.disk.0.lock().flush_latency;
                if !latency.is_zero() {
                    // The flush takes effect when it completes, as on a real device.
                    self.delayed.push((
                        Instant::now() + latency,
                        IoDone {
                            token,
                            req,
                            res: Ok(()),
                        },
                    ));
                    return;
                }
                self.disk.flush()
            }
        };
        self.done.push(IoDone { token, req, res });
    }

    fn poll(&mut self, out: &mut Vec<IoDone>, wait: Option<Option<Duration>>) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.delayed.len() {
            if self.delayed[i].0 <= now {
                let (_, mut d) = self.delayed.swap_remove(i);
                d.res = self.disk.flush();
                self.done.push(d);
            } else {
                i += 1;
            }
        }
        if self.done.is_empty()
            && let Some(timeout) = wait
        {
            let next = self
                .delayed
                .iter()
                .map(|(t, _)| t.saturating_duration_since(now))
                .min();
            let timeout = match (timeout, next) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            self.waker.wait_cond(timeout);
        }
        out.append(&mut self.done);
    }

    fn waker(&self) -> Waker {
        self.waker.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_keeps_flushed_and_maybe_unflushed() {
        let d = SimDisk::new(8192);
        d.write(0, &[1u8; 4096]).unwrap();
        d.flush().unwrap();
        d.write(4096, &[2u8; 4096]).unwrap();
        let mut saw = [false; 3];
        for seed in 0..64 {
            let img = d.crash_image(seed);
            assert_eq!(img.read(0, 4096), vec![1u8; 4096]);
            let second = img.read(4096, 4096);
            let twos = second.iter().filter(|&&b| b == 2).count();
            saw[if twos == 0 {
                0
            } else if twos == 4096 {
                1
            } else {
                2
            }] = true;
        }
        assert_eq!(saw, [true; 3], "drop, keep and tear all happen");
    }

    #[test]
    fn faults() {
        let d = SimDisk::new(4096);
        d.fail_flushes(true);
        assert!(d.flush().is_err());
        d.fail_writes(true);
        assert!(d.write(0, &[0; 512]).is_err());
    }
}
