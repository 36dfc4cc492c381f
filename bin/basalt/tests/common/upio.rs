//! I/O across failures on a `basalt up --nodes` cluster (shared by `replicated.rs` and
//! `rebalance.rs`): fio (`ioengine=nbd`, every block checked with crc32c) over the first
//! [`FIO_SIZE`] of volume `vol0` and a checking writer (`writer.rs`: every acknowledged write
//! is recorded and read back at the end) on objects past [`WRITER_FROM`], while a test strikes
//! (kills a node, adds one, marks a device out, ...).

use super::fio::FioRun;
use super::nbd::NbdClient;
use super::upcluster::UpCluster;
use super::wait_until;
use super::writer::{Log, Writer};
use serde_json::Value;
use std::time::{Duration, Instant};

/// `--lease-ttl` of the nodes: how long after a node dies its devices go down.
pub const TTL: &str = "3s";
/// `--io-timeout` of the gateway: an I/O waits this long before it fails (EIO).
pub const IO_TIMEOUT: Duration = Duration::from_secs(60);
pub const VOLUME: &str = "128MiB";
/// fio writes (and checks) the first 48 MiB of the volume; the writer objects past 64 MiB.
pub const FIO_SIZE: &str = "48m";
pub const WRITER_FROM: u64 = 64 << 20;
pub const WRITER_OBJECTS: usize = 16;
pub const WAIT: Duration = Duration::from_secs(60);

/// `basalt up --nodes <nodes>` with the lease and I/O timeout above and `extra` options;
/// returns once every PG is clean.
pub fn start(dir: &std::path::Path, nodes: u32, extra: &[&str]) -> UpCluster {
    let timeout = format!("{}s", IO_TIMEOUT.as_secs());
    let mut args = vec!["--lease-ttl", TTL, "--io-timeout", &timeout];
    args.extend_from_slice(extra);
    let c = UpCluster::start(dir, nodes, VOLUME, &args);
    c.wait_clean(WAIT);
    c
}

/// fio over the first [`FIO_SIZE`] of the volume: random writes of mixed sizes, each block
/// with a crc32c checksum that fio checks after writing (or only checks, `verify_only`).
pub fn fio_args(c: &UpCluster, verify_only: bool) -> Vec<String> {
    let mut args: Vec<String> = [
        "--name=rep",
        "--ioengine=nbd",
        "--rw=randwrite",
        "--bssplit=4k/50:64k/30:256k/20",
        "--iodepth=16",
        "--verify=crc32c",
        "--randseed=17",
        // Writes slow enough that a failure strikes while fio writes; checks at full speed.
        "--rate=,6m",
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

/// Runs fio only checking what it wrote (no write).
pub fn fio_verify(c: &UpCluster) {
    super::tool_ok("fio", &to_str(&fio_args(c, true)), WAIT * 3);
}

pub fn nbd(c: &UpCluster) -> NbdClient {
    NbdClient::connect(&c.up.nbd, "vol0").expect("connect to the gateway")
}

/// The writer's objects: past [`WRITER_FROM`], those whose PG `keep` accepts.
pub fn writer_objects(c: &UpCluster, keep: impl Fn(usize) -> bool) -> Vec<u64> {
    let first = WRITER_FROM / c.object_size;
    let objects: Vec<u64> = (first..first * 2)
        .filter(|&o| keep(c.pg_of(o)))
        .take(WRITER_OBJECTS)
        .collect();
    assert_eq!(objects.len(), WRITER_OBJECTS, "not enough objects");
    objects
}

/// What a run of I/O across a failure saw.
pub struct Run {
    pub fio: Value,
    pub log: Log,
    pub nbd: NbdClient,
}

/// Runs fio (write and check) and the writer on `objects`, calls `strike` once both write, and
/// waits until the writer is acknowledged again after `resumed` says the failure is in place
/// (`strike` returns when it struck). fio must finish without an error, and no write of the
/// writer may fail.
pub fn io_across(
    c: &mut UpCluster,
    objects: Vec<u64>,
    strike: impl FnOnce(&mut UpCluster) -> Instant,
) -> Run {
    let writer = Writer::start(nbd(c), objects, c.object_size);
    let mut fio = FioRun::start(&fio_args(c, false));
    wait_until("fio and the writer to write", WAIT, || {
        fio.percent().is_some_and(|p| p >= 15.0) && writer.peek(Log::acks) > 0
    });
    assert!(fio.running(), "fio finished before the failure");
    let struck = strike(c);
    wait_until("the writer acknowledged after the failure", WAIT, || {
        writer.peek(|l| l.acks_sent_after(struck)) > 0
    });
    let fio = fio.finish(Duration::from_secs(180));
    let (nbd, log) = writer.finish();
    assert_eq!(log.errors(), Vec::new(), "failed writes");
    Run { fio, log, nbd }
}

pub fn to_str(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// `t` relative to `origin`, signed.
pub fn since(t: Instant, origin: Instant) -> String {
    match t.checked_duration_since(origin) {
        Some(d) => format!("+{d:.3?}"),
        None => format!("-{:.3?}", origin - t),
    }
}

/// Kills `victim` with SIGKILL; returns when, after waiting until its devices are down.
pub fn kill_and_wait_down(c: &mut UpCluster, victim: u64) -> Instant {
    let at = Instant::now();
    c.kill(victim);
    let devices = c.node(victim).devices.clone();
    wait_until("the victim's devices down", WAIT, || {
        devices.iter().all(|d| !c.device_up(*d))
    });
    at
}
