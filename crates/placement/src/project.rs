//! What marking devices out would do to placement, worked out before it is done: `basalt node
//! drain` and `basalt device out` refuse (unless forced) a change after which some PGs could
//! not get all their copies, or would have copies sharing a failure domain. The first kind
//! never finishes moving: a PG whose new `up` set is smaller than the copies it serves now
//! keeps its acting set, so a drain would wait for good; the second weakens what the pool
//! promises (losing one host would lose two copies).

use crate::compute::{PlacementInput, PoolSpec, compute};
use crate::map::{ClusterMap, FailureDomain, PoolMap};
use basalt_types::{DeviceId, PgId, PoolId};
use std::collections::{BTreeMap, BTreeSet};

/// How one pool would fare, after the change, where it fares worse than before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shortfall {
    pub pool: PoolId,
    pub replicas: u8,
    pub failure_domain: FailureDomain,
    /// Failure domains (hosts, or devices) with a device the pool may use, after the change.
    pub domains: usize,
    /// PGs that could get fewer than `replicas` copies, after the change.
    pub short: usize,
    /// PGs whose copies would share a failure domain, after the change.
    pub shared: usize,
}

/// The pools that would fare worse were `out` marked out: more copies missing from PGs, or
/// more copies in a failure domain another copy of their PG uses, than placement gives now.
pub fn shortfalls_if_out(map: &ClusterMap, out: &[DeviceId]) -> Vec<Shortfall> {
    let now = input_of(map, &[]);
    let then = input_of(map, out);
    let before = compute(Some(map), &now);
    let after = compute(Some(map), &then);
    let mut found = Vec::new();
    for (id, pool) in &after.pools {
        let Some(was) = before.pools.get(id) else {
            continue;
        };
        let f = faults(pool, &after);
        if f.worse_than(&faults(was, &before)) {
            found.push(Shortfall {
                pool: *id,
                replicas: pool.replicas,
                failure_domain: pool.failure_domain,
                domains: domains(&then, &then.pools[id]),
                short: f.short,
                shared: f.shared,
            });
        }
    }
    found
}

/// Where copies would move were `out` marked out: for each device, the PGs placement would
/// give it (in their new `up` set) that it neither serves now nor is placed on already (not in
/// their `acting` or `up` set), so it would receive each by a backfill this change starts.
pub fn arrivals_if_out(map: &ClusterMap, out: &[DeviceId]) -> BTreeMap<DeviceId, Vec<PgId>> {
    let after = compute(Some(map), &input_of(map, out));
    let mut arrivals: BTreeMap<DeviceId, Vec<PgId>> = BTreeMap::new();
    for (id, pool) in &after.pools {
        let Some(now) = map.pools.get(id) else {
            continue;
        };
        for (i, (then, now)) in pool.pgs.iter().zip(&now.pgs).enumerate() {
            let pg = PgId {
                pool: *id,
                pg: i as u32,
            };
            let new = |d: &&DeviceId| !now.acting.contains(d) && !now.up.contains(d);
            for d in then.up.iter().filter(new) {
                arrivals.entry(*d).or_default().push(pg);
            }
        }
    }
    arrivals
}

/// The placement input `map` was computed from, as far as the map tells it, with `out`
/// marked out. PG-ready reports are not in it: only `up` sets matter here.
fn input_of(map: &ClusterMap, out: &[DeviceId]) -> PlacementInput {
    let mut devices = map.devices.clone();
    for d in out {
        if let Some(info) = devices.get_mut(d) {
            info.r#in = false;
        }
    }
    PlacementInput {
        pools: map.pools.iter().map(|(id, p)| (*id, spec_of(p))).collect(),
        devices,
        nodes: map.nodes.clone(),
        ready: Default::default(),
        now: 0,
    }
}

fn spec_of(p: &PoolMap) -> PoolSpec {
    PoolSpec {
        pg_count: p.pg_count,
        replicas: p.replicas,
        min_size: p.min_size,
        object_size: p.object_size,
        failure_domain: p.failure_domain,
        device_class: p.device_class.clone(),
    }
}

/// What a pool lacks: PGs with fewer up members than replicas and the copies they lack; PGs
/// whose up members share a domain and the copies in a domain already used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Faults {
    short: usize,
    missing: usize,
    shared: usize,
    doubled: usize,
}

impl Faults {
    fn worse_than(&self, before: &Faults) -> bool {
        self.missing > before.missing || self.doubled > before.doubled
    }
}

fn faults(pool: &PoolMap, map: &ClusterMap) -> Faults {
    let want = usize::from(pool.replicas);
    let mut f = Faults::default();
    for pg in &pool.pgs {
        let missing = want.saturating_sub(pg.up.len());
        f.short += usize::from(missing > 0);
        f.missing += missing;
        let distinct: BTreeSet<u64> = pg
            .up
            .iter()
            .map(|d| domain_of(map, pool.failure_domain, *d))
            .collect();
        let doubled = pg.up.len() - distinct.len();
        f.shared += usize::from(doubled > 0);
        f.doubled += doubled;
    }
    f
}

fn domain_of(map: &ClusterMap, fd: FailureDomain, d: DeviceId) -> u64 {
    match fd {
        FailureDomain::Host => map.devices.get(&d).map_or(0, |i| u64::from(i.node.0)),
        FailureDomain::Device => u64::from(d.0),
    }
}

/// Failure domains with a device `spec` may use.
fn domains(input: &PlacementInput, spec: &PoolSpec) -> usize {
    input
        .devices
        .iter()
        .filter(|(_, d)| crate::compute::is_candidate(d, spec))
        .map(|(id, d)| match spec.failure_domain {
            FailureDomain::Host => u64::from(d.node.0),
            FailureDomain::Device => u64::from(id.0),
        })
        .collect::<BTreeSet<_>>()
        .len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::DeviceInfo;
    use basalt_types::NodeId;

    /// `hosts` hosts of `per_host` devices each, one pool of `replicas` copies, placed.
    fn cluster(hosts: u32, per_host: u32, replicas: u8, fd: FailureDomain) -> ClusterMap {
        let mut inp = crate::compute::tests::input(hosts, per_host);
        let pool = inp.pools.get_mut(&PoolId(1)).expect("pool 1");
        pool.replicas = replicas;
        pool.min_size = 1;
        pool.failure_domain = fd;
        compute(None, &inp)
    }

    fn host(h: u32, per_host: u32) -> Vec<DeviceId> {
        (0..per_host).map(|k| DeviceId(h * 100 + k)).collect()
    }

    #[test]
    fn draining_a_host_that_copies_need_is_a_shortfall() {
        // Three hosts of one device, three copies: a drained host leaves every PG short.
        let map = cluster(3, 1, 3, FailureDomain::Host);
        let s = shortfalls_if_out(&map, &host(3, 1));
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!((s[0].domains, s[0].short, s[0].shared), (2, 64, 0));
        // Four hosts: the copies move to the fourth.
        let map = cluster(4, 1, 3, FailureDomain::Host);
        assert_eq!(shortfalls_if_out(&map, &host(3, 1)), []);
    }

    #[test]
    fn copies_that_would_share_a_host_are_a_shortfall() {
        // Three hosts of two devices: one device out is fine, its host keeps another; both
        // out leave two hosts for three copies, which placement fills from the same host.
        let map = cluster(3, 2, 3, FailureDomain::Host);
        assert_eq!(shortfalls_if_out(&map, &[DeviceId(200)]), []);
        let s = shortfalls_if_out(&map, &host(2, 2));
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].domains, 2);
        assert_eq!(s[0].short, 0, "{s:?}");
        assert!(s[0].shared > 0, "{s:?}");
        // With failure domain device every device is a domain of its own.
        let map = cluster(1, 4, 2, FailureDomain::Device);
        assert_eq!(shortfalls_if_out(&map, &[DeviceId(100)]), []);
        let s = shortfalls_if_out(&map, &host(1, 3));
        assert_eq!((s[0].domains, s[0].short), (1, 64), "{s:?}");
    }

    #[test]
    fn the_copies_of_a_device_out_arrive_on_the_others() {
        // Four hosts of one device, two copies: every PG on the device out gets a new device
        // (one it did not use), and nothing else moves to a device that served the PG.
        let map = cluster(4, 1, 2, FailureDomain::Host);
        let out = DeviceId(300);
        let arrivals = arrivals_if_out(&map, &[out]);
        assert!(!arrivals.contains_key(&out), "{arrivals:?}");
        let pool = &map.pools[&PoolId(1)];
        let on_out: Vec<u32> = (0..pool.pg_count)
            .filter(|i| pool.pgs[*i as usize].acting.contains(&out))
            .collect();
        let mut arrived: Vec<u32> = arrivals.values().flatten().map(|pg| pg.pg).collect();
        arrived.sort_unstable();
        assert_eq!(arrived, on_out);
        for (d, pgs) in &arrivals {
            for pg in pgs {
                assert!(!pool.pgs[pg.pg as usize].acting.contains(d), "{pg} on {d}");
            }
        }
        // A device of another class, which the pool does not use, moves nothing.
        let mut map = map;
        map.devices
            .insert(DeviceId(99), DeviceInfo::new(NodeId(9), "hdd", 100, 131072));
        map.pools.get_mut(&PoolId(1)).unwrap().device_class = Some("ssd".into());
        assert_eq!(arrivals_if_out(&map, &[DeviceId(99)]), BTreeMap::new());
    }

    #[test]
    fn a_pool_already_short_is_not_made_worse_by_a_device_it_does_not_use() {
        // Two hosts for three copies: short before; marking out a device of another class
        // changes nothing for it.
        let mut map = cluster(2, 1, 3, FailureDomain::Host);
        map.pools.get_mut(&PoolId(1)).unwrap().device_class = Some("ssd".into());
        map.devices
            .insert(DeviceId(99), DeviceInfo::new(NodeId(9), "hdd", 100, 131072));
        assert_eq!(shortfalls_if_out(&map, &[DeviceId(99)]), []);
        // Its last host drained: worse.
        assert_eq!(shortfalls_if_out(&map, &host(2, 1)).len(), 1);
    }
}
