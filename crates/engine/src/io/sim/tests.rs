//! Tests of the simulated disk.

use super::*;
use crate::buf::{AlignedBuf, IoBuf};

const US: Duration = Duration::from_micros(1);

fn write_req(off: u64, byte: u8, len: usize) -> IoReq {
    IoReq::Write {
        off,
        bufs: vec![IoBuf::Owned(AlignedBuf::copy_from(&vec![byte; len]))],
        durable: false,
    }
}

fn tokens(out: &[IoDone]) -> Vec<u64> {
    out.iter().map(|d| d.token).collect()
}

/// Which of "absent", "whole", "torn" occur for `len` bytes at `off` over many images.
fn outcomes(d: &SimDisk, off: u64, len: usize, byte: u8) -> [bool; 3] {
    let mut saw = [false; 3];
    for seed in 0..64 {
        let img = d.crash_image(seed).read(off, len);
        let n = img.iter().filter(|&&b| b == byte).count();
        saw[if n == 0 {
            0
        } else if n == len {
            1
        } else {
            2
        }] = true;
    }
    saw
}

#[test]
fn crash_keeps_flushed_and_maybe_unflushed() {
    let d = SimDisk::new(8192);
    d.write(0, &[1u8; 4096]).unwrap();
    d.flush().unwrap();
    d.write(4096, &[2u8; 4096]).unwrap();
    for seed in 0..64 {
        assert_eq!(d.crash_image(seed).read(0, 4096), vec![1u8; 4096]);
    }
    assert_eq!(
        outcomes(&d, 4096, 4096, 2),
        [true; 3],
        "drop, keep and tear"
    );
}

/// A flush covers exactly the writes completed before it was issued: a write that completes
/// while the flush is in flight may still be lost. (A disk that made every write completed
/// before the flush *completed* durable fails this.)
#[test]
fn flush_covers_only_writes_completed_before_it_was_issued() {
    let d = SimDisk::new(3 * 4096);
    d.set_latency(Latency {
        write: Spread::fixed(10 * US),
        flush: Spread::fixed(100 * US),
        ..Latency::ZERO
    });
    let t0 = Instant::now();
    let mut out = Vec::new();
    let mut s = d.lock();
    s.submit(t0, 1, write_req(0, 0xa, 4096));
    s.complete_due(t0 + 10 * US, &mut out);
    assert_eq!(tokens(&out), [1]);
    s.submit(t0 + 10 * US, 2, IoReq::Flush);
    s.submit(t0 + 10 * US, 3, write_req(4096, 0xb, 4096));
    out.clear();
    s.complete_due(t0 + 20 * US, &mut out);
    assert_eq!(tokens(&out), [3], "the later write completes first");
    out.clear();
    s.complete_due(t0 + 110 * US, &mut out);
    assert_eq!(tokens(&out), [2]);
    assert!(out[0].res.is_ok());
    drop(s);
    assert_eq!(d.read(4096, 1), [0xb], "reads see the completed write");
    assert_eq!(
        outcomes(&d, 0, 4096, 0xa),
        [false, true, false],
        "covered: durable"
    );
    assert_eq!(
        outcomes(&d, 4096, 4096, 0xb),
        [true; 3],
        "not covered: volatile"
    );
    // A second flush issued now covers it.
    let mut s = d.lock();
    s.submit(t0 + 110 * US, 4, IoReq::Flush);
    out.clear();
    s.complete_due(t0 + 210 * US, &mut out);
    drop(s);
    assert_eq!(outcomes(&d, 4096, 4096, 0xb), [false, true, false]);
}

/// A durable write is durable once it completes, and makes no other write durable (a FUA
/// write); with flushes failing it fails and stays volatile.
#[test]
fn a_durable_write_hardens_only_itself() {
    let d = SimDisk::new(3 * 4096);
    let t0 = Instant::now();
    let mut out = Vec::new();
    let durable = |off, byte| match write_req(off, byte, 4096) {
        IoReq::Write { off, bufs, .. } => IoReq::Write {
            off,
            bufs,
            durable: true,
        },
        other => other,
    };
    let mut s = d.lock();
    s.submit(t0, 1, write_req(0, 0xa, 4096));
    s.submit(t0, 2, durable(4096, 0xb));
    s.complete_due(t0, &mut out);
    assert_eq!(tokens(&out), [1, 2]);
    assert!(out.iter().all(|d| d.res.is_ok()));
    drop(s);
    assert_eq!(
        outcomes(&d, 4096, 4096, 0xb),
        [false, true, false],
        "durable"
    );
    assert_eq!(
        outcomes(&d, 0, 4096, 0xa),
        [true; 3],
        "the other one: volatile"
    );
    d.fail_flushes(true);
    let mut s = d.lock();
    s.submit(t0, 3, durable(8192, 0xc));
    out.clear();
    s.complete_due(t0, &mut out);
    assert!(out[0].res.is_err(), "its flush failed");
    drop(s);
    assert_eq!(d.read(8192, 1), [0xc], "completed: seen by reads");
    assert_eq!(outcomes(&d, 8192, 4096, 0xc), [true; 3], "but volatile");
}

/// A write in flight (not completed) is invisible to reads and may be absent, whole or torn
/// in a crash image; a flush does not cover it.
#[test]
fn in_flight_write_is_torn_and_not_flushed() {
    let d = SimDisk::new(16 * 4096);
    d.set_latency(Latency {
        write: Spread::fixed(50 * US),
        ..Latency::ZERO
    });
    let t0 = Instant::now();
    let mut out = Vec::new();
    let mut s = d.lock();
    s.submit(t0, 1, write_req(0, 7, 8 * 4096));
    s.submit(t0, 2, IoReq::Flush);
    s.complete_due(t0, &mut out);
    assert_eq!(tokens(&out), [2], "the flush completes before the write");
    drop(s);
    assert_eq!(d.read(0, 1), [0], "not visible before completion");
    assert_eq!(d.writes_in_flight(), 1);
    assert_eq!(outcomes(&d, 0, 8 * 4096, 7), [true; 3]);
}

#[test]
fn completions_come_out_of_order_and_are_seeded() {
    let run = |seed: u64| {
        let d = SimDisk::seeded(64 * 4096, seed);
        d.set_latency(Latency {
            write: Spread::between(US, 100 * US),
            ..Latency::ZERO
        });
        let t0 = Instant::now();
        let mut s = d.lock();
        for i in 0..32u64 {
            s.submit(t0, i, write_req(i * 4096, i as u8, 4096));
        }
        let mut out = Vec::new();
        s.complete_due(t0 + 100 * US, &mut out);
        assert_eq!(out.len(), 32);
        (tokens(&out), s.stats.out_of_order)
    };
    let (a, ooo) = run(1);
    assert!(ooo > 0, "{a:?}");
    assert_eq!(run(1).0, a, "same seed, same order");
    assert_ne!(run(2).0, a, "another seed, another order");
}

#[test]
fn armed_crash_takes_the_image_and_halts() {
    let d = SimDisk::new(4 * 4096);
    d.write(0, &[1; 4096]).unwrap();
    d.flush().unwrap();
    d.arm_crash(2, 9);
    d.write(4096, &[2; 4096]).unwrap(); // event 1: happens
    d.write(8192, &[3; 4096]).unwrap(); // event 2: the crash, before the write
    d.flush().unwrap(); // no effect
    let img = d.crashed().expect("crashed");
    assert_eq!(img.read(0, 1), [1]);
    assert_eq!(
        img.read(8192, 1),
        [0],
        "the write at the crash event never happened"
    );
    assert_eq!(
        d.durable()[4096],
        0,
        "the sync after the crash had no effect"
    );
    let mut out = Vec::new();
    let t0 = Instant::now();
    let mut s = d.lock();
    s.submit(t0, 1, IoReq::Flush);
    s.complete_due(t0, &mut out);
    assert!(out.is_empty(), "a halted disk completes no flush");
}

#[test]
fn faults() {
    let d = SimDisk::new(2 * 4096);
    d.write(0, &[5; 4096]).unwrap();
    d.flush().unwrap();
    d.fail_reads(100..200);
    let mut buf = [0u8; 512];
    assert!(d.read_into(0, &mut buf).is_err());
    assert!(d.read_into(512, &mut buf).is_ok());
    d.flip_bit(4000, 3);
    assert_eq!(d.read(4000, 1), [5 ^ 8]);
    assert_eq!(d.crash_image(1).read(4000, 1), [5 ^ 8], "durable");
    d.fail_flushes(true);
    assert!(d.flush().is_err());
    d.fail_writes(true);
    assert!(d.write(0, &[0; 512]).is_err());
}

#[test]
fn a_write_remaps_sectors_that_failed_to_read() {
    let d = SimDisk::new(4 * 4096);
    d.fail_reads(4096..3 * 4096);
    let mut buf = [0u8; 4096];
    d.write(4096, &[7; 4096]).unwrap();
    assert!(
        d.read_into(4096, &mut buf).is_ok(),
        "written over: remapped"
    );
    assert_eq!(buf, [7; 4096]);
    assert!(
        d.read_into(2 * 4096, &mut buf).is_err(),
        "the rest still fails"
    );
    assert!(d.read_into(0, &mut buf).is_ok(), "outside the range");
    d.write(2 * 4096 + 512, &[1; 512]).unwrap();
    assert!(
        d.read_into(2 * 4096, &mut buf).is_err(),
        "part of it written only"
    );
    let mut sector = [0u8; 512];
    assert!(d.read_into(2 * 4096 + 512, &mut sector).is_ok());
    assert!(d.read_into(2 * 4096, &mut sector).is_err());
}
