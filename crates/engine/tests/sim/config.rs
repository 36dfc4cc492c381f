//! Swarm testing: every seed draws its own configuration (sizes, operation mix, concurrency,
//! disk latencies, when and whether to crash, which faults), so that the seeds together cover
//! combinations no single hand-written configuration would.

use basalt_engine::sim::{Latency, Spread};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;

const US: Duration = Duration::from_micros(1);

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

/// Relative weights of the operations a client issues.
#[derive(Clone, Debug)]
pub struct Mix {
    pub write: u32,
    pub write_blocks: u32,
    pub full: u32,
    pub zero: u32,
    pub trim: u32,
    pub delete: u32,
    pub flush: u32,
    pub read: u32,
}

impl Mix {
    fn draw(rng: &mut StdRng) -> Mix {
        let mut w = |max: u32| {
            if rng.random_bool(0.15) {
                0
            } else {
                rng.random_range(1..=max)
            }
        };
        Mix {
            write: w(10),
            write_blocks: w(6),
            full: w(5),
            zero: w(4),
            trim: w(3),
            delete: w(2),
            flush: w(3),
            read: w(6),
        }
    }

    pub fn total(&self) -> u32 {
        self.write
            + self.write_blocks
            + self.full
            + self.zero
            + self.trim
            + self.delete
            + self.flush
            + self.read
    }
}

/// When the first run loses power.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crash {
    /// No crash: the clients finish, then the store is closed (or dropped).
    None { close: bool },
    /// At a virtual instant (from the start of the run).
    At(Duration),
    /// At the n-th device event.
    AtEvent(u64),
    /// After the clients finish, a while later (write-back may be running).
    AfterIdle(Duration),
}

/// A fault on the disk image recovery opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Region {
    Slots,
    Journal,
    Meta,
    Any,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub seed: u64,
    pub object_size: usize,
    pub slots: u64,
    pub journal: u64,
    pub objects: usize,
    /// Probability that an operation goes to object 0 (contention on one object).
    pub hot: f64,
    pub clients: usize,
    /// Operations a client submits back to back before awaiting them.
    pub pipeline: usize,
    pub rounds: usize,
    pub mix: Mix,
    pub durable: f64,
    /// Probability of an explicit version (sometimes a stale one).
    pub explicit_version: f64,
    pub aligned_payload: f64,
    pub think: Duration,
    pub latency: Latency,
    pub writeback_idle: Duration,
    pub crash: Crash,
    /// Fail every write (true) or flush (false) from this instant on: the store is poisoned.
    pub poison: Option<(Duration, bool)>,
    /// Arm a crash at this device event when recovery opens the image (recovery's own writes
    /// and the first write-back after it).
    pub recovery_crash: Option<u64>,
    /// Bit flips in durable data before recovery.
    pub corrupt: Option<(Region, u32)>,
    /// Latent read errors (4 KiB blocks) before recovery.
    pub read_errors: Option<(Region, u32)>,
    /// After recovery, write, close and reopen once more.
    pub reopen: bool,
    /// Known engine bugs the run may reach (`SIM_KNOWN_BUGS`).
    pub known: super::known::KnownBugs,
    /// Put hashes of whole disk images into the trace (slow in debug builds: used when checking
    /// determinism and replaying a seed).
    pub trace_images: bool,
}

fn spread(rng: &mut StdRng, lo: u64, hi: u64) -> Spread {
    let a = rng.random_range(lo..=hi);
    let b = rng.random_range(a..=hi.max(a));
    Spread::between(us(a), us(b))
}

/// Disk latencies. Tokio's timer has a resolution of 1 ms, so completions due within one
/// millisecond of virtual time reach the store together (in due order); the profiles in
/// milliseconds let the store react between completions.
fn latency(rng: &mut StdRng) -> Latency {
    match rng.random_range(0..10) {
        0..=1 => Latency::ZERO,
        2..=4 => Latency {
            read: spread(rng, 5, 100),
            write: spread(rng, 5, 200),
            flush: spread(rng, 20, 1000),
            slow: 0.01,
            slow_factor: 10,
        },
        5..=7 => Latency {
            read: spread(rng, 100, 3000),
            write: spread(rng, 100, 5000),
            flush: spread(rng, 500, 10_000),
            slow: 0.02,
            slow_factor: 10,
        },
        _ => Latency {
            read: spread(rng, 0, 2000),
            write: spread(rng, 0, 20_000),
            flush: spread(rng, 0, 5000),
            slow: 0.1,
            slow_factor: 5,
        },
    }
}

impl Config {
    pub fn draw(seed: u64) -> Config {
        let mut rng = StdRng::seed_from_u64(seed ^ 0xc0f1_6000_0000_0000);
        let object_size = [8usize, 16, 16, 32, 32, 64][rng.random_range(0..6)] << 10;
        let objects = [1usize, 1, 2, 3, 4, 6][rng.random_range(0..6)];
        let clients = rng.random_range(1..=6);
        let pipeline = rng.random_range(1..=4);
        let ops_budget = rng.random_range(20..=240usize);
        let rounds = (ops_budget / (clients * pipeline)).max(2);
        let latency = latency(&mut rng);
        let think = rng.random_range(0..=3000) * US;
        // Roughly how long (µs) the clients run: the crash and poison instants fall within.
        let horizon = (rounds as u64)
            * (think.as_micros() as u64 / 2
                + latency.write.max.as_micros() as u64
                + latency.flush.max.as_micros() as u64
                + 1000);
        let crash = match rng.random_range(0..20) {
            0..=1 => Crash::None {
                close: rng.random_bool(0.5),
            },
            2..=9 => Crash::At(us(rng.random_range(0..=horizon.max(1)))),
            10..=16 => Crash::AtEvent(rng.random_range(1..=(ops_budget as u64) * 5)),
            _ => Crash::AfterIdle(rng.random_range(0..=20_000) * US),
        };
        let poison = rng.random_bool(0.08).then(|| {
            (
                us(rng.random_range(0..=horizon.max(1))),
                rng.random_bool(0.5),
            )
        });
        let region = |rng: &mut StdRng| {
            [
                Region::Slots,
                Region::Slots,
                Region::Journal,
                Region::Meta,
                Region::Any,
            ][rng.random_range(0..5)]
        };
        let faults = rng.random_range(0..20);
        let corrupt = (faults < 2).then(|| (region(&mut rng), rng.random_range(1..=3)));
        let read_errors = (faults == 2).then(|| (region(&mut rng), rng.random_range(1..=2)));
        Config {
            seed,
            object_size,
            slots: objects as u64 + rng.random_range(1..=24),
            // The journal must hold 8 whole-object records (64 KiB objects need more than 1 MiB).
            journal: if object_size < (64 << 10) && rng.random_bool(0.8) {
                1 << 20
            } else {
                2 << 20
            },
            objects,
            hot: rng.random_range(0.0..0.8),
            clients,
            pipeline,
            rounds,
            mix: Mix::draw(&mut rng),
            durable: rng.random_range(0.0..1.0),
            explicit_version: if rng.random_bool(0.3) { 0.15 } else { 0.0 },
            aligned_payload: rng.random_range(0.0..1.0),
            think,
            latency,
            writeback_idle: rng.random_range(50..=10_000) * US,
            crash,
            poison,
            // Small numbers hit recovery's own writes (erasing a stale record, the sync), larger
            // ones the first write-back after it.
            recovery_crash: match rng.random_range(0..10) {
                0..=1 => Some(rng.random_range(1..=3)),
                2..=5 => Some(rng.random_range(1..=40)),
                _ => None,
            },
            corrupt,
            read_errors,
            reopen: rng.random_bool(0.3),
            known: super::known::KnownBugs::from_env(),
            trace_images: false,
        }
    }

    /// Faults that may legitimately make data unreadable or recovery refuse to open.
    pub fn media_faults(&self) -> bool {
        self.corrupt.is_some() || self.read_errors.is_some()
    }

    /// Device size for the drawn slot count, journal and object size.
    pub fn device_size(&self) -> u64 {
        basalt_engine::device_size_for(self.object_size as u32, self.journal, self.slots)
    }
}
