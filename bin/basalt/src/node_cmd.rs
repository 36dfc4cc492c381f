//! `basalt node`: one storage node of a multi-process cluster whose metadata lives in etcd.

use crate::up::{FormatArgs, IoArg};
use anyhow::{Context, bail};
use basalt_meta::EtcdStore;
use basalt_node::{DeviceConfig, Node, NodeConfig};
use basalt_types::size::parse_size;
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct NodeArgs {
    /// etcd endpoints (comma-separated).
    #[arg(long, env = "BASALT_ETCD", value_delimiter = ',', required = true)]
    pub etcd: Vec<String>,
    /// Key prefix of the cluster in etcd.
    #[arg(long, env = "BASALT_ETCD_PREFIX", default_value = "")]
    pub etcd_prefix: String,
    /// Directory for the node's own state (its id).
    #[arg(long)]
    pub data: PathBuf,
    /// Data-path listen address.
    #[arg(long, default_value = "0.0.0.0:10810")]
    pub listen: SocketAddr,
    /// Address clients use to reach this node. Default: the listen address, or, when that is
    /// every address (0.0.0.0), this host's primary address (that of its default route).
    #[arg(long)]
    pub advertise: Option<String>,
    /// A device: PATH, PATH:SIZE (file created with that size) or PATH:SIZE:CLASS. Repeatable.
    #[arg(long = "device", required = true)]
    pub devices: Vec<String>,
    /// I/O backend.
    #[arg(long, value_enum, default_value = "auto")]
    pub io: IoArg,
    #[command(flatten)]
    pub format: FormatArgs,
    /// Lease of the node's registration (e.g. 10s, 2500ms): the node acknowledges I/O only
    /// while its lease is confirmed, and other nodes may take its data over once it expired.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub lease_ttl: Duration,
}

pub async fn run(args: NodeArgs) -> anyhow::Result<()> {
    let store = EtcdStore::connect(&args.etcd, &args.etcd_prefix)
        .await
        .with_context(|| format!("cannot reach etcd at {}", args.etcd.join(",")))?;
    let mut config = NodeConfig::new(&args.data, args.listen);
    config.advertise = args.advertise.clone();
    config.io = args.io.into();
    config.lease_ttl = args.lease_ttl;
    for spec in &args.devices {
        config.devices.push(DeviceConfig {
            force_format: args.format.force_format,
            allow_sparse: args.format.allow_sparse_device,
            ..parse_device(spec)?
        });
    }
    let node = Node::start(config, Arc::new(store), false).await?;
    println!("node {} serving on {}", node.id(), node.status().addr);
    crate::up::wait_for_signal().await;
    node.shutdown().await;
    Ok(())
}

fn parse_device(spec: &str) -> anyhow::Result<DeviceConfig> {
    let mut parts = spec.splitn(3, ':');
    let path = PathBuf::from(parts.next().unwrap_or_default());
    if path.as_os_str().is_empty() {
        bail!("--device needs a path, e.g. --device /dev/nvme0n1 or --device /srv/d0.img:64GiB");
    }
    let size = parts
        .next()
        .map(parse_size)
        .transpose()
        .with_context(|| format!("bad size in --device {spec}"))?;
    let class = parts.next().unwrap_or("ssd").to_string();
    Ok(DeviceConfig {
        size,
        class,
        ..DeviceConfig::new(path)
    })
}

/// `10s`, `2500ms` or a number of seconds; at least 2 s (etcd's smallest lease).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = match s.strip_suffix("ms") {
        Some(n) => (n, 1),
        None => (s.strip_suffix('s').unwrap_or(s), 1000),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a duration: use e.g. 10s or 2500ms"))?;
    let d = Duration::from_millis(n.saturating_mul(unit));
    if d < Duration::from_secs(2) {
        return Err(format!("a lease of {d:?} is too short: use at least 2s"));
    }
    Ok(d)
}
