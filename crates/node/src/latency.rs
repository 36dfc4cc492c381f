//! Device latency: the mean time each local device took per read or write, and per flush, over
//! the last [`WINDOW`], from its store's completion counters (`StoreStats::io_micros` and
//! kin), sampled every [`TICK`]. `basalt status` shows it per device and warns about a device
//! much slower than its peers (`device_slow`, `bin/basalt/src/health.rs`): a slow disk holds
//! up every write of every PG it serves, and nothing else would name it. Nothing here marks a
//! device down: a slow device is the operator's call (`basalt device out`).

use basalt_engine::{Store, StoreStats};
use basalt_types::DeviceId;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The span the means cover.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);
/// How often the counters are sampled.
const TICK: Duration = Duration::from_secs(1);

/// One device's recent latency.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Latency {
    /// Mean milliseconds per device read or write completed in the window (`None`: none).
    pub io_ms: Option<f64>,
    /// Mean milliseconds per flush completed in the window (`None`: none).
    pub flush_ms: Option<f64>,
    /// Reads and writes completed in the window.
    pub ios: u64,
}

/// The latest latency of every local device, read by the status handler (`admin.rs`).
pub(crate) type Latencies = Arc<Mutex<BTreeMap<DeviceId, Latency>>>;

/// The counters at one instant.
#[derive(Clone, Copy, Debug)]
struct Sample {
    at: Instant,
    ios: u64,
    io_micros: u64,
    flushes: u64,
    flush_micros: u64,
}

impl Sample {
    fn of(at: Instant, s: &StoreStats) -> Sample {
        Sample {
            at,
            ios: s.ios_done,
            io_micros: s.io_micros,
            flushes: s.flushes_done,
            flush_micros: s.flush_micros,
        }
    }
}

/// The samples of one device within the window, oldest first.
#[derive(Default)]
struct Window {
    samples: VecDeque<Sample>,
}

impl Window {
    /// Adds the newest sample; returns the means since the newest sample at least [`WINDOW`]
    /// older than it (or the oldest one kept, early on).
    fn add(&mut self, s: Sample) -> Latency {
        self.samples.push_back(s);
        while self
            .samples
            .get(1)
            .is_some_and(|next| s.at.duration_since(next.at) >= WINDOW)
        {
            self.samples.pop_front();
        }
        let first = self.samples.front().copied().unwrap_or(s);
        let ios = s.ios.saturating_sub(first.ios);
        Latency {
            io_ms: mean_ms(s.io_micros.saturating_sub(first.io_micros), ios),
            flush_ms: mean_ms(
                s.flush_micros.saturating_sub(first.flush_micros),
                s.flushes.saturating_sub(first.flushes),
            ),
            ios,
        }
    }
}

fn mean_ms(micros: u64, n: u64) -> Option<f64> {
    (n > 0).then(|| micros as f64 / n as f64 / 1000.0)
}

/// Samples the stores every [`TICK`] until `stop`, publishing their latency in `out`.
pub(crate) async fn watch(
    stores: BTreeMap<DeviceId, Store>,
    out: Latencies,
    mut stop: watch::Receiver<bool>,
) {
    let mut windows: BTreeMap<DeviceId, Window> = BTreeMap::new();
    loop {
        let now = Instant::now();
        let latest: BTreeMap<DeviceId, Latency> = stores
            .iter()
            .map(|(dev, store)| {
                let w = windows.entry(*dev).or_default();
                (*dev, w.add(Sample::of(now, &store.stats())))
            })
            .collect();
        *out.lock().expect("latency map lock") = latest;
        tokio::select! {
            biased;
            _ = tokio::time::sleep(TICK) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(base: Instant, secs: u64, ios: u64, io_ms: u64, flushes: u64) -> Sample {
        Sample {
            at: base + Duration::from_secs(secs),
            ios,
            io_micros: io_ms * 1000,
            flushes,
            flush_micros: flushes * 2000,
        }
    }

    #[test]
    fn the_means_cover_the_last_ten_seconds_only() {
        let base = Instant::now();
        let mut w = Window::default();
        assert_eq!(w.add(sample(base, 0, 0, 0, 0)), Latency::default());
        // 100 I/Os of 1 ms in the first second, 4 flushes of 2 ms.
        let l = w.add(sample(base, 1, 100, 100, 4));
        assert_eq!((l.io_ms, l.flush_ms, l.ios), (Some(1.0), Some(2.0), 100));
        // Then 10 I/Os of 500 ms each (the device became slow), still within the window.
        let l = w.add(sample(base, 5, 110, 5100, 4));
        assert_eq!((l.io_ms, l.ios), (Some(5_100_000.0 / 110.0 / 1000.0), 110));
        // Ten seconds on, the fast second is out of the window: only the slow I/Os count.
        let l = w.add(sample(base, 12, 110, 5100, 4));
        assert_eq!((l.io_ms, l.flush_ms, l.ios), (Some(500.0), None, 10));
        // Nothing completed within the window: no mean.
        let l = w.add(sample(base, 30, 110, 5100, 4));
        assert_eq!(l, Latency::default());
    }
}
