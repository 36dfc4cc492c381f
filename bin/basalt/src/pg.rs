//! `basalt pg list|mark-lost|mark-unfound-lost`: placement groups, and the operator's escape
//! hatches for a PG whose data is gone, or objects of it no good copy of is left.

use crate::connect::Common;
use crate::output;
use anyhow::{Context, bail};
use basalt_client::Cluster;
use basalt_meta::PgReadyRecord;
use basalt_placement::{ClusterMap, PgMap};
use basalt_types::{DeviceId, NodeId, ObjectId, PgId};
use clap::Subcommand;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum PgCommand {
    /// List placement groups: where they should live (up), where their data is (acting),
    /// who serves them.
    List {
        /// Only this pool.
        #[arg(long)]
        pool: Option<String>,
        /// Only placement groups that are unavailable, degraded, remapped or have unfound
        /// objects.
        #[arg(long)]
        problems: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Declare a placement group's data lost: it is served from its `up` devices from now on,
    /// EMPTY (every object of it reads as zeros). Only for a PG whose devices are gone for good.
    MarkLost {
        /// Pool name.
        pool: String,
        /// Placement group number within the pool.
        pg: u32,
        /// Required: you accept that the placement group's data is lost.
        #[arg(long)]
        yes_i_really_mean_it: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Give up a placement group's unfound objects (every copy of them fails its checksum and
    /// recovery finds no good one): each is deleted on every member and reads as ZEROS from
    /// now on; the rest of the placement group is untouched.
    MarkUnfoundLost {
        /// Pool name.
        pool: String,
        /// Placement group number within the pool.
        pg: u32,
        /// Required: you accept that those objects' data is lost.
        #[arg(long)]
        yes_i_really_mean_it: bool,
        #[command(flatten)]
        common: Common,
    },
}

/// One placement group as printed.
#[derive(Serialize)]
struct PgView {
    pool: String,
    pg: u32,
    up: Vec<DeviceId>,
    acting: Vec<DeviceId>,
    /// The acting members that are up (first = primary).
    serving: Vec<DeviceId>,
    since: u64,
    /// `active`, `unavailable`, `degraded`, and/or `remapped`, and/or `unfound`, and/or
    /// `backfill_toofull`.
    state: String,
    /// Objects its primary found no good copy of (every copy fails its checksum): their reads
    /// and writes fail. `None` when its primary's node did not answer.
    unfound_objects: Option<u64>,
    /// The first of them (`basalt pg mark-unfound-lost` gives them up).
    unfound: Vec<ObjectId>,
}

pub async fn run(cmd: PgCommand) -> anyhow::Result<()> {
    match cmd {
        PgCommand::List {
            pool,
            problems,
            common,
        } => list(pool, problems, common).await,
        PgCommand::MarkLost {
            pool,
            pg,
            yes_i_really_mean_it,
            common,
        } => {
            if !yes_i_really_mean_it {
                bail!(
                    "marking {pool} PG {pg} lost makes it serve EMPTY data from its up devices \
                     (every object of it reads as zeros); run again with \
                     --yes-i-really-mean-it if its devices are gone for good"
                );
            }
            let cluster = common.cluster.connect().await?;
            mark_lost(&cluster, &pool, pg).await
        }
        PgCommand::MarkUnfoundLost {
            pool,
            pg,
            yes_i_really_mean_it,
            common,
        } => {
            if !yes_i_really_mean_it {
                bail!(
                    "marking the unfound objects of {pool} PG {pg} lost deletes them (they read \
                     as zeros); run again with --yes-i-really-mean-it if no device that could \
                     hold a good copy will come back"
                );
            }
            let cluster = common.cluster.connect().await?;
            crate::pg_lost::mark_unfound_lost(&cluster, &pool, pg).await
        }
    }
}

/// What a PG's primary reported of it, when it reported something worth a state.
#[derive(Clone, Debug, Default)]
struct Reported {
    unfound: u64,
    /// The first unfound objects.
    oids: Vec<ObjectId>,
    /// Its backfill stopped at a target used past the backfill-full limit.
    toofull: bool,
}

fn state(map: &ClusterMap, replicas: u8, pg: &PgMap, reported: Option<&Reported>) -> String {
    let unfound = reported.map(|r| r.unfound);
    let serving = map.serving(pg).count();
    let mut parts = Vec::new();
    if serving == 0 {
        parts.push("unavailable");
    } else if serving < usize::from(replicas) {
        parts.push("degraded");
    } else {
        parts.push("active");
    }
    if pg.acting != pg.up {
        parts.push("remapped");
    }
    if unfound.is_some_and(|n| n > 0) {
        parts.push("unfound");
    }
    if reported.is_some_and(|r| r.toofull) {
        parts.push("backfill_toofull");
    }
    parts.join("+")
}

async fn list(only: Option<String>, problems: bool, common: Common) -> anyhow::Result<()> {
    let cluster = common.cluster.connect().await?;
    let map = cluster.map();
    let reports = reported_by_pg(&cluster, &map).await;
    let mut views = Vec::new();
    for p in cluster.list_pools().await? {
        if only.as_ref().is_some_and(|n| *n != p.name) {
            continue;
        }
        let Some(placed) = map.pools.get(&p.id) else {
            continue;
        };
        for (i, pg) in placed.pgs.iter().enumerate() {
            let id = PgId {
                pool: p.id,
                pg: i as u32,
            };
            let found = primary_node(&map, pg).and_then(|n| {
                let of_node = reports.get(&n)?;
                Some(of_node.get(&id).cloned().unwrap_or_default())
            });
            let state = state(&map, placed.replicas, pg, found.as_ref());
            if problems && state == "active" {
                continue;
            }
            views.push(PgView {
                pool: p.name.clone(),
                pg: i as u32,
                up: pg.up.clone(),
                acting: pg.acting.clone(),
                serving: map.serving(pg).collect(),
                since: pg.since.0,
                state,
                unfound_objects: found.as_ref().map(|r| r.unfound),
                unfound: found.map(|r| r.oids).unwrap_or_default(),
            });
        }
    }
    if common.json {
        return output::json(&views);
    }
    let ids = |v: &[DeviceId]| {
        let s: Vec<String> = v.iter().map(|d| d.0.to_string()).collect();
        format!("[{}]", s.join(","))
    };
    let mut t = output::table(&["POOL", "PG", "UP", "ACTING", "SINCE", "STATE"]);
    for v in &views {
        t.add_row([
            v.pool.clone(),
            v.pg.to_string(),
            ids(&v.up),
            ids(&v.acting),
            v.since.to_string(),
            v.state.clone(),
        ]);
    }
    println!("map epoch {}", map.epoch.0);
    println!("{t}");
    Ok(())
}

/// The node of the PG's primary (its first serving member).
pub(crate) fn primary_node(map: &ClusterMap, pg: &PgMap) -> Option<NodeId> {
    let primary = map.serving(pg).next()?;
    Some(map.devices.get(&primary)?.node)
}

/// Per node of a PG primary that answered: its PGs with unfound objects (how many, and the
/// first of them) or a backfill stopped by a backfill-full target.
async fn reported_by_pg(
    cluster: &Cluster,
    map: &ClusterMap,
) -> BTreeMap<NodeId, BTreeMap<PgId, Reported>> {
    let primaries: std::collections::BTreeSet<NodeId> = map
        .pools
        .values()
        .flat_map(|p| &p.pgs)
        .filter_map(|pg| primary_node(map, pg))
        .collect();
    let mut asked = tokio::task::JoinSet::new();
    for node in primaries {
        let cluster = cluster.clone();
        asked.spawn(async move { (node, crate::status::node_status(&cluster, node).await) });
    }
    let mut out = BTreeMap::new();
    while let Some(Ok((node, answer))) = asked.join_next().await {
        let Ok(status) = answer else { continue };
        let pgs = status
            .pgs
            .iter()
            .filter(|p| p.unfound_objects > 0 || p.backfill_toofull)
            .map(|p| {
                let r = Reported {
                    unfound: p.unfound_objects,
                    oids: p.unfound.clone(),
                    toofull: p.backfill_toofull,
                };
                (p.pg, r)
            })
            .collect();
        out.insert(node, pgs);
    }
    out
}

/// Pool `pool`'s record and the id of its PG number `pg`.
pub(crate) async fn pool_pg(
    cluster: &Cluster,
    pool: &str,
    pg: u32,
) -> anyhow::Result<(basalt_meta::PoolRecord, PgId)> {
    let rec = cluster
        .catalog()
        .get_pool_by_name(pool)
        .await?
        .with_context(|| format!("no pool '{pool}'"))?;
    let id = PgId { pool: rec.id, pg };
    Ok((rec, id))
}

/// Writes a PG-ready report marked lost for the PG's current `up` set, and waits until the
/// leader has made it the acting set.
async fn mark_lost(cluster: &Cluster, pool: &str, pg: u32) -> anyhow::Result<()> {
    let (rec, id) = pool_pg(cluster, pool, pg).await?;
    let map = cluster.map();
    let entry = map
        .pg(id)
        .with_context(|| format!("pool {pool} has no PG {pg} (it has {})", rec.pg_count))?;
    if entry.acting == entry.up {
        println!(
            "{id} already serves from its up set {:?}; nothing to do",
            entry.up
        );
        return Ok(());
    }
    if entry.up.is_empty() {
        bail!("{id} has no device to serve it (no device can hold pool {pool}); add devices first");
    }
    let mut report = PgReadyRecord::new(id, map.epoch, entry.up.clone());
    report.lost = true;
    cluster.catalog().put_pg_ready(&report).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = cluster.map();
        if let Some(e) = now.pg(id)
            && e.acting == report.up
        {
            println!(
                "{id} is marked lost: served EMPTY from {:?} since map epoch {}",
                e.acting, e.since.0
            );
            return Ok(());
        }
        if now.pg(id).is_some_and(|e| e.up != report.up) {
            bail!("{id}'s up set changed meanwhile; look again and re-run if still needed");
        }
        if Instant::now() >= deadline {
            bail!("the leader did not apply the report within 30 s; is a node running?");
        }
        cluster.refresh_map(now.epoch.next()).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_placement::DeviceInfo;
    use basalt_types::Epoch;

    #[test]
    fn unfound_objects_are_a_state_of_their_own() {
        let mut map = ClusterMap::default();
        for d in 1..=3 {
            let info = DeviceInfo {
                node: NodeId(d),
                class: "hdd".into(),
                weight: 1,
                object_size: 4096,
                up: d != 3,
                r#in: true,
                auto_out: false,
                down_since: None,
            };
            map.devices.insert(DeviceId(d), info);
        }
        let pg = PgMap {
            up: vec![DeviceId(1), DeviceId(2), DeviceId(3)],
            acting: vec![DeviceId(1), DeviceId(2), DeviceId(3)],
            since: Epoch(1),
        };
        let unfound = |n| Reported {
            unfound: n,
            ..Reported::default()
        };
        assert_eq!(state(&map, 3, &pg, Some(&unfound(0))), "degraded");
        assert_eq!(state(&map, 3, &pg, None), "degraded");
        assert_eq!(state(&map, 3, &pg, Some(&unfound(2))), "degraded+unfound");
        assert_eq!(primary_node(&map, &pg), Some(NodeId(1)));
        map.devices.get_mut(&DeviceId(3)).unwrap().up = true;
        assert_eq!(state(&map, 3, &pg, Some(&unfound(1))), "active+unfound");
        assert_eq!(state(&map, 3, &pg, Some(&unfound(0))), "active");
        let toofull = Reported {
            toofull: true,
            ..Reported::default()
        };
        assert_eq!(
            state(&map, 3, &pg, Some(&toofull)),
            "active+backfill_toofull"
        );
    }
}
