//! The fallback backend: preadv / pwritev / fdatasync on a small pool of worker threads, so
//! several requests are in flight even without io_uring. A short transfer is completed by
//! submitting the remainder ([`super::account`]).

use super::{Backend, IoDone, IoReq, Step, Waker, account};
use crate::clock::Clock;
use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub(crate) struct PsyncBackend {
    tx: Option<Sender<(u64, IoReq)>>,
    done: Arc<Mutex<Vec<IoDone>>>,
    waker: Waker,
    threads: Vec<JoinHandle<()>>,
}

impl PsyncBackend {
    /// Workers that wake the store's I/O thread (`Clock::Os`) or its task (`Clock::Runtime`).
    pub fn new(file: Arc<File>, threads: usize, clock: Clock) -> io::Result<PsyncBackend> {
        PsyncBackend::with_limit(file, threads, clock, usize::MAX)
    }

    /// `limit`: the most bytes one system call asks for (tests set it low to force short
    /// transfers).
    pub(super) fn with_limit(
        file: Arc<File>,
        threads: usize,
        clock: Clock,
        limit: usize,
    ) -> io::Result<PsyncBackend> {
        let (tx, rx) = crossbeam_channel::unbounded::<(u64, IoReq)>();
        let done = Arc::new(Mutex::new(Vec::new()));
        let waker = match clock {
            Clock::Os => Waker::condvar(),
            Clock::Runtime => Waker::notify(),
        };
        let threads = (0..threads.max(1))
            .map(|i| {
                let (rx, done, waker, file) =
                    (rx.clone(), done.clone(), waker.clone(), file.clone());
                std::thread::Builder::new()
                    .name(format!("basalt-psync-{i}"))
                    .spawn(move || worker(&file, &rx, &done, &waker, limit))
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(PsyncBackend {
            tx: Some(tx),
            done,
            waker,
            threads,
        })
    }
}

fn worker(
    file: &File,
    rx: &Receiver<(u64, IoReq)>,
    done: &Mutex<Vec<IoDone>>,
    waker: &Waker,
    limit: usize,
) {
    let fd = file.as_raw_fd();
    while let Ok((token, mut req)) = rx.recv() {
        let res = match req {
            // SAFETY: plain syscall on an open descriptor.
            IoReq::Flush => match unsafe { libc::fdatasync(fd) } {
                0 => Ok(()),
                _ => Err(io::Error::last_os_error()),
            },
            _ => transfer_all(fd, &mut req, limit),
        };
        done.lock().push(IoDone { token, req, res });
        waker.wake();
    }
}

/// Reads or writes all of `req`, submitting the remainder again after a short transfer.
fn transfer_all(fd: i32, req: &mut IoReq, limit: usize) -> io::Result<()> {
    let want = req.len();
    let read = matches!(req, IoReq::Read { .. });
    let flags = match req {
        IoReq::Write { durable: true, .. } => libc::RWF_DSYNC,
        _ => 0,
    };
    let mut done = 0;
    loop {
        let (off, iov) = req.remainder(done, limit);
        // SAFETY: the iovecs point into `req`'s buffers, which outlive this call.
        let n = unsafe {
            if read {
                libc::preadv(fd, iov.as_ptr(), iov.len() as i32, off as i64)
            } else {
                libc::pwritev2(fd, iov.as_ptr(), iov.len() as i32, off as i64, flags)
            }
        };
        let result = if n < 0 { -(errno() as isize) } else { n };
        match account(result, &mut done, want) {
            Step::Done => return Ok(()),
            Step::More => {}
            Step::Failed(e) => return Err(e),
        }
    }
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

impl Backend for PsyncBackend {
    fn name(&self) -> &'static str {
        "psync"
    }

    fn submit(&mut self, token: u64, req: IoReq) {
        if let Some(tx) = &self.tx {
            let _ = tx.send((token, req));
        }
    }

    fn poll(&mut self, out: &mut Vec<IoDone>, wait: Option<Option<Duration>>) {
        let empty = self.done.lock().is_empty();
        if empty && let Some(timeout) = wait {
            self.waker.wait_cond(timeout);
        }
        out.append(&mut self.done.lock());
    }

    fn waker(&self) -> Waker {
        self.waker.clone()
    }

    fn has_completions(&mut self) -> bool {
        !self.done.lock().is_empty()
    }
}

impl Drop for PsyncBackend {
    fn drop(&mut self) {
        self.tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
