//! Which devices are slow: a device much slower than the other devices of its class, or slower
//! than any device should ever be, judged from the mean latency of the reads and writes it
//! completed in the last 10 s (`crates/node/src/latency.rs`). A slow device holds up every
//! write of every PG it serves (a write is acknowledged once every copy is durable), so
//! `basalt status` names it (`device_slow`); moving its data off (`basalt device out ID`) is
//! the operator's call. Pure: the unit tests below feed it hand-made latencies.

use serde::Serialize;
use std::collections::BTreeMap;

/// One device's recent latency, as its node reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceLatency {
    pub id: u32,
    /// Its class (`hdd`, `ssd`, ...): a device is compared with its own kind only.
    pub class: String,
    /// Mean milliseconds per read or write completed in the window.
    pub io_ms: f64,
    /// Reads and writes completed in the window.
    pub ios: u64,
}

/// A slow device, and the median of its class's other devices (`None`: it has no peers).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SlowDevice {
    pub id: u32,
    pub io_ms: f64,
    pub peers_ms: Option<f64>,
}

/// Fewer reads and writes than this in the window say nothing about a device.
pub const MIN_IOS: u64 = 20;
/// A device at least this many times slower than the median of its class's other devices...
pub const FACTOR: f64 = 4.0;
/// ...and at least this slow (ms per I/O) is slow. (Loaded disks of one kind are alike: one
/// that queues its I/O for tens of milliseconds while its peers answer in a few is failing,
/// or shares its drive with something else.)
pub const MIN_MS: f64 = 20.0;
/// A device this slow (ms per I/O) is slow whatever its peers.
pub const ABSOLUTE_MS: f64 = 1000.0;

/// The slow devices among `devs`, in their order. Each class's latencies are sorted once, so a
/// cluster of thousands of devices is judged in O(n log n).
pub fn slow_devices(devs: &[DeviceLatency]) -> Vec<SlowDevice> {
    let judged: Vec<&DeviceLatency> = devs.iter().filter(|d| d.ios >= MIN_IOS).collect();
    let mut by_class: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for d in &judged {
        by_class.entry(&d.class).or_default().push(d.io_ms);
    }
    for v in by_class.values_mut() {
        v.sort_by(f64::total_cmp);
    }
    judged
        .iter()
        .filter_map(|d| {
            let peers_ms = median_of_others(&by_class[d.class.as_str()], d.io_ms);
            let relative = peers_ms.is_some_and(|m| d.io_ms >= MIN_MS && d.io_ms >= FACTOR * m);
            (relative || d.io_ms >= ABSOLUTE_MS).then_some(SlowDevice {
                id: d.id,
                io_ms: d.io_ms,
                peers_ms,
            })
        })
        .collect()
}

/// The median of `sorted` without one occurrence of `own` (which it holds); `None` when
/// nothing else is left.
fn median_of_others(sorted: &[f64], own: f64) -> Option<f64> {
    let skip = sorted.partition_point(|x| x.total_cmp(&own).is_lt());
    let n = sorted.len().checked_sub(1).filter(|n| *n > 0)?;
    let at = |k: usize| sorted[if k < skip { k } else { k + 1 }];
    Some(if n % 2 == 1 {
        at(n / 2)
    } else {
        (at(n / 2 - 1) + at(n / 2)) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(id: u32, class: &str, io_ms: f64, ios: u64) -> DeviceLatency {
        DeviceLatency {
            id,
            class: class.into(),
            io_ms,
            ios,
        }
    }

    fn ids(s: &[SlowDevice]) -> Vec<u32> {
        s.iter().map(|d| d.id).collect()
    }

    #[test]
    fn the_median_of_the_others_leaves_out_one_occurrence_of_the_device() {
        assert_eq!(median_of_others(&[5.0], 5.0), None);
        assert_eq!(median_of_others(&[1.0, 5.0], 5.0), Some(1.0));
        assert_eq!(median_of_others(&[1.0, 2.0, 9.0], 1.0), Some(5.5));
        assert_eq!(median_of_others(&[1.0, 2.0, 9.0], 9.0), Some(1.5));
        assert_eq!(median_of_others(&[1.0, 2.0, 3.0, 9.0], 2.0), Some(3.0));
        // Equal values are interchangeable: one of them is left out.
        assert_eq!(median_of_others(&[2.0, 2.0, 2.0], 2.0), Some(2.0));
    }

    #[test]
    fn one_device_far_slower_than_its_peers_is_slow() {
        let devs = [
            dev(1, "hdd", 2.0, 500),
            dev(2, "hdd", 400.0, 60),
            dev(3, "hdd", 3.0, 500),
        ];
        let slow = slow_devices(&devs);
        assert_eq!(
            slow,
            vec![SlowDevice {
                id: 2,
                io_ms: 400.0,
                peers_ms: Some(2.5)
            }]
        );
        // Two devices: each is compared with the other.
        assert_eq!(
            ids(&slow_devices(&[
                dev(1, "hdd", 2.0, 500),
                dev(2, "hdd", 90.0, 50)
            ])),
            [2]
        );
    }

    #[test]
    fn alike_devices_under_load_are_not_slow_however_slow_they_all_are() {
        let devs = [
            dev(1, "hdd", 180.0, 500),
            dev(2, "hdd", 240.0, 400),
            dev(3, "hdd", 150.0, 600),
        ];
        assert!(slow_devices(&devs).is_empty());
        // 3.9x is not 4x.
        let devs = [dev(1, "ssd", 10.0, 500), dev(2, "ssd", 39.0, 500)];
        assert!(slow_devices(&devs).is_empty());
    }

    #[test]
    fn fast_devices_many_times_faster_than_their_peers_are_not_slow() {
        // 4x of 0.1 ms is nothing: below MIN_MS a device is not slow.
        let devs = [dev(1, "ssd", 0.1, 500), dev(2, "ssd", 5.0, 500)];
        assert!(slow_devices(&devs).is_empty());
    }

    #[test]
    fn classes_are_compared_within_themselves() {
        // A disk is not slow beside flash.
        let devs = [
            dev(1, "ssd", 0.2, 900),
            dev(2, "ssd", 0.3, 900),
            dev(3, "hdd", 25.0, 200),
            dev(4, "hdd", 30.0, 200),
        ];
        assert!(slow_devices(&devs).is_empty());
        // A lone device of its class has no peers: only the absolute limit applies.
        let devs = [dev(1, "ssd", 0.2, 900), dev(3, "hdd", 900.0, 30)];
        assert!(slow_devices(&devs).is_empty());
        let devs = [dev(1, "ssd", 0.2, 900), dev(3, "hdd", 1500.0, 30)];
        assert_eq!(
            slow_devices(&devs),
            vec![SlowDevice {
                id: 3,
                io_ms: 1500.0,
                peers_ms: None
            }]
        );
    }

    #[test]
    fn devices_with_few_ios_in_the_window_are_not_judged_nor_peers() {
        // One cold read of 300 ms says nothing.
        let devs = [dev(1, "hdd", 2.0, 500), dev(2, "hdd", 300.0, 1)];
        assert!(slow_devices(&devs).is_empty());
        // And an idle peer does not make the busy ones look slow.
        let devs = [
            dev(1, "hdd", 30.0, 500),
            dev(2, "hdd", 0.1, 3),
            dev(3, "hdd", 28.0, 500),
        ];
        assert!(slow_devices(&devs).is_empty());
    }
}
