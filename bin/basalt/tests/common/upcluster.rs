//! A `basalt up --nodes N` cluster with control over its processes: kill a node (SIGKILL),
//! start it again with its own command line (the test owns that process then), replace etcd,
//! and what the tests ask of it (devices up, PG primaries, the leader, every PG clean).

use super::{Proc, Up, UpOptions, wait_until};
use basalt_placement::pg_of;
use basalt_types::{ObjectId, PoolId, VolumeId};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One `basalt node` of the cluster.
pub struct UpNode {
    pub name: String,
    pub id: u64,
    /// Its first device.
    pub device: u64,
    /// All its devices, by id.
    pub devices: Vec<u64>,
    pub dir: PathBuf,
    /// Its command line (program first), read from /proc when `up` started it.
    cmdline: Vec<String>,
    /// Its process id while it runs.
    pub pid: Option<u32>,
    /// The process, when the test started it (again).
    proc: Option<Proc>,
}

pub struct UpCluster {
    /// First, so that it prints the logs before the processes are gone.
    _dump: DumpOnPanic,
    pub up: Up,
    pub nodes: Vec<UpNode>,
    /// etcd when the test started it again (it must outlive `up`'s nodes).
    etcd: Option<Proc>,
    pub pool: PoolId,
    pub pg_count: u32,
    pub object_size: u64,
    pub volume: VolumeId,
}

/// The command line of process `pid`.
pub fn cmdline(pid: u32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).expect("the process runs");
    raw.split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// Whether `pid` runs (and is not a zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(
        |s| !matches!(s.rsplit(')').next().map(str::trim_start), Some(t) if t.starts_with('Z')),
    )
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: signalling a process this test started (directly or through `basalt up`).
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0, "kill {pid}");
}

/// A node stopped by [`UpCluster::freeze`]; continued when dropped.
pub struct Frozen(u32);

impl Drop for Frozen {
    fn drop(&mut self) {
        // No assertion: this may run while a failing test unwinds, on a node gone meanwhile.
        // SAFETY: signalling a node process this test started.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

/// Prints the end of some log files when the test fails.
struct DumpOnPanic(Vec<PathBuf>);

impl Drop for DumpOnPanic {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for path in &self.0 {
            let Ok(text) = std::fs::read_to_string(path) else {
                continue;
            };
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            eprintln!("--- {}\n{}", path.display(), tail.join("\n"));
        }
    }
}

fn nodes_logs(nodes: &[UpNode]) -> Vec<PathBuf> {
    nodes.iter().map(|n| n.dir.join("node.log")).collect()
}

impl UpCluster {
    /// `basalt up --nodes <nodes>` with `extra` options on `dir`.
    pub fn start(dir: &Path, nodes: u32, volume_size: &'static str, extra: &[&str]) -> UpCluster {
        let mut args: Vec<String> = vec!["--nodes".into(), nodes.to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        let up = Up::start(
            dir,
            &UpOptions {
                device_size: "512MiB",
                volume_size,
                extra: args,
            },
        );
        let file: Value =
            serde_json::from_slice(&std::fs::read(up.dir.join("cluster.json")).unwrap()).unwrap();
        let status = up.cli_json(&["status"]);
        let nodes: Vec<UpNode> = file["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                let id = n["id"].as_u64().unwrap();
                let pid = n["pid"].as_u64().unwrap() as u32;
                let devices = devices_in_status(&status, id);
                assert!(!devices.is_empty(), "node {id} has no device in {status}");
                UpNode {
                    name: n["name"].as_str().unwrap().to_string(),
                    id,
                    device: devices[0],
                    devices,
                    dir: PathBuf::from(n["data"].as_str().unwrap()),
                    cmdline: cmdline(pid),
                    pid: Some(pid),
                    proc: None,
                }
            })
            .collect();
        let pool = up.cli_json(&["pool", "info", "default"]);
        let volume = up.cli_json(&["volume", "info", "vol0"]);
        let mut logs: Vec<PathBuf> = nodes_logs(&nodes);
        logs.push(up.stderr_log.clone());
        logs.push(up.dir.join("etcd-restarted.log"));
        UpCluster {
            _dump: DumpOnPanic(logs),
            pool: PoolId(pool["id"].as_u64().unwrap() as u32),
            pg_count: pool["pg_count"].as_u64().unwrap() as u32,
            object_size: pool["object_size"].as_u64().unwrap(),
            volume: VolumeId(volume["id"].as_u64().unwrap()),
            up,
            nodes,
            etcd: None,
        }
    }

    pub fn node(&self, id: u64) -> &UpNode {
        self.nodes.iter().find(|n| n.id == id).expect("a node")
    }

    fn node_mut(&mut self, id: u64) -> &mut UpNode {
        self.nodes.iter_mut().find(|n| n.id == id).expect("a node")
    }

    /// Starts another node that joins the running cluster (`basalt node --join`, its data in
    /// the next free `nodeK` directory, one device the size of node1's); the test owns the
    /// process. Returns once the map has its device up.
    pub fn join(&mut self) -> u64 {
        let k = self.nodes.len() + 1;
        let dir = self.up.dir.join(format!("node{k}"));
        std::fs::create_dir_all(&dir).unwrap();
        let log = std::fs::File::create(dir.join("node.log")).unwrap();
        let mut line: Vec<String> = vec![super::BASALT.into(), "node".into(), "--join".into()];
        line.push(self.up.dir.display().to_string());
        line.extend(["--data".into(), dir.display().to_string()]);
        line.extend(["--lease-ttl".into(), super::upio::TTL.into()]);
        let child = Command::new(&line[0])
            .args(&line[1..])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start a node that joins");
        let pid = child.id();
        let proc = Proc(child);
        self._dump.0.push(dir.join("node.log"));
        let mut id = 0;
        wait_until("the new node's id", Duration::from_secs(60), || {
            id = std::fs::read_to_string(dir.join("node.id"))
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(0);
            id > 0
        });
        let mut devices = Vec::new();
        wait_until("the new node's device up", Duration::from_secs(60), || {
            devices = self
                .devices()
                .iter()
                .filter(|d| d["node"].as_u64() == Some(id) && d["up"] == true)
                .map(|d| d["id"].as_u64().unwrap())
                .collect();
            !devices.is_empty()
        });
        // The device path exists now: started again, the node opens it (no size needed).
        self.nodes.push(UpNode {
            name: format!("node{k}"),
            id,
            device: devices[0],
            devices,
            dir,
            cmdline: line,
            pid: Some(pid),
            proc: Some(proc),
        });
        id
    }

    /// SIGKILL to node `id`; returns once it is gone.
    pub fn kill(&mut self, id: u64) {
        let node = self.node_mut(id);
        let pid = node.pid.take().expect("the node runs");
        signal(pid, libc::SIGKILL);
        if let Some(mut p) = node.proc.take() {
            p.0.wait().unwrap();
        }
        wait_until("the killed node to exit", Duration::from_secs(30), || {
            !alive(pid)
        });
    }

    /// SIGSTOP to node `id` (a hung process, a paused VM): it holds its connections and
    /// requests and runs nothing until the returned guard is dropped, which sends SIGCONT (so
    /// a failing test never leaves it stopped, deaf to the SIGTERM of the cleanup).
    pub fn freeze(&self, id: u64) -> Frozen {
        let pid = self.node(id).pid.expect("the node runs");
        signal(pid, libc::SIGSTOP);
        Frozen(pid)
    }

    /// Starts node `id` again with the command line `up` gave it (output appended to its
    /// log); returns once the map has its device up.
    pub fn restart(&mut self, id: u64) {
        let node = self.node_mut(id);
        assert!(node.pid.is_none(), "{} runs", node.name);
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(node.dir.join("node.log"))
            .unwrap();
        let child = Command::new(&node.cmdline[0])
            .args(&node.cmdline[1..])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the node again");
        node.pid = Some(child.id());
        node.proc = Some(Proc(child));
        let devices = node.devices.clone();
        wait_until(
            "the restarted node's devices up",
            Duration::from_secs(60),
            || devices.iter().all(|d| self.device_up(*d)),
        );
    }

    /// SIGKILL to etcd, then etcd again with the same command line (same data, same port).
    /// Returns once it answers.
    pub fn restart_etcd(&mut self) {
        let pid = match &self.etcd {
            Some(p) => p.0.id(),
            None => {
                let file: Value = serde_json::from_slice(
                    &std::fs::read(self.up.dir.join("cluster.json")).unwrap(),
                )
                .unwrap();
                file["etcd_pid"].as_u64().unwrap() as u32
            }
        };
        let line = cmdline(pid);
        signal(pid, libc::SIGKILL);
        if let Some(mut p) = self.etcd.take() {
            p.0.wait().unwrap();
        }
        wait_until("etcd to exit", Duration::from_secs(30), || !alive(pid));
        // Its ports came from the ephemeral range: until it binds them again, an outgoing
        // connection of another process may hold one. Start it again until it stays up.
        let path = self.up.dir.join("etcd-restarted.log");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = std::fs::File::create(&path).unwrap();
            let child = Command::new(&line[0])
                .args(&line[1..])
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("start etcd again");
            let mut etcd = Proc(child);
            let mut answers = false;
            wait_until("etcd to answer or exit", Duration::from_secs(30), || {
                answers = self.up.cli(&["device", "list", "--json"]).status.success();
                answers || etcd.0.try_wait().unwrap().is_some()
            });
            if answers {
                self.etcd = Some(etcd);
                return;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                text.contains("address already in use") && Instant::now() < deadline,
                "etcd did not start again:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn devices(&self) -> Vec<Value> {
        self.up
            .cli_json(&["device", "list"])
            .as_array()
            .unwrap()
            .clone()
    }

    pub fn device_up(&self, device: u64) -> bool {
        let out = self.up.cli(&["device", "list", "--json"]);
        out.status.success()
            && serde_json::from_slice::<Value>(&out.stdout)
                .unwrap()
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d["id"].as_u64() == Some(device) && d["up"] == true)
    }

    /// The acting set of every PG of the default pool, by PG number.
    pub fn acting(&self) -> Vec<Vec<u64>> {
        self.up
            .cli_json(&["pg", "list", "--pool", "default"])
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                p["acting"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap())
                    .collect()
            })
            .collect()
    }

    /// How many PGs each node's device is the primary (first acting device) of.
    pub fn primaries(&self) -> Vec<(u64, usize)> {
        let acting = self.acting();
        self.nodes
            .iter()
            .map(|n| {
                let count = acting.iter().filter(|a| a.first() == Some(&n.device));
                (n.id, count.count())
            })
            .collect()
    }

    /// The node that leads now.
    pub fn leader(&self) -> Option<u64> {
        let status = self.up.cli_json(&["status"]);
        let name = status["leader"].as_str()?;
        let id = name.split('@').next()?;
        id.trim_start_matches(|c: char| !c.is_ascii_digit())
            .parse()
            .ok()
    }

    /// The PG of object number `object` of the volume.
    pub fn pg_of(&self, object: u64) -> usize {
        pg_of(
            &ObjectId::new(self.pool, self.volume, object),
            self.pg_count,
        ) as usize
    }

    /// Whether every PG is active and clean: in the map (every acting device up, acting = up)
    /// and as the primaries report it (active, nothing missing, no backfill, clean).
    pub fn all_clean(&self) -> bool {
        let out = self.up.cli(&["status", "--json"]);
        if !out.status.success() {
            return false;
        }
        let s: Value = serde_json::from_slice(&out.stdout).unwrap();
        pgs_clean(&s, self.pg_count)
    }

    /// Node `id`'s own status (`basalt status --json`, `nodes[].status`).
    pub fn node_status(&self, id: u64) -> Value {
        let status = self.up.cli_json(&["status"]);
        status["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"].as_u64() == Some(id))
            .map(|s| s["status"].clone())
            .unwrap_or_else(|| panic!("node {id} is not in the status: {status}"))
    }

    pub fn wait_clean(&self, limit: Duration) {
        wait_until("every PG active and clean", limit, || self.all_clean());
    }

    /// The end of every node's log (for failure messages).
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let text = std::fs::read_to_string(n.dir.join("node.log")).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- {} (node {})\n{}", n.name, n.id, tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Stops everything: the nodes the test started (SIGTERM: they leave), then `up` (its
    /// nodes, its gateway and etcd, or the etcd the test started).
    pub fn stop(mut self) {
        for n in &mut self.nodes {
            if let Some(mut p) = n.proc.take() {
                signal(p.0.id(), libc::SIGTERM);
                wait_until("a restarted node to stop", Duration::from_secs(30), || {
                    p.0.try_wait().unwrap().is_some()
                });
            }
        }
        self.up.stop();
        if let Some(mut etcd) = self.etcd.take() {
            signal(etcd.0.id(), libc::SIGTERM);
            wait_until("etcd to stop", Duration::from_secs(30), || {
                etcd.0.try_wait().unwrap().is_some()
            });
        }
    }
}

/// The device ids of node `id` in `basalt status --json`.
fn devices_in_status(status: &Value, id: u64) -> Vec<u64> {
    status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"].as_u64() == Some(id))
        .and_then(|s| s["devices"].as_array())
        .map(|ds| ds.iter().map(|d| d["id"].as_u64().unwrap()).collect())
        .unwrap_or_default()
}

/// Whether `basalt status --json` says every PG is active and clean: in the map (every acting
/// device up, acting = up) and as the primaries report it (active, nothing missing, no
/// backfill, clean), `pg_count` PGs in all.
pub fn pgs_clean(s: &Value, pg_count: u32) -> bool {
    if s["pgs"]["active_clean"] != s["pgs"]["total"] {
        return false;
    }
    let reports: Vec<&Value> = s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["status"]["pgs"].as_array())
        .flatten()
        .collect();
    reports.len() == pg_count as usize
        && reports.iter().all(|p| {
            p["state"] == "active"
                && p["clean"] == true
                && p["missing_objects"] == 0
                && p["backfilling"] == 0
        })
}
