//! Device faults: a device whose store is poisoned (a write or flush failed: it refuses all I/O
//! until reopened), on which more distinct blocks failed their checksums (or could not be read)
//! than the limit within the window (a block read again and again counts once), or
//! whose oldest I/O in flight has waited longer than the stall limit (the device hangs without
//! returning errors: a firmware stall, a dead path, a hung controller), is reported `down` in
//! its catalog record. The leader's next map marks it down, its PGs fail over to the other
//! members and, after the down-out interval, are rebuilt elsewhere.
//!
//! The report is sticky: the record keeps the reason (`DeviceRecord::fault`), a restart of the
//! node registers the device down again (a restart does not make a failing drive
//! trustworthy), and only an operator's `basalt device clear-fault` brings it back. While the
//! node runs it checks the record every tick and reports the device again if it was marked up
//! meanwhile, because its store stays poisoned (or the drive suspect) until the node restarts.
//! A stalled device stays down too when its I/O completes after all: a drive that hung once is
//! not trusted again without an operator, and its PGs have moved on meanwhile. So does a
//! registered device whose store did not open when the node started (`devices.rs`): cleared,
//! it is reported again until the node restarts and opens it.

use basalt_engine::Store;
use basalt_meta::{Catalog, DeviceState};
use basalt_types::DeviceId;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How often the stores are checked.
const TICK: Duration = Duration::from_millis(500);

/// When a device counts as faulty.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FaultConfig {
    /// More distinct bad blocks than this within `window` mark the device down (0: never).
    pub checksum_limit: u32,
    pub checksum_window: Duration,
    /// An I/O in flight for longer than this marks the device down (zero: never).
    pub stall_limit: Duration,
}

/// An I/O this old is logged (once per stall) before it reaches the stall limit.
const SLOW_IO: Duration = Duration::from_secs(1);

/// What the watcher knows of one device.
#[derive(Default)]
struct Watch {
    /// (when, distinct bad blocks so far) samples within the window, oldest first.
    samples: VecDeque<(Instant, u64)>,
    /// Why the device is faulty, once it is.
    fault: Option<String>,
    /// Whether the catalog record was seen down since the fault.
    reported: bool,
    /// Whether the current slow I/O was logged.
    slow_logged: bool,
}

/// Watches the stores until `stop`; reports faulty devices down, and adds those whose I/O hangs
/// to `hung` (their sub-operations are answered with an error from then on: `service.rs`).
pub(crate) async fn watch(
    catalog: Catalog,
    stores: BTreeMap<DeviceId, Store>,
    unopened: BTreeMap<DeviceId, String>,
    hung: watch::Sender<BTreeSet<DeviceId>>,
    cfg: FaultConfig,
    mut stop: watch::Receiver<bool>,
) {
    let mut seen: BTreeMap<DeviceId, Watch> = BTreeMap::new();
    // A device whose store did not open stays faulty until the node restarts (and tries again).
    for (dev, why) in unopened {
        seen.entry(dev).or_default().fault = Some(why);
    }
    loop {
        for (dev, w) in seen.iter_mut().filter(|(d, _)| !stores.contains_key(d)) {
            if let Some(why) = w.fault.clone() {
                w.reported = report(&catalog, *dev, &why, w.reported).await;
            }
        }
        let now = Instant::now();
        for (dev, store) in &stores {
            let w = seen.entry(*dev).or_default();
            if w.fault.is_none()
                && let Some(f) = fault(*dev, store, w, now, cfg)
            {
                tracing::error!(device = %dev, "device fault: {}; reporting it down", f.why);
                if f.hung {
                    hung.send_modify(|h| {
                        h.insert(*dev);
                    });
                }
                w.fault = Some(f.why);
            }
            if let Some(why) = w.fault.clone() {
                w.reported = report(&catalog, *dev, &why, w.reported).await;
            }
        }
        tokio::select! {
            biased;
            _ = tokio::time::sleep(TICK) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Why a device is faulty.
struct Fault {
    why: String,
    /// Its I/O hangs (rather than failing).
    hung: bool,
}

/// Why the device is faulty now, if it is.
fn fault(
    dev: DeviceId,
    store: &Store,
    w: &mut Watch,
    now: Instant,
    cfg: FaultConfig,
) -> Option<Fault> {
    let failed = |why: String| Fault { why, hung: false };
    if store.is_poisoned() {
        return Some(failed(
            "its store is poisoned (a write or flush failed)".into(),
        ));
    }
    if let Some(why) = stalled(dev, store, w, cfg.stall_limit) {
        return Some(Fault { why, hung: true });
    }
    // Distinct bad blocks, not reads: one damaged object read again and again (a client
    // retrying, recovery trying every source) is not a dying drive.
    let errors = store.stats().bad_blocks;
    w.samples.push_back((now, errors));
    while w
        .samples
        .front()
        .is_some_and(|(t, _)| now.duration_since(*t) > cfg.checksum_window)
    {
        w.samples.pop_front();
    }
    let oldest = w.samples.front().map_or(errors, |(_, n)| *n);
    let recent = errors.saturating_sub(oldest);
    (cfg.checksum_limit > 0 && recent > u64::from(cfg.checksum_limit)).then(|| {
        failed(format!(
            "{recent} blocks failed their checksums or could not be read within {:?} (limit {})",
            cfg.checksum_window, cfg.checksum_limit
        ))
    })
}

/// Makes sure the device's record says down and faulty. Returns whether it does (so the next
/// tick only checks it again).
async fn report(catalog: &Catalog, dev: DeviceId, why: &str, reported: bool) -> bool {
    match catalog.get_device(dev).await {
        Ok(Some(rec)) if rec.state == DeviceState::Down && rec.fault.is_some() => return true,
        // Removed by an operator (`basalt device remove`): there is nothing to report.
        Ok(None) => return true,
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(device = %dev, "reading the device record: {e}");
            return false;
        }
    }
    if reported {
        tracing::warn!(device = %dev, "the faulty device was marked up again; reporting it down again ({why})");
    }
    match catalog.report_device_fault(dev, why).await {
        Ok(_) => {
            tracing::warn!(device = %dev, "reported down: {why}");
            true
        }
        Err(e) => {
            tracing::warn!(device = %dev, "reporting the device down failed: {e}; retrying");
            false
        }
    }
}

/// Why the device counts as hung, if it does: its oldest I/O has waited longer than `limit`.
/// Logs an I/O slower than [`SLOW_IO`] once per stall (the stall may end by itself).
fn stalled(dev: DeviceId, store: &Store, w: &mut Watch, limit: Duration) -> Option<String> {
    let Some(age) = store.oldest_io_age() else {
        w.slow_logged = false;
        return None;
    };
    if !limit.is_zero() && age > limit {
        return Some(format!(
            "an I/O has waited {:.1} s for the device (stall limit {:.1} s, \
             --device-stall-timeout): the device hangs",
            age.as_secs_f64(),
            limit.as_secs_f64()
        ));
    }
    if age >= SLOW_IO && !w.slow_logged {
        w.slow_logged = true;
        let then = if limit.is_zero() {
            "stall detection is off".to_string()
        } else {
            format!("reported down past {:.1} s", limit.as_secs_f64())
        };
        tracing::warn!(
            device = %dev,
            "slow device: an I/O has waited {:.1} s ({then})",
            age.as_secs_f64()
        );
    } else if age < SLOW_IO {
        w.slow_logged = false;
    }
    None
}
