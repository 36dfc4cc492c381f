//! The acting set and interval of each PG: who holds its data and serves it, and since when.
//!
//! `up` says where a PG should live; `acting` says where its data is. They differ after a
//! placement change until the PG's primary reports the PG complete on its new `up` set (a
//! ready record): only then does `acting` become `up`. So a PG is never served by a device
//! that does not hold its data, with one exception: when every acting device is down and
//! marked out by the operator (gone for good as far as placement knows), `acting` becomes
//! `up` and the new primary's peering finds the data through the PG's history (or waits for
//! it). Any other PG whose acting devices are all down is unavailable until one returns.

use crate::compute::PlacementInput;
use crate::map::{ClusterMap, PgMap, PoolMap};
use basalt_types::{DeviceId, PgId, PoolId};

/// The PG table of one pool in the new map `next` (whose devices are already final), given the
/// new `up` sets and the pool in the previous map.
pub(crate) fn pool_pgs(
    pool: PoolId,
    up: Vec<Vec<DeviceId>>,
    prev: Option<(&ClusterMap, &PoolMap)>,
    next: &ClusterMap,
    input: &PlacementInput,
) -> Vec<PgMap> {
    up.into_iter()
        .enumerate()
        .map(|(i, up)| {
            let id = PgId { pool, pg: i as u32 };
            let before = prev.and_then(|(map, p)| p.pgs.get(i).map(|pg| (map, pg)));
            pg_map(up, before, next, input.ready.get(&id))
        })
        .collect()
}

fn pg_map(
    up: Vec<DeviceId>,
    before: Option<(&ClusterMap, &PgMap)>,
    next: &ClusterMap,
    ready: Option<&Vec<DeviceId>>,
) -> PgMap {
    let kept: Vec<DeviceId> = before
        .map(|(_, pg)| {
            pg.acting
                .iter()
                .copied()
                .filter(|d| next.devices.contains_key(d))
                .collect()
        })
        .unwrap_or_default();
    // Every device holding the data is gone for good as far as placement knows (down and
    // marked out by the operator: a dead drive given up on; not the automatic down-out, after
    // which a device that returns goes back in and serves its PGs at once): the PG moves to its
    // up set, whose primary peers with every device of the PG's history (the history names
    // every device that served an interval that went active, and peering waits for one of each
    // interval: data the out devices alone held stays out of reach, never lost, until one
    // returns, and is then recovered from it). Before, such a PG waited for good for a device
    // that no longer counted, although the devices of its last active interval held its data
    // (an undersized PG that had moved onto one device, whose drive then died: cluster
    // simulation seed 562635).
    let gone = |d: &DeviceId| {
        !next.is_up(*d) && next.devices.get(d).is_some_and(|i| !i.r#in && !i.auto_out)
    };
    let acting = if kept.iter().all(gone) || ready == Some(&up) {
        up.clone()
    } else {
        kept
    };
    let mut pg = PgMap {
        up,
        acting,
        since: next.epoch,
    };
    if let Some((prev_map, prev_pg)) = before {
        let was: Vec<DeviceId> = prev_map.serving(prev_pg).collect();
        if next.serving(&pg).eq(was) {
            pg.since = prev_pg.since;
        }
    }
    pg
}
