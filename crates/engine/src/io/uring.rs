//! The io_uring backend: one ring per device, O_DIRECT, many requests per `io_uring_enter`.
//!
//! Requests wait in a backlog when the ring is full. A short transfer goes back to the front of
//! the backlog for its remainder ([`super::account`]).
//!
//! Two ways to be driven:
//! - by the store's own I/O thread (`Clock::Os`): `poll` blocks in `io_uring_enter`; an
//!   eventfd read is always armed in the ring so that other threads can wake it ([`Waker`]);
//! - as a task on a tokio runtime (`Clock::Runtime`, run to completion with the node's network
//!   on one thread): `poll` never blocks; an eventfd registered with the ring
//!   (`IORING_REGISTER_EVENTFD`) becomes readable when completions are posted, and the task
//!   awaits it ([`Backend::completion_fd`]); handles wake the task with a tokio `Notify`.

use super::{Backend, IoDone, IoReq, Step, Waker, account};
use crate::clock::Clock;
use io_uring::{IoUring, opcode, types};
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

const RING_ENTRIES: u32 = 512;
const WAKE_TOKEN: u64 = u64::MAX;

struct InFlight {
    token: u64,
    req: IoReq,
    /// Bytes transferred by earlier submissions of this request (short transfers).
    done: usize,
    /// Keeps the iovec array alive while the kernel may read it.
    _iov: Vec<libc::iovec>,
}

pub(crate) struct UringBackend {
    ring: IoUring,
    file: Arc<File>,
    slab: Vec<Option<InFlight>>,
    free: Vec<usize>,
    inflight: usize,
    /// Requests not yet in the ring: (token, request, bytes already transferred).
    backlog: VecDeque<(u64, IoReq, usize)>,
    waker: Waker,
    wake_buf: Box<u64>,
    /// Whether the eventfd read that wakes a blocked `poll` is in the ring (always true when
    /// driven as a task: nothing blocks, so nothing needs it).
    wake_armed: bool,
    /// Driven as a task: the eventfd the ring signals for every completion it posts.
    completions: Option<OwnedFd>,
    /// The most bytes one submission asks for (tests set it low to force short transfers).
    limit: usize,
}

// SAFETY: the raw pointers inside in-flight iovecs point into buffers owned by the same
// InFlight entries; the backend is moved between threads only as a whole.
unsafe impl Send for UringBackend {}

/// True if io_uring can be set up here (not blocked by seccomp, not an old kernel).
pub(crate) fn available() -> bool {
    IoUring::new(8).is_ok()
}

impl UringBackend {
    /// A ring driven by the store's I/O thread (`Clock::Os`) or as a task (`Clock::Runtime`).
    pub fn new(file: Arc<File>, clock: Clock) -> io::Result<UringBackend> {
        UringBackend::with_limit(file, clock, usize::MAX)
    }

    pub(super) fn with_limit(
        file: Arc<File>,
        clock: Clock,
        limit: usize,
    ) -> io::Result<UringBackend> {
        let ring = IoUring::new(RING_ENTRIES)?;
        let (waker, completions) = match clock {
            Clock::Os => (Waker::eventfd()?, None),
            Clock::Runtime => {
                let efd = nonblocking_eventfd()?;
                ring.submitter().register_eventfd(efd.as_raw_fd())?;
                (Waker::notify(), Some(efd))
            }
        };
        Ok(UringBackend {
            ring,
            file,
            slab: Vec::new(),
            free: Vec::new(),
            inflight: 0,
            backlog: VecDeque::new(),
            waker,
            wake_buf: Box::new(0),
            wake_armed: completions.is_some(),
            completions,
            limit,
        })
    }

    /// Moves backlog requests into the submission queue while there is room.
    fn fill_sq(&mut self) {
        let fd = types::Fd(self.file.as_raw_fd());
        if !self.wake_armed {
            let efd = self.waker.eventfd_raw().expect("uring waker is an eventfd");
            let e = opcode::Read::new(types::Fd(efd), (&mut *self.wake_buf as *mut u64).cast(), 8)
                .build()
                .user_data(WAKE_TOKEN);
            // SAFETY: wake_buf is boxed and lives as long as the ring.
            if unsafe { self.ring.submission().push(&e) }.is_ok() {
                self.wake_armed = true;
            }
        }
        while self.inflight < RING_ENTRIES as usize && !self.ring.submission().is_full() {
            let Some((token, mut req, done)) = self.backlog.pop_front() else {
                break;
            };
            let idx = self.free.pop().unwrap_or_else(|| {
                self.slab.push(None);
                self.slab.len() - 1
            });
            let (off, iov) = req.remainder(done, self.limit);
            let entry = match &req {
                IoReq::Read { .. } => {
                    opcode::Read::new(fd, iov[0].iov_base.cast(), iov[0].iov_len as u32)
                        .offset(off)
                        .build()
                }
                IoReq::Write { durable, .. } => {
                    opcode::Writev::new(fd, iov.as_ptr(), iov.len() as u32)
                        .offset(off)
                        .rw_flags(if *durable { libc::RWF_DSYNC } else { 0 })
                        .build()
                }
                IoReq::Flush => opcode::Fsync::new(fd)
                    .flags(types::FsyncFlags::DATASYNC)
                    .build(),
            };
            let entry = entry.user_data(idx as u64);
            // SAFETY: every buffer and the iovec array are owned by the InFlight stored below
            // and stay at the same address until the completion is reaped.
            let pushed = unsafe { self.ring.submission().push(&entry) };
            assert!(pushed.is_ok(), "checked is_full above");
            self.slab[idx] = Some(InFlight {
                token,
                req,
                done,
                _iov: iov,
            });
            self.inflight += 1;
        }
    }

    fn enter(&mut self, wait: Option<Option<Duration>>) {
        // Nothing to submit and no wait: the kernel posts completions without being entered
        // (no system call per step of a loop run as a task).
        if wait.is_none() && self.ring.submission().is_empty() {
            return;
        }
        let res = match wait {
            None => self.ring.submit(),
            Some(None) => self.ring.submit_and_wait(1),
            Some(Some(t)) => {
                let ts = types::Timespec::from(t);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
        };
        if let Err(e) = res {
            match e.raw_os_error() {
                Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN) => {}
                _ => tracing::warn!("io_uring_enter failed: {e}"),
            }
        }
    }
}

impl Backend for UringBackend {
    fn name(&self) -> &'static str {
        "io_uring"
    }

    fn submit(&mut self, token: u64, req: IoReq) {
        self.backlog.push_back((token, req, 0));
    }

    fn poll(&mut self, out: &mut Vec<IoDone>, wait: Option<Option<Duration>>) {
        self.fill_sq();
        let ready = !self.ring.completion().is_empty();
        self.enter(if ready { None } else { wait });
        loop {
            let before = out.len();
            let cqes: Vec<(u64, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (ud, result) in cqes {
                if ud == WAKE_TOKEN {
                    self.wake_armed = false;
                    continue;
                }
                let idx = ud as usize;
                let Some(mut inf) = self.slab[idx].take() else {
                    continue;
                };
                self.free.push(idx);
                self.inflight -= 1;
                let res = match account(result as isize, &mut inf.done, inf.req.len()) {
                    Step::More => {
                        self.backlog.push_front((inf.token, inf.req, inf.done));
                        continue;
                    }
                    Step::Done => Ok(()),
                    Step::Failed(e) => Err(e),
                };
                out.push(IoDone {
                    token: inf.token,
                    req: inf.req,
                    res,
                });
            }
            // Refill the ring with backlog now that slots are free, without waiting.
            if self.backlog.is_empty() || out.len() == before {
                break;
            }
            self.fill_sq();
            self.enter(None);
        }
        if !self.wake_armed || !self.backlog.is_empty() {
            self.fill_sq();
            self.enter(None);
        }
    }

    fn waker(&self) -> Waker {
        self.waker.clone()
    }

    fn completion_fd(&self) -> Option<OwnedFd> {
        let fd = self.completions.as_ref()?;
        Some(
            fd.try_clone()
                .expect("cannot duplicate the completion eventfd"),
        )
    }

    fn has_completions(&mut self) -> bool {
        !self.ring.completion().is_empty()
    }
}

/// A non-blocking eventfd (the task reads it empty without blocking).
fn nonblocking_eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the returned fd is owned below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Drop for UringBackend {
    /// The kernel may still read or fill the buffers of requests in flight: wait for them
    /// before the buffers are freed (a store closed cleanly has none; a task dropped with its
    /// runtime may). A device that does not complete them within [`DROP_WAIT`] hangs: their
    /// buffers are leaked instead, never freed under the kernel's feet.
    fn drop(&mut self) {
        let deadline = std::time::Instant::now() + DROP_WAIT;
        while self.inflight > 0 && std::time::Instant::now() < deadline {
            let ts = types::Timespec::from(Duration::from_millis(100));
            let args = types::SubmitArgs::new().timespec(&ts);
            let _ = self.ring.submitter().submit_with_args(1, &args);
            let done: Vec<u64> = self.ring.completion().map(|c| c.user_data()).collect();
            for ud in done {
                let entry = self.slab.get_mut(ud as usize).and_then(Option::take);
                if ud != WAKE_TOKEN && entry.is_some() {
                    self.inflight -= 1;
                }
            }
        }
        if self.inflight > 0 {
            tracing::error!(
                requests = self.inflight,
                "dropping an io_uring ring whose device has not completed its requests; their \
                 buffers are leaked"
            );
            for entry in self.slab.drain(..).flatten() {
                std::mem::forget(entry);
            }
        }
    }
}

/// How long dropping a ring waits for requests still in flight.
const DROP_WAIT: Duration = Duration::from_secs(2);
