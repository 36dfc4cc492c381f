//! Test helpers: an in-process server on 127.0.0.1:0 with its own runtime, a small blocking NBD
//! client written independently of the server's code (so a shared misreading of the protocol
//! cannot hide), and a runner for external tools with a deadline.

#![allow(dead_code)]

use basalt_nbd::{MemCatalog, NbdError, NbdServer, ServerConfig};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const SIMPLE_MAGIC: u32 = 0x6744_6698;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const FLAG_FUA: u16 = 1;

pub const EPERM: u32 = 1;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const ESHUTDOWN: u32 = 108;

/// How long any single wait in a test may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A server running on its own runtime; shut down on drop.
pub struct TestServer {
    pub addr: SocketAddr,
    pub catalog: Arc<MemCatalog>,
    rt: Option<tokio::runtime::Runtime>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<Result<(), NbdError>>>,
}

impl TestServer {
    pub fn start(catalog: MemCatalog, config: ServerConfig) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let catalog = Arc::new(catalog);
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = NbdServer::new(Arc::clone(&catalog), config);
        let done = rt.spawn(async move {
            server
                .serve(listener, async {
                    let _ = stopped.await;
                })
                .await
        });
        TestServer {
            addr,
            catalog,
            rt: Some(rt),
            stop: Some(stop),
            done: Some(done),
        }
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd://{}/{}", self.addr, export)
    }

    /// Triggers shutdown and waits for `serve` to return.
    pub fn stop(&mut self) -> Result<(), NbdError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let done = self.done.take().expect("stopped once");
        let rt = self.rt.as_ref().expect("runtime");
        rt.block_on(async { tokio::time::timeout(DEADLINE, done).await })
            .expect("server stopped within the deadline")
            .expect("server task did not panic")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

/// A reply to a transmission request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub cookie: u64,
    pub error: u32,
    pub data: Vec<u8>,
}

/// A blocking NBD client speaking raw bytes.
pub struct RawClient {
    pub sock: TcpStream,
    /// READ lengths of requests in flight, by cookie (simple replies carry no length).
    pending_reads: HashMap<u64, usize>,
}

impl RawClient {
    /// Connects and reads the greeting; returns the handshake flags too.
    pub fn connect(addr: SocketAddr) -> (Self, u16) {
        let sock = TcpStream::connect(addr).expect("connect");
        sock.set_read_timeout(Some(DEADLINE)).expect("timeout");
        sock.set_nodelay(true).expect("nodelay");
        let mut c = RawClient {
            sock,
            pending_reads: HashMap::new(),
        };
        assert_eq!(c.u64(), NBDMAGIC);
        assert_eq!(c.u64(), IHAVEOPT);
        let flags = c.u16();
        (c, flags)
    }

    /// Connects and sends fixed-newstyle + no-zeroes client flags.
    pub fn negotiating(addr: SocketAddr) -> Self {
        let (mut c, flags) = Self::connect(addr);
        assert_eq!(flags, 0b11, "server offers FIXED_NEWSTYLE and NO_ZEROES");
        c.send(&3u32.to_be_bytes());
        c
    }

    /// A full handshake with GO; returns the client, the size and the transmission flags.
    pub fn go(addr: SocketAddr, name: &str) -> (Self, u64, u16) {
        let mut c = Self::negotiating(addr);
        c.option(OPT_GO, &info_request(name, &[]));
        let (size, flags) = c.info_until_ack(OPT_GO).export.expect("INFO_EXPORT");
        (c, size, flags)
    }

    pub fn send(&mut self, b: &[u8]) {
        self.sock.write_all(b).expect("send");
    }

    pub fn option(&mut self, option: u32, data: &[u8]) {
        let mut b = Vec::new();
        b.extend_from_slice(&IHAVEOPT.to_be_bytes());
        b.extend_from_slice(&option.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.send(&b);
    }

    /// Reads one option reply: (option, reply type, data).
    pub fn option_reply(&mut self) -> (u32, u32, Vec<u8>) {
        assert_eq!(self.u64(), REPLY_MAGIC);
        let option = self.u32();
        let rep = self.u32();
        let len = self.u32() as usize;
        (option, rep, self.bytes(len))
    }

    /// Reads NBD_REP_INFO replies up to the final ACK (or error).
    pub fn info_until_ack(&mut self, option: u32) -> InfoReplies {
        let mut out = InfoReplies::default();
        loop {
            let (opt, rep, data) = self.option_reply();
            assert_eq!(opt, option);
            match rep {
                REP_INFO => {
                    let item = u16::from_be_bytes([data[0], data[1]]);
                    let d = &data[2..];
                    match item {
                        0 => {
                            out.export = Some((
                                u64::from_be_bytes(d[0..8].try_into().unwrap()),
                                u16::from_be_bytes(d[8..10].try_into().unwrap()),
                            ))
                        }
                        1 => out.name = Some(String::from_utf8(d.to_vec()).unwrap()),
                        2 => out.description = Some(String::from_utf8(d.to_vec()).unwrap()),
                        3 => {
                            let w = |i: usize| u32::from_be_bytes(d[i..i + 4].try_into().unwrap());
                            out.block_size = Some((w(0), w(4), w(8)));
                        }
                        other => panic!("unexpected info item {other}"),
                    }
                }
                REP_ACK => return out,
                err => {
                    out.error = Some((err, String::from_utf8_lossy(&data).into_owned()));
                    return out;
                }
            }
        }
    }

    pub fn request(&mut self, kind: u16, flags: u16, cookie: u64, offset: u64, len: u32) {
        self.request_with(kind, flags, cookie, offset, len, &[]);
    }

    pub fn request_with(
        &mut self,
        kind: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        len: u32,
        data: &[u8],
    ) {
        let mut b = Vec::with_capacity(28 + data.len());
        b.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&kind.to_be_bytes());
        b.extend_from_slice(&cookie.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(data);
        if kind == CMD_READ {
            self.pending_reads.insert(cookie, len as usize);
        }
        self.send(&b);
    }

    pub fn write(&mut self, cookie: u64, offset: u64, data: &[u8], flags: u16) {
        self.request_with(CMD_WRITE, flags, cookie, offset, data.len() as u32, data);
    }

    /// Reads one simple reply (with READ data when it succeeded).
    pub fn reply(&mut self) -> Reply {
        assert_eq!(self.u32(), SIMPLE_MAGIC);
        let error = self.u32();
        let cookie = self.u64();
        let len = self.pending_reads.remove(&cookie).unwrap_or(0);
        let data = if error == 0 {
            self.bytes(len)
        } else {
            Vec::new()
        };
        Reply {
            cookie,
            error,
            data,
        }
    }

    /// Sends one request and waits for its reply.
    pub fn call(&mut self, kind: u16, flags: u16, offset: u64, len: u32, data: &[u8]) -> Reply {
        self.request_with(kind, flags, 7, offset, len, data);
        let r = self.reply();
        assert_eq!(r.cookie, 7);
        r
    }

    /// True when the server closed the connection (EOF or reset) before sending anything more.
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        match self.sock.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ),
        }
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        self.sock.read_exact(&mut b).expect("read from server");
        b
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.bytes(2).try_into().unwrap())
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.bytes(4).try_into().unwrap())
    }

    pub fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.bytes(8).try_into().unwrap())
    }
}

/// What INFO/GO answered.
#[derive(Debug, Default)]
pub struct InfoReplies {
    pub export: Option<(u64, u16)>,
    pub name: Option<String>,
    pub description: Option<String>,
    pub block_size: Option<(u32, u32, u32)>,
    pub error: Option<(u32, String)>,
}

/// The data of INFO/GO.
pub fn info_request(name: &str, items: &[u16]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(name.len() as u32).to_be_bytes());
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(&(items.len() as u16).to_be_bytes());
    for i in items {
        b.extend_from_slice(&i.to_be_bytes());
    }
    b
}

/// Polls `cond` until it holds or the deadline passes.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Output of an external tool.
pub struct ToolOutput {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs an external tool, killing it if it outlives `limit`. Panics with an install hint when
/// the tool is missing.
pub fn run_tool(program: &str, args: &[&str], limit: Duration) -> ToolOutput {
    let dir = tempfile::tempdir().expect("tempdir");
    let out_path = dir.path().join("stdout");
    let err_path = dir.path().join("stderr");
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {program}: {e}; install it (apt-get install libnbd-bin \
                 python3-libnbd qemu-utils fio nbdkit)"
            )
        });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{program} {args:?} did not finish within {limit:?}; stderr: {}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    ToolOutput {
        status,
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    }
}

/// Runs a tool and panics with its output unless it succeeds.
pub fn run_ok(program: &str, args: &[&str], limit: Duration) -> String {
    let out = run_tool(program, args, limit);
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    out.stdout
}
