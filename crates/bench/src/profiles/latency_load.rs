//! StorPool's latency under load: queue depth from 1 upward until latency passes 1 ms, the
//! latency-vs-IOPS curve, and an optional cost line (price over a period -> cost per IOPS and per
//! usable GB).

use super::{Metric, cell, powers_of_two};
use crate::error::BenchError;
use crate::job::Pattern;
use crate::model::{Cell, PlotKind, PlotSpec, Section, Series, Table};
use crate::report::format::{fmt_iops, fmt_us};
use crate::runner::Runner;
use crate::search::{LatStat, best_within, ramp_until};

/// A price for the system under test, given by the user.
#[derive(Debug, Clone)]
pub struct Cost {
    pub price: f64,
    pub currency: String,
    pub months: f64,
    /// Usable capacity in GB (10^9 bytes); None = not given (cost per GB not shown).
    pub usable_gb: Option<f64>,
}

/// Latency-vs-load settings.
#[derive(Debug, Clone)]
pub struct LatencyLoadOpts {
    pub limit_us: f64,
    pub stat: LatStat,
    pub max_qd: u32,
    /// Read percentages of the 4K random workloads (100 = randread, 0 = randwrite).
    pub workloads: Vec<u8>,
    pub jobs: u32,
    pub cost: Option<Cost>,
}

fn wl_name(read_pct: u8) -> String {
    match read_pct {
        100 => "4K random read".into(),
        0 => "4K random write".into(),
        p => format!("4K random {p}/{} read/write", 100 - p),
    }
}

/// Runs the QD ramp for each workload on every benchmarked target.
pub fn run(r: &mut Runner, o: &LatencyLoadOpts) -> Result<Section, BenchError> {
    let mut s = Section::new(
        "latency-load",
        "Latency against load",
        format!(
            "One client, {}; queue depth 1, 2, 4, ... up to {} per workload until the {} latency passes {} (the first point past it is kept to show the crossing).",
            crate::job::jobs_word(o.jobs),
            o.max_qd,
            o.stat.label(),
            fmt_us(Some(o.limit_us))
        ),
    );
    let qds = powers_of_two(1, o.max_qd);
    let targets = r.bench_targets();
    let mut curves = Vec::new();
    for &t in &targets {
        let label = r.targets[t].label().to_string();
        for &w in &o.workloads {
            let mut err = None;
            let pts = ramp_until(&qds, o.limit_us, o.stat, |qd| {
                r.plan(1);
                let job = r.job(Pattern::Random, 4096, w, qd).jobs(o.jobs);
                match r.measure(&mut s, &format!("r{w}-qd{qd}"), t, &job) {
                    Ok(st) => (st.stats().cloned(), st.id),
                    Err(e) => {
                        err = Some(e);
                        (None, String::new())
                    }
                }
            });
            if let Some(e) = err {
                return Err(e);
            }
            curves.push((label.clone(), w, pts));
        }
    }
    let mut t = Table {
        title: format!("Latency vs load (until {} latency > {})", o.stat.label(), fmt_us(Some(o.limit_us))),
        caption: "Each row one step; CPU per IO is CPU-microseconds of the server processes (and of fio) per completed IO.".into(),
        columns: ["target", "workload", "QD", "IOPS", "MiB/s", "mean latency", "p99 latency", "server CPU µs/IO", "client CPU µs/IO", "of raw limit"].map(String::from).to_vec(),
        rows: Vec::new(),
    };
    for (label, w, pts) in &curves {
        for p in pts {
            let st = s.steps.iter().find(|x| x.id == p.step);
            t.rows.push(vec![
                Cell::text(label),
                Cell::text(wl_name(*w)),
                Cell::text(p.x.unwrap_or(0).to_string()),
                cell(st, Metric::Iops),
                cell(st, Metric::MibS),
                cell(st, Metric::LatMean),
                cell(st, Metric::LatP99),
                cell(st, Metric::ServerUsPerIo),
                cell(st, Metric::ClientUsPerIo),
                cell(st, Metric::FractionOfLimit),
            ]);
        }
    }
    s.tables.push(t);
    let mut cost_rows = Vec::new();
    for (label, w, pts) in &curves {
        match best_within(pts) {
            Some(b) => {
                let iops = b.iops.unwrap_or(0.0);
                s.findings.push(format!(
                    "{label}, {}: {} IOPS at QD{} with {} latency {} (highest load under {})",
                    wl_name(*w),
                    fmt_iops(iops),
                    b.x.unwrap_or(0),
                    o.stat.label(),
                    fmt_us(b.lat_us),
                    fmt_us(Some(o.limit_us))
                ));
                // The price is the system under test's (the first target), not a peer's.
                if let Some(c) = o.cost.as_ref().filter(|_| Some(label) == curves.first().map(|c| &c.0)) {
                    cost_rows.push(vec![
                        Cell::text(label),
                        Cell::text(wl_name(*w)),
                        Cell::text(fmt_iops(iops)),
                        Cell::text(format!("{:.4} {}", c.price / iops.max(1e-9), c.currency)),
                        Cell::text(c.usable_gb.map_or("- (give --usable-gb)".into(), |g| format!("{:.3} {}", c.price / g, c.currency))),
                        Cell::text(format!("{:.2} {} per month over {} months", c.price / c.months.max(1e-9), c.currency, c.months)),
                    ]);
                }
            }
            None => s.findings.push(format!(
                "{label}, {}: latency was over {} already at QD1 (or the step failed): no load meets it",
                wl_name(*w),
                fmt_us(Some(o.limit_us))
            )),
        }
    }
    if let Some(c) = &o.cost {
        s.tables.push(Table {
            title: "Cost".into(),
            caption: format!(
                "Price given by the user: {} {} for {} months. Cost per IOPS = price / highest IOPS under {}; cost per usable GB = price / usable GB given by the user.",
                c.price, c.currency, c.months, fmt_us(Some(o.limit_us))
            ),
            columns: ["target", "workload", "IOPS under limit", "cost per IOPS", "cost per usable GB", "cost per month"].map(String::from).to_vec(),
            rows: cost_rows,
        });
    }
    s.plots.push(PlotSpec {
        id: "latency-vs-iops".into(),
        title: format!("{} latency vs IOPS, QD 1 upward", o.stat.label()),
        x_label: "IOPS".into(),
        y_label: format!("{} latency (µs)", o.stat.label()),
        kind: PlotKind::Line { log_x: false },
        series: curves
            .iter()
            .map(|(l, w, pts)| Series {
                name: format!("{l} {}", wl_name(*w)),
                points: pts
                    .iter()
                    .filter_map(|p| Some((p.iops?, p.lat_us?)))
                    .collect(),
            })
            .collect(),
        hlines: vec![(o.limit_us, format!("{} limit", fmt_us(Some(o.limit_us))))],
    });
    Ok(s)
}
