//! kill -9 of a real `basalt up` under write load: after a restart every acknowledged write
//! reads back whole, and the write that was in flight on each connection is all-or-nothing.
//!
//! Each writer thread owns a disjoint region and writes at QD1, so at the kill it has at most one
//! write in flight. Every 512-byte sector's content is a function of (writer, sequence number,
//! offset), so a sector read back names the write it came from.

mod common;

use common::nbd::{NBD_CMD_FLAG_FUA, NbdClient};
use common::{Up, UpOptions, wait_until};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const VOLUME: u64 = 64 << 20;
const WRITERS: u64 = 6;
const REGION: u64 = VOLUME / WRITERS / 4096 * 4096;
const SECTOR: u64 = 512;
const OBJECT: u64 = 128 << 10;

#[derive(Clone, Copy, Debug)]
struct Write {
    writer: u64,
    seq: u64,
    offset: u64,
    len: u64,
}

#[derive(Default)]
struct Log {
    acked: Vec<Write>,
    in_flight: Option<Write>,
}

fn sector_content(w: &Write, sector_offset: u64) -> [u8; SECTOR as usize] {
    let mut out = [0u8; SECTOR as usize];
    let mut x = (w.writer + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ w.seq.wrapping_mul(0xBF58_476D_1CE4_E5B9)
        ^ sector_offset.wrapping_mul(0x94D0_49BB_1331_11EB);
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    out
}

fn payload(w: &Write) -> Vec<u8> {
    (0..w.len / SECTOR)
        .flat_map(|i| sector_content(w, w.offset + i * SECTOR))
        .collect()
}

/// A random write inside the writer's region, never crossing an object boundary (atomicity is per
/// object). Offsets and lengths are multiples of 512, so many are not 4 KiB-aligned.
fn next_write(writer: u64, seq: u64, rng: &mut u64) -> Write {
    let mut r = || {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng
    };
    let base = writer * REGION;
    let sectors_in_region = REGION / SECTOR;
    let start = base + (r() % sectors_in_region) * SECTOR;
    let room = (OBJECT - start % OBJECT).min(base + REGION - start);
    let want = match r() % 4 {
        0 => 4096,
        1 => SECTOR * (1 + r() % 16),
        2 => 32 << 10,
        _ => OBJECT,
    };
    Write {
        writer,
        seq,
        offset: start,
        len: want.min(room),
    }
}

fn writer(
    addr: String,
    id: u64,
    fua: bool,
    log: Arc<Mutex<Log>>,
    acked: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) {
    let Ok(mut c) = NbdClient::connect(&addr, "vol0") else {
        return;
    };
    let mut rng = 0x1234_5678_9ABC_DEF0 ^ (id + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let first = log.lock().unwrap().acked.len() as u64 + 1_000_000 * (1 + id);
    let mut seq = first;
    while !stop.load(Ordering::Relaxed) {
        seq += 1;
        let w = next_write(id, seq, &mut rng);
        log.lock().unwrap().in_flight = Some(w);
        match c.write(
            w.offset,
            &payload(&w),
            if fua { NBD_CMD_FLAG_FUA } else { 0 },
        ) {
            Ok(0) => {
                let mut l = log.lock().unwrap();
                l.acked.push(w);
                l.in_flight = None;
                acked.fetch_add(1, Ordering::Relaxed);
            }
            // The server died: the write stays recorded as in flight.
            _ => return,
        }
    }
}

/// Runs writers until `min_acked` writes were acknowledged, then SIGKILLs the server.
fn load_and_kill(up: Up, logs: &[Arc<Mutex<Log>>], min_acked: u64, fua: bool) {
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..WRITERS)
        .map(|i| {
            let (addr, log, acked, stop) = (
                up.nbd.clone(),
                logs[i as usize].clone(),
                acked.clone(),
                stop.clone(),
            );
            std::thread::spawn(move || writer(addr, i, fua, log, acked, stop))
        })
        .collect();
    wait_until(
        "writes to be acknowledged",
        Duration::from_secs(120),
        || acked.load(Ordering::Relaxed) >= min_acked,
    );
    up.kill9();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
}

/// Reads the whole volume and checks every writer's region against its log.
fn verify(up: &Up, logs: &[Arc<Mutex<Log>>]) {
    let mut c = NbdClient::connect(&up.nbd, "vol0").expect("connect after restart");
    let mut image = Vec::with_capacity(VOLUME as usize);
    for off in (0..VOLUME).step_by(1 << 20) {
        image.extend(c.read(off, 1 << 20).unwrap().expect("read after restart"));
    }
    c.disconnect();
    for log in logs {
        let log = log.lock().unwrap();
        // The last acknowledged write covering each sector.
        let mut last: std::collections::HashMap<u64, Write> = Default::default();
        for w in &log.acked {
            for s in (w.offset..w.offset + w.len).step_by(SECTOR as usize) {
                last.insert(s, *w);
            }
        }
        let sector = |s: u64| &image[s as usize..(s + SECTOR) as usize];
        let expected_old = |s: u64| {
            last.get(&s)
                .map(|w| sector_content(w, s))
                .unwrap_or([0; 512])
        };
        // Every acknowledged sector not covered by the in-flight write holds its last acked data.
        for (&s, w) in &last {
            let covered = log
                .in_flight
                .is_some_and(|f| (f.offset..f.offset + f.len).contains(&s));
            if !covered {
                assert!(
                    sector(s) == sector_content(w, s),
                    "acknowledged write {w:?} lost at byte offset {s}"
                );
            }
        }
        // The in-flight write is all-or-nothing.
        if let Some(f) = log.in_flight {
            let sectors: Vec<u64> = (f.offset..f.offset + f.len)
                .step_by(SECTOR as usize)
                .collect();
            let new: Vec<bool> = sectors
                .iter()
                .map(|&s| sector(s) == sector_content(&f, s))
                .collect();
            let old: Vec<bool> = sectors
                .iter()
                .map(|&s| sector(s) == expected_old(s))
                .collect();
            let all_new = new.iter().all(|&b| b);
            let all_old = old.iter().all(|&b| b);
            assert!(
                all_new || all_old,
                "in-flight write {f:?} is torn: new={new:?} old={old:?}"
            );
        }
    }
}

fn crash_cycles(fua: bool, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let opts = UpOptions {
        device_size: "512MiB",
        volume_size: "64MiB",
        extra: extra.iter().map(|s| s.to_string()).collect(),
    };
    let logs: Vec<_> = (0..WRITERS)
        .map(|_| Arc::new(Mutex::new(Log::default())))
        .collect();
    for (round, min_acked) in [150u64, 600, 2000].into_iter().enumerate() {
        let up = Up::start(dir.path(), &opts);
        if round > 0 {
            verify(&up, &logs);
        }
        load_and_kill(up, &logs, min_acked, fua);
    }
    let up = Up::start(dir.path(), &opts);
    verify(&up, &logs);
    let total: usize = logs.iter().map(|l| l.lock().unwrap().acked.len()).sum();
    assert!(total >= 2750, "only {total} writes were acknowledged");
    up.stop();
}

#[test]
fn acknowledged_writes_survive_kill9_in_sync_mode() {
    crash_cycles(false, &[]);
}

#[test]
fn fua_writes_survive_kill9_in_flush_mode() {
    crash_cycles(true, &["--durability", "flush"]);
}
