//! `basalt pg mark-unfound-lost`: asks a PG's primary to delete its unfound objects (the node
//! side is `crates/node/src/pg/lost.rs`) and says which volume ranges now read as zeros.

use crate::scrub::call;
use anyhow::{Context, bail};
use basalt_client::{ClientError, Cluster};
use basalt_node::{AdminRequest, LostReport};
use basalt_types::{NodeId, ObjectId, PgId, Version, VolumeId};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long to keep asking while the PG peers or its primary moves.
const PATIENCE: Duration = Duration::from_secs(60);

pub async fn mark_unfound_lost(cluster: &Cluster, pool: &str, pg: u32) -> anyhow::Result<()> {
    let (rec, id) = crate::pg::pool_pg(cluster, pool, pg).await?;
    if pg >= rec.pg_count {
        bail!("pool {pool} has no PG {pg} (it has {})", rec.pg_count);
    }
    let deadline = Instant::now() + PATIENCE;
    let mut declared: Vec<(ObjectId, Version)> = Vec::new();
    let mut last_error = String::new();
    let mut done = false;
    while !done {
        if Instant::now() >= deadline {
            print_declared(cluster, &rec, &declared).await?;
            bail!("{id}: gave up after {PATIENCE:?}: {last_error}");
        }
        match ask(cluster, id).await {
            Ok(r) if r.failed.is_empty() && !r.declared.is_empty() => {
                declared.extend(r.declared);
                done = true;
                continue;
            }
            Ok(r) if r.failed.is_empty() => {
                // Nothing unfound on the primary now: done, unless it is peering again
                // between two recovery attempts (then the objects are unfound again soon).
                if unfound_now(cluster, id).await? == 0 {
                    done = true;
                    continue;
                }
                last_error = "the PG is peering".into();
            }
            Ok(r) => {
                declared.extend(r.declared);
                last_error = r.failed.join("; ");
            }
            // Refused for good (the PG is peered below min_size: the answer says what to do).
            Err(e) if is_refusal(&e) => {
                print_declared(cluster, &rec, &declared).await?;
                bail!("{e:#}");
            }
            Err(e) => last_error = format!("{e:#}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Follows a primary that moved (waits up to 500 ms for a newer map).
        cluster.refresh_map(cluster.map().epoch.next()).await.ok();
    }
    if declared.is_empty() {
        println!("{id} has no unfound objects");
        return Ok(());
    }
    print_declared(cluster, &rec, &declared).await?;
    println!("{id}: {} object(s) declared lost", declared.len());
    Ok(())
}

/// Whether the primary refused the request as asked (asking again cannot help).
fn is_refusal(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<ClientError>(),
        Some(ClientError::InvalidArgument(_))
    )
}

/// Says which volume ranges read as zeros now.
async fn print_declared(
    cluster: &Cluster,
    rec: &basalt_meta::PoolRecord,
    declared: &[(ObjectId, Version)],
) -> anyhow::Result<()> {
    let names = volume_names(cluster).await?;
    for (oid, version) in declared {
        let start = oid.index * u64::from(rec.object_size);
        let end = start + u64::from(rec.object_size);
        let volume = names
            .get(&oid.volume)
            .map_or_else(|| format!("{}", oid.volume), |n| format!("'{n}'"));
        println!(
            "{oid} declared lost (deleted at {version}): volume {volume} bytes {start}..{end} read as zeros now"
        );
    }
    Ok(())
}

/// The node of the PG's primary in this process's map.
fn primary_of(cluster: &Cluster, id: PgId) -> anyhow::Result<NodeId> {
    let map = cluster.map();
    let entry = map
        .pg(id)
        .with_context(|| format!("{id} is not in the map"))?;
    crate::pg::primary_node(&map, entry).with_context(|| format!("{id} has no serving device"))
}

/// Asks the PG's primary (per this process's map) to declare its unfound objects lost.
async fn ask(cluster: &Cluster, id: PgId) -> anyhow::Result<LostReport> {
    let node = primary_of(cluster, id)?;
    let body = call(cluster, node, &AdminRequest::MarkUnfoundLost { pg: id }).await?;
    Ok(serde_json::from_slice(&body)?)
}

/// The unfound objects the PG's primary reports now.
async fn unfound_now(cluster: &Cluster, id: PgId) -> anyhow::Result<u64> {
    let node = primary_of(cluster, id)?;
    let status = crate::status::node_status(cluster, node).await?;
    Ok(status
        .pgs
        .iter()
        .filter(|p| p.pg == id)
        .map(|p| p.unfound_objects)
        .sum())
}

async fn volume_names(cluster: &Cluster) -> anyhow::Result<BTreeMap<VolumeId, String>> {
    Ok(cluster
        .list_volumes()
        .await?
        .into_iter()
        .map(|v| (v.id, v.name))
        .collect())
}
