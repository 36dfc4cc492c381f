//! Resize and delete under open connections: an open NBD connection follows its volume's record
//! (I/O past a shrunk end is refused, a deleted volume refuses I/O); a stale writer that missed
//! the shrink is refused by the node, and the range past the old end reads as zeros after the
//! volume grows again.

mod common;

use basalt_proto::{ErrorCode, Request, Response};
use basalt_types::{ObjectId, PoolId, Version, VolumeId};
use bytes::Bytes;
use common::nbd::NbdClient;
use common::node::NodeConn;
use common::{Up, UpOptions, wait_until};
use std::time::Duration;

const EINVAL: u32 = 22;
const EIO: u32 = 5;
const KIB: u64 = 1024;

fn resize(up: &Up, name: &str, size: u64) {
    up.cli_json(&[
        "volume",
        "resize",
        name,
        "--size",
        &size.to_string(),
        "--allow-shrink",
    ]);
}

#[test]
fn an_open_connection_follows_resize_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start(dir.path(), &UpOptions::default());
    up.cli_json(&["volume", "create", "r", "--size", "1MiB"]);
    let mut c = NbdClient::connect(&up.nbd, "r").unwrap();
    let tail = 768 * KIB;
    assert_eq!(c.write(tail, &[0xBB; 4096], 1).unwrap(), 0);

    // Shrunk under the connection: its reads past the new end fail, I/O before it still works.
    resize(&up, "r", 512 * KIB);
    wait_until(
        "the open connection sees the shrink",
        Duration::from_secs(10),
        || c.read(tail, 4096).unwrap() == Err(EINVAL),
    );
    assert_eq!(c.write(tail, &[0xCC; 4096], 0).unwrap(), EINVAL);
    assert_eq!(c.write(0, &[0xDD; 4096], 1).unwrap(), 0);
    assert_eq!(c.read(0, 4096).unwrap().unwrap(), vec![0xDD; 4096]);

    // Grown back: the range is usable again on the same connection, and reads as zeros.
    resize(&up, "r", 1 << 20);
    wait_until(
        "the open connection sees the grow",
        Duration::from_secs(10),
        || c.read(tail, 4096).unwrap().is_ok(),
    );
    assert_eq!(c.read(tail, 4096).unwrap().unwrap(), vec![0u8; 4096]);

    // Deleted, then re-created under the same name: the old connection stays refused (it must
    // never reach the new volume's data), a new connection serves the new volume.
    up.cli_json(&["volume", "delete", "r"]);
    wait_until(
        "the open connection sees the delete",
        Duration::from_secs(10),
        || c.read(0, 4096).unwrap() == Err(EIO),
    );
    assert_eq!(c.write(0, &[0xEE; 4096], 1).unwrap(), EIO);
    up.cli_json(&["volume", "create", "r", "--size", "1MiB"]);
    let mut d = NbdClient::connect(&up.nbd, "r").unwrap();
    assert_eq!(d.write(4096, &[0x11; 4096], 1).unwrap(), 0);
    assert_eq!(c.read(4096, 4096).unwrap(), Err(EIO));
    assert_eq!(d.read(0, 8192).unwrap().unwrap()[..4096], [0u8; 4096]);
    c.disconnect();
    d.disconnect();
    up.stop();
}

/// A gateway that has not seen a shrink still sends writes past the new end (its writes go to
/// the node directly; here, a raw node connection plays that gateway): the node refuses them,
/// zeroing past the end is still allowed (it removes data), and growing the volume again shows
/// zeros there.
#[test]
fn a_stale_writer_past_a_shrunk_end_is_refused_and_a_grow_shows_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start(dir.path(), &UpOptions::default());
    let pools = up.cli_json(&["pool", "list"]);
    let pool = &pools.as_array().unwrap()[0];
    let (pool_id, os) = (
        PoolId(pool["id"].as_u64().unwrap() as u32),
        pool["object_size"].as_u64().unwrap(),
    );
    let size = 8 * os;
    let vol = up.cli_json(&["volume", "create", "g", "--size", &size.to_string()])["id"]
        .as_u64()
        .unwrap();
    let mut c = NbdClient::connect(&up.nbd, "g").unwrap();
    assert_eq!(c.write(0, &vec![0xAA; size as usize], 1).unwrap(), 0);
    c.disconnect();

    // Shrink to the middle of object 4 (plus a block).
    let keep = 4 * os + 4096;
    resize(&up, "g", keep);

    let mut n = NodeConn::connect(&up.node);
    let epoch = n.hello();
    let stale = |index: u64, offset: u32, len: usize| Request::Write {
        epoch,
        oid: ObjectId::new(pool_id, VolumeId(vol), index),
        offset,
        version: Version::NONE,
        fua: true,
        data: Bytes::from(vec![0x5A; len]),
        session: basalt_proto::Session::NONE,
    };
    // The resize returned once the node had seen the shrink: refused at once.
    for (id, req) in [
        (2, stale(4, 8192, 8192)),
        (3, stale(4, 0, 8192)),
        (4, stale(6, 0, os as usize)),
        (5, stale(9, 0, 4096)),
    ] {
        n.send(id, &req);
        match n.answer() {
            Some(Err(e)) if e.code == ErrorCode::InvalidArgument => {
                assert!(e.message.contains("past the end"), "{}", e.message);
            }
            other => panic!("the stale write was not refused: {other:?}"),
        }
    }
    n.send(
        6,
        &Request::WriteZeroes {
            epoch,
            oid: ObjectId::new(pool_id, VolumeId(vol), 6),
            offset: 0,
            len: os as u32,
            fua: true,
            session: basalt_proto::Session::NONE,
        },
    );
    assert!(matches!(n.answer(), Some(Ok(Response::Written { .. }))));

    resize(&up, "g", 10 * os);
    let mut c = NbdClient::connect(&up.nbd, "g").unwrap();
    let data = c.read(0, (10 * os) as u32).unwrap().unwrap();
    assert!(
        data[..keep as usize].iter().all(|&b| b == 0xAA),
        "data before the cut changed"
    );
    let leaked = data[keep as usize..].iter().filter(|&&b| b != 0).count();
    assert_eq!(leaked, 0, "{leaked} bytes past the old end are not zero");
    c.disconnect();
    up.stop();
}
