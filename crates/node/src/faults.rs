//! Device faults: a device whose store is poisoned (a write or flush failed: it refuses all I/O
//! until reopened), or that returned more checksum errors than the limit within the window, is
//! reported `down` in its catalog record. The leader's next map marks it down, its PGs fail
//! over to the other members and, after the down-out interval, are rebuilt elsewhere.
//!
//! The report is sticky while the node runs: the node checks its record again every tick and
//! sets it down again if anything marked it up (a registration, an operator), because the store
//! stays poisoned (or the drive suspect) until the node restarts; a restart reopens the store
//! (recovery) and registers the device up again.

use basalt_engine::Store;
use basalt_meta::{Catalog, DeviceState};
use basalt_types::DeviceId;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How often the stores are checked.
const TICK: Duration = Duration::from_millis(500);

/// When a device counts as faulty.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FaultConfig {
    /// More checksum errors than this within `window` mark the device down (0: never).
    pub checksum_limit: u32,
    pub checksum_window: Duration,
}

/// What the watcher knows of one device.
#[derive(Default)]
struct Watch {
    /// (when, checksum errors so far) samples within the window, oldest first.
    samples: VecDeque<(Instant, u64)>,
    /// Why the device is faulty, once it is.
    fault: Option<String>,
    /// Whether the catalog record was seen down since the fault.
    reported: bool,
}

/// Watches the stores until `stop`; reports faulty devices down.
pub(crate) async fn watch(
    catalog: Catalog,
    stores: BTreeMap<DeviceId, Store>,
    cfg: FaultConfig,
    mut stop: watch::Receiver<bool>,
) {
    let mut seen: BTreeMap<DeviceId, Watch> = BTreeMap::new();
    loop {
        let now = Instant::now();
        for (dev, store) in &stores {
            let w = seen.entry(*dev).or_default();
            if w.fault.is_none() {
                w.fault = fault(store, w, now, cfg);
                if let Some(why) = &w.fault {
                    tracing::error!(device = %dev, "device fault: {why}; reporting it down");
                }
            }
            if let Some(why) = w.fault.clone() {
                w.reported = report(&catalog, *dev, &why, w.reported).await;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Why the device is faulty now, if it is.
fn fault(store: &Store, w: &mut Watch, now: Instant, cfg: FaultConfig) -> Option<String> {
    if store.is_poisoned() {
        return Some("its store is poisoned (a write or flush failed)".into());
    }
    let errors = store.stats().checksum_errors;
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
        format!(
            "{recent} checksum errors within {:?} (limit {})",
            cfg.checksum_window, cfg.checksum_limit
        )
    })
}

/// Makes sure the device's record says down. Returns whether it does (so the next tick only
/// checks it again).
async fn report(catalog: &Catalog, dev: DeviceId, why: &str, reported: bool) -> bool {
    match catalog.get_device(dev).await {
        Ok(Some(rec)) if rec.state == DeviceState::Down => return true,
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(device = %dev, "reading the device record: {e}");
            return false;
        }
    }
    if reported {
        tracing::warn!(device = %dev, "the faulty device was marked up again; reporting it down again ({why})");
    }
    match catalog.set_device_state(dev, DeviceState::Down).await {
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
