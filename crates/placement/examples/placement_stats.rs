//! Prints what `compute` does on a few cluster shapes: time, balance and movement.
//!
//! `cargo run --release -p basalt-placement --example placement_stats`

use basalt_placement::{
    ClusterMap, DeviceInfo, FailureDomain, NodeInfo, PlacementInput, PoolSpec, compute,
};
use basalt_types::{DeviceId, NodeId, PoolId};
use std::collections::BTreeMap;
use std::time::Instant;

fn cluster(hosts: u32, per_host: u32, pgs: u32, replicas: u8) -> PlacementInput {
    let mut inp = PlacementInput::default();
    for h in 1..=hosts {
        add_host(&mut inp, h, per_host);
    }
    inp.pools.insert(
        PoolId(1),
        PoolSpec {
            pg_count: pgs,
            replicas,
            object_size: 131072,
            failure_domain: FailureDomain::Host,
            device_class: None,
        },
    );
    inp
}

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
            DeviceInfo {
                node: NodeId(h),
                class: "ssd".into(),
                weight: 1000,
                up: true,
                r#in: true,
            },
        );
    }
}

fn spread(map: &ClusterMap, primaries: bool) -> (u32, u32) {
    let mut counts: BTreeMap<DeviceId, u32> = map.devices.keys().map(|d| (*d, 0)).collect();
    for pg in &map.pools[&PoolId(1)].pgs {
        let members = if primaries {
            &pg[..1.min(pg.len())]
        } else {
            &pg[..]
        };
        for d in members {
            *counts.entry(*d).or_default() += 1;
        }
    }
    let min = counts.values().copied().min().unwrap_or(0);
    let max = counts.values().copied().max().unwrap_or(0);
    (min, max)
}

fn moved(a: &ClusterMap, b: &ClusterMap) -> usize {
    a.pools[&PoolId(1)]
        .pgs
        .iter()
        .zip(&b.pools[&PoolId(1)].pgs)
        .map(|(x, y)| y.iter().filter(|d| !x.contains(d)).count())
        .sum()
}

fn main() {
    println!(
        "hosts x devs, pgs x copies | compute | copies/dev min-max (mean) | primaries min-max | add host: moved (new host holds) | time"
    );
    for (hosts, per_host, pgs, replicas) in [
        (4, 2, 256, 3),
        (10, 3, 1024, 3),
        (20, 5, 4096, 3),
        (50, 4, 8192, 2),
    ] {
        let inp = cluster(hosts, per_host, pgs, replicas);
        let t = Instant::now();
        let map = compute(None, &inp);
        let first = t.elapsed();
        let mean = f64::from(pgs) * f64::from(replicas) / f64::from(hosts * per_host);
        let (lo, hi) = spread(&map, false);
        let (plo, phi) = spread(&map, true);
        let mut grown = inp.clone();
        add_host(&mut grown, hosts + 1, per_host);
        let t = Instant::now();
        let after = compute(Some(&map), &grown);
        let second = t.elapsed();
        let new_share: usize = after.pools[&PoolId(1)]
            .pgs
            .iter()
            .flatten()
            .filter(|d| d.0 / 100 == hosts + 1)
            .count();
        println!(
            "{hosts} x {per_host}, {pgs} x {replicas} | {first:?} | {lo}-{hi} ({mean:.1}) | {plo}-{phi} | {} ({new_share}) | {second:?}",
            moved(&map, &after)
        );
    }
}
