//! Shared helpers of the end-to-end tests: a real `basalt up` process on OS-chosen ports, a small
//! blocking NBD client, external tools (fio, nbdinfo, qemu-img) run with time limits, and hosts
//! in network namespaces for multi-host clusters (`netns.rs`, `netcluster.rs`).
#![allow(dead_code)]

pub mod fio;
pub mod host;
pub mod nbd;
pub mod netcluster;
pub mod netns;
pub mod node;
pub mod proxy;
pub mod upcluster;
pub mod upio;
pub mod writer;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BASALT: &str = env!("CARGO_BIN_EXE_basalt");

/// Polls `cond` until it holds, failing the test after `limit`.
pub fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `basalt up` child process. Killed (SIGKILL) on drop if still running.
pub struct Up {
    pub dir: PathBuf,
    pub child: Child,
    pub nbd: String,
    pub node: String,
    pub stdout_log: PathBuf,
    pub stderr_log: PathBuf,
}

/// Options for [`Up::start`].
#[derive(Clone)]
pub struct UpOptions {
    pub device_size: &'static str,
    pub volume_size: &'static str,
    pub extra: Vec<String>,
}

impl Default for UpOptions {
    fn default() -> Self {
        UpOptions {
            device_size: "1GiB",
            volume_size: "256MiB",
            extra: Vec::new(),
        }
    }
}

impl Up {
    /// Starts `basalt up` on `dir` with free ports and waits until it serves.
    pub fn start(dir: &Path, opts: &UpOptions) -> Up {
        let stdout_log = dir.join(format!("up-{}.out", unique()));
        let stderr_log = dir.join(format!("up-{}.err", unique()));
        let data = dir.join("data");
        let _ = std::fs::remove_file(data.join("cluster.json"));
        let mut cmd = Command::new(BASALT);
        cmd.arg("up").arg("--data").arg(&data);
        // `up --nodes` starts node processes on ports of their own.
        if !opts.extra.iter().any(|a| a == "--nodes") {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        cmd.args(["--nbd", "127.0.0.1:0"])
            .args([
                "--device-size",
                opts.device_size,
                "--volume-size",
                opts.volume_size,
            ])
            .args(&opts.extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout_log).unwrap())
            .stderr(std::fs::File::create(&stderr_log).unwrap());
        let mut child = cmd.spawn().expect("spawn basalt up");
        let pid = child.id();
        let file = data.join("cluster.json");
        let deadline = Instant::now() + Duration::from_secs(60);
        let info: Value = loop {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "basalt up exited with {status}:\n{}",
                    std::fs::read_to_string(&stderr_log).unwrap_or_default()
                );
            }
            if let Ok(bytes) = std::fs::read(&file)
                && let Ok(v) = serde_json::from_slice::<Value>(&bytes)
                && v["pid"].as_u64() == Some(pid as u64)
            {
                break v;
            }
            assert!(Instant::now() < deadline, "basalt up did not start in 60 s");
            std::thread::sleep(Duration::from_millis(20));
        };
        Up {
            dir: data,
            child,
            nbd: info["nbd_addr"].as_str().unwrap().to_string(),
            node: info["node_addr"].as_str().unwrap().to_string(),
            stdout_log,
            stderr_log,
        }
    }

    pub fn uri(&self, volume: &str) -> String {
        format!("nbd://{}/{}", self.nbd, volume)
    }

    /// Runs a `basalt` CLI command against this cluster.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(BASALT)
            .args(args)
            .env("BASALT_DATA", &self.dir)
            .output()
            .expect("run basalt")
    }

    /// Runs a CLI command that must succeed with `--json`, returning its parsed output.
    pub fn cli_json(&self, args: &[&str]) -> Value {
        let mut all: Vec<&str> = args.to_vec();
        all.push("--json");
        let out = self.cli(&all);
        assert!(
            out.status.success(),
            "basalt {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON output")
    }

    /// SIGTERM, and waits for a clean exit.
    pub fn stop(mut self) {
        unsafe_kill(self.child.id(), libc::SIGTERM);
        let status = wait_exit(&mut self.child, Duration::from_secs(30));
        assert!(
            status.success(),
            "basalt up did not stop cleanly ({status}):\n{}",
            std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
        );
    }

    /// SIGKILL: a crash.
    pub fn kill9(mut self) {
        unsafe_kill(self.child.id(), libc::SIGKILL);
        wait_exit(&mut self.child, Duration::from_secs(30));
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            unsafe_kill(self.child.id(), libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// A child process killed (SIGKILL) and reaped when dropped, also when a test fails.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn unsafe_kill(pid: u32, sig: i32) {
    // SAFETY: sending a signal to our own child process.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

pub fn wait_exit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "process did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Runs an external tool with a time limit; panics with an install hint if it is missing.
pub fn tool(program: &str, args: &[&str], limit: Duration) -> Output {
    // A throwaway working directory: fio leaves verify-state files in its current directory.
    let cwd = tempfile::tempdir().unwrap();
    let mut child = Command::new(program)
        .args(args)
        .current_dir(cwd.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run {program}: {e}; install the test tools with scripts/setup.sh")
        });
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{program} {args:?} did not finish in {limit:?}:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Like [`tool`], and the tool must succeed; returns its stdout.
pub fn tool_ok(program: &str, args: &[&str], limit: Duration) -> String {
    let out = tool(program, args, limit);
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
