//! `basalt bench`: the built-in benchmark. It drives real clients (fio `ioengine=nbd` for volumes,
//! `ioengine=rbd` for a Ceph peer, io_uring on a raw file for the local limit) against a running
//! cluster or one it starts, shows progress and per-step results while it runs, and ends with
//! terminal tables, `results.json`, `results.csv`, `plots/*.svg` and one self-contained `report.html`.
//!
//! The flow of one run ([`run`]):
//! 1. [`target`] starts or attaches to the targets: the Basalt volume (or `basalt up` in a temp
//!    dir), peers (`--peer-uri`, `--peer-nbdkit`, `--ceph-conf`), and a raw file for baselines.
//! 2. [`profiles::baseline`] measures the raw limits (disk via fio O_DIRECT, network via [`net`]).
//! 3. The chosen profile ([`profiles`]) plans steps; [`runner::Runner::measure`] runs each one:
//!    quiet/settle checks, a job file ([`job`]), fio ([`fio`]), JSON parsing ([`parse`]), CPU from
//!    `/proc` ([`cpu`]), the fraction of the raw limit ([`baseline`]). Searches live in [`search`].
//! 4. [`report`] renders the [`model::RunReport`] to every format.
//!
//! Start here: [`run`] and [`profiles`]; the report layout is in docs/design/bench.md.

pub mod baseline;
pub mod cli;
pub mod cpu;
pub mod env;
pub mod error;
pub mod fio;
pub mod job;
pub mod model;
pub mod net;
mod netnode;
pub mod parse;
pub mod profiles;
pub mod readback;
pub mod report;
pub mod runner;
pub mod search;
pub mod target;

pub use cli::{BenchArgs, ProfileCmd};
pub use error::BenchError;

use cli::{CommonArgs, defaults};
use job::Pattern;
use model::{RunReport, Section};
use net::{LoopbackProbe, NetProbe};
use runner::{RunOpts, Runner};
use search::{LatStat, LatencyGoal};
use std::path::{Path, PathBuf};
use std::time::Instant;
use target::{LocalCluster, Target, TargetSpec};

/// Runs `basalt bench` with parsed arguments; returns when the report is written.
pub fn run(args: BenchArgs) -> Result<(), BenchError> {
    let dir = run_to_dir(args)?;
    eprintln!("\nreport: {}", dir.join("report.html").display());
    Ok(())
}

/// Like [`run`], and returns the output directory.
pub fn run_to_dir(args: BenchArgs) -> Result<PathBuf, BenchError> {
    let started_at = Instant::now();
    let started = env::unix_now();
    let c = &args.common;
    let name = profile_name(&args.profile);
    let out = c.out.clone().unwrap_or_else(|| {
        PathBuf::from("bench-results").join(format!("{}-{name}", env::utc_compact(started)))
    });
    for d in [out.clone(), out.join("fio"), out.join("logs")] {
        std::fs::create_dir_all(&d)
            .map_err(|e| BenchError::io("creating the output directory", &d, e))?;
    }
    let scratch = c.scratch.clone().unwrap_or_else(std::env::temp_dir);
    let size = basalt_types::size::parse_size(&c.size)
        .map_err(|e| BenchError::InvalidOption(format!("--size: {e}")))?;
    let (runtime, ramp) = match args.profile {
        ProfileCmd::Quick(_) => (c.runtime.unwrap_or(3.0), c.ramp.unwrap_or(1.0)),
        _ => (c.runtime.unwrap_or(10.0), c.ramp.unwrap_or(3.0)),
    };
    if runtime <= 0.0 || ramp < 0.0 {
        return Err(BenchError::InvalidOption(
            "--runtime must be > 0 and --ramp >= 0".into(),
        ));
    }
    let mut env = env::Env::collect(&scratch);
    env.runtime_s = runtime;
    env.ramp_s = ramp;
    env.quiet_max_pct = c.quiet_max_pct;
    env.settle_max_pct = c.settle_max_pct;
    env.client =
        "fio on the same host as the servers, over loopback TCP (NBD) or local io_uring (raw file)"
            .into();
    let extras = extras_of(&args.profile, c)?;
    let device_size = match &c.device_size {
        Some(d) => basalt_types::size::parse_size(d)
            .map_err(|e| BenchError::InvalidOption(format!("--device-size: {e}")))?,
        None => device_size_for(size, volumes_planned(&args.profile)?),
    };
    let targets = start_targets(c, (size, device_size), &scratch, &out.join("logs"), extras)?;
    let raw = targets.iter().position(|t| t.info.kind == "raw-file");
    let opts = RunOpts {
        fio: c.fio.clone(),
        runtime_s: runtime,
        ramp_s: ramp,
        quiet_max_pct: c.quiet_max_pct,
        quiet_timeout_s: c.quiet_timeout,
        settle_max_pct: c.settle_max_pct,
        settle_timeout_s: c.settle_timeout,
        attempts: c.attempts,
        percentiles: percentiles_of(&args.profile),
        precondition: !c.no_precondition,
        progress: !c.no_progress,
    };
    // nbdkit added for `compare` alone is not a peer of the other profiles (--peer-nbdkit makes it one).
    let compare_only = targets
        .iter()
        .position(|t| t.info.kind == "nbdkit-file" && !c.peer_nbdkit);
    let mut r = Runner::new(opts, out.clone(), targets);
    r.raw = raw;
    r.compare_only.extend(compare_only);
    r.say(&format!(
        "basalt bench {name}: {} s per step after {} s warm-up; output in {}",
        runtime,
        ramp,
        out.display()
    ));
    let result = run_profile(&mut r, &args.profile, c);
    r.finish();
    let mut sections = result?;
    if !r.prep.steps.is_empty() {
        let at = usize::from(sections.first().is_some_and(|s| s.id == "baseline"));
        sections.insert(at, prep_section(&r));
    }
    env.targets = r.targets.iter().map(|t| t.info.clone()).collect();
    let report = RunReport {
        format_version: model::FORMAT_VERSION,
        profile: name.to_string(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        started: env::utc_iso(started),
        duration_s: started_at.elapsed().as_secs_f64(),
        env,
        baselines: r.baselines.clone(),
        sections,
        warnings: r.warnings.clone(),
    };
    report::write_all(&report, &out)?;
    println!("{}", report::table::render_run(&report));
    Ok(out)
}

/// The preconditioning steps with a table of how long each fill took.
fn prep_section(r: &Runner) -> Section {
    use profiles::{Metric, cell};
    let mut s = r.prep.clone();
    s.tables.push(model::Table {
        title: "Preconditioning (one sequential 1 MiB write pass, QD16)".into(),
        caption: "Time is wall-clock for the whole pass, including fio start-up.".into(),
        columns: ["target", "volume", "MiB/s", "seconds"]
            .map(String::from)
            .to_vec(),
        rows: s
            .steps
            .iter()
            .map(|st| {
                vec![
                    model::Cell::text(&st.target),
                    model::Cell::text(&st.point),
                    cell(Some(st), Metric::MibS),
                    model::Cell::text(format!("{:.1}", st.wall_s)),
                ]
            })
            .collect(),
    });
    s
}

fn profile_name(p: &ProfileCmd) -> &'static str {
    match p {
        ProfileCmd::Quick(_) => "quick",
        ProfileCmd::Full => "full",
        ProfileCmd::Baseline => "baseline",
        ProfileCmd::Matrix(_) => "matrix",
        ProfileCmd::LatencyTarget(_) => "latency-target",
        ProfileCmd::LatencyLoad(_) => "latency-load",
        ProfileCmd::Threads(_) => "threads",
        ProfileCmd::Mix(_) => "mix",
        ProfileCmd::Autotune(_) => "autotune",
        ProfileCmd::Compare(_) => "compare",
        ProfileCmd::Cluster(_) => "cluster",
    }
}

fn percentiles_of(p: &ProfileCmd) -> Vec<f64> {
    let stat = match p {
        ProfileCmd::LatencyTarget(a) => LatStat::parse(&a.stat).ok(),
        ProfileCmd::LatencyLoad(a) => LatStat::parse(&a.stat).ok(),
        _ => None,
    };
    match stat {
        Some(LatStat::Pct(p)) => vec![p],
        _ => Vec::new(),
    }
}

/// Most volumes any step of the profile uses at once (volumes are created on first use).
fn volumes_planned(p: &ProfileCmd) -> Result<usize, BenchError> {
    let of = |a: &cli::LatencyTargetArgs| -> Result<usize, BenchError> {
        let o = latency_target_opts(a)?;
        Ok(o.volumes
            .iter()
            .copied()
            .chain([o.iodepth_volumes])
            .max()
            .unwrap_or(1))
    };
    match p {
        ProfileCmd::LatencyTarget(a) => of(a),
        ProfileCmd::Full => of(&defaults()?),
        _ => Ok(1),
    }
    .map(|n| n.max(1))
}

/// A device file that holds `volumes` fully written volumes of `size`, a quarter more, and 1 GiB
/// (the journal takes 1/32 of the device, at least 16 MiB), so that a bench never takes more of
/// the disk than it needs.
pub fn device_size_for(size: u64, volumes: usize) -> u64 {
    let data = size.saturating_mul(volumes as u64);
    data.saturating_add(data / 4)
        .saturating_add(1 << 30)
        .next_multiple_of(1 << 20)
}

/// The targets a run starts beside the main one.
#[derive(Debug, Clone, Copy, Default)]
struct Extras {
    /// A replicated local cluster, started first (the `cluster` profile's main target).
    cluster: Option<LocalCluster>,
    /// Another, started last (`cluster --local-gateway`: the cluster with `up`'s gateway).
    last_cluster: Option<LocalCluster>,
    /// Leave out the main (single-node or --uri) target (`cluster --no-single`).
    no_primary: bool,
    nbdkit_file: bool,
    nbdkit_memory: bool,
    raw: bool,
}

/// What the targets of a profile are.
fn extras_of(p: &ProfileCmd, c: &CommonArgs) -> Result<Extras, BenchError> {
    let compare = matches!(p, ProfileCmd::Compare(_) | ProfileCmd::Full)
        || matches!(p, ProfileCmd::Quick(q) if q.with_compare);
    let mut e = Extras {
        nbdkit_file: c.peer_nbdkit
            || (compare && !matches!(p, ProfileCmd::Compare(a) if a.no_nbdkit)),
        raw: !c.no_baseline || compare,
        ..Extras::default()
    };
    if let ProfileCmd::Cluster(a) = p {
        if !c.uris.is_empty() {
            return Err(BenchError::InvalidOption(
                "the cluster profile starts its own clusters; --uri does not apply (use --peer-uri to add a running export beside them)".into(),
            ));
        }
        if a.replicas.is_some_and(|r| u32::from(r) > a.nodes) {
            return Err(BenchError::InvalidOption(format!(
                "--replicas {} needs at least as many --nodes (every copy on another node)",
                a.replicas.unwrap_or_default()
            )));
        }
        let cluster = LocalCluster {
            nodes: a.nodes,
            replicas: a.replicas,
            local_gateway: false,
        };
        if a.local_gateway {
            e.cluster = Some(LocalCluster {
                local_gateway: true,
                ..cluster
            });
            e.last_cluster = Some(cluster);
        } else {
            e.cluster = Some(cluster);
        }
        e.no_primary = a.no_single;
        e.nbdkit_memory = !a.no_nbdkit;
    }
    Ok(e)
}

/// The cluster's label: `basalt-rep3`, or `basalt-4n-rep3` when nodes and copies differ; with
/// the gateway in node1, `-gw-in-node` after it.
pub fn cluster_label(c: &LocalCluster) -> String {
    let gateway = if c.local_gateway { "-gw-in-node" } else { "" };
    if c.nodes == c.copies() {
        format!("basalt-rep{}{gateway}", c.copies())
    } else {
        format!("basalt-{}n-rep{}{gateway}", c.nodes, c.copies())
    }
}

fn basalt_bin(c: &CommonArgs) -> Result<PathBuf, BenchError> {
    match &c.basalt_bin {
        Some(b) => Ok(b.clone()),
        None => std::env::current_exe()
            .map_err(|e| BenchError::io("finding the basalt binary", "current_exe", e)),
    }
}

fn start_targets(
    c: &CommonArgs,
    (size, device_size): (u64, u64),
    scratch: &Path,
    logs: &Path,
    x: Extras,
) -> Result<Vec<Target>, BenchError> {
    let cluster = |cluster| start_cluster(c, (size, device_size), scratch, logs, cluster);
    let mut v = Vec::new();
    if let Some(first) = x.cluster {
        v.push(cluster(first)?);
    }
    let primary = if c.uris.is_empty() {
        TargetSpec::LocalBasalt {
            bin: basalt_bin(c)?,
            size,
            device_size,
            cluster: None,
        }
    } else {
        TargetSpec::Nbd {
            uris: c.uris.clone(),
            server_pids: c.server_pids.clone(),
        }
    };
    // A cluster the bench starts runs in the mode given (default `sync`: every acknowledged write
    // is durable); for an external target the report states only what the user said.
    let durability = match (&primary, &c.durability) {
        (_, Some(d)) => d.clone(),
        (TargetSpec::LocalBasalt { .. }, None) => "sync".into(),
        (_, None) => "as configured by the target (not given with --durability)".into(),
    };
    if !x.no_primary {
        v.push(Target::start(
            primary,
            &c.label,
            scratch,
            logs,
            &durability,
        )?);
    }
    start_peers(c, size, scratch, logs, x, &mut v)?;
    if let Some(last) = x.last_cluster {
        v.push(cluster(last)?);
    }
    Ok(v)
}

/// A local `basalt up --nodes N` cluster target.
fn start_cluster(
    c: &CommonArgs,
    (size, device_size): (u64, u64),
    scratch: &Path,
    logs: &Path,
    cluster: LocalCluster,
) -> Result<Target, BenchError> {
    let spec = TargetSpec::LocalBasalt {
        bin: basalt_bin(c)?,
        size,
        device_size,
        cluster: Some(cluster),
    };
    let durability = c.durability.clone().unwrap_or_else(|| "sync".into());
    Target::start(spec, &cluster_label(&cluster), scratch, logs, &durability)
}

/// Peers (--peer-uri, --ceph-conf), nbdkit and the raw file.
fn start_peers(
    c: &CommonArgs,
    size: u64,
    scratch: &Path,
    logs: &Path,
    x: Extras,
    v: &mut Vec<Target>,
) -> Result<(), BenchError> {
    if !c.peer_uris.is_empty() {
        let spec = TargetSpec::Nbd {
            uris: c.peer_uris.clone(),
            server_pids: c.peer_pids.clone(),
        };
        v.push(Target::start(
            spec,
            &c.peer_label,
            scratch,
            logs,
            "peer: not stated",
        )?);
    }
    if let Some(conf) = &c.ceph_conf {
        let images = if c.rbd_images.is_empty() {
            vec!["bench".to_string()]
        } else {
            c.rbd_images.clone()
        };
        let spec = TargetSpec::Rbd {
            conf: conf.clone(),
            pool: c.rbd_pool.clone(),
            images,
            server_pids: Vec::new(),
        };
        v.push(Target::start(
            spec,
            &format!("ceph-{}", c.rbd_pool),
            scratch,
            logs,
            "Ceph pool replication (see the pool's size)",
        )?);
    }
    if x.nbdkit_memory {
        v.push(Target::start(
            TargetSpec::NbdkitMemory { size },
            "nbdkit-memory",
            scratch,
            logs,
            "none: RAM",
        )?);
    }
    if x.nbdkit_file {
        v.push(Target::start(
            TargetSpec::NbdkitFile { size },
            "nbdkit-file",
            scratch,
            logs,
            "none: page cache, writes not flushed",
        )?);
    }
    if x.raw {
        v.push(Target::start(
            TargetSpec::RawFile { size },
            "raw-file",
            scratch,
            logs,
            "O_DIRECT without flush (disk write cache volatile)",
        )?);
    }
    Ok(())
}

fn bs_arg(s: &str) -> Result<u64, BenchError> {
    basalt_types::size::parse_size(s)
        .map_err(|e| BenchError::InvalidOption(format!("block size: {e}")))
}

fn goal(read_us: f64, write_us: f64, stat: &str) -> Result<LatencyGoal, BenchError> {
    Ok(LatencyGoal {
        read_us,
        write_us,
        stat: LatStat::parse(stat).map_err(BenchError::InvalidOption)?,
    })
}

fn run_profile(r: &mut Runner, p: &ProfileCmd, c: &CommonArgs) -> Result<Vec<Section>, BenchError> {
    let mut out = Vec::new();
    if !c.no_baseline
        && let Some(raw) = r.raw
    {
        // The client's own path (loopback TCP to the NBD server here) is the network limit; a
        // cluster the bench started is also probed through Basalt's own protocol to its node.
        let loopback = LoopbackProbe::start()?;
        let node = r
            .targets
            .iter()
            .find_map(|t| t.node_addr())
            .map(|addr| netnode::NodeProbe {
                name: "node.1".into(),
                addr,
            });
        let mut probes: Vec<&dyn NetProbe> = vec![&loopback];
        if let Some(n) = &node {
            probes.push(n);
        }
        let (s, b) = profiles::baseline::run(r, raw, &probes, c.net_seconds)?;
        r.baselines = Some(b);
        out.push(s);
    }
    match p {
        ProfileCmd::Baseline => {}
        ProfileCmd::Quick(q) => {
            let m = profiles::matrix::MatrixOpts {
                shapes: vec![(4096, Pattern::Random), (128 << 10, Pattern::Sequential)],
                mixes: vec![100, 0, 70],
                jobs: 1,
                iodepth: 16,
            };
            out.push(profiles::matrix::run(r, &m)?);
            out.push(profiles::latency_load::run(
                r,
                &latency_load_opts(
                    &defaults::<cli::LatencyLoadArgs>()?,
                    Some(32),
                    Some(vec![100, 0]),
                )?,
            )?);
            let mut a = autotune_opts(&defaults::<cli::AutotuneArgs>()?)?;
            a.max_concurrency = 64;
            a.workloads = vec![100];
            out.push(profiles::autotune::run(r, &a)?);
            if q.with_compare {
                out.push(profiles::compare::run(r)?);
            }
        }
        ProfileCmd::Full => {
            out.push(profiles::matrix::run(r, &matrix_opts(&defaults()?)?)?);
            out.push(profiles::latency_target::run(
                r,
                &latency_target_opts(&defaults()?)?,
            )?);
            out.push(profiles::latency_load::run(
                r,
                &latency_load_opts(&defaults()?, None, None)?,
            )?);
            out.push(profiles::threads::run(r, &threads_opts(&defaults()?)?)?);
            out.push(profiles::mix::run(r, &mix_opts(&defaults()?)?)?);
            out.push(profiles::autotune::run(r, &autotune_opts(&defaults()?)?)?);
            out.push(profiles::compare::run(r)?);
        }
        ProfileCmd::Matrix(a) => out.push(profiles::matrix::run(r, &matrix_opts(a)?)?),
        ProfileCmd::LatencyTarget(a) => {
            out.push(profiles::latency_target::run(r, &latency_target_opts(a)?)?)
        }
        ProfileCmd::LatencyLoad(a) => out.push(profiles::latency_load::run(
            r,
            &latency_load_opts(a, None, None)?,
        )?),
        ProfileCmd::Threads(a) => out.push(profiles::threads::run(r, &threads_opts(a)?)?),
        ProfileCmd::Mix(a) => out.push(profiles::mix::run(r, &mix_opts(a)?)?),
        ProfileCmd::Autotune(a) => out.push(profiles::autotune::run(r, &autotune_opts(a)?)?),
        ProfileCmd::Compare(_) => out.push(profiles::compare::run(r)?),
        ProfileCmd::Cluster(a) => out.push(profiles::cluster::run(r, &cluster_opts(a)?)?),
    }
    Ok(out)
}

fn cluster_opts(a: &cli::ClusterArgs) -> Result<profiles::cluster::ClusterOpts, BenchError> {
    let known: Vec<&str> = profiles::compare::JOBS.iter().map(|j| j.0).collect();
    let jobs = match &a.only {
        None => known.iter().map(|j| j.to_string()).collect(),
        Some(list) => {
            let v: Vec<String> = list
                .split(',')
                .map(|j| j.trim().to_string())
                .filter(|j| !j.is_empty())
                .collect();
            if let Some(bad) = v.iter().find(|j| !known.contains(&j.as_str())) {
                return Err(BenchError::InvalidOption(format!(
                    "--only {bad}: not a job; the jobs are {}",
                    known.join(", ")
                )));
            }
            if v.is_empty() {
                return Err(BenchError::InvalidOption("--only names no job".into()));
            }
            v
        }
    };
    Ok(profiles::cluster::ClusterOpts { jobs })
}

fn matrix_opts(a: &cli::MatrixArgs) -> Result<profiles::matrix::MatrixOpts, BenchError> {
    Ok(profiles::matrix::MatrixOpts {
        shapes: profiles::matrix::cross(
            &a.bs.split(',').map(bs_arg).collect::<Result<Vec<_>, _>>()?,
        ),
        mixes: percent_list(&a.mixes, "--mixes")?,
        jobs: a.jobs.max(1),
        iodepth: a.iodepth.max(1),
    })
}

fn percent_list(s: &str, what: &str) -> Result<Vec<u8>, BenchError> {
    let v: Vec<u8> = profiles::parse_list(s, what)?;
    if v.iter().any(|p| *p > 100) {
        return Err(BenchError::InvalidOption(format!(
            "{what}: read percentages go from 0 to 100"
        )));
    }
    Ok(v)
}

fn latency_target_opts(
    a: &cli::LatencyTargetArgs,
) -> Result<profiles::latency_target::LatencyTargetOpts, BenchError> {
    let volumes: Vec<usize> = profiles::parse_list(&a.volumes, "--volumes")?;
    Ok(profiles::latency_target::LatencyTargetOpts {
        goal: goal(a.read_target_us, a.write_target_us, &a.stat)?,
        iodepth_volumes: a
            .iodepth_volumes
            .unwrap_or_else(|| volumes.iter().copied().max().unwrap_or(1)),
        volumes,
        volume_iodepth: a.volume_iodepth,
        iodepths: profiles::parse_list(&a.iodepths, "--iodepths")?,
        jobs: a.jobs.max(1),
        bisect_steps: a.bisect,
    })
}

fn latency_load_opts(
    a: &cli::LatencyLoadArgs,
    max_qd: Option<u32>,
    workloads: Option<Vec<u8>>,
) -> Result<profiles::latency_load::LatencyLoadOpts, BenchError> {
    Ok(profiles::latency_load::LatencyLoadOpts {
        limit_us: a.limit_us,
        stat: LatStat::parse(&a.stat).map_err(BenchError::InvalidOption)?,
        max_qd: max_qd.unwrap_or(a.max_qd),
        workloads: match workloads {
            Some(w) => w,
            None => percent_list(&a.workloads, "--workloads")?,
        },
        jobs: a.jobs.max(1),
        cost: a.cost_price.map(|price| profiles::latency_load::Cost {
            price,
            currency: a.cost_currency.clone(),
            months: a.cost_months,
            usable_gb: a.usable_gb,
        }),
    })
}

fn threads_opts(a: &cli::ThreadsArgs) -> Result<profiles::threads::ThreadsOpts, BenchError> {
    Ok(profiles::threads::ThreadsOpts {
        max_jobs: a.max_jobs.clamp(1, 1024),
        bs: bs_arg(&a.bs)?,
        iodepth: a.iodepth.max(1),
    })
}

fn mix_opts(a: &cli::MixArgs) -> Result<profiles::mix::MixOpts, BenchError> {
    Ok(profiles::mix::MixOpts {
        queue_depths: profiles::parse_list(&a.queue_depths, "--queue-depths")?,
        jobs: a.jobs.max(1),
        step_pct: a.step,
    })
}

fn autotune_opts(a: &cli::AutotuneArgs) -> Result<profiles::autotune::AutotuneOpts, BenchError> {
    let pattern = match a.pattern.as_str() {
        "random" | "rand" => Pattern::Random,
        "sequential" | "seq" => Pattern::Sequential,
        p => {
            return Err(BenchError::InvalidOption(format!(
                "--pattern {p}: use random or sequential"
            )));
        }
    };
    Ok(profiles::autotune::AutotuneOpts {
        pattern,
        bs: bs_arg(&a.bs)?,
        workloads: percent_list(&a.workloads, "--workloads")?,
        max_concurrency: a.max_concurrency.max(1),
        max_jobs: a.max_jobs.max(1),
        min_gain: a.min_gain,
        patience: a.patience.max(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn planned(args: &[&str]) -> usize {
        let cli = Cli::try_parse_from(["bench"].iter().chain(args)).expect("parses");
        volumes_planned(&cli.bench.profile).expect("valid")
    }

    #[test]
    fn the_device_holds_every_volume_the_run_creates() {
        assert_eq!(planned(&["matrix"]), 1);
        assert_eq!(planned(&["full"]), 4);
        assert_eq!(planned(&["latency-target", "--volumes", "1,3"]), 3);
        assert_eq!(
            planned(&["latency-target", "--volumes", "1", "--iodepth-volumes", "5"]),
            5
        );
        let mib = 1u64 << 20;
        assert_eq!(device_size_for(64 * mib, 1), 1024 * mib + 80 * mib);
        assert_eq!(device_size_for(4 << 30, 4), (20u64 << 30) + (1 << 30));
        assert_eq!(device_size_for(1000, 1) % mib, 0);
    }
}
