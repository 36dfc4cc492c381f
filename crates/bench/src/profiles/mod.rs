//! The profiles: each measures through the [`Runner`] and returns report [`Section`]s.
//!
//! | profile | seed | what it answers |
//! |---|---|---|
//! | [`baseline`] | MinIO | raw disk and network limits |
//! | [`matrix`] | simplyblock Tables 1-8 | IOPS and Mbit/s for 4K/128K, random/sequential, 5 mixes |
//! | [`latency_target`] | simplyblock | highest IOPS under latency targets, by volumes and by IO depth |
//! | [`latency_load`] | StorPool | latency vs IOPS as QD rises until 1 ms; cost per IOPS / GB |
//! | [`threads`] | Curvine | 256K sequential and random read from 1 to N jobs |
//! | [`mix`] | RAID review | 0-100% reads in 10% steps at several QDs, 4K random and 128K sequential |
//! | [`autotune`] | MinIO speedtest | concurrency where throughput stops growing (the knee) |
//! | [`compare`] | data-path issue | Basalt vs nbdkit vs raw file, 7 jobs + durable-write baseline |
//! | [`cluster`] | cluster issue | `basalt up --nodes 3` (3 copies) vs single-node Basalt vs `nbdkit memory`, compare's 7 jobs |
//!
//! Every profile runs each point on every benchmarked target, so a peer (`--peer-*`) appears beside
//! Basalt in every table with ratios.

pub mod autotune;
pub mod baseline;
pub mod cluster;
pub mod compare;
pub mod latency_load;
pub mod latency_target;
pub mod matrix;
pub mod mix;
pub mod threads;

use crate::model::{Cell, Step};
use crate::report::format::{fmt_iops, fmt_mib, fmt_pct, fmt_ratio, fmt_thousands, fmt_us};

/// What a table cell shows of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    Iops,
    IopsExact,
    Mbit,
    MibS,
    GibS,
    LatMean,
    LatP99,
    ServerUsPerIo,
    ClientUsPerIo,
    FractionOfLimit,
}

impl Metric {
    pub fn key(self) -> &'static str {
        match self {
            Metric::Iops | Metric::IopsExact => "iops",
            Metric::Mbit => "mbit_s",
            Metric::MibS => "mib_s",
            Metric::GibS => "gib_s",
            Metric::LatMean => "lat_mean_us",
            Metric::LatP99 => "lat_p99_us",
            Metric::ServerUsPerIo => "server_us_per_io",
            Metric::ClientUsPerIo => "client_us_per_io",
            Metric::FractionOfLimit => "fraction_of_limit",
        }
    }

    /// The value of this metric for a successful step.
    pub fn value(self, s: &Step) -> Option<f64> {
        let st = s.stats()?;
        match self {
            Metric::Iops | Metric::IopsExact => Some(st.iops()),
            Metric::Mbit => Some(st.mbit_s()),
            Metric::MibS => Some(st.mib_s()),
            Metric::GibS => Some(st.gib_s()),
            Metric::LatMean => st.lat_mean_us(),
            Metric::LatP99 => st.lat_pct_us(99.0),
            Metric::ServerUsPerIo => s.cpu.as_ref()?.server_us_per_io,
            Metric::ClientUsPerIo => s.cpu.as_ref()?.client_us_per_io,
            Metric::FractionOfLimit => s.limit.as_ref().map(|l| l.fraction),
        }
    }

    pub fn text(self, v: f64) -> String {
        match self {
            Metric::Iops => fmt_iops(v),
            Metric::IopsExact | Metric::Mbit => fmt_thousands(v),
            Metric::MibS => fmt_mib(v),
            Metric::GibS => format!("{v:.2}"),
            Metric::LatMean | Metric::LatP99 => fmt_us(Some(v)),
            Metric::ServerUsPerIo | Metric::ClientUsPerIo => format!("{v:.1}"),
            Metric::FractionOfLimit => fmt_pct(v),
        }
    }
}

/// The cell for `metric` of `step`: the number, "failed" with fio's error, or "-" when the step
/// was not run or the metric does not apply.
pub fn cell(step: Option<&Step>, metric: Metric) -> Cell {
    let Some(s) = step else {
        return Cell::na("not measured");
    };
    if let Some(e) = s.outcome.error() {
        return Cell::failed(&s.id, e);
    }
    match metric.value(s) {
        Some(v) => {
            let mut c = Cell::num(metric.text(v), v, &s.id, metric.key());
            if metric == Metric::FractionOfLimit {
                c.note = s
                    .limit
                    .as_ref()
                    .map(|l| format!("{:.1} {} limit: {}", l.limit, l.unit, l.name));
                if let Some(l) = &s.limit {
                    c.text = format!("{} of {}", c.text, short_limit(&l.name));
                }
            }
            c
        }
        None => Cell::na(match metric {
            Metric::FractionOfLimit => "no baseline measured",
            Metric::ServerUsPerIo => "no server process known",
            _ => "no IO completed",
        }),
    }
}

/// `disk 4K random read (4K random, O_DIRECT, QD64)` -> `disk 4K random read`.
pub fn short_limit(name: &str) -> String {
    name.split(" (").next().unwrap_or(name).to_string()
}

/// `a / b` of a metric, as a cell (e.g. Basalt IOPS / nbdkit IOPS).
pub fn ratio_cell(a: Option<&Step>, b: Option<&Step>, metric: Metric) -> Cell {
    match (
        a.and_then(|s| metric.value(s)),
        b.and_then(|s| metric.value(s)),
    ) {
        (Some(x), Some(y)) if y > 0.0 => {
            let r = x / y;
            Cell {
                text: fmt_ratio(r),
                value: Some(r),
                metric: Some(format!("ratio_{}", metric.key())),
                ..Cell::default()
            }
        }
        _ => Cell::na("one side failed or was not measured"),
    }
}

/// Parses a comma-separated list (`4,8,16`).
pub fn parse_list<T: std::str::FromStr>(
    s: &str,
    what: &str,
) -> Result<Vec<T>, crate::error::BenchError> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            p.trim().parse::<T>().map_err(|_| {
                crate::error::BenchError::InvalidOption(format!(
                    "'{p}' in {what} is not a number; write e.g. 4,8,16"
                ))
            })
        })
        .collect()
}

/// `1, 2, 4, ...` up to and including `max` (and `max` itself if it is not a power of two).
pub fn powers_of_two(min: u32, max: u32) -> Vec<u32> {
    let mut v = Vec::new();
    let mut x = min.max(1);
    while x <= max {
        v.push(x);
        x = x.saturating_mul(2);
    }
    if v.last() != Some(&max) && max >= min {
        v.push(max);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists() {
        assert_eq!(powers_of_two(1, 8), vec![1, 2, 4, 8]);
        assert_eq!(powers_of_two(4, 12), vec![4, 8, 12]);
        assert_eq!(
            parse_list::<u32>("4, 8,16", "x").expect("ok"),
            vec![4, 8, 16]
        );
        assert!(parse_list::<u32>("4,x", "--iodepths").is_err());
        assert_eq!(
            short_limit("disk 4K random read (4K random, O_DIRECT, QD64)"),
            "disk 4K random read"
        );
    }
}
