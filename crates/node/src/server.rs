//! The node's TCP server: one task per connection reading frames, a task per request calling
//! the node's [`Service`], and a writer task batching the answers (in completion order).
//!
//! A connection must open with Hello. A frame that fails to decode gets a `Malformed` error
//! answer (when its header was readable) and the connection is closed; other connections are
//! not affected.
//!
//! Backpressure: a connection has at most [`Limits::requests`] requests and [`Limits::bytes`]
//! bytes in flight. A request's bytes are its frame's payload plus the data its answer will
//! carry (a read's length), counted from the moment its header arrives (before its payload is
//! read) until its answer has been written to the socket. When either budget is used up the
//! server stops reading the connection; beyond the frame it is receiving it reads at most
//! [`READ_AHEAD`] bytes. So a client that sends large writes, or asks for large reads, without
//! reading its answers cannot make the node hold more than the budget for it.
//!
//! A data-path answer is checked against the node's lease right before it is encoded
//! (`lease.rs::Fence`): one that would go out after the lease may have expired becomes `Busy`.

use crate::lease::Fence;
use basalt_proto::{
    ErrorCode, Frame, FrameDecoder, OutQueue, ProtoError, Request, RequestKind, Response, Service,
    WireError, encode_response,
};
use bytes::{BufMut, BytesMut};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

/// Requests one connection may have in flight.
pub const MAX_IN_FLIGHT: usize = 1024;
/// Bytes one connection may have in flight (request payloads and the answers' data).
pub const MAX_IN_FLIGHT_BYTES: usize = 64 << 20;
/// The most a connection reads beyond the frame it is receiving.
pub(crate) const READ_AHEAD: usize = 64 << 10;

/// The in-flight budget of each connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) requests: usize,
    pub(crate) bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            requests: MAX_IN_FLIGHT,
            bytes: MAX_IN_FLIGHT_BYTES,
        }
    }
}

/// Counters of the server, shown by `basalt status`.
#[derive(Debug, Default)]
pub(crate) struct ServerStats {
    /// Times a connection stopped reading because its in-flight budget was used up.
    pub(crate) pauses: AtomicU64,
}

/// What every connection shares.
struct Ctx {
    service: Arc<dyn Service>,
    fence: Arc<Fence>,
    limits: Limits,
    stats: Arc<ServerStats>,
}

/// An answer ready to be written. The permits (the request's slot and bytes) are released
/// only once the answer has been written, so a client that does not read its answers stops
/// being read from.
struct Answer {
    id: u64,
    kind: RequestKind,
    result: Result<Response, WireError>,
    /// A data-path answer, to be checked against the lease before it goes out.
    data_path: bool,
    permits: Vec<OwnedSemaphorePermit>,
}

/// Accepts connections until `stop` turns true.
pub(crate) async fn serve(
    listener: TcpListener,
    service: Arc<dyn Service>,
    fence: Arc<Fence>,
    limits: Limits,
    stats: Arc<ServerStats>,
    mut stop: watch::Receiver<bool>,
) {
    let ctx = Arc::new(Ctx {
        service,
        fence,
        limits,
        stats,
    });
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                tokio::spawn(connection(stream, peer, ctx.clone(), stop.clone()));
            }
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::task::yield_now().await;
            }
        }
    }
}

/// One connection's budget.
struct Budget {
    slots: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    limit: usize,
}

impl Budget {
    /// Takes `n` permits of `sem`, waiting (and counting a pause) when they are not free.
    /// `None` when the node stops meanwhile.
    async fn take(
        sem: &Arc<Semaphore>,
        n: usize,
        stats: &ServerStats,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<OwnedSemaphorePermit> {
        let n = u32::try_from(n).expect("budgets fit in u32");
        if let Ok(p) = sem.clone().try_acquire_many_owned(n) {
            return Some(p);
        }
        stats.pauses.fetch_add(1, Ordering::Relaxed);
        tokio::select! {
            biased;
            p = sem.clone().acquire_many_owned(n) => p.ok(),
            _ = stop.wait_for(|s| *s) => None,
        }
    }
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    ctx: Arc<Ctx>,
    mut stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let (mut rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::unbounded_channel::<Answer>();
    let writer = tokio::spawn(write_loop(wr, rx, ctx.fence.clone()));
    let budget = Budget {
        slots: Arc::new(Semaphore::new(ctx.limits.requests)),
        bytes: Arc::new(Semaphore::new(ctx.limits.bytes)),
        limit: ctx.limits.bytes,
    };
    let mut decoder = FrameDecoder::new();
    let mut buf = BytesMut::with_capacity(256 * 1024);
    let mut greeted = false;
    // Bytes taken for the frame being received, before its payload was read.
    let mut reserved: Option<OwnedSemaphorePermit> = None;
    let why: String = 'conn: loop {
        loop {
            let frame = match decoder.decode(&mut buf) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(e) => {
                    refuse(&tx, None, &e);
                    break 'conn format!("undecodable frame: {e}");
                }
            };
            let req = match Request::decode(&frame) {
                Ok(req) => req,
                Err(e) => {
                    refuse(&tx, Some(&frame), &e);
                    break 'conn format!("undecodable request: {e}");
                }
            };
            if let Err(e) = check_greeting(&mut greeted, &req) {
                refuse(&tx, Some(&frame), &e);
                break 'conn e.to_string();
            }
            let cost = cost(&frame, &req).min(budget.limit);
            let mut bytes = reserved.take();
            let have = bytes.as_ref().map_or(0, |p| p.num_permits());
            if cost > have {
                let Some(more) =
                    Budget::take(&budget.bytes, cost - have, &ctx.stats, &mut stop).await
                else {
                    break 'conn "node stopping".into();
                };
                match bytes.as_mut() {
                    Some(b) => b.merge(more),
                    None => bytes = Some(more),
                }
            }
            let Some(slot) = Budget::take(&budget.slots, 1, &ctx.stats, &mut stop).await else {
                break 'conn "node stopping".into();
            };
            dispatch(&ctx, &tx, &frame, req, [Some(slot), bytes]);
        }
        // Budget the payload of the frame being received before reading it.
        if reserved.is_none()
            && let Some(len) = decoder.pending_payload()
            && len > 0
        {
            let want = len.min(budget.limit);
            match Budget::take(&budget.bytes, want, &ctx.stats, &mut stop).await {
                Some(p) => reserved = Some(p),
                None => break "node stopping".into(),
            }
        }
        let want = decoder.bytes_needed(&buf).max(READ_AHEAD);
        buf.reserve(want);
        let mut room = (&mut buf).limit(want);
        tokio::select! {
            // The stop first: a peer that keeps sending must not keep a stopping node reading.
            biased;
            _ = stop.wait_for(|s| *s) => break "node stopping".into(),
            read = rd.read_buf(&mut room) => match read {
                Ok(0) => break "peer closed the connection".into(),
                Ok(_) => {}
                Err(e) => break format!("read failed: {e}"),
            },
        }
    };
    tracing::debug!(%peer, "connection closed: {why}");
    drop(tx);
    let _ = writer.await;
}

/// The first message must be Hello, and only the first.
fn check_greeting(greeted: &mut bool, req: &Request) -> Result<(), ProtoError> {
    let is_hello = matches!(req, Request::Hello { .. });
    if *greeted == is_hello {
        return Err(ProtoError::Malformed {
            what: "connection",
            detail: if *greeted {
                "second Hello"
            } else {
                "first message must be Hello"
            }
            .into(),
        });
    }
    *greeted = true;
    Ok(())
}

/// The bytes a request keeps in memory until its answer is written: its payload, and the data
/// its answer carries.
fn cost(frame: &Frame, req: &Request) -> usize {
    let answer = match req {
        Request::Read { len, .. } | Request::ReadReplica { len, .. } => *len as usize,
        Request::Ping { data } => data.len(),
        _ => 0,
    };
    frame.body.len() + frame.data.len() + answer
}

/// Runs one request in its own task; its answer goes to the writer with its permits.
fn dispatch(
    ctx: &Arc<Ctx>,
    tx: &mpsc::UnboundedSender<Answer>,
    frame: &Frame,
    req: Request,
    permits: [Option<OwnedSemaphorePermit>; 2],
) {
    let id = frame.header.request_id;
    let kind = RequestKind::of(&req);
    let data_path = req.epoch().is_some();
    let call = ctx.service.call(req);
    let tx = tx.clone();
    tokio::spawn(async move {
        let result = call.await;
        let _ = tx.send(Answer {
            id,
            kind,
            result,
            data_path,
            permits: permits.into_iter().flatten().collect(),
        });
    });
}

/// Answers a frame that could not be decoded with `Malformed`, when it had a readable header.
fn refuse(tx: &mpsc::UnboundedSender<Answer>, frame: Option<&Frame>, e: &ProtoError) {
    let Some(frame) = frame else { return };
    let err = WireError::new(ErrorCode::Malformed, e.to_string());
    let _ = tx.send(Answer {
        id: frame.header.request_id,
        kind: RequestKind::from_header(&frame.header),
        result: Err(err),
        data_path: false,
        permits: Vec::new(),
    });
}

async fn write_loop(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Answer>,
    fence: Arc<Fence>,
) {
    let mut queue = OutQueue::new();
    let mut permits = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(a) = next.take() {
            // The last check before the acknowledgement leaves the process.
            let result = match a.result {
                Ok(_) if a.data_path => fence.check().and(a.result),
                other => other,
            };
            let data = encode_response(a.id, &a.kind, &result, queue.head());
            queue.push_data(data);
            permits.extend(a.permits);
            if queue.len() < (4 << 20) {
                next = rx.try_recv().ok();
            }
        }
        while !queue.is_empty() {
            match wr.write_vectored(&queue.slices()).await {
                Ok(0) | Err(_) => return,
                Ok(n) => queue.advance(n),
            }
        }
        permits.clear();
    }
    let _ = wr.shutdown().await;
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
