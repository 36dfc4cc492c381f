//! Properties of `up`, `acting` and `since` across sequences of cluster events: down devices
//! keep `up`, `acting` only moves to devices that hold the PG's data (a ready report for the new
//! `up`), `since` changes exactly when the serving set does, and everything is deterministic.

use basalt_placement::{
    ClusterMap, DeviceInfo, FailureDomain, NodeInfo, PgMap, PlacementInput, PoolSpec, compute,
    is_candidate,
};
use basalt_types::{DeviceId, Epoch, NodeId, PgId, PoolId};
use proptest::prelude::*;
use std::collections::BTreeSet;

const POOL: PoolId = PoolId(1);

fn add_host(inp: &mut PlacementInput, h: u32, per_host: u32) {
    inp.nodes.insert(
        NodeId(h),
        NodeInfo {
            addr: format!("10.0.0.{h}:7000"),
        },
    );
    for k in 0..per_host {
        inp.devices.insert(
            DeviceId(h * 100 + k),
            DeviceInfo::new(NodeId(h), "ssd", 10, 131072),
        );
    }
}

fn cluster(hosts: u32, per_host: u32, pgs: u32, replicas: u8, fd: FailureDomain) -> PlacementInput {
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
            failure_domain: fd,
            device_class: None,
        },
    );
    inp
}

/// One thing that happens to the cluster between two map computations.
#[derive(Clone, Debug)]
enum Event {
    DeviceDown(usize),
    DeviceUp(usize),
    NodeDown(u32),
    NodeUp(u32),
    Out(usize),
    In(usize),
    AddHost,
    /// The primary of PG `n` finishes recovery onto the current `up` set and reports it.
    Ready(u32),
    /// A report for an `up` set that is not the current one (stale).
    StaleReady(u32),
}

fn arb_event() -> impl Strategy<Value = Event> {
    prop_oneof![
        (0usize..64).prop_map(Event::DeviceDown),
        (0usize..64).prop_map(Event::DeviceUp),
        (1u32..6).prop_map(Event::NodeDown),
        (1u32..6).prop_map(Event::NodeUp),
        (0usize..64).prop_map(Event::Out),
        (0usize..64).prop_map(Event::In),
        Just(Event::AddHost),
        (0u32..1024).prop_map(Event::Ready),
        (0u32..1024).prop_map(Event::StaleReady),
    ]
}

fn nth_device(inp: &PlacementInput, i: usize) -> DeviceId {
    let keys: Vec<DeviceId> = inp.devices.keys().copied().collect();
    keys[i % keys.len()]
}

fn pgs(map: &ClusterMap) -> &[PgMap] {
    &map.pools[&POOL].pgs
}

fn ups(map: &ClusterMap) -> Vec<Vec<DeviceId>> {
    pgs(map).iter().map(|p| p.up.clone()).collect()
}

fn serving(map: &ClusterMap, pg: &PgMap) -> Vec<DeviceId> {
    map.serving(pg).collect()
}

/// Applies `ev` to the input; returns whether it may change `up` (liveness events may not).
fn apply(inp: &mut PlacementInput, prev: &ClusterMap, ev: &Event, next_host: &mut u32) -> bool {
    inp.ready.clear();
    match ev {
        Event::DeviceDown(i) => {
            let d = nth_device(inp, *i);
            inp.devices.get_mut(&d).expect("device").up = false;
            false
        }
        Event::DeviceUp(i) => {
            let d = nth_device(inp, *i);
            inp.devices.get_mut(&d).expect("device").up = true;
            false
        }
        Event::NodeDown(h) => {
            inp.nodes.remove(&NodeId(*h));
            false
        }
        Event::NodeUp(h) => {
            if inp.devices.values().any(|d| d.node == NodeId(*h)) {
                inp.nodes.insert(
                    NodeId(*h),
                    NodeInfo {
                        addr: format!("10.0.0.{h}:7000"),
                    },
                );
            }
            false
        }
        Event::Out(i) => {
            let d = nth_device(inp, *i);
            inp.devices.get_mut(&d).expect("device").r#in = false;
            true
        }
        Event::In(i) => {
            let d = nth_device(inp, *i);
            inp.devices.get_mut(&d).expect("device").r#in = true;
            true
        }
        Event::AddHost => {
            add_host(inp, *next_host, 2);
            *next_host += 1;
            true
        }
        Event::Ready(n) | Event::StaleReady(n) => {
            let count = pgs(prev).len() as u32;
            let pg = PgId {
                pool: POOL,
                pg: n % count,
            };
            let mut set = pgs(prev)[pg.pg as usize].up.clone();
            if matches!(ev, Event::StaleReady(_)) {
                // A set that cannot be the new `up`: a device twice, or no device at all.
                match set.first().copied() {
                    Some(first) => set.push(first),
                    None => set.push(DeviceId(1)),
                }
            }
            inp.ready.insert(pg, set);
            false
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn acting_only_moves_to_devices_holding_the_data(
        hosts in 2u32..6,
        per_host in 1u32..4,
        pg_count in 1u32..80,
        replicas in 1u8..4,
        fd in prop_oneof![Just(FailureDomain::Host), Just(FailureDomain::Device)],
        events in proptest::collection::vec(arb_event(), 1..14),
    ) {
        let mut inp = cluster(hosts, per_host, pg_count, replicas, fd);
        let mut map = compute(None, &inp);
        // The model: which devices hold each PG's current data.
        let mut holders: Vec<BTreeSet<DeviceId>> =
            pgs(&map).iter().map(|p| p.acting.iter().copied().collect()).collect();
        for pg in pgs(&map) {
            prop_assert_eq!(&pg.acting, &pg.up, "a new PG is acting on its up set");
            prop_assert_eq!(pg.since, Epoch(1));
        }
        let mut next_host = hosts + 1;
        for ev in &events {
            let may_move_up = apply(&mut inp, &map, ev, &mut next_host);
            inp.now += 7;
            let next = compute(Some(&map), &inp);
            prop_assert_eq!(&compute(Some(&map), &inp), &next, "deterministic");
            if next != map {
                prop_assert_eq!(next.epoch, map.epoch.next());
            } else {
                prop_assert_eq!(next.epoch, map.epoch);
            }
            if !may_move_up {
                prop_assert_eq!(ups(&next), ups(&map), "{:?} moved up sets", ev);
            }
            // Every device holding a PG's data down and out: placement gives it up, and the PG
            // moves to its up set (its peering finds the data through its history).
            let gone = |acting: &[DeviceId]| {
                acting.iter().all(|d| {
                    !next.is_up(*d) && next.devices.get(d).is_none_or(|i| !i.r#in && !i.auto_out)
                })
            };
            if matches!(ev, Event::Out(_) | Event::AddHost | Event::In(_)) {
                for (a, b) in pgs(&map).iter().zip(pgs(&next)) {
                    if !gone(&a.acting) {
                        prop_assert_eq!(&a.acting, &b.acting, "{:?} moved an acting set", ev);
                    }
                }
            }
            let spec = &inp.pools[&POOL];
            for (i, (before, after)) in pgs(&map).iter().zip(pgs(&next)).enumerate() {
                let id = PgId { pool: POOL, pg: i as u32 };
                if inp.ready.get(&id) == Some(&after.up) {
                    // The primary completed the PG on its up set: now those hold the data.
                    holders[i] = after.up.iter().copied().collect();
                    prop_assert_eq!(&after.acting, &after.up, "a matching report flips acting");
                } else if after.acting != before.acting {
                    let held: Vec<DeviceId> = holders[i].iter().copied().collect();
                    prop_assert!(
                        gone(&held),
                        "pg {} moved acting {:?} -> {:?} with no report", i, before.acting, after.acting
                    );
                    prop_assert_eq!(&after.acting, &after.up);
                    holders[i] = after.acting.iter().copied().collect();
                }
                prop_assert!(
                    after.acting.iter().all(|d| holders[i].contains(d)),
                    "pg {} acting {:?} includes a device without its data {:?}", i, after.acting, holders[i]
                );
                let changed = serving(&next, after) != serving(&map, before);
                let want = if changed { next.epoch } else { before.since };
                prop_assert_eq!(after.since, want, "pg {} since", i);
                prop_assert!(after.up.iter().all(|d| is_candidate(&next.devices[d], spec)));
            }
            for d in next.devices.values() {
                prop_assert_eq!(d.down_since.is_some(), !d.up);
            }
            map = next;
        }
    }
}

#[test]
fn a_down_device_keeps_up_and_acting_and_its_pgs_become_unavailable() {
    let inp = cluster(2, 1, 32, 1, FailureDomain::Host);
    let first = compute(None, &inp);
    let mut down = inp.clone();
    down.nodes.remove(&NodeId(2));
    let second = compute(Some(&first), &down);
    assert_eq!(second.epoch, Epoch(2));
    let pool = &second.pools[&POOL];
    let on_two = pool.pgs.iter().filter(|p| p.acting == [DeviceId(200)]);
    assert!(on_two.clone().count() > 0);
    for pg in on_two {
        assert_eq!(pg.up, [DeviceId(200)], "down is not out");
        assert_eq!(second.pg_primary(pg), None, "unavailable, not re-homed");
        assert_eq!(pg.since, Epoch(2), "its serving set changed");
    }
    assert_eq!(pool.unavailable(&second), 16);
    // Back up: the same placement serves again, nothing moved.
    let third = compute(Some(&second), &inp);
    assert_eq!(ups(&third), ups(&first));
    assert_eq!(third.pools[&POOL].unavailable(&third), 0);
}

#[test]
fn a_pg_whose_every_acting_device_is_down_and_out_moves_to_its_up_set() {
    let inp = cluster(3, 1, 16, 1, FailureDomain::Host);
    let first = compute(None, &inp);
    // Device 300's node dies: its PGs stay on it, unavailable.
    let mut down = inp.clone();
    down.nodes.remove(&NodeId(3));
    let second = compute(Some(&first), &down);
    let on_300: Vec<usize> = (0..pgs(&second).len())
        .filter(|i| pgs(&second)[*i].acting == [DeviceId(300)])
        .collect();
    assert!(!on_300.is_empty());
    // Marked out too, by the operator: they move to their up sets. (The automatic down-out
    // keeps them: `crates/node/tests/leader.rs`, a device that returns serves them again.)
    let mut out = down.clone();
    out.devices.get_mut(&DeviceId(300)).expect("device").r#in = false;
    let third = compute(Some(&second), &out);
    for &i in &on_300 {
        let pg = &pgs(&third)[i];
        assert!(!pg.up.contains(&DeviceId(300)), "{pg:?}");
        assert_eq!(pg.acting, pg.up, "pg {i}");
        assert!(third.pg_primary(pg).is_some(), "pg {i} has a primary again");
        assert_eq!(pg.since, third.epoch);
    }
}

#[test]
fn out_moves_up_but_not_acting_until_the_ready_report() {
    let inp = cluster(3, 1, 16, 1, FailureDomain::Host);
    let first = compute(None, &inp);
    let mut out = inp.clone();
    out.devices.get_mut(&DeviceId(300)).expect("device").r#in = false;
    let second = compute(Some(&first), &out);
    let moved: Vec<usize> = pgs(&second)
        .iter()
        .enumerate()
        .filter(|(_, p)| p.up != p.acting)
        .map(|(i, _)| i)
        .collect();
    assert!(!moved.is_empty());
    for &i in &moved {
        let pg = &pgs(&second)[i];
        assert_eq!(
            pg.acting,
            [DeviceId(300)],
            "the out device still serves its data"
        );
        assert_eq!(second.pg_primary(pg), Some(DeviceId(300)));
    }
    let i = moved[0];
    let mut ready = out.clone();
    let id = PgId {
        pool: POOL,
        pg: i as u32,
    };
    ready.ready.insert(id, vec![DeviceId(999)]);
    let stale = compute(Some(&second), &ready);
    assert_eq!(stale, second, "a report for another set changes nothing");
    ready.ready.insert(id, pgs(&second)[i].up.clone());
    let third = compute(Some(&second), &ready);
    let pg = &pgs(&third)[i];
    assert_eq!(pg.acting, pg.up);
    assert_eq!(pg.since, third.epoch);
    assert_eq!(
        pgs(&third).iter().filter(|p| p.up != p.acting).count(),
        moved.len() - 1
    );
}
