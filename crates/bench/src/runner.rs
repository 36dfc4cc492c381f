//! Runs steps: waits for a quiet machine and a settled server, writes the job file, runs fio, reads
//! CPU from `/proc` over the measured window, repeats a step that foreign load disturbed or whose CPU
//! window came out too short to measure, and prints progress and a one-line result per step.
//!
//! Every profile measures through [`Runner::measure`], so every step gets the same treatment.

use crate::baseline::Baselines;
use crate::cpu::{self, CpuUse};
use crate::error::BenchError;
use crate::fio::{StepOutcome, run_fio};
use crate::job::{JobSpec, Pattern, render_jobfile};
use crate::model::{Section, Step};
use crate::report::format::{fmt_iops, fmt_mib, fmt_us};
use crate::target::Target;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Shortest measured window for which CPU use is reported.
pub const MIN_CPU_WINDOW_S: f64 = 0.3;

/// Settings shared by all steps of a run.
#[derive(Debug, Clone)]
pub struct RunOpts {
    pub fio: PathBuf,
    pub runtime_s: f64,
    pub ramp_s: f64,
    /// Foreign CPU (other processes) allowed during a step, % of one core.
    pub quiet_max_pct: f64,
    /// How long to wait for the machine to go quiet before each step (0 = do not wait).
    pub quiet_timeout_s: f64,
    /// The server counts as settled below this CPU use, % of one core.
    pub settle_max_pct: f64,
    /// How long to wait for the server to settle before each step (0 = do not wait).
    pub settle_timeout_s: f64,
    /// Attempts per step when foreign load disturbed it.
    pub attempts: u32,
    /// Extra latency percentiles to ask fio for.
    pub percentiles: Vec<f64>,
    /// Write every volume once, sequentially, before measuring it.
    pub precondition: bool,
    pub progress: bool,
}

/// The run in progress.
#[derive(Debug)]
pub struct Runner {
    pub opts: RunOpts,
    pub out_dir: PathBuf,
    pub targets: Vec<Target>,
    pub baselines: Option<Baselines>,
    /// Index of the raw-file target (the baseline and the compare profile's local limit).
    pub raw: Option<usize>,
    /// Targets only the compare profile measures (the nbdkit column it adds by itself).
    pub compare_only: Vec<usize>,
    /// Preconditioning steps (shown in the report's preparation section).
    pub prep: Section,
    pub warnings: Vec<String>,
    seq: usize,
    filled: Vec<Vec<bool>>,
    progress: Progress,
}

impl Runner {
    pub fn new(opts: RunOpts, out_dir: PathBuf, targets: Vec<Target>) -> Runner {
        let progress = Progress::new(opts.progress);
        let filled = targets.iter().map(|_| Vec::new()).collect();
        Runner {
            opts,
            out_dir,
            targets,
            baselines: None,
            raw: None,
            compare_only: Vec::new(),
            prep: Section::new(
                "prep",
                "Preparation",
                "Each volume is written once, sequentially with 1 MiB blocks at QD16, before it is measured (fill = 100%), so reads hit written data and writes overwrite.",
            ),
            warnings: Vec::new(),
            seq: 0,
            filled,
            progress,
        }
    }

    /// A job with the run's runtime and warm-up.
    pub fn job(&self, pattern: Pattern, bs: u64, read_pct: u8, iodepth: u32) -> JobSpec {
        JobSpec::new(pattern, bs, read_pct, iodepth).timing(self.opts.runtime_s, self.opts.ramp_s)
    }

    /// Announces `steps` more steps of about `each_s` seconds (for the progress bar).
    pub fn plan(&mut self, steps: usize) {
        self.progress.add(steps);
    }

    /// Prints a line above the progress bars.
    pub fn say(&self, line: &str) {
        self.progress.println(line);
    }

    /// The targets profiles benchmark: all but the raw file (which only gives limits) and the
    /// targets started for `compare` alone.
    pub fn bench_targets(&self) -> Vec<usize> {
        bench_indices(self.targets.len(), self.raw, &self.compare_only)
    }

    pub fn target_labels(&self) -> Vec<String> {
        self.targets.iter().map(|t| t.label().to_string()).collect()
    }

    /// Measures `job` on target `t` and records the step in `section`. Never fails for a failed fio
    /// run (that is a failed step); Err only when files cannot be written or fio cannot start.
    pub fn measure(
        &mut self,
        section: &mut Section,
        point: &str,
        t: usize,
        job: &JobSpec,
    ) -> Result<Step, BenchError> {
        let mut vols = Vec::new();
        let mut vol_err = None;
        for i in 0..job.volumes {
            match self.targets[t].volume(i) {
                Ok(v) => vols.push(v),
                Err(e) => {
                    vol_err = Some(e.to_string());
                    break;
                }
            }
        }
        if vol_err.is_none()
            && self.opts.precondition
            && !job.fill
            && let Err(e) = self.ensure_filled(t, job.volumes)
        {
            vol_err = Some(e);
        }
        let step = self.run_step(&section.id, point, t, job, &vols, vol_err)?;
        section.steps.push(step.clone());
        Ok(step)
    }

    /// Writes volumes `0..n` of target `t` once (sequential 1 MiB, QD16), if not done yet.
    pub fn ensure_filled(&mut self, t: usize, n: usize) -> Result<(), String> {
        for i in 0..n {
            if self.filled[t].get(i).copied().unwrap_or(false) {
                continue;
            }
            let mut job = JobSpec::new(Pattern::Sequential, 1 << 20, 0, 16).timing(0.0, 0.0);
            job.fill = true;
            let vol = self.targets[t].volume(i).map_err(|e| e.to_string())?;
            self.progress.add(1);
            let step = self
                .run_step("prep", &format!("fill-v{i}"), t, &job, &[vol], None)
                .map_err(|e| e.to_string())?;
            let ok = step.stats().is_some();
            let written = step.stats().map(|s| s.write.bw_bytes * step.wall_s);
            let err = step.outcome.error().map(String::from);
            self.prep.steps.push(step);
            if self.filled[t].len() <= i {
                self.filled[t].resize(i + 1, false);
            }
            self.filled[t][i] = ok;
            if let Some(e) = err {
                return Err(format!("preconditioning volume {i} failed: {e}"));
            }
            let info = &mut self.targets[t].info;
            info.filled_bytes = info.size_bytes.or(written.map(|w| w as u64));
        }
        Ok(())
    }

    fn run_step(
        &mut self,
        section: &str,
        point: &str,
        t: usize,
        job: &JobSpec,
        vols: &[crate::job::EngineOptions],
        vol_err: Option<String>,
    ) -> Result<Step, BenchError> {
        self.seq += 1;
        let target = self.targets[t].label().to_string();
        let id = sanitize(&format!("{:03}-{section}-{point}-{target}", self.seq));
        let fio_dir = self.out_dir.join("fio");
        let jobfile = fio_dir.join(format!("{id}.fio"));
        let json = fio_dir.join(format!("{id}.json"));
        let mut step = Step {
            id: id.clone(),
            section: section.into(),
            point: point.into(),
            target: target.clone(),
            job: job.clone(),
            outcome: StepOutcome::Failed {
                error: String::new(),
            },
            cpu: None,
            limit: None,
            wall_s: 0.0,
            attempts: 0,
            quiet_wait_s: 0.0,
            settle_wait_s: 0.0,
            warnings: Vec::new(),
            fio_json: format!("fio/{id}.json"),
            fio_jobfile: format!("fio/{id}.fio"),
        };
        let label = format!("{section} {point} [{target}] {}", job.label());
        if let Some(e) = vol_err {
            step.outcome = StepOutcome::Failed { error: e };
            self.progress.done(&step_line(&label, &step));
            return Ok(step);
        }
        let text = render_jobfile(job, vols, &self.opts.percentiles);
        std::fs::write(&jobfile, text)
            .map_err(|e| BenchError::io("writing a fio job file", &jobfile, e))?;
        let pids = self.targets[t].server_pids().to_vec();
        let env = self.targets[t].env.clone();
        let expected = if job.fill {
            0.0
        } else {
            job.runtime_s + job.ramp_s
        };
        for attempt in 1..=self.opts.attempts.max(1) {
            step.attempts = attempt;
            step.settle_wait_s += self.wait_settle(&pids);
            step.quiet_wait_s += self.wait_quiet(&pids);
            let bar = self.progress.start(&label, expected);
            let run = run_fio(
                &self.opts.fio,
                &jobfile,
                &json,
                &env,
                if job.fill { 0.0 } else { job.ramp_s },
                &pids,
                &mut |l| {
                    bar.set_message(format!("{label}  {}", l.rate.clone().unwrap_or_default()));
                    if let Some(p) = l.percent {
                        bar.set_position((p * 10.0) as u64);
                    }
                },
            )?;
            bar.finish_and_clear();
            if !run.stderr.trim().is_empty() {
                let p = fio_dir.join(format!("{id}.stderr"));
                std::fs::write(&p, &run.stderr)
                    .map_err(|e| BenchError::io("writing fio's stderr", &p, e))?;
            }
            step.wall_s = run.wall_s;
            step.outcome = run.outcome;
            let iops = step.stats().map_or(0.0, |s| s.iops());
            step.cpu = run
                .window
                .as_ref()
                .map(|(a, b)| CpuUse::between(a, b, !pids.is_empty(), iops));
            let window = step.cpu.as_ref().map_or(0.0, |c| c.window_s);
            if window < MIN_CPU_WINDOW_S && !job.fill && step.stats().is_some() {
                step.warnings.push(format!(
                    "attempt {attempt}: CPU was measured over only {window:.2} s (at least {MIN_CPU_WINDOW_S} s needed)"
                ));
                if attempt < self.opts.attempts {
                    continue;
                }
                step.cpu = None;
            }
            let foreign = step.cpu.as_ref().map_or(0.0, |c| c.foreign_pct);
            if foreign > self.opts.quiet_max_pct && step.stats().is_some() {
                let w = format!(
                    "attempt {attempt}: other processes used {foreign:.0}% of a core during the step (limit {:.0}%)",
                    self.opts.quiet_max_pct
                );
                step.warnings.push(w);
                if attempt < self.opts.attempts {
                    continue;
                }
            }
            break;
        }
        if let StepOutcome::Ok {
            warning: Some(w), ..
        } = &step.outcome
        {
            step.warnings.push(w.clone());
        }
        if section != "baseline" && section != "prep" {
            step.limit = match (&self.baselines, step.stats()) {
                (Some(b), Some(s)) => b.limit_for(job, s),
                _ => None,
            };
        }
        self.progress.done(&step_line(&label, &step));
        Ok(step)
    }

    /// Waits until the server uses less than `settle_max_pct` of a core (at most the timeout).
    fn wait_settle(&self, pids: &[u32]) -> f64 {
        if pids.is_empty() || self.opts.settle_timeout_s <= 0.0 {
            return 0.0;
        }
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < self.opts.settle_timeout_s {
            if cpu::pids_pct(pids, Duration::from_millis(500)) < self.opts.settle_max_pct {
                break;
            }
        }
        start.elapsed().as_secs_f64()
    }

    /// Waits until other processes use at most `quiet_max_pct` of a core (at most the timeout).
    fn wait_quiet(&self, pids: &[u32]) -> f64 {
        if self.opts.quiet_timeout_s <= 0.0 {
            return 0.0;
        }
        let start = Instant::now();
        let mut told = false;
        loop {
            let f = cpu::foreign_pct(pids, Duration::from_secs(1));
            if f <= self.opts.quiet_max_pct {
                break;
            }
            if start.elapsed().as_secs_f64() > self.opts.quiet_timeout_s {
                self.progress.println(&format!(
                    "   machine still busy ({f:.0}% of a core by other processes); running anyway"
                ));
                break;
            }
            if !told {
                self.progress.println(&format!(
                    "   waiting for the machine to go quiet ({f:.0}% of a core by other processes)"
                ));
                told = true;
            }
        }
        let w = start.elapsed().as_secs_f64();
        if w < 1.5 { 0.0 } else { w }
    }

    /// Stops the targets and the progress bars.
    pub fn finish(&mut self) {
        self.progress.total.finish_and_clear();
        for t in &mut self.targets {
            t.stop();
        }
    }
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

/// `✓ matrix r70 [basalt] 4K random 70/30: 45.2k IOPS, 176.6 MiB/s, mean 350 µs, p99 1.2 ms, server 12.3 µs CPU/IO`.
pub fn step_line(label: &str, s: &Step) -> String {
    match &s.outcome {
        StepOutcome::Failed { error } => format!("  FAILED {label}: {error}"),
        StepOutcome::Ok { stats, .. } => {
            let mut l = format!(
                "  ok {label}: {} IOPS, {} MiB/s, mean {}, p99 {}",
                fmt_iops(stats.iops()),
                fmt_mib(stats.mib_s()),
                fmt_us(stats.lat_mean_us()),
                fmt_us(stats.lat_pct_us(99.0)),
            );
            if let Some(us) = s.cpu.as_ref().and_then(|c| c.server_us_per_io) {
                l.push_str(&format!(", server {us:.1} µs CPU/IO"));
            }
            if let Some(lim) = &s.limit {
                l.push_str(&format!(", {:.0}% of {}", lim.fraction * 100.0, lim.name));
            }
            for w in &s.warnings {
                l.push_str(&format!(" [{w}]"));
            }
            l
        }
    }
}

/// Progress bars: total steps, and the running step with fio's live rate.
#[derive(Debug)]
struct Progress {
    mp: MultiProgress,
    total: ProgressBar,
    visible: bool,
}

impl Progress {
    fn new(enabled: bool) -> Progress {
        let target = if enabled {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let mp = MultiProgress::with_draw_target(target);
        let total = mp.add(ProgressBar::new(0));
        total.set_style(
            ProgressStyle::with_template(
                "{prefix:.bold} [{bar:30.cyan/blue}] {pos}/{len} steps, {elapsed} elapsed",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        total.set_prefix("basalt bench");
        let visible = enabled && !mp.is_hidden();
        Progress { mp, total, visible }
    }

    fn add(&self, n: usize) {
        self.total.inc_length(n as u64);
    }

    fn start(&self, label: &str, expected_s: f64) -> ProgressBar {
        let bar = self.mp.add(ProgressBar::new(1000));
        bar.set_style(
            ProgressStyle::with_template("  {spinner} [{bar:20}] {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_message(format!("{label} (~{expected_s:.0} s)"));
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    }

    fn done(&self, line: &str) {
        if self.total.position() >= self.total.length().unwrap_or(0) {
            self.total.inc_length(1); // an adaptive search ran more steps than planned
        }
        self.total.inc(1);
        self.println(line);
    }

    fn println(&self, line: &str) {
        if self.visible {
            let _ = self.mp.println(line);
        } else {
            eprintln!("{line}");
        }
    }
}

/// Indices of `n` targets that profiles other than `compare` benchmark.
fn bench_indices(n: usize, raw: Option<usize>, compare_only: &[usize]) -> Vec<usize> {
    (0..n)
        .filter(|i| Some(*i) != raw && !compare_only.contains(i))
        .collect()
}

#[cfg(test)]
mod bench_indices_tests {
    use super::bench_indices;

    #[test]
    fn raw_file_and_compare_only_targets_are_not_benchmarked() {
        assert_eq!(bench_indices(3, Some(2), &[1]), vec![0]);
        assert_eq!(bench_indices(4, Some(3), &[]), vec![0, 1, 2]);
        assert_eq!(bench_indices(2, None, &[]), vec![0, 1]);
    }
}
