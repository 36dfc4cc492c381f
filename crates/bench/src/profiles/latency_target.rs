//! simplyblock's "max IOPS within a latency target": for each volume count (1, 2, 4) and for each IO
//! depth (4-128), the highest 4K random read and write IOPS whose latency (mean or a percentile)
//! stays under the target (default read 300 µs, write 500 µs).
//!
//! Method: run unthrottled; if the target is missed, bisect fio's offered rate (`rate_iops`) between
//! 0 and the unthrottled IOPS ([`crate::search::rate_search`]). A point that never meets the target
//! says so, with the lowest rate tried and its latency.

use crate::error::BenchError;
use crate::job::{JobSpec, Pattern};
use crate::model::{Cell, PlotKind, PlotSpec, Section, Series, Table};
use crate::report::format::{fmt_iops, fmt_thousands, fmt_us};
use crate::runner::Runner;
use crate::search::{LatencyGoal, RateSearch, SearchOutcome, rate_search};

/// Latency-target settings.
#[derive(Debug, Clone)]
pub struct LatencyTargetOpts {
    pub goal: LatencyGoal,
    pub volumes: Vec<usize>,
    /// IO depth of the by-volumes sweep.
    pub volume_iodepth: u32,
    pub iodepths: Vec<u32>,
    /// Volumes used in the by-IO-depth sweep.
    pub iodepth_volumes: usize,
    pub jobs: u32,
    pub bisect_steps: u32,
}

/// Runs one search; infrastructure errors are returned, failed steps are part of the result.
fn search(
    r: &mut Runner,
    s: &mut Section,
    t: usize,
    point: &str,
    job: &JobSpec,
    o: &LatencyTargetOpts,
) -> Result<RateSearch, BenchError> {
    let mut err = None;
    let res = rate_search(&o.goal, o.bisect_steps, |rate| {
        r.plan(1);
        let p = format!(
            "{point}-{}",
            rate.map_or("max".to_string(), |x| format!("rate{x}"))
        );
        match r.measure(s, &p, t, &job.clone().rate(rate)) {
            Ok(st) => (st.stats().cloned(), st.id),
            Err(e) => {
                err = Some(e);
                (None, String::new())
            }
        }
    });
    match err {
        Some(e) => Err(e),
        None => Ok(res),
    }
}

fn answer_cells(res: &RateSearch, bs: u64) -> [Cell; 4] {
    let step = res.best().map(|b| b.step.clone()).unwrap_or_default();
    match (res.outcome, res.best()) {
        (SearchOutcome::Failed, _) => {
            let id = res
                .points
                .first()
                .map(|p| p.step.clone())
                .unwrap_or_default();
            [
                Cell::failed(&id, "the unthrottled step failed; see Failed steps"),
                Cell::na(""),
                Cell::na(""),
                Cell::na(""),
            ]
        }
        (_, Some(b)) => {
            let iops = b.iops.unwrap_or(0.0);
            let mbit = iops * bs as f64 * 8.0 / 1e6;
            [
                Cell::num(fmt_thousands(iops), iops, &step, "iops"),
                Cell::num(fmt_thousands(mbit), mbit, &step, "mbit_s"),
                Cell::text(fmt_us(b.lat_us)),
                Cell::text(match b.x {
                    None => "unthrottled".to_string(),
                    Some(r) => format!("offered {}", fmt_iops(r as f64)),
                }),
            ]
        }
        (_, None) => {
            let low = res
                .points
                .iter()
                .filter(|p| p.x.is_some())
                .min_by_key(|p| p.x);
            let note = match low {
                Some(p) => format!(
                    "lowest rate tried {} IOPS: {}",
                    p.x.unwrap_or(0),
                    fmt_us(p.lat_us)
                ),
                None => format!(
                    "unthrottled: {}",
                    fmt_us(res.points.first().and_then(|p| p.lat_us))
                ),
            };
            let mut c = Cell::text("never met");
            c.note = Some(note.clone());
            [
                c,
                Cell::text("-"),
                Cell::text(note),
                Cell::text(format!("{} tries", res.points.len())),
            ]
        }
    }
}

/// Runs both sweeps on every benchmarked target.
pub fn run(r: &mut Runner, o: &LatencyTargetOpts) -> Result<Section, BenchError> {
    let g = &o.goal;
    let mut s = Section::new(
        "latency-target",
        "Max IOPS within a latency target",
        format!(
            "4K random reads and writes separately; target: read {} µs, write {} µs, judged by the {} latency. Each point runs unthrottled first; if that misses the target, up to {} bisections of fio's offered rate (rate_iops) between 0 and the unthrottled IOPS find the highest rate that meets it. {} per volume.",
            g.read_us,
            g.write_us,
            g.stat.label(),
            o.bisect_steps,
            crate::job::jobs_word(o.jobs)
        ),
    );
    let targets = r.bench_targets();
    let mut by_vol: Vec<(String, usize, RateSearch, RateSearch)> = Vec::new();
    let mut by_qd: Vec<(String, u32, RateSearch, RateSearch)> = Vec::new();
    for &t in &targets {
        let label = r.targets[t].label().to_string();
        for &v in &o.volumes {
            let base = r
                .job(Pattern::Random, 4096, 100, o.volume_iodepth)
                .jobs(o.jobs)
                .volumes(v);
            let rd = search(r, &mut s, t, &format!("vol{v}-read"), &base, o)?;
            let mut w = base.clone();
            w.read_pct = 0;
            let wr = search(r, &mut s, t, &format!("vol{v}-write"), &w, o)?;
            by_vol.push((label.clone(), v, rd, wr));
        }
        for &qd in &o.iodepths {
            let base = r
                .job(Pattern::Random, 4096, 100, qd)
                .jobs(o.jobs)
                .volumes(o.iodepth_volumes);
            let rd = search(r, &mut s, t, &format!("qd{qd}-read"), &base, o)?;
            let mut w = base.clone();
            w.read_pct = 0;
            let wr = search(r, &mut s, t, &format!("qd{qd}-write"), &w, o)?;
            by_qd.push((label.clone(), qd, rd, wr));
        }
    }
    let cols = |first: &str| {
        [
            first,
            "target",
            "read IOPS",
            "read Mbit/s",
            "read latency",
            "read found at",
            "write IOPS",
            "write Mbit/s",
            "write latency",
            "write found at",
        ]
        .map(String::from)
        .to_vec()
    };
    let row = |k: String, l: &str, rd: &RateSearch, wr: &RateSearch| {
        let mut v = vec![Cell::text(k), Cell::text(l)];
        v.extend(answer_cells(rd, 4096));
        v.extend(answer_cells(wr, 4096));
        v
    };
    s.tables.push(Table {
        title: format!("Max IOPS and throughput by number of volumes (bs=4K, read {} µs, write {} µs, {})", g.read_us, g.write_us, g.stat.label()),
        caption: format!("{} x QD{} per volume. \"never met\": no tried rate kept the {} latency under the target (hover for the lowest rate tried).", crate::job::jobs_word(o.jobs), o.volume_iodepth, g.stat.label()),
        columns: cols("volumes"),
        rows: by_vol.iter().map(|(l, v, rd, wr)| row(v.to_string(), l, rd, wr)).collect(),
    });
    s.tables.push(Table {
        title: format!(
            "Max IOPS by IO depth within the latency target ({} volumes, {} per volume)",
            o.iodepth_volumes,
            crate::job::jobs_word(o.jobs)
        ),
        caption: "Same search at each IO depth.".into(),
        columns: cols("IO depth"),
        rows: by_qd
            .iter()
            .map(|(l, q, rd, wr)| row(q.to_string(), l, rd, wr))
            .collect(),
    });
    let best = |x: &RateSearch| x.best().and_then(|b| b.iops);
    let labels: Vec<String> = targets
        .iter()
        .map(|t| r.targets[*t].label().to_string())
        .collect();
    let mut vs = Vec::new();
    let mut qs = Vec::new();
    for l in &labels {
        for (dir, pick) in [("read", 0usize), ("write", 1)] {
            let pts = by_vol
                .iter()
                .filter(|e| &e.0 == l)
                .enumerate()
                .filter_map(|(i, e)| {
                    best(if pick == 0 { &e.2 } else { &e.3 }).map(|v| (i as f64, v))
                })
                .collect();
            vs.push(Series {
                name: format!("{l} {dir}"),
                points: pts,
            });
            let pts = by_qd
                .iter()
                .filter(|e| &e.0 == l)
                .filter_map(|e| {
                    best(if pick == 0 { &e.2 } else { &e.3 }).map(|v| (f64::from(e.1), v))
                })
                .collect();
            qs.push(Series {
                name: format!("{l} {dir}"),
                points: pts,
            });
        }
    }
    s.plots.push(PlotSpec {
        id: "latency-target-volumes".into(),
        title: format!(
            "Max 4K IOPS within read {} µs / write {} µs ({}) by volumes",
            g.read_us,
            g.write_us,
            g.stat.label()
        ),
        x_label: "number of volumes".into(),
        y_label: "IOPS within the latency target".into(),
        kind: PlotKind::Bar {
            categories: o.volumes.iter().map(|v| v.to_string()).collect(),
        },
        series: vs,
        hlines: Vec::new(),
    });
    s.plots.push(PlotSpec {
        id: "latency-target-iodepth".into(),
        title: format!(
            "Max 4K IOPS within the latency target by IO depth ({} volumes)",
            o.iodepth_volumes
        ),
        x_label: "IO depth per job (log scale)".into(),
        y_label: "IOPS within the latency target".into(),
        kind: PlotKind::Line { log_x: true },
        series: qs,
        hlines: Vec::new(),
    });
    for (l, v, rd, wr) in &by_vol {
        s.findings.push(format!(
            "{l}, {v} volume(s), within the target: read {}, write {}",
            best(rd).map_or("never met".into(), |x| format!("{} IOPS", fmt_iops(x))),
            best(wr).map_or("never met".into(), |x| format!("{} IOPS", fmt_iops(x)))
        ));
    }
    Ok(s)
}
