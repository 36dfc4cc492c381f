//! `basalt up`: a whole single-node cluster in one foreground process — metadata store, a node
//! with one device, a default pool and volume, and the NBD server — that stops cleanly on
//! SIGINT/SIGTERM and serves the same data when started again on the same directory.
//! `basalt up --nodes N` starts a local cluster of N node processes instead (`up_nodes.rs`).

use crate::clusterfile::{self, ClusterFile, NodeEntry};
use anyhow::{Context, bail};
use basalt_client::{Cluster, ClusterConfig, Durability, VolumeOptions};
use basalt_engine::IoMode;
use basalt_meta::{EmbeddedStore, EtcdOptions, EtcdProcess, EtcdStore, MetaStore, PoolSpec};
use basalt_nbd::{CancellationToken, ClusterCatalog, NbdServer, ServerConfig};
use basalt_node::{DeviceConfig, DirLock, Node, NodeConfig};
use basalt_types::size::{format_size, format_size_approx, parse_size};
use clap::{Args, ValueEnum};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Data directory (metadata, device file, node id). Default: ~/.local/share/basalt.
    #[arg(long, env = "BASALT_DATA")]
    pub data: Option<PathBuf>,
    /// Start a local cluster of N node processes (`basalt node`, each with its own device file
    /// in <data>/nodeK/) on a private etcd, instead of one node in this process.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=crate::up_nodes::MAX_NODES as i64),
          conflicts_with_all = ["listen", "device", "etcd_endpoints"])]
    pub nodes: Option<u32>,
    /// With --nodes: copies of every object in the default pool, 1 to 5 (default: 3, or N if
    /// fewer nodes).
    #[arg(long, requires = "nodes", value_parser = clap::value_parser!(u8).range(1..=5))]
    pub replicas: Option<u8>,
    /// With --nodes: devices (files <data>/nodeK/devJ.img) of each node, 1 to 16 (default 1).
    /// Device files a node has beyond this number are used too.
    #[arg(long, requires = "nodes", value_parser = clap::value_parser!(u32).range(1..=16))]
    pub devices_per_node: Option<u32>,
    /// With --nodes: where the default pool's copies go: on different nodes (`host`, the
    /// default), or only on different devices (`device`: with one node of several devices,
    /// replicas 2 is RAID-10-like). Applies when the pool is created (first start).
    #[arg(long, requires = "nodes", value_enum)]
    pub failure_domain: Option<crate::pool::Domain>,
    /// With --nodes: the lease of each node's registration (how long after a node dies its
    /// devices count as down; a node stopped cleanly leaves at once), e.g. 4s (the default).
    #[arg(long, requires = "nodes", value_parser = crate::duration::parse_duration)]
    pub lease_ttl: Option<Duration>,
    /// NBD listen address.
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub nbd: SocketAddr,
    /// Node (data path and admin) listen address; port 0 picks a free port. (With --nodes,
    /// every node listens on 127.0.0.1 with a port chosen by the OS.)
    #[arg(long, default_value = "127.0.0.1:10810")]
    pub listen: SocketAddr,
    /// Device to store data on (file or block device). Default: <data>/devices/dev0.img.
    #[arg(long)]
    pub device: Option<PathBuf>,
    /// Size of a device file created on first start (with --nodes: of each node's). Default:
    /// 16GiB or half the free space (shared by the nodes).
    #[arg(long, value_parser = parse_size)]
    pub device_size: Option<u64>,
    #[command(flatten)]
    pub format: FormatArgs,
    /// Name of the volume created when the cluster has none.
    #[arg(long, default_value = "vol0")]
    pub volume: String,
    /// Size of that volume.
    #[arg(long, value_parser = parse_size, default_value = "4GiB")]
    pub volume_size: u64,
    /// When an acknowledged write is durable: `sync` (on ack) or `flush` (at FLUSH/FUA).
    #[arg(long, default_value = "sync")]
    pub durability: Durability,
    /// I/O backend of the device store.
    #[arg(long, value_enum, default_value = "auto")]
    pub io: IoArg,
    /// Threads of this process (the NBD gateway, and without --nodes the node and its device):
    /// 1 (the default) runs everything on one thread, a request crossing no thread switch;
    /// 0 a thread per core; N that many.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(0..=256))]
    pub threads: u16,
    /// Keep metadata in a private etcd (started under <data>/etcd) instead of the embedded store.
    #[arg(long, conflicts_with = "etcd_endpoints")]
    pub etcd: bool,
    /// Keep metadata in an existing etcd at these endpoints (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,
    /// Placement groups of the default pool, created on first start. Default: 64; with
    /// --nodes, the power of two nearest to 100 copies per device.
    #[arg(long)]
    pub pg_count: Option<u32>,
    /// How long one NBD I/O may wait (restarts, map changes) before it fails with EIO.
    #[arg(long, value_parser = crate::duration::parse_duration, default_value = "30s")]
    pub io_timeout: Duration,
    /// How long a device may be down before it is marked out automatically.
    #[arg(long, value_parser = crate::duration::parse_duration, default_value = "10m")]
    pub down_out_interval: Duration,
    /// Time between passes of the collector that removes the objects of deleted volumes from
    /// this node's devices (in the background, at a low rate), e.g. 5m.
    #[arg(long, value_parser = crate::duration::parse_duration, default_value = "5m")]
    pub collect_interval: Duration,
    /// Bytes of object data per second each node's background scrub compares (every copy of
    /// every object, repairing bad ones), e.g. 4MiB; 0 turns it off.
    #[arg(long, value_parser = crate::scrub::parse_rate, default_value = "4MiB")]
    pub scrub_rate: u64,
    /// With --nodes: serve NBD (on --nbd) from node1's process (`basalt node --nbd`) instead of
    /// from this one: a gateway beside a node, as on a hyperconverged host, whose requests for
    /// node1's placement groups reach its devices in process. The NBD service then lives and
    /// dies with node1 (and runs on node1's threads: --threads does not apply to it).
    #[arg(long, requires = "nodes")]
    pub local_gateway: bool,
    /// With --nodes: one more option for every `basalt node` process, as `basalt node --help`
    /// lists them; repeat for several, e.g. --node-arg=--device-stall-timeout=5s
    /// --node-arg=--heartbeat-grace=1s (not those `up` sets itself: --lease-ttl,
    /// --down-out-interval, --scrub-rate, --io, --etcd, --listen, --device, --data, --name,
    /// and with --local-gateway node1's --nbd options).
    #[arg(
        long = "node-arg",
        value_name = "OPTION",
        allow_hyphen_values = true,
        requires = "nodes"
    )]
    pub node_args: Vec<String>,
}

/// How a device that is not yet a Basalt store may be formatted (shared by `up` and `node`).
#[derive(Args, Debug, Clone, Copy)]
pub struct FormatArgs {
    /// Format the device even if it is not blank: it holds a file system, partition table,
    /// LVM/LUKS/RAID/swap signature, a damaged Basalt store, or any non-zero byte in its first
    /// or last MiB. DESTROYS what it holds. A valid Basalt store is never reformatted.
    #[arg(long)]
    pub force_format: bool,
    /// Accept a device file on a file system that cannot preallocate it (ext2, NFSv3, ...): it
    /// stays sparse, and when the host file system fills up its writes fail and the store stops
    /// accepting writes.
    #[arg(long)]
    pub allow_sparse_device: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum IoArg {
    Auto,
    Uring,
    Psync,
}

impl From<IoArg> for IoMode {
    fn from(a: IoArg) -> IoMode {
        match a {
            IoArg::Auto => IoMode::Auto,
            IoArg::Uring => IoMode::Uring,
            IoArg::Psync => IoMode::Psync,
        }
    }
}

/// The metadata store `up` runs on, and the etcd child that must outlive it.
struct Meta {
    store: Arc<dyn MetaStore>,
    embedded: bool,
    etcd_endpoints: Vec<String>,
    _etcd: Option<EtcdProcess>,
}

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    if let Some(nodes) = args.nodes {
        return crate::up_nodes::run(args, nodes).await;
    }
    // Caught from here on: a SIGTERM during startup stops the cluster cleanly once it is up.
    let mut signals = Signals::new()?;
    let data = args
        .data
        .clone()
        .unwrap_or_else(clusterfile::default_data_dir);
    std::fs::create_dir_all(&data)
        .with_context(|| format!("cannot create the data directory {}", data.display()))?;
    let _lock = lock(&data)?;
    crate::up_nodes::refuse_multi_node_dir(&data)?;
    let meta = open_meta(&args, &data).await?;
    ensure_pool(&meta.store, args.pg_count.unwrap_or(64)).await?;
    let node = start_node(&args, &data, &meta).await?;
    if !node.wait_until_placed(Duration::from_secs(30)).await {
        bail!("the node's device was not placed in a cluster map within 30 s");
    }
    let config = ClusterConfig {
        op_timeout: args.io_timeout,
        ..ClusterConfig::default()
    };
    let cluster = Cluster::connect(meta.store.clone(), config).await?;
    cluster.add_local_node(node.id(), node.service());
    ensure_volume(&cluster, &args).await?;

    let gateway = Gateway::start(&cluster, &GatewayArgs::of(&args)).await?;
    let status = node.status();
    clusterfile::write(
        &data,
        &ClusterFile {
            v: 1,
            pid: std::process::id(),
            node_addr: status.addr.clone(),
            nbd_addr: gateway.addr.to_string(),
            etcd: meta.etcd_endpoints.clone(),
            etcd_pid: meta._etcd.as_ref().and_then(EtcdProcess::pid),
            nodes: vec![NodeEntry {
                id: node.id().0,
                name: status.name.clone(),
                addr: status.addr.clone(),
                data: data.join("node"),
                pid: std::process::id(),
            }],
        },
    )?;
    banner(&cluster, &data, &node, gateway.addr, &args).await?;

    signals.recv().await;
    eprintln!("stopping...");
    gateway.stop().await;
    drop(cluster);
    node.shutdown().await;
    clusterfile::remove(&data);
    eprintln!("stopped; data is kept in {}", data.display());
    Ok(())
}

/// The NBD server of `basalt up` (and of `basalt node --nbd`), serving the cluster's volumes
/// through the client library.
pub(crate) struct Gateway {
    pub(crate) addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), basalt_nbd::NbdError>>,
}

/// What a [`Gateway`] serves, and where.
pub(crate) struct GatewayArgs {
    pub listen: SocketAddr,
    pub durability: Durability,
    /// The volume served under the empty export name.
    pub default_volume: Option<String>,
}

impl GatewayArgs {
    /// `basalt up`'s: on `--nbd`, the empty export name being `--volume`.
    pub(crate) fn of(args: &UpArgs) -> GatewayArgs {
        GatewayArgs {
            listen: args.nbd,
            durability: args.durability,
            default_volume: Some(args.volume.clone()),
        }
    }
}

impl Gateway {
    /// Listens on `args.listen` and serves every volume.
    pub(crate) async fn start(cluster: &Cluster, args: &GatewayArgs) -> anyhow::Result<Gateway> {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("cannot listen for NBD on {}", args.listen))?;
        let addr = listener.local_addr()?;
        let catalog = ClusterCatalog::new(
            cluster.clone(),
            VolumeOptions {
                durability: args.durability,
            },
            args.default_volume.clone(),
        );
        let server = NbdServer::new(Arc::new(catalog), ServerConfig::default());
        let stop = CancellationToken::new();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move { server.serve(listener, stop.cancelled_owned()).await })
        };
        Ok(Gateway { addr, stop, task })
    }

    /// Stops serving and waits for the server to finish.
    pub(crate) async fn stop(self) {
        self.stop.cancel();
        match self.task.await {
            Ok(Err(e)) => tracing::warn!("NBD server: {e}"),
            Err(e) => tracing::warn!("NBD server task: {e}"),
            Ok(Ok(())) => {}
        }
    }
}

async fn open_meta(args: &UpArgs, data: &Path) -> anyhow::Result<Meta> {
    if !args.etcd_endpoints.is_empty() {
        let store = EtcdStore::connect(&args.etcd_endpoints, "")
            .await
            .with_context(|| format!("cannot reach etcd at {}", args.etcd_endpoints.join(",")))?;
        return Ok(Meta {
            store: Arc::new(store),
            embedded: false,
            etcd_endpoints: args.etcd_endpoints.clone(),
            _etcd: None,
        });
    }
    if args.etcd {
        let etcd = EtcdProcess::start_with(EtcdOptions {
            data_dir: Some(data.join("etcd")),
            ..EtcdOptions::default()
        })
        .await
        .context("cannot start etcd (is Debian's etcd-server installed?)")?;
        let endpoint = etcd.endpoint();
        let store = EtcdStore::connect(std::slice::from_ref(&endpoint), "").await?;
        return Ok(Meta {
            store: Arc::new(store),
            embedded: false,
            etcd_endpoints: vec![endpoint],
            _etcd: Some(etcd),
        });
    }
    let path = data.join("meta.redb");
    let store = EmbeddedStore::open(&path)
        .await
        .with_context(|| format!("cannot open the metadata store {}", path.display()))?;
    Ok(Meta {
        store: Arc::new(store),
        embedded: true,
        etcd_endpoints: Vec::new(),
        _etcd: None,
    })
}

/// Creates the pool `default` (one copy, 128 KiB objects) on first start.
async fn ensure_pool(meta: &Arc<dyn MetaStore>, pg_count: u32) -> anyhow::Result<()> {
    let catalog = basalt_meta::Catalog::new(meta.clone());
    if catalog.get_pool_by_name("default").await?.is_none() {
        let mut spec = PoolSpec::new("default");
        spec.replicas = 1;
        spec.pg_count = pg_count;
        catalog.create_pool(&spec).await?;
    }
    Ok(())
}

async fn start_node(args: &UpArgs, data: &Path, meta: &Meta) -> anyhow::Result<Node> {
    let device = args
        .device
        .clone()
        .unwrap_or_else(|| data.join("devices").join("dev0.img"));
    if let Some(parent) = device.parent() {
        std::fs::create_dir_all(parent)?;
    }
    // A block device has its own size; --device-size only sizes a file created on first start.
    let is_block = std::fs::metadata(&device)
        .map(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
        .unwrap_or(false);
    let size = match args.device_size {
        _ if is_block => None,
        Some(s) => Some(s),
        None if !device.exists() => Some(default_device_size(data)?),
        None => None,
    };
    let mut config = NodeConfig::new(data.join("node"), args.listen);
    config.io = args.io.into();
    config.down_out_interval = args.down_out_interval;
    config.collect_interval = args.collect_interval;
    config.scrub_bytes_per_sec = args.scrub_rate;
    config.devices.push(DeviceConfig {
        size,
        force_format: args.format.force_format,
        allow_sparse: args.format.allow_sparse_device,
        ..DeviceConfig::new(device)
    });
    Node::start(config, meta.store.clone(), meta.embedded)
        .await
        .context("cannot start the storage node")
}

/// 16 GiB, or half the free space of the data directory's file system if that is less.
fn default_device_size(data: &Path) -> anyhow::Result<u64> {
    default_device_size_of(data, 1)
}

/// 16 GiB, or half the free space of the data directory's file system shared by `devices`
/// devices if that is less (at least 256 MiB).
pub(crate) fn default_device_size_of(data: &Path, devices: u32) -> anyhow::Result<u64> {
    let free = free_space(data)?;
    let size = (16u64 << 30).min(free / 2 / u64::from(devices.max(1))) & !((1 << 20) - 1);
    if size < 256 << 20 {
        bail!(
            "only {} free in {}; free some space or pass --device-size",
            format_size_approx(free),
            data.display()
        );
    }
    Ok(size)
}

fn free_space(path: &Path) -> anyhow::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: `c` is a valid NUL-terminated path and `st` a properly sized out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error()).context("statvfs");
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Creates the default volume if the cluster has no volume at all.
pub(crate) async fn ensure_volume(cluster: &Cluster, args: &UpArgs) -> anyhow::Result<()> {
    if cluster.list_volumes().await?.is_empty() {
        cluster
            .create_volume(&args.volume, args.volume_size, "default")
            .await
            .with_context(|| format!("cannot create the default volume {}", args.volume))?;
    }
    Ok(())
}

async fn banner(
    cluster: &Cluster,
    data: &Path,
    node: &Node,
    nbd: SocketAddr,
    args: &UpArgs,
) -> anyhow::Result<()> {
    let st = node.status();
    println!("Basalt is up (single node, data in {}).", data.display());
    for d in &st.devices {
        println!(
            "  device {}: {} capacity, {} used, {} I/O",
            d.id,
            format_size_approx(d.capacity_bytes),
            format_size_approx(d.used_bytes),
            d.io_backend
        );
    }
    print_durability(args);
    println!("  node: {}   map epoch: {}", st.addr, st.epoch.0);
    print_exports(cluster, nbd).await?;
    println!("Stop with Ctrl-C.");
    Ok(())
}

/// What an acknowledged write means with `--durability`.
pub(crate) fn print_durability(args: &UpArgs) {
    println!(
        "  durability: {} (every acknowledged write is {})",
        args.durability,
        match args.durability {
            Durability::Sync => "on stable storage",
            Durability::Flush => "on stable storage after the next FLUSH or FUA",
        }
    );
}

/// The NBD exports and how to try them.
pub(crate) async fn print_exports(cluster: &Cluster, nbd: SocketAddr) -> anyhow::Result<()> {
    let volumes = cluster.list_volumes().await?;
    println!("NBD exports:");
    for v in &volumes {
        println!("  nbd://{nbd}/{}  ({})", v.name, format_size(v.size));
    }
    if let Some(v) = volumes.first() {
        println!("Try:");
        println!("  nbdinfo nbd://{nbd}/{}", v.name);
        println!(
            "  fio --name=try --ioengine=nbd --uri=nbd://{nbd}/{} --rw=randrw --bs=4k --iodepth=32 --runtime=10 --time_based",
            v.name
        );
    }
    Ok(())
}

/// SIGINT (Ctrl-C) and SIGTERM, caught from the moment this is made (until then they end the
/// process).
pub(crate) struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn new() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            int: signal(SignalKind::interrupt()).context("SIGINT handler")?,
            term: signal(SignalKind::terminate()).context("SIGTERM handler")?,
        })
    }

    /// Waits for the next SIGINT or SIGTERM.
    pub(crate) async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

pub async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Locks `<data>` (through `<data>/basalt.lock`, the same lock every node takes on its own
/// directory) for the life of the process, so that two `basalt up` never share a directory.
pub(crate) fn lock(data: &Path) -> anyhow::Result<DirLock> {
    basalt_node::lock_dir(data).map_err(|e| {
        anyhow::anyhow!(
            "another basalt process is using {}: {e}; stop it first or pass another --data",
            data.display()
        )
    })
}
