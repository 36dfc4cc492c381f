//! Runs fio on a job file and turns its exit status, stderr and JSON into a [`StepOutcome`].
//!
//! fio writes its JSON to a file (`--output`), and its status line (`--eta=always`) to a pipe that
//! we read for the progress bar and to time the CPU window: the window opens `ramp` seconds after
//! the first status line that shows progress, or 1.5 x `ramp` after fio was started when its status
//! lines come late (its status thread starved on a busy machine), and closes when fio closes its
//! stdout (it has exited; its `/proc` entry still holds its CPU times until we reap it).

use crate::cpu::Snapshot;
use crate::error::BenchError;
use crate::parse::{IoStats, aggregate, parse_fio_json};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How a step ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum StepOutcome {
    Ok {
        stats: IoStats,
        /// Set when fio succeeded but completed no IO in the measured window.
        #[serde(skip_serializing_if = "Option::is_none")]
        warning: Option<String>,
    },
    Failed {
        error: String,
    },
}

impl StepOutcome {
    pub fn stats(&self) -> Option<&IoStats> {
        match self {
            StepOutcome::Ok { stats, .. } => Some(stats),
            StepOutcome::Failed { .. } => None,
        }
    }
    pub fn error(&self) -> Option<&str> {
        match self {
            StepOutcome::Failed { error } => Some(error),
            StepOutcome::Ok { .. } => None,
        }
    }
}

/// Decides a step's outcome from fio's exit status, its stderr and its JSON output.
/// A non-zero exit is a failure carrying fio's own error lines, never a row of zeros.
pub fn classify(exit_ok: bool, stderr: &str, json: Option<&str>) -> StepOutcome {
    let fio_errors: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.contains("connected to NBD server"))
        .collect();
    let parsed = json.map(parse_fio_json);
    if !exit_ok {
        let mut error = fio_errors.join("; ");
        if error.is_empty() {
            error = match &parsed {
                Some(Ok(out)) if out.jobs.iter().any(|j| j.error != 0) => {
                    format!(
                        "fio job error {}",
                        out.jobs.iter().map(|j| j.error).max().unwrap_or(0)
                    )
                }
                _ => "fio exited with an error and printed no message".to_string(),
            };
        }
        return StepOutcome::Failed { error };
    }
    let out = match parsed {
        Some(Ok(out)) => out,
        Some(Err(reason)) => {
            return StepOutcome::Failed {
                error: format!("fio's JSON output is unreadable: {reason}"),
            };
        }
        None => {
            return StepOutcome::Failed {
                error: "fio wrote no output file".to_string(),
            };
        }
    };
    if let Some(j) = out.jobs.iter().find(|j| j.error != 0) {
        return StepOutcome::Failed {
            error: format!("fio job {} reported error {} (errno)", j.jobname, j.error),
        };
    }
    if out.jobs.is_empty() {
        return StepOutcome::Failed {
            error: "fio reported no jobs".to_string(),
        };
    }
    let stats = aggregate(&out);
    let warning = (stats.total_ios() == 0)
        .then(|| "no IO completed in the measured window (0 IOPS); latency unknown".to_string());
    StepOutcome::Ok { stats, warning }
}

/// The live part of fio's status line: `[75.0%]` and `[r=44.1k,w=18.8k IOPS]` (fio shows them only
/// after about a second; before that a line with open files, `(f=1)`, says the jobs are running).
#[derive(Debug, Clone, PartialEq)]
pub struct Live {
    pub percent: Option<f64>,
    pub rate: Option<String>,
}

/// Parses one status line such as
/// `Jobs: 1 (f=1): [m(1)][75.0%][r=172MiB/s,w=73.3MiB/s][r=44.1k,w=18.8k IOPS][eta 00m:01s]`.
pub fn parse_status_line(line: &str) -> Option<Live> {
    if !line.starts_with("Jobs:") {
        return None;
    }
    // `(f=N)`: N files (connections) open; 0 means the jobs are still setting up.
    let open_files = line
        .split("(f=")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|n| n.trim().parse::<u32>().ok())
        .unwrap_or(0);
    let mut live = Live {
        percent: None,
        rate: None,
    };
    for part in line.split('[').map(|p| p.trim_end_matches([']', ' '])) {
        if let Some(p) = part.strip_suffix('%') {
            live.percent = p.parse().ok();
        } else if part.ends_with("IOPS") {
            live.rate = Some(part.to_string());
        }
    }
    (open_files > 0 || live.percent.is_some()).then_some(live)
}

/// What one fio process did.
#[derive(Debug)]
pub struct FioRun {
    pub outcome: StepOutcome,
    pub stderr: String,
    pub wall_s: f64,
    /// Snapshots bracketing the measured window (None if fio never showed progress).
    pub window: Option<(Snapshot, Snapshot)>,
}

/// Runs `fio jobfile`, writing JSON to `json_out`. `server_pids` are sampled for the CPU window;
/// `on_live` sees each status line. Err only when fio cannot be started at all.
pub fn run_fio(
    fio: &Path,
    jobfile: &Path,
    json_out: &Path,
    env: &[(String, String)],
    ramp_s: f64,
    server_pids: &[u32],
    on_live: &mut dyn FnMut(&Live),
) -> Result<FioRun, BenchError> {
    let started = Instant::now();
    let _ = std::fs::remove_file(json_out);
    let mut child = Command::new(fio)
        .arg(jobfile)
        .arg("--output-format=json")
        .arg(format!("--output={}", json_out.display()))
        .args(["--eta=always", "--eta-newline=1", "--eta-interval=250ms"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| BenchError::ToolMissing {
            program: fio.display().to_string(),
            package: "fio".into(),
            source,
        })?;
    let pid = child.id();
    // stderr is drained on a thread so a chatty fio never blocks on a full pipe.
    let mut err_pipe = child.stderr.take();
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = err_pipe.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    // stdout is read on a thread that forwards status lines, so the CPU window opens on time even
    // when fio prints nothing for a while.
    let (tx, rx) = std::sync::mpsc::channel::<Live>();
    let mut out_pipe = child.stdout.take();
    let out_thread = std::thread::spawn(move || {
        let Some(out) = out_pipe.as_mut() else { return };
        let mut buf = [0u8; 4096];
        let mut line = Vec::new();
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            for &b in &buf[..n] {
                if b != b'\r' && b != b'\n' {
                    line.push(b);
                    continue;
                }
                if let Some(live) = parse_status_line(&String::from_utf8_lossy(&line))
                    && tx.send(live).is_err()
                {
                    return;
                }
                line.clear();
            }
        }
    });
    let mut start: Option<Snapshot> = None;
    let mut running_since: Option<Instant> = None;
    let ramp = Duration::from_secs_f64(ramp_s.max(0.0));
    loop {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(live) => {
                running_since.get_or_insert_with(Instant::now);
                on_live(&live);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if start.is_none() && window_opens(started.elapsed(), running_since, ramp) {
            start = Some(Snapshot::take(server_pids, Some(pid)));
        }
    }
    let _ = out_thread.join();
    // fio has closed stdout (it exited): its zombie still reports its CPU times.
    let end = start
        .as_ref()
        .map(|_| Snapshot::take(server_pids, Some(pid)));
    let status = child
        .wait()
        .map_err(|e| BenchError::io("waiting for fio", jobfile, e))?;
    let stderr = err_thread.join().unwrap_or_default();
    let json = std::fs::read_to_string(json_out).ok();
    Ok(FioRun {
        outcome: classify(status.success(), &stderr, json.as_deref()),
        stderr,
        wall_s: started.elapsed().as_secs_f64(),
        window: start.zip(end),
    })
}

/// Whether the CPU window opens now: `ramp` after fio first showed progress, or at the latest
/// 1.5 x `ramp` after it was started, so that late status lines never shrink the window to the end
/// of the run (it then spans at least the runtime minus half the ramp).
fn window_opens(since_spawn: Duration, running_since: Option<Instant>, ramp: Duration) -> bool {
    running_since.is_some_and(|t| t.elapsed() >= ramp) || since_spawn >= ramp.mul_f64(1.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_opens_after_the_ramp_even_when_status_lines_are_late() {
        let ramp = Duration::from_millis(500);
        let ms = Duration::from_millis;
        // fio showed progress 600 ms ago: the ramp has passed.
        let seen = Instant::now().checked_sub(ms(600));
        assert!(window_opens(ms(700), seen, ramp));
        // Progress seen only 100 ms ago, 700 ms after the start: still in the ramp.
        let late = Instant::now().checked_sub(ms(100));
        assert!(!window_opens(ms(700), late, ramp));
        assert!(!window_opens(ms(700), None, ramp));
        // 1.5 x the ramp after the start, the window opens with or without status lines.
        assert!(window_opens(ms(750), None, ramp));
        assert!(window_opens(ms(750), late, ramp));
        // No ramp (a fill): it opens at once.
        assert!(window_opens(ms(0), None, Duration::ZERO));
    }

    #[test]
    fn status_line_parts() {
        let l = "Jobs: 1 (f=1): [m(1)][75.0%][r=172MiB/s,w=73.3MiB/s][r=44.1k,w=18.8k IOPS][eta 00m:01s]";
        let live = parse_status_line(l).expect("parses");
        assert_eq!(live.percent, Some(75.0));
        assert_eq!(live.rate.as_deref(), Some("r=44.1k,w=18.8k IOPS"));
        assert_eq!(parse_status_line("Jobs: 1 (f=0)"), None);
        assert_eq!(
            parse_status_line("Jobs: 2 (f=2)"),
            Some(Live {
                percent: None,
                rate: None
            })
        );
        assert_eq!(parse_status_line("fio: connected"), None);
    }

    #[test]
    fn nonzero_exit_without_message_is_still_a_failure() {
        let o = classify(false, "", None);
        assert!(o.error().is_some_and(|e| e.contains("no message")), "{o:?}");
        let o = classify(true, "", None);
        assert!(o.error().is_some_and(|e| e.contains("no output")), "{o:?}");
    }
}
