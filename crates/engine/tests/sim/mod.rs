//! The deterministic simulation harness: one store (as a task, `Store::spawn_sim`) on a
//! simulated disk, and many client tasks, all on one current-thread tokio runtime with paused
//! (virtual) time. A seed fixes everything: the configuration (swarm, `config.rs`), the
//! operations and their arrival order (`workload.rs`), the disk's latencies, the crash instant
//! and the crash image. The same seed gives the same run, bit for bit (`Report::trace`).
//!
//! One seed:
//! 1. run: clients issue operations; the disk may be made to fail writes or flushes (the store
//!    is poisoned); power is lost at a virtual instant or a device event (or the store is closed);
//! 2. recovery on the crash image (maybe with bit flips or latent read errors), which may itself
//!    lose power at a device event: during recovery's own writes or the first write-back;
//! 3. a second recovery, which must agree with the first; maybe a write, close and reopen.
//!
//! Checks against the model (`model.rs`): every read the clients saw matches a state they could
//! have seen; after each recovery every object equals its state after some prefix of its
//! operations (versions included) that holds every write acknowledged as durable or before a
//! completed flush; media faults give errors, never wrong data.

#![allow(dead_code)]

pub mod config;
pub mod known;
pub mod model;
mod recovery;
pub mod trace;
pub mod workload;

use basalt_engine::sim::SimDisk;
use basalt_engine::{DeviceId, FormatOptions, OpenOptions, Store, format_sim};
use config::{Config, Crash};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};
use workload::Recorder;

/// What one seed did (for coverage totals) and its trace hash.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub trace: u64,
    pub ops: u64,
    pub acked: u64,
    pub reads_checked: u64,
    /// The run lost power (not a clean close).
    pub crashed: bool,
    /// Writes in flight (not completed) when the run lost power.
    pub in_flight_at_crash: u64,
    /// Writes completed but not durable when the run lost power.
    pub volatile_at_crash: u64,
    pub out_of_order: u64,
    pub writeback_batches: u64,
    pub poisoned: bool,
    /// Recovery lost power during its own I/O or the write-back after it.
    pub recovery_crashed: bool,
    /// ... during its own I/O (erasing a stale record, the sync).
    pub crashed_in_recovery: bool,
    /// Recovery erased a stale record (and maybe lost power right after).
    pub erased: bool,
    pub crashed_after_erase: bool,
    pub media_faults: bool,
    /// Regions that got a bit flip or a read error.
    pub damaged: Vec<config::Region>,
    /// Recovery refused the damaged image with an error.
    pub refused: bool,
    /// Blocks that read as an error after recovery (media faults).
    pub unreadable_blocks: u64,
    pub reopened: bool,
}

/// `SIM_LOG=1`: print what the clients and the disk do (debugging one seed).
pub fn log_enabled() -> bool {
    std::env::var("SIM_LOG").as_deref() == Ok("1")
}

/// The options every store of a run opens with.
pub fn open_options(cfg: &Config) -> OpenOptions {
    OpenOptions {
        writeback_idle: cfg.writeback_idle,
        ..OpenOptions::default()
    }
}

fn formatted_disk(cfg: &Config) -> Result<SimDisk, String> {
    let disk = SimDisk::seeded(cfg.device_size(), cfg.seed);
    let fmt = FormatOptions {
        device_id: DeviceId(1),
        object_size: cfg.object_size as u32,
        size: None,
        journal_size: Some(cfg.journal),
        ..FormatOptions::default()
    };
    format_sim(&disk, &fmt).map_err(|e| format!("format: {e}"))?;
    disk.set_latency(cfg.latency);
    disk.set_log(log_enabled());
    Ok(disk)
}

/// Runs one seed on a fresh current-thread runtime with paused time.
pub fn run_seed(seed: u64) -> Result<Report, String> {
    run_config(Config::draw(seed))
}

/// [`run_seed`] with disk images in the trace too.
pub fn run_seed_traced(seed: u64) -> Result<Report, String> {
    let mut cfg = Config::draw(seed);
    cfg.trace_images = true;
    run_config(cfg)
}

/// Runs one configuration (a seed's, maybe adjusted by a targeted test).
pub fn run_config(cfg: Config) -> Result<Report, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(run(cfg))
}

async fn run(cfg: Config) -> Result<Report, String> {
    let cfg = Rc::new(cfg);
    let disk = formatted_disk(&cfg)?;
    let mut report = Report::default();
    let (rec, image) = first_run(&cfg, &disk, &mut report).await?;
    let rec = Rc::try_unwrap(rec)
        .map_err(|_| "the recorder is still shared after the run".to_string())?
        .into_inner();
    if let Some(f) = rec.failures.first() {
        return Err(format!(
            "during the run: {f} ({} failures)",
            rec.failures.len()
        ));
    }
    report.reads_checked = rec.check_reads()? as u64;
    report.ops = rec.ops.len() as u64;
    report.acked = rec.acked() as u64;
    let mut trace = rec.trace;
    recovery::recover(&cfg, &rec, image, &mut report, &mut trace).await?;
    report.trace = trace.0;
    Ok(report)
}

/// The first run: clients against a fresh store until power is lost (or the store is closed).
/// Returns what the clients saw and the disk image recovery starts from.
async fn first_run(
    cfg: &Rc<Config>,
    disk: &SimDisk,
    report: &mut Report,
) -> Result<(Rc<RefCell<Recorder>>, SimDisk), String> {
    let store = Store::spawn_sim(disk, &open_options(cfg)).map_err(|e| format!("open: {e}"))?;
    let rec = Rc::new(RefCell::new(Recorder::new(cfg, disk.clone())));
    let pool = Rc::new(workload::random_pool(cfg.seed, 4 * cfg.object_size));
    let clients = futures::future::join_all(
        (0..cfg.clients)
            .map(|c| workload::client(c, cfg.clone(), store.clone(), rec.clone(), pool.clone())),
    );
    let poison = async {
        if let Some((at, writes)) = cfg.poison {
            tokio::time::sleep(at).await;
            rec.borrow_mut().poisoned = true;
            if writes {
                disk.fail_writes(true);
            } else {
                disk.fail_flushes(true);
            }
        }
    };
    let work = futures::future::join(clients, poison);
    if let Crash::AtEvent(n) = cfg.crash {
        disk.arm_crash(n, cfg.seed ^ 1);
    }
    let crash_at = match cfg.crash {
        Crash::At(t) => t,
        _ => Duration::from_secs(1 << 20),
    };
    let finished = tokio::select! {
        biased;
        _ = disk.wait_crash() => false,
        _ = tokio::time::sleep(crash_at) => {
            disk.crash(cfg.seed ^ 2);
            false
        }
        _ = work => true,
    };
    report.poisoned = cfg.poison.is_some();
    let batches = || store.stats().writeback_batches;
    let image = if !finished {
        report.writeback_batches = batches();
        store.crash();
        disk.crashed().expect("crashed")
    } else {
        match cfg.crash {
            Crash::None { close } => {
                if close {
                    // A poisoned store reports the failure when closing.
                    let r = store.close().await;
                    if r.is_err() && cfg.poison.is_none() {
                        return Err(format!("close: {r:?}"));
                    }
                }
                report.writeback_batches = batches();
                // Dropping the last handle finishes queued work; wait until it is done.
                drop(store);
                disk.released().await;
                disk.crash_image(cfg.seed ^ 3)
            }
            Crash::AfterIdle(d) => {
                tokio::time::sleep(d).await;
                report.writeback_batches = batches();
                store.crash();
                disk.crash(cfg.seed ^ 4)
            }
            _ => {
                report.writeback_batches = batches();
                store.crash();
                disk.crash(cfg.seed ^ 5)
            }
        }
    };
    report.crashed = disk.crashed().is_some();
    if report.crashed {
        report.in_flight_at_crash = disk.writes_in_flight() as u64;
        report.volatile_at_crash = disk.unflushed_writes() as u64;
    }
    report.out_of_order = disk.stats().out_of_order;
    let image_hash = if cfg.trace_images {
        image.durable_hash()
    } else {
        0
    };
    rec.borrow_mut().trace.add(
        10,
        &[report.crashed as u64, disk.stats().events, image_hash],
    );
    Ok((rec, image))
}

/// The settings of a batch of seeds, from the environment.
pub struct Budget {
    /// `SIM_SEED`: run only this seed (twice, checking the trace is the same).
    pub only: Option<u64>,
    pub first: u64,
    pub max_seeds: u64,
    pub time: Duration,
    pub threads: usize,
    /// `SIM_KEEP_GOING=1`: run on after a failing seed and report how many failed.
    pub keep_going: bool,
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

impl Budget {
    pub fn from_env(default_secs: u64, default_first: u64) -> Budget {
        Budget {
            only: env_u64("SIM_SEED"),
            first: env_u64("SIM_SEED_BASE").unwrap_or(default_first),
            max_seeds: env_u64("SIM_SEEDS").unwrap_or(u64::MAX),
            time: Duration::from_secs(env_u64("SIM_SECONDS").unwrap_or(default_secs)),
            threads: env_u64("SIM_THREADS").map_or_else(
                || std::thread::available_parallelism().map_or(1, |n| n.get().min(2)),
                |n| n.max(1) as usize,
            ),
            keep_going: std::env::var("SIM_KEEP_GOING").as_deref() == Ok("1"),
        }
    }
}

/// Totals over many seeds.
#[derive(Debug, Default)]
pub struct Totals {
    pub seeds: u64,
    pub sum: Report,
    pub elapsed: Duration,
}

impl Totals {
    fn add(&mut self, r: &Report) {
        let s = &mut self.sum;
        self.seeds += 1;
        s.ops += r.ops;
        s.acked += r.acked;
        s.reads_checked += r.reads_checked;
        s.crashed |= r.crashed;
        s.in_flight_at_crash += r.in_flight_at_crash;
        s.volatile_at_crash += r.volatile_at_crash;
        s.out_of_order += r.out_of_order;
        s.writeback_batches += r.writeback_batches;
        s.unreadable_blocks += r.unreadable_blocks;
        s.trace = s.trace.wrapping_add(r.trace);
    }
}

/// Counts of seeds with a property, for the coverage checks.
#[derive(Debug, Default)]
pub struct Coverage {
    pub crashed: u64,
    pub in_flight: u64,
    pub poisoned: u64,
    pub recovery_crashed: u64,
    pub crashed_in_recovery: u64,
    pub erased: u64,
    pub crashed_after_erase: u64,
    pub media_faults: u64,
    pub refused: u64,
    pub unreadable: u64,
    pub reopened: u64,
}

impl Coverage {
    fn add(&mut self, r: &Report) {
        self.crashed += r.crashed as u64;
        self.in_flight += (r.in_flight_at_crash > 0) as u64;
        self.poisoned += r.poisoned as u64;
        self.recovery_crashed += r.recovery_crashed as u64;
        self.crashed_in_recovery += r.crashed_in_recovery as u64;
        self.erased += r.erased as u64;
        self.crashed_after_erase += r.crashed_after_erase as u64;
        self.media_faults += r.media_faults as u64;
        self.refused += r.refused as u64;
        self.unreadable += (r.unreadable_blocks > 0) as u64;
        self.reopened += r.reopened as u64;
    }
}

/// The command that replays `seed` exactly (with the environment that changes what a seed
/// does).
pub fn replay(seed: u64, test: &str) -> String {
    let env =
        std::env::var("SIM_KNOWN_BUGS").map_or(String::new(), |v| format!("SIM_KNOWN_BUGS={v} "));
    format!("{env}SIM_SEED={seed} cargo test -p basalt-engine --test {test}")
}

/// Runs seeds from `budget.first` up, on `budget.threads` threads, until the time or count is
/// used up. Panics with the replay command on the first failing seed.
pub fn swarm(budget: &Budget, test: &str) -> (Totals, Coverage) {
    let start = Instant::now();
    let next = std::sync::atomic::AtomicU64::new(budget.first);
    let results = std::sync::Mutex::new((
        Totals::default(),
        Coverage::default(),
        None::<(u64, String)>,
        0u64,
    ));
    std::thread::scope(|s| {
        for _ in 0..budget.threads {
            s.spawn(|| {
                loop {
                    if start.elapsed() >= budget.time
                        || (results.lock().unwrap().2.is_some() && !budget.keep_going)
                    {
                        return;
                    }
                    let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if seed - budget.first >= budget.max_seeds {
                        return;
                    }
                    let r = std::panic::catch_unwind(|| run_seed(seed))
                        .unwrap_or_else(|p| Err(panic_text(&p)));
                    let mut g = results.lock().unwrap();
                    match r {
                        Ok(r) => {
                            g.0.add(&r);
                            g.1.add(&r);
                        }
                        Err(e) => {
                            g.3 += 1;
                            if budget.keep_going {
                                eprintln!(
                                    "seed {seed} failed: {}",
                                    e.chars().take(300).collect::<String>()
                                );
                            }
                            if g.2.as_ref().is_none_or(|(s, _)| seed < *s) {
                                g.2 = Some((seed, e));
                            }
                        }
                    }
                }
            });
        }
    });
    let (mut totals, cov, failed, failures) = results.into_inner().unwrap();
    totals.elapsed = start.elapsed();
    if let Some((seed, e)) = failed {
        panic!(
            "simulation failed with seed {seed} ({failures} of {} seeds failed): {e}\nconfig: {:?}\nreplay: {}",
            totals.seeds + failures,
            Config::draw(seed),
            replay(seed, test)
        );
    }
    (totals, cov)
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<String>() {
        format!("panic: {s}")
    } else if let Some(s) = p.downcast_ref::<&str>() {
        format!("panic: {s}")
    } else {
        "panic".into()
    }
}

/// Runs `seed` twice and checks both runs are identical; returns the report or the failure
/// with the replay command.
pub fn replay_seed(seed: u64, test: &str) -> Report {
    let first = run_seed_traced(seed);
    let second = run_seed_traced(seed);
    match (first, second) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b, "seed {seed} is not deterministic");
            a
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "seed {seed} is not deterministic");
            panic!(
                "simulation failed with seed {seed}: {a}\nconfig: {:?}\nreplay: {}",
                Config::draw(seed),
                replay(seed, test)
            )
        }
        (a, b) => panic!("seed {seed} is not deterministic: {a:?} then {b:?}"),
    }
}
