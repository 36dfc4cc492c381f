//! The network baseline, measured by Basalt itself: TCP throughput and round-trip time.
//!
//! A probe server ([`serve`]) answers two kinds of connections, chosen by the first byte:
//! * `T`: the client streams data for a while and half-closes; the server replies with the number
//!   of bytes it received (u64, little-endian). Throughput = bytes / time until that reply.
//! * `P`: ping-pong; the server echoes each 64-byte message. RTT = time for one exchange.
//!
//! [`NetProbe`] is the seam: [`LoopbackProbe`] runs a server thread on 127.0.0.1:0 (what a
//! single-host run measures); [`TcpProbe`] measures against a server on a given address (the
//! lead can later point one at each node through the client library).

use crate::error::BenchError;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const PING: usize = 64;

/// The result of one network probe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetBaseline {
    pub path: String,
    /// Bytes per second, one TCP stream.
    pub throughput_bytes_s: f64,
    pub rtt_mean_us: f64,
    pub rtt_p50_us: f64,
    pub rtt_p99_us: f64,
    pub pings: usize,
}

impl NetBaseline {
    pub fn gbit_s(&self) -> f64 {
        self.throughput_bytes_s * 8.0 / 1e9
    }
}

/// Something that can measure the network path to one peer.
pub trait NetProbe {
    /// A short name of the path, e.g. `loopback 127.0.0.1`.
    fn path(&self) -> String;
    /// Measures throughput for `duration`, then `pings` round trips.
    fn measure(&self, duration: Duration, pings: usize) -> Result<NetBaseline, BenchError>;
}

/// Measures against a probe server at `addr`.
#[derive(Debug, Clone)]
pub struct TcpProbe {
    pub addr: SocketAddr,
}

impl NetProbe for TcpProbe {
    fn path(&self) -> String {
        format!("tcp {}", self.addr)
    }

    fn measure(&self, duration: Duration, pings: usize) -> Result<NetBaseline, BenchError> {
        let net = |e: std::io::Error| BenchError::Net(format!("{}: {e}", self.addr));
        // Throughput: stream 1 MiB writes until the duration is over, then wait for the count.
        let mut s = TcpStream::connect(self.addr).map_err(net)?;
        s.write_all(b"T").map_err(net)?;
        let buf = vec![0x5au8; 1 << 20];
        let start = Instant::now();
        let mut sent = 0u64;
        while start.elapsed() < duration {
            s.write_all(&buf).map_err(net)?;
            sent += buf.len() as u64;
        }
        s.shutdown(std::net::Shutdown::Write).map_err(net)?;
        let mut n = [0u8; 8];
        s.read_exact(&mut n).map_err(net)?;
        let secs = start.elapsed().as_secs_f64();
        let received = u64::from_le_bytes(n);
        if received != sent {
            return Err(BenchError::Net(format!(
                "sent {sent} bytes but the server counted {received}"
            )));
        }
        // Round trips.
        let mut p = TcpStream::connect(self.addr).map_err(net)?;
        p.set_nodelay(true).map_err(net)?;
        p.write_all(b"P").map_err(net)?;
        let mut msg = [7u8; PING];
        let mut rtts = Vec::with_capacity(pings);
        for _ in 0..pings.max(1) {
            let t = Instant::now();
            p.write_all(&msg).map_err(net)?;
            p.read_exact(&mut msg).map_err(net)?;
            rtts.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let mut b = summarize(received as f64 / secs, rtts);
        b.path = self.path();
        Ok(b)
    }
}

/// A baseline from a throughput and round-trip samples in microseconds (at least one).
pub(crate) fn summarize(throughput_bytes_s: f64, mut rtts: Vec<f64>) -> NetBaseline {
    if rtts.is_empty() {
        rtts.push(0.0);
    }
    rtts.sort_by(f64::total_cmp);
    let q = |f: f64| rtts[((rtts.len() - 1) as f64 * f).round() as usize];
    NetBaseline {
        path: String::new(),
        throughput_bytes_s,
        rtt_mean_us: rtts.iter().sum::<f64>() / rtts.len() as f64,
        rtt_p50_us: q(0.5),
        rtt_p99_us: q(0.99),
        pings: rtts.len(),
    }
}

/// A probe server on 127.0.0.1 in a background thread, measured through [`TcpProbe`].
#[derive(Debug)]
pub struct LoopbackProbe {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl LoopbackProbe {
    pub fn start() -> Result<LoopbackProbe, BenchError> {
        let l =
            TcpListener::bind("127.0.0.1:0").map_err(|e| BenchError::Net(format!("bind: {e}")))?;
        let addr = l.local_addr().map_err(|e| BenchError::Net(e.to_string()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::spawn(move || serve_until(l, &flag));
        Ok(LoopbackProbe { addr, stop })
    }
}

impl Drop for LoopbackProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr); // wakes the accept loop so it sees the flag
    }
}

impl NetProbe for LoopbackProbe {
    fn path(&self) -> String {
        format!("loopback {}", self.addr.ip())
    }
    fn measure(&self, duration: Duration, pings: usize) -> Result<NetBaseline, BenchError> {
        let mut b = TcpProbe { addr: self.addr }.measure(duration, pings)?;
        b.path = self.path();
        Ok(b)
    }
}

/// Serves probe connections on `listener` forever (run it on every node to probe between nodes).
pub fn serve(listener: TcpListener) {
    serve_until(listener, &AtomicBool::new(false));
}

fn serve_until(listener: TcpListener, stop: &AtomicBool) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(s) = conn else { continue };
        std::thread::spawn(move || {
            let _ = handle(s);
        });
    }
}

fn handle(mut s: TcpStream) -> std::io::Result<()> {
    let mut kind = [0u8; 1];
    s.read_exact(&mut kind)?;
    match kind[0] {
        b'T' => {
            let mut buf = vec![0u8; 1 << 20];
            let mut total = 0u64;
            loop {
                let n = s.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
            s.write_all(&total.to_le_bytes())
        }
        b'P' => {
            s.set_nodelay(true)?;
            let mut msg = [0u8; PING];
            loop {
                if s.read_exact(&mut msg).is_err() {
                    return Ok(());
                }
                s.write_all(&msg)?;
            }
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_probe_measures_something_real() {
        let p = LoopbackProbe::start().expect("starts");
        let b = p.measure(Duration::from_millis(200), 50).expect("measures");
        assert!(b.throughput_bytes_s > 1e6, "{b:?}");
        assert_eq!(b.pings, 50);
        assert!(b.rtt_p50_us > 0.0 && b.rtt_p50_us <= b.rtt_p99_us, "{b:?}");
        assert!(b.path.starts_with("loopback"));
    }

    #[test]
    fn unreachable_peer_is_a_clear_error() {
        let addr: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        let e = TcpProbe { addr }
            .measure(Duration::from_millis(10), 1)
            .expect_err("refused");
        assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
    }
}
