//! The server against a raw-socket client: option phase, commands, errors, pipelining, FLUSH
//! and FUA durability, backpressure, misbehaving clients and shutdown.

mod common;

use basalt_nbd::{MemCatalog, MemExport, ServerConfig};
use common::*;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn catalog() -> MemCatalog {
    let c = MemCatalog::new().with_default("disk");
    c.add(
        "disk",
        MemExport::new(4 * MIB).with_description("the test disk"),
    );
    c.add("ro", MemExport::new(MIB).with_read_only(true));
    c.add("wb", MemExport::volatile(MIB));
    c
}

fn server() -> TestServer {
    TestServer::start(catalog(), ServerConfig::default())
}

#[test]
fn list_info_and_unsupported_options() {
    let s = server();
    let mut c = RawClient::negotiating(s.addr);

    c.option(OPT_LIST, &[]);
    let mut names = Vec::new();
    loop {
        let (opt, rep, data) = c.option_reply();
        assert_eq!(opt, OPT_LIST);
        if rep == REP_ACK {
            break;
        }
        assert_eq!(rep, REP_SERVER);
        let len = u32::from_be_bytes(data[0..4].try_into().unwrap()) as usize;
        let name = String::from_utf8(data[4..4 + len].to_vec()).unwrap();
        let description = String::from_utf8(data[4 + len..].to_vec()).unwrap();
        names.push((name, description));
    }
    assert_eq!(
        names,
        [
            ("disk".into(), "the test disk".into()),
            ("ro".into(), String::new()),
            ("wb".into(), String::new())
        ]
    );

    // LIST with data is invalid; the session goes on.
    c.option(OPT_LIST, b"x");
    assert_eq!(c.option_reply().1, REP_ERR_INVALID);

    // INFO with NAME and DESCRIPTION, and the block sizes.
    c.option(OPT_INFO, &info_request("disk", &[1, 2, 3]));
    let info = c.info_until_ack(OPT_INFO);
    assert_eq!(info.export, Some((4 * MIB, 0b1_0110_1101)));
    assert_eq!(info.name.as_deref(), Some("disk"));
    assert_eq!(info.description.as_deref(), Some("the test disk"));
    assert_eq!(info.block_size, Some((1, 4096, 32 << 20)));

    // The empty name is the default export.
    c.option(OPT_INFO, &info_request("", &[1]));
    assert_eq!(c.info_until_ack(OPT_INFO).name.as_deref(), Some("disk"));

    // Unknown export, malformed INFO, structured replies, an unknown option, an oversized one.
    c.option(OPT_INFO, &info_request("nope", &[]));
    let err = c.info_until_ack(OPT_INFO).error.expect("error");
    assert_eq!(err.0, REP_ERR_UNKNOWN);
    assert!(
        err.1.contains("nope"),
        "message names the export: {}",
        err.1
    );
    c.option(OPT_GO, &[0, 0, 0, 9, b'a']);
    assert_eq!(c.option_reply().1, REP_ERR_INVALID);
    c.option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.option_reply().1, REP_ERR_UNSUP);
    c.option(0x1234, b"whatever");
    let (opt, rep, msg) = c.option_reply();
    assert_eq!((opt, rep), (0x1234, REP_ERR_UNSUP));
    assert!(String::from_utf8(msg).unwrap().contains("not supported"));
    c.option(OPT_INFO, &vec![0u8; 100_000]);
    assert_eq!(c.option_reply().1, REP_ERR_TOO_BIG);

    // Still usable: GO into transmission.
    c.option(OPT_GO, &info_request("disk", &[]));
    let info = c.info_until_ack(OPT_GO);
    assert_eq!(info.export.map(|e| e.0), Some(4 * MIB));
    let r = c.call(CMD_READ, 0, 0, 512, &[]);
    assert_eq!((r.error, r.data.len()), (0, 512));
}

#[test]
fn export_name_abort_and_bad_client_flags() {
    let s = server();
    // EXPORT_NAME without NO_ZEROES: size, flags, 124 zero bytes, then transmission.
    let (mut c, _) = RawClient::connect(s.addr);
    c.send(&1u32.to_be_bytes());
    c.option(OPT_EXPORT_NAME, b"ro");
    assert_eq!(c.u64(), MIB);
    assert_eq!(
        c.u16(),
        0b1_0000_0111,
        "HAS_FLAGS|READ_ONLY|SEND_FLUSH|CAN_MULTI_CONN"
    );
    assert_eq!(c.bytes(124), vec![0u8; 124]);
    let r = c.call(CMD_WRITE, 0, 0, 3, b"abc");
    assert_eq!(r.error, EPERM, "writes to a read-only export are refused");
    assert_eq!(c.call(CMD_READ, 0, 0, 8, &[]).error, 0);

    // EXPORT_NAME with NO_ZEROES, for the default export (empty name).
    let mut c = RawClient::negotiating(s.addr);
    c.option(OPT_EXPORT_NAME, b"");
    assert_eq!(c.u64(), 4 * MIB);
    assert_eq!(c.u16(), 0b1_0110_1101);
    assert_eq!(c.call(CMD_READ, 0, 0, 8, &[]).data, vec![0u8; 8]);

    // EXPORT_NAME of an unknown export cannot be refused: the server closes.
    let mut c = RawClient::negotiating(s.addr);
    c.option(OPT_EXPORT_NAME, b"missing");
    assert!(c.closed());

    // ABORT is acknowledged, then the server closes.
    let mut c = RawClient::negotiating(s.addr);
    c.option(OPT_ABORT, &[]);
    assert_eq!(c.option_reply(), (OPT_ABORT, REP_ACK, Vec::new()));
    assert!(c.closed());

    // Unknown client flags: dropped at once.
    let (mut c, _) = RawClient::connect(s.addr);
    c.send(&0x8000_0001u32.to_be_bytes());
    assert!(c.closed());
}

#[test]
fn commands_round_trip_and_bad_requests_keep_the_connection_usable() {
    let s = server();
    let disk = s.catalog.get("disk").unwrap();
    let (mut c, size, _) = RawClient::go(s.addr, "disk");
    assert_eq!(size, 4 * MIB);

    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(
        c.call(CMD_WRITE, FLAG_FUA, 12_345, data.len() as u32, &data)
            .error,
        0
    );
    assert_eq!(
        c.call(CMD_READ, 0, 12_345, data.len() as u32, &[]).data,
        data
    );
    assert_eq!(disk.snapshot(12_345, data.len()), data);

    // Past the end, overflowing, too long, unknown command, unknown flag: errors, no close.
    let end = 4 * MIB;
    assert_eq!(c.call(CMD_READ, 0, end - 10, 11, &[]).error, EINVAL);
    assert_eq!(c.call(CMD_READ, 0, u64::MAX - 1, 4, &[]).error, EINVAL);
    assert_eq!(c.call(CMD_READ, 0, 0, (32 << 20) + 1, &[]).error, EINVAL);
    assert_eq!(c.call(CMD_WRITE, 0, end - 1, 2, b"xy").error, EINVAL);
    assert_eq!(c.call(CMD_TRIM, 0, end, 1, &[]).error, EINVAL);
    assert_eq!(c.call(CMD_WRITE_ZEROES, 0, end - 1, 2, &[]).error, EINVAL);
    assert_eq!(c.call(99, 0, 0, 0, &[]).error, EINVAL);
    assert_eq!(c.call(CMD_READ, 0x40, 0, 1, &[]).error, EINVAL);
    // A WRITE longer than the maximum payload: its data is skipped, the stream stays in step.
    let huge = vec![0xEE; (32 << 20) + 1];
    assert_eq!(
        c.call(CMD_WRITE, 0, 0, huge.len() as u32, &huge).error,
        EINVAL
    );
    assert_eq!(
        disk.snapshot(0, 4),
        [0; 4],
        "the oversized write wrote nothing"
    );
    // Zero-length requests succeed without touching anything.
    assert_eq!(
        c.call(CMD_READ, 0, end, 0, &[]),
        Reply {
            cookie: 7,
            error: 0,
            data: vec![]
        }
    );

    // TRIM and WRITE_ZEROES (NO_HOLE keeps the allocation).
    assert_eq!(c.call(CMD_WRITE_ZEROES, 2, 12_345, 1000, &[]).error, 0);
    assert_eq!(c.call(CMD_READ, 0, 12_345, 1000, &[]).data, vec![0u8; 1000]);
    assert_eq!(c.call(CMD_TRIM, 0, 0, MIB as u32, &[]).error, 0);
    assert_eq!(c.call(CMD_FLUSH, 0, 0, 0, &[]).error, 0);
    let st = disk.stats();
    assert_eq!(
        (st.trims, st.write_zeroes, st.flushes, st.fua_writes),
        (1, 1, 1, 1)
    );

    // DISC: the server closes after it.
    c.request(CMD_DISC, 0, 1, 0, 0);
    assert!(c.closed());
}

#[test]
fn replies_come_back_out_of_order_and_disc_waits_for_them() {
    let s = server();
    let disk = s.catalog.get("disk").unwrap();
    disk.set_delay(0..4096, Duration::from_millis(300));
    let (mut c, _, _) = RawClient::go(s.addr, "disk");
    c.request(CMD_READ, 0, 1, 0, 4096);
    c.request(CMD_READ, 0, 2, MIB, 4096);
    c.request(CMD_WRITE, 0, 3, 2 * MIB, 0);
    let first = c.reply();
    let second = c.reply();
    let third = c.reply();
    assert_eq!(first.cookie, 2, "the fast read overtakes the slow one");
    assert_eq!(second.cookie, 3);
    assert_eq!(third.cookie, 1);

    // A slow write, then DISC at once: the write still completes and is answered.
    c.write(4, 100, b"late", 0);
    c.request(CMD_DISC, 0, 5, 0, 0);
    assert_eq!(
        c.reply(),
        Reply {
            cookie: 4,
            error: 0,
            data: vec![]
        }
    );
    assert!(c.closed());
    assert_eq!(disk.snapshot(100, 4), b"late");
}

#[test]
fn flush_and_fua_replies_mean_durable() {
    let s = server();
    let wb = s.catalog.get("wb").unwrap();
    let (mut c, _, flags) = RawClient::go(s.addr, "wb");
    assert_ne!(flags & (1 << 2), 0, "SEND_FLUSH");
    assert_ne!(flags & (1 << 3), 0, "SEND_FUA");

    // Control: an acknowledged write without FLUSH or FUA is lost by a crash of this disk,
    // so the checks below can fail.
    assert_eq!(c.call(CMD_WRITE, 0, 0, 4, b"gone").error, 0);
    wb.crash();
    assert_eq!(c.call(CMD_READ, 0, 0, 4, &[]).data, [0; 4]);

    // Pipelined writes, then FLUSH: everything answered before the flush is durable.
    for i in 0..16u64 {
        c.write(100 + i, i * 4096, &[i as u8 + 1; 4096], 0);
    }
    for _ in 0..16 {
        assert_eq!(c.reply().error, 0);
    }
    assert_eq!(c.call(CMD_FLUSH, 0, 0, 0, &[]).error, 0);
    wb.crash();
    for i in 0..16u64 {
        let block = wb.snapshot(i * 4096, 4096);
        assert!(
            block == [i as u8 + 1; 4096],
            "flushed block {i} lost by the crash"
        );
    }

    // FUA: durable when answered, without a flush.
    assert_eq!(c.call(CMD_WRITE, FLAG_FUA, 200_000, 3, b"fua").error, 0);
    wb.crash();
    assert_eq!(wb.snapshot(200_000, 3), b"fua");
    assert_eq!(wb.stats().flushes, 1);
}

#[test]
fn connections_share_one_image() {
    let s = server();
    let (mut a, _, flags) = RawClient::go(s.addr, "disk");
    let (mut b, _, _) = RawClient::go(s.addr, "disk");
    assert_ne!(flags & (1 << 8), 0, "CAN_MULTI_CONN");
    for i in 0..50u64 {
        let data = [i as u8; 512];
        assert_eq!(a.call(CMD_WRITE, 0, i * 512, 512, &data).error, 0);
        assert_eq!(b.call(CMD_READ, 0, i * 512, 512, &[]).data, data);
    }
}

#[test]
fn garbage_closes_only_the_offending_connection() {
    let s = server();
    let (mut good, _, _) = RawClient::go(s.addr, "disk");
    let (mut bad, _, _) = RawClient::go(s.addr, "disk");
    // A request in flight on the bad connection is still answered before the close.
    bad.request(CMD_READ, 0, 1, 0, 16);
    bad.send(b"this is not an NBD request header at all");
    let r = bad.reply();
    assert_eq!((r.cookie, r.error), (1, 0));
    assert!(bad.closed());

    // Garbage in the option phase too.
    let mut bad2 = RawClient::negotiating(s.addr);
    bad2.send(&[0xAB; 64]);
    assert!(bad2.closed());

    // A client that vanishes in the middle of a write payload.
    let (mut gone, _, _) = RawClient::go(s.addr, "disk");
    gone.send(&[0x25, 0x60, 0x95, 0x13, 0, 0, 0, 1]);
    drop(gone);

    for i in 0..20 {
        assert_eq!(good.call(CMD_WRITE, 0, i * 8, 8, b"still ok").error, 0);
        assert_eq!(good.call(CMD_READ, 0, i * 8, 8, &[]).data, b"still ok");
    }
}

#[test]
fn a_client_that_does_not_read_is_held_back() {
    let config = ServerConfig {
        max_inflight_bytes: 4 << 20,
        ..ServerConfig::default()
    };
    let s = TestServer::start(catalog(), config);
    let disk = s.catalog.get("disk").unwrap();
    let (mut slow, _, _) = RawClient::go(s.addr, "disk");
    let (mut other, _, _) = RawClient::go(s.addr, "disk");
    // 256 reads of 1 MiB (256 MiB of replies) that the client does not read for now.
    let count = 256u64;
    for i in 0..count {
        slow.request(CMD_READ, 0, i, (i % 4) * MIB, MIB as u32);
    }
    wait_until("the server to start reading", || disk.stats().reads >= 4);
    // The limit (4 MiB) plus what the sockets' buffers absorb stays far below 256 MiB; observe
    // for a while that the server does not run ahead.
    for _ in 0..40 {
        let started = disk.stats().reads;
        assert!(
            started < 64,
            "server ran ahead of a non-reading client: {started} reads"
        );
        assert_eq!(
            other.call(CMD_READ, 0, 0, 4096, &[]).error,
            0,
            "others are served"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut seen = vec![false; count as usize];
    for _ in 0..count {
        let r = slow.reply();
        assert_eq!((r.error, r.data.len()), (0, MIB as usize));
        seen[r.cookie as usize] = true;
    }
    assert!(seen.iter().all(|&s| s));
}

#[test]
fn shutdown_finishes_requests_in_flight() {
    let mut s = server();
    let disk = s.catalog.get("disk").unwrap();
    disk.set_delay(0..4096, Duration::from_millis(400));
    let (mut c, _, _) = RawClient::go(s.addr, "disk");
    c.write(1, 0, b"in flight at shutdown", FLAG_FUA);
    wait_until("the write to be in flight", || disk.in_flight() == 1);
    let addr = s.addr;
    let stopper = std::thread::spawn(move || {
        let r = s.stop();
        (s, r)
    });
    let r = c.reply();
    assert_eq!((r.cookie, r.error), (1, 0), "the in-flight write completed");
    assert_eq!(disk.snapshot(0, 21), b"in flight at shutdown");
    assert!(c.closed(), "then the connection closes");
    let (_s, result) = stopper.join().unwrap();
    result.expect("clean shutdown");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "no new connections after shutdown"
    );
}
