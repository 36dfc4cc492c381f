//! The TCP server over real sockets: the Hello rule, malformed frames, the lease check on
//! answers, and the per-connection in-flight budget (requests and bytes).

use super::*;
use crate::service::NodeService;
use crate::testing::{shared, sim_store};
use basalt_proto::{FrameHeader, PROTOCOL_VERSION, ResponseFuture, encode_request};
use basalt_types::{Epoch, NodeId, ObjectId, PoolId, Version, VolumeId};
use bytes::Bytes;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

const OID: ObjectId = ObjectId {
    pool: PoolId(1),
    volume: VolumeId(1),
    index: 0,
};

/// A service that answers Hello at once and parks every other request until the test opens
/// the gate, counting what it holds.
struct Gate {
    open: Semaphore,
    calls: AtomicUsize,
    parked_bytes: AtomicUsize,
    most_parked_bytes: AtomicUsize,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            open: Semaphore::new(0),
            calls: AtomicUsize::new(0),
            parked_bytes: AtomicUsize::new(0),
            most_parked_bytes: AtomicUsize::new(0),
        }
    }
}

struct GateService(Arc<Gate>);

impl Service for GateService {
    fn call(&self, req: Request) -> ResponseFuture {
        let gate = self.0.clone();
        Box::pin(async move {
            if let Request::Hello { .. } = req {
                return Ok(hello());
            }
            gate.calls.fetch_add(1, Ordering::SeqCst);
            let held = match &req {
                Request::Write { data, .. } => data.len(),
                _ => 0,
            };
            let now = gate.parked_bytes.fetch_add(held, Ordering::SeqCst) + held;
            gate.most_parked_bytes.fetch_max(now, Ordering::SeqCst);
            gate.open.acquire().await.expect("gate open").forget();
            gate.parked_bytes.fetch_sub(held, Ordering::SeqCst);
            Ok(match req {
                Request::Read { len, .. } => Response::Read {
                    data: Bytes::from(vec![0u8; len as usize]),
                },
                Request::Ping { data } => Response::Pong { data },
                _ => Response::Written {
                    version: Version::new(0, 1),
                    incarnation: 1,
                },
            })
        })
    }
}

fn hello() -> Response {
    Response::Hello {
        version: PROTOCOL_VERSION,
        node: NodeId(9),
        epoch: Epoch(1),
    }
}

struct Server {
    addr: SocketAddr,
    fence: Arc<Fence>,
    stats: Arc<ServerStats>,
    _stop: watch::Sender<bool>,
}

async fn start(service: Arc<dyn Service>, limits: Limits) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fence = Arc::new(Fence::new(NodeId(9), Duration::from_secs(3600)));
    fence.confirmed(tokio::time::Instant::now());
    let stats = Arc::new(ServerStats::default());
    let (stop, rx) = watch::channel(false);
    tokio::spawn(serve(
        listener,
        service,
        fence.clone(),
        limits,
        stats.clone(),
        rx,
    ));
    Server {
        addr,
        fence,
        stats,
        _stop: stop,
    }
}

/// A raw client connection.
struct Client {
    rd: OwnedReadHalf,
    wr: Option<OwnedWriteHalf>,
    /// A task still sending on the connection (it owns the write half).
    writer: Option<tokio::task::JoinHandle<OwnedWriteHalf>>,
    buf: BytesMut,
    dec: FrameDecoder,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        let (rd, wr) = TcpStream::connect(addr).await.unwrap().into_split();
        Client {
            rd,
            wr: Some(wr),
            writer: None,
            buf: BytesMut::new(),
            dec: FrameDecoder::new(),
        }
    }

    fn wr(&mut self) -> &mut OwnedWriteHalf {
        self.wr.as_mut().expect("the write half is here")
    }

    async fn send(&mut self, id: u64, req: &Request) {
        self.wr().write_all(&frame(id, req)).await.unwrap();
    }

    /// The next answer, or None when the server closed the connection.
    async fn answer(&mut self) -> Option<(u64, Result<Response, WireError>)> {
        loop {
            if let Some(f) = self
                .dec
                .decode(&mut self.buf)
                .expect("a well-formed answer")
            {
                return Some((f.header.request_id, Response::decode(&f).unwrap()));
            }
            match self.rd.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    async fn hello(&mut self) {
        self.send(1, &hello_req()).await;
        assert!(matches!(
            self.answer().await,
            Some((1, Ok(Response::Hello { .. })))
        ));
    }
}

fn frame(id: u64, req: &Request) -> BytesMut {
    let mut out = BytesMut::new();
    let data = encode_request(id, req, &mut out);
    out.extend_from_slice(&data);
    out
}

fn hello_req() -> Request {
    Request::Hello {
        min_version: PROTOCOL_VERSION,
        max_version: PROTOCOL_VERSION,
        client: "test".into(),
    }
}

fn write_req(len: usize) -> Request {
    Request::Write {
        epoch: Epoch(1),
        oid: OID,
        offset: 0,
        version: Version::NONE,
        fua: false,
        data: Bytes::from(vec![7u8; len]),
        session: basalt_proto::Session::NONE,
    }
}

fn read_req(len: u32) -> Request {
    Request::Read {
        epoch: Epoch(1),
        oid: OID,
        offset: 0,
        len,
    }
}

/// The real node service over a simulated disk, its lease confirmed.
async fn node_server() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let meta = basalt_meta::EmbeddedStore::open(dir.path().join("meta.redb"))
        .await
        .unwrap();
    let catalog = basalt_meta::Catalog::new(Arc::new(meta));
    let node = shared(
        NodeId(9),
        Duration::from_secs(3600),
        vec![sim_store(1)],
        catalog,
    );
    let server = start(
        Arc::new(NodeService {
            shared: node.clone(),
        }),
        Limits::default(),
    )
    .await;
    node.fence.confirmed(tokio::time::Instant::now());
    server
}

fn is_malformed(a: Option<(u64, Result<Response, WireError>)>, id: u64) -> bool {
    matches!(a, Some((got, Err(e))) if got == id && e.code == ErrorCode::Malformed)
}

#[tokio::test]
async fn a_connection_must_open_with_one_hello() {
    let server = node_server().await;
    let mut c = Client::connect(server.addr).await;
    c.send(5, &Request::Flush { epoch: Epoch(1) }).await;
    assert!(is_malformed(c.answer().await, 5), "a request before Hello");
    assert!(c.answer().await.is_none(), "the connection stays open");

    let mut c = Client::connect(server.addr).await;
    c.send(1, &hello_req()).await;
    match c.answer().await {
        Some((1, Ok(Response::Hello { node, version, .. }))) => {
            assert_eq!((node, version), (NodeId(9), PROTOCOL_VERSION));
        }
        other => panic!("Hello answered with {other:?}"),
    }
    c.send(2, &hello_req()).await;
    assert!(is_malformed(c.answer().await, 2), "a second Hello");
    assert!(c.answer().await.is_none());
}

#[tokio::test]
async fn a_malformed_frame_closes_its_connection_only() {
    let server = node_server().await;
    let mut good = Client::connect(server.addr).await;
    good.hello().await;
    // A payload that fails its checksum: no answer (the frame cannot be trusted), closed.
    let mut bad = Client::connect(server.addr).await;
    bad.hello().await;
    let mut f = frame(3, &write_req(4096));
    let last = f.len() - 1;
    f[last] ^= 1;
    bad.wr().write_all(&f).await.unwrap();
    assert!(bad.answer().await.is_none());
    // A body of the wrong length for its opcode (checksums right): Malformed, then closed.
    let mut bad = Client::connect(server.addr).await;
    bad.hello().await;
    let mut f = frame(4, &Request::Flush { epoch: Epoch(1) });
    f.extend_from_slice(&[0u8; 3]);
    let h = FrameHeader::decode(&f[..32].try_into().unwrap()).unwrap();
    let fixed = FrameHeader {
        body_len: h.body_len + 3,
        payload_crc: basalt_proto::crc32c(&f[32..]),
        ..h
    };
    let mut raw = Vec::new();
    fixed.encode(&mut raw);
    f[..32].copy_from_slice(&raw);
    bad.wr().write_all(&f).await.unwrap();
    assert!(is_malformed(bad.answer().await, 4));
    assert!(bad.answer().await.is_none());
    // Garbage: closed without an answer.
    let mut bad = Client::connect(server.addr).await;
    bad.wr()
        .write_all(b"GET / HTTP/1.1\r\n\r\n0123456789abcdef")
        .await
        .unwrap();
    assert!(bad.answer().await.is_none());
    // The other connection never noticed.
    good.send(
        9,
        &Request::Ping {
            data: Bytes::from_static(b"hi"),
        },
    )
    .await;
    assert!(matches!(good.answer().await, Some((9, Ok(Response::Pong { data }))) if data == "hi"));
}

#[tokio::test]
async fn an_answer_ready_after_the_lease_lapsed_is_not_an_acknowledgement() {
    let gate = Arc::new(Gate::default());
    let server = start(Arc::new(GateService(gate.clone())), Limits::default()).await;
    let mut c = Client::connect(server.addr).await;
    c.hello().await;
    c.send(2, &write_req(4096)).await;
    while gate.calls.load(Ordering::SeqCst) < 1 {
        tokio::task::yield_now().await;
    }
    // The write was accepted while the lease was confirmed; its answer is ready only after.
    server.fence.close();
    gate.open.add_permits(1);
    match c.answer().await {
        Some((2, Err(e))) => assert_eq!(e.code, ErrorCode::Busy, "{e:?}"),
        other => panic!("acknowledged without a lease: {other:?}"),
    }
    // Control-plane answers are not fenced.
    c.send(3, &Request::Ping { data: Bytes::new() }).await;
    gate.open.add_permits(1);
    assert!(matches!(
        c.answer().await,
        Some((3, Ok(Response::Pong { .. })))
    ));
}

/// Sends `requests` on a new connection without reading answers (from a task, which blocks
/// once the server stops reading), until the server pauses the connection or `overflowed`
/// holds (the caller then fails). Returns the connection's reading side.
async fn push_until_paused(
    server: &Server,
    gate: &Gate,
    requests: Vec<Request>,
    overflowed: impl Fn(&Gate) -> bool,
) -> Client {
    let mut c = Client::connect(server.addr).await;
    c.hello().await;
    let mut wr = c.wr.take().unwrap();
    let writer = tokio::spawn(async move {
        for (i, req) in requests.iter().enumerate() {
            wr.write_all(&frame(10 + i as u64, req)).await.unwrap();
        }
        wr
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while server.stats.pauses.load(Ordering::SeqCst) == 0 && !overflowed(gate) {
        assert!(
            std::time::Instant::now() < deadline,
            "the server neither paused nor overflowed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    c.writer = Some(writer);
    c
}

const MIB: usize = 1 << 20;

#[tokio::test]
async fn large_writes_without_reading_answers_cannot_exceed_the_byte_budget() {
    let gate = Arc::new(Gate::default());
    let server = start(Arc::new(GateService(gate.clone())), Limits::default()).await;
    let n = 100;
    let reqs = (0..n).map(|_| write_req(MIB)).collect();
    let over = |g: &Gate| g.most_parked_bytes.load(Ordering::SeqCst) > MAX_IN_FLIGHT_BYTES;
    let mut c = push_until_paused(&server, &gate, reqs, over).await;
    let held = gate.most_parked_bytes.load(Ordering::SeqCst);
    assert!(
        held <= MAX_IN_FLIGHT_BYTES,
        "the node held {held} bytes of writes"
    );
    // The budget is what it got: 63 whole 1 MiB writes (and their bodies) fit in 64 MiB.
    assert_eq!(
        gate.calls.load(Ordering::SeqCst),
        MAX_IN_FLIGHT_BYTES / MIB - 1
    );
    gate.open.add_permits(n);
    for _ in 0..n {
        let (_, answer) = c.answer().await.expect("every write is answered");
        assert!(matches!(answer, Ok(Response::Written { .. })), "{answer:?}");
    }
    assert!(gate.most_parked_bytes.load(Ordering::SeqCst) <= MAX_IN_FLIGHT_BYTES);
}

/// The most bytes the kernel may buffer on one loopback connection (the sender's and the
/// receiver's socket buffers at their largest).
fn socket_buffers() -> usize {
    let max = |path: &str| -> usize {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.split_whitespace().nth(2)?.parse().ok())
            .unwrap_or(16 * MIB)
    };
    max("/proc/sys/net/ipv4/tcp_wmem") + max("/proc/sys/net/ipv4/tcp_rmem")
}

#[tokio::test]
async fn large_reads_whose_answers_are_not_read_cannot_exceed_the_byte_budget() {
    let gate = Arc::new(Gate::default());
    gate.open.add_permits(1 << 20);
    let server = start(Arc::new(GateService(gate.clone())), Limits::default()).await;
    // Enough reads that their answers exceed the budget and every socket buffer.
    let n = (MAX_IN_FLIGHT_BYTES + socket_buffers()) / MIB + 20;
    let reqs = (0..n).map(|_| read_req(MIB as u32)).collect();
    let mut c = push_until_paused(&server, &gate, reqs, |g| {
        g.calls.load(Ordering::SeqCst) == n
    })
    .await;
    // Answers held by the node are within the budget; the rest fit in the kernel's buffers.
    let calls = gate.calls.load(Ordering::SeqCst);
    let bound = MAX_IN_FLIGHT_BYTES / MIB + socket_buffers().div_ceil(MIB);
    assert!(
        calls <= bound,
        "{calls} reads of 1 MiB taken in (at most {bound})"
    );
    for _ in 0..n {
        let (_, answer) = c.answer().await.expect("every read is answered");
        assert!(matches!(answer, Ok(Response::Read { data }) if data.len() == MIB));
    }
}

#[tokio::test]
async fn requests_in_flight_are_capped_by_count() {
    let gate = Arc::new(Gate::default());
    let limits = Limits {
        requests: 4,
        ..Limits::default()
    };
    let server = start(Arc::new(GateService(gate.clone())), limits).await;
    let reqs = (0..10).map(|_| write_req(16)).collect();
    let mut c =
        push_until_paused(&server, &gate, reqs, |g| g.calls.load(Ordering::SeqCst) > 4).await;
    assert_eq!(gate.calls.load(Ordering::SeqCst), 4);
    gate.open.add_permits(10);
    for _ in 0..10 {
        assert!(matches!(
            c.answer().await,
            Some((_, Ok(Response::Written { .. })))
        ));
    }
}
