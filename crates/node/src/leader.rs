//! The leader: one node at a time (elected through a lease on `/basalt/leader`) computes the
//! placement of every pool from the registered pools, devices, live nodes and PG-ready reports,
//! and publishes a new cluster map whenever that placement changes. It also applies the
//! down-out rule: a device down longer than the down-out interval is marked out (and back in
//! when it returns); and the failure-report rule (`reports.rs`): the devices of a live node
//! that enough peers cannot reach are down in the map.
//!
//! It recomputes when something under `pools/`, `nodes/`, `devices/`, `pg-ready/` or
//! `failure-reports/` changes (`changes.rs`), when a down device reaches the interval, or when
//! a delay of the report rule ends; never on volume records or on its own map writes.

use crate::changes::Changes;
use crate::gather::{Gathered, drop_stale_reports, gather};
use crate::reports::{ReportRules, Reports};
use basalt_meta::{Catalog, Leadership, MetaError, StoredMap};
use basalt_placement::{ClusterMap, compute, down_out, named_chunks};
use basalt_types::{MapCodec, NodeId};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// How the leader runs.
#[derive(Clone, Debug)]
pub(crate) struct LeaderConfig {
    /// Who campaigns (shown in the leader record).
    pub name: String,
    /// Lease of the leadership.
    pub ttl: Duration,
    /// How long a device may be down before it is marked out automatically.
    pub down_out_interval: Duration,
    /// Counts map computations (tests check what triggers them).
    pub computations: Arc<AtomicU64>,
    /// When live nodes are marked down by their peers' failure reports.
    pub reports: ReportRules,
}

/// Campaigns for leadership until `stop`; while leader, keeps the map up to date.
pub(crate) async fn run(catalog: Catalog, cfg: LeaderConfig, mut stop: watch::Receiver<bool>) {
    loop {
        let elected = tokio::select! {
            biased;
            l = catalog.elect(&cfg.name, cfg.ttl) => l,
            _ = stop.wait_for(|s| *s) => return,
        };
        let failed = match elected {
            Ok(leadership) => {
                tracing::info!(name = %cfg.name, "became the cluster leader");
                let result = lead(&catalog, &leadership, &cfg, &mut stop).await;
                let _ = leadership.resign().await;
                result.err()
            }
            Err(e) => Some(e),
        };
        if *stop.borrow() {
            return;
        }
        if let Some(e) = failed {
            tracing::warn!("leading failed: {e}; campaigning again");
            tokio::select! {
                biased;
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }
}

/// How long the leader sleeps when nothing is due (a change wakes it earlier).
const IDLE: Duration = Duration::from_secs(3600);

/// The map as published and as stored (for the next publication's diff).
type Current = Option<(ClusterMap, StoredMap)>;

/// What the leader remembers between rounds.
struct State {
    current: Current,
    reports: Reports,
    /// The nodes marked down by reports in the last round, with their reporter counts.
    reported_down: BTreeMap<NodeId, usize>,
    /// Whether `reports` took over the predecessor's markings (the term's first round).
    seeded: bool,
}

async fn lead(
    catalog: &Catalog,
    leadership: &Leadership,
    cfg: &LeaderConfig,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), MetaError> {
    // Watch first, then compute: no change can slip between the two.
    let mut changes = Changes::watch(catalog).await?;
    let mut state = State {
        current: load(catalog).await?,
        reports: Reports::default(),
        reported_down: BTreeMap::new(),
        seeded: false,
    };
    loop {
        let next_due = step(catalog, leadership, cfg, &mut state).await?;
        let wake = next_due.unwrap_or_else(|| Instant::now() + IDLE);
        tokio::select! {
            // Losing the leadership or stopping first: a busy stream of changes must not hide
            // them (and a due wake-up must not wait behind the changes).
            biased;
            _ = leadership.lost() => return Ok(()),
            _ = stop.wait_for(|s| *s) => return Ok(()),
            _ = tokio::time::sleep_until(wake) => {}
            _ = changes.next() => {}
        }
    }
}

async fn load(catalog: &Catalog) -> Result<Current, MetaError> {
    let Some(stored) = catalog.get_map_parts().await? else {
        return Ok(None);
    };
    let map = ClusterMap::from_parts(&stored.parts).map_err(|detail| MetaError::Corrupt {
        key: basalt_meta::keys::MAP_HEADER.to_string(),
        detail,
    })?;
    Ok(Some((map, stored)))
}

/// One round: judge the failure reports, compute, publish if changed, consume the PG-ready
/// reports it considered, apply the down-out rule. Returns when the next round is due without
/// a change (a down device reaches the interval, a delay of the report rule ends).
async fn step(
    catalog: &Catalog,
    leadership: &Leadership,
    cfg: &LeaderConfig,
    state: &mut State,
) -> Result<Option<Instant>, MetaError> {
    let Gathered {
        mut input,
        reports,
        intervals,
        failures,
    } = gather(catalog, now_secs()).await?;
    drop_stale_reports(
        &mut input,
        &intervals,
        state.current.as_ref().map(|(m, _)| m),
    );
    let live: BTreeSet<NodeId> = input.nodes.keys().copied().collect();
    if !std::mem::replace(&mut state.seeded, true) {
        let current = state.current.as_ref().map(|(m, _)| m);
        let marked = marked_by_reports(current, &live, &failures);
        state.reported_down = marked.iter().map(|n| (*n, 0)).collect();
        state.reports.seed(marked, Instant::now());
    }
    let verdict = state
        .reports
        .decide(&failures, &live, &cfg.reports, Instant::now());
    log_verdict(&state.reported_down, &verdict.down);
    for d in input.devices.values_mut() {
        if verdict.down.contains_key(&d.node) {
            d.up = false;
        }
    }
    state.reported_down = verdict.down;
    let due = publish(catalog, leadership, cfg, &mut state.current, input, reports).await?;
    let due = due.map(|unix| Instant::now() + Duration::from_secs(unix.saturating_sub(now_secs())));
    Ok(match (due, verdict.next_due) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    })
}

/// The nodes a predecessor marked down by failure reports, as far as the published map tells:
/// live, reported by a live peer, and every one of their devices down in `map`.
fn marked_by_reports(
    map: Option<&ClusterMap>,
    live: &BTreeSet<NodeId>,
    failures: &[(NodeId, NodeId)],
) -> Vec<NodeId> {
    let Some(map) = map else { return Vec::new() };
    let reported: BTreeSet<NodeId> = failures
        .iter()
        .filter(|(r, a)| r != a && live.contains(r))
        .map(|(_, a)| *a)
        .collect();
    reported
        .into_iter()
        .filter(|n| live.contains(n) && map.nodes.contains_key(n))
        .filter(|n| {
            let mut devices = map.devices.values().filter(|d| d.node == *n).peekable();
            devices.peek().is_some() && devices.all(|d| !d.up)
        })
        .collect()
}

/// Logs the nodes that the report rule marks down or up again.
fn log_verdict(before: &BTreeMap<NodeId, usize>, now: &BTreeMap<NodeId, usize>) {
    for (node, reporters) in now {
        if !before.contains_key(node) {
            tracing::warn!(
                %node,
                reporters,
                "marking the node's devices down: its peers cannot reach it (failure reports)"
            );
        }
    }
    for node in before.keys().filter(|n| !now.contains_key(n)) {
        tracing::info!(%node, "no longer marked down by failure reports");
    }
}

/// Clusters with more devices than this get their maps computed on a blocking thread: the
/// leader is a node whose own I/O runs on its thread (run to completion), and placing
/// thousands of PGs over hundreds of devices takes long enough to stall it (1000 hosts x 10
/// devices: seconds) and to miss its heartbeats. Small clusters (and the deterministic
/// simulation) compute inline, in microseconds.
const INLINE_DEVICES: usize = 64;

/// [`compute`], on a blocking thread for large clusters.
async fn compute_off_thread(
    prev: Option<&basalt_placement::ClusterMap>,
    input: basalt_placement::PlacementInput,
) -> basalt_placement::ClusterMap {
    if input.devices.len() <= INLINE_DEVICES {
        return compute(prev, &input);
    }
    let prev = prev.cloned();
    tokio::task::spawn_blocking(move || compute(prev.as_ref(), &input))
        .await
        .expect("the map computation panicked")
}

/// Computes and publishes the map from `input`, consumes the PG-ready `reports`, applies the
/// down-out rule. Returns when (unix seconds) a down device next reaches the interval.
async fn publish(
    catalog: &Catalog,
    leadership: &Leadership,
    cfg: &LeaderConfig,
    current: &mut Current,
    input: basalt_placement::PlacementInput,
    reports: Vec<(basalt_types::PgId, basalt_meta::Revision)>,
) -> Result<Option<u64>, MetaError> {
    cfg.computations.fetch_add(1, Ordering::Relaxed);
    let prev = current.as_ref();
    let next = compute_off_thread(prev.map(|(m, _)| m), input).await;
    if prev.map(|(m, _)| m.epoch) != Some(next.epoch) {
        match catalog
            .put_map_as_leader(&next, prev.map(|(_, s)| s), leadership)
            .await
        {
            Ok(stored) => {
                tracing::info!(epoch = %next.epoch, "published cluster map");
                *current = Some((next, stored));
            }
            Err(MetaError::MapConflict { .. }) => {
                // Someone else published (a previous leader's late write): start from theirs.
                *current = load(catalog).await?;
                return Ok(Some(now_secs()));
            }
            Err(e) => return Err(e),
        }
    } else if let Some((_, stored)) = current.as_mut() {
        remove_strays(catalog, leadership, stored).await?;
    }
    for (pg, revision) in reports {
        catalog.remove_pg_ready(pg, revision, leadership).await?;
    }
    let Some((map, _)) = current.as_ref() else {
        return Ok(None);
    };
    let mut rule = down_out(map, now_secs(), cfg.down_out_interval.as_secs());
    if !rule.mark_out.is_empty() && catalog.get_settings().await?.0.noout {
        // Maintenance: nothing goes out for being down (the settings' watch wakes the leader
        // when the flag goes).
        tracing::debug!(devices = ?rule.mark_out, "down past the down-out interval; noout is set");
        rule.mark_out.clear();
        rule.next_due = None;
    }
    for id in rule.mark_out {
        if catalog.auto_out_device(id, leadership).await? {
            tracing::warn!(device = %id, "down longer than the down-out interval: marked out");
        }
    }
    for id in rule.mark_in {
        if catalog.auto_in_device(id, leadership).await? {
            tracing::info!(device = %id, "back up: marked in again");
        }
    }
    Ok(rule.next_due)
}

/// Deletes chunks the published header does not name (left by a publication that died).
async fn remove_strays(
    catalog: &Catalog,
    leadership: &Leadership,
    stored: &mut StoredMap,
) -> Result<(), MetaError> {
    let Ok(named) = named_chunks(&stored.parts) else {
        return Ok(());
    };
    if named.len() == stored.parts.chunks.len() {
        return Ok(());
    }
    *stored = catalog
        .remove_stray_map_chunks(stored, &named, leadership)
        .await?;
    Ok(())
}

fn now_secs() -> u64 {
    basalt_meta::clock::unix_secs()
}

#[cfg(test)]
#[path = "leader_tests.rs"]
mod tests;
