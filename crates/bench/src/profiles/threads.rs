//! Curvine's thread sweep: 256K sequential and random read from 1 to N fio jobs (threads), each job
//! its own connection, GiB/s and IOPS.

use super::{Metric, cell, powers_of_two};
use crate::error::BenchError;
use crate::job::{Pattern, bs_label};
use crate::model::{Cell, PlotKind, PlotSpec, Section, Series, Table};
use crate::runner::Runner;

/// Thread-sweep settings.
#[derive(Debug, Clone)]
pub struct ThreadsOpts {
    pub max_jobs: u32,
    pub bs: u64,
    pub iodepth: u32,
}

/// Runs the sweep on every benchmarked target.
pub fn run(r: &mut Runner, o: &ThreadsOpts) -> Result<Section, BenchError> {
    let jobs = powers_of_two(1, o.max_jobs);
    let bs = bs_label(o.bs).to_uppercase();
    let mut s = Section::new(
        "threads",
        &format!("Thread sweep: {bs} sequential and random read"),
        format!(
            "fio jobs 1, 2, 4, ... {} (each a thread with its own connection), QD{} each, {bs} reads on one volume.",
            o.max_jobs, o.iodepth
        ),
    );
    let targets = r.bench_targets();
    r.plan(jobs.len() * 2 * targets.len());
    let pats = [(Pattern::Sequential, "seq"), (Pattern::Random, "rand")];
    for &t in &targets {
        for (p, name) in pats {
            for &j in &jobs {
                let job = r.job(p, o.bs, 100, o.iodepth).jobs(j);
                r.measure(&mut s, &format!("{name}-j{j}"), t, &job)?;
            }
        }
    }
    let labels: Vec<String> = targets
        .iter()
        .map(|t| r.targets[*t].label().to_string())
        .collect();
    for l in &labels {
        let rows = jobs
            .iter()
            .map(|j| {
                let sq = s.step(&format!("seq-j{j}"), l);
                let rd = s.step(&format!("rand-j{j}"), l);
                vec![
                    Cell::text(j.to_string()),
                    cell(sq, Metric::GibS),
                    cell(sq, Metric::Iops),
                    cell(sq, Metric::FractionOfLimit),
                    cell(rd, Metric::GibS),
                    cell(rd, Metric::Iops),
                    cell(rd, Metric::LatMean),
                    cell(rd, Metric::FractionOfLimit),
                ]
            })
            .collect();
        s.tables.push(Table {
            title: format!(
                "{l}: thread count vs read speed ({bs}, QD{} per job)",
                o.iodepth
            ),
            caption: "GiB/s = 2^30 bytes per second.".into(),
            columns: [
                "jobs",
                "sequential GiB/s",
                "sequential IOPS",
                "seq. of raw limit",
                "random GiB/s",
                "random IOPS",
                "random mean latency",
                "rand. of raw limit",
            ]
            .map(String::from)
            .to_vec(),
            rows,
        });
    }
    for (metric, id, ylab) in [
        (Metric::GibS, "threads-gibs", "read throughput (GiB/s)"),
        (Metric::Iops, "threads-iops", "read IOPS"),
    ] {
        let mut series = Vec::new();
        for l in &labels {
            for (_, name) in pats {
                let pts = jobs
                    .iter()
                    .filter_map(|j| {
                        s.step(&format!("{name}-j{j}"), l)
                            .and_then(|st| metric.value(st))
                            .map(|v| (f64::from(*j), v))
                    })
                    .collect();
                series.push(Series {
                    name: format!(
                        "{l} {}",
                        if name == "seq" {
                            "sequential"
                        } else {
                            "random"
                        }
                    ),
                    points: pts,
                });
            }
        }
        s.plots.push(PlotSpec {
            id: id.into(),
            title: format!("{bs} read: {ylab} by number of jobs"),
            x_label: "fio jobs (threads), log scale".into(),
            y_label: ylab.into(),
            kind: PlotKind::Line { log_x: true },
            series,
            hlines: Vec::new(),
        });
    }
    Ok(s)
}
