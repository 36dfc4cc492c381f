//! `basalt pool create|list|info|set|delete`.

use crate::connect::Common;
use crate::output;
use basalt_meta::{Catalog, DeviceRecord, FailureDomain, PoolRecord, PoolSpec};
use basalt_placement::ClusterMap;
use basalt_types::size::{format_size, parse_size};
use clap::{Subcommand, ValueEnum};
use serde::Serialize;
use std::collections::HashSet;

#[derive(Subcommand)]
pub enum PoolCommand {
    /// Create a pool.
    Create {
        /// Pool name.
        name: String,
        /// Copies of every object, 1 to 5, each on another failure domain; a write is
        /// acknowledged once every serving copy has it durable. Default: 3, or as many as
        /// there are failure domains (hosts, or devices) among the registered devices that can
        /// hold the pool, if that is fewer.
        #[arg(long, value_parser = clap::value_parser!(u8).range(1..=5))]
        replicas: Option<u8>,
        /// Copies a placement group needs to accept writes (default: a majority,
        /// replicas - replicas/2).
        #[arg(long)]
        min_size: Option<u8>,
        /// Placement groups (about 100 per device is a good rule; cannot change later).
        #[arg(long = "pgs", alias = "pg-count", default_value_t = 64)]
        pgs: u32,
        /// Object size: a power of two from 4KiB to 16MiB; only devices formatted with this
        /// object size hold the pool's data.
        #[arg(long, value_parser = parse_size, default_value = "128KiB")]
        object_size: u64,
        /// What copies must not share.
        #[arg(long, value_enum, default_value = "host")]
        failure_domain: Domain,
        /// Only devices of this class hold the pool's data.
        #[arg(long)]
        device_class: Option<String>,
        /// Create the pool even though no registered device can hold its data.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        common: Common,
    },
    /// List pools.
    List {
        #[command(flatten)]
        common: Common,
    },
    /// Show one pool and the state of its placement groups.
    Info {
        name: String,
        #[command(flatten)]
        common: Common,
    },
    /// Change a pool setting that can change safely.
    Set {
        name: String,
        /// Copies a placement group needs to accept writes (1 to replicas).
        #[arg(long, required = true)]
        min_size: Option<u8>,
        #[command(flatten)]
        common: Common,
    },
    /// Delete a pool that holds no volume.
    Delete {
        name: String,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Domain {
    Host,
    Device,
}

/// A pool with the state of its placement groups in the current map.
#[derive(Serialize)]
struct PoolInfo {
    #[serde(flatten)]
    pool: PoolRecord,
    epoch: u64,
    /// PGs with no up device holding their data: their I/O waits, then fails.
    unavailable_pgs: usize,
    /// PGs served by fewer devices than `replicas`.
    degraded_pgs: usize,
    /// PGs whose data is not (yet) where placement wants it.
    remapped_pgs: usize,
    /// Devices that may hold the pool's data (in, of its class and object size).
    devices: usize,
}

pub async fn run(cmd: PoolCommand) -> anyhow::Result<()> {
    match cmd {
        PoolCommand::Create {
            name,
            replicas,
            min_size,
            pgs,
            object_size,
            failure_domain,
            device_class,
            force,
            common,
        } => {
            let catalog = Catalog::new(common.cluster.meta().await?);
            let devices = catalog.list_devices().await?;
            let mut spec = PoolSpec {
                name,
                replicas: replicas.unwrap_or(DEFAULT_REPLICAS),
                min_size,
                pg_count: pgs,
                object_size: u32::try_from(object_size)
                    .map_err(|_| anyhow::anyhow!("--object-size {object_size} is too large"))?,
                failure_domain: match failure_domain {
                    Domain::Host => FailureDomain::Host,
                    Domain::Device => FailureDomain::Device,
                },
                device_class,
            };
            if replicas.is_none() {
                spec.replicas = default_replicas(&devices, &spec);
            }
            spec.validate()?;
            check_devices(&devices, &spec, force)?;
            let rec = catalog.create_pool(&spec).await?;
            note_domains(&devices, &rec, replicas.is_none());
            if common.json {
                return output::json(&rec);
            }
            println!("created pool {} ({})", rec.name, rec.id);
            Ok(())
        }
        PoolCommand::List { common } => list(common).await,
        PoolCommand::Info { name, common } => info(&name, common).await,
        PoolCommand::Set {
            name,
            min_size,
            common,
        } => {
            let catalog = Catalog::new(common.cluster.meta().await?);
            let min = min_size.ok_or_else(|| anyhow::anyhow!("nothing to set"))?;
            let rec = catalog.set_pool_min_size(&name, min).await?;
            if common.json {
                return output::json(&rec);
            }
            println!("pool {}: min_size {}", rec.name, rec.min_size);
            Ok(())
        }
        PoolCommand::Delete { name, common } => {
            let catalog = Catalog::new(common.cluster.meta().await?);
            let rec = catalog.delete_pool(&name).await?;
            if common.json {
                return output::json(&rec);
            }
            println!("deleted pool {} ({})", rec.name, rec.id);
            Ok(())
        }
    }
}

/// Whether a device can hold data of a pool with `spec`.
fn matches(d: &DeviceRecord, spec: &PoolSpec) -> bool {
    d.is_in()
        && d.object_size == spec.object_size
        && spec.device_class.as_ref().is_none_or(|c| *c == d.class)
}

/// Copies of a pool created without `--replicas` where enough failure domains exist.
const DEFAULT_REPLICAS: u8 = 3;

/// The failure domains (hosts, or devices) among the devices that can hold a pool's data.
fn domains(devices: &[DeviceRecord], spec: &PoolSpec) -> usize {
    let held = devices.iter().filter(|d| matches(d, spec));
    match spec.failure_domain {
        FailureDomain::Host => held.map(|d| d.node).collect::<HashSet<_>>().len(),
        _ => held.count(),
    }
}

/// [`DEFAULT_REPLICAS`], or fewer when fewer failure domains can hold the pool today (a
/// one-host cluster gets one copy). With no such device registered yet, the default.
fn default_replicas(devices: &[DeviceRecord], spec: &PoolSpec) -> u8 {
    match domains(devices, spec) {
        0 => DEFAULT_REPLICAS,
        n => DEFAULT_REPLICAS.min(u8::try_from(n).unwrap_or(u8::MAX)),
    }
}

/// Tells the operator how many copies a pool got and when its PGs lack failure domains.
fn note_domains(devices: &[DeviceRecord], rec: &PoolRecord, defaulted: bool) {
    let spec = PoolSpec {
        name: rec.name.clone(),
        replicas: rec.replicas,
        min_size: Some(rec.min_size),
        pg_count: rec.pg_count,
        object_size: rec.object_size,
        failure_domain: rec.failure_domain,
        device_class: rec.device_class.clone(),
    };
    let have = domains(devices, &spec);
    let kind = match rec.failure_domain {
        FailureDomain::Host => "host",
        _ => "device",
    };
    if defaulted {
        eprintln!(
            "note: pool {} keeps {} cop{} (min_size {}){}; --replicas sets it",
            rec.name,
            rec.replicas,
            if rec.replicas == 1 { "y" } else { "ies" },
            rec.min_size,
            if rec.replicas < DEFAULT_REPLICAS {
                format!(", one per {kind}: the cluster has {have} {kind}(s) that can hold it")
            } else {
                String::new()
            }
        );
    } else if have > 0 && have < usize::from(rec.replicas) {
        eprintln!(
            "note: pool {} wants {} copies on distinct {kind}s but {have} can hold it now: its \
             placement groups stay degraded (and below min_size {} they wait) until more join",
            rec.name, rec.replicas, rec.min_size
        );
    }
}

/// Refuses a pool no registered device can hold (unless `force`); with no device registered
/// yet, only notes it.
fn check_devices(devices: &[DeviceRecord], spec: &PoolSpec, force: bool) -> anyhow::Result<()> {
    if devices.is_empty() {
        eprintln!(
            "note: no device is registered yet; pool {} is placed once nodes with {} object \
             devices join",
            spec.name,
            format_size(u64::from(spec.object_size))
        );
        return Ok(());
    }
    if force || devices.iter().any(|d| matches(d, spec)) {
        return Ok(());
    }
    let found: Vec<String> = devices
        .iter()
        .map(|d| {
            format!(
                "{} ({}, {} objects{})",
                d.id,
                d.class,
                format_size(u64::from(d.object_size)),
                if d.is_in() { "" } else { ", out" }
            )
        })
        .collect();
    anyhow::bail!(
        "no device can hold pool {}: it needs {} objects{} on a device that is in; the devices \
         are {}. Pick a matching --object-size/--device-class, add such devices, or pass \
         --force",
        spec.name,
        format_size(u64::from(spec.object_size)),
        spec.device_class
            .as_ref()
            .map(|c| format!(" of class {c}"))
            .unwrap_or_default(),
        found.join(", ")
    )
}

async fn list(common: Common) -> anyhow::Result<()> {
    let catalog = Catalog::new(common.cluster.meta().await?);
    let pools = catalog.list_pools().await?;
    if common.json {
        return output::json(&pools);
    }
    let mut t = output::table(&[
        "NAME",
        "ID",
        "REPLICAS",
        "MIN SIZE",
        "PGS",
        "OBJECT SIZE",
        "DOMAIN",
        "CLASS",
    ]);
    for p in &pools {
        t.add_row([
            p.name.clone(),
            p.id.to_string(),
            p.replicas.to_string(),
            p.min_size.to_string(),
            p.pg_count.to_string(),
            format_size(p.object_size as u64),
            format!("{:?}", p.failure_domain).to_lowercase(),
            p.device_class.clone().unwrap_or_else(|| "any".into()),
        ]);
    }
    println!("{t}");
    Ok(())
}

async fn info(name: &str, common: Common) -> anyhow::Result<()> {
    let cluster = common.cluster.connect().await?;
    let pool = cluster
        .catalog()
        .get_pool_by_name(name)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no pool '{name}'; list pools with `basalt pool list`"))?;
    let map = cluster.map();
    let view = pool_info(pool, &map);
    if common.json {
        return output::json(&view);
    }
    let p = &view.pool;
    println!(
        "pool {} ({}): {} cop{} (min {}), {} PGs, {} objects, failure domain {}, class {}",
        p.name,
        p.id,
        p.replicas,
        if p.replicas == 1 { "y" } else { "ies" },
        p.min_size,
        p.pg_count,
        format_size(u64::from(p.object_size)),
        format!("{:?}", p.failure_domain).to_lowercase(),
        p.device_class.as_deref().unwrap_or("any")
    );
    println!(
        "map epoch {}: {} device(s) may hold it; {} PG(s) unavailable, {} degraded, {} remapped",
        view.epoch, view.devices, view.unavailable_pgs, view.degraded_pgs, view.remapped_pgs
    );
    Ok(())
}

fn pool_info(pool: PoolRecord, map: &ClusterMap) -> PoolInfo {
    let placed = map.pools.get(&pool.id);
    let devices = map
        .devices
        .values()
        .filter(|d| {
            d.r#in
                && d.weight > 0
                && d.object_size == pool.object_size
                && pool.device_class.as_ref().is_none_or(|c| *c == d.class)
        })
        .count();
    PoolInfo {
        epoch: map.epoch.0,
        unavailable_pgs: placed.map_or(0, |p| p.unavailable(map)),
        degraded_pgs: placed.map_or(0, |p| p.degraded(map)),
        remapped_pgs: placed.map_or(0, |p| p.remapped()),
        devices,
        pool,
    }
}
