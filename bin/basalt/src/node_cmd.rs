//! `basalt node`: one storage node of a multi-process cluster whose metadata lives in etcd.

use crate::up::{FormatArgs, Gateway, GatewayArgs, IoArg};
use anyhow::{Context, bail};
use basalt_client::{Cluster, ClusterConfig, Durability};
use basalt_meta::{EtcdStore, MetaStore};
use basalt_node::{DeviceConfig, HeartbeatConfig, Node, NodeConfig, ReportRules};
use basalt_types::size::parse_size;
use clap::Args;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct NodeArgs {
    /// Act on a node of the cluster instead of running one.
    #[command(subcommand)]
    pub action: Option<crate::drain::NodeAction>,
    /// etcd endpoints (comma-separated). Required unless --join names a local cluster.
    #[arg(long, env = "BASALT_ETCD", value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// Join the local cluster of a running `basalt up --nodes` (or `up --etcd`) whose data
    /// directory is DIR: its etcd is read from DIR/cluster.json; --data defaults to the next
    /// free DIR/nodeK (so a later `basalt up --nodes K` starts it too), --name to nodeK,
    /// --listen to 127.0.0.1 with a port chosen by the OS, and --device to <data>/dev0.img of
    /// the size of node1's first device.
    #[arg(long, value_name = "DIR")]
    pub join: Option<PathBuf>,
    /// Key prefix of the cluster in etcd.
    #[arg(long, env = "BASALT_ETCD_PREFIX", default_value = "")]
    pub etcd_prefix: String,
    /// Directory for the node's own state (its id).
    #[arg(long, required_unless_present = "join")]
    pub data: Option<PathBuf>,
    /// Name shown in `basalt status` and logs. Default: the host name.
    #[arg(long)]
    pub name: Option<String>,
    /// Data-path listen address (default 0.0.0.0:10810; with --join 127.0.0.1:0).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Address clients use to reach this node. Default: the listen address, or, when that is
    /// every address (0.0.0.0), this host's primary address (that of its default route).
    #[arg(long)]
    pub advertise: Option<String>,
    /// A device: PATH, PATH:SIZE (file created with that size) or PATH:SIZE:CLASS. Repeatable.
    #[arg(long = "device", required_unless_present = "join")]
    pub devices: Vec<String>,
    /// I/O backend.
    #[arg(long, value_enum, default_value = "auto")]
    pub io: IoArg,
    /// Threads that serve the network and drive the devices. 1 (the default): everything on
    /// one thread, each request handed from its socket to the device and back without a
    /// thread switch (run to completion); N spreads connections and devices over N threads
    /// (for hosts with many fast devices); 0 a thread per core.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(0..=256))]
    pub threads: u16,
    /// Give each device's I/O loop an OS thread of its own (the loop otherwise runs on the
    /// node's threads, beside the network).
    #[arg(long)]
    pub store_threads: bool,
    #[command(flatten)]
    pub format: FormatArgs,
    /// Also serve the cluster's volumes over NBD on ADDR, from this process: a gateway beside
    /// the node, as on a hyperconverged host. A request for a placement group whose primary is
    /// one of this node's devices reaches it in process, without a network hop; the others go
    /// to their primaries over TCP, as from any client. The gateway stops with the node.
    #[arg(long, value_name = "ADDR")]
    pub nbd: Option<SocketAddr>,
    /// With --nbd: the volume served to clients asking for the empty export name.
    #[arg(long, value_name = "NAME", requires = "nbd")]
    pub nbd_default_export: Option<String>,
    /// With --nbd: when an acknowledged write is durable, `sync` (on ack) or `flush` (at
    /// FLUSH/FUA).
    #[arg(long, requires = "nbd", default_value = "sync")]
    pub nbd_durability: Durability,
    /// With --nbd: where reads go. `local` (default): to this node's own copy when it is a
    /// serving member of the object's placement group other than its primary, in process
    /// (the node answers only while that copy may, else the primary serves the read; see
    /// docs/design/replication.md); `primary`: always to the primary.
    /// (Accepted without --nbd, where it does nothing, so that `basalt up --node-arg` can pass
    /// it to every node.)
    #[arg(long, value_enum, default_value = "local")]
    pub nbd_reads: NbdReads,
    /// With --nbd: how long one NBD I/O may wait (node restarts, map changes) before it fails
    /// with EIO, e.g. 30s.
    #[arg(long, requires = "nbd", value_parser = crate::duration::parse_duration, default_value = "30s")]
    pub nbd_io_timeout: Duration,
    /// Lease of the node's registration (e.g. 4s, 2500ms): the node acknowledges I/O only
    /// while its lease is confirmed; when the node dies, its devices count as down this long
    /// after its last renewal, and other nodes may take its data over.
    #[arg(long, value_parser = crate::duration::parse_duration, default_value = "4s")]
    pub lease_ttl: Duration,
    /// Lease of the leadership while this node leads (the shorter of this and --lease-ttl):
    /// when the leader dies, a successor is elected this long after its last renewal and
    /// marks the dead leader down on the survivors' failure reports, before its node lease
    /// expires. Losing it costs only an election.
    #[arg(long, value_parser = crate::duration::parse_duration, default_value = "2s")]
    pub leader_ttl: Duration,
    /// While this node leads: how long a device may be down before it is marked out
    /// automatically (its placement groups' up sets move), e.g. 10m.
    #[arg(long, value_parser = crate::duration::parse_duration, default_value = "10m")]
    pub down_out_interval: Duration,
    /// Time between passes of the collector that removes the objects of deleted volumes from
    /// this node's devices (in the background, at a low rate), e.g. 5m.
    #[arg(long, value_parser = crate::duration::parse_duration, default_value = "5m")]
    pub collect_interval: Duration,
    /// Bytes of object data per second the background scrub compares (every copy of every
    /// object of the PGs this node is primary of, one PG at a time; bad copies are repaired),
    /// e.g. 4MiB; 0 turns it off. `basalt scrub --background-rate` changes it at run time.
    #[arg(long, value_parser = crate::scrub::parse_rate, default_value = "4MiB")]
    pub scrub_rate: u64,
    /// A device on which more than this many distinct blocks fail their checksums within
    /// --checksum-error-window is reported down (its placement groups fail over; restart the
    /// node to bring it back); 0: never for checksum errors. A block read again and again
    /// counts once. A failed write or flush reports
    /// it down at once.
    #[arg(long, default_value_t = basalt_node::DEFAULT_CHECKSUM_ERROR_LIMIT)]
    pub checksum_error_limit: u32,
    /// The window of --checksum-error-limit, e.g. 10m.
    #[arg(long, value_parser = crate::duration::parse_duration, default_value = "10m")]
    pub checksum_error_window: Duration,
    /// A device whose oldest I/O has waited longer than this (it hangs without returning
    /// errors: a firmware stall, a dead path, a hung controller) is reported down like a
    /// failed one: its placement groups fail over, and it stays down (restarts too), even if
    /// the I/O completes later, until `basalt device clear-fault`. 0 turns it off.
    #[arg(long, value_parser = crate::duration::parse_duration, default_value = "10s")]
    pub device_stall_timeout: Duration,
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

pub async fn run(mut args: NodeArgs) -> anyhow::Result<()> {
    if let Some(action) = args.action.take() {
        return crate::drain::run(action).await;
    }
    if let Some(dir) = args.join.clone() {
        join_defaults(&mut args, &dir)?;
    }
    if args.etcd.is_empty() {
        bail!("--etcd is required (or --join DIR, the data directory of a local `basalt up`)");
    }
    let data = args.data.clone().context("--data is required")?;
    let listen = args
        .listen
        .unwrap_or_else(|| "0.0.0.0:10810".parse().expect("an address"));
    // Caught from here on: a SIGTERM during startup makes the node leave once it has started.
    let mut signals = crate::up::Signals::new()?;
    let store = EtcdStore::connect(&args.etcd, &args.etcd_prefix)
        .await
        .with_context(|| format!("cannot reach etcd at {}", args.etcd.join(",")))?;
    let mut config = NodeConfig::new(&data, listen);
    if let Some(name) = &args.name {
        config.name.clone_from(name);
    }
    config.advertise = args.advertise.clone();
    config.io = args.io.into();
    config.store_threads = args.store_threads;
    config.lease_ttl = args.lease_ttl;
    config.leader_ttl = args.leader_ttl;
    config.down_out_interval = args.down_out_interval;
    config.collect_interval = args.collect_interval;
    config.scrub_bytes_per_sec = args.scrub_rate;
    config.checksum_error_limit = args.checksum_error_limit;
    config.checksum_error_window = args.checksum_error_window;
    config.device_stall_timeout = args.device_stall_timeout;
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
    let meta: Arc<dyn MetaStore> = Arc::new(store);
    let node = Node::start(config, meta.clone(), false).await?;
    println!("node {} serving on {}", node.id(), node.status().addr);
    let gateway = match args.nbd {
        Some(listen) => match start_gateway(&args, listen, meta, &node).await {
            Ok(g) => Some(g),
            Err(e) => {
                node.shutdown().await;
                return Err(e);
            }
        },
        None => None,
    };
    let removed = tokio::select! {
        _ = signals.recv() => None,
        why = node.removed() => Some(why),
    };
    // The gateway first: its clients' requests in flight finish on the node still serving.
    if let Some((gateway, cluster)) = gateway {
        gateway.stop().await;
        drop(cluster);
    }
    // A clean stop leaves the cluster at once: requests in flight finish, then the lease is
    // revoked (the leader marks the node's devices down now, not when the lease would expire).
    node.shutdown().await;
    match removed {
        // Removed while it was cut off from the metadata store: it can never serve again.
        Some(why) => bail!("{why}"),
        None => Ok(()),
    }
}

/// Where the reads of `basalt node --nbd` go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NbdReads {
    Local,
    Primary,
}

/// `--nbd`: an NBD gateway in this process whose client library reaches this node in process
/// (the other nodes over TCP).
async fn start_gateway(
    args: &NodeArgs,
    listen: SocketAddr,
    meta: Arc<dyn MetaStore>,
    node: &Node,
) -> anyhow::Result<(Gateway, Cluster)> {
    let config = ClusterConfig {
        op_timeout: args.nbd_io_timeout,
        ..ClusterConfig::default()
    };
    let cluster = Cluster::connect(meta, config).await?;
    cluster.add_local_node(node.id(), node.service());
    if args.nbd_reads == NbdReads::Local {
        cluster.read_near(node.id());
    }
    let gateway = Gateway::start(
        &cluster,
        &GatewayArgs {
            listen,
            durability: args.nbd_durability,
            default_volume: args.nbd_default_export.clone(),
        },
    )
    .await?;
    println!("node {} serving NBD on {}", node.id(), gateway.addr);
    Ok((gateway, cluster))
}

/// `--join DIR`: the etcd of the local cluster in DIR, and defaults for what was not given.
fn join_defaults(args: &mut NodeArgs, dir: &Path) -> anyhow::Result<()> {
    let Some(file) = crate::clusterfile::read(dir) else {
        bail!(
            "no running `basalt up` in {} (no cluster.json); start one with `basalt up --nodes N \
             --data {}`",
            dir.display(),
            dir.display()
        );
    };
    if file.etcd.is_empty() {
        bail!(
            "the cluster in {} keeps its metadata inside `basalt up` (embedded store): only \
             `basalt up --nodes N` or `basalt up --etcd` clusters take more nodes",
            dir.display()
        );
    }
    if args.etcd.is_empty() {
        args.etcd = file.etcd;
    }
    let data = match &args.data {
        Some(d) => d.clone(),
        None => {
            let k = crate::up_nodes::node_dirs(dir).last().map_or(1, |k| k + 1);
            let d = dir.join(format!("node{k}"));
            std::fs::create_dir_all(&d)
                .with_context(|| format!("cannot create {}", d.display()))?;
            args.data = Some(d.clone());
            d
        }
    };
    if args.name.is_none()
        && let Some(name) = data.file_name().and_then(|n| n.to_str())
    {
        args.name = Some(name.to_string());
    }
    if args.listen.is_none() {
        args.listen = Some("127.0.0.1:0".parse().expect("an address"));
    }
    if args.devices.is_empty() {
        let device = data.join("dev0.img");
        let spec = if device.exists() {
            device.display().to_string()
        } else {
            let size = std::fs::metadata(dir.join("node1").join("dev0.img"))
                .map(|m| m.len())
                .context("cannot read the size of node1's device; pass --device PATH:SIZE")?;
            format!("{}:{size}", device.display())
        };
        args.devices.push(spec);
    }
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
