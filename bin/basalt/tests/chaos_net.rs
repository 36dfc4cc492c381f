//! Chaos with real processes on hosts in network namespaces (`common/netns.rs`; needs root,
//! iproute2, nftables): etcd, a gateway and three storage nodes, each on a host of its own,
//! pool `default` with 3 copies and `min_size` 2. fio (`verify=crc32c`, rounds that each
//! write a random quarter of 16 MiB and then check it) and the checking writer
//! (`common/writer.rs`) run through the gateway while one fault after another strikes a
//! random node for 1-5 s: its link down (partition), its traffic
//! to one other node dropped, its traffic to etcd dropped, SIGSTOP, or SIGKILL / SIGTERM and a
//! start again. Faults follow each other without waiting for recovery, so a second one may
//! strike while the first node's PGs still recover (I/O then waits; it must not fail).
//!
//! At the end, with every fault healed: every PG clean, `basalt scrub` finds every copy the
//! same as its primary's, every fio round verified, every acknowledged write of the writer
//! reads back, and no write failed. With recovery's copies to members skipped (a planted
//! bug), the test fails: a stale member served as primary after a later fault, and fio's
//! check failed.
//!
//! `CHAOS_SECONDS` (default 60) sets how long faults strike, `CHAOS_SEED` the schedule (printed
//! at the start; the same seed gives the same faults in the same order, the timing around them
//! is the machine's).

mod common;

use common::netcluster::{NetCluster, NodeProc};
use common::wait_until;
use common::writer::{Log, Writer};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PGS: u32 = 32;
const OBJECT: u64 = 128 << 10;
const WAIT: Duration = Duration::from_secs(120);
/// The gateway's I/O timeout: far longer than any fault and the recovery after it, so that a
/// failed I/O means something went wrong, not that a fault lasted long.
const IO_TIMEOUT: Duration = Duration::from_secs(90);
const NODES: [&str; 3] = ["n1", "n2", "n3"];

/// A small deterministic generator (xorshift64*): the schedule from the seed alone.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    Partition,
    CutFromPeer,
    CutFromEtcd,
    Freeze,
    Kill,
    Stop,
}

const FAULTS: [Fault; 6] = [
    Fault::Partition,
    Fault::CutFromPeer,
    Fault::CutFromEtcd,
    Fault::Freeze,
    Fault::Kill,
    Fault::Stop,
];

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: signalling a node process this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0, "kill {pid}");
}

/// fio round `round`'s writes (and checks) through the gateway at `addr`.
/// Each round writes a quarter of the 16 MiB at random: blocks no later round rewrites keep
/// what an earlier round wrote on every copy, so a copy that recovery left stale stays stale
/// for the final scrub to find (rounds that rewrote everything hid it: tried by skipping
/// recovery's copies, which then passed).
fn fio_args(addr: std::net::SocketAddr, round: u64, verify_only: bool) -> Vec<String> {
    let mut args =
        common::netcluster::fio_args(addr, "4k/50:64k/30:128k/20", round + 1, verify_only);
    args.push("--io_size=4m".into());
    args
}

/// Strikes node `i` with `fault` for `hold`, then undoes it (a stopped node is started again
/// on its host, with its data).
fn strike(
    c: &NetCluster,
    nodes: &mut [NodeProc],
    i: usize,
    other: usize,
    f: Fault,
    hold: Duration,
) {
    let host = nodes[i].host.clone();
    match f {
        Fault::Partition => {
            c.net.partition(&host);
            std::thread::sleep(hold);
            c.net.heal(&host);
        }
        Fault::CutFromPeer => {
            c.net.cut(&host, NODES[other]);
            std::thread::sleep(hold);
            c.net.heal_all();
        }
        Fault::CutFromEtcd => {
            c.net.cut(&host, &c.etcd_host);
            std::thread::sleep(hold);
            c.net.heal_all();
        }
        Fault::Freeze => {
            signal(nodes[i].proc.pid, libc::SIGSTOP);
            std::thread::sleep(hold);
            signal(nodes[i].proc.pid, libc::SIGCONT);
        }
        Fault::Kill => {
            c.net.kill(&nodes[i].proc);
            std::thread::sleep(hold);
            nodes[i] = c.start_node(&host);
        }
        Fault::Stop => {
            signal(nodes[i].proc.pid, libc::SIGTERM);
            wait_until("the stopped node to exit", WAIT, || {
                !c.net.running(&nodes[i].proc)
            });
            std::thread::sleep(hold);
            nodes[i] = c.start_node(&host);
        }
    }
}

#[test]
fn random_faults_under_io_lose_no_acknowledged_write() {
    let seconds: u64 = std::env::var("CHAOS_SECONDS").map_or(60, |s| s.parse().unwrap());
    let seed: u64 = std::env::var("CHAOS_SEED").map_or_else(
        |_| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        },
        |s| s.parse().unwrap(),
    );
    eprintln!("CHAOS_SEED={seed} CHAOS_SECONDS={seconds}");
    let mut rng = Rng(seed.max(1));

    let (c, mut nodes) = NetCluster::start_three(Duration::from_secs(3), PGS, "64MiB");
    let gw = c.start_gateway("gw", IO_TIMEOUT);
    // The writer's objects: past the 16 MiB fio writes.
    let objects: Vec<u64> = (256..272).collect();
    let writer = Writer::start(c.nbd("gw", &gw, "v"), objects, OBJECT);
    wait_until("the writer to write", WAIT, || writer.peek(Log::acks) > 0);

    let stop = AtomicBool::new(false);
    let rounds = AtomicU64::new(0);
    let faults = std::thread::scope(|s| {
        // Set however the fault loop ends, a panic included: the scope waits for the fio
        // thread, which must then end too.
        let _stop = StopOnDrop(&stop);
        // fio rounds until the faults end: each writes with a new seed and checks what it
        // wrote (`c.fio` fails the test on any error, a failed check included).
        let fio = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let round = rounds.load(Ordering::Relaxed);
                c.fio("gw", &fio_args(gw.addr, round, false));
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        });
        let until = Instant::now() + Duration::from_secs(seconds);
        let mut struck = Vec::new();
        // A fio round that failed ends the faults at once (the scope then reports its panic).
        while Instant::now() < until && !fio.is_finished() {
            let i = rng.below(3) as usize;
            let other = (i + 1 + rng.below(2) as usize) % 3;
            let f = FAULTS[rng.below(FAULTS.len() as u64) as usize];
            let hold = Duration::from_millis(1000 + rng.below(4000));
            let pause = Duration::from_millis(1000 + rng.below(3000));
            eprintln!(
                "chaos: {f:?} on {} for {hold:?} (other: {})",
                NODES[i], NODES[other]
            );
            strike(&c, &mut nodes, i, other, f, hold);
            struck.push(f);
            std::thread::sleep(pause);
        }
        struck
    });
    let rounds = rounds.into_inner();
    eprintln!(
        "chaos: {} faults, {rounds} fio rounds: {faults:?}",
        faults.len()
    );
    assert!(rounds > 0, "no fio round completed");

    wait_until("every node's device up", WAIT, || {
        c.devices().iter().all(|d| d.up)
    });
    wait_until("every PG clean after the faults", WAIT, || c.all_clean(PGS));
    let status = c.cli(&["status"]);
    eprintln!(
        "chaos: recovery moved {} objects",
        status["recovery"]["recovered_objects"]
    );
    // Every copy, not only what the primaries serve: the members hold what their primary does
    // (a member recovery left stale would serve once the others fail).
    let scrub = c.cli(&["scrub"]);
    let count = |field: &str| -> u64 {
        scrub
            .as_array()
            .expect("scrub results")
            .iter()
            .map(|p| p[field].as_u64().unwrap())
            .sum()
    };
    assert_eq!(
        count("inconsistent"),
        0,
        "copies differ after the faults: {scrub}"
    );
    assert!(count("objects") > 0, "{scrub}");
    // The last round again, checking only (the data it wrote is the newest in its blocks).
    c.fio("gw", &fio_args(gw.addr, rounds - 1, true));
    let (mut nbd, log) = writer.finish();
    assert_eq!(log.errors(), Vec::new(), "failed writes");
    log.verify(&mut nbd, OBJECT);
    eprintln!(
        "chaos: the writer's {} acknowledged writes read back; slowest {:?}",
        log.acks(),
        log.slowest().map(|w| w.latency())
    );
    nbd.disconnect();
    for n in &nodes {
        assert!(c.net.running(&n.proc), "{} exited", n.host);
    }
}
