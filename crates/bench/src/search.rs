//! The searches, as pure functions over measurements, so they are tested on recorded fio output:
//! * [`rate_search`]: the highest IOPS whose latency stays under a target (simplyblock), by
//!   bisecting fio's offered rate (`rate_iops`) below the unthrottled rate;
//! * [`ramp_until`]: raise queue depth until latency passes a limit (StorPool's latency vs load);
//! * [`find_knee`]: the concurrency after which throughput stops growing (MinIO's autotune).

use crate::parse::{DirStats, IoStats};
use serde::Serialize;

/// Which latency statistic a target is judged by.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum LatStat {
    Mean,
    /// A percentile such as 99.0.
    Pct(f64),
}

impl LatStat {
    /// `mean`, `p99`, `p99.9`.
    pub fn parse(s: &str) -> Result<LatStat, String> {
        if s == "mean" {
            return Ok(LatStat::Mean);
        }
        let p = s
            .strip_prefix('p')
            .and_then(|p| p.parse::<f64>().ok())
            .filter(|p| *p > 0.0 && *p < 100.0)
            .ok_or_else(|| {
                format!("'{s}' is not a latency statistic; use mean, p50, p99, p99.9 ...")
            })?;
        Ok(LatStat::Pct(p))
    }

    pub fn label(&self) -> String {
        match self {
            LatStat::Mean => "mean".into(),
            LatStat::Pct(p) => format!("p{}", crate::parse::pct_key(*p)),
        }
    }

    /// This statistic of one direction, in µs (None if no IO or not reported).
    pub fn of(&self, d: &DirStats) -> Option<f64> {
        if d.total_ios == 0 {
            return None;
        }
        match self {
            LatStat::Mean => d.lat_mean_us,
            LatStat::Pct(p) => d.pct(*p),
        }
    }

    /// The worse of the two directions.
    pub fn worst(&self, s: &IoStats) -> Option<f64> {
        match (self.of(&s.read), self.of(&s.write)) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Latency targets for reads and writes (simplyblock: read 300 µs, write 500 µs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencyGoal {
    pub read_us: f64,
    pub write_us: f64,
    pub stat: LatStat,
}

impl LatencyGoal {
    /// Some(true) when every direction that did IO is within its target; None when no IO completed.
    pub fn check(&self, s: &IoStats) -> Option<bool> {
        let r = self.stat.of(&s.read).map(|v| v <= self.read_us);
        let w = self.stat.of(&s.write).map(|v| v <= self.write_us);
        match (r, w) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(true) && b.unwrap_or(true)),
        }
    }
}

/// One measurement of a search.
#[derive(Debug, Clone, Serialize)]
pub struct SearchPoint {
    /// Offered rate (None = unthrottled) or queue depth / concurrency, depending on the search.
    pub x: Option<u64>,
    pub step: String,
    pub iops: Option<f64>,
    pub lat_us: Option<f64>,
    pub meets: Option<bool>,
}

/// How a rate search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SearchOutcome {
    /// Even unthrottled the target is met: the answer is the unthrottled rate.
    MetUnthrottled,
    /// The answer is a throttled rate found by bisection.
    MetThrottled,
    /// No tried rate met the target.
    NeverMet,
    /// The first (unthrottled) step failed.
    Failed,
}

/// Result of [`rate_search`]: every point tried, and the best one meeting the goal.
#[derive(Debug, Clone, Serialize)]
pub struct RateSearch {
    pub points: Vec<SearchPoint>,
    pub best: Option<usize>,
    pub outcome: SearchOutcome,
}

impl RateSearch {
    pub fn best(&self) -> Option<&SearchPoint> {
        self.best.map(|i| &self.points[i])
    }
}

/// Finds the highest IOPS meeting `goal`. `measure(rate)` runs one step at an offered rate (None =
/// as fast as possible) and returns its stats (None if the step failed) and its step id.
/// Unthrottled first; if that misses the goal, `bisect_steps` bisections of the rate in
/// (0, unthrottled IOPS).
pub fn rate_search(
    goal: &LatencyGoal,
    bisect_steps: u32,
    mut measure: impl FnMut(Option<u64>) -> (Option<IoStats>, String),
) -> RateSearch {
    let mut points = Vec::new();
    let mut probe = |rate: Option<u64>, points: &mut Vec<SearchPoint>| -> Option<(f64, bool)> {
        let (stats, step) = measure(rate);
        let meets = stats.as_ref().and_then(|s| goal.check(s));
        points.push(SearchPoint {
            x: rate,
            step,
            iops: stats.as_ref().map(IoStats::iops),
            lat_us: stats.as_ref().and_then(|s| goal.stat.worst(s)),
            meets,
        });
        Some((stats?.iops(), meets?))
    };
    let Some((top, ok)) = probe(None, &mut points) else {
        return RateSearch {
            points,
            best: None,
            outcome: SearchOutcome::Failed,
        };
    };
    if ok {
        return RateSearch {
            points,
            best: Some(0),
            outcome: SearchOutcome::MetUnthrottled,
        };
    }
    let (mut lo, mut hi) = (0.0f64, top);
    let mut best: Option<usize> = None;
    for _ in 0..bisect_steps {
        let mid = ((lo + hi) / 2.0).round();
        if mid < 1.0 {
            break;
        }
        match probe(Some(mid as u64), &mut points) {
            Some((iops, true)) => {
                let better = best.is_none_or(|b| points[b].iops.unwrap_or(0.0) < iops);
                if better {
                    best = Some(points.len() - 1);
                }
                lo = mid;
            }
            Some((_, false)) => hi = mid,
            None => break, // a failed step ends the search with what was found
        }
    }
    let outcome = if best.is_some() {
        SearchOutcome::MetThrottled
    } else {
        SearchOutcome::NeverMet
    };
    RateSearch {
        points,
        best,
        outcome,
    }
}

/// Raises the load through `xs` (queue depths) until the latency statistic passes `limit_us`; the
/// first point over the limit is kept (it shows where the curve crosses). A failed step stops it.
pub fn ramp_until(
    xs: &[u32],
    limit_us: f64,
    stat: LatStat,
    mut measure: impl FnMut(u32) -> (Option<IoStats>, String),
) -> Vec<SearchPoint> {
    let mut points = Vec::new();
    for &x in xs {
        let (stats, step) = measure(x);
        let lat = stats.as_ref().and_then(|s| stat.worst(s));
        let meets = lat.map(|l| l <= limit_us);
        points.push(SearchPoint {
            x: Some(u64::from(x)),
            step,
            iops: stats.as_ref().map(IoStats::iops),
            lat_us: lat,
            meets,
        });
        if meets != Some(true) {
            break;
        }
    }
    points
}

/// The point with the highest IOPS among those within the limit.
pub fn best_within(points: &[SearchPoint]) -> Option<&SearchPoint> {
    points
        .iter()
        .filter(|p| p.meets == Some(true))
        .max_by(|a, b| a.iops.unwrap_or(0.0).total_cmp(&b.iops.unwrap_or(0.0)))
}

/// Where throughput stopped growing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Knee {
    /// Index of the knee point (the best throughput before growth stalled).
    pub index: Option<usize>,
    /// True when growth stalled for `patience` points (the search can stop).
    pub stalled: bool,
}

/// Scans throughputs measured at increasing concurrency. A point "grows" if it beats the best so
/// far by more than `min_gain` (0.05 = 5%). After `patience` points without growth, the best point
/// is the knee. A failed point (None) ends the scan: the knee is then unknown.
pub fn find_knee(values: &[Option<f64>], min_gain: f64, patience: usize) -> Knee {
    let mut best: Option<usize> = None;
    let mut stall = 0;
    for (i, v) in values.iter().enumerate() {
        let Some(v) = *v else {
            return Knee {
                index: None,
                stalled: true,
            };
        };
        match best {
            Some(b) if v <= values[b].unwrap_or(0.0) * (1.0 + min_gain) => {
                stall += 1;
                if stall >= patience.max(1) {
                    return Knee {
                        index: Some(b),
                        stalled: true,
                    };
                }
            }
            _ => {
                best = Some(i);
                stall = 0;
            }
        }
    }
    Knee {
        index: None,
        stalled: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knee_waits_for_patience_and_ignores_small_gains() {
        let v = |xs: &[f64]| xs.iter().map(|x| Some(*x)).collect::<Vec<_>>();
        assert_eq!(
            find_knee(&v(&[10.0, 20.0, 40.0, 41.0, 39.0]), 0.05, 2),
            Knee {
                index: Some(2),
                stalled: true
            }
        );
        assert_eq!(
            find_knee(&v(&[10.0, 20.0, 40.0, 41.0]), 0.05, 2),
            Knee {
                index: None,
                stalled: false
            }
        );
        assert_eq!(
            find_knee(&v(&[10.0, 20.0, 40.0, 80.0]), 0.05, 2).index,
            None
        );
        assert_eq!(
            find_knee(&[Some(1.0), None], 0.05, 2),
            Knee {
                index: None,
                stalled: true
            }
        );
        assert_eq!(
            find_knee(&v(&[0.0, 0.0, 0.0]), 0.05, 2),
            Knee {
                index: Some(0),
                stalled: true
            }
        );
    }

    #[test]
    fn stat_parsing() {
        assert_eq!(LatStat::parse("mean"), Ok(LatStat::Mean));
        assert_eq!(LatStat::parse("p99.9"), Ok(LatStat::Pct(99.9)));
        assert!(LatStat::parse("p100").is_err());
        assert!(LatStat::parse("median").is_err());
        assert_eq!(LatStat::Pct(99.0).label(), "p99");
    }
}
