//! Building a new cluster map from the cluster's current state and the previous map.

use crate::acting::pool_pgs;
use crate::assign::assign_pool;
use crate::map::{ClusterMap, DeviceInfo, FailureDomain, NodeInfo, PoolMap};
use basalt_types::{DeviceId, Epoch, NodeId, PgId, PoolId};
use std::collections::BTreeMap;

/// What the leader knows about the cluster when it computes a map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlacementInput {
    pub pools: BTreeMap<PoolId, PoolSpec>,
    /// Every known device. `up` and `in` come from the device records and node registrations;
    /// `down_since` is ignored (the map carries it from the previous map).
    pub devices: BTreeMap<DeviceId, DeviceInfo>,
    /// The live nodes. A device whose node is missing here is down: clients cannot reach it.
    pub nodes: BTreeMap<NodeId, NodeInfo>,
    /// PG-ready reports: the primary of the PG completed it on this `up` set. Applied only when
    /// it equals the PG's new `up` set (then `acting = up`).
    pub ready: BTreeMap<PgId, Vec<DeviceId>>,
    /// Unix seconds now: the `down_since` of a device that has just gone down.
    pub now: u64,
}

/// A pool's placement rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSpec {
    pub pg_count: u32,
    pub replicas: u8,
    pub min_size: u8,
    pub object_size: u32,
    pub failure_domain: FailureDomain,
    /// Only devices of this class; `None` = any.
    pub device_class: Option<String>,
}

/// Computes the map for `input`, moving as little as possible from `prev`.
///
/// Guarantees (tested as properties in tests/properties.rs and tests/acting.rs):
/// - `up`: every PG gets `min(replicas, candidates)` distinct candidates, in distinct failure
///   domains whenever there are enough domains. Candidates are the devices that are `in`, with
///   weight > 0, of the pool's class and object size, **up or down**: a device going down keeps
///   its PGs in `up`;
/// - each candidate holds a number of PGs within one of its weighted target (its weight share
///   of all PG slots, capped where the failure-domain rule caps it), and primaries (first
///   members of `up`) are spread the same way;
/// - a PG keeps every device of its previous `up` that is still a candidate, unless it moves to
///   even out the counts; adding or removing a device moves about that device's share of PGs;
/// - `acting`: a new PG gets `acting = up`; an existing PG keeps its previous `acting` minus
///   devices no longer in the map (it holds the data) until a ready report matching its new
///   `up` arrives, then `acting = up`. If nothing of its previous `acting` is left in the map
///   (no device ever held it, or all were removed), `acting = up`;
/// - `since`: the new epoch when the PG's serving set (acting members that are up, in order)
///   differs from the previous map's, else the previous `since`;
/// - deterministic: the same `prev` and `input` give the same map;
/// - the epoch is `prev.epoch + 1` (or 1 without `prev`) when anything changed; when nothing
///   changed, `prev` is returned as it was.
pub fn compute(prev: Option<&ClusterMap>, input: &PlacementInput) -> ClusterMap {
    let epoch = prev.map_or(Epoch(1), |p| p.epoch.next());
    let devices = device_states(prev, input);
    let mut next = ClusterMap {
        epoch,
        pools: BTreeMap::new(),
        devices,
        nodes: input.nodes.clone(),
    };
    for (id, spec) in &input.pools {
        let prev_pool = prev
            .and_then(|p| p.pools.get(id))
            .filter(|p| p.pg_count == spec.pg_count);
        let prev_up: Option<Vec<Vec<DeviceId>>> =
            prev_pool.map(|p| p.pgs.iter().map(|pg| pg.up.clone()).collect());
        let cands = candidates(input, spec);
        let up = assign_pool(*id, spec, &cands, prev_up.as_deref());
        let pgs = pool_pgs(*id, up, prev.zip(prev_pool), &next, input);
        next.pools.insert(
            *id,
            PoolMap {
                pg_count: spec.pg_count,
                replicas: spec.replicas,
                min_size: spec.min_size,
                object_size: spec.object_size,
                failure_domain: spec.failure_domain,
                device_class: spec.device_class.clone(),
                pgs,
            },
        );
    }
    match prev {
        Some(p) if p.pools == next.pools && p.devices == next.devices && p.nodes == next.nodes => {
            p.clone()
        }
        _ => next,
    }
}

/// The devices of the new map: `up` only when the node is alive too, and `down_since` carried
/// from the previous map (or `now` for a device that has just gone down).
fn device_states(
    prev: Option<&ClusterMap>,
    input: &PlacementInput,
) -> BTreeMap<DeviceId, DeviceInfo> {
    input
        .devices
        .iter()
        .map(|(id, d)| {
            let mut d = d.clone();
            d.up = d.up && input.nodes.contains_key(&d.node);
            d.down_since = if d.up {
                None
            } else {
                let before = prev.and_then(|p| p.devices.get(id));
                Some(before.and_then(|b| b.down_since).unwrap_or(input.now))
            };
            (*id, d)
        })
        .collect()
}

/// A device that may hold data of one pool, with what the assignment needs to know about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub id: DeviceId,
    /// The failure domain: the node id for `Host`, the device id for `Device`.
    pub domain: u64,
    pub weight: u32,
}

/// Whether `d` may be in the `up` sets of a pool with `spec`: in, weighted, of the pool's class
/// and object size. Up or down does not matter.
pub fn is_candidate(d: &DeviceInfo, spec: &PoolSpec) -> bool {
    d.r#in
        && d.weight > 0
        && d.object_size == spec.object_size
        && spec.device_class.as_ref().is_none_or(|c| *c == d.class)
}

fn candidates(input: &PlacementInput, spec: &PoolSpec) -> Vec<Candidate> {
    input
        .devices
        .iter()
        .filter(|(_, d)| is_candidate(d, spec))
        .map(|(id, d)| Candidate {
            id: *id,
            domain: match spec.failure_domain {
                FailureDomain::Host => u64::from(d.node.0),
                FailureDomain::Device => u64::from(id.0),
            },
            weight: d.weight,
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `hosts` hosts of `per_host` devices each (device `h * 100 + k` on host `h`), and pool 1
    /// of 3 copies, failure domain host, 64 PGs.
    pub(crate) fn input(hosts: u32, per_host: u32) -> PlacementInput {
        let mut inp = PlacementInput::default();
        for h in 1..=hosts {
            inp.nodes.insert(
                NodeId(h),
                NodeInfo {
                    addr: format!("10.0.0.{h}:7000"),
                },
            );
            for k in 0..per_host {
                inp.devices.insert(
                    DeviceId(h * 100 + k),
                    DeviceInfo::new(NodeId(h), "ssd", 100, 131072),
                );
            }
        }
        inp.pools.insert(
            PoolId(1),
            PoolSpec {
                pg_count: 64,
                replicas: 3,
                min_size: 2,
                object_size: 131072,
                failure_domain: FailureDomain::Host,
                device_class: None,
            },
        );
        inp
    }

    fn ups(map: &ClusterMap) -> Vec<Vec<DeviceId>> {
        map.pools[&PoolId(1)]
            .pgs
            .iter()
            .map(|p| p.up.clone())
            .collect()
    }

    #[test]
    fn epoch_moves_only_on_change_and_out_devices_leave_up() {
        let inp = input(4, 2);
        let first = compute(None, &inp);
        assert_eq!(first.epoch, Epoch(1));
        let again = compute(Some(&first), &inp);
        assert_eq!(again, first, "nothing changed: the same map, same epoch");
        let mut changed = inp.clone();
        changed
            .devices
            .get_mut(&DeviceId(101))
            .expect("device")
            .r#in = false;
        let second = compute(Some(&first), &changed);
        assert_eq!(second.epoch, Epoch(2));
        assert!(
            ups(&second).iter().all(|pg| !pg.contains(&DeviceId(101))),
            "an out device leaves every up set"
        );
    }

    #[test]
    fn a_device_on_a_missing_node_is_down_and_keeps_its_pgs() {
        let inp = input(4, 1);
        let first = compute(None, &inp);
        let mut gone = inp.clone();
        gone.nodes.remove(&NodeId(4));
        gone.now = 1234;
        let second = compute(Some(&first), &gone);
        assert_eq!(ups(&second), ups(&first), "down is not out: up stays");
        let dev = &second.devices[&DeviceId(400)];
        assert!(!dev.up);
        assert_eq!(dev.down_since, Some(1234));
        gone.now = 9999;
        let third = compute(Some(&second), &gone);
        assert_eq!(third, second, "the down clock is kept, not restarted");
    }

    #[test]
    fn class_and_object_size_rules_filter_devices() {
        let mut inp = input(4, 2);
        for (id, d) in inp.devices.iter_mut() {
            if id.0 % 2 == 1 {
                d.class = "hdd".into();
            }
        }
        inp.devices
            .get_mut(&DeviceId(301))
            .expect("device")
            .object_size = 4 << 20;
        inp.pools.get_mut(&PoolId(1)).expect("pool").device_class = Some("hdd".into());
        let map = compute(None, &inp);
        for pg in ups(&map) {
            assert_eq!(pg.len(), 3);
            assert!(
                pg.iter().all(|d| d.0 % 2 == 1 && d.0 != 301),
                "{pg:?} has a non-hdd device or one of another object size"
            );
        }
    }

    #[test]
    fn too_few_devices_is_degraded_not_empty() {
        let inp = input(2, 1);
        let map = compute(None, &inp);
        let pool = &map.pools[&PoolId(1)];
        assert!(pool.pgs.iter().all(|pg| pg.up.len() == 2));
        assert_eq!(pool.degraded(&map), 64);
        let mut none = inp.clone();
        none.devices.clear();
        let empty = compute(Some(&map), &none);
        assert!(ups(&empty).iter().all(Vec::is_empty));
        assert_eq!(empty.pools[&PoolId(1)].pgs.len(), 64);
    }
}
