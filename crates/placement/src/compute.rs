//! Building a new cluster map from the cluster's current state and the previous map.

use crate::assign::assign_pool;
use crate::map::{ClusterMap, DeviceInfo, FailureDomain, MapFormat, NodeInfo};
use basalt_types::{DeviceId, NodeId, PoolId};
use std::collections::BTreeMap;

/// What the leader knows about the cluster when it computes a map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlacementInput {
    pub pools: BTreeMap<PoolId, PoolSpec>,
    /// Every known device, eligible or not (down and out devices stay in the map so that their
    /// ids still resolve to a node).
    pub devices: BTreeMap<DeviceId, DeviceInfo>,
    /// The live nodes. A device whose node is missing here is not eligible: clients could not
    /// reach it.
    pub nodes: BTreeMap<NodeId, NodeInfo>,
}

/// A pool's placement rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSpec {
    pub pg_count: u32,
    pub replicas: u8,
    pub object_size: u32,
    pub failure_domain: FailureDomain,
    /// Only devices of this class; `None` = any.
    pub device_class: Option<String>,
}

/// Computes the placement for `input`, moving as little as possible from `prev`.
///
/// Guarantees (tested as properties in tests/properties.rs):
/// - every PG gets `min(replicas, eligible devices)` distinct eligible devices, in distinct
///   failure domains whenever there are enough domains; PGs with fewer than `replicas` devices
///   are listed in [`PoolMap::degraded`](crate::PoolMap::degraded);
/// - each eligible device holds a number of PGs within one of its weighted target (its weight
///   share of all PG slots, capped where the failure-domain rule caps it);
/// - primaries are spread the same way over the devices that can be primaries;
/// - a PG keeps every device of `prev` that is still eligible, unless it moves to even out
///   the counts; adding or removing a device moves about that device's share of PGs;
/// - deterministic: the same `prev` and `input` give the same map;
/// - the epoch is `prev.epoch + 1` (or 1 without `prev`) when anything changed; when nothing
///   changed, `prev` is returned as it was.
pub fn compute(prev: Option<&ClusterMap>, input: &PlacementInput) -> ClusterMap {
    let mut pools = BTreeMap::new();
    for (id, spec) in &input.pools {
        let prev_pool = prev
            .and_then(|p| p.pools.get(id))
            .filter(|p| p.pg_count == spec.pg_count);
        let eligible = eligible_devices(input, spec);
        pools.insert(*id, assign_pool(*id, spec, &eligible, prev_pool));
    }
    let next = ClusterMap {
        v: MapFormat,
        epoch: prev
            .map(|p| p.epoch.next())
            .unwrap_or(basalt_types::Epoch(1)),
        pools,
        devices: input.devices.clone(),
        nodes: input.nodes.clone(),
    };
    match prev {
        Some(p) if p.pools == next.pools && p.devices == next.devices && p.nodes == next.nodes => {
            p.clone()
        }
        _ => next,
    }
}

/// A device that may hold data of one pool, with what the assignment needs to know about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub id: DeviceId,
    /// The failure domain: the node id for `Host`, the device id for `Device`.
    pub domain: u64,
    pub weight: u32,
}

fn eligible_devices(input: &PlacementInput, spec: &PoolSpec) -> Vec<Candidate> {
    input
        .devices
        .iter()
        .filter(|(_, d)| d.eligible() && input.nodes.contains_key(&d.node))
        .filter(|(_, d)| spec.device_class.as_ref().is_none_or(|c| *c == d.class))
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
mod tests {
    use super::*;
    use basalt_types::Epoch;

    fn input(hosts: u32, per_host: u32) -> PlacementInput {
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
                    DeviceInfo {
                        node: NodeId(h),
                        class: "ssd".into(),
                        weight: 100,
                        up: true,
                        r#in: true,
                    },
                );
            }
        }
        inp.pools.insert(
            PoolId(1),
            PoolSpec {
                pg_count: 64,
                replicas: 3,
                object_size: 131072,
                failure_domain: FailureDomain::Host,
                device_class: None,
            },
        );
        inp
    }

    #[test]
    fn epoch_moves_only_on_change() {
        let inp = input(4, 2);
        let first = compute(None, &inp);
        assert_eq!(first.epoch, Epoch(1));
        let again = compute(Some(&first), &inp);
        assert_eq!(again, first, "nothing changed: the same map, same epoch");
        let mut changed = inp.clone();
        changed.devices.get_mut(&DeviceId(101)).expect("device").up = false;
        let second = compute(Some(&first), &changed);
        assert_eq!(second.epoch, Epoch(2));
        assert!(
            second.pools[&PoolId(1)]
                .pgs
                .iter()
                .all(|pg| !pg.contains(&DeviceId(101))),
            "a down device holds no PG"
        );
    }

    #[test]
    fn device_on_missing_node_is_not_used() {
        let mut inp = input(4, 1);
        inp.nodes.remove(&NodeId(4));
        let map = compute(None, &inp);
        assert!(
            map.pools[&PoolId(1)]
                .pgs
                .iter()
                .all(|pg| pg.len() == 3 && !pg.contains(&DeviceId(400)))
        );
    }

    #[test]
    fn class_rule_filters_devices() {
        let mut inp = input(4, 2);
        for (id, d) in inp.devices.iter_mut() {
            if id.0 % 2 == 1 {
                d.class = "hdd".into();
            }
        }
        inp.pools.get_mut(&PoolId(1)).expect("pool").device_class = Some("hdd".into());
        let map = compute(None, &inp);
        for pg in &map.pools[&PoolId(1)].pgs {
            assert_eq!(pg.len(), 3);
            assert!(
                pg.iter().all(|d| d.0 % 2 == 1),
                "{pg:?} has a non-hdd device"
            );
        }
    }

    #[test]
    fn too_few_devices_is_degraded_not_empty() {
        let inp = input(2, 1);
        let map = compute(None, &inp);
        let pool = &map.pools[&PoolId(1)];
        assert!(pool.pgs.iter().all(|pg| pg.len() == 2));
        assert_eq!(pool.degraded.len(), 64);
        let mut none = inp.clone();
        none.devices.clear();
        let empty = compute(Some(&map), &none);
        assert!(empty.pools[&PoolId(1)].pgs.iter().all(Vec::is_empty));
        assert_eq!(empty.pools[&PoolId(1)].pgs.len(), 64);
    }
}
