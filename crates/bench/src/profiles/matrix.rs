//! The simplyblock matrix: 4K and 128K, random and sequential, read/write mixes 100/0, 0/100, 30/70,
//! 70/30, 50/50, at settable jobs x IO depth. Tables laid out like its Tables 1-8 (IOPS, then
//! Mbit/s), with one row per target instead of one per cluster size, plus the fraction of the raw
//! limit and ratio rows against the first target.

use super::{Metric, cell, ratio_cell};
use crate::error::BenchError;
use crate::job::{Pattern, bs_label};
use crate::model::{Cell, PlotKind, PlotSpec, Section, Series, Table};
use crate::runner::Runner;

/// Matrix settings.
#[derive(Debug, Clone)]
pub struct MatrixOpts {
    /// (block size, pattern) pairs; the default is {4K, 128K} x {random, sequential}.
    pub shapes: Vec<(u64, Pattern)>,
    /// Read percentages, in table column order.
    pub mixes: Vec<u8>,
    pub jobs: u32,
    pub iodepth: u32,
}

impl Default for MatrixOpts {
    fn default() -> Self {
        MatrixOpts {
            shapes: cross(&[4096, 128 << 10]),
            mixes: vec![100, 0, 30, 70, 50],
            jobs: 2,
            iodepth: 32,
        }
    }
}

/// Every block size with random and then sequential access.
pub fn cross(block_sizes: &[u64]) -> Vec<(u64, Pattern)> {
    block_sizes
        .iter()
        .flat_map(|bs| [(*bs, Pattern::Random), (*bs, Pattern::Sequential)])
        .collect()
}

fn mix_col(m: u8) -> String {
    format!("RW ({m}/{})", 100 - m)
}

/// Runs the matrix on every benchmarked target.
pub fn run(r: &mut Runner, o: &MatrixOpts) -> Result<Section, BenchError> {
    let mut s = Section::new(
        "matrix",
        "Matrix: block size x pattern x read/write mix",
        format!(
            "simplyblock's matrix scaled to this machine: fio {} x QD{} on one volume per target, each cell one step; mixes are read/write percentages.",
            crate::job::jobs_word(o.jobs),
            o.iodepth
        ),
    );
    let targets = r.bench_targets();
    r.plan(o.shapes.len() * o.mixes.len() * targets.len());
    let point = |bs: u64, p: Pattern, m: u8| {
        format!(
            "{}-{}-r{m}",
            bs_label(bs),
            if p == Pattern::Random { "rand" } else { "seq" }
        )
    };
    for &(bs, p) in &o.shapes {
        for &m in &o.mixes {
            for &t in &targets {
                let job = r.job(p, bs, m, o.iodepth).jobs(o.jobs);
                r.measure(&mut s, &point(bs, p, m), t, &job)?;
            }
        }
    }
    let labels: Vec<String> = targets
        .iter()
        .map(|t| r.targets[*t].label().to_string())
        .collect();
    let mut n = 0;
    for (metric, unit) in [
        (Metric::IopsExact, "IOPS"),
        (Metric::Mbit, "Throughput (Mbit/s)"),
    ] {
        for &(bs, p) in &o.shapes {
            {
                n += 1;
                let pat = if p == Pattern::Random {
                    "Random"
                } else {
                    "Sequential"
                };
                let mut cols = vec!["target".to_string()];
                cols.extend(o.mixes.iter().map(|m| mix_col(*m)));
                let mut rows = Vec::new();
                for l in &labels {
                    let mut row = vec![Cell::text(l)];
                    row.extend(
                        o.mixes
                            .iter()
                            .map(|m| cell(s.step(&point(bs, p, *m), l), metric)),
                    );
                    rows.push(row);
                    let mut lim = vec![Cell::text(format!("{l}: of raw limit"))];
                    lim.extend(
                        o.mixes
                            .iter()
                            .map(|m| cell(s.step(&point(bs, p, *m), l), Metric::FractionOfLimit)),
                    );
                    rows.push(lim);
                }
                for l in labels.iter().skip(1) {
                    let mut row = vec![Cell::text(format!("ratio {l} / {}", labels[0]))];
                    row.extend(o.mixes.iter().map(|m| {
                        ratio_cell(
                            s.step(&point(bs, p, *m), l),
                            s.step(&point(bs, p, *m), &labels[0]),
                            metric,
                        )
                    }));
                    rows.push(row);
                }
                s.tables.push(Table {
                    title: format!("Table {n}: {unit}, {pat} access pattern with {} block size", bs_label(bs).to_uppercase()),
                    caption: format!(
                        "{} x QD{}; \"of raw limit\" rows name the limit each cell is measured against (hover for its value). Mbit/s = 10^6 bit/s.",
                        crate::job::jobs_word(o.jobs), o.iodepth
                    ),
                    columns: cols,
                    rows,
                });
            }
        }
    }
    let mut sizes: Vec<u64> = o.shapes.iter().map(|x| x.0).collect();
    sizes.dedup();
    for bs in sizes {
        let (metric, ylab) = if bs <= 16384 {
            (Metric::Iops, "IOPS")
        } else {
            (Metric::Mbit, "throughput (Mbit/s)")
        };
        let mut series = Vec::new();
        for p in o.shapes.iter().filter(|x| x.0 == bs).map(|x| x.1) {
            for l in &labels {
                let pts = o
                    .mixes
                    .iter()
                    .enumerate()
                    .filter_map(|(i, m)| {
                        s.step(&point(bs, p, *m), l)
                            .and_then(|st| metric.value(st))
                            .map(|v| (i as f64, v))
                    })
                    .collect();
                series.push(Series {
                    name: format!(
                        "{l} {}",
                        if p == Pattern::Random {
                            "random"
                        } else {
                            "sequential"
                        }
                    ),
                    points: pts,
                });
            }
        }
        s.plots.push(PlotSpec {
            id: format!("matrix-{}", bs_label(bs)),
            title: format!(
                "{} blocks: {ylab} by read/write mix ({} x QD{})",
                bs_label(bs).to_uppercase(),
                crate::job::jobs_word(o.jobs),
                o.iodepth
            ),
            x_label: "read/write mix (% read / % write)".into(),
            y_label: ylab.into(),
            kind: PlotKind::Bar {
                categories: o.mixes.iter().map(|m| format!("{m}/{}", 100 - m)).collect(),
            },
            series,
            hlines: Vec::new(),
        });
    }
    Ok(s)
}
