//! MinIO speedtest's autotune: raise concurrency (jobs x IO depth) until aggregate throughput stops
//! growing; report the knee and the latency there ([`crate::search::find_knee`]).

use super::{Metric, cell, powers_of_two};
use crate::error::BenchError;
use crate::job::{Pattern, bs_label};
use crate::model::{Cell, PlotKind, PlotSpec, Section, Series, Table};
use crate::report::format::{fmt_iops, fmt_mib, fmt_us};
use crate::runner::Runner;
use crate::search::find_knee;

/// Autotune settings.
#[derive(Debug, Clone)]
pub struct AutotuneOpts {
    pub pattern: Pattern,
    pub bs: u64,
    /// Read percentages to tune separately (100 = reads, 0 = writes).
    pub workloads: Vec<u8>,
    pub max_concurrency: u32,
    /// Jobs are added first, up to this many; beyond it the IO depth grows.
    pub max_jobs: u32,
    /// Growth below this fraction (0.05 = 5%) counts as no growth.
    pub min_gain: f64,
    pub patience: usize,
}

/// Runs autotune on every benchmarked target.
pub fn run(r: &mut Runner, o: &AutotuneOpts) -> Result<Section, BenchError> {
    let bs = bs_label(o.bs).to_uppercase();
    let mut s = Section::new(
        "autotune",
        "Autotune: where throughput stops growing",
        format!(
            "{bs} {} IO; concurrency 1, 2, 4, ... up to {} outstanding IOs (jobs first, up to {}, then IO depth). The search stops when {} steps in a row add less than {:.0}% over the best so far; the knee is that best point.",
            if o.pattern == Pattern::Random {
                "random"
            } else {
                "sequential"
            },
            o.max_concurrency,
            o.max_jobs,
            o.patience,
            o.min_gain * 100.0
        ),
    );
    let conc = powers_of_two(1, o.max_concurrency);
    let targets = r.bench_targets();
    let mut table = Table {
        title: format!("Autotune ({bs})"),
        caption: "Each row one step; the knee row is marked.".into(),
        columns: [
            "target",
            "workload",
            "concurrency",
            "jobs x QD",
            "IOPS",
            "MiB/s",
            "mean latency",
            "p99 latency",
            "server CPU µs/IO",
            "of raw limit",
            "knee",
        ]
        .map(String::from)
        .to_vec(),
        rows: Vec::new(),
    };
    let mut series = Vec::new();
    for &t in &targets {
        let label = r.targets[t].label().to_string();
        for &w in &o.workloads {
            let wl = match w {
                100 => "read".to_string(),
                0 => "write".to_string(),
                p => format!("{p}% read"),
            };
            let mut values: Vec<Option<f64>> = Vec::new();
            let mut ids = Vec::new();
            for &c in &conc {
                r.plan(1);
                let jobs = c.min(o.max_jobs).max(1);
                let job = r.job(o.pattern, o.bs, w, (c / jobs).max(1)).jobs(jobs);
                let st = r.measure(&mut s, &format!("r{w}-c{c}"), t, &job)?;
                values.push(st.stats().map(|x| x.iops()));
                ids.push((c, jobs, st.id.clone()));
                if find_knee(&values, o.min_gain, o.patience).stalled {
                    break;
                }
            }
            let knee = find_knee(&values, o.min_gain, o.patience);
            for (i, (c, jobs, id)) in ids.iter().enumerate() {
                let st = s.steps.iter().find(|x| &x.id == id);
                table.rows.push(vec![
                    Cell::text(&label),
                    Cell::text(&wl),
                    Cell::text(c.to_string()),
                    Cell::text(format!("{jobs} x {}", (c / jobs).max(1))),
                    cell(st, Metric::Iops),
                    cell(st, Metric::MibS),
                    cell(st, Metric::LatMean),
                    cell(st, Metric::LatP99),
                    cell(st, Metric::ServerUsPerIo),
                    cell(st, Metric::FractionOfLimit),
                    Cell::text(if knee.index == Some(i) { "knee" } else { "" }),
                ]);
            }
            match knee.index.and_then(|i| ids.get(i)).and_then(|(c, _, id)| s.steps.iter().find(|x| &x.id == id).map(|st| (c, st))) {
                Some((c, st)) => {
                    let x = st.stats().cloned().unwrap_or_default();
                    s.findings.push(format!(
                        "{label} {bs} {wl}: knee at concurrency {c}: {} IOPS, {} MiB/s, mean latency {}, p99 {}",
                        fmt_iops(x.iops()),
                        fmt_mib(x.mib_s()),
                        fmt_us(x.lat_mean_us()),
                        fmt_us(x.lat_pct_us(99.0))
                    ));
                }
                None if values.iter().any(Option::is_none) => {
                    s.findings.push(format!("{label} {bs} {wl}: a step failed before throughput stopped growing; no knee"));
                }
                None => s.findings.push(format!(
                    "{label} {bs} {wl}: throughput still grew at concurrency {}: no knee within the tested range",
                    ids.last().map_or(0, |x| x.0)
                )),
            }
            series.push(Series {
                name: format!("{label} {wl}"),
                points: ids
                    .iter()
                    .zip(&values)
                    .filter_map(|((c, _, _), v)| v.map(|v| (f64::from(*c), v)))
                    .collect(),
            });
            if let Some((c, v)) = knee
                .index
                .and_then(|i| Some((ids.get(i)?.0, values.get(i).copied().flatten()?)))
            {
                series.push(Series {
                    name: format!("{label} {wl} knee (concurrency {c})"),
                    points: vec![(f64::from(c), v)],
                });
            }
        }
    }
    s.tables.push(table);
    s.plots.push(PlotSpec {
        id: "autotune".into(),
        title: format!("Autotune: {bs} IOPS by concurrency"),
        x_label: "outstanding IOs (jobs x IO depth), log scale".into(),
        y_label: "IOPS".into(),
        kind: PlotKind::Line { log_x: true },
        series,
        hlines: Vec::new(),
    });
    Ok(s)
}
