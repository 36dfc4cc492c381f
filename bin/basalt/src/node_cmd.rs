//! `basalt node`: one storage node of a multi-process cluster whose metadata lives in etcd.

use crate::up::{FormatArgs, IoArg};
use anyhow::{Context, bail};
use basalt_meta::EtcdStore;
use basalt_node::{DeviceConfig, HeartbeatConfig, Node, NodeConfig, ReportRules};
use basalt_types::size::parse_size;
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct NodeArgs {
    /// Act on a node of the cluster instead of running one.
    #[command(subcommand)]
    pub action: Option<crate::drain::NodeAction>,
    /// etcd endpoints (comma-separated).
    #[arg(long, env = "BASALT_ETCD", value_delimiter = ',', required = true)]
    pub etcd: Vec<String>,
    /// Key prefix of the cluster in etcd.
    #[arg(long, env = "BASALT_ETCD_PREFIX", default_value = "")]
    pub etcd_prefix: String,
    /// Directory for the node's own state (its id).
    #[arg(long, required = true)]
    pub data: Option<PathBuf>,
    /// Name shown in `basalt status` and logs. Default: the host name.
    #[arg(long)]
    pub name: Option<String>,
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
    /// Lease of the node's registration (e.g. 4s, 2500ms): the node acknowledges I/O only
    /// while its lease is confirmed; when the node dies, its devices count as down this long
    /// after its last renewal, and other nodes may take its data over.
    #[arg(long, value_parser = crate::duration::parse_duration, default_value = "4s")]
    pub lease_ttl: Duration,
    /// While this node leads: how long a device may be down before it is marked out
    /// automatically (its placement groups' up sets move), e.g. 10m.
    #[arg(long, value_parser = crate::duration::parse_duration, default_value = "10m")]
    pub down_out_interval: Duration,
    /// Time between passes of the collector that removes the objects of deleted volumes from
    /// this node's devices (in the background, at a low rate), e.g. 5m.
    #[arg(long, value_parser = crate::duration::parse_duration, default_value = "5m")]
    pub collect_interval: Duration,
    /// Time between two heartbeats (pings) this node sends to each other node.
    #[arg(long, value_parser = crate::duration::parse_duration, default_value = "500ms")]
    pub heartbeat_interval: Duration,
    /// How long another node may leave every heartbeat unanswered before this node reports
    /// it to the leader (0: no heartbeats, no reports).
    #[arg(long, value_parser = crate::duration::parse_duration, default_value = "2s")]
    pub heartbeat_grace: Duration,
    /// While this node leads: how many live nodes must report another (it does not answer
    /// their heartbeats) for its devices to be marked down although it holds its lease
    /// (0: never).
    #[arg(long, default_value_t = 2)]
    pub min_down_reporters: usize,
    /// While this node leads: how long a node marked down by reports stays down at least
    /// (flap damping).
    #[arg(long, value_parser = crate::duration::parse_duration, default_value = "10s")]
    pub reported_down_for: Duration,
    /// While this node leads: how long two nodes must have reported each other (one broken
    /// link) before one of them is marked down.
    #[arg(long, value_parser = crate::duration::parse_duration, default_value = "3s")]
    pub broken_link_delay: Duration,
}

pub async fn run(args: NodeArgs) -> anyhow::Result<()> {
    if let Some(action) = args.action {
        return crate::drain::run(action).await;
    }
    let data = args.data.clone().context("--data is required")?;
    // Caught from here on: a SIGTERM during startup makes the node leave once it has started.
    let mut signals = crate::up::Signals::new()?;
    let store = EtcdStore::connect(&args.etcd, &args.etcd_prefix)
        .await
        .with_context(|| format!("cannot reach etcd at {}", args.etcd.join(",")))?;
    let mut config = NodeConfig::new(&data, args.listen);
    if let Some(name) = &args.name {
        config.name.clone_from(name);
    }
    config.advertise = args.advertise.clone();
    config.io = args.io.into();
    config.lease_ttl = args.lease_ttl;
    config.down_out_interval = args.down_out_interval;
    config.collect_interval = args.collect_interval;
    config.heartbeat = HeartbeatConfig {
        interval: args.heartbeat_interval,
        grace: args.heartbeat_grace,
    };
    config.reports = ReportRules {
        min_reporters: args.min_down_reporters,
        min_down: args.reported_down_for,
        mutual_after: args.broken_link_delay,
    };
    for spec in &args.devices {
        config.devices.push(DeviceConfig {
            force_format: args.format.force_format,
            allow_sparse: args.format.allow_sparse_device,
            ..parse_device(spec)?
        });
    }
    let node = Node::start(config, Arc::new(store), false).await?;
    println!("node {} serving on {}", node.id(), node.status().addr);
    signals.recv().await;
    // A clean stop leaves the cluster at once: requests in flight finish, then the lease is
    // revoked (the leader marks the node's devices down now, not when the lease would expire).
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
