//! `basalt scrub [--pool P]`: every PG's primary compares the copies of every object on all
//! serving members and repairs bad or divergent ones (`basalt_node` `pg/scrub.rs`). The command
//! asks each node that is the primary of a PG of the pool (in parallel; a node scrubs its PGs
//! one after the other), prints per pool the objects checked, inconsistent, repaired and
//! unrepairable, and fails when something could not be repaired or a PG could not be scrubbed
//! (no active primary, or it changed terms meanwhile: run it again).
//!
//! `basalt scrub --background-rate RATE` sets the background scrub's rate on every live node
//! instead (bytes of object data per second, e.g. 8MiB; 0 turns it off) until they restart.

use crate::connect::Common;
use crate::output;
use anyhow::{Context, bail};
use basalt_client::Cluster;
use basalt_meta::{Catalog, PoolRecord};
use basalt_node::{AdminRequest, NodeStatus, PgScrub, ScrubReport};
use basalt_proto::{Request, Response};
use basalt_types::NodeId;
use basalt_types::size::parse_size;
use clap::Args;
use serde::Serialize;
use std::collections::BTreeSet;

#[derive(Args, Debug)]
pub struct ScrubArgs {
    /// Scrub only this pool (default: every pool).
    #[arg(long)]
    pub pool: Option<String>,
    /// Set the background scrub's rate on every live node instead of scrubbing now (bytes of
    /// object data per second, e.g. 8MiB; 0 turns it off); lasts until a node restarts (its
    /// `--scrub-rate` applies again).
    #[arg(long, value_parser = parse_rate)]
    pub background_rate: Option<u64>,
    #[command(flatten)]
    pub common: Common,
}

pub fn parse_rate(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// What scrubbing one pool found (as printed, and as JSON).
#[derive(Serialize)]
struct PoolScrub {
    pool: String,
    pgs: u32,
    pgs_scrubbed: u64,
    objects: u64,
    inconsistent: u64,
    repaired: u64,
    unrepairable: u64,
    /// PGs that were not scrubbed to the end, and why.
    not_scrubbed: Vec<String>,
    details: Vec<PgScrub>,
}

pub async fn run(args: ScrubArgs) -> anyhow::Result<()> {
    let meta = args.common.cluster.meta().await?;
    let catalog = Catalog::new(meta.clone());
    let cluster = Cluster::connect(meta, Default::default()).await?;
    if let Some(rate) = args.background_rate {
        return set_rate(&cluster, rate).await;
    }
    let pools = match &args.pool {
        Some(name) => vec![
            catalog
                .get_pool_by_name(name)
                .await?
                .with_context(|| format!("no pool named '{name}'"))?,
        ],
        None => catalog.list_pools().await?,
    };
    let mut results = Vec::new();
    for pool in &pools {
        results.push(scrub_pool(&cluster, pool).await?);
    }
    if args.common.json {
        output::json(&results)?;
    } else {
        print(&results);
    }
    let unrepairable: u64 = results.iter().map(|r| r.unrepairable).sum();
    let skipped: usize = results.iter().map(|r| r.not_scrubbed.len()).sum();
    if unrepairable > 0 {
        bail!("{unrepairable} object(s) could not be repaired (no copy verifies)");
    }
    if skipped > 0 {
        bail!("{skipped} placement group(s) were not scrubbed; run the scrub again");
    }
    Ok(())
}

/// Asks every node that is the primary of a PG of `pool` to scrub its PGs of the pool.
async fn scrub_pool(cluster: &Cluster, pool: &PoolRecord) -> anyhow::Result<PoolScrub> {
    let map = cluster.map();
    let nodes: BTreeSet<NodeId> = map
        .pools
        .get(&pool.id)
        .map(|p| {
            p.pgs
                .iter()
                .filter_map(|pg| map.pg_primary(pg))
                .filter_map(|dev| map.device_node(dev))
                .collect()
        })
        .unwrap_or_default();
    let mut asked = tokio::task::JoinSet::new();
    for node in nodes {
        let cluster = cluster.clone();
        let req = AdminRequest::Scrub {
            pool: Some(pool.id),
        };
        asked.spawn(async move { (node, call(&cluster, node, &req).await) });
    }
    let mut report = ScrubReport::default();
    let mut not_scrubbed = Vec::new();
    while let Some(done) = asked.join_next().await {
        let (node, answer) = done.context("a scrub task failed")?;
        match answer.and_then(|body| Ok(serde_json::from_slice::<ScrubReport>(&body)?)) {
            Ok(r) => report.add(&r),
            Err(e) => not_scrubbed.push(format!("node {node}: {e:#}")),
        }
    }
    let done: BTreeSet<u32> = report
        .pgs
        .iter()
        .filter(|p| p.error.is_none())
        .map(|p| p.pg.pg)
        .collect();
    for p in report.pgs.iter().filter(|p| p.error.is_some()) {
        not_scrubbed.push(format!(
            "{}: {}",
            p.pg,
            p.error.as_deref().unwrap_or_default()
        ));
    }
    for pg in (0..pool.pg_count).filter(|pg| !done.contains(pg)) {
        let reported = report.pgs.iter().any(|p| p.pg.pg == pg);
        if !reported {
            not_scrubbed.push(format!("{}.{pg}: no active primary answered", pool.id));
        }
    }
    report.pgs.sort_by_key(|p| p.pg);
    Ok(PoolScrub {
        pool: pool.name.clone(),
        pgs: pool.pg_count,
        pgs_scrubbed: done.len() as u64,
        objects: report.objects(),
        inconsistent: report.inconsistent(),
        repaired: report.repaired(),
        unrepairable: report.unrepairable(),
        not_scrubbed,
        details: report.pgs,
    })
}

/// Sends an admin request to `node`; returns the answer's body.
pub(crate) async fn call(
    cluster: &Cluster,
    node: NodeId,
    req: &AdminRequest,
) -> anyhow::Result<Vec<u8>> {
    let body = serde_json::to_vec(req)?;
    match cluster
        .call_node(node, Request::Admin { body: body.into() })
        .await?
    {
        Response::Admin { body } => Ok(body.to_vec()),
        other => bail!("unexpected answer: {other:?}"),
    }
}

async fn set_rate(cluster: &Cluster, rate: u64) -> anyhow::Result<()> {
    let map = cluster.map();
    let mut failed = Vec::new();
    for &node in map.nodes.keys() {
        let req = AdminRequest::SetScrubRate {
            bytes_per_sec: rate,
        };
        match call(cluster, node, &req)
            .await
            .and_then(|b| Ok(serde_json::from_slice::<NodeStatus>(&b)?))
        {
            Ok(s) => println!(
                "node {node}: background scrub at {} bytes/s",
                s.scrub_bytes_per_sec
            ),
            Err(e) => failed.push(format!("node {node}: {e:#}")),
        }
    }
    if !failed.is_empty() {
        bail!("could not set the rate on {}", failed.join("; "));
    }
    Ok(())
}

fn print(results: &[PoolScrub]) {
    let mut t = output::table(&[
        "pool",
        "pgs scrubbed",
        "objects checked",
        "inconsistent",
        "repaired",
        "unrepairable",
    ]);
    for r in results {
        t.add_row(vec![
            r.pool.clone(),
            format!("{}/{}", r.pgs_scrubbed, r.pgs),
            r.objects.to_string(),
            r.inconsistent.to_string(),
            r.repaired.to_string(),
            r.unrepairable.to_string(),
        ]);
    }
    println!("{t}");
    for r in results {
        for why in &r.not_scrubbed {
            println!("pool {}: not scrubbed: {why}", r.pool);
        }
    }
}
