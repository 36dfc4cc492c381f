//! Side by side on the same disk in one run: fio ioengine=nbd against a Basalt volume, against
//! `nbdkit file` on a file of the same size, and fio io_uring O_DIRECT on a raw file (optionally a
//! Ceph RBD pool), with the seven jobs of shared/peers/ceph/bench.sh plus the raw file's durable
//! 4K random write (fdatasync every 32 writes). Ratios to raw and to nbdkit.

use super::{Metric, cell, ratio_cell};
use crate::error::BenchError;
use crate::job::{JobSpec, Pattern};
use crate::model::{Cell, PlotKind, PlotSpec, Section, Series, Table};
use crate::runner::Runner;

/// The seven jobs: (point, pattern, bs, read %, QD).
pub const JOBS: [(&str, Pattern, u64, u8, u32); 7] = [
    ("randread-4k-qd64", Pattern::Random, 4096, 100, 64),
    ("randwrite-4k-qd64", Pattern::Random, 4096, 0, 64),
    ("randrw70-4k-qd64", Pattern::Random, 4096, 70, 64),
    ("read-128k-qd16", Pattern::Sequential, 128 << 10, 100, 16),
    ("write-128k-qd16", Pattern::Sequential, 128 << 10, 0, 16),
    ("randread-4k-qd1", Pattern::Random, 4096, 100, 1),
    ("randwrite-4k-qd1", Pattern::Random, 4096, 0, 1),
];

const DURABLE: &str = "randwrite-4k-qd64-fdatasync32";

/// The tables of [`run`]: (metric, title, caption).
const METRICS: [(Metric, &str, &str); 6] = [
    (
        Metric::Iops,
        "IOPS",
        "IOPS over the measured window; ratio columns divide the first target by the named one.",
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
        "CPU-microseconds of the server processes per completed IO (utime+stime from /proc over the measured window). The raw file has no server.",
    ),
    (
        Metric::ClientUsPerIo,
        "client (fio) CPU µs per IO",
        "CPU-microseconds of the fio process, all threads (libnbd/librbd included), per IO.",
    ),
];

/// Runs the comparison over all targets (Basalt first, then peers, nbdkit, raw).
pub fn run(r: &mut Runner) -> Result<Section, BenchError> {
    let mut s = Section::new(
        "compare",
        "Basalt beside its peers, nbdkit and the raw disk",
        "Same machine, same disk, one run: each job on every target in turn, numjobs=1. nbdkit's file plugin goes through the page cache (not durable); the raw file is fio io_uring with O_DIRECT (no server, the local limit); the durable-write line is the raw file with fdatasync every 32 writes.",
    );
    let all: Vec<usize> = (0..r.targets.len()).collect();
    r.plan(JOBS.len() * all.len() + 1);
    for (point, p, bs, rd, qd) in JOBS {
        for &t in &all {
            let job = r.job(p, bs, rd, qd);
            r.measure(&mut s, point, t, &job)?;
        }
    }
    let raw = r.raw;
    if let Some(raw) = raw {
        let mut job: JobSpec = r.job(Pattern::Random, 4096, 0, 64);
        job.fdatasync = Some(32);
        r.measure(&mut s, DURABLE, raw, &job)?;
    }
    let labels: Vec<String> = r.target_labels();
    let raw_label = raw.map(|i| labels[i].clone());
    let mut points: Vec<&str> = JOBS.iter().map(|j| j.0).collect();
    if raw.is_some() {
        points.push(DURABLE);
    }
    let no_server: Vec<String> = raw_label.iter().cloned().collect();
    s.tables.extend(metric_tables(
        &s,
        &points,
        &labels,
        &no_server,
        &[
            Metric::Iops,
            Metric::MibS,
            Metric::LatMean,
            Metric::ServerUsPerIo,
        ],
        "Compare",
        &METRICS,
    ));
    let fr_rows = JOBS
        .iter()
        .map(|j| {
            let mut row = vec![Cell::text(j.0)];
            row.extend(
                labels
                    .iter()
                    .map(|l| cell(s.step(j.0, l), Metric::FractionOfLimit)),
            );
            row
        })
        .collect();
    let mut cols = vec!["job".to_string()];
    cols.extend(labels.iter().cloned());
    s.tables.push(Table {
        title: "Compare: fraction of the raw limit".into(),
        caption:
            "Each cell names the limit it is measured against (the baseline section's numbers)."
                .into(),
        columns: cols,
        rows: fr_rows,
    });
    if let Some(raw) = &raw_label {
        s.tables.push(durable_table(&s, &labels, raw, r));
    }
    let jobs: Vec<&str> = JOBS.iter().map(|j| j.0).collect();
    s.plots
        .extend(bar_plots(&s, &jobs, &labels, &no_server, "compare"));
    Ok(s)
}

/// Each target's 4K random write QD64 against the raw file's durable limit (fdatasync every 32
/// writes): the fair bound for a target that acknowledges only durable writes.
fn durable_table(s: &Section, labels: &[String], raw: &str, r: &Runner) -> Table {
    let durable = s.step(DURABLE, raw);
    let rows = labels
        .iter()
        .zip(&r.targets)
        .filter(|(l, _)| l.as_str() != raw)
        .map(|(l, t)| {
            let step = s.step("randwrite-4k-qd64", l);
            vec![
                Cell::text(l),
                Cell::text(&t.info.durability),
                cell(step, Metric::Iops),
                cell(durable, Metric::Iops),
                ratio_cell(step, durable, Metric::Iops),
            ]
        })
        .collect();
    Table {
        title: "Compare: 4K random write QD64 against the durable raw limit".into(),
        caption: "The raw file with fdatasync every 32 writes is the limit for a target whose acknowledged writes are durable; a target that acknowledges before its data is on stable storage (nbdkit's file plugin: page cache) is not held to it.".into(),
        columns: ["target", "durability", "IOPS", "raw-file fdatasync=32 IOPS", "ratio"]
            .map(String::from)
            .to_vec(),
        rows,
    }
}

/// One table per metric of `specs` (metric, title, caption): a row per point, a column per
/// target, and for the metrics in `ratios` a column of the first target over every other one
/// (targets in `no_server` have no server, so no CPU ratio against them).
pub(super) fn metric_tables(
    s: &Section,
    points: &[&str],
    labels: &[String],
    no_server: &[String],
    ratios: &[Metric],
    prefix: &str,
    specs: &[(Metric, &str, &str)],
) -> Vec<Table> {
    let primary = &labels[0];
    let mut tables = Vec::new();
    for &(metric, title, caption) in specs {
        let mut cols = vec!["job".to_string()];
        cols.extend(labels.iter().cloned());
        let ratio_to: Vec<&String> = labels
            .iter()
            .filter(|l| *l != primary)
            .filter(|l| metric != Metric::ServerUsPerIo || !no_server.contains(l))
            .collect();
        let with_ratio = ratios.contains(&metric);
        if with_ratio {
            cols.extend(ratio_to.iter().map(|l| format!("{primary} / {l}")));
        }
        let rows = points
            .iter()
            .map(|pt| {
                let mut row = vec![Cell::text(*pt)];
                row.extend(labels.iter().map(|l| cell(s.step(pt, l), metric)));
                if with_ratio {
                    row.extend(
                        ratio_to
                            .iter()
                            .map(|l| ratio_cell(s.step(pt, primary), s.step(pt, l), metric)),
                    );
                }
                row
            })
            .collect();
        tables.push(Table {
            title: format!("{prefix}: {title}"),
            caption: caption.into(),
            columns: cols,
            rows,
        });
    }
    tables
}

/// Bar plots of IOPS and server CPU per IO by job, one series per target (`no_server`
/// targets left out of the CPU plot); plot ids `<id>-iops` and `<id>-cpu`.
pub(super) fn bar_plots(
    s: &Section,
    jobs: &[&str],
    labels: &[String],
    no_server: &[String],
    id: &str,
) -> Vec<PlotSpec> {
    let cats: Vec<String> = jobs
        .iter()
        .map(|j| j.replace("-qd", " QD").replace('-', " "))
        .collect();
    let mut plots = Vec::new();
    for (metric, suffix, ylab) in [
        (Metric::Iops, "iops", "IOPS"),
        (Metric::ServerUsPerIo, "cpu", "server CPU µs per IO"),
    ] {
        let series = labels
            .iter()
            .filter(|l| metric != Metric::ServerUsPerIo || !no_server.contains(l))
            .map(|l| Series {
                name: l.clone(),
                points: jobs
                    .iter()
                    .enumerate()
                    .filter_map(|(i, j)| {
                        s.step(j, l)
                            .and_then(|st| metric.value(st))
                            .map(|v| (i as f64, v))
                    })
                    .collect(),
            })
            .collect();
        plots.push(PlotSpec {
            id: format!("{id}-{suffix}"),
            title: format!("{}: {ylab} per job", capitalised(id)),
            x_label: "job".into(),
            y_label: ylab.into(),
            kind: PlotKind::Bar {
                categories: cats.clone(),
            },
            series,
            hlines: Vec::new(),
        });
    }
    plots
}

/// `compare` -> `Compare`.
fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}
