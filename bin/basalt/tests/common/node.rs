//! A raw node-protocol connection: for tests that send the node what a client library would
//! not (garbage, stale epochs, writes a stale gateway could still make).

use basalt_proto::{FrameDecoder, Request, Response, encode_request};
use basalt_types::Epoch;
use bytes::BytesMut;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A raw node-protocol connection.
pub struct NodeConn {
    pub s: TcpStream,
    buf: BytesMut,
    dec: FrameDecoder,
}

impl NodeConn {
    pub fn connect(addr: &str) -> NodeConn {
        NodeConn::over(TcpStream::connect(addr).unwrap())
    }

    /// A connection made elsewhere (e.g. from another network namespace).
    pub fn over(s: TcpStream) -> NodeConn {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        NodeConn {
            s,
            buf: BytesMut::new(),
            dec: FrameDecoder::new(),
        }
    }

    pub fn send(&mut self, id: u64, req: &Request) {
        let mut out = BytesMut::new();
        let data = encode_request(id, req, &mut out);
        out.extend_from_slice(&data);
        self.s.write_all(&out).unwrap();
    }

    /// The next answer, or None when the node closed the connection.
    pub fn answer(&mut self) -> Option<Result<Response, basalt_proto::WireError>> {
        loop {
            if let Some(f) = self
                .dec
                .decode(&mut self.buf)
                .expect("node sent a bad frame")
            {
                return Some(Response::decode(&f).unwrap());
            }
            let mut chunk = [0u8; 65536];
            match self.s.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    pub fn hello(&mut self) -> Epoch {
        self.send(
            1,
            &Request::Hello {
                min_version: basalt_proto::PROTOCOL_VERSION,
                max_version: basalt_proto::PROTOCOL_VERSION,
                client: "test".into(),
            },
        );
        match self.answer() {
            Some(Ok(Response::Hello { epoch, .. })) => epoch,
            other => panic!("bad Hello answer: {other:?}"),
        }
    }
}
