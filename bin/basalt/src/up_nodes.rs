//! `basalt up --nodes N`: a local cluster of N storage node processes on one machine, for
//! trying replication and failures with one command. This process starts its own etcd
//! (`EtcdProcess`, on loopback ports chosen by the OS, data in `<data>/etcd`), then N
//! `basalt node` children (`<data>/nodeK/`: the node's id, lock, log and device files
//! `dev0.img`.. (`--devices-per-node`); each listens on 127.0.0.1 with a port chosen by the OS
//! and may lead), waits until
//! every node is registered, creates the default pool and volume on first start, serves NBD
//! through the client library (with `--local-gateway` node1 serves it: `basalt node --nbd`)
//! and writes `<data>/cluster.json` for the CLI.
//!
//! Ctrl-C / SIGTERM stops the gateway, then every node (SIGTERM: each leaves the cluster at once;
//! with `--local-gateway` node1 first, waited for, then the others), then etcd. Every child gets
//! SIGTERM from the kernel when this process dies, however it dies (`children.rs`). A child that
//! dies while `up` runs is reported and not restarted: its devices go down once its lease expires,
//! like a crashed host's. Started again on the same directory, the cluster serves the same data
//! (same node ids, same devices). A node added with `basalt node --join <data>` (`node_cmd.rs`)
//! gets the next `nodeK` directory, so a later `up --nodes K` starts it with the others.

use crate::children::{self, Supervised};
use crate::clusterfile::{self, ClusterFile, NodeEntry};
use crate::up::{self, Gateway, GatewayArgs, Signals, UpArgs};
use anyhow::{Context, bail};
use basalt_client::{Cluster, ClusterConfig, Durability};
use basalt_meta::{
    Catalog, EtcdOptions, EtcdProcess, EtcdStore, FailureDomain, MAX_PG_COUNT, MetaStore,
    PoolRecord, PoolSpec,
};
use basalt_types::NodeId;
use basalt_types::size::format_size_approx;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;
use tokio::sync::oneshot;

/// Most nodes `up --nodes` starts.
pub const MAX_NODES: u32 = 64;
/// PG copies each device should hold: the default PG count gives about this many.
const PG_COPIES_PER_DEVICE: u32 = 100;
/// How long the nodes may take to start (format their devices, register).
const START_LIMIT: Duration = Duration::from_secs(120);
/// How long the default pool may take to be placed once the nodes are registered.
const PLACE_LIMIT: Duration = Duration::from_secs(60);
/// How long a node may take to leave after SIGTERM before it is killed.
const NODE_STOP_LIMIT: Duration = Duration::from_secs(30);
/// How long etcd may take to stop after SIGTERM before it is killed.
const ETCD_STOP_LIMIT: Duration = Duration::from_secs(10);
/// How long to wait for processes of a previous `up` on this directory to finish leaving.
const LEFTOVER_LIMIT: Duration = Duration::from_secs(30);
/// A node's default lease.
const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(4);

/// One `basalt node` child.
struct NodeChild {
    name: String,
    dir: PathBuf,
    devices: Vec<PathBuf>,
    id: NodeId,
    proc: Supervised,
    /// Its data-path address, once it printed that it serves (it is registered then).
    ready: Option<oneshot::Receiver<String>>,
    addr: String,
    /// Its NBD address once it printed it (a node started with `--nbd`: `--local-gateway`).
    nbd: Option<oneshot::Receiver<String>>,
}

/// What runs once the cluster is up.
struct Running {
    cluster: Cluster,
    /// The gateway in this process; `None` with `--local-gateway` (node1 serves NBD).
    gateway: Option<Gateway>,
    nbd_addr: SocketAddr,
    pool: PoolRecord,
}

pub async fn run(args: UpArgs, count: u32) -> anyhow::Result<()> {
    let data = args
        .data
        .clone()
        .unwrap_or_else(clusterfile::default_data_dir);
    std::fs::create_dir_all(&data)
        .with_context(|| format!("cannot create the data directory {}", data.display()))?;
    let _lock = up::lock(&data)?;
    refuse_single_node_dir(&data)?;
    let per_node = args.devices_per_node.unwrap_or(1);
    let domain = match args.failure_domain {
        Some(crate::pool::Domain::Device) => FailureDomain::Device,
        _ => FailureDomain::Host,
    };
    let replicas = replicas(args.replicas, count, per_node, domain)?;
    let mut signals = Signals::new()?;
    wait_for_leftovers(&data).await?;
    let mut etcd = EtcdProcess::start_with(EtcdOptions {
        data_dir: Some(data.join("etcd")),
        stop_with_parent: true,
        ..EtcdOptions::default()
    })
    .await
    .context("cannot start etcd (is Debian's etcd-server installed?)")?;
    let mut nodes = Vec::new();
    let started = tokio::select! {
        r = start(&args, &data, (count, per_node), (replicas, domain), &etcd, &mut nodes) => Some(r),
        _ = signals.recv() => None,
    };
    let outcome = match started {
        Some(Ok(running)) => serve(&args, &data, &etcd, &nodes, running, &mut signals).await,
        Some(Err(e)) => Err(e),
        None => Ok(()),
    };
    eprintln!("stopping...");
    stop_nodes(nodes, args.local_gateway).await;
    if let Err(e) = etcd.stop(ETCD_STOP_LIMIT).await {
        tracing::warn!("stopping etcd: {e}");
    }
    clusterfile::remove(&data);
    if outcome.is_ok() {
        eprintln!("stopped; data is kept in {}", data.display());
    }
    outcome
}

/// Starts the nodes, waits until they are registered, creates the default pool and volume if
/// missing, waits until the pool is placed, and starts the gateway.
async fn start(
    args: &UpArgs,
    data: &Path,
    (count, per_node): (u32, u32),
    (replicas, domain): (u8, FailureDomain),
    etcd: &EtcdProcess,
    nodes: &mut Vec<NodeChild>,
) -> anyhow::Result<Running> {
    let endpoint = etcd.endpoint();
    let store: Arc<dyn MetaStore> = Arc::new(
        EtcdStore::connect(std::slice::from_ref(&endpoint), "")
            .await
            .with_context(|| format!("cannot reach the cluster's etcd at {endpoint}"))?,
    );
    // The default size is computed only when a device file is missing (first start).
    let missing = (1..=count).any(|k| {
        device_paths(&data.join(format!("node{k}")), per_node)
            .iter()
            .any(|d| !d.exists())
    });
    let size = match args.device_size {
        Some(s) => s,
        None if missing => up::default_device_size_of(data, count * per_node)?,
        None => 0,
    };
    warn_unstarted(data, count);
    for k in 1..=count {
        nodes.push(start_node(args, data, k, per_node, &endpoint, size).await?);
    }
    for node in nodes.iter_mut() {
        wait_ready(node).await?;
    }
    let node_nbd = match nodes.first_mut() {
        Some(node1) if args.local_gateway => Some(node_nbd_addr(node1).await?),
        _ => None,
    };
    let catalog = Catalog::new(store.clone());
    let pool = ensure_pool(&catalog, args, count * per_node, (replicas, domain)).await?;
    let config = ClusterConfig {
        op_timeout: args.io_timeout,
        ..ClusterConfig::default()
    };
    let cluster = Cluster::connect(store, config).await?;
    cluster
        .wait_for_pool(pool.id, PLACE_LIMIT)
        .await
        .with_context(|| {
            format!(
                "the placement groups of pool {} were not all placed within {PLACE_LIMIT:?}",
                pool.name
            )
        })?;
    up::ensure_volume(&cluster, args).await?;
    let (gateway, nbd_addr) = match node_nbd {
        Some(addr) => (None, addr),
        None => {
            let gateway = Gateway::start(&cluster, &GatewayArgs::of(args)).await?;
            let addr = gateway.addr;
            (Some(gateway), addr)
        }
    };
    Ok(Running {
        cluster,
        gateway,
        nbd_addr,
        pool,
    })
}

/// The NBD address node1 printed (`--local-gateway`).
async fn node_nbd_addr(node: &mut NodeChild) -> anyhow::Result<SocketAddr> {
    let rx = node.nbd.take().context("node1 was started without --nbd")?;
    match tokio::time::timeout(START_LIMIT, rx).await {
        Ok(Ok(addr)) => addr
            .parse()
            .with_context(|| format!("{} printed a bad NBD address {addr:?}", node.name)),
        Ok(Err(_)) => {
            // Its stdout closed: it exited. Give the reaper a moment to record how.
            let _ = tokio::time::timeout(Duration::from_secs(5), node.proc.exited()).await;
            check_alive(&node.proc, &node.dir)?;
            bail!(
                "{} closed its output before serving NBD; see {}",
                node.name,
                node.dir.join("node.log").display()
            )
        }
        Err(_) => bail!(
            "{} did not serve NBD within {START_LIMIT:?}; see {}",
            node.name,
            node.dir.join("node.log").display()
        ),
    }
}

/// Writes cluster.json, prints the banner, serves until a signal, stops the gateway.
async fn serve(
    args: &UpArgs,
    data: &Path,
    etcd: &EtcdProcess,
    nodes: &[NodeChild],
    running: Running,
    signals: &mut Signals,
) -> anyhow::Result<()> {
    let entries: Vec<NodeEntry> = nodes
        .iter()
        .map(|n| NodeEntry {
            id: n.id.0,
            name: n.name.clone(),
            addr: n.addr.clone(),
            data: n.dir.clone(),
            pid: n.proc.pid,
        })
        .collect();
    clusterfile::write(
        data,
        &ClusterFile {
            v: 1,
            pid: std::process::id(),
            node_addr: entries.first().map(|e| e.addr.clone()).unwrap_or_default(),
            nbd_addr: running.nbd_addr.to_string(),
            etcd: vec![etcd.endpoint()],
            etcd_pid: etcd.pid(),
            nodes: entries,
        },
    )?;
    banner(args, data, etcd, nodes, &running).await?;
    signals.recv().await;
    if let Some(gateway) = running.gateway {
        gateway.stop().await;
    }
    drop(running.cluster);
    Ok(())
}

/// The default pool's copies: `--replicas`, else 3, or fewer with fewer failure domains.
/// Copies go to different hosts (here: nodes), or with failure domain `device` to different
/// devices, so there cannot be more copies than those.
fn replicas(
    asked: Option<u8>,
    nodes: u32,
    per_node: u32,
    domain: FailureDomain,
) -> anyhow::Result<u8> {
    let domains = match domain {
        FailureDomain::Host => nodes,
        FailureDomain::Device => nodes * per_node,
    };
    let r = asked.unwrap_or(u8::try_from(domains.min(3)).expect("at most 3"));
    if u32::from(r) > domains {
        match domain {
            FailureDomain::Host => bail!(
                "--replicas {r} needs at least {r} nodes (every copy on another node); pass \
                 --nodes {r}, fewer --replicas, or --failure-domain device with enough \
                 --devices-per-node"
            ),
            FailureDomain::Device => bail!(
                "--replicas {r} needs at least {r} devices (every copy on another device); \
                 pass more --nodes or --devices-per-node, or fewer --replicas"
            ),
        }
    }
    Ok(r)
}

/// The power of two nearest to [`PG_COPIES_PER_DEVICE`] copies per device.
fn default_pg_count(devices: u32, replicas: u8) -> u32 {
    let target = f64::from(PG_COPIES_PER_DEVICE) * f64::from(devices) / f64::from(replicas);
    let exp = target.max(1.0).log2().round();
    // `exp` is at most log2(100 * MAX_NODES) < 13.
    (1u32 << exp as u32).min(MAX_PG_COUNT)
}

/// Creates pool `default` on first start (copies on different nodes, or devices with
/// `--failure-domain device`; `min_size` the pool code's default); an existing one is kept as
/// it is.
async fn ensure_pool(
    catalog: &Catalog,
    args: &UpArgs,
    devices: u32,
    (replicas, domain): (u8, FailureDomain),
) -> anyhow::Result<PoolRecord> {
    if let Some(pool) = catalog.get_pool_by_name("default").await? {
        if args.replicas.is_some_and(|r| r != pool.replicas) {
            eprintln!(
                "note: pool default exists with {} copies; --replicas applies to a new data \
                 directory only (or create another pool: basalt pool create)",
                pool.replicas
            );
        }
        return Ok(pool);
    }
    let mut spec = PoolSpec::new("default");
    spec.replicas = replicas;
    spec.failure_domain = domain;
    spec.pg_count = args
        .pg_count
        .unwrap_or_else(|| default_pg_count(devices, replicas));
    Ok(catalog.create_pool(&spec).await?)
}

/// Starts `basalt node` number `k`. On a new directory it waits until the node has its id, so
/// that ids follow the order of the nodes.
async fn start_node(
    args: &UpArgs,
    data: &Path,
    k: u32,
    per_node: u32,
    endpoint: &str,
    size: u64,
) -> anyhow::Result<NodeChild> {
    let name = format!("node{k}");
    let dir = data.join(&name);
    wait_dir_free(&dir).await?;
    let devices = device_paths(&dir, per_node);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("node.log"))
        .with_context(|| format!("cannot open {}", dir.join("node.log").display()))?;
    let exe = std::env::current_exe().context("cannot find the basalt binary")?;
    let mut cmd = tokio::process::Command::new(exe);
    let ttl = args.lease_ttl.unwrap_or(DEFAULT_LEASE_TTL);
    cmd.args(["node", "--etcd", endpoint, "--name", &name])
        .args(["--listen", "127.0.0.1:0"]);
    for device in &devices {
        cmd.args(["--device", &device_arg(device, size)?]);
    }
    cmd.args(["--io", io_name(args.io)])
        .args(["--lease-ttl", &millis(ttl)])
        .args(["--down-out-interval", &millis(args.down_out_interval)])
        .args(["--scrub-rate", &args.scrub_rate.to_string()])
        .args(&args.node_args)
        .arg("--data")
        .arg(&dir)
        .env_remove("BASALT_ETCD_PREFIX")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log.try_clone()?);
    if args.format.force_format {
        cmd.arg("--force-format");
    }
    if args.format.allow_sparse_device {
        cmd.arg("--allow-sparse-device");
    }
    let gateway = args.local_gateway && k == 1;
    if gateway {
        cmd.args(["--nbd", &args.nbd.to_string()])
            .args(["--nbd-default-export", &args.volume])
            .args(["--nbd-durability", durability_name(args.durability)])
            .args(["--nbd-io-timeout", &millis(args.io_timeout)]);
    }
    let mut proc = children::spawn(&name, cmd).with_context(|| format!("cannot start {name}"))?;
    let (ready, nbd) = forward_stdout(&mut proc, log)?;
    let id = wait_node_id(&dir, &proc).await?;
    Ok(NodeChild {
        name,
        dir,
        devices,
        id,
        proc,
        ready: Some(ready),
        addr: String::new(),
        nbd: gateway.then_some(nbd),
    })
}

/// The device files of the node whose directory is `dir`: `dev0.img` .. `dev<per_node - 1>.img`,
/// and any further `devJ.img` it already has (a device is never left out).
pub(crate) fn device_paths(dir: &Path, per_node: u32) -> Vec<PathBuf> {
    let mut count = per_node.max(1);
    while dir.join(format!("dev{count}.img")).exists() {
        count += 1;
    }
    (0..count)
        .map(|j| dir.join(format!("dev{j}.img")))
        .collect()
}

/// `--device` of a node: the file, with the size to create it with on first start.
fn device_arg(device: &Path, size: u64) -> anyhow::Result<String> {
    let path = device.display().to_string();
    if path.contains(':') {
        bail!("the data directory's path must not contain ':' ({path}); pass another --data");
    }
    Ok(if device.exists() {
        path
    } else {
        format!("{path}:{size}")
    })
}

/// Copies the node's stdout to its log; the receivers get the data-path address it prints when
/// it serves, and the NBD address it prints when it serves NBD (`--nbd`).
fn forward_stdout(
    proc: &mut Supervised,
    mut log: std::fs::File,
) -> anyhow::Result<(oneshot::Receiver<String>, oneshot::Receiver<String>)> {
    let stdout = proc
        .take_stdout()
        .context("the node's stdout is not piped")?;
    let (tx, rx) = oneshot::channel();
    let (nbd_tx, nbd_rx) = oneshot::channel();
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let (mut tx, mut nbd_tx) = (Some(tx), Some(nbd_tx));
        while let Ok(Some(line)) = lines.next_line().await {
            for (marker, tx) in [(" serving on ", &mut tx), (" serving NBD on ", &mut nbd_tx)] {
                if let Some(addr) = line.split(marker).nth(1)
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(addr.trim().to_string());
                }
            }
            let _ = std::io::Write::write_all(&mut log, format!("{line}\n").as_bytes());
        }
    });
    Ok((rx, nbd_rx))
}

/// Waits for `<dir>/node.id`, which a node writes first thing.
async fn wait_node_id(dir: &Path, proc: &Supervised) -> anyhow::Result<NodeId> {
    let path = dir.join("node.id");
    let deadline = Instant::now() + START_LIMIT;
    loop {
        if let Ok(text) = std::fs::read_to_string(&path)
            && let Ok(id) = text.trim().parse()
        {
            return Ok(NodeId(id));
        }
        check_alive(proc, dir)?;
        if Instant::now() > deadline {
            bail!("{} did not get a node id within {START_LIMIT:?}", proc.name);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the node says it serves (it registered under its lease just before).
async fn wait_ready(node: &mut NodeChild) -> anyhow::Result<()> {
    let ready = node.ready.take().expect("waited for once");
    match tokio::time::timeout(START_LIMIT, ready).await {
        Ok(Ok(addr)) => {
            node.addr = addr;
            Ok(())
        }
        Ok(Err(_)) => {
            // Its stdout closed: it exited. Give the reaper a moment to record how.
            let _ = tokio::time::timeout(Duration::from_secs(5), node.proc.exited()).await;
            check_alive(&node.proc, &node.dir)?;
            bail!("{} closed its output before serving", node.name)
        }
        Err(_) => bail!(
            "{} did not register within {START_LIMIT:?}; see {}",
            node.name,
            node.dir.join("node.log").display()
        ),
    }
}

/// An error with the end of the node's log if it has exited.
fn check_alive(proc: &Supervised, dir: &Path) -> anyhow::Result<()> {
    let Some(status) = proc.exit_status() else {
        return Ok(());
    };
    let log = dir.join("node.log");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(8).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    bail!(
        "{} exited ({}) while starting; {} ends with:\n{}",
        proc.name,
        children::describe(Some(status)),
        log.display(),
        tail.join("\n")
    )
}

/// SIGTERM to every node at once (each leaves the cluster), then waits for all; with
/// `--local-gateway` to node1 first, and waits for it.
async fn stop_nodes(nodes: Vec<NodeChild>, local_gateway: bool) {
    let mut procs: Vec<Supervised> = nodes.into_iter().map(|n| n.proc).collect();
    // The gateway in node1 first, as `up`'s own is stopped before the nodes: its requests in
    // flight finish while the nodes that serve them are still there.
    if local_gateway && !procs.is_empty() {
        let mut node1 = procs.remove(0);
        node1.request_stop(NODE_STOP_LIMIT);
        let name = node1.name.clone();
        let status = node1.wait().await;
        tracing::info!("{name} ended: {}", children::describe(status));
    }
    for p in &mut procs {
        p.request_stop(NODE_STOP_LIMIT);
    }
    for p in procs {
        let name = p.name.clone();
        let status = p.wait().await;
        tracing::info!("{name} ended: {}", children::describe(status));
    }
}

/// A node of a previous `up` on this directory (killed with SIGKILL: its children got SIGTERM)
/// may still be leaving: waits until its directory is free.
async fn wait_dir_free(dir: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + LEFTOVER_LIMIT;
    loop {
        match basalt_node::lock_dir(dir) {
            Ok(lock) => {
                drop(lock);
                return Ok(());
            }
            Err(e) if Instant::now() > deadline => {
                bail!(
                    "{} is still in use after {LEFTOVER_LIMIT:?}: {e}",
                    dir.display()
                )
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Waits until the etcd of a previous `up` on this directory (named in the cluster.json it
/// left) has exited.
async fn wait_for_leftovers(data: &Path) -> anyhow::Result<()> {
    let Some(pid) = clusterfile::read(data).and_then(|f| f.etcd_pid) else {
        return Ok(());
    };
    let deadline = Instant::now() + LEFTOVER_LIMIT;
    while clusterfile::is_running(pid, "etcd") {
        if Instant::now() > deadline {
            bail!(
                "etcd (pid {pid}) of a previous `basalt up` on {} is still running; stop it first",
                data.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The nodeK directories of a data directory, by K.
pub(crate) fn node_dirs(data: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(data) else {
        return Vec::new();
    };
    let mut ks: Vec<u32> = entries
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_prefix("node")?
                .parse()
                .ok()
        })
        .collect();
    ks.sort_unstable();
    ks
}

/// Nodes of an earlier, larger `up --nodes` on this directory are not started: say so.
fn warn_unstarted(data: &Path, count: u32) {
    let extra: Vec<String> = node_dirs(data)
        .into_iter()
        .filter(|k| *k > count)
        .map(|k| format!("node{k}"))
        .collect();
    if !extra.is_empty() {
        eprintln!(
            "note: {} not started (--nodes {count}): their devices are down",
            extra.join(", ")
        );
    }
}

/// `basalt up` without --nodes refuses a directory of `up --nodes` (it would start another,
/// empty cluster beside it).
pub fn refuse_multi_node_dir(data: &Path) -> anyhow::Result<()> {
    let ks = node_dirs(data);
    if let Some(n) = ks.last()
        && !data.join("node").exists()
    {
        bail!(
            "{} holds a cluster of node processes started with `basalt up --nodes {n}`; start \
             it with --nodes {n}, or pass another --data",
            data.display()
        );
    }
    Ok(())
}

/// `basalt up --nodes` refuses the directory of a single-node `basalt up`.
fn refuse_single_node_dir(data: &Path) -> anyhow::Result<()> {
    if data.join("node").exists() || data.join("meta.redb").exists() {
        bail!(
            "{} holds a single-node cluster started with `basalt up` (without --nodes); start \
             it that way, or pass another --data",
            data.display()
        );
    }
    Ok(())
}

fn io_name(io: up::IoArg) -> &'static str {
    match io {
        up::IoArg::Auto => "auto",
        up::IoArg::Uring => "uring",
        up::IoArg::Psync => "psync",
    }
}

fn durability_name(d: Durability) -> &'static str {
    match d {
        Durability::Sync => "sync",
        Durability::Flush => "flush",
    }
}

fn millis(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

async fn banner(
    args: &UpArgs,
    data: &Path,
    etcd: &EtcdProcess,
    nodes: &[NodeChild],
    running: &Running,
) -> anyhow::Result<()> {
    let devices = running.cluster.catalog().list_devices().await?;
    println!(
        "Basalt is up: {} node processes on this machine, data in {}.",
        nodes.len(),
        data.display()
    );
    for n in nodes {
        let capacity: u64 = devices
            .iter()
            .filter(|d| d.node == n.id)
            .map(|d| d.capacity)
            .sum();
        let paths: Vec<String> = n.devices.iter().map(|d| d.display().to_string()).collect();
        println!(
            "  {} ({}): pid {}, listening on {}, device{} {} ({}), log {}",
            n.name,
            n.id,
            n.proc.pid,
            n.addr,
            if paths.len() == 1 { "" } else { "s" },
            paths.join(", "),
            format_size_approx(capacity),
            n.dir.join("node.log").display()
        );
    }
    println!(
        "  etcd: {} (pid {}), data in {}",
        etcd.endpoint(),
        etcd.pid().unwrap_or(0),
        etcd.data_dir().display()
    );
    let p = &running.pool;
    println!(
        "  pool {}: {} cop{} (min_size {}), {} PGs, copies on different {}",
        p.name,
        p.replicas,
        if p.replicas == 1 { "y" } else { "ies" },
        p.min_size,
        p.pg_count,
        match p.failure_domain {
            FailureDomain::Host => "nodes",
            FailureDomain::Device => "devices",
        }
    );
    up::print_durability(args);
    if args.local_gateway
        && let Some(n) = nodes.first()
    {
        println!(
            "  NBD gateway in {} (pid {}): a request for its placement groups reaches its \
             device in process; the gateway stops with it",
            n.name, n.proc.pid
        );
    }
    up::print_exports(&running.cluster, running.nbd_addr).await?;
    println!("  basalt status --data {}", data.display());
    if let Some(n) = nodes.last() {
        println!(
            "  kill -9 {}    # a node failure: `basalt status` shows it down",
            n.proc.pid
        );
    }
    println!("Stop with Ctrl-C.");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_pg_count_gives_about_a_hundred_copies_per_device() {
        assert_eq!(default_pg_count(3, 3), 128);
        assert_eq!(default_pg_count(3, 1), 256);
        assert_eq!(default_pg_count(1, 1), 128);
        assert_eq!(default_pg_count(5, 3), 128);
        assert_eq!(default_pg_count(10, 3), 256);
        assert_eq!(default_pg_count(64, 1), 8192);
    }

    #[test]
    fn replicas_default_to_three_and_never_exceed_the_nodes() {
        let host = FailureDomain::Host;
        assert_eq!(replicas(None, 5, 1, host).unwrap(), 3);
        assert_eq!(replicas(None, 2, 1, host).unwrap(), 2);
        assert_eq!(replicas(None, 1, 1, host).unwrap(), 1);
        assert_eq!(replicas(Some(1), 3, 1, host).unwrap(), 1);
        let e = replicas(Some(3), 2, 4, host).unwrap_err().to_string();
        assert!(e.contains("--replicas 3 needs at least 3 nodes"), "{e}");
        // Copies on different devices: one node of several devices holds them all.
        let device = FailureDomain::Device;
        assert_eq!(replicas(None, 1, 2, device).unwrap(), 2);
        assert_eq!(replicas(Some(2), 1, 3, device).unwrap(), 2);
        let e = replicas(Some(3), 1, 2, device).unwrap_err().to_string();
        assert!(e.contains("--replicas 3 needs at least 3 devices"), "{e}");
    }
}
