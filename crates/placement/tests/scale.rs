//! Placement at scale: balance, and data moved when a host joins or leaves.
//!
//! The CI case is 100 hosts x 10 devices; the 1000 x 10 case runs with
//! `cargo test --release -p basalt-placement --test scale -- --ignored` (about 3 s), and
//! `examples/placement_stats.rs` prints the numbers docs/design/placement.md quotes.

use basalt_placement::{
    ClusterMap, DeviceInfo, FailureDomain, NodeInfo, PlacementInput, PoolSpec, compute,
};
use basalt_types::{DeviceId, NodeId, PoolId};
use std::collections::BTreeMap;

const POOL: PoolId = PoolId(1);

fn add_host(inp: &mut PlacementInput, h: u32, per_host: u32) {
    inp.nodes.insert(
        NodeId(h),
        NodeInfo {
            addr: format!("10.0.{}.{}:7000", h / 256, h % 256),
        },
    );
    for k in 0..per_host {
        inp.devices.insert(
            DeviceId(h * 100 + k),
            DeviceInfo::new(NodeId(h), "ssd", 1000, 131072),
        );
    }
}

/// The largest deviation of any in device's copy count from the mean, as a fraction.
fn worst_deviation(map: &ClusterMap) -> f64 {
    let mut counts: BTreeMap<DeviceId, u32> = map
        .devices
        .iter()
        .filter(|(_, d)| d.r#in)
        .map(|(id, _)| (*id, 0))
        .collect();
    for pg in &map.pools[&POOL].pgs {
        for d in &pg.up {
            *counts.entry(*d).or_default() += 1;
        }
    }
    let mean = f64::from(counts.values().sum::<u32>()) / counts.len() as f64;
    counts
        .values()
        .map(|&c| (f64::from(c) / mean - 1.0).abs())
        .fold(0.0, f64::max)
}

fn moved(a: &ClusterMap, b: &ClusterMap) -> usize {
    a.pools[&POOL]
        .pgs
        .iter()
        .zip(&b.pools[&POOL].pgs)
        .map(|(x, y)| y.up.iter().filter(|d| !x.up.contains(d)).count())
        .sum()
}

fn check(hosts: u32, per_host: u32, pg_count: u32, replicas: u8) {
    let mut inp = PlacementInput::default();
    for h in 1..=hosts {
        add_host(&mut inp, h, per_host);
    }
    inp.pools.insert(
        POOL,
        PoolSpec {
            pg_count,
            replicas,
            min_size: 2,
            object_size: 131072,
            failure_domain: FailureDomain::Host,
            device_class: None,
        },
    );
    let map = compute(None, &inp);
    let dev = worst_deviation(&map);
    assert!(dev <= 0.03, "a device is {:.2}% off its share", dev * 100.0);

    let mut grown = inp.clone();
    add_host(&mut grown, hosts + 1, per_host);
    let after = compute(Some(&map), &grown);
    let slots = f64::from(pg_count) * f64::from(replicas);
    let ideal = slots / f64::from(hosts + 1);
    let m = moved(&map, &after) as f64;
    assert!(
        m <= 1.1 * ideal,
        "adding a host moved {m} copies, ideal {ideal:.0}"
    );
    assert!(worst_deviation(&after) <= 0.03);

    let mut shrunk = inp;
    for k in 0..per_host {
        shrunk
            .devices
            .get_mut(&DeviceId(100 + k))
            .expect("device")
            .r#in = false;
    }
    let removed = compute(Some(&map), &shrunk);
    let held: usize = map.pools[&POOL]
        .pgs
        .iter()
        .map(|p| p.up.iter().filter(|d| d.0 / 100 == 1).count())
        .sum();
    let m = moved(&map, &removed) as f64;
    assert!(
        m <= 1.1 * held as f64,
        "removing a host moved {m} copies, it held {held}"
    );
    assert!(worst_deviation(&removed) <= 0.03);
}

#[test]
fn a_hundred_hosts_of_ten_devices() {
    check(100, 10, 1 << 15, 3);
}

#[test]
#[ignore = "about 3 s in release, minutes in debug: run with --release -- --ignored"]
fn a_thousand_hosts_of_ten_devices() {
    check(1000, 10, 1 << 18, 3);
}
