//! The transmission phase of one connection: one task reads requests, runs them concurrently
//! and writes replies as they complete, in any order (matched by cookie).
//!
//! One poll loop drives four things without spawning a task per request:
//! 1. decode requests already received and start each as a future in a `FuturesUnordered`
//!    (invalid ones are answered at once, without touching the export);
//! 2. read more from the socket, only while the connection is under its limits of requests
//!    and bytes in flight (backpressure: a client that floods or never reads stops being read);
//! 3. collect finished requests and queue their replies;
//! 4. write queued replies with one vectored write (batched: every reply that finished since
//!    the last write leaves in the same call; READ data goes out without a copy).
//!
//! The connection ends after `NBD_CMD_DISC`, EOF, a protocol error, a socket error or
//! shutdown; in every case the requests already started run to completion first, and their
//! replies are written while the client still listens.

use crate::caps::ExportCaps;
use crate::config::{Dispatch, ServerConfig};
use crate::error::NbdError;
use crate::export::Export;
use crate::reply::{MAX_SLICES, ReplyQueue};
use crate::request::{Command, Incoming, RequestDecoder, RequestHeader, validate};
use crate::wire::{REPLY_HEADER_LEN, REQUEST_HEADER_LEN, cmd, errno};
use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use std::future::{Future, poll_fn};
use std::io::{ErrorKind, IoSlice};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

/// Smallest free space offered to one socket read.
const READ_CHUNK: usize = 64 << 10;
/// A WRITE payload with at least this much left to receive is read straight into its aligned
/// buffer; smaller rests come through the receive buffer (one read takes several requests).
const DIRECT_MIN: usize = 32 << 10;
/// Loop turns per poll before yielding to other tasks.
const TURNS_PER_POLL: usize = 32;

/// A finished request.
struct Done {
    cookie: u64,
    /// Bytes charged against the in-flight limit when it started.
    charge: usize,
    error: u32,
    payload: Bytes,
}

/// Why the connection stopped reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Reading,
    Disconnect,
    Eof,
    Failed,
}

/// Serves requests on `rd`/`wr` until the connection ends; returns once every started request
/// has finished. `Ok` after a clean `NBD_CMD_DISC` or EOF between requests.
pub(crate) async fn transmit<E, R, W>(
    export: &Arc<E>,
    caps: ExportCaps,
    rd: &mut R,
    wr: &mut W,
    config: &ServerConfig,
    dispatch: Dispatch,
    shutdown: &CancellationToken,
) -> Result<(), NbdError>
where
    E: Export,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut conn = Conn::new(caps, config);
    let mut start = |cookie, charge, command| run(export, dispatch, cookie, charge, command);
    let mut cancelled = pin!(shutdown.cancelled());
    poll_fn(|cx| {
        // Checked once per wake-up; the waker stays registered in between.
        if conn.reading == Stop::Reading && cancelled.as_mut().poll(cx).is_ready() {
            conn.shutting_down = true;
        }
        for _ in 0..TURNS_PER_POLL {
            let mut progress = conn.start_received(&mut start);
            progress |= conn.read_more(cx, rd);
            progress |= conn.collect(cx);
            progress |= conn.write_replies(cx, wr);
            if conn.finished() {
                return Poll::Ready(());
            }
            if !progress {
                return Poll::Pending;
            }
        }
        // Plenty of work: let other tasks run, then come back.
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await;
    if conn.reading == Stop::Disconnect {
        tracing::debug!("client disconnected (NBD_CMD_DISC)");
    }
    conn.result
}

/// The state of one connection's transmission phase. Each step returns whether it made
/// progress; a step that did not has registered the waker for what it waits on.
struct Conn<'a, F> {
    caps: ExportCaps,
    config: &'a ServerConfig,
    rbuf: BytesMut,
    decoder: RequestDecoder,
    /// The last request was a large WRITE: the next read takes only a header, so that a
    /// following large payload is read in place rather than through `rbuf`.
    after_large_write: bool,
    inflight: FuturesUnordered<F>,
    out: ReplyQueue,
    /// Bytes charged by the requests in `inflight`.
    charged: usize,
    reading: Stop,
    /// False once the peer stopped taking replies.
    writing: bool,
    unflushed: bool,
    shutting_down: bool,
    /// The first error.
    result: Result<(), NbdError>,
}

impl<'a, F: Future<Output = Done>> Conn<'a, F> {
    fn new(caps: ExportCaps, config: &'a ServerConfig) -> Self {
        Conn {
            caps,
            config,
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            decoder: RequestDecoder::new(caps.max_payload),
            after_large_write: false,
            inflight: FuturesUnordered::new(),
            out: ReplyQueue::new(),
            charged: 0,
            reading: Stop::Reading,
            writing: true,
            unflushed: false,
            shutting_down: false,
            result: Ok(()),
        }
    }

    /// Under the limits of requests and bytes in flight (unsent replies count too).
    fn admits(&self) -> bool {
        self.inflight.len() < self.config.max_inflight_requests
            && self.charged + self.out.len() < self.config.max_inflight_bytes
    }

    fn fail(&mut self, e: NbdError) {
        if self.result.is_ok() {
            self.result = Err(e);
        }
    }

    /// Step 1: decode received requests and start them (invalid ones are answered at once).
    fn start_received(&mut self, start: &mut impl FnMut(u64, usize, Command) -> F) -> bool {
        let mut progress = false;
        while self.reading == Stop::Reading && self.admits() {
            let incoming = match self.decoder.decode(&mut self.rbuf) {
                Ok(Some(incoming)) => incoming,
                Ok(None) => break,
                Err(e) => {
                    self.fail(NbdError::protocol(e.to_string()));
                    self.reading = Stop::Failed;
                    break;
                }
            };
            progress = true;
            let (Incoming::Request(h, _) | Incoming::Oversized(h)) = &incoming;
            self.after_large_write = h.kind == cmd::WRITE && h.len as usize >= DIRECT_MIN;
            let (h, payload) = match incoming {
                Incoming::Request(h, payload) => (h, payload),
                Incoming::Oversized(h) => {
                    self.out.push(errno::EINVAL, h.cookie, Bytes::new());
                    continue;
                }
            };
            if self.shutting_down && h.kind != cmd::DISC {
                self.out.push(errno::ESHUTDOWN, h.cookie, Bytes::new());
                continue;
            }
            match validate(&h, payload, &self.caps) {
                Ok(Command::Disconnect) => self.reading = Stop::Disconnect,
                Ok(command) => {
                    let charge = charge_of(&h);
                    self.charged += charge;
                    self.inflight.push(start(h.cookie, charge, command));
                }
                Err(error) => self.out.push(error, h.cookie, Bytes::new()),
            }
        }
        // Shutting down: what was already received has been answered; read nothing more.
        if self.shutting_down && self.reading == Stop::Reading {
            self.reading = Stop::Failed;
        }
        progress
    }

    /// Step 2: read more from the socket, within the limits.
    fn read_more<R: AsyncRead + Unpin>(&mut self, cx: &mut Context<'_>, rd: &mut R) -> bool {
        if self.reading != Stop::Reading || !self.admits() {
            return false;
        }
        let read = match self.decoder.direct_buf() {
            // The rest of a large aligned WRITE payload: straight into its buffer.
            Some(dst) if self.rbuf.is_empty() && dst.len() >= DIRECT_MIN => {
                let mut rb = tokio::io::ReadBuf::new(dst);
                let read = Pin::new(rd)
                    .poll_read(cx, &mut rb)
                    .map_ok(|()| rb.filled().len());
                if let Poll::Ready(Ok(n)) = read {
                    self.decoder.filled(n);
                }
                read
            }
            _ => {
                let want = if self.after_large_write && self.rbuf.is_empty() {
                    self.decoder.needed(0).max(REQUEST_HEADER_LEN)
                } else {
                    self.decoder.needed(self.rbuf.len()).max(READ_CHUNK)
                };
                if self.rbuf.capacity() - self.rbuf.len() < want {
                    self.rbuf.reserve(want);
                }
                let mut limited = (&mut self.rbuf).limit(want);
                tokio_util::io::poll_read_buf(Pin::new(rd), cx, &mut limited)
            }
        };
        match read {
            Poll::Ready(Ok(0)) => {
                self.reading = Stop::Eof;
                if !(self.decoder.at_boundary() && self.rbuf.is_empty()) {
                    let msg = "client closed the connection in the middle of a request";
                    self.fail(NbdError::protocol(msg));
                }
            }
            Poll::Ready(Ok(_)) => {}
            Poll::Ready(Err(e)) => {
                self.reading = Stop::Failed;
                self.fail(e.into());
            }
            Poll::Pending => return false,
        }
        true
    }

    /// Step 3: queue the replies of finished requests.
    fn collect(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        while let Poll::Ready(Some(done)) = self.inflight.poll_next_unpin(cx) {
            progress = true;
            self.charged -= done.charge;
            if self.writing {
                self.out.push(done.error, done.cookie, done.payload);
            }
        }
        progress
    }

    /// Step 4: write queued replies with one vectored write; flush once the queue is empty.
    fn write_replies<W: AsyncWrite + Unpin>(&mut self, cx: &mut Context<'_>, wr: &mut W) -> bool {
        let mut progress = false;
        if self.writing && !self.out.is_empty() {
            let mut iov = [IoSlice::new(&[]); MAX_SLICES];
            let n = self.out.io_slices(&mut iov);
            match Pin::new(&mut *wr).poll_write_vectored(cx, &iov[..n]) {
                Poll::Ready(Ok(written)) if written > 0 => {
                    progress = true;
                    self.unflushed = true;
                    self.out.advance(written);
                }
                Poll::Ready(res) => {
                    progress = true;
                    let e = res.err().unwrap_or_else(|| ErrorKind::WriteZero.into());
                    self.peer_gone(e);
                }
                Poll::Pending => {}
            }
        }
        if self.writing && self.unflushed && self.out.is_empty() {
            match Pin::new(&mut *wr).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.unflushed = false,
                Poll::Ready(Err(e)) => self.peer_gone(e),
                Poll::Pending => {}
            }
        }
        progress
    }

    /// The client cannot hear replies any more: stop reading too, and let the requests
    /// already started finish unanswered.
    fn peer_gone(&mut self, e: std::io::Error) {
        self.fail(e.into());
        self.writing = false;
        self.unflushed = false;
        self.out.clear();
        if self.reading == Stop::Reading {
            self.reading = Stop::Failed;
        }
    }

    /// Reading has stopped, every started request finished, every reply that can be sent was.
    fn finished(&self) -> bool {
        self.reading != Stop::Reading
            && self.inflight.is_empty()
            && (self.out.is_empty() || !self.writing)
            && !self.unflushed
    }
}

/// Bytes a request holds while in flight: its WRITE data or READ result, and its reply header.
fn charge_of(h: &RequestHeader) -> usize {
    match h.kind {
        cmd::READ | cmd::WRITE => REPLY_HEADER_LEN + h.len as usize,
        _ => REPLY_HEADER_LEN,
    }
}

/// Runs one command, inline or as a spawned task.
async fn run<E: Export>(
    export: &Arc<E>,
    dispatch: Dispatch,
    cookie: u64,
    charge: usize,
    command: Command,
) -> Done {
    let error = |error| Done {
        cookie,
        charge,
        error,
        payload: Bytes::new(),
    };
    let result = match dispatch {
        Dispatch::Inline => execute(&**export, command).await,
        Dispatch::Spawn => {
            let export = Arc::clone(export);
            match tokio::spawn(async move { execute(&*export, command).await }).await {
                Ok(result) => result,
                Err(e) => {
                    tracing::error!("NBD request task failed: {e}");
                    Err(errno::EIO)
                }
            }
        }
    };
    match result {
        Ok(payload) => Done {
            cookie,
            charge,
            error: 0,
            payload,
        },
        Err(e) => error(e),
    }
}

/// Calls the export; the READ data on success, the NBD error value on failure.
async fn execute<E: Export>(export: &E, command: Command) -> Result<Bytes, u32> {
    let result = match command {
        Command::Read { len: 0, .. } => return Ok(Bytes::new()),
        Command::Read { offset, len } => match export.read(offset, len).await {
            Ok(data) if data.len() == len as usize => return Ok(data),
            Ok(data) => {
                tracing::error!(
                    "export returned {} bytes for a {len}-byte read at {offset}",
                    data.len()
                );
                return Err(errno::EIO);
            }
            Err(e) => Err(e),
        },
        Command::Write { data, .. } if data.is_empty() => Ok(()),
        Command::Write { offset, data, fua } => export.write(offset, data, fua).await,
        Command::Flush => export.flush().await,
        Command::Trim { len: 0, .. } | Command::WriteZeroes { len: 0, .. } => Ok(()),
        Command::Trim { offset, len, fua } => match export.trim(offset, len).await {
            // The trait's trim has no FUA: a flush makes the trim durable before the reply.
            Ok(()) if fua => export.flush().await,
            other => other,
        },
        Command::WriteZeroes {
            offset,
            len,
            fua,
            no_hole,
        } => export.write_zeroes(offset, len, fua, no_hole).await,
        Command::Disconnect => Ok(()),
    };
    result.map(|()| Bytes::new()).map_err(|e| {
        tracing::debug!("NBD request failed: {e}");
        e.errno()
    })
}
