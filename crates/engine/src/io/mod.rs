//! Device I/O for the store's thread: one [`Backend`] per device, chosen at open time.
//!
//! - [`uring`]: io_uring with O_DIRECT, batched submission, an eventfd for wake-ups.
//! - [`psync`]: pread/pwritev/fdatasync on a small worker pool (when io_uring is unavailable).
//! - [`sim`]: an in-memory disk with a volatile write cache and seeded latencies, for the
//!   deterministic simulation, crash and fault tests.
//!
//! Buffers are owned by the request and handed back in the completion, so nothing borrowed
//! crosses the kernel boundary.

pub(crate) mod file;
pub(crate) mod psync;
pub mod sim;
pub(crate) mod uring;

use crate::buf::{AlignedBuf, IoBuf};
use parking_lot::{Condvar, Mutex};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// One device request.
#[derive(Debug)]
pub(crate) enum IoReq {
    /// Read `buf.len()` bytes at `off`.
    Read { off: u64, buf: AlignedBuf },
    /// Write the buffers back to back starting at `off` (one vectored write). `durable`: the
    /// write itself is durable when it completes (`RWF_DSYNC`: a FUA write, or the write and
    /// then a cache flush); nothing is said of other writes.
    Write {
        off: u64,
        bufs: Vec<IoBuf>,
        durable: bool,
    },
    /// fdatasync: everything whose write completed before this was issued becomes durable.
    Flush,
}

impl IoReq {
    pub fn len(&self) -> usize {
        match self {
            IoReq::Read { buf, .. } => buf.len(),
            IoReq::Write { bufs, .. } => bufs.iter().map(|b| b.len()).sum(),
            IoReq::Flush => 0,
        }
    }
}

/// A finished request. `res` is `Ok` only if the whole length was transferred.
#[derive(Debug)]
pub(crate) struct IoDone {
    pub token: u64,
    pub req: IoReq,
    pub res: io::Result<()>,
}

/// What one kernel result means for a transfer.
#[derive(Debug)]
pub(crate) enum Step {
    /// Every byte was transferred.
    Done,
    /// Some bytes are left (a short transfer, or an interrupted call): submit the remainder.
    More,
    /// The transfer failed.
    Failed(io::Error),
}

/// Accounts one kernel result (bytes moved, or `-errno`) to a transfer of `want` bytes of which
/// `*done` had moved before. A short transfer is not an error: the kernel may move fewer bytes
/// than asked (a signal, a file system splitting the request), and the caller submits the
/// remainder ([`IoReq::remainder`]). Only an error, or a call that moved nothing (end of the
/// device), fails the transfer.
pub(crate) fn account(result: isize, done: &mut usize, want: usize) -> Step {
    if result < 0 {
        let errno = result.unsigned_abs() as i32;
        if errno == libc::EINTR || errno == libc::EAGAIN {
            return Step::More;
        }
        return Step::Failed(io::Error::from_raw_os_error(errno));
    }
    let moved = result as usize;
    assert!(
        moved <= want - *done,
        "the kernel reports {moved} bytes moved of {} asked",
        want - *done
    );
    if moved == 0 && *done < want {
        return Step::Failed(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("transfer made no progress after {} of {want} bytes", *done),
        ));
    }
    *done += moved;
    if *done == want {
        Step::Done
    } else {
        Step::More
    }
}

impl IoReq {
    /// The device offset and the buffers (as iovecs) of what is left after the first `done`
    /// bytes, at most `limit` bytes of it (tests use a limit to force short transfers). The
    /// iovecs point into this request's own buffers; keep the request alive while the kernel
    /// may use them.
    pub fn remainder(&mut self, done: usize, limit: usize) -> (u64, Vec<libc::iovec>) {
        let (off, mut iov) = match self {
            IoReq::Read { off, buf } => {
                let rest = &mut buf[done..];
                let iov = libc::iovec {
                    iov_base: rest.as_mut_ptr().cast(),
                    iov_len: rest.len(),
                };
                (*off, vec![iov])
            }
            IoReq::Write { off, bufs, .. } => {
                let mut skip = done;
                let mut iov = Vec::with_capacity(bufs.len());
                for b in bufs.iter() {
                    if skip >= b.len() {
                        skip -= b.len();
                        continue;
                    }
                    iov.push(libc::iovec {
                        iov_base: b[skip..].as_ptr() as *mut _,
                        iov_len: b.len() - skip,
                    });
                    skip = 0;
                }
                (*off, iov)
            }
            IoReq::Flush => return (0, Vec::new()),
        };
        let mut left = limit;
        iov.retain_mut(|v| {
            v.iov_len = v.iov_len.min(left);
            left -= v.iov_len;
            v.iov_len > 0
        });
        (off + done as u64, iov)
    }
}

/// A device backend driven by the store's single I/O thread.
pub(crate) trait Backend: Send {
    /// "io_uring", "psync" or "sim".
    fn name(&self) -> &'static str;
    /// Queues a request; it is handed to the device by the next `poll`.
    fn submit(&mut self, token: u64, req: IoReq);
    /// Hands queued requests to the device and collects finished ones into `out`. With `wait`,
    /// blocks when nothing is finished until a completion, a [`Waker::wake`] or the timeout
    /// (`None` = no timeout).
    fn poll(&mut self, out: &mut Vec<IoDone>, wait: Option<Option<Duration>>);
    /// When the next request will complete, if the backend knows (the simulated disk): a
    /// loop that never blocks in `poll` sleeps until then.
    fn next_event(&self) -> Option<Instant> {
        None
    }
    /// The handle other threads use to interrupt a blocking `poll`.
    fn waker(&self) -> Waker;
    /// Driven as a task: a file descriptor that becomes readable when completions are ready
    /// to be collected (io_uring's registered eventfd); the task awaits it when idle. `None`:
    /// completions arrive through the [`Waker`] (psync, sim) or the backend blocks in `poll`.
    /// Each call returns a new descriptor of the same eventfd, owned by the caller.
    fn completion_fd(&self) -> Option<OwnedFd> {
        None
    }
    /// Whether finished requests wait to be collected by `poll` (checked before a task sleeps).
    fn has_completions(&mut self) -> bool {
        false
    }
}

/// Wakes the I/O thread from a blocking poll. Cheap when the thread is awake: senders only make
/// a syscall if the thread announced it is about to sleep.
#[derive(Clone)]
pub(crate) struct Waker(Arc<WakeInner>);

struct WakeInner {
    sleeping: AtomicBool,
    kind: WakeKind,
}

enum WakeKind {
    EventFd(OwnedFd),
    Cond {
        flag: Mutex<bool>,
        cv: Condvar,
    },
    /// The engine runs as a task (simulation) and awaits the notification.
    Notify(tokio::sync::Notify),
}

impl Waker {
    pub fn eventfd() -> io::Result<Waker> {
        // SAFETY: plain syscall; the returned fd is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh, valid descriptor that nothing else owns.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(Waker::with(WakeKind::EventFd(fd)))
    }

    pub fn condvar() -> Waker {
        Waker::with(WakeKind::Cond {
            flag: Mutex::new(false),
            cv: Condvar::new(),
        })
    }

    /// A waker for an engine running as a tokio task.
    pub fn notify() -> Waker {
        Waker::with(WakeKind::Notify(tokio::sync::Notify::new()))
    }

    fn with(kind: WakeKind) -> Waker {
        Waker(Arc::new(WakeInner {
            sleeping: AtomicBool::new(false),
            kind,
        }))
    }

    /// Wakes the thread if it is (about to be) asleep.
    pub fn wake(&self) {
        if self.0.sleeping.swap(false, Ordering::SeqCst) {
            self.kick();
        }
    }

    /// The I/O thread announces it will block; it must re-check its queues afterwards.
    pub fn set_sleeping(&self) {
        self.0.sleeping.store(true, Ordering::SeqCst);
    }

    pub fn clear_sleeping(&self) {
        self.0.sleeping.store(false, Ordering::SeqCst);
    }

    fn kick(&self) {
        match &self.0.kind {
            WakeKind::EventFd(fd) => {
                let one: u64 = 1;
                // SAFETY: writes 8 bytes from a valid u64 to our eventfd. A failure (counter
                // overflow) still leaves the eventfd readable, which is all we need.
                unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
            }
            WakeKind::Cond { flag, cv } => {
                *flag.lock() = true;
                cv.notify_one();
            }
            // Stores a permit if the task is not waiting yet, so no wake-up is lost.
            WakeKind::Notify(n) => n.notify_one(),
        }
    }

    pub fn eventfd_raw(&self) -> Option<i32> {
        match &self.0.kind {
            WakeKind::EventFd(fd) => Some(fd.as_raw_fd()),
            _ => None,
        }
    }

    /// Waits until kicked (a waker made by [`Waker::notify`]; other kinds return at once).
    pub async fn notified(&self) {
        if let WakeKind::Notify(n) = &self.0.kind {
            n.notified().await;
        }
    }

    /// Blocks on a condvar waker until kicked or timed out.
    pub fn wait_cond(&self, timeout: Option<Duration>) {
        if let WakeKind::Cond { flag, cv } = &self.0.kind {
            let mut f = flag.lock();
            if !*f {
                match timeout {
                    Some(t) => {
                        cv.wait_for(&mut f, t);
                    }
                    None => cv.wait(&mut f),
                }
            }
            *f = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::IoBuf;

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    /// A write of two buffers (durable or not) and a read back, both through `run`, must move
    /// every byte.
    fn round_trip(durable: bool, mut run: impl FnMut(IoReq) -> IoDone) {
        let (a, b) = (pattern(1, 8192), pattern(2, 4096));
        let write = IoReq::Write {
            off: 4096,
            bufs: vec![
                IoBuf::Owned(AlignedBuf::copy_from(&a)),
                IoBuf::Owned(AlignedBuf::copy_from(&b)),
            ],
            durable,
        };
        let done = run(write);
        done.res
            .expect("the write completes despite short transfers");
        let done = run(IoReq::Read {
            off: 4096,
            buf: AlignedBuf::zeroed(12288),
        });
        done.res
            .expect("the read completes despite short transfers");
        let IoReq::Read { buf, .. } = done.req else {
            panic!("the read came back as {:?}", done.req)
        };
        assert!(buf[..8192] == a[..] && buf[8192..] == b[..], "data differs");
    }

    /// A kernel that moves at most `cap` bytes per call, over an in-memory disk.
    fn fake_kernel(disk: &mut [u8], req: &mut IoReq, cap: usize) -> io::Result<()> {
        let want = req.len();
        let read = matches!(req, IoReq::Read { .. });
        let mut done = 0;
        let mut calls = 0;
        loop {
            calls += 1;
            let (off, iov) = req.remainder(done, cap);
            let mut at = off as usize;
            let mut moved = 0;
            for v in &iov {
                // SAFETY: the iovecs point into `req`'s live buffers.
                let mem = unsafe { std::slice::from_raw_parts_mut(v.iov_base.cast(), v.iov_len) };
                if read {
                    mem.copy_from_slice(&disk[at..at + v.iov_len]);
                } else {
                    disk[at..at + v.iov_len].copy_from_slice(mem);
                }
                at += v.iov_len;
                moved += v.iov_len;
            }
            match account(moved as isize, &mut done, want) {
                Step::Done => {
                    assert_eq!(calls, want.div_ceil(cap), "one call per {cap} bytes");
                    return Ok(());
                }
                Step::More => {}
                Step::Failed(e) => return Err(e),
            }
        }
    }

    #[test]
    fn short_transfers_are_completed_by_submitting_the_remainder() {
        for cap in [1, 511, 4096, 5000, 8192, 12287] {
            let mut disk = vec![0u8; 32768];
            round_trip(false, |mut req| {
                let res = fake_kernel(&mut disk, &mut req, cap);
                IoDone { token: 0, req, res }
            });
        }
    }

    #[test]
    fn errors_and_transfers_that_stop_fail_but_interruptions_retry() {
        let mut done = 0;
        assert!(matches!(
            account(-(libc::EINTR as isize), &mut done, 10),
            Step::More
        ));
        assert!(matches!(account(4, &mut done, 10), Step::More));
        assert_eq!(done, 4);
        match account(0, &mut done, 10) {
            Step::Failed(e) => assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof),
            other => panic!("a transfer that stopped: {other:?}"),
        }
        match account(-(libc::EIO as isize), &mut done, 10) {
            Step::Failed(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO)),
            other => panic!("EIO: {other:?}"),
        }
        assert!(matches!(account(6, &mut done, 10), Step::Done));
        let mut flushed = 0;
        assert!(matches!(account(0, &mut flushed, 0), Step::Done), "a flush");
    }

    /// Drives a real backend over a real file, the backend asking the kernel for at most `limit`
    /// bytes per submission: every request is a chain of short transfers.
    pub(crate) fn backend_round_trip(mut be: Box<dyn Backend>) {
        for durable in [false, true] {
            round_trip(durable, |req| {
                be.submit(7, req);
                let mut out = Vec::new();
                let waker = be.waker();
                while out.is_empty() {
                    // As the store's I/O thread does: announce the sleep, then block in poll.
                    waker.set_sleeping();
                    be.poll(&mut out, Some(Some(std::time::Duration::from_secs(5))));
                    waker.clear_sleeping();
                }
                out.pop().unwrap()
            });
        }
    }

    pub(crate) fn scratch_file() -> (tempfile::TempDir, Arc<std::fs::File>) {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("dev"))
            .unwrap();
        file.set_len(32768).unwrap();
        (dir, Arc::new(file))
    }

    #[test]
    fn the_psync_backend_completes_short_transfers() {
        let (_dir, file) = scratch_file();
        for limit in [1000, 4096, 5555] {
            backend_round_trip(Box::new(
                psync::PsyncBackend::with_limit(file.clone(), 2, crate::clock::Clock::Os, limit)
                    .unwrap(),
            ));
        }
    }

    #[test]
    fn the_io_uring_backend_completes_short_transfers() {
        if !uring::available() {
            eprintln!("SKIPPED: io_uring cannot be set up here (seccomp or an old kernel)");
            return;
        }
        let (_dir, file) = scratch_file();
        for limit in [1000, 4096, 5555] {
            backend_round_trip(Box::new(
                uring::UringBackend::with_limit(file.clone(), crate::clock::Clock::Os, limit)
                    .unwrap(),
            ));
        }
    }
}
