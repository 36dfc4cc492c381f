//! `basalt node drain|undrain|remove ID`: move every placement group off a node (its devices
//! marked out; placement moves their up sets, backfill copies the data, then the acting sets
//! follow), wait until none is left on it, and say that it may be removed; forget a stopped or
//! dead node and its devices for good (`basalt_client`'s `remove.rs` says when it may).

use crate::connect::Common;
use crate::output;
use anyhow::{Context, bail};
use basalt_meta::{Catalog, DeviceRecord, OutReason};
use basalt_placement::ClusterMap;
use basalt_types::{DeviceId, NodeId};
use clap::Subcommand;
use serde::Serialize;
use std::time::{Duration, Instant};

#[derive(Subcommand, Debug)]
pub enum NodeAction {
    /// Move every placement group off node ID: mark its devices out, then wait until no
    /// placement group is placed on or served from them (copies are made before the old ones
    /// go) and each is clean where it moved (no PG history names them). Then the node may be
    /// stopped and removed.
    Drain {
        /// Node id, e.g. 2 or node.2.
        #[arg(value_parser = parse_node_id)]
        id: NodeId,
        /// Return once the devices are marked out, without waiting for the data to move.
        #[arg(long)]
        no_wait: bool,
        /// Give up waiting after this long (the drain goes on), e.g. 30m. Default: no limit.
        #[arg(long, value_parser = crate::duration::parse_duration)]
        timeout: Option<Duration>,
        /// Drain even when the other nodes cannot hold every copy apart (some placement groups
        /// would stay on the node, or keep copies on one host); refused otherwise.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Forget node ID and its devices for good: a host retired after a drain, or dead for good
    /// once its data was rebuilt elsewhere (its devices out, in no placement group). Refused
    /// while it runs or anything may need its data. The ids never register again: the host,
    /// if it comes back, must join as a new node with erased devices.
    Remove {
        #[arg(value_parser = parse_node_id)]
        id: NodeId,
        #[command(flatten)]
        common: Common,
    },
    /// Mark node ID's devices in again (undoes a drain; placement groups move back).
    Undrain {
        #[arg(value_parser = parse_node_id)]
        id: NodeId,
        #[command(flatten)]
        common: Common,
    },
}

fn parse_node_id(s: &str) -> Result<NodeId, String> {
    s.strip_prefix("node.")
        .unwrap_or(s)
        .parse()
        .map(NodeId)
        .map_err(|_| format!("'{s}' is not a node id (e.g. 2 or node.2)"))
}

/// How far a drain is, as printed (and as JSON).
#[derive(Serialize)]
struct Progress {
    node: NodeId,
    devices: Vec<DeviceId>,
    /// Placement groups whose up or acting set still names one of the devices (or, once none
    /// does, whose history still names one: not clean yet on their new devices).
    pgs_left: usize,
    drained: bool,
}

/// What `basalt node remove --json` prints: the node and its devices' last records.
#[derive(Serialize)]
struct Removed {
    node: NodeId,
    devices: Vec<DeviceRecord>,
}

pub async fn run(action: NodeAction) -> anyhow::Result<()> {
    match action {
        NodeAction::Drain {
            id,
            no_wait,
            timeout,
            force,
            common,
        } => drain(id, no_wait, timeout, force, common).await,
        NodeAction::Remove { id, common } => {
            let cluster = common.cluster.connect().await?;
            let devices = cluster.remove_node(id).await?;
            if common.json {
                return output::json(&Removed { node: id, devices });
            }
            let ids: Vec<DeviceId> = devices.iter().map(|d| d.id).collect();
            println!("node {id} and its devices {ids:?} are removed");
            Ok(())
        }
        NodeAction::Undrain { id, common } => {
            let catalog = Catalog::new(common.cluster.meta().await?);
            let devices = devices_of(&catalog, id).await?;
            for d in &devices {
                catalog.set_device_out(*d, None).await?;
            }
            println!("node {id}: devices {devices:?} are in again");
            Ok(())
        }
    }
}

async fn devices_of(catalog: &Catalog, node: NodeId) -> anyhow::Result<Vec<DeviceId>> {
    let devices: Vec<DeviceId> = catalog
        .list_devices()
        .await
        .context("listing devices")?
        .into_iter()
        .filter(|d| d.node == node)
        .map(|d| d.id)
        .collect();
    if devices.is_empty() {
        bail!("node {node} has no registered device");
    }
    Ok(devices)
}

/// Placement groups whose up or acting set names one of `devices`.
fn pgs_on(map: &ClusterMap, devices: &[DeviceId]) -> usize {
    map.pools
        .values()
        .flat_map(|p| &p.pgs)
        .filter(|pg| {
            devices
                .iter()
                .any(|d| pg.up.contains(d) || pg.acting.contains(d))
        })
        .count()
}

async fn drain(
    id: NodeId,
    no_wait: bool,
    timeout: Option<Duration>,
    force: bool,
    common: Common,
) -> anyhow::Result<()> {
    let cluster = common.cluster.connect().await?;
    let catalog = cluster.catalog().clone();
    let devices = devices_of(&catalog, id).await?;
    crate::outcheck::check(&cluster, &devices, &format!("draining {id}"), force).await?;
    for d in &devices {
        catalog
            .set_device_out(*d, Some(OutReason::Operator))
            .await
            .with_context(|| format!("marking {d} out"))?;
    }
    if !common.json {
        println!("node {id}: devices {devices:?} marked out; placement groups move off it");
    }
    let start = Instant::now();
    let mut last_print = None;
    loop {
        let mut left = pgs_on(&cluster.map(), &devices);
        if left == 0 {
            // Moved; done once no PG's history names the devices either: a PG whose new
            // primary has not peered yet may still need their copies.
            left = cluster.pgs_naming(&devices).await?;
        }
        let drained = left == 0;
        if no_wait || drained || timeout.is_some_and(|t| start.elapsed() >= t) {
            let p = Progress {
                node: id,
                devices: devices.clone(),
                pgs_left: left,
                drained,
            };
            if common.json {
                return output::json(&p);
            }
            if drained {
                println!(
                    "node {id} holds no placement group: it may be stopped (SIGTERM) and removed \
                     (`basalt node remove {}`)",
                    id.0
                );
            } else {
                println!(
                    "node {id}: {left} placement groups still on it (the drain goes on; run \
                     `basalt node drain {}` again to wait)",
                    id.0
                );
            }
            return Ok(());
        }
        if last_print != Some(left) && !common.json {
            println!("  {left} placement groups still on node {id}");
            last_print = Some(left);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
