//! `basalt device list|out|in|clear-fault|lost|remove|pgs|reweight`: the operator's side of device
//! state.

use crate::connect::Common;
use crate::output;
use anyhow::Context;
use basalt_client::Cluster;
use basalt_meta::{DeviceRecord, OutReason};
use basalt_node::{AdminRequest, HeldPg};
use basalt_proto::{Request, Response};
use basalt_types::size::format_size_approx;
use basalt_types::{DeviceId, NodeId};
use clap::Subcommand;
use serde::Serialize;

#[derive(Subcommand)]
pub enum DeviceCommand {
    /// List devices: state, weight, and the placement groups they hold.
    List {
        #[command(flatten)]
        common: Common,
    },
    /// Mark a device out: placement moves its placement groups elsewhere (their data stays
    /// on it, and it keeps serving them, until recovery has copied them). Survives restarts.
    Out {
        /// Device id, e.g. 3 or dev.3.
        #[arg(value_parser = parse_device_id)]
        id: DeviceId,
        /// Mark it out even when the other devices cannot hold every copy apart (some
        /// placement groups would stay on it, or keep copies on one host); refused otherwise.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Mark a device in again (also undoes an automatic down-out).
    In {
        #[arg(value_parser = parse_device_id)]
        id: DeviceId,
        #[command(flatten)]
        common: Common,
    },
    /// Trust a device its node found faulty again (a poisoned store, repeated checksum
    /// errors, a hang: `basalt device list` shows why), once the drive is replaced or checked.
    /// A faulty device stays down, across restarts of its node, until this. Its node reports
    /// it down again at once if it still finds it faulty (a poisoned store stays so until the
    /// node restarts).
    ClearFault {
        #[arg(value_parser = parse_device_id)]
        id: DeviceId,
        #[command(flatten)]
        common: Common,
    },
    /// Declare a device that is down lost for good (its drive destroyed, its host gone):
    /// placement groups waiting for it (and only for devices declared lost) serve what the
    /// devices that answer hold, GIVING UP the writes only the lost devices held (an object
    /// reads as its newest version there, or as zeros; copies on devices whose backfill had
    /// not completed are not used). Placement groups no answering device ever held still wait
    /// (`basalt pg mark-lost`). Refused while its node runs and reports it working. The device
    /// stays down and out for good; to use the drive again, remove the device and erase it.
    Lost {
        #[arg(value_parser = parse_device_id)]
        id: DeviceId,
        /// Required: you accept that writes only this device held are lost.
        #[arg(long)]
        yes_i_really_mean_it: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Forget a device for good: a drive replaced or retired. Refused unless it is out, its node
    /// started without it (take it off the node's devices and restart the node), no placement
    /// group maps it and no placement group's history names it (mark it out and wait until
    /// every placement group is clean). Its record goes: `basalt device list` and `basalt
    /// status` no longer show it.
    Remove {
        #[arg(value_parser = parse_device_id)]
        id: DeviceId,
        #[command(flatten)]
        common: Common,
    },
    /// What device ID holds of each placement group (asked of its node): objects,
    /// tombstones, member record.
    Pgs {
        #[arg(value_parser = parse_device_id)]
        id: DeviceId,
        #[command(flatten)]
        common: Common,
    },
    /// Set a device's placement weight (its relative share of data; 0 = none).
    Reweight {
        #[arg(value_parser = parse_device_id)]
        id: DeviceId,
        weight: u32,
        #[command(flatten)]
        common: Common,
    },
}

/// A device as printed: its record and what the current map says.
#[derive(Serialize)]
struct DeviceView {
    #[serde(flatten)]
    record: DeviceRecord,
    /// Up in the current map (its node is alive and reports it working).
    up: bool,
    /// Unix seconds since when it is down, if it is.
    down_since: Option<u64>,
    /// Placement groups whose `up` set holds it.
    up_pgs: usize,
    /// Placement groups whose acting set holds it (their data is on it).
    acting_pgs: usize,
    /// Placement groups it serves as primary now.
    primary_pgs: usize,
}

pub fn parse_device_id(s: &str) -> Result<DeviceId, String> {
    s.strip_prefix("dev.")
        .unwrap_or(s)
        .parse()
        .map(DeviceId)
        .map_err(|_| format!("'{s}' is not a device id (e.g. 3 or dev.3)"))
}

pub async fn run(cmd: DeviceCommand) -> anyhow::Result<()> {
    match cmd {
        DeviceCommand::List { common } => list(common).await,
        DeviceCommand::Pgs { id, common } => pgs(id, common).await,
        DeviceCommand::Out { id, force, common } => {
            let cluster = common.cluster.connect().await?;
            let catalog = cluster.catalog();
            crate::outcheck::check(&cluster, &[id], &format!("marking {id} out"), force).await?;
            let rec = catalog
                .set_device_out(id, Some(OutReason::Operator))
                .await?;
            done(
                &common,
                &rec,
                "out (its placement groups move when recovery allows)",
            )
        }
        DeviceCommand::In { id, common } => {
            let catalog = basalt_meta::Catalog::new(common.cluster.meta().await?);
            let rec = catalog.set_device_out(id, None).await?;
            done(&common, &rec, "in")
        }
        DeviceCommand::ClearFault { id, common } => {
            let catalog = basalt_meta::Catalog::new(common.cluster.meta().await?);
            let before = catalog
                .get_device(id)
                .await?
                .with_context(|| format!("no device {id}; `basalt device list` shows the ids"))?;
            let rec = catalog.clear_device_fault(id).await?;
            match before.fault {
                Some(why) => done(&common, &rec, &format!("no longer faulty (was: {why})")),
                None => done(&common, &rec, "not faulty: nothing to clear"),
            }
        }
        DeviceCommand::Lost {
            id,
            yes_i_really_mean_it,
            common,
        } => lost(id, yes_i_really_mean_it, common).await,
        DeviceCommand::Remove { id, common } => {
            let cluster = common.cluster.connect().await?;
            let rec = cluster.remove_device(id).await?;
            done(&common, &rec, "removed")
        }
        DeviceCommand::Reweight { id, weight, common } => {
            let catalog = basalt_meta::Catalog::new(common.cluster.meta().await?);
            let rec = catalog.set_device_weight(id, weight).await?;
            done(&common, &rec, &format!("weight {weight}"))
        }
    }
}

/// `basalt device lost`: refused without the confirmation, and by the catalog while the
/// device's node is registered and reports it working (`MetaError::DeviceInUse`).
async fn lost(id: DeviceId, confirmed: bool, common: Common) -> anyhow::Result<()> {
    if !confirmed {
        anyhow::bail!(
            "declaring {id} lost gives up every write only it holds: placement groups stop \
             waiting for it and serve older data from the devices left; run again with \
             --yes-i-really-mean-it if it is gone for good"
        );
    }
    let cluster = common.cluster.connect().await?;
    let rec = cluster
        .catalog()
        .get_device(id)
        .await?
        .with_context(|| format!("no device {id}; `basalt device list` shows the ids"))?;
    if rec.lost {
        return done(&common, &rec, "lost already");
    }
    let rec = cluster.catalog().mark_device_lost(id).await?;
    done(
        &common,
        &rec,
        "lost: placement groups no longer wait for it; writes only it held are given up",
    )
}

/// What device `id` of `node` holds of each PG (the node's `DevicePgs` answer).
pub(crate) async fn held_pgs(
    cluster: &Cluster,
    node: NodeId,
    id: DeviceId,
) -> anyhow::Result<Vec<HeldPg>> {
    let body = serde_json::to_vec(&AdminRequest::DevicePgs { device: id })?;
    let answer = cluster
        .call_node(node, Request::Admin { body: body.into() })
        .await
        .with_context(|| format!("asking {node} (the node of {id})"))?;
    let Response::Admin { body } = answer else {
        anyhow::bail!("unexpected answer from {node}: {answer:?}");
    };
    Ok(serde_json::from_slice(&body)?)
}

async fn pgs(id: DeviceId, common: Common) -> anyhow::Result<()> {
    let cluster = common.cluster.connect().await?;
    let record = cluster
        .catalog()
        .list_devices()
        .await?
        .into_iter()
        .find(|d| d.id == id)
        .with_context(|| format!("no device {id}; `basalt device list` shows the ids"))?;
    let held = held_pgs(&cluster, record.node, id).await?;
    if common.json {
        return output::json(&held);
    }
    let mut t = output::table(&["PG", "OBJECTS", "TOMBSTONES", "RECORD"]);
    for h in &held {
        t.add_row([
            h.pg.to_string(),
            h.objects.to_string(),
            h.tombstones.to_string(),
            if h.record { "yes" } else { "no" }.to_string(),
        ]);
    }
    println!("{id} holds {} placement group(s)", held.len());
    println!("{t}");
    Ok(())
}

fn done(common: &Common, rec: &DeviceRecord, what: &str) -> anyhow::Result<()> {
    if common.json {
        return output::json(rec);
    }
    println!("device {} is {what}", rec.id);
    Ok(())
}

async fn list(common: Common) -> anyhow::Result<()> {
    let cluster = common.cluster.connect().await?;
    let map = cluster.map();
    let records = cluster
        .catalog()
        .list_devices()
        .await
        .context("listing devices")?;
    let views: Vec<DeviceView> = records
        .into_iter()
        .map(|record| {
            let placed = map.devices.get(&record.id);
            let mut view = DeviceView {
                up: placed.is_some_and(|d| d.up),
                down_since: placed.and_then(|d| d.down_since),
                up_pgs: 0,
                acting_pgs: 0,
                primary_pgs: 0,
                record,
            };
            for pg in map.pools.values().flat_map(|p| &p.pgs) {
                let id = view.record.id;
                view.up_pgs += usize::from(pg.up.contains(&id));
                view.acting_pgs += usize::from(pg.acting.contains(&id));
                view.primary_pgs += usize::from(map.pg_primary(pg) == Some(id));
            }
            view
        })
        .collect();
    if common.json {
        return output::json(&views);
    }
    let mut t = output::table(&[
        "DEVICE", "NODE", "PATH", "CLASS", "CAPACITY", "WEIGHT", "STATE", "PGS UP", "ACTING",
        "PRIMARY",
    ]);
    for v in &views {
        let r = &v.record;
        let mut state = String::from(if v.up { "up" } else { "down" });
        state.push_str(match r.out {
            None if r.is_in() => ", in",
            Some(OutReason::Auto) => ", out (auto)",
            _ => ", out",
        });
        if let Some(since) = v.down_since {
            state.push_str(&format!(" since {}", output::utc(since)));
        }
        if r.lost {
            state.push_str(", lost");
        }
        if let Some(why) = &r.fault {
            state.push_str(&format!(", faulty: {why}"));
        }
        t.add_row([
            r.id.to_string(),
            r.node.to_string(),
            r.path.clone(),
            r.class.clone(),
            format_size_approx(r.capacity),
            r.weight.to_string(),
            state,
            v.up_pgs.to_string(),
            v.acting_pgs.to_string(),
            v.primary_pgs.to_string(),
        ]);
    }
    println!("{t}");
    Ok(())
}
