//! Raw limits measured before anything else (MinIO's method): the disk under the scratch directory
//! through fio io_uring with O_DIRECT (1 MiB sequential, like dd/dperf; 4K random at QD64), and the
//! network through Basalt's own TCP probe ([`crate::net`]). [`Baselines::limit_for`] picks the
//! limit that bounds a later result, so every result can be shown as a fraction of it.
//!
//! Which limit applies (documented in docs/design/bench.md):
//! * blocks up to 16 KiB are bounded in IOPS by the disk's 4K random read/write IOPS;
//!   larger blocks in bandwidth by the disk's 1 MiB sequential read/write bandwidth;
//! * a read/write mix is bounded by the time-shared combination `1 / (r/R + w/W)`;
//! * the network bounds bandwidth (converted to IOPS at the block size); the smaller limit wins.

use crate::job::JobSpec;
use crate::model::LimitUse;
use crate::net::NetBaseline;
use crate::parse::IoStats;
use serde::Serialize;

/// The measured raw limits.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Baselines {
    /// Where the device baseline ran (the scratch directory's file system).
    pub device_path: String,
    pub seq_read_bytes_s: Option<f64>,
    pub seq_write_bytes_s: Option<f64>,
    pub rand_read_iops: Option<f64>,
    pub rand_write_iops: Option<f64>,
    /// 4K random write QD64 with fdatasync every 32 writes: the durable-write limit (shown, not used
    /// as the bound, since O_DIRECT without sync is the device's upper limit).
    pub rand_write_durable_iops: Option<f64>,
    pub net: Option<NetBaseline>,
}

/// Blocks up to this size are IOPS-bound, larger ones bandwidth-bound.
pub const SMALL_BLOCK: u64 = 16 * 1024;

impl Baselines {
    /// The raw limit that bounds `stats` measured with `job`, and the fraction reached.
    pub fn limit_for(&self, job: &JobSpec, stats: &IoStats) -> Option<LimitUse> {
        let r = f64::from(job.read_pct) / 100.0;
        let w = 1.0 - r;
        let mix_name = |what: &str| match job.read_pct {
            100 => format!("disk {what} read"),
            0 => format!("disk {what} write"),
            p => format!("disk {what} {p}/{} mix", 100 - p),
        };
        let combine = |read: Option<f64>, write: Option<f64>| -> Option<f64> {
            match job.read_pct {
                100 => return read.filter(|v| *v > 0.0),
                0 => return write.filter(|v| *v > 0.0),
                _ => {}
            }
            let mut t = 0.0;
            if r > 0.0 {
                t += r / read.filter(|v| *v > 0.0)?;
            }
            if w > 0.0 {
                t += w / write.filter(|v| *v > 0.0)?;
            }
            (t > 0.0).then(|| 1.0 / t)
        };
        let bs = job.bs as f64;
        // Candidate limits in IOPS at this block size: (name, iops limit).
        let mut cands: Vec<(String, f64)> = Vec::new();
        if job.bs <= SMALL_BLOCK {
            if let Some(l) = combine(self.rand_read_iops, self.rand_write_iops) {
                cands.push((
                    format!("{} (4K random, O_DIRECT, QD64)", mix_name("4K random")),
                    l,
                ));
            }
        } else if let Some(l) = combine(self.seq_read_bytes_s, self.seq_write_bytes_s) {
            cands.push((
                format!("{} (1M sequential, O_DIRECT)", mix_name("bandwidth")),
                l / bs,
            ));
        }
        if let Some(n) = &self.net {
            cands.push((
                format!("network {} ({:.1} Gbit/s)", n.path, n.gbit_s()),
                n.throughput_bytes_s / bs,
            ));
        }
        let (name, iops_limit) = cands.into_iter().min_by(|a, b| a.1.total_cmp(&b.1))?;
        if job.bs <= SMALL_BLOCK {
            Some(LimitUse {
                name,
                unit: "IOPS".into(),
                limit: iops_limit,
                value: stats.iops(),
                fraction: stats.iops() / iops_limit,
            })
        } else {
            let lim = iops_limit * bs / (1024.0 * 1024.0);
            Some(LimitUse {
                name,
                unit: "MiB/s".into(),
                limit: lim,
                value: stats.mib_s(),
                fraction: stats.mib_s() / lim,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Pattern;
    use crate::parse::DirStats;

    fn stats(r_iops: f64, w_iops: f64, bs: f64) -> IoStats {
        IoStats {
            read: DirStats {
                iops: r_iops,
                bw_bytes: r_iops * bs,
                ..DirStats::default()
            },
            write: DirStats {
                iops: w_iops,
                bw_bytes: w_iops * bs,
                ..DirStats::default()
            },
        }
    }

    fn base() -> Baselines {
        Baselines {
            seq_read_bytes_s: Some(1000.0 * 1024.0 * 1024.0),
            seq_write_bytes_s: Some(500.0 * 1024.0 * 1024.0),
            rand_read_iops: Some(100_000.0),
            rand_write_iops: Some(50_000.0),
            ..Baselines::default()
        }
    }

    #[test]
    fn small_blocks_use_random_iops_and_mixes_combine() {
        let j = JobSpec::new(Pattern::Random, 4096, 100, 64);
        let l = base()
            .limit_for(&j, &stats(25_000.0, 0.0, 4096.0))
            .expect("limit");
        assert_eq!(
            (l.unit.as_str(), l.limit, l.fraction),
            ("IOPS", 100_000.0, 0.25)
        );
        assert!(l.name.contains("4K random read"), "{}", l.name);
        // 50/50: 1 / (0.5/100k + 0.5/50k) = 66_666.7
        let j = JobSpec::new(Pattern::Random, 4096, 50, 64);
        let l = base()
            .limit_for(&j, &stats(10_000.0, 10_000.0, 4096.0))
            .expect("limit");
        assert!((l.limit - 66_666.67).abs() < 0.1, "{l:?}");
        assert!(l.name.contains("50/50"));
    }

    #[test]
    fn large_blocks_use_bandwidth_and_the_network_can_be_the_bound() {
        let j = JobSpec::new(Pattern::Sequential, 128 << 10, 0, 16);
        let l = base()
            .limit_for(&j, &stats(0.0, 2000.0, 131072.0))
            .expect("limit");
        assert_eq!(l.unit, "MiB/s");
        assert!(
            (l.limit - 500.0).abs() < 1e-6 && (l.fraction - 0.5).abs() < 1e-9,
            "{l:?}"
        );
        let mut b = base();
        b.net = Some(NetBaseline {
            path: "loopback 127.0.0.1".into(),
            throughput_bytes_s: 100.0 * 1024.0 * 1024.0,
            rtt_mean_us: 10.0,
            rtt_p50_us: 10.0,
            rtt_p99_us: 20.0,
            pings: 1,
        });
        let l = b
            .limit_for(&j, &stats(0.0, 400.0, 131072.0))
            .expect("limit");
        assert!(l.name.starts_with("network"), "{l:?}");
        assert!((l.limit - 100.0).abs() < 1e-6 && (l.fraction - 0.5).abs() < 1e-9);
    }

    #[test]
    fn no_baseline_means_no_ratio() {
        let j = JobSpec::new(Pattern::Random, 4096, 100, 1);
        assert!(
            Baselines::default()
                .limit_for(&j, &stats(1.0, 0.0, 4096.0))
                .is_none()
        );
    }
}
