//! A pipelined TCP connection to one node.
//!
//! Callers hand requests to a writer task through a channel; the writer assigns request ids,
//! registers the reply slot, and writes every queued frame in one batch (one syscall for many
//! requests under load). A reader task decodes response frames and completes the matching reply
//! slots, in whatever order the node answers.

use basalt_proto::{
    ErrorCode, FrameDecoder, OutQueue, PROTOCOL_VERSION, Request, Response, ResponseFuture,
    Service, WireError, encode_request,
};
use basalt_types::{Epoch, NodeId};
use bytes::BytesMut;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot};

type Reply = oneshot::Sender<Result<Response, WireError>>;

struct Outgoing {
    req: Request,
    reply: Reply,
}

struct Shared {
    pending: Mutex<HashMap<u64, Reply>>,
    closed: AtomicBool,
    peer: String,
}

impl Shared {
    /// Marks the link dead and fails every request still waiting for an answer.
    fn close(&self, why: &str) {
        self.closed.store(true, Ordering::Release);
        let pending: Vec<Reply> = self.pending.lock().drain().map(|(_, r)| r).collect();
        for reply in pending {
            let _ = reply.send(Err(lost(&self.peer, why)));
        }
    }
}

fn lost(peer: &str, why: &str) -> WireError {
    WireError::new(
        ErrorCode::ShuttingDown,
        format!("connection to {peer} lost: {why}"),
    )
}

/// A connected, handshaken link to a node.
pub struct TcpLink {
    tx: mpsc::UnboundedSender<Outgoing>,
    shared: Arc<Shared>,
    node: NodeId,
    epoch: Epoch,
}

impl TcpLink {
    /// Connects to `addr`, exchanges Hello, and starts the reader and writer tasks.
    pub async fn connect(addr: &str, client: &str, timeout: Duration) -> Result<TcpLink, String> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| format!("connect timed out after {timeout:?}"))?
            .map_err(|e| e.to_string())?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (mut rd, mut wr) = stream.into_split();
        let hello = Request::Hello {
            min_version: PROTOCOL_VERSION,
            max_version: PROTOCOL_VERSION,
            client: client.to_string(),
        };
        let mut out = BytesMut::new();
        encode_request(0, &hello, &mut out);
        wr.write_all(&out).await.map_err(|e| e.to_string())?;
        let mut buf = BytesMut::with_capacity(64 * 1024);
        let mut decoder = FrameDecoder::new();
        let frame = tokio::time::timeout(timeout, read_frame(&mut rd, &mut buf, &mut decoder))
            .await
            .map_err(|_| format!("no Hello answer within {timeout:?}"))??;
        let (node, epoch) = match Response::decode(&frame).map_err(|e| e.to_string())? {
            Ok(Response::Hello {
                version,
                node,
                epoch,
            }) if version == PROTOCOL_VERSION => (node, epoch),
            Ok(other) => return Err(format!("unexpected answer to Hello: {other:?}")),
            Err(e) => return Err(format!("node refused the handshake: {e}")),
        };
        let shared = Arc::new(Shared {
            pending: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            peer: addr.to_string(),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(wr, rx, shared.clone()));
        tokio::spawn(read_loop(rd, buf, decoder, shared.clone()));
        Ok(TcpLink {
            tx,
            shared,
            node,
            epoch,
        })
    }

    /// The node's id, from its Hello answer.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// The node's map epoch when the connection was made.
    pub fn epoch_at_connect(&self) -> Epoch {
        self.epoch
    }

    /// False once the connection has failed; the owner should reconnect.
    pub fn is_open(&self) -> bool {
        !self.shared.closed.load(Ordering::Acquire)
    }
}

impl Service for TcpLink {
    fn call(&self, req: Request) -> ResponseFuture {
        let (reply, rx) = oneshot::channel();
        let sent = self.is_open() && self.tx.send(Outgoing { req, reply }).is_ok();
        let peer = self.shared.peer.clone();
        Box::pin(async move {
            if !sent {
                return Err(lost(&peer, "link closed"));
            }
            rx.await
                .unwrap_or_else(|_| Err(lost(&peer, "writer stopped")))
        })
    }
}

impl Drop for TcpLink {
    fn drop(&mut self) {
        self.shared.close("link dropped");
    }
}

async fn read_frame(
    rd: &mut OwnedReadHalf,
    buf: &mut BytesMut,
    decoder: &mut FrameDecoder,
) -> Result<basalt_proto::Frame, String> {
    loop {
        if let Some(frame) = decoder.decode(buf).map_err(|e| e.to_string())? {
            return Ok(frame);
        }
        buf.reserve(64 * 1024);
        if rd.read_buf(buf).await.map_err(|e| e.to_string())? == 0 {
            return Err("connection closed by the node".into());
        }
    }
}

async fn read_loop(
    mut rd: OwnedReadHalf,
    mut buf: BytesMut,
    mut decoder: FrameDecoder,
    shared: Arc<Shared>,
) {
    let why = loop {
        let frame = match read_frame(&mut rd, &mut buf, &mut decoder).await {
            Ok(f) => f,
            Err(e) => break e,
        };
        let result = match Response::decode(&frame) {
            Ok(r) => r,
            Err(e) => break format!("undecodable response: {e}"),
        };
        let reply = shared.pending.lock().remove(&frame.header.request_id);
        match reply {
            Some(reply) => {
                let _ = reply.send(result);
            }
            None => break format!("answer to unknown request {}", frame.header.request_id),
        }
    };
    shared.close(&why);
}

/// Stop adding requests to a batch once this many bytes are queued.
const BATCH_BYTES: usize = 4 << 20;

async fn write_loop(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    shared: Arc<Shared>,
) {
    let mut next_id: u64 = 1;
    let mut queue = OutQueue::new();
    while let Some(first) = rx.recv().await {
        let mut item = Some(first);
        while let Some(Outgoing { req, reply }) = item.take() {
            let id = next_id;
            next_id += 1;
            shared.pending.lock().insert(id, reply);
            let data = encode_request(id, &req, queue.head());
            queue.push_data(data);
            if queue.len() < BATCH_BYTES {
                item = rx.try_recv().ok();
            }
        }
        if let Err(e) = flush_queue(&mut wr, &mut queue).await {
            shared.close(&format!("write failed: {e}"));
            return;
        }
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
    }
}

/// Writes everything queued with vectored writes.
async fn flush_queue(wr: &mut OwnedWriteHalf, queue: &mut OutQueue) -> std::io::Result<()> {
    while !queue.is_empty() {
        let n = wr.write_vectored(&queue.slices()).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        queue.advance(n);
    }
    Ok(())
}
