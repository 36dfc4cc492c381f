//! What one fio step does ([`JobSpec`]) and the fio job file it becomes ([`render_jobfile`]).
//!
//! Every step is written as a job file (kept next to its JSON output, so a person can re-run it):
//! a `[global]` section with the workload, one `[vN]` section per volume with the engine options.
//! `thread=1` keeps all fio jobs in one process so its CPU can be read from `/proc/<fio>/stat`;
//! `group_reporting=1` folds all jobs into one result; `lat_percentiles=1` gives percentiles of the
//! total latency (submission + completion), which is what an application waits for.

use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// The access pattern of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    Random,
    Sequential,
}

/// One fio workload. Sizes are bytes; `read_pct` is 100 for pure reads and 0 for pure writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    pub pattern: Pattern,
    pub bs: u64,
    pub read_pct: u8,
    /// IO depth per fio job.
    pub iodepth: u32,
    /// fio jobs (threads) per volume.
    pub numjobs: u32,
    /// Number of volumes, one `[vN]` section each.
    pub volumes: usize,
    pub runtime_s: f64,
    /// Warm-up before statistics start (fio `ramp_time`); excluded from every number.
    pub ramp_s: f64,
    /// Total offered rate over all jobs and volumes (fio `rate_iops`, split evenly); None = as fast as possible.
    pub rate_iops: Option<u64>,
    /// `fdatasync` every N writes (durable-write baseline).
    pub fdatasync: Option<u32>,
    /// Run for a fixed size instead of a time (precondition).
    pub fill: bool,
}

impl JobSpec {
    /// A time-based job with one fio job on one volume.
    pub fn new(pattern: Pattern, bs: u64, read_pct: u8, iodepth: u32) -> Self {
        JobSpec {
            pattern,
            bs,
            read_pct,
            iodepth,
            numjobs: 1,
            volumes: 1,
            runtime_s: 10.0,
            ramp_s: 2.0,
            rate_iops: None,
            fdatasync: None,
            fill: false,
        }
    }

    pub fn jobs(mut self, numjobs: u32) -> Self {
        self.numjobs = numjobs.max(1);
        self
    }

    pub fn volumes(mut self, volumes: usize) -> Self {
        self.volumes = volumes.max(1);
        self
    }

    pub fn timing(mut self, runtime_s: f64, ramp_s: f64) -> Self {
        self.runtime_s = runtime_s;
        self.ramp_s = ramp_s;
        self
    }

    pub fn rate(mut self, rate_iops: Option<u64>) -> Self {
        self.rate_iops = rate_iops;
        self
    }

    /// fio's `rw=` value.
    pub fn rw(&self) -> &'static str {
        match (self.pattern, self.read_pct) {
            (Pattern::Random, 100) => "randread",
            (Pattern::Random, 0) => "randwrite",
            (Pattern::Random, _) => "randrw",
            (Pattern::Sequential, 100) => "read",
            (Pattern::Sequential, 0) => "write",
            (Pattern::Sequential, _) => "rw",
        }
    }

    /// Outstanding IOs over all jobs and volumes.
    pub fn concurrency(&self) -> u64 {
        u64::from(self.iodepth) * u64::from(self.numjobs) * self.volumes as u64
    }

    /// Short name such as `randrw70-4k-qd16-j2-v4`.
    pub fn short_name(&self) -> String {
        let mut s = self.rw().to_string();
        if self.read_pct != 0 && self.read_pct != 100 {
            let _ = write!(s, "{}", self.read_pct);
        }
        let _ = write!(s, "-{}-qd{}", bs_label(self.bs), self.iodepth);
        if self.numjobs > 1 {
            let _ = write!(s, "-j{}", self.numjobs);
        }
        if self.volumes > 1 {
            let _ = write!(s, "-v{}", self.volumes);
        }
        if let Some(r) = self.rate_iops {
            let _ = write!(s, "-rate{r}");
        }
        if let Some(n) = self.fdatasync {
            let _ = write!(s, "-fdatasync{n}");
        }
        s
    }

    /// Human label such as `4K random 70% read, QD16 x 2 jobs`.
    pub fn label(&self) -> String {
        let pat = match self.pattern {
            Pattern::Random => "random",
            Pattern::Sequential => "sequential",
        };
        let mix = match self.read_pct {
            100 => "read".to_string(),
            0 => "write".to_string(),
            r => format!("{r}/{} read/write", 100 - r),
        };
        let mut s = format!(
            "{} {pat} {mix}, QD{}",
            bs_label(self.bs).to_uppercase(),
            self.iodepth
        );
        if self.numjobs > 1 {
            let _ = write!(s, " x {} jobs", self.numjobs);
        }
        if self.volumes > 1 {
            let _ = write!(s, " x {} volumes", self.volumes);
        }
        s
    }
}

/// `1 job`, `2 jobs`.
pub fn jobs_word(n: u32) -> String {
    if n == 1 {
        "1 job".into()
    } else {
        format!("{n} jobs")
    }
}

/// `4096` -> `4k`, `131072` -> `128k`, `1048576` -> `1m`.
pub fn bs_label(bs: u64) -> String {
    if bs >= 1 << 20 && bs.is_multiple_of(1 << 20) {
        format!("{}m", bs >> 20)
    } else if bs >= 1024 && bs.is_multiple_of(1024) {
        format!("{}k", bs >> 10)
    } else {
        format!("{bs}b")
    }
}

/// The fio engine options of one volume, in job-file order (`ioengine=nbd`, `uri=...`).
pub type EngineOptions = Vec<(String, String)>;

/// Renders the job file for `spec` over `volumes` (one engine option set per volume).
/// `percentiles` are extra latency percentiles to report (50, 90, 95, 99, 99.9 are always there).
pub fn render_jobfile(spec: &JobSpec, volumes: &[EngineOptions], percentiles: &[f64]) -> String {
    let mut g = String::from("[global]\n");
    let mut kv = |k: &str, v: String| {
        let _ = writeln!(g, "{k}={v}");
    };
    kv("thread", "1".into());
    kv("group_reporting", "1".into());
    kv("rw", spec.rw().into());
    if spec.read_pct != 0 && spec.read_pct != 100 {
        kv("rwmixread", spec.read_pct.to_string());
    }
    kv("bs", spec.bs.to_string());
    kv("iodepth", spec.iodepth.to_string());
    kv("numjobs", spec.numjobs.to_string());
    if spec.fill {
        // One pass over the whole volume: fio stops at the end of the device.
        kv("time_based", "0".into());
    } else {
        kv("time_based", "1".into());
        kv("runtime", fio_time(spec.runtime_s));
        if spec.ramp_s > 0.0 {
            kv("ramp_time", fio_time(spec.ramp_s));
        }
    }
    if let Some(rate) = spec.rate_iops {
        let per_job = (rate / (u64::from(spec.numjobs) * spec.volumes.max(1) as u64)).max(1);
        kv("rate_iops", per_job.to_string());
    }
    if let Some(n) = spec.fdatasync {
        kv("fdatasync", n.to_string());
    }
    kv("lat_percentiles", "1".into());
    let mut pl: Vec<f64> = vec![50.0, 90.0, 95.0, 99.0, 99.9];
    for p in percentiles {
        if !pl.iter().any(|x| (x - p).abs() < 1e-9) && *p > 0.0 && *p < 100.0 {
            pl.push(*p);
        }
    }
    pl.sort_by(f64::total_cmp);
    let list: Vec<String> = pl.iter().map(|p| format!("{p}")).collect();
    kv("percentile_list", list.join(":"));
    for (i, opts) in volumes.iter().enumerate() {
        let _ = writeln!(g, "\n[v{i}]");
        for (k, v) in opts {
            let _ = writeln!(g, "{k}={v}");
        }
    }
    g
}

/// Seconds as fio wants them: whole seconds as `20`, otherwise milliseconds as `1500ms`.
fn fio_time(s: f64) -> String {
    let ms = (s * 1000.0).round() as u64;
    if ms.is_multiple_of(1000) {
        format!("{}", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_workload() {
        let j = JobSpec::new(Pattern::Random, 4096, 70, 16)
            .jobs(2)
            .volumes(4);
        assert_eq!(j.rw(), "randrw");
        assert_eq!(j.short_name(), "randrw70-4k-qd16-j2-v4");
        assert_eq!(j.concurrency(), 128);
        let s = JobSpec::new(Pattern::Sequential, 128 << 10, 0, 8);
        assert_eq!(s.rw(), "write");
        assert_eq!(s.label(), "128K sequential write, QD8");
        assert_eq!(bs_label(1 << 20), "1m");
        assert_eq!(bs_label(1000), "1000b");
    }

    #[test]
    fn jobfile_splits_the_rate_and_lists_volumes() {
        let j = JobSpec::new(Pattern::Random, 4096, 100, 8)
            .jobs(2)
            .volumes(2)
            .timing(1.5, 0.0)
            .rate(Some(10_000));
        let vols = vec![
            vec![
                ("ioengine".into(), "nbd".into()),
                ("uri".into(), "nbd://a/x".into()),
            ],
            vec![
                ("ioengine".into(), "nbd".into()),
                ("uri".into(), "nbd://a/y".into()),
            ],
        ];
        let text = render_jobfile(&j, &vols, &[99.99]);
        assert!(text.contains("rate_iops=2500\n"), "{text}");
        assert!(text.contains("runtime=1500ms\n"));
        assert!(!text.contains("ramp_time"));
        assert!(text.contains("percentile_list=50:90:95:99:99.9:99.99\n"));
        assert!(text.contains("[v1]\nioengine=nbd\nuri=nbd://a/y\n"));
        assert!(!text.contains("rwmixread"));
    }
}
