//! fio's JSON output (`--output-format=json`) into typed numbers ([`IoStats`]).
//!
//! fio may print lines such as `fio: connected to NBD server` into the output file before the JSON
//! document; [`parse_fio_json`] skips to the first `{`. Several jobs (no `group_reporting`) are summed:
//! IOPS and bandwidth add up, means are weighted by completed IOs, and a percentile is the worst of
//! the jobs (an upper bound, never an invented number).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// fio's whole JSON document (only the parts we read).
#[derive(Debug, Clone, Deserialize)]
pub struct FioOutput {
    #[serde(rename = "fio version", default)]
    pub fio_version: String,
    #[serde(default)]
    pub jobs: Vec<FioJob>,
}

/// One entry of `jobs[]`.
#[derive(Debug, Clone, Deserialize)]
pub struct FioJob {
    #[serde(default)]
    pub jobname: String,
    #[serde(default)]
    pub error: i64,
    pub read: FioDir,
    pub write: FioDir,
}

/// `jobs[].read` / `jobs[].write`.
#[derive(Debug, Clone, Deserialize)]
pub struct FioDir {
    #[serde(default)]
    pub io_bytes: u64,
    #[serde(default)]
    pub bw_bytes: f64,
    #[serde(default)]
    pub iops: f64,
    #[serde(default)]
    pub runtime: u64,
    #[serde(default)]
    pub total_ios: u64,
    #[serde(default)]
    pub lat_ns: Option<FioLat>,
    #[serde(default)]
    pub clat_ns: Option<FioLat>,
}

/// A latency block in nanoseconds; `percentile` maps `"99.000000"` to a value.
#[derive(Debug, Clone, Deserialize)]
pub struct FioLat {
    #[serde(default)]
    pub mean: f64,
    #[serde(default)]
    pub max: f64,
    #[serde(default)]
    pub percentile: BTreeMap<String, f64>,
}

/// One direction (read or write) of a step, latencies in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DirStats {
    pub iops: f64,
    pub bw_bytes: f64,
    pub total_ios: u64,
    /// Mean total latency (fio `lat_ns`, falling back to `clat_ns`); None when no IO completed.
    pub lat_mean_us: Option<f64>,
    pub lat_max_us: Option<f64>,
    /// Percentiles keyed by their name in fio (`"99"`, `"99.9"`), in µs.
    pub lat_pct_us: BTreeMap<String, f64>,
}

impl DirStats {
    /// The percentile `p` (e.g. 99.0), if fio reported it.
    pub fn pct(&self, p: f64) -> Option<f64> {
        self.lat_pct_us.get(&pct_key(p)).copied()
    }
}

/// A step's result: both directions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IoStats {
    pub read: DirStats,
    pub write: DirStats,
}

impl IoStats {
    pub fn iops(&self) -> f64 {
        self.read.iops + self.write.iops
    }
    pub fn bw_bytes(&self) -> f64 {
        self.read.bw_bytes + self.write.bw_bytes
    }
    pub fn mib_s(&self) -> f64 {
        self.bw_bytes() / (1024.0 * 1024.0)
    }
    /// Megabits per second (10^6 bits), as in the simplyblock tables.
    pub fn mbit_s(&self) -> f64 {
        self.bw_bytes() * 8.0 / 1e6
    }
    pub fn gib_s(&self) -> f64 {
        self.bw_bytes() / (1024.0 * 1024.0 * 1024.0)
    }
    pub fn total_ios(&self) -> u64 {
        self.read.total_ios + self.write.total_ios
    }
    /// Mean latency over both directions, weighted by completed IOs.
    pub fn lat_mean_us(&self) -> Option<f64> {
        weighted_mean(&[
            (self.read.lat_mean_us, self.read.total_ios),
            (self.write.lat_mean_us, self.write.total_ios),
        ])
    }
    /// The worse of the two directions' percentile `p`.
    pub fn lat_pct_us(&self, p: f64) -> Option<f64> {
        max_opt(self.read.pct(p), self.write.pct(p))
    }
}

/// `99.0` -> `"99"`, `99.9` -> `"99.9"`: the key used in [`DirStats::lat_pct_us`].
pub fn pct_key(p: f64) -> String {
    let s = format!("{p:.6}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Parses fio's JSON output, skipping any text fio printed before the document.
pub fn parse_fio_json(text: &str) -> Result<FioOutput, String> {
    let start = text
        .find("\n{")
        .map(|i| i + 1)
        .or_else(|| text.starts_with('{').then_some(0))
        .ok_or_else(|| "no JSON document in fio's output".to_string())?;
    let mut it = serde_json::Deserializer::from_str(&text[start..]).into_iter::<FioOutput>();
    match it.next() {
        Some(Ok(out)) => Ok(out),
        Some(Err(e)) => Err(e.to_string()),
        None => Err("empty fio output".to_string()),
    }
}

/// Sums all jobs of one fio run into an [`IoStats`].
pub fn aggregate(out: &FioOutput) -> IoStats {
    IoStats {
        read: aggregate_dir(out.jobs.iter().map(|j| &j.read)),
        write: aggregate_dir(out.jobs.iter().map(|j| &j.write)),
    }
}

fn aggregate_dir<'a>(dirs: impl Iterator<Item = &'a FioDir>) -> DirStats {
    let mut s = DirStats::default();
    let mut means = Vec::new();
    for d in dirs {
        s.iops += d.iops;
        s.bw_bytes += d.bw_bytes;
        s.total_ios += d.total_ios;
        if d.total_ios == 0 {
            continue; // fio prints zeros for a direction without IO: not a latency of 0
        }
        // Total latency when fio reported its percentiles (lat_percentiles=1), else completion latency.
        let lat = match (&d.lat_ns, &d.clat_ns) {
            (Some(l), _) if !l.percentile.is_empty() => l,
            (_, Some(c)) => c,
            (Some(l), None) => l,
            (None, None) => continue,
        };
        means.push((Some(lat.mean / 1000.0), d.total_ios));
        s.lat_max_us = max_opt(s.lat_max_us, Some(lat.max / 1000.0));
        for (k, v) in &lat.percentile {
            let Ok(p) = k.parse::<f64>() else { continue };
            let e = s.lat_pct_us.entry(pct_key(p)).or_insert(0.0);
            *e = e.max(v / 1000.0);
        }
    }
    s.lat_mean_us = weighted_mean(&means);
    s
}

fn weighted_mean(parts: &[(Option<f64>, u64)]) -> Option<f64> {
    let (sum, n) = parts
        .iter()
        .filter_map(|(m, n)| m.map(|m| (m * *n as f64, *n)))
        .fold((0.0, 0u64), |(s, c), (m, n)| (s + m, c + n));
    (n > 0).then(|| sum / n as f64)
}

fn max_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_keys_are_short() {
        assert_eq!(pct_key(99.0), "99");
        assert_eq!(pct_key(99.9), "99.9");
        assert_eq!(pct_key(50.0), "50");
    }

    #[test]
    fn garbage_is_an_error_not_a_zero() {
        assert!(parse_fio_json("fio: something broke\n").is_err());
        assert!(parse_fio_json("{ \"jobs\": [ {").is_err());
    }
}
