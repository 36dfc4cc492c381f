//! What the benchmark drives: a local Basalt cluster it starts, an NBD URI, `nbdkit file`, a raw
//! file (fio io_uring, O_DIRECT), or a Ceph RBD pool. A [`Target`] hands out fio engine options per
//! volume, knows its server processes (for CPU per IO), and stops whatever it started when dropped.

use crate::error::BenchError;
use crate::job::EngineOptions;
use serde::Serialize;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How to obtain a target.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum TargetSpec {
    /// Spawn `BIN up --data DIR --nbd 127.0.0.1:PORT --volume bench-0 --volume-size SIZE
    /// --device-size DEVICE_SIZE`, with `--nodes N [--replicas R]` when `cluster` is set (then
    /// DEVICE_SIZE is each node's).
    LocalBasalt {
        bin: PathBuf,
        size: u64,
        device_size: u64,
        cluster: Option<LocalCluster>,
    },
    /// NBD exports that are already served; `server_pids` name the server's processes.
    Nbd {
        uris: Vec<String>,
        server_pids: Vec<u32>,
    },
    /// `nbdkit file` on a file of `size` bytes in the scratch directory (page cache, not durable).
    NbdkitFile { size: u64 },
    /// `nbdkit memory SIZE` (tests and stand-ins).
    NbdkitMemory { size: u64 },
    /// fio io_uring with O_DIRECT on a file of `size` bytes in the scratch directory.
    RawFile { size: u64 },
    /// fio's rbd engine; `conf` is exported as CEPH_CONF.
    Rbd {
        conf: PathBuf,
        pool: String,
        images: Vec<String>,
        server_pids: Vec<u32>,
    },
}

/// The shape of a multi-process local cluster (`basalt up --nodes N`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalCluster {
    pub nodes: u32,
    /// Copies in the default pool (None: `basalt up`'s default, min(3, nodes)).
    pub replicas: Option<u8>,
    /// The NBD gateway in node1's process (`--local-gateway`) instead of in `up`.
    pub local_gateway: bool,
}

impl LocalCluster {
    /// The copies the default pool gets.
    pub fn copies(&self) -> u32 {
        self.replicas.map_or(self.nodes.min(3), u32::from)
    }
}

/// What the report says about a target.
#[derive(Debug, Clone, Serialize)]
pub struct TargetInfo {
    pub label: String,
    pub kind: String,
    pub description: String,
    pub volumes: Vec<String>,
    pub size_bytes: Option<u64>,
    pub server_pids: Vec<u32>,
    pub version: Option<String>,
    pub durability: String,
    /// Bytes written by the precondition pass per volume (None = not preconditioned).
    pub filled_bytes: Option<u64>,
    pub logs: Vec<String>,
}

/// A running target.
#[derive(Debug)]
pub struct Target {
    pub info: TargetInfo,
    pub env: Vec<(String, String)>,
    spec: TargetSpec,
    volumes: Vec<EngineOptions>,
    children: Vec<ChildGuard>,
    scratch: PathBuf,
    log_dir: PathBuf,
    basalt: Option<(PathBuf, PathBuf, SocketAddr)>,
    _dir: Option<tempfile::TempDir>,
}

impl Target {
    /// Starts (or attaches to) a target. Files go to a fresh directory under `scratch`, logs of
    /// started servers to `log_dir`.
    pub fn start(
        spec: TargetSpec,
        label: &str,
        scratch: &Path,
        log_dir: &Path,
        durability: &str,
    ) -> Result<Target, BenchError> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("basalt-bench-{label}-"))
            .tempdir_in(scratch)
            .map_err(|e| BenchError::io("creating a scratch directory", scratch, e))?;
        let mut t = Target {
            info: TargetInfo {
                label: label.to_string(),
                kind: String::new(),
                description: String::new(),
                volumes: Vec::new(),
                size_bytes: None,
                server_pids: Vec::new(),
                version: None,
                durability: durability.to_string(),
                filled_bytes: None,
                logs: Vec::new(),
            },
            env: Vec::new(),
            spec: spec.clone(),
            volumes: Vec::new(),
            children: Vec::new(),
            scratch: dir.path().to_path_buf(),
            log_dir: log_dir.to_path_buf(),
            basalt: None,
            _dir: Some(dir),
        };
        t.open(spec)?;
        Ok(t)
    }

    fn open(&mut self, spec: TargetSpec) -> Result<(), BenchError> {
        match spec {
            TargetSpec::LocalBasalt {
                bin,
                size,
                device_size,
                cluster,
            } => self.start_basalt(&bin, (size, device_size), cluster)?,
            TargetSpec::Nbd { uris, server_pids } => {
                self.info.kind = "nbd".into();
                self.info.description =
                    "NBD export(s) served by a running server (fio ioengine=nbd)".into();
                self.info.server_pids = server_pids;
                self.info.size_bytes = uris.first().and_then(|u| nbd_size(u));
                for u in uris {
                    self.push_nbd(&u);
                }
            }
            TargetSpec::NbdkitFile { size } | TargetSpec::NbdkitMemory { size } => {
                let file = matches!(self.spec, TargetSpec::NbdkitFile { .. });
                self.info.kind = if file { "nbdkit-file" } else { "nbdkit-memory" }.into();
                self.info.description = if file {
                    "nbdkit file plugin on a file on the same disk (buffered through the page cache: not durable)"
                } else {
                    "nbdkit memory plugin (RAM; a stand-in NBD server)"
                }
                .into();
                self.info.size_bytes = Some(size);
                self.info.version = tool_version("nbdkit", &["--version"]);
                self.spawn_nbdkit(0, size)?;
            }
            TargetSpec::RawFile { size } => {
                self.info.kind = "raw-file".into();
                self.info.description =
                    "a file on the same disk, fio ioengine=io_uring direct=1 (the local raw limit; no server)".into();
                self.info.size_bytes = Some(size);
                self.push_raw(0, size)?;
            }
            TargetSpec::Rbd {
                conf,
                pool,
                images,
                server_pids,
            } => {
                self.info.kind = "ceph-rbd".into();
                self.info.description = format!(
                    "Ceph RBD pool {pool} through fio ioengine=rbd (librbd), CEPH_CONF={}",
                    conf.display()
                );
                self.env
                    .push(("CEPH_CONF".into(), conf.display().to_string()));
                self.info.server_pids = if server_pids.is_empty() {
                    ceph_pids(&conf)
                } else {
                    server_pids
                };
                self.info.version = tool_version("ceph", &["--version"]);
                for img in images {
                    self.info.volumes.push(format!("rbd:{pool}/{img}"));
                    self.volumes.push(vec![
                        ("ioengine".into(), "rbd".into()),
                        ("clientname".into(), "admin".into()),
                        ("pool".into(), pool.clone()),
                        ("rbdname".into(), img),
                    ]);
                }
            }
        }
        Ok(())
    }

    /// fio options for volume `i`, creating the volume when the target can.
    pub fn volume(&mut self, i: usize) -> Result<EngineOptions, BenchError> {
        while self.volumes.len() <= i {
            let next = self.volumes.len();
            match self.spec.clone() {
                TargetSpec::LocalBasalt { size, .. } => self.create_basalt_volume(next, size)?,
                TargetSpec::NbdkitFile { size } | TargetSpec::NbdkitMemory { size } => {
                    self.spawn_nbdkit(next, size)?
                }
                TargetSpec::RawFile { size } => self.push_raw(next, size)?,
                TargetSpec::Nbd { .. } => {
                    return Err(BenchError::NotEnoughVolumes {
                        index: next,
                        hint: "give one --uri per volume".into(),
                    });
                }
                TargetSpec::Rbd { .. } => {
                    return Err(BenchError::NotEnoughVolumes {
                        index: next,
                        hint: "give one --rbd-image per volume".into(),
                    });
                }
            }
        }
        Ok(self.volumes[i].clone())
    }

    /// Number of volumes that exist now.
    /// The data-path address of the node of a cluster the bench started (from the
    /// `cluster.json` that `basalt up` writes into its data directory).
    pub fn node_addr(&self) -> Option<String> {
        let (_, data, _) = self.basalt.as_ref()?;
        let text = std::fs::read_to_string(data.join("cluster.json")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v["node_addr"].as_str().map(String::from)
    }

    pub fn volume_count(&self) -> usize {
        self.volumes.len()
    }

    pub fn label(&self) -> &str {
        &self.info.label
    }

    pub fn server_pids(&self) -> &[u32] {
        &self.info.server_pids
    }

    fn push_nbd(&mut self, uri: &str) {
        self.info.volumes.push(uri.to_string());
        self.volumes.push(vec![
            ("ioengine".into(), "nbd".into()),
            ("uri".into(), uri.to_string()),
        ]);
    }

    fn push_raw(&mut self, i: usize, size: u64) -> Result<(), BenchError> {
        let path = self.scratch.join(format!("raw-{i}.img"));
        make_file(&path, size)?;
        self.info.volumes.push(path.display().to_string());
        self.volumes.push(vec![
            ("ioengine".into(), "io_uring".into()),
            ("direct".into(), "1".into()),
            ("filename".into(), path.display().to_string()),
            ("size".into(), size.to_string()),
        ]);
        Ok(())
    }

    fn spawn_nbdkit(&mut self, i: usize, size: u64) -> Result<(), BenchError> {
        let port = free_port()?;
        let mut cmd = Command::new("nbdkit");
        cmd.args([
            "-f",
            "--exit-with-parent",
            "-i",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ]);
        if matches!(self.spec, TargetSpec::NbdkitFile { .. }) {
            let path = self.scratch.join(format!("nbdkit-{i}.img"));
            make_file(&path, size)?;
            cmd.args(["file", &format!("file={}", path.display())]);
        } else {
            cmd.args(["memory", &size.to_string()]);
        }
        let log = self
            .log_dir
            .join(format!("{}-nbdkit-{i}.log", self.info.label));
        let child = spawn_logged(cmd, &log, "nbdkit", "nbdkit")?;
        self.info.logs.push(log.display().to_string());
        let pid = child.id();
        let mut guard = ChildGuard {
            child,
            name: "nbdkit".into(),
            grace: STOP_GRACE,
        };
        wait_for_port(SocketAddr::from(([127, 0, 0, 1], port)), &mut guard, &log)?;
        self.children.push(guard);
        self.info.server_pids.push(pid);
        self.push_nbd(&format!("nbd://127.0.0.1:{port}/"));
        Ok(())
    }

    /// `basalt up` (one process), or `basalt up --nodes N` (etcd, N `basalt node` processes and
    /// the gateway in `up`); its server processes are `up` and, for a cluster, every node and
    /// etcd as `<data>/cluster.json` names them.
    fn start_basalt(
        &mut self,
        bin: &Path,
        (size, device): (u64, u64),
        cluster: Option<LocalCluster>,
    ) -> Result<(), BenchError> {
        self.info.kind = if cluster.is_some() {
            "basalt-cluster"
        } else {
            "basalt-local"
        }
        .into();
        self.info.size_bytes = Some(size);
        self.info.version = tool_version(&bin.display().to_string(), &["--version"]);
        let data = self.scratch.join("data");
        std::fs::create_dir_all(&data)
            .map_err(|e| BenchError::io("creating the data directory", &data, e))?;
        let port = free_port()?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut cmd = Command::new(bin);
        cmd.arg("up").arg("--data").arg(&data);
        cmd.args(["--nbd", &addr.to_string()]);
        match cluster {
            // Every node listens on a port the OS picks.
            Some(c) => {
                cmd.args(["--nodes", &c.nodes.to_string()]);
                if let Some(r) = c.replicas {
                    cmd.args(["--replicas", &r.to_string()]);
                }
                if c.local_gateway {
                    cmd.arg("--local-gateway");
                }
            }
            None => {
                cmd.args(["--listen", "127.0.0.1:0"]);
            }
        }
        cmd.args(["--volume", "bench-0", "--volume-size", &size.to_string()]);
        cmd.args(["--device-size", &device.to_string()]);
        if matches!(self.info.durability.as_str(), "sync" | "flush") {
            cmd.args(["--durability", &self.info.durability]);
        }
        let command_line: Vec<String> = std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        stop_with_parent(&mut cmd);
        let log = self
            .log_dir
            .join(format!("{}-basalt-up.log", self.info.label));
        let child = spawn_logged(
            cmd,
            &log,
            &bin.display().to_string(),
            "basalt (build bin/basalt)",
        )?;
        self.info.logs.push(log.display().to_string());
        let pid = child.id();
        let mut guard = ChildGuard {
            child,
            name: "basalt up".into(),
            grace: if cluster.is_some() {
                CLUSTER_STOP_GRACE
            } else {
                STOP_GRACE
            },
        };
        wait_for_port(addr, &mut guard, &log)?;
        self.info.server_pids.push(pid);
        self.info.description = match cluster {
            None => {
                wait_cluster_file(&data, &mut guard, &log, written_node_addr)?;
                format!(
                    "single-node cluster started by the bench: {} (client on the same host, loopback)",
                    command_line.join(" ")
                )
            }
            Some(c) => {
                let pids = wait_cluster_pids(&data, &mut guard, &log)?;
                self.info.server_pids.extend(pids);
                self.info.logs.extend(
                    (1..=c.nodes)
                        .map(|k| data.join(format!("node{k}/node.log")).display().to_string()),
                );
                let gateway = if c.local_gateway {
                    "the NBD gateway in node1's process, node1's PGs reached in process; server CPU: up, every node with node1's gateway, etcd"
                } else {
                    "server CPU: up with its NBD gateway, every node, etcd"
                };
                format!(
                    "{} node processes, pool of {} copies on different nodes, all on this host and disk, started by the bench: {} ({gateway}; client on the same host, loopback)",
                    c.nodes,
                    c.copies(),
                    command_line.join(" ")
                )
            }
        };
        self.children.push(guard);
        let uri = std::fs::read_to_string(&log)
            .ok()
            .and_then(|l| {
                l.split_whitespace()
                    .find(|w| w.starts_with("nbd://") && w.ends_with("/bench-0"))
                    .map(String::from)
            })
            .unwrap_or_else(|| format!("nbd://{addr}/bench-0"));
        self.push_nbd(&uri);
        self.basalt = Some((bin.to_path_buf(), data, addr));
        Ok(())
    }

    /// `BIN volume create bench-N --size SIZE` (BASALT_DATA names the cluster's data directory).
    fn create_basalt_volume(&mut self, i: usize, size: u64) -> Result<(), BenchError> {
        let Some((bin, data, addr)) = self.basalt.clone() else {
            return Err(BenchError::TargetStart("no local cluster".into()));
        };
        let name = format!("bench-{i}");
        let mut cmd = Command::new(&bin);
        cmd.args(["volume", "create", &name, "--size", &size.to_string()])
            .env("BASALT_DATA", &data);
        let out = output_with_timeout(cmd, Duration::from_secs(60)).map_err(|e| {
            BenchError::TargetStart(format!("{} volume create: {e}", bin.display()))
        })?;
        if !out.status.success() {
            return Err(BenchError::TargetStart(format!(
                "{} volume create {name} failed: {}",
                bin.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        self.push_nbd(&format!("nbd://{addr}/{name}"));
        Ok(())
    }

    /// Stops everything this target started (also done on drop), and copies the node logs of
    /// a cluster it started into the log directory (its data directory is removed with it).
    pub fn stop(&mut self) {
        self.children.clear();
        let Some((_, data, _)) = &self.basalt else {
            return;
        };
        for log in &mut self.info.logs {
            let from = PathBuf::from(&*log);
            let Some(node) = from
                .strip_prefix(data)
                .ok()
                .and_then(|p| p.parent())
                .and_then(|p| p.to_str())
            else {
                continue;
            };
            let to = self.log_dir.join(format!("{}-{node}.log", self.info.label));
            if std::fs::copy(&from, &to).is_ok() {
                *log = to.display().to_string();
            }
        }
    }
}

/// How long a server the bench started may take to stop after SIGTERM before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// The same for `basalt up --nodes`: it stops its gateway, then every node (each leaves the
/// cluster), then etcd; killed, it would leave its nodes to the kernel's SIGTERM.
pub const CLUSTER_STOP_GRACE: Duration = Duration::from_secs(40);

/// A child process that is stopped (SIGTERM, then SIGKILL after `grace`) when dropped.
#[derive(Debug)]
pub struct ChildGuard {
    pub child: Child,
    pub name: String,
    pub grace: Duration,
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) with a pid we spawned and have not reaped yet (try_wait saw it alive).
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + self.grace;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it).
pub fn free_port() -> Result<u16, BenchError> {
    let l = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| BenchError::io("binding a probe port", "127.0.0.1:0", e))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| BenchError::io("reading a probe port", "127.0.0.1:0", e))
}

/// The child gets SIGTERM (a clean stop) when the bench dies, however it dies: a killed bench
/// leaves no cluster running. (Ctrl-C in a terminal reaches the whole process group anyway.)
fn stop_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory shared with the parent. The
    // signal follows the spawning thread: targets are started and stopped by the thread that
    // runs the whole bench.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn spawn_logged(
    mut cmd: Command,
    log: &Path,
    program: &str,
    package: &str,
) -> Result<Child, BenchError> {
    let f =
        std::fs::File::create(log).map_err(|e| BenchError::io("creating a log file", log, e))?;
    let f2 = f
        .try_clone()
        .map_err(|e| BenchError::io("creating a log file", log, e))?;
    cmd.stdin(Stdio::null()).stdout(f).stderr(f2);
    cmd.spawn().map_err(|source| BenchError::ToolMissing {
        program: program.to_string(),
        package: package.to_string(),
        source,
    })
}

/// Waits (up to 60 s) until `addr` accepts connections; fails early if the server exits.
fn wait_for_port(addr: SocketAddr, guard: &mut ChildGuard, log: &Path) -> Result<(), BenchError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = guard.child.try_wait() {
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            let tail: String = tail
                .lines()
                .rev()
                .take(10)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            return Err(BenchError::TargetStart(format!(
                "{} exited ({status}) before listening on {addr}; log {}:\n{tail}",
                guard.name,
                log.display()
            )));
        }
        if Instant::now() > deadline {
            return Err(BenchError::TargetStart(format!(
                "{} did not listen on {addr} within 60 s; see {}",
                guard.name,
                log.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The node and etcd pids of a `basalt up --nodes` (as `guard`), from the `<data>/cluster.json`
/// it writes once it serves (just after its NBD port opens): waits up to 60 s, failing early if
/// `up` exits.
fn wait_cluster_pids(
    data: &Path,
    guard: &mut ChildGuard,
    log: &Path,
) -> Result<Vec<u32>, BenchError> {
    wait_cluster_file(data, guard, log, cluster_pids)
}

/// What `read` finds in the `<data>/cluster.json` that `up` (as `guard`) writes once it serves
/// (just after its NBD port opens; the node's address, which the network probe uses, is only
/// there): waits up to 60 s, failing early if `up` exits.
fn wait_cluster_file<T>(
    data: &Path,
    guard: &mut ChildGuard,
    log: &Path,
    read: impl Fn(&Path, u32) -> Option<T>,
) -> Result<T, BenchError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(found) = read(data, guard.child.id()) {
            return Ok(found);
        }
        if let Ok(Some(status)) = guard.child.try_wait() {
            return Err(BenchError::TargetStart(format!(
                "{} exited ({status}) before writing {}; see {}",
                guard.name,
                data.join("cluster.json").display(),
                log.display()
            )));
        }
        if Instant::now() > deadline {
            return Err(BenchError::TargetStart(format!(
                "{} did not write {} within 60 s; see {}",
                guard.name,
                data.join("cluster.json").display(),
                log.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The node's address in `<data>/cluster.json`, if it is there and written by `up_pid`.
fn written_node_addr(data: &Path, up_pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(data.join("cluster.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    (v["pid"].as_u64() == Some(u64::from(up_pid)))
        .then(|| v["node_addr"].as_str().map(String::from))
        .flatten()
}

/// Every node's pid and etcd's from `<data>/cluster.json`, if it is there and written by `up_pid`.
pub fn cluster_pids(data: &Path, up_pid: u32) -> Option<Vec<u32>> {
    let text = std::fs::read_to_string(data.join("cluster.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    if v["pid"].as_u64() != Some(u64::from(up_pid)) {
        return None;
    }
    let pid = |x: &serde_json::Value| x.as_u64().and_then(|p| u32::try_from(p).ok());
    let mut pids: Vec<u32> = v["nodes"]
        .as_array()?
        .iter()
        .map(|n| pid(&n["pid"]))
        .collect::<Option<_>>()?;
    if pids.is_empty() {
        return None;
    }
    pids.extend(pid(&v["etcd_pid"]));
    Some(pids)
}

fn make_file(path: &Path, size: u64) -> Result<(), BenchError> {
    let f =
        std::fs::File::create(path).map_err(|e| BenchError::io("creating a data file", path, e))?;
    f.set_len(size)
        .map_err(|e| BenchError::io("sizing a data file", path, e))
}

/// Runs a command to completion with a deadline (kills it after).
pub fn output_with_timeout(mut cmd: Command, timeout: Duration) -> std::io::Result<Output> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    let deadline = Instant::now() + timeout;
    loop {
        if child.try_wait()?.is_some() {
            return child.wait_with_output();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return child.wait_with_output();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// First line of `program args` (e.g. `nbdkit 1.32.5`), if it runs.
pub fn tool_version(program: &str, args: &[&str]) -> Option<String> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    let out = output_with_timeout(cmd, Duration::from_secs(10)).ok()?;
    let text = String::from_utf8_lossy(if out.stdout.is_empty() {
        &out.stderr
    } else {
        &out.stdout
    })
    .to_string();
    out.status
        .success()
        .then(|| text.lines().next().unwrap_or("").trim().to_string())
}

/// `nbdinfo --size URI`, if libnbd-bin is installed and the export answers.
fn nbd_size(uri: &str) -> Option<u64> {
    let mut cmd = Command::new("nbdinfo");
    cmd.args(["--size", uri]);
    let out = output_with_timeout(cmd, Duration::from_secs(10)).ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// Ceph daemons' pids from `<dir of ceph.conf>/pids/*.pid` (as shared/peers/ceph/setup.sh writes them).
fn ceph_pids(conf: &Path) -> Vec<u32> {
    let Some(dir) = conf.parent().map(|d| d.join("pids")) else {
        return Vec::new();
    };
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_pids_are_every_node_and_etcd_of_this_up() {
        let dir = tempfile::tempdir().expect("dir");
        assert_eq!(cluster_pids(dir.path(), 10), None, "no file yet");
        let file = r#"{"v":1,"pid":10,"node_addr":"127.0.0.1:1","nbd_addr":"127.0.0.1:2",
            "etcd":["http://127.0.0.1:3"],"etcd_pid":14,
            "nodes":[{"id":1,"name":"node1","addr":"a","data":"d","pid":11},
                     {"id":2,"name":"node2","addr":"a","data":"d","pid":12},
                     {"id":3,"name":"node3","addr":"a","data":"d","pid":13}]}"#;
        std::fs::write(dir.path().join("cluster.json"), file).expect("write");
        assert_eq!(cluster_pids(dir.path(), 10), Some(vec![11, 12, 13, 14]));
        assert_eq!(cluster_pids(dir.path(), 99), None, "written by another up");
        assert_eq!(
            written_node_addr(dir.path(), 10).as_deref(),
            Some("127.0.0.1:1")
        );
        assert_eq!(
            written_node_addr(dir.path(), 99),
            None,
            "written by another up"
        );
        let no_nodes = r#"{"v":1,"pid":10,"nodes":[]}"#;
        std::fs::write(dir.path().join("cluster.json"), no_nodes).expect("write");
        assert_eq!(cluster_pids(dir.path(), 10), None);
    }
}
