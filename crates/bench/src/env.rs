//! The facts a reader needs to judge the numbers: machine, disk, software versions, targets, run
//! settings. Written to `env.json` and shown at the top of the report.

use crate::target::{TargetInfo, tool_version};
use serde::Serialize;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// Machine and run facts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Env {
    pub hostname: String,
    pub cpu_model: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub os: String,
    pub disk: DiskInfo,
    pub fio_version: Option<String>,
    pub nbdkit_version: Option<String>,
    pub bench_version: String,
    pub targets: Vec<TargetInfo>,
    /// Where fio ran relative to the servers.
    pub client: String,
    pub runtime_s: f64,
    pub ramp_s: f64,
    pub quiet_max_pct: f64,
    pub settle_max_pct: f64,
}

/// The block device under the scratch directory.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DiskInfo {
    pub path: String,
    pub device: String,
    pub model: String,
    pub rotational: Option<bool>,
    pub write_cache: String,
    pub filesystem: String,
    pub size_gib: Option<f64>,
}

impl Env {
    /// Collects what can be read here; unknown facts stay empty rather than guessed.
    pub fn collect(scratch: &Path) -> Env {
        let cpuinfo = read("/proc/cpuinfo");
        let meminfo = read("/proc/meminfo");
        let mem_kib: f64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let os = read("/etc/os-release")
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|s| s.trim_matches('"').to_string())
            .unwrap_or_default();
        Env {
            hostname: read("/proc/sys/kernel/hostname").trim().to_string(),
            cpu_model: cpuinfo
                .lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_gib: mem_kib / (1024.0 * 1024.0),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            os,
            disk: DiskInfo::of(scratch),
            fio_version: tool_version("fio", &["--version"]),
            nbdkit_version: tool_version("nbdkit", &["--version"]),
            bench_version: env!("CARGO_PKG_VERSION").to_string(),
            ..Env::default()
        }
    }
}

impl DiskInfo {
    /// The device and file system holding `path`.
    pub fn of(path: &Path) -> DiskInfo {
        let mut d = DiskInfo {
            path: path.display().to_string(),
            ..DiskInfo::default()
        };
        if let Ok(meta) = std::fs::metadata(path) {
            let dev = meta.dev();
            let (major, minor) = (
                ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff),
                (dev & 0xff) | ((dev >> 12) & !0xff),
            );
            let sys = format!("/sys/dev/block/{major}:{minor}");
            if let Ok(real) = std::fs::canonicalize(&sys) {
                // A partition's queue/ lives in its parent device's directory.
                let base = if real.join("queue").exists() {
                    real.clone()
                } else {
                    real.parent().map(Path::to_path_buf).unwrap_or(real.clone())
                };
                d.device = base
                    .file_name()
                    .map(|s| format!("/dev/{}", s.to_string_lossy()))
                    .unwrap_or_default();
                d.rotational = match read(base.join("queue/rotational")).trim() {
                    "1" => Some(true),
                    "0" => Some(false),
                    _ => None,
                };
                d.write_cache = read(base.join("queue/write_cache")).trim().to_string();
                let model = read(base.join("device/model")).trim().to_string();
                let vendor = read(base.join("device/vendor")).trim().to_string();
                d.model = match (model.is_empty(), vendor.as_str()) {
                    (false, _) => model,
                    (true, "0x1af4") => "virtio (vendor 0x1af4)".into(),
                    (true, "") => String::new(),
                    (true, v) => format!("vendor {v}"),
                };
                d.size_gib = read(base.join("size"))
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .map(|s| s * 512.0 / f64::from(1u32 << 30));
            }
        }
        let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mounts = read("/proc/mounts");
        d.filesystem = mounts
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() > 2 && canon.starts_with(f[1]))
                    .then(|| (f[1].len(), format!("{} on {} ({})", f[2], f[1], f[0])))
            })
            .max_by_key(|(n, _)| *n)
            .map(|(_, s)| s)
            .unwrap_or_default();
        d
    }
}

fn read(p: impl AsRef<Path>) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Seconds since the epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `2026-11-22T03:47:29Z` for a Unix time (UTC; civil-from-days).
pub fn utc_iso(secs: u64) -> String {
    let (date, tod) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(date as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        tod / 3600,
        tod % 3600 / 60,
        tod % 60
    )
}

/// `20261122-034729` for directory names.
pub fn utc_compact(secs: u64) -> String {
    utc_iso(secs)
        .replace(['-', ':'], "")
        .replace('T', "-")
        .trim_end_matches('Z')
        .to_string()
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formatting() {
        assert_eq!(utc_iso(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_iso(1_795_319_258), "2026-11-22T03:47:38Z");
        assert_eq!(utc_iso(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_compact(1_795_319_258), "20261122-034738");
    }

    #[test]
    fn collects_this_machine() {
        let e = Env::collect(Path::new("/tmp"));
        assert!(e.cores >= 1 && e.memory_gib > 0.0, "{e:?}");
        assert!(!e.kernel.is_empty());
        assert!(e.disk.filesystem.contains(" on /"), "{:?}", e.disk);
    }
}
