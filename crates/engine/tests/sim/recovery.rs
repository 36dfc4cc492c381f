//! Recovery phases of a simulated run: open the crash image (maybe damaged, maybe losing power
//! again during recovery or the first write-back), check every object against the model, open
//! the second crash image and check that both recoveries agree, then maybe write, close and
//! reopen once more.

use super::config::{Config, Crash, Region};
use super::model::{BLK, Observed};
use super::trace::Trace;
use super::workload::{Recorder, oid};
use super::{Report, open_options};
use basalt_engine::sim::SimDisk;
use basalt_engine::{Store, WriteOptions};
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::ops::Range;
use std::time::Duration;

/// How long (virtual time) write-back may take to empty the journal after recovery.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);

pub async fn recover(
    cfg: &Config,
    rec: &Recorder,
    image: SimDisk,
    report: &mut Report,
    trace: &mut Trace,
) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(cfg.seed ^ 0x7265_636f_7665);
    // Read errors go on the crash image. Bit flips too if the known bug that loses (or mixes
    // up) acknowledged writes is wanted; otherwise on the image after write-back has emptied
    // the journal (`KnownBugs::media_loss`).
    let early_flips = cfg.known.media_loss;
    let (mut bad_reads, mut damaged) = damage(cfg, &image, &mut rng, report, early_flips, true);
    let hash = |d: &SimDisk| {
        if cfg.trace_images {
            d.durable_hash()
        } else {
            0
        }
    };
    trace.add(20, &[hash(&image), bad_reads.len() as u64]);
    image.set_log(super::log_enabled());
    if let Some(n) = cfg.recovery_crash {
        image.arm_crash(n, cfg.seed ^ 6);
    }
    let opts = open_options(cfg);
    let store = match Store::spawn_sim(&image, &opts) {
        Ok(s) => s,
        // Refusing a damaged store with an error is a correct answer.
        Err(_) if report.media_faults => return refused(report, trace),
        Err(e) => return Err(format!("recovery failed: {e}")),
    };
    report.crashed_in_recovery = image.crashed().is_some();
    // Recovery's only blocking writes erase a stale record; the crash came after one.
    report.crashed_after_erase = report.crashed_in_recovery && image.stats().blocking_writes > 0;
    report.erased = image.stats().blocking_writes > 0;
    let first = observe(cfg, &store).await;
    check_all(cfg, rec, &first, report, "first recovery").map_err(|e| with(e, &damaged))?;
    trace_obs(trace, 22, &first);
    // Let write-back run until the journal is empty, or until the armed crash.
    let mut waited = Duration::ZERO;
    while image.crashed().is_none() && store.stats().journal_used > 0 {
        if waited > DRAIN_LIMIT {
            return Err("write-back after recovery does not empty the journal".into());
        }
        let step = cfg.writeback_idle.max(Duration::from_micros(100));
        tokio::time::sleep(step).await;
        waited += step;
    }
    report.recovery_crashed = image.crashed().is_some();
    report.writeback_batches += store.stats().writeback_batches;
    let drained = !report.recovery_crashed;
    let second_image = image.crash(cfg.seed ^ 7);
    store.crash();
    for r in &bad_reads {
        second_image.fail_reads(r.clone());
    }
    second_image.set_log(super::log_enabled());
    if !early_flips && drained {
        let (more, what) = damage(cfg, &second_image, &mut rng, report, true, false);
        bad_reads.extend(more);
        damaged.extend(what);
    }
    trace.add(23, &[report.recovery_crashed as u64, hash(&second_image)]);
    let store = match Store::spawn_sim(&second_image, &opts) {
        Ok(s) => s,
        Err(_) if report.media_faults => return refused(report, trace),
        Err(e) => return Err(format!("second recovery failed: {e}")),
    };
    let second = observe(cfg, &store).await;
    check_all(cfg, rec, &second, report, "second recovery").map_err(|e| with(e, &damaged))?;
    for (i, (a, b)) in first.iter().zip(&second).enumerate() {
        if !a.agrees(b) {
            let e = format!(
                "object {i} differs between two recoveries: versions {} and {}; ops {}",
                a.version,
                b.version,
                rec.describe(i)
            );
            return Err(with(e, &damaged));
        }
    }
    trace_obs(trace, 24, &second);
    report.unreadable_blocks = second.iter().map(|o| o.errors() as u64).sum();
    if cfg.reopen && !report.media_faults {
        reopen(cfg, store, &second_image, &second).await?;
        report.reopened = true;
    } else {
        store.crash();
    }
    Ok(())
}

fn refused(report: &mut Report, trace: &mut Trace) -> Result<(), String> {
    report.refused = true;
    trace.add(21, &[0]);
    Ok(())
}

/// A failure message with the media faults that were applied.
fn with(e: String, damaged: &[String]) -> String {
    if damaged.is_empty() {
        e
    } else {
        format!("{e}; media faults: {}", damaged.join(", "))
    }
}

/// The recovered store keeps working: a durable write, a clean close, and after reopening
/// everything is as before plus that write.
async fn reopen(
    cfg: &Config,
    store: Store,
    disk: &SimDisk,
    before: &[Observed],
) -> Result<(), String> {
    let marker = oid(cfg.objects + 1);
    let v = store
        .write(
            marker,
            0,
            Bytes::from_static(b"after"),
            WriteOptions::durable(),
        )
        .await
        .map_err(|e| format!("write after recovery: {e}"))?;
    store
        .close()
        .await
        .map_err(|e| format!("close after recovery: {e}"))?;
    drop(store);
    disk.released().await;
    let store = Store::spawn_sim(disk, &open_options(cfg)).map_err(|e| format!("reopen: {e}"))?;
    let again = observe(cfg, &store).await;
    if again != before {
        return Err("objects changed across a clean close and reopen".into());
    }
    let got = store.read(marker, 0, 5).await.map_err(|e| e.to_string())?;
    let info = store.object_info(marker).await.map_err(|e| e.to_string())?;
    if got != b"after"[..] || info.map(|i| i.version) != Some(v) {
        return Err("the write after recovery is lost".into());
    }
    store.close().await.map_err(|e| format!("close: {e}"))
}

/// Every object as the store shows it: whole-object read, or block by block if that fails.
async fn observe(cfg: &Config, store: &Store) -> Vec<Observed> {
    let mut out = Vec::new();
    for i in 0..cfg.objects {
        let o = oid(i);
        let size = cfg.object_size;
        let blocks = match store.read(o, 0, size as u32).await {
            Ok(d) => d.chunks(BLK).map(|c| Ok(c.to_vec())).collect(),
            Err(_) => {
                let mut v = Vec::new();
                for b in 0..size / BLK {
                    let r = store.read(o, (b * BLK) as u32, BLK as u32).await;
                    v.push(r.map(|d| d.to_vec()).map_err(|e| e.to_string()));
                }
                v
            }
        };
        let (version, deleted) = match store.object_info(o).await {
            Ok(info) => info.map_or((0, false), |i| {
                assert_eq!(i.version.epoch, 0, "the workload writes in epoch 0");
                (i.version.seq, i.deleted)
            }),
            Err(_) => (u64::MAX, false),
        };
        out.push(Observed {
            blocks,
            version,
            deleted,
        });
    }
    out
}

fn trace_obs(trace: &mut Trace, tag: u64, obs: &[Observed]) {
    for o in obs {
        let mut vals = vec![o.version, u64::from(o.deleted)];
        for b in &o.blocks {
            vals.push(b.as_ref().map_or(u64::MAX, |d| Trace::digest(d)));
        }
        trace.add(tag, &vals);
    }
}

/// Each object equals its state after a prefix of its operations that holds everything that
/// had to survive. With media faults, blocks may read as errors, never as wrong data.
fn check_all(
    cfg: &Config,
    rec: &Recorder,
    obs: &[Observed],
    report: &Report,
    what: &str,
) -> Result<(), String> {
    let clean = matches!(cfg.crash, Crash::None { .. }) && cfg.poison.is_none();
    for (i, o) in obs.iter().enumerate() {
        if o.errors() > 0 && !report.media_faults {
            return Err(format!(
                "{what}: object {i} (version {}) has unreadable blocks without a media fault ({}); ops {}",
                o.version,
                rec.hist[i].explain(o),
                rec.describe(i)
            ));
        }
        let h = &rec.hist[i];
        let must = if clean {
            h.states.len() - 1
        } else {
            rec.must(i)
        };
        if h.matching_prefix(o, must).is_none() {
            let any = h.matching_prefix(o, 0);
            return Err(format!(
                "{what}: object {i} (version {}) matches no state from {must} to {} (matches {any:?}; {}); ops {}",
                o.version,
                h.states.len() - 1,
                h.explain(o),
                rec.describe(i)
            ));
        }
    }
    Ok(())
}

fn region_range(image: &SimDisk, region: Region, rng: &mut StdRng) -> Option<(Region, Range<u64>)> {
    let r = image.regions()?;
    let region = match region {
        Region::Any => [Region::Slots, Region::Journal, Region::Meta][rng.random_range(0..3)],
        x => x,
    };
    Some(match region {
        Region::Slots => (region, r.slots),
        Region::Journal => (region, r.journal),
        _ => (Region::Meta, r.meta),
    })
}

/// A 4 KiB block in `range` that holds data (not all zeros), from a random start, if any.
fn written_block(image: &SimDisk, range: &Range<u64>, rng: &mut StdRng) -> Option<u64> {
    let blocks = (range.end - range.start) / BLK as u64;
    let first = rng.random_range(0..blocks.max(1));
    (0..blocks)
        .map(|i| range.start + (first + i) % blocks * BLK as u64)
        .find(|&at| image.read(at, BLK).iter().any(|&b| b != 0))
}

/// Applies the configured bit flips and read errors (as asked) to the image; returns the
/// unreadable ranges and a description of every fault.
fn damage(
    cfg: &Config,
    image: &SimDisk,
    rng: &mut StdRng,
    report: &mut Report,
    flips: bool,
    errors: bool,
) -> (Vec<Range<u64>>, Vec<String>) {
    let mut bad = Vec::new();
    let mut what = Vec::new();
    if let Some((region, n)) = cfg.corrupt.filter(|_| flips) {
        for _ in 0..n {
            let Some((mut region, mut range)) = region_range(image, region, rng) else {
                break;
            };
            if region == Region::Journal && !cfg.known.media_loss {
                // Steer around the known bug: flip a bit in a slot instead.
                (region, range) = region_range(image, Region::Slots, rng).expect("formatted");
            }
            if let Some(at) = written_block(image, &range, rng) {
                let off = at + rng.random_range(0..BLK as u64);
                image.flip_bit(off, rng.random_range(0..8));
                report.media_faults = true;
                report.damaged.push(region);
                what.push(format!("bit flip in {region:?} at {off}"));
            }
        }
    }
    if let Some((region, n)) = cfg.read_errors.filter(|_| errors) {
        for _ in 0..n {
            let Some((region, range)) = region_range(image, region, rng) else {
                break;
            };
            if let Some(at) = written_block(image, &range, rng) {
                let r = at..at + BLK as u64;
                image.fail_reads(r.clone());
                what.push(format!("read error in {region:?} at {at}"));
                bad.push(r);
                report.media_faults = true;
                report.damaged.push(region);
            }
        }
    }
    (bad, what)
}
