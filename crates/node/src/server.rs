//! The node's TCP server: one task per connection reading frames, a task per request calling
//! the [`NodeService`], and a writer task batching the answers (in completion order).
//!
//! A connection must open with Hello. A frame that fails to decode gets a `Malformed` error
//! answer (when its header was readable) and the connection is closed; other connections are
//! not affected. Each connection has at most [`MAX_IN_FLIGHT`] requests in flight; past that the
//! server stops reading from it (backpressure).

use crate::service::NodeService;
use basalt_proto::{
    ErrorCode, Frame, FrameDecoder, OutQueue, ProtoError, Request, RequestKind, Response,
    WireError, encode_response,
};
use bytes::BytesMut;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

/// Requests one connection may have in flight.
pub const MAX_IN_FLIGHT: usize = 1024;

/// An answer ready to be written. The permit is released only once the answer has been written,
/// so a client that does not read its answers stops being read from.
type Answer = (
    u64,
    RequestKind,
    Result<Response, WireError>,
    Option<OwnedSemaphorePermit>,
);

/// Accepts connections until `stop` turns true.
pub(crate) async fn serve(
    listener: TcpListener,
    service: NodeService,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                tokio::spawn(connection(stream, peer, service.clone(), stop.clone()));
            }
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::task::yield_now().await;
            }
        }
    }
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    service: NodeService,
    mut stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let (mut rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::unbounded_channel::<Answer>();
    let writer = tokio::spawn(write_loop(wr, rx));
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut decoder = FrameDecoder::new();
    let mut buf = BytesMut::with_capacity(256 * 1024);
    let mut greeted = false;
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
            let is_hello = matches!(req, Request::Hello { .. });
            if greeted == is_hello {
                let e = ProtoError::Malformed {
                    what: "connection",
                    detail: if greeted {
                        "second Hello"
                    } else {
                        "first message must be Hello"
                    }
                    .into(),
                };
                refuse(&tx, Some(&frame), &e);
                break 'conn e.to_string();
            }
            greeted = true;
            let Ok(permit) = slots.clone().acquire_owned().await else {
                break 'conn "closing".into();
            };
            let id = frame.header.request_id;
            let kind = RequestKind::of(&req);
            let tx = tx.clone();
            let svc = service.clone();
            tokio::spawn(async move {
                let result = svc.shared.handle(req).await;
                let _ = tx.send((id, kind, result, Some(permit)));
            });
        }
        buf.reserve(64 * 1024);
        tokio::select! {
            read = rd.read_buf(&mut buf) => match read {
                Ok(0) => break "peer closed the connection".into(),
                Ok(_) => {}
                Err(e) => break format!("read failed: {e}"),
            },
            _ = stop.wait_for(|s| *s) => break "node stopping".into(),
        }
    };
    tracing::debug!(%peer, "connection closed: {why}");
    drop(tx);
    let _ = writer.await;
}

/// Answers a frame that could not be decoded with `Malformed`, when it had a readable header.
fn refuse(tx: &mpsc::UnboundedSender<Answer>, frame: Option<&Frame>, e: &ProtoError) {
    let Some(frame) = frame else { return };
    let err = WireError::new(ErrorCode::Malformed, e.to_string());
    let _ = tx.send((
        frame.header.request_id,
        RequestKind::from_header(&frame.header),
        Err(err),
        None,
    ));
}

async fn write_loop(mut wr: OwnedWriteHalf, mut rx: mpsc::UnboundedReceiver<Answer>) {
    let mut queue = OutQueue::new();
    let mut permits = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some((id, kind, result, permit)) = next.take() {
            let data = encode_response(id, &kind, &result, queue.head());
            queue.push_data(data);
            permits.extend(permit);
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
