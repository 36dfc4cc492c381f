//! `basalt bench` arguments: options shared by every profile ([`CommonArgs`]) and one subcommand
//! per profile ([`ProfileCmd`]). Defaults are sized for a 2-core machine.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// `basalt bench`: measure a cluster (or any NBD export, or a Ceph pool) with fio and write a report.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub profile: ProfileCmd,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// The profiles.
#[derive(Debug, Clone, Subcommand)]
pub enum ProfileCmd {
    /// A few minutes: baselines, a small matrix, latency vs load, autotune (its output goes in the README).
    Quick(QuickArgs),
    /// Every profile below with defaults (about 50 minutes here with --runtime 10 --ramp 3).
    Full,
    /// Only the raw limits: disk (O_DIRECT) and network (TCP probe).
    Baseline,
    /// simplyblock's matrix: 4K/128K x random/sequential x read/write mixes (Tables 1-8).
    Matrix(MatrixArgs),
    /// simplyblock's max IOPS within a latency target, by volumes and by IO depth.
    LatencyTarget(LatencyTargetArgs),
    /// StorPool's latency vs load: QD 1 upward until latency passes a limit; optional cost line.
    LatencyLoad(LatencyLoadArgs),
    /// Curvine's thread sweep: 256K sequential and random read from 1 to N jobs.
    Threads(ThreadsArgs),
    /// The RAID review's mix sweep: 0-100% reads in 10% steps at several queue depths.
    Mix(MixArgs),
    /// MinIO's autotune: raise concurrency until throughput stops growing.
    Autotune(AutotuneArgs),
    /// Basalt vs `nbdkit file` vs raw file (io_uring O_DIRECT), seven jobs, one run.
    Compare(CompareArgs),
    /// A local replicated cluster (`basalt up --nodes 3`: 3 copies, one disk) beside single-node
    /// Basalt and `nbdkit memory` (and Ceph with --ceph-conf): compare's seven jobs, one run.
    Cluster(ClusterArgs),
}

/// Options of every profile.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// NBD URI of an already running Basalt volume (repeat for more volumes). Without it, the bench
    /// starts a local single-node cluster with `basalt up`.
    #[arg(long = "uri", global = true)]
    pub uris: Vec<String>,
    /// PID of a server process of --uri, for CPU per IO (repeatable).
    #[arg(long = "server-pid", global = true)]
    pub server_pids: Vec<u32>,
    /// The basalt binary used to start a local cluster (default: this executable).
    #[arg(long, global = true)]
    pub basalt_bin: Option<PathBuf>,
    /// Name of the main target in the report.
    #[arg(long, global = true, default_value = "basalt")]
    pub label: String,
    /// Volume size for what the bench creates (local cluster volumes, nbdkit and raw files).
    #[arg(long, global = true, default_value = "1GiB")]
    pub size: String,
    /// Device file of a cluster the bench starts (default: room for every volume the run
    /// creates, fully written, plus a quarter and 1 GiB; the journal is 1/32 of the device).
    #[arg(long, global = true)]
    pub device_size: Option<String>,
    /// Durability mode of the target, as the report should state it.
    #[arg(long, global = true)]
    pub durability: Option<String>,
    /// A peer NBD export to run beside the target in every profile.
    #[arg(long = "peer-uri", global = true)]
    pub peer_uris: Vec<String>,
    /// PID of the peer's server (repeatable).
    #[arg(long = "peer-pid", global = true)]
    pub peer_pids: Vec<u32>,
    #[arg(long, global = true, default_value = "peer")]
    pub peer_label: String,
    /// Also run every profile against `nbdkit file` on a file of --size on the same disk.
    #[arg(long, global = true)]
    pub peer_nbdkit: bool,
    /// ceph.conf of a Ceph cluster: adds an RBD peer (fio ioengine=rbd) in every profile.
    #[arg(long, global = true)]
    pub ceph_conf: Option<PathBuf>,
    #[arg(long, global = true, default_value = "rep3")]
    pub rbd_pool: String,
    /// RBD image(s) of the peer, one per volume.
    #[arg(long = "rbd-image", global = true)]
    pub rbd_images: Vec<String>,
    /// Output directory (default ./bench-results/<time>-<profile>).
    #[arg(long, global = true)]
    pub out: Option<PathBuf>,
    /// Where data files and the local cluster live (default: the system temp dir).
    #[arg(long, global = true)]
    pub scratch: Option<PathBuf>,
    /// Measured seconds per step (default: 3 for quick, 10 otherwise).
    #[arg(long, global = true)]
    pub runtime: Option<f64>,
    /// Warm-up seconds per step, excluded from the numbers (default: 1 for quick, 3 otherwise).
    #[arg(long, global = true)]
    pub ramp: Option<f64>,
    /// Skip the disk and network baselines (results are then not shown as fractions of a limit).
    #[arg(long, global = true)]
    pub no_baseline: bool,
    /// Skip writing each volume once before measuring it.
    #[arg(long, global = true)]
    pub no_precondition: bool,
    /// Seconds of the network throughput probe.
    #[arg(long, global = true, default_value_t = 2.0)]
    pub net_seconds: f64,
    /// Other processes may use at most this % of one core during a step.
    #[arg(long, global = true, default_value_t = 15.0)]
    pub quiet_max_pct: f64,
    /// Wait at most this long (s) for the machine to go quiet before a step; 0 = do not wait.
    #[arg(long, global = true, default_value_t = 60.0)]
    pub quiet_timeout: f64,
    /// The server counts as settled below this % of one core.
    #[arg(long, global = true, default_value_t = 20.0)]
    pub settle_max_pct: f64,
    /// Wait at most this long (s) for the server to settle before a step; 0 = do not wait.
    #[arg(long, global = true, default_value_t = 30.0)]
    pub settle_timeout: f64,
    /// Attempts per step when other processes disturbed it.
    #[arg(long, global = true, default_value_t = 3)]
    pub attempts: u32,
    /// No progress bars (per-step lines are still printed).
    #[arg(long, global = true)]
    pub no_progress: bool,
    /// The fio binary.
    #[arg(long, global = true, default_value = "fio")]
    pub fio: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct QuickArgs {
    /// Also run the compare profile (adds nbdkit and raw-file columns).
    #[arg(long)]
    pub with_compare: bool,
}

#[derive(Debug, Clone, Args)]
pub struct MatrixArgs {
    #[arg(long, default_value_t = 2)]
    pub jobs: u32,
    #[arg(long, default_value_t = 32)]
    pub iodepth: u32,
    /// Block sizes, comma-separated.
    #[arg(long, default_value = "4k,128k")]
    pub bs: String,
    /// Read percentages, comma-separated, in table order.
    #[arg(long, default_value = "100,0,30,70,50")]
    pub mixes: String,
}

#[derive(Debug, Clone, Args)]
pub struct LatencyTargetArgs {
    #[arg(long, default_value_t = 300.0)]
    pub read_target_us: f64,
    #[arg(long, default_value_t = 500.0)]
    pub write_target_us: f64,
    /// mean, or a percentile such as p99.
    #[arg(long, default_value = "mean")]
    pub stat: String,
    #[arg(long, default_value = "1,2,4")]
    pub volumes: String,
    /// IO depth per job in the by-volumes sweep.
    #[arg(long, default_value_t = 32)]
    pub volume_iodepth: u32,
    #[arg(long, default_value = "4,8,16,32,64,128")]
    pub iodepths: String,
    /// Volumes in the by-IO-depth sweep (default: the largest of --volumes).
    #[arg(long)]
    pub iodepth_volumes: Option<usize>,
    #[arg(long, default_value_t = 1)]
    pub jobs: u32,
    /// Bisection steps of the offered rate when the unthrottled run misses the target.
    #[arg(long, default_value_t = 4)]
    pub bisect: u32,
}

#[derive(Debug, Clone, Args)]
pub struct LatencyLoadArgs {
    #[arg(long, default_value_t = 1000.0)]
    pub limit_us: f64,
    #[arg(long, default_value = "mean")]
    pub stat: String,
    #[arg(long, default_value_t = 128)]
    pub max_qd: u32,
    /// 4K random workloads as read percentages (100 = read, 0 = write).
    #[arg(long, default_value = "100,0,70")]
    pub workloads: String,
    #[arg(long, default_value_t = 1)]
    pub jobs: u32,
    /// Price of the system under test (enables the cost table).
    #[arg(long)]
    pub cost_price: Option<f64>,
    #[arg(long, default_value = "USD")]
    pub cost_currency: String,
    /// Period the price covers, months.
    #[arg(long, default_value_t = 36.0)]
    pub cost_months: f64,
    /// Usable capacity in GB for cost per GB.
    #[arg(long)]
    pub usable_gb: Option<f64>,
}

#[derive(Debug, Clone, Args)]
pub struct ThreadsArgs {
    /// Up to this many jobs (1, 2, 4, ...); the seed went to 128.
    #[arg(long, default_value_t = 32)]
    pub max_jobs: u32,
    #[arg(long, default_value = "256k")]
    pub bs: String,
    #[arg(long, default_value_t = 1)]
    pub iodepth: u32,
}

#[derive(Debug, Clone, Args)]
pub struct MixArgs {
    /// Total queue depths; the seed used 8,64,512.
    #[arg(long, default_value = "8,64")]
    pub queue_depths: String,
    #[arg(long, default_value_t = 2)]
    pub jobs: u32,
    #[arg(long, default_value_t = 10)]
    pub step: u8,
}

#[derive(Debug, Clone, Args)]
pub struct AutotuneArgs {
    #[arg(long, default_value = "4k")]
    pub bs: String,
    /// random or sequential.
    #[arg(long, default_value = "random")]
    pub pattern: String,
    /// Read percentages to tune separately.
    #[arg(long, default_value = "100,0")]
    pub workloads: String,
    #[arg(long, default_value_t = 256)]
    pub max_concurrency: u32,
    #[arg(long, default_value_t = 4)]
    pub max_jobs: u32,
    /// Growth below this fraction counts as none.
    #[arg(long, default_value_t = 0.05)]
    pub min_gain: f64,
    #[arg(long, default_value_t = 2)]
    pub patience: usize,
}

#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// Leave out the `nbdkit file` column.
    #[arg(long)]
    pub no_nbdkit: bool,
}

#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// Node processes of the replicated cluster (`basalt up --nodes N`).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..=64))]
    pub nodes: u32,
    /// Copies in its pool (default: `basalt up`'s, 3 or N if fewer).
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=5))]
    pub replicas: Option<u8>,
    /// Also run the cluster with its NBD gateway in node1's process (`basalt up --nodes N
    /// --local-gateway`: node1's placement groups reached in process) as the first column,
    /// the cluster with the gateway in `up` moving to the last.
    #[arg(long)]
    pub local_gateway: bool,
    /// Leave out the single-node Basalt column.
    #[arg(long)]
    pub no_single: bool,
    /// Leave out the `nbdkit memory` column.
    #[arg(long)]
    pub no_nbdkit: bool,
    /// Run only these of compare's jobs, comma-separated (e.g. randwrite-4k-qd64,randread-4k-qd1).
    #[arg(long)]
    pub only: Option<String>,
}

#[derive(Debug, Parser)]
struct Wrap<T: Args> {
    #[command(flatten)]
    inner: T,
}

/// The defaults of a profile's arguments (used by `full`).
pub fn defaults<T: Args>() -> Result<T, crate::error::BenchError> {
    Wrap::<T>::try_parse_from(["bench"])
        .map(|w| w.inner)
        .map_err(|e| {
            crate::error::BenchError::InvalidOption(format!("profile defaults do not parse: {e}"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[derive(Debug, Parser)]
    struct Top {
        #[command(flatten)]
        bench: BenchArgs,
    }

    #[test]
    fn cli_is_consistent_and_common_options_go_anywhere() {
        Top::command().debug_assert();
        let t = Top::try_parse_from([
            "bench",
            "matrix",
            "--jobs",
            "4",
            "--runtime",
            "2",
            "--uri",
            "nbd://x/",
        ])
        .expect("parses");
        assert!(matches!(
            t.bench.profile,
            ProfileCmd::Matrix(MatrixArgs { jobs: 4, .. })
        ));
        assert_eq!(t.bench.common.runtime, Some(2.0));
        assert_eq!(t.bench.common.uris, vec!["nbd://x/".to_string()]);
        let d: LatencyTargetArgs = defaults().expect("defaults parse");
        assert_eq!(
            (d.read_target_us, d.write_target_us, d.stat.as_str()),
            (300.0, 500.0, "mean")
        );
    }
}
