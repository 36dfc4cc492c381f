//! `basalt status`: the cluster map, nodes with their devices, pools and volumes.

use crate::connect::Common;
use crate::output;
use basalt_node::{AdminRequest, NodeStatus};
use basalt_proto::{Request, Response};
use basalt_types::size::{format_size, format_size_approx};
use clap::Args;
use serde::Serialize;

#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    common: Common,
}

#[derive(Serialize)]
struct ClusterStatus {
    epoch: u64,
    nodes: Vec<NodeView>,
    /// Devices that are down in the map (their node is gone or reports them failed).
    devices_down: Vec<u32>,
    pools: Vec<PoolView>,
    volumes: usize,
    provisioned_bytes: u64,
}

#[derive(Serialize)]
struct NodeView {
    id: u32,
    addr: String,
    /// The node's own report, when it answered.
    status: Option<NodeStatus>,
    error: Option<String>,
}

#[derive(Serialize)]
struct PoolView {
    name: String,
    replicas: u8,
    pg_count: u32,
    object_size: u32,
    /// PGs with no up device holding their data: their I/O waits, then fails.
    unavailable_pgs: usize,
    /// PGs served by fewer devices than `replicas`.
    degraded_pgs: usize,
    /// PGs whose data is not (yet) where placement wants it.
    remapped_pgs: usize,
}

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let cluster = args.common.cluster.connect().await?;
    let map = cluster.map();
    let mut nodes = Vec::new();
    for (id, info) in &map.nodes {
        let (status, error) = match node_status(&cluster, *id).await {
            Ok(s) => (Some(s), None),
            Err(e) => (None, Some(e.to_string())),
        };
        nodes.push(NodeView {
            id: id.0,
            addr: info.addr.clone(),
            status,
            error,
        });
    }
    let pools = cluster
        .list_pools()
        .await?
        .into_iter()
        .map(|p| PoolView {
            unavailable_pgs: map.pools.get(&p.id).map_or(0, |m| m.unavailable(&map)),
            degraded_pgs: map.pools.get(&p.id).map_or(0, |m| m.degraded(&map)),
            remapped_pgs: map.pools.get(&p.id).map_or(0, |m| m.remapped()),
            name: p.name,
            replicas: p.replicas,
            pg_count: p.pg_count,
            object_size: p.object_size,
        })
        .collect();
    let volumes = cluster.list_volumes().await?;
    let status = ClusterStatus {
        epoch: map.epoch.0,
        nodes,
        devices_down: map
            .devices
            .iter()
            .filter(|(_, d)| !d.up)
            .map(|(id, _)| id.0)
            .collect(),
        pools,
        volumes: volumes.len(),
        provisioned_bytes: volumes.iter().map(|v| v.size).sum(),
    };
    if args.common.json {
        return output::json(&status);
    }
    print_tables(&status);
    Ok(())
}

async fn node_status(
    cluster: &basalt_client::Cluster,
    node: basalt_types::NodeId,
) -> anyhow::Result<NodeStatus> {
    let body = serde_json::to_vec(&AdminRequest::Status)?;
    match cluster
        .call_node(node, Request::Admin { body: body.into() })
        .await?
    {
        Response::Admin { body } => Ok(serde_json::from_slice(&body)?),
        other => anyhow::bail!("unexpected answer to a status request: {other:?}"),
    }
}

fn print_tables(s: &ClusterStatus) {
    println!(
        "cluster map epoch {}: {} node(s), {} volume(s), {} provisioned",
        s.epoch,
        s.nodes.len(),
        s.volumes,
        format_size_approx(s.provisioned_bytes)
    );
    if !s.devices_down.is_empty() {
        let ids: Vec<String> = s.devices_down.iter().map(|d| format!("dev.{d}")).collect();
        println!(
            "devices down: {} (see `basalt device list`, `basalt pg list --problems`)",
            ids.join(", ")
        );
    }
    let mut t = output::table(&[
        "NODE", "ADDRESS", "DEVICE", "I/O", "CAPACITY", "USED", "OBJECTS", "JOURNAL",
    ]);
    for n in &s.nodes {
        match (&n.status, &n.error) {
            (Some(st), _) => {
                let node = match st.fenced {
                    true => format!("node.{} (FENCED: no lease)", n.id),
                    false => format!("node.{}", n.id),
                };
                for d in &st.devices {
                    t.add_row([
                        node.clone(),
                        n.addr.clone(),
                        d.id.to_string(),
                        d.io_backend.clone(),
                        format_size_approx(d.capacity_bytes),
                        format_size_approx(d.used_bytes),
                        d.objects.to_string(),
                        format!(
                            "{}/{}",
                            format_size_approx(d.journal_used),
                            format_size_approx(d.journal_size)
                        ),
                    ]);
                }
            }
            (None, e) => {
                t.add_row([
                    format!("node.{}", n.id),
                    n.addr.clone(),
                    format!("unreachable: {}", e.clone().unwrap_or_default()),
                ]);
            }
        }
    }
    println!("{t}");
    let mut t = output::table(&[
        "POOL",
        "REPLICAS",
        "PGS",
        "OBJECT SIZE",
        "UNAVAILABLE PGS",
        "DEGRADED PGS",
        "REMAPPED PGS",
    ]);
    for p in &s.pools {
        t.add_row([
            p.name.clone(),
            p.replicas.to_string(),
            p.pg_count.to_string(),
            format_size(p.object_size as u64),
            p.unavailable_pgs.to_string(),
            p.degraded_pgs.to_string(),
            p.remapped_pgs.to_string(),
        ]);
    }
    println!("{t}");
}
