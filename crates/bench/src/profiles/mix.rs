//! The RAID review's mix sweep: 0-100% reads in 10% steps at several total queue depths, for 4K
//! random and 128K sequential, after preconditioning; each step's warm-up (fio ramp_time) is
//! excluded from its statistics.

use super::{Metric, cell};
use crate::error::BenchError;
use crate::job::{Pattern, bs_label};
use crate::model::{Cell, PlotKind, PlotSpec, Section, Series, Table};
use crate::runner::Runner;

/// Mix-sweep settings.
#[derive(Debug, Clone)]
pub struct MixOpts {
    /// Total queue depths (split over `jobs`), e.g. 8, 64, 512.
    pub queue_depths: Vec<u32>,
    pub jobs: u32,
    pub step_pct: u8,
}

/// Runs the sweep on every benchmarked target.
pub fn run(r: &mut Runner, o: &MixOpts) -> Result<Section, BenchError> {
    let step = o.step_pct.clamp(1, 100);
    let mixes: Vec<u8> = (0..=100u8).step_by(usize::from(step)).collect();
    let mut s = Section::new(
        "mix",
        "Mixed read/write sweep",
        format!(
            "Read share from 0% to 100% in {step}% steps at total queue depths {:?} ({}, QD split evenly), 4K random and 128K sequential; volumes preconditioned first; each step's {} s warm-up is excluded from its numbers.",
            o.queue_depths,
            crate::job::jobs_word(o.jobs),
            r.opts.ramp_s
        ),
    );
    let targets = r.bench_targets();
    let shapes = [
        (Pattern::Random, 4096u64, "4k-rand", Metric::Iops, "IOPS"),
        (
            Pattern::Sequential,
            128 << 10,
            "128k-seq",
            Metric::MibS,
            "MiB/s",
        ),
    ];
    r.plan(shapes.len() * o.queue_depths.len() * mixes.len() * targets.len());
    let point = |name: &str, qd: u32, m: u8| format!("{name}-qd{qd}-r{m}");
    for &t in &targets {
        for (p, bs, name, _, _) in shapes {
            for &qd in &o.queue_depths {
                for &m in &mixes {
                    let per_job = (qd / o.jobs.max(1)).max(1);
                    let job = r.job(p, bs, m, per_job).jobs(o.jobs);
                    r.measure(&mut s, &point(name, qd, m), t, &job)?;
                }
            }
        }
    }
    let labels: Vec<String> = targets
        .iter()
        .map(|t| r.targets[*t].label().to_string())
        .collect();
    for (_, bs, name, metric, unit) in shapes {
        let mut cols = vec!["read %".to_string()];
        for l in &labels {
            for qd in &o.queue_depths {
                cols.push(format!("{l} QD{qd} {unit}"));
                cols.push(format!("{l} QD{qd} of raw"));
            }
        }
        let rows = mixes
            .iter()
            .map(|m| {
                let mut row = vec![Cell::text(format!("{m}%"))];
                for l in &labels {
                    for qd in &o.queue_depths {
                        let st = s.step(&point(name, *qd, *m), l);
                        row.push(cell(st, metric));
                        row.push(cell(st, Metric::FractionOfLimit));
                    }
                }
                row
            })
            .collect();
        s.tables.push(Table {
            title: format!("{} {}: {unit} by read share", bs_label(bs).to_uppercase(), if name.ends_with("rand") { "random" } else { "sequential" }),
            caption: "Total queue depth over all jobs; \"of raw\" is the fraction of the time-shared disk limit for that mix.".into(),
            columns: cols,
            rows,
        });
        let mut series = Vec::new();
        for l in &labels {
            for qd in &o.queue_depths {
                let pts = mixes
                    .iter()
                    .filter_map(|m| {
                        s.step(&point(name, *qd, *m), l)
                            .and_then(|st| metric.value(st))
                            .map(|v| (f64::from(*m), v))
                    })
                    .collect();
                series.push(Series {
                    name: format!("{l} QD{qd}"),
                    points: pts,
                });
            }
        }
        s.plots.push(PlotSpec {
            id: format!("mix-{name}"),
            title: format!(
                "{} {}: {unit} from pure write (0%) to pure read (100%)",
                bs_label(bs).to_uppercase(),
                if name.ends_with("rand") {
                    "random"
                } else {
                    "sequential"
                }
            ),
            x_label: "reads (% of IOs)".into(),
            y_label: unit.into(),
            kind: PlotKind::Line { log_x: false },
            series,
            hlines: Vec::new(),
        });
    }
    Ok(s)
}
