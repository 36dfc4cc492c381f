//! Node configuration.

use crate::heartbeat::HeartbeatConfig;
use crate::pg::Tuning;
use crate::reports::ReportRules;
use basalt_engine::IoMode;
use basalt_link::{Connector, TcpConnector};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// One device (a file or a block device) the node stores data on.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// File or block device. A missing file is created.
    pub path: PathBuf,
    /// Size of a file to create or extend at format time; `None` = the existing size.
    pub size: Option<u64>,
    /// Device class used by placement rules, e.g. "ssd" or "hdd".
    pub class: String,
    /// Journal size for a new store; `None` = the engine's default.
    pub journal_size: Option<u64>,
    /// Format the device even if it is not blank (it holds a file system, a partition table,
    /// a damaged Basalt store or other data). A valid Basalt store is opened, never
    /// reformatted.
    pub force_format: bool,
    /// Accept a device file its file system cannot preallocate (see
    /// `basalt_engine::FormatOptions::allow_sparse`).
    pub allow_sparse: bool,
    /// Tests: the store lives on this simulated disk instead of `path` (which only names it in
    /// the catalog and logs); formatted when blank. Its faults (`flip_bit`, `fail_writes`, ...)
    /// reach the running node.
    pub sim: Option<basalt_engine::sim::SimDisk>,
    /// Tests: how long the store waits for writes to stop before writing its journal back
    /// (`None`: the engine's default, 2 ms). A long one keeps records in the journal.
    pub writeback_idle: Option<std::time::Duration>,
}

impl DeviceConfig {
    /// A device at `path` with the defaults: its existing size, class "ssd", the default
    /// journal, formatted only if blank.
    pub fn new(path: impl Into<PathBuf>) -> DeviceConfig {
        DeviceConfig {
            path: path.into(),
            size: None,
            class: "ssd".into(),
            journal_size: None,
            force_format: false,
            allow_sparse: false,
            sim: None,
            writeback_idle: None,
        }
    }
}

/// How a node runs.
#[derive(Clone)]
pub struct NodeConfig {
    /// Name shown in status and logs; defaults to the host name.
    pub name: String,
    /// Directory for the node's own small state (its id).
    pub data_dir: PathBuf,
    /// Address of the data-path listener; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Address clients should use, if not `listen` (e.g. behind NAT). Without it an
    /// unspecified listen IP (0.0.0.0, [::]) is advertised as this host's primary address (the
    /// source address of its default route); see `advertise.rs`.
    pub advertise: Option<String>,
    pub devices: Vec<DeviceConfig>,
    /// Object size of newly formatted devices; pools placed on them must use the same size.
    pub object_size: u32,
    pub io: IoMode,
    /// Run each store's I/O loop on an OS thread of its own (`true`), or as a task on the
    /// runtime that serves the node's network (`false`, the default): with a current-thread
    /// runtime a request then runs to completion on one thread, handed from socket to store
    /// and back without waking another thread.
    pub store_threads: bool,
    /// Liveness lease of the node's registration. The node acknowledges data-path requests
    /// only while its lease is confirmed (`lease.rs`).
    pub lease_ttl: Duration,
    /// Lease of its leadership while it leads (the shorter of this and `lease_ttl` is used).
    /// Shorter than the node's lease so that when the leader dies a successor is elected, and
    /// applies the survivors' failure reports on the dead leader, before the dead node's own
    /// lease expires: a kill of the leader then stalls I/O about as long as a kill of another
    /// node. Losing it costs only an election (maps are published by compare-and-swap on the
    /// leadership), unlike the node lease, whose loss fences the node's I/O.
    pub leader_ttl: Duration,
    /// Whether this node may become the leader that computes and publishes cluster maps.
    pub leader_eligible: bool,
    /// While leader: how long a device may be down before it is marked out automatically
    /// (its PGs' `up` sets then move; their data stays where it is until recovery reports it
    /// complete elsewhere).
    pub down_out_interval: Duration,
    /// How the node reaches other nodes (TCP; the simulator plugs in its own network).
    pub connector: Arc<dyn Connector>,
    /// How long one peering or recovery message to another node may take.
    pub peer_timeout: Duration,
    /// How this node pings the other nodes and reports those that do not answer.
    pub heartbeat: HeartbeatConfig,
    /// While leader: when failure reports mark a live node down.
    pub reports: ReportRules,
    /// Recovery and backfill pacing.
    pub tuning: Tuning,
    /// Time between two passes of the collector that removes the objects of deleted volumes
    /// from this node's devices (`collect.rs`); at least 10 ms.
    pub collect_interval: Duration,
    /// Store calls (listings and removals) per second the collector makes at most.
    pub collect_rate: u32,
    /// Bytes of object data per second the background scrub compares (each PG's primary
    /// reads its copy, every member its own; `pg/scrub.rs`); 0 turns it off. Settable at run
    /// time (`AdminRequest::SetScrubRate`, `basalt scrub --background-rate`).
    pub scrub_bytes_per_sec: u64,
    /// A device on which more than this many distinct blocks fail their checksums (or cannot
    /// be read) within `checksum_error_window` is reported down (`faults.rs`); 0: never for
    /// checksum errors.
    /// (A block read again and again counts once: `StoreStats::bad_blocks`.)
    pub checksum_error_limit: u32,
    pub checksum_error_window: Duration,
    /// A device whose oldest I/O in flight has waited longer than this (it hangs without
    /// returning errors: a firmware stall, a dead path) is reported down like a poisoned store
    /// (`faults.rs`), until an operator clears the fault; zero: never for stalls.
    pub device_stall_timeout: Duration,
}

/// The default down-out interval: 10 minutes, like Ceph's `mon_osd_down_out_interval`.
pub const DEFAULT_DOWN_OUT_INTERVAL: Duration = Duration::from_secs(600);

/// The default time between collector passes: 5 minutes.
pub const DEFAULT_COLLECT_INTERVAL: Duration = Duration::from_secs(300);

/// The default pace of the collector: 500 store calls per second.
pub const DEFAULT_COLLECT_RATE: u32 = 500;

/// The default rate of the background scrub: 4 MiB of object data per second per node (a
/// 1 TiB device is compared in about three days).
pub const DEFAULT_SCRUB_RATE: u64 = 4 << 20;

/// The default checksum-error limit: more than 50 errors within 10 minutes mark a device down.
/// Every bad block costs one error before read repair or scrub replaces it, so this is far
/// above a few damaged sectors and well below a drive returning garbage.
pub const DEFAULT_CHECKSUM_ERROR_LIMIT: u32 = 50;

/// The window of the checksum-error limit.
pub const DEFAULT_CHECKSUM_ERROR_WINDOW: Duration = Duration::from_secs(600);

/// The default stall limit: a device whose oldest I/O has waited 10 s is reported down. Far
/// above a healthy device's worst latency (a flush behind a full cache takes well under a
/// second), and well below the client's operation timeout (30 s), so the PG fails over before
/// clients give up.
pub const DEFAULT_DEVICE_STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The default lease of a leadership: about the heartbeat grace (2 s), so that a successor is
/// elected when the survivors' reports on a dead leader are due; etcd's smallest lease with
/// its default timing is 2 s anyway.
pub const DEFAULT_LEADER_TTL: Duration = Duration::from_secs(2);

impl NodeConfig {
    pub fn new(data_dir: impl Into<PathBuf>, listen: SocketAddr) -> NodeConfig {
        NodeConfig {
            name: hostname(),
            data_dir: data_dir.into(),
            listen,
            advertise: None,
            devices: Vec::new(),
            object_size: basalt_types::DEFAULT_OBJECT_SIZE,
            io: IoMode::Auto,
            store_threads: false,
            lease_ttl: Duration::from_secs(4),
            leader_ttl: DEFAULT_LEADER_TTL,
            leader_eligible: true,
            down_out_interval: DEFAULT_DOWN_OUT_INTERVAL,
            connector: Arc::new(TcpConnector),
            peer_timeout: Duration::from_secs(5),
            heartbeat: HeartbeatConfig::default(),
            reports: ReportRules::default(),
            tuning: Tuning::default(),
            collect_interval: DEFAULT_COLLECT_INTERVAL,
            collect_rate: DEFAULT_COLLECT_RATE,
            scrub_bytes_per_sec: DEFAULT_SCRUB_RATE,
            checksum_error_limit: DEFAULT_CHECKSUM_ERROR_LIMIT,
            checksum_error_window: DEFAULT_CHECKSUM_ERROR_WINDOW,
            device_stall_timeout: DEFAULT_DEVICE_STALL_TIMEOUT,
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}
