//! Prints what `compute` does on a few cluster shapes: time, balance, and data moved when a
//! host is added and when one is removed.
//!
//! `cargo run --release -p basalt-placement --example placement_stats` (add `-- big` for the
//! 1000 hosts x 10 devices case only).

use basalt_placement::{
    ClusterMap, DeviceInfo, FailureDomain, NodeInfo, PlacementInput, PoolSpec, compute,
};
use basalt_types::{DeviceId, MapCodec, NodeId, PoolId};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const POOL: PoolId = PoolId(1);

fn cluster(hosts: u32, per_host: u32, pgs: u32, replicas: u8) -> PlacementInput {
    let mut inp = PlacementInput::default();
    for h in 1..=hosts {
        add_host(&mut inp, h, per_host);
    }
    inp.pools.insert(
        POOL,
        PoolSpec {
            pg_count: pgs,
            replicas,
            min_size: 1,
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
            DeviceInfo::new(NodeId(h), "ssd", 1000, 131072),
        );
    }
}

/// Copies per in device, min and max, as a fraction of the mean (all weights are equal).
fn balance(map: &ClusterMap, primaries: bool) -> (f64, f64) {
    let mut counts: BTreeMap<DeviceId, u32> = map
        .devices
        .iter()
        .filter(|(_, d)| d.r#in)
        .map(|(id, _)| (*id, 0))
        .collect();
    let mut total = 0u64;
    for pg in &map.pools[&POOL].pgs {
        let members = if primaries {
            &pg.up[..1.min(pg.up.len())]
        } else {
            &pg.up[..]
        };
        for d in members {
            *counts.entry(*d).or_default() += 1;
            total += 1;
        }
    }
    let mean = total as f64 / counts.len() as f64;
    let min = f64::from(counts.values().copied().min().unwrap_or(0));
    let max = f64::from(counts.values().copied().max().unwrap_or(0));
    (min / mean - 1.0, max / mean - 1.0)
}

/// Copies that land on a device that did not hold them before.
fn moved(a: &ClusterMap, b: &ClusterMap) -> usize {
    a.pools[&POOL]
        .pgs
        .iter()
        .zip(&b.pools[&POOL].pgs)
        .map(|(x, y)| y.up.iter().filter(|d| !x.up.contains(d)).count())
        .sum()
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let out = f();
    (out, t.elapsed())
}

fn run(hosts: u32, per_host: u32, pgs: u32, replicas: u8) {
    let inp = cluster(hosts, per_host, pgs, replicas);
    let (map, fresh) = timed(|| compute(None, &inp));
    let (lo, hi) = balance(&map, false);
    let (plo, phi) = balance(&map, true);
    let (parts, enc) = timed(|| map.to_parts(None));
    let bytes: usize = parts.header.len() + parts.chunks.values().map(Vec::len).sum::<usize>();
    let (back, dec) = timed(|| ClusterMap::from_parts(&parts));
    assert!(back.as_ref() == Ok(&map), "the map decodes back");

    let mut grown = inp.clone();
    add_host(&mut grown, hosts + 1, per_host);
    let (after, add_time) = timed(|| compute(Some(&map), &grown));
    let slots = f64::from(pgs) * f64::from(replicas);
    let ideal_add = slots * f64::from(per_host) / f64::from((hosts + 1) * per_host);
    let add_moved = moved(&map, &after) as f64;

    let mut shrunk = inp.clone();
    for k in 0..per_host {
        shrunk
            .devices
            .get_mut(&DeviceId(100 + k))
            .expect("device")
            .r#in = false;
    }
    let (removed, rm_time) = timed(|| compute(Some(&map), &shrunk));
    let ideal_rm: usize = map.pools[&POOL]
        .pgs
        .iter()
        .map(|p| p.up.iter().filter(|d| d.0 / 100 == 1).count())
        .sum();
    let rm_moved = moved(&map, &removed);
    let (rlo, rhi) = balance(&removed, false);
    println!(
        "| {hosts} × {per_host}, {pgs} × {replicas} | {fresh:.2?} | {:+.1}% / {:+.1}% | \
         {:+.1}% / {:+.1}% | {add_moved} ({:.3}x of {ideal_add:.0}) in {add_time:.2?} | \
         {rm_moved} ({:.3}x of {ideal_rm}) in {rm_time:.2?}, then {:+.1}% / {:+.1}% | \
         {:.1} MiB: header {} KiB + {} chunks, encoded in {enc:.2?}, decoded in {dec:.2?} |",
        lo * 100.0,
        hi * 100.0,
        plo * 100.0,
        phi * 100.0,
        add_moved / ideal_add,
        rm_moved as f64 / ideal_rm as f64,
        rlo * 100.0,
        rhi * 100.0,
        bytes as f64 / f64::from(1 << 20),
        parts.header.len() >> 10,
        parts.chunks.len(),
    );
}

fn main() {
    let big_only = std::env::args().any(|a| a == "big");
    println!(
        "| hosts × devices, PGs × copies | compute (fresh) | copies per device, min / max vs mean | \
         primaries, min / max vs mean | add a host: copies moved (vs ideal) | remove a host: copies \
         moved (vs its copies), balance after | stored map |"
    );
    println!("|---|---|---|---|---|---|---|");
    if !big_only {
        for (hosts, per_host, pgs, replicas) in [
            (4, 2, 256, 3),
            (10, 3, 1024, 3),
            (20, 5, 4096, 3),
            (50, 4, 8192, 2),
            (100, 10, 32768, 3),
        ] {
            run(hosts, per_host, pgs, replicas);
        }
    }
    run(1000, 10, 1 << 18, 3);
}
