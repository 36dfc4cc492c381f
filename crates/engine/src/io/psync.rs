//! The fallback backend: pread / pwritev / fdatasync on a small pool of worker threads, so
//! several requests are in flight even without io_uring.

use super::{Backend, IoDone, IoReq, Waker, check_len};
use crate::buf::IoBuf;
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
    pub fn new(file: Arc<File>, threads: usize) -> io::Result<PsyncBackend> {
        let (tx, rx) = crossbeam_channel::unbounded::<(u64, IoReq)>();
        let done = Arc::new(Mutex::new(Vec::new()));
        let waker = Waker::condvar();
        let threads = (0..threads.max(1))
            .map(|i| {
                let (rx, done, waker, file) =
                    (rx.clone(), done.clone(), waker.clone(), file.clone());
                std::thread::Builder::new()
                    .name(format!("basalt-psync-{i}"))
                    .spawn(move || worker(&file, &rx, &done, &waker))
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

fn worker(file: &File, rx: &Receiver<(u64, IoReq)>, done: &Mutex<Vec<IoDone>>, waker: &Waker) {
    let fd = file.as_raw_fd();
    while let Ok((token, mut req)) = rx.recv() {
        let res = match &mut req {
            IoReq::Read { off, buf } => {
                // SAFETY: buf is valid for buf.len() writable bytes.
                let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), *off as i64) };
                check_len(
                    if n < 0 {
                        -(errno() as isize)
                    } else {
                        n as isize
                    },
                    buf.len(),
                )
            }
            IoReq::Write { off, bufs } => pwritev_all(fd, *off, bufs),
            // SAFETY: plain syscall on an open descriptor.
            IoReq::Flush => match unsafe { libc::fdatasync(fd) } {
                0 => Ok(()),
                _ => Err(io::Error::last_os_error()),
            },
        };
        done.lock().push(IoDone { token, req, res });
        waker.wake();
    }
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Writes all buffers back to back at `off`, retrying short writes.
fn pwritev_all(fd: i32, mut off: u64, bufs: &[IoBuf]) -> io::Result<()> {
    let mut iov: Vec<libc::iovec> = bufs
        .iter()
        .map(|b| libc::iovec {
            iov_base: b.as_ptr() as *mut _,
            iov_len: b.len(),
        })
        .collect();
    let mut first = 0;
    while first < iov.len() {
        // SAFETY: the iovecs point into buffers borrowed for the duration of this call.
        let n = unsafe {
            libc::pwritev(
                fd,
                iov[first..].as_ptr(),
                (iov.len() - first) as i32,
                off as i64,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "pwritev wrote nothing",
            ));
        }
        let mut n = n as usize;
        off += n as u64;
        while n > 0 && first < iov.len() {
            if n >= iov[first].iov_len {
                n -= iov[first].iov_len;
                first += 1;
            } else {
                // SAFETY: advancing within the same buffer.
                iov[first].iov_base = unsafe { iov[first].iov_base.cast::<u8>().add(n).cast() };
                iov[first].iov_len -= n;
                n = 0;
            }
        }
    }
    Ok(())
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
}

impl Drop for PsyncBackend {
    fn drop(&mut self) {
        self.tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
