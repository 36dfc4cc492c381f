//! Bad input never crashes the server or loses data: I/O past the end, garbage on the NBD port,
//! malformed and stale node-protocol frames, and a full device.

mod common;

use basalt_proto::{ErrorCode, Request, Response, encode_request};
use basalt_types::{Epoch, ObjectId, PoolId, Version, VolumeId};
use bytes::{Bytes, BytesMut};
use common::nbd::NbdClient;
use common::node::NodeConn;
use common::{Up, UpOptions};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const EINVAL: u32 = 22;
const ENOSPC: u32 = 28;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

#[test]
fn io_past_the_end_is_refused_and_the_connection_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start(dir.path(), &UpOptions::default());
    let mut c = NbdClient::connect(&up.nbd, "vol0").unwrap();
    let size = c.size;
    let data = pattern(1, 8192);
    assert_eq!(c.write(size - 8192, &data, 0).unwrap(), 0);
    assert_eq!(c.read(size - 4096, 8192).unwrap(), Err(EINVAL));
    assert_eq!(c.write(size - 4096, &data, 0).unwrap(), EINVAL);
    assert_eq!(c.write(size, &data[..512], 0).unwrap(), EINVAL);
    assert_eq!(c.read(u64::MAX - 511, 512).unwrap(), Err(EINVAL));
    // Still usable, and the refused writes changed nothing.
    assert_eq!(c.read(size - 8192, 8192).unwrap().unwrap(), data);
    c.disconnect();
    up.stop();
}

#[test]
fn garbage_on_the_nbd_port_does_not_affect_other_clients() {
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start(dir.path(), &UpOptions::default());
    let mut good = NbdClient::connect(&up.nbd, "vol0").unwrap();
    let data = pattern(2, 4096);
    assert_eq!(good.write(4096, &data, 0).unwrap(), 0);
    for garbage in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        &[0xFFu8; 4096][..],
        &[0u8; 3][..],
    ] {
        let mut bad = TcpStream::connect(&up.nbd).unwrap();
        bad.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let _ = bad.write_all(garbage);
        let mut sink = Vec::new();
        let _ = bad.read_to_end(&mut sink); // the server closes it (or we time out: failure below)
        assert_eq!(good.read(4096, 4096).unwrap().unwrap(), data);
    }
    // Garbage after a successful handshake: a bad request magic.
    let mut bad = NbdClient::connect(&up.nbd, "vol0").unwrap();
    assert!(bad.write_raw(&[0x42; 64]).is_ok());
    assert_eq!(good.read(4096, 4096).unwrap().unwrap(), data);
    good.disconnect();
    up.stop();
}

#[test]
fn malformed_and_stale_node_protocol_frames_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start(dir.path(), &UpOptions::default());
    let mut good = NbdClient::connect(&up.nbd, "vol0").unwrap();
    let data = pattern(3, 65536);
    assert_eq!(good.write(0, &data, 0).unwrap(), 0);
    let vol = up.cli_json(&["volume", "info", "vol0"])["id"]
        .as_u64()
        .unwrap();
    let oid = ObjectId::new(PoolId(1), VolumeId(vol), 0);

    // Not our protocol at all: closed.
    let mut c = NodeConn::connect(&up.node);
    c.s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(c.answer().is_none(), "garbage got an answer");

    // A data request before Hello: Malformed, then closed.
    let mut c = NodeConn::connect(&up.node);
    c.send(5, &Request::Flush { epoch: Epoch(1) });
    assert!(matches!(c.answer(), Some(Err(e)) if e.code == ErrorCode::Malformed));
    assert!(c.answer().is_none());

    // A frame whose payload checksum is wrong: closed, and the write it carried is not applied.
    let mut c = NodeConn::connect(&up.node);
    let epoch = c.hello();
    let mut out = BytesMut::new();
    let payload = encode_request(
        9,
        &Request::Write {
            epoch,
            oid,
            offset: 0,
            version: Version::NONE,
            fua: true,
            data: Bytes::from(vec![0u8; 4096]),
            session: basalt_proto::Session::NONE,
        },
        &mut out,
    );
    out.extend_from_slice(&payload);
    let last = out.len() - 1;
    out[last] ^= 0x01;
    c.s.write_all(&out).unwrap();
    assert!(c.answer().is_none(), "a corrupt frame was answered");

    // A stale epoch is refused with the node's epoch; a range past the object is refused.
    let mut c = NodeConn::connect(&up.node);
    let epoch = c.hello();
    c.send(
        2,
        &Request::Write {
            epoch: Epoch(0),
            oid,
            offset: 0,
            version: Version::NONE,
            fua: true,
            data: Bytes::from(vec![0u8; 4096]),
            session: basalt_proto::Session::NONE,
        },
    );
    match c.answer() {
        Some(Err(e)) => {
            assert_eq!(e.code, ErrorCode::StaleEpoch);
            assert_eq!(e.epoch, epoch);
        }
        other => panic!("stale write answered {other:?}"),
    }
    c.send(
        3,
        &Request::Read {
            epoch,
            oid,
            offset: 128 << 10,
            len: 4096,
        },
    );
    assert!(matches!(c.answer(), Some(Err(e)) if e.code == ErrorCode::InvalidArgument));
    c.send(
        4,
        &Request::Read {
            epoch,
            oid,
            offset: 0,
            len: 4096,
        },
    );
    match c.answer() {
        Some(Ok(Response::Read { data: got })) => assert_eq!(&got[..], &data[..4096]),
        other => panic!("read answered {other:?}"),
    }
    // Nothing above changed the data.
    assert_eq!(good.read(0, 65536).unwrap().unwrap(), data);
    good.disconnect();
    up.stop();
}

#[test]
fn a_full_device_refuses_new_data_and_keeps_the_old() {
    let dir = tempfile::tempdir().unwrap();
    // A 64 MiB device under a 256 MiB (thin) volume.
    let opts = UpOptions {
        device_size: "64MiB",
        volume_size: "256MiB",
        extra: vec![],
    };
    let up = Up::start(dir.path(), &opts);
    let mut c = NbdClient::connect(&up.nbd, "vol0").unwrap();
    let chunk = 1 << 20;
    let mut written = Vec::new();
    let mut full_at = None;
    for i in 0..256u64 {
        let data = pattern(i as u8, chunk);
        match c.write(i * chunk as u64, &data, 0).unwrap() {
            0 => written.push((i, data)),
            ENOSPC => {
                full_at = Some(i);
                break;
            }
            other => panic!("write {i} failed with {other}"),
        }
    }
    let full_at = full_at.expect("a 64 MiB device never ran out of space");
    assert!(
        written.len() >= 32,
        "only {} MiB fit on a 64 MiB device",
        written.len()
    );
    // Still full for new data, but overwrites of allocated data work, and nothing was lost.
    assert_eq!(
        c.write((full_at + 1) * chunk as u64, &pattern(9, 4096), 0)
            .unwrap(),
        ENOSPC
    );
    let (i0, _) = written[0];
    let again = pattern(200, chunk);
    assert_eq!(c.write(i0 * chunk as u64, &again, 0).unwrap(), 0);
    written[0].1 = again;
    for (i, data) in &written {
        assert!(
            c.read(i * chunk as u64, chunk as u32).unwrap().unwrap() == *data,
            "MiB {i} changed"
        );
    }
    // Trimming frees space for new data.
    for (i, _) in written.iter().skip(1).take(8) {
        c.trim(i * chunk as u64, chunk as u32).unwrap();
    }
    assert_eq!(
        c.write(full_at * chunk as u64, &pattern(7, chunk), 0)
            .unwrap(),
        0
    );
    c.disconnect();
    // And it all survives a restart.
    up.stop();
    let up = Up::start(dir.path(), &opts);
    let mut c = NbdClient::connect(&up.nbd, "vol0").unwrap();
    let (i0, d0) = &written[0];
    assert!(c.read(i0 * chunk as u64, chunk as u32).unwrap().unwrap() == *d0);
    assert!(
        c.read(full_at * chunk as u64, chunk as u32)
            .unwrap()
            .unwrap()
            == pattern(7, chunk)
    );
    c.disconnect();
    up.stop();
}
