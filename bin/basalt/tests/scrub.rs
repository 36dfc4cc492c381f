//! Media corruption in one copy with real processes: `basalt up --nodes 3` (3 copies,
//! `min_size` 2, background scrub off), fio writes with `verify=crc32c`; one node is killed
//! (SIGKILL), bits are flipped in many places of its device file's data area (never the
//! superblock, journal or tables: the store would refuse to open), and it is started again.
//! fio then reads everything back correct (the reads that hit the bad copies on the node are
//! repaired from the others), `basalt scrub` finds the bad copies no read touched and repairs
//! every one, and a second scrub finds nothing.

mod common;

use common::upcluster::UpCluster;
use common::wait_until;
use serde_json::Value;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);
const FIO_SIZE: &str = "48m";
/// 4 KiB blocks whose bits are flipped: many, yet below the checksum-error limit that would
/// report the device down (50 within 10 minutes; each bad copy fails one read before it is
/// repaired).
const FLIPS: usize = 40;

fn fio_args(c: &UpCluster, verify_only: bool) -> Vec<String> {
    let mut args: Vec<String> = [
        "--name=scrub",
        "--ioengine=nbd",
        "--rw=randwrite",
        "--bssplit=4k/50:64k/30:256k/20",
        "--iodepth=16",
        "--verify=crc32c",
        "--randseed=23",
    ]
    .map(String::from)
    .to_vec();
    args.push(format!("--size={FIO_SIZE}"));
    args.push(format!("--uri={}", c.up.uri("vol0")));
    if verify_only {
        args.push("--verify_only".into());
    }
    args
}

fn to_str(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Where the data area (the object slots) of a store begins: the superblock's `data_offset`
/// (docs/design/on-disk-format.md: little-endian u64 at byte 144 of the first block).
fn data_offset(dev: &mut std::fs::File) -> u64 {
    let mut sb = [0u8; 4096];
    dev.seek(SeekFrom::Start(0)).unwrap();
    dev.read_exact(&mut sb).unwrap();
    assert_eq!(&sb[..8], b"BASALTSB", "a Basalt superblock");
    u64::from_le_bytes(sb[144..152].try_into().unwrap())
}

/// Flips one bit in each of `n` blocks spread over the non-zero 4 KiB blocks of the data area
/// (slots that hold, or held, data) of the store at `path`, which no process has open.
/// Returns how many it flipped.
fn flip_bits(path: &Path, n: usize) -> usize {
    let mut dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let start = data_offset(&mut dev);
    // The last block is the backup superblock.
    let end = dev.metadata().unwrap().len() - 4096;
    let mut used = Vec::new();
    let mut chunk = vec![0u8; 1 << 20];
    let mut at = start;
    dev.seek(SeekFrom::Start(start)).unwrap();
    while at < end {
        let len = chunk.len().min((end - at) as usize);
        dev.read_exact(&mut chunk[..len]).unwrap();
        for (i, b) in chunk[..len].chunks_exact(4096).enumerate() {
            if b.iter().any(|x| *x != 0) {
                used.push(at + i as u64 * 4096);
            }
        }
        at += len as u64;
    }
    assert!(used.len() >= n, "only {} blocks hold data", used.len());
    let step = used.len() / n;
    for (k, block) in used.iter().step_by(step).take(n).enumerate() {
        let off = block + 64 * (k as u64 % 60) + 7;
        let mut byte = [0u8; 1];
        dev.seek(SeekFrom::Start(off)).unwrap();
        dev.read_exact(&mut byte).unwrap();
        byte[0] ^= 1 << (k % 8);
        dev.seek(SeekFrom::Start(off)).unwrap();
        dev.write_all(&byte).unwrap();
    }
    dev.sync_all().unwrap();
    n
}

fn total(results: &Value, field: &str) -> u64 {
    results
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[field].as_u64().unwrap())
        .sum()
}

#[test]
fn bits_flipped_in_one_nodes_device_are_never_read_and_scrub_repairs_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = UpCluster::start(
        dir.path(),
        3,
        "128MiB",
        &["--lease-ttl", "3s", "--scrub-rate", "0"],
    );
    c.wait_clean(WAIT);
    common::tool_ok("fio", &to_str(&fio_args(&c, false)), WAIT * 3);
    let clean = c.up.cli_json(&["scrub"]);
    assert_eq!(total(&clean, "inconsistent"), 0, "{clean}");
    assert!(total(&clean, "objects") > 0, "{clean}");

    // A node that does not lead is killed; bits flip in its device file; it starts again.
    let leader = c.leader();
    let victim = c
        .nodes
        .iter()
        .map(|n| n.id)
        .find(|id| Some(*id) != leader)
        .unwrap();
    let device = c.node(victim).device;
    c.kill(victim);
    wait_until("the victim's device down", WAIT, || !c.device_up(device));
    let path = c.node(victim).dir.join("dev0.img");
    flip_bits(&path, FLIPS);
    c.restart(victim);
    c.wait_clean(WAIT);

    // Every byte reads back correct (fio checks each block's crc32c).
    common::tool_ok("fio", &to_str(&fio_args(&c, true)), WAIT * 3);
    let status = c.up.cli_json(&["status"]);
    let read_repairs: u64 = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["status"]["repaired_objects"].as_u64().unwrap_or(0))
        .sum();

    // Scrub finds the bad copies the reads did not touch and repairs each one.
    let first = c.up.cli_json(&["scrub"]);
    let (inconsistent, repaired) = (total(&first, "inconsistent"), total(&first, "repaired"));
    eprintln!(
        "SCRUB {FLIPS} blocks flipped: {read_repairs} copies repaired by reads, scrub found \
         {inconsistent} inconsistent objects and repaired {repaired}"
    );
    assert!(inconsistent > 0, "{first}");
    assert_eq!(repaired, inconsistent, "{first}");
    assert_eq!(total(&first, "unrepairable"), 0, "{first}");
    let second = c.up.cli_json(&["scrub", "--pool", "default"]);
    assert_eq!(total(&second, "inconsistent"), 0, "{second}");
    assert_eq!(
        total(&second, "objects"),
        total(&first, "objects"),
        "{second}"
    );
    // The repairs show in the nodes' status.
    let status = c.up.cli_json(&["status"]);
    let repairs: u64 = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["status"]["repaired_objects"].as_u64().unwrap_or(0))
        .sum();
    assert!(repairs >= read_repairs + repaired, "{status}");
    common::tool_ok("fio", &to_str(&fio_args(&c, true)), WAIT * 3);
    c.stop();
}
