//! A replicated local cluster (`basalt up --nodes N`: N node processes, etcd and the NBD gateway,
//! every copy on another node process but all on this machine's one disk) beside single-node
//! Basalt (one copy) and `nbdkit memory` (and any peer: Ceph with `--ceph-conf`), in one run,
//! with compare's seven jobs. The cluster is the first target: ratio columns divide it by each
//! other target, so they show what the copies cost. Its server CPU is summed over `up` (the
//! gateway), every node and etcd. With `--local-gateway` the first target is a cluster whose
//! gateway runs in node1's process (`up` idle) and the one with `up`'s gateway comes last.

use super::compare::{JOBS, bar_plots, metric_tables};
use super::{Metric, ratio_cell};
use crate::error::BenchError;
use crate::model::Section;
use crate::runner::Runner;
use crate::target::Target;

/// What to run.
#[derive(Debug, Clone)]
pub struct ClusterOpts {
    /// Names of compare's jobs, in [`JOBS`] order or the order given.
    pub jobs: Vec<String>,
}

/// The tables: (metric, title, caption).
const METRICS: [(Metric, &str, &str); 6] = [
    (
        Metric::Iops,
        "IOPS",
        "IOPS over the measured window; ratio columns divide the replicated cluster (first column) by the named target.",
    ),
    (Metric::MibS, "MiB/s", "MiB/s = 2^20 bytes per second."),
    (
        Metric::LatMean,
        "mean latency",
        "fio total latency (submission + completion); for the 70/30 mix the mean over reads and writes.",
    ),
    (
        Metric::LatP99,
        "p99 latency",
        "99th percentile of fio total latency; for the 70/30 mix the worse of read and write.",
    ),
    (
        Metric::ServerUsPerIo,
        "server CPU µs per IO",
        "CPU-microseconds of the server processes per completed IO (utime+stime from /proc over the measured window): for the replicated cluster `basalt up` (the NBD gateway, unless it runs in node1), every `basalt node` and etcd together; for single-node Basalt its one process; nbdkit's one process.",
    ),
    (
        Metric::ClientUsPerIo,
        "client (fio) CPU µs per IO",
        "CPU-microseconds of the fio process, all threads (libnbd/librbd included), per IO.",
    ),
];

/// Runs the jobs on every benchmarked target (the cluster first) and builds the tables.
pub fn run(r: &mut Runner, o: &ClusterOpts) -> Result<Section, BenchError> {
    let targets = r.bench_targets();
    let mut s = Section::new(
        "cluster",
        "A replicated cluster beside single-node Basalt and nbdkit memory",
        method(&targets.iter().map(|&t| &r.targets[t]).collect::<Vec<_>>()),
    );
    let jobs: Vec<_> = o
        .jobs
        .iter()
        .filter_map(|name| JOBS.iter().find(|j| j.0 == name))
        .collect();
    r.plan(jobs.len() * targets.len());
    for &(point, p, bs, rd, qd) in &jobs {
        for &t in &targets {
            let job = r.job(*p, *bs, *rd, *qd);
            r.measure(&mut s, point, t, &job)?;
        }
    }
    let labels: Vec<String> = targets
        .iter()
        .map(|&t| r.targets[t].label().to_string())
        .collect();
    let points: Vec<&str> = jobs.iter().map(|j| j.0).collect();
    s.findings = findings(&s, &points, &labels);
    s.tables.extend(metric_tables(
        &s,
        &points,
        &labels,
        &[],
        &[
            Metric::Iops,
            Metric::MibS,
            Metric::LatMean,
            Metric::LatP99,
            Metric::ServerUsPerIo,
        ],
        "Cluster",
        &METRICS,
    ));
    s.plots
        .extend(bar_plots(&s, &points, &labels, &[], "cluster"));
    Ok(s)
}

/// The section's method: what each target is.
fn method(targets: &[&Target]) -> String {
    let mut m = String::from(
        "Same machine, same disk, one run: each job on every target in turn, numjobs=1, one NBD connection (fio ioengine=nbd over loopback). ",
    );
    for t in targets {
        m.push_str(&format!("{}: {}. ", t.info.label, t.info.description));
    }
    m.push_str("Every copy of the replicated cluster is on this machine's one disk, so its writes cost that disk the copies' IO and its nodes share the client's cores: it measures the replication protocol's cost, not a multi-host cluster's throughput.");
    m
}

/// One line per 4K QD64 job: the cluster's IOPS and server CPU per IO against the second target
/// (single-node Basalt when it runs).
fn findings(s: &Section, points: &[&str], labels: &[String]) -> Vec<String> {
    let (Some(cluster), Some(other)) = (labels.first(), labels.get(1)) else {
        return Vec::new();
    };
    points
        .iter()
        .filter(|p| p.ends_with("-4k-qd64"))
        .filter_map(|p| {
            let (a, b) = (s.step(p, cluster), s.step(p, other));
            let iops = ratio_cell(a, b, Metric::Iops).value?;
            let cpu = ratio_cell(a, b, Metric::ServerUsPerIo)
                .value
                .map_or(String::new(), |v| {
                    format!(", at {v:.2}x its server CPU per IO")
                });
            Some(format!(
                "{p}: {cluster} reaches {iops:.2}x the IOPS of {other}{cpu}"
            ))
        })
        .collect()
}
