//! fio running in the background: the test watches its progress (fio's ETA lines) to strike
//! while it writes, then collects its JSON report.

use super::Proc;
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub struct FioRun {
    proc: Proc,
    dir: tempfile::TempDir,
    args: Vec<String>,
}

impl FioRun {
    /// Starts `fio <args>` with a JSON report and a progress line every second.
    pub fn start(args: &[String]) -> FioRun {
        let dir = tempfile::tempdir().unwrap();
        let mut all = args.to_vec();
        all.extend(["--output-format=json", "--eta=always", "--eta-newline=1"].map(String::from));
        all.push(format!(
            "--output={}",
            dir.path().join("report.json").display()
        ));
        let child = Command::new("fio")
            .args(&all)
            // fio leaves verify-state files in its working directory.
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.path().join("eta.out")).unwrap())
            .stderr(std::fs::File::create(dir.path().join("stderr")).unwrap())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run fio: {e}; install the test tools with scripts/setup.sh")
            });
        FioRun {
            proc: Proc(child),
            dir,
            args: all,
        }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The progress fio printed last, in percent (None before its first line).
    pub fn percent(&self) -> Option<f64> {
        let text = std::fs::read_to_string(self.file("eta.out")).ok()?;
        let end = text.rfind("%]")?;
        let start = text[..end].rfind('[')? + 1;
        text[start..end].parse().ok()
    }

    pub fn running(&mut self) -> bool {
        self.proc.0.try_wait().unwrap().is_none()
    }

    /// Waits for fio to finish (within `limit`); it must succeed. Returns its JSON report.
    pub fn finish(mut self, limit: Duration) -> Value {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(s) = self.proc.0.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "fio {:?} did not finish in {limit:?}",
                self.args
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let report = std::fs::read_to_string(self.file("report.json")).unwrap_or_default();
        let stderr = std::fs::read_to_string(self.file("stderr")).unwrap_or_default();
        assert!(
            status.success(),
            "fio {:?} failed ({status}):\n{stderr}\n{report}",
            self.args
        );
        // fio may print notes before the JSON document.
        let json = &report[report.find('{').expect("a JSON report")..];
        let v: Value = serde_json::from_str(json).expect("fio's JSON report");
        for job in v["jobs"].as_array().unwrap() {
            assert_eq!(job["error"], 0, "fio job failed:\n{stderr}\n{report}");
        }
        v
    }
}

/// The longest completion latency of fio's writes, from its JSON report.
pub fn max_write_latency(report: &Value) -> Duration {
    let ns = report["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|j| j["write"]["clat_ns"]["max"].as_f64())
        .fold(0.0, f64::max);
    Duration::from_nanos(ns as u64)
}

/// Bytes fio wrote and read (verify included), from its JSON report.
pub fn io_bytes(report: &Value) -> (u64, u64) {
    let sum = |dir: &str| {
        report["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|j| j[dir]["io_bytes"].as_u64())
            .sum()
    };
    (sum("write"), sum("read"))
}
