//! `results.csv`: one row per step with full-precision numbers (empty cell = not measured).

use crate::model::{RunReport, Step};

pub const HEADER: &[&str] = &[
    "step",
    "section",
    "point",
    "target",
    "status",
    "error",
    "rw",
    "bs",
    "read_pct",
    "iodepth",
    "numjobs",
    "volumes",
    "rate_iops",
    "runtime_s",
    "ramp_s",
    "iops",
    "read_iops",
    "write_iops",
    "mib_s",
    "mbit_s",
    "read_mean_us",
    "read_p99_us",
    "write_mean_us",
    "write_p99_us",
    "server_cpu_pct",
    "client_cpu_pct",
    "machine_cpu_pct",
    "foreign_cpu_pct",
    "server_us_per_io",
    "client_us_per_io",
    "limit",
    "limit_value",
    "limit_unit",
    "fraction_of_limit",
    "attempts",
    "warnings",
    "fio_json",
];

/// The whole CSV document.
pub fn render(r: &RunReport) -> String {
    let mut out = HEADER.join(",");
    out.push('\n');
    for s in r.all_steps() {
        out.push_str(
            &row(s)
                .iter()
                .map(|c| quote(c))
                .collect::<Vec<_>>()
                .join(","),
        );
        out.push('\n');
    }
    out
}

fn row(s: &Step) -> Vec<String> {
    let f = |v: Option<f64>| v.map(|v| format!("{v}")).unwrap_or_default();
    let st = s.stats();
    let cpu = s.cpu.as_ref();
    let j = &s.job;
    vec![
        s.id.clone(),
        s.section.clone(),
        s.point.clone(),
        s.target.clone(),
        if st.is_some() { "ok" } else { "failed" }.into(),
        s.outcome.error().unwrap_or("").into(),
        j.rw().into(),
        j.bs.to_string(),
        j.read_pct.to_string(),
        j.iodepth.to_string(),
        j.numjobs.to_string(),
        j.volumes.to_string(),
        j.rate_iops.map(|r| r.to_string()).unwrap_or_default(),
        format!("{}", j.runtime_s),
        format!("{}", j.ramp_s),
        f(st.map(|s| s.iops())),
        f(st.map(|s| s.read.iops)),
        f(st.map(|s| s.write.iops)),
        f(st.map(|s| s.mib_s())),
        f(st.map(|s| s.mbit_s())),
        f(st.and_then(|s| s.read.lat_mean_us)),
        f(st.and_then(|s| s.read.pct(99.0))),
        f(st.and_then(|s| s.write.lat_mean_us)),
        f(st.and_then(|s| s.write.pct(99.0))),
        f(cpu.and_then(|c| c.server_pct)),
        f(cpu.and_then(|c| c.client_pct)),
        f(cpu.map(|c| c.machine_pct)),
        f(cpu.map(|c| c.foreign_pct)),
        f(cpu.and_then(|c| c.server_us_per_io)),
        f(cpu.and_then(|c| c.client_us_per_io)),
        s.limit.as_ref().map(|l| l.name.clone()).unwrap_or_default(),
        f(s.limit.as_ref().map(|l| l.limit)),
        s.limit.as_ref().map(|l| l.unit.clone()).unwrap_or_default(),
        f(s.limit.as_ref().map(|l| l.fraction)),
        s.attempts.to_string(),
        s.warnings.join("; "),
        s.fio_json.clone(),
    ]
}

/// RFC 4180 quoting when needed.
pub fn quote(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote("plain"), "plain");
        assert_eq!(quote("a,b"), "\"a,b\"");
        assert_eq!(quote("say \"x\""), "\"say \"\"x\"\"\"");
    }
}
