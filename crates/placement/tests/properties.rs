//! Properties of `compute`: validity, balance, minimal movement, primary balance, stability.

use basalt_placement::{
    ClusterMap, DeviceInfo, FailureDomain, NodeInfo, PlacementInput, PoolSpec, compute,
    is_candidate,
};
use basalt_types::{DeviceId, Epoch, NodeId, PoolId};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

const POOL: PoolId = PoolId(1);

/// A cluster of `hosts` hosts with `per_host` devices each (ids host*100+k), all weight `w`.
fn cluster(hosts: u32, per_host: u32, w: u32) -> PlacementInput {
    let mut inp = PlacementInput::default();
    for h in 1..=hosts {
        add_host(&mut inp, h, per_host, w);
    }
    inp
}

fn add_host(inp: &mut PlacementInput, h: u32, per_host: u32, w: u32) {
    inp.nodes.insert(
        NodeId(h),
        NodeInfo {
            addr: format!("10.0.0.{h}:7000"),
        },
    );
    for k in 0..per_host {
        inp.devices.insert(DeviceId(h * 100 + k), device(h, w));
    }
}

fn device(host: u32, weight: u32) -> DeviceInfo {
    DeviceInfo::new(NodeId(host), "ssd", weight, 131072)
}

fn with_pool(
    mut inp: PlacementInput,
    pg_count: u32,
    replicas: u8,
    fd: FailureDomain,
) -> PlacementInput {
    inp.pools.insert(
        POOL,
        PoolSpec {
            pg_count,
            replicas,
            min_size: 1,
            object_size: 131072,
            failure_domain: fd,
            device_class: None,
        },
    );
    inp
}

fn counts(map: &ClusterMap) -> BTreeMap<DeviceId, u32> {
    let mut c: BTreeMap<DeviceId, u32> = map
        .devices
        .iter()
        .filter(|(_, d)| d.r#in && d.weight > 0)
        .map(|(id, _)| (*id, 0))
        .collect();
    for pg in &map.pools[&POOL].pgs {
        for d in &pg.up {
            *c.entry(*d).or_default() += 1;
        }
    }
    c
}

fn primary_counts(map: &ClusterMap) -> BTreeMap<DeviceId, u32> {
    let mut c: BTreeMap<DeviceId, u32> = counts(map).keys().map(|d| (*d, 0)).collect();
    for pg in &map.pools[&POOL].pgs {
        if let Some(p) = pg.up.first() {
            *c.entry(*p).or_default() += 1;
        }
    }
    c
}

/// Device slots that differ between two maps (copies that have to be moved).
fn moved(a: &ClusterMap, b: &ClusterMap) -> usize {
    a.pools[&POOL]
        .pgs
        .iter()
        .zip(&b.pools[&POOL].pgs)
        .map(|(x, y)| y.up.iter().filter(|d| !x.up.contains(d)).count())
        .sum()
}

/// Checks that every PG's `up` set is a valid placement for `inp`: candidates are the devices
/// that are in, weighted, of the pool's object size, up or down.
fn assert_valid(inp: &PlacementInput, map: &ClusterMap) {
    let spec = &inp.pools[&POOL];
    let pool = &map.pools[&POOL];
    let eligible: BTreeSet<DeviceId> = inp
        .devices
        .iter()
        .filter(|(_, d)| is_candidate(d, spec))
        .map(|(id, _)| *id)
        .collect();
    let domain = |d: &DeviceId| match spec.failure_domain {
        FailureDomain::Host => inp.devices[d].node.0,
        FailureDomain::Device => d.0,
    };
    let domains: BTreeSet<u32> = eligible.iter().map(domain).collect();
    let width = usize::from(spec.replicas).min(eligible.len());
    assert_eq!(pool.pgs.len(), spec.pg_count as usize);
    for (i, entry) in pool.pgs.iter().enumerate() {
        let pg = &entry.up;
        assert_eq!(pg.len(), width, "pg {i}: {pg:?}");
        let distinct: BTreeSet<_> = pg.iter().collect();
        assert_eq!(distinct.len(), pg.len(), "pg {i} repeats a device: {pg:?}");
        assert!(pg.iter().all(|d| eligible.contains(d)), "pg {i}: {pg:?}");
        let pg_domains: BTreeSet<u32> = pg.iter().map(domain).collect();
        assert_eq!(
            pg_domains.len(),
            width.min(domains.len()),
            "pg {i} does not spread over as many failure domains as exist: {pg:?}"
        );
    }
}

fn spread(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)))
}

fn arb_input() -> impl Strategy<Value = PlacementInput> {
    (
        1u32..7,
        1u32..4,
        1u8..5,
        1u32..200,
        prop_oneof![Just(FailureDomain::Host), Just(FailureDomain::Device)],
        proptest::collection::vec((1u32..5, any::<bool>(), any::<bool>()), 24),
    )
        .prop_map(|(hosts, per_host, replicas, pgs, fd, tweaks)| {
            let mut inp = with_pool(cluster(hosts, per_host, 1), pgs, replicas, fd);
            for ((_, dev), (w, down, out)) in inp.devices.iter_mut().zip(tweaks) {
                dev.weight = w;
                // About one device in eight is down or out.
                dev.up = !(down && w == 1 && out);
                dev.r#in = !(out && w == 2 && down);
            }
            inp
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn every_pg_is_valid_and_compute_is_deterministic(inp in arb_input()) {
        let map = compute(None, &inp);
        assert_valid(&inp, &map);
        prop_assert_eq!(compute(None, &inp), map.clone());
        let again = compute(Some(&map), &inp);
        prop_assert_eq!(again, map, "an unchanged input must give the unchanged map");
    }

    /// Equal weights, equal hosts: every device within one PG of the mean, primaries within one
    /// of theirs.
    #[test]
    fn equal_weights_balance_within_one(
        hosts in 3u32..8, per_host in 1u32..4, replicas in 1u8..4, pgs in 16u32..512,
    ) {
        let inp = with_pool(cluster(hosts, per_host, 7), pgs, replicas, FailureDomain::Host);
        let map = compute(None, &inp);
        assert_valid(&inp, &map);
        let n = f64::from(hosts * per_host);
        let mean = f64::from(pgs) * f64::from(replicas) / n;
        let (lo, hi) = spread(counts(&map).values().map(|&c| f64::from(c) - mean));
        prop_assert!(lo > -1.0 - 1e-9 && hi < 1.0 + 1e-9, "counts {:?} mean {mean}", counts(&map));
        let pmean = f64::from(pgs) / n;
        let (lo, hi) = spread(primary_counts(&map).values().map(|&c| f64::from(c) - pmean));
        prop_assert!(lo >= -2.0 && hi <= 2.0, "primaries {:?} mean {pmean}", primary_counts(&map));
    }

    /// Unequal weights, no cap in the way: every device within one PG of its weight share.
    #[test]
    fn weights_are_followed(weights in proptest::collection::vec(1u32..6, 4..10), pgs in 32u32..400) {
        let mut inp = PlacementInput::default();
        add_host(&mut inp, 1, 0, 1);
        for (k, w) in weights.iter().enumerate() {
            inp.devices.insert(DeviceId(k as u32), device(1, *w));
        }
        let total: u32 = weights.iter().sum();
        let max = *weights.iter().max().unwrap_or(&1);
        // Two copies per PG; a device's share 2*w/total stays <= 1 so no per-PG cap binds.
        prop_assume!(2 * max <= total);
        let inp = with_pool(inp, pgs, 2, FailureDomain::Device);
        let map = compute(None, &inp);
        assert_valid(&inp, &map);
        let slots = f64::from(pgs * 2);
        for (d, c) in counts(&map) {
            let target = slots * f64::from(inp.devices[&d].weight) / f64::from(total);
            prop_assert!((f64::from(c) - target).abs() < 1.0 + 1e-9, "{d}: {c} vs target {target}");
        }
    }

    /// Adding a host moves about the new devices' share, and nothing else.
    #[test]
    fn adding_a_host_moves_only_its_share(
        hosts in 3u32..7, per_host in 1u32..3, replicas in 2u8..4, pgs in 32u32..300,
    ) {
        let before_in = with_pool(cluster(hosts, per_host, 10), pgs, replicas, FailureDomain::Host);
        let before = compute(None, &before_in);
        let mut after_in = before_in.clone();
        add_host(&mut after_in, hosts + 1, per_host, 10);
        let after = compute(Some(&before), &after_in);
        assert_valid(&after_in, &after);
        prop_assert_eq!(after.epoch, Epoch(2));
        let new_share: u32 = counts(&after)
            .iter()
            .filter(|(d, _)| d.0 / 100 == hosts + 1)
            .map(|(_, c)| *c)
            .sum();
        let m = moved(&before, &after);
        // Every moved copy lands on the new host, give or take rounding at the edges.
        prop_assert!(m <= new_share as usize + per_host as usize + 1,
            "moved {m} copies, new host holds {new_share}");
        let mean = f64::from(pgs) * f64::from(replicas) / f64::from((hosts + 1) * per_host);
        let (lo, hi) = spread(counts(&after).values().map(|&c| f64::from(c) - mean));
        prop_assert!(lo > -1.0 - 1e-9 && hi < 1.0 + 1e-9, "counts {:?} mean {mean}", counts(&after));
    }

    /// Removing a device moves its copies plus at most a few to even out the rest.
    #[test]
    fn removing_a_device_moves_only_its_copies(
        hosts in 4u32..8, per_host in 1u32..3, replicas in 2u8..4, pgs in 32u32..300, pick in any::<u32>(),
    ) {
        let before_in = with_pool(cluster(hosts, per_host, 10), pgs, replicas, FailureDomain::Host);
        let before = compute(None, &before_in);
        let victim = *before_in.devices.keys().nth((pick % (hosts * per_host)) as usize).unwrap_or(&DeviceId(100));
        let mut after_in = before_in.clone();
        if let Some(d) = after_in.devices.get_mut(&victim) {
            d.r#in = false;
        }
        let after = compute(Some(&before), &after_in);
        assert_valid(&after_in, &after);
        let lost = counts(&before)[&victim] as usize;
        let m = moved(&before, &after);
        let survivors = (hosts * per_host - 1) as usize;
        prop_assert!(m >= lost, "the victim's copies must all move");
        // The aim: at most 1.1x the ideal (the victim's copies), with a few copies of
        // slack for rounding when the cluster is small.
        let slack = (lost / 10).max(survivors / 2 + 1);
        prop_assert!(m <= lost + slack, "moved {m}, the victim held {lost}");
    }
}

#[test]
fn hosts_of_different_sizes_still_get_one_copy_each() {
    // Three hosts with 1, 2 and 5 devices, three copies per PG: each PG has one copy per host.
    let mut inp = PlacementInput::default();
    add_host(&mut inp, 1, 1, 10);
    add_host(&mut inp, 2, 2, 10);
    add_host(&mut inp, 3, 5, 10);
    let inp = with_pool(inp, 128, 3, FailureDomain::Host);
    let map = compute(None, &inp);
    assert_valid(&inp, &map);
    let c = counts(&map);
    assert_eq!(
        c[&DeviceId(100)],
        128,
        "the lone device of host 1 holds every PG"
    );
    for d in [200, 201] {
        assert!((63..=65).contains(&c[&DeviceId(d)]), "{c:?}");
    }
    for d in 300..305 {
        assert!((25..=27).contains(&c[&DeviceId(d)]), "{c:?}");
    }
}

#[test]
fn two_hosts_three_copies_spread_as_widely_as_possible() {
    let inp = with_pool(cluster(2, 3, 1), 60, 3, FailureDomain::Host);
    let map = compute(None, &inp);
    assert_valid(&inp, &map);
    for pg in &map.pools[&POOL].pgs {
        let hosts: BTreeSet<u32> = pg.up.iter().map(|d| d.0 / 100).collect();
        assert_eq!(hosts.len(), 2, "{pg:?}");
    }
    assert_eq!(map.pools[&POOL].degraded(&map), 0);
}
