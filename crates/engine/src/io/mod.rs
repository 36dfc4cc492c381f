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
    /// Write the buffers back to back starting at `off` (one vectored write).
    Write { off: u64, bufs: Vec<IoBuf> },
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

/// Checks a byte count returned by the kernel against the request length.
pub(crate) fn check_len(done: isize, want: usize) -> io::Result<()> {
    if done < 0 {
        Err(io::Error::from_raw_os_error(-done as i32))
    } else if done as usize != want {
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("short transfer: {done} of {want} bytes"),
        ))
    } else {
        Ok(())
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
