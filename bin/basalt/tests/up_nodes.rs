//! `basalt up --nodes 3`: a local cluster of three `basalt node` processes on a private etcd,
//! with the NBD gateway in the `up` process. It serves a volume (fio verifies), `status` lists
//! the nodes with their pids, a node killed with SIGKILL shows as down with its device while
//! `up` keeps running, SIGTERM of `up` leaves no process behind, a restart serves the same data
//! with the same node ids, and a SIGKILL of `up` takes its children down too.

mod common;

use common::{BASALT, Up, UpOptions, tool_ok, wait_until};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(300);

fn opts() -> UpOptions {
    UpOptions {
        device_size: "512MiB",
        volume_size: "256MiB",
        extra: [
            "--nodes",
            "3",
            "--replicas",
            "1",
            "--lease-ttl",
            "3s",
            "--node-arg=--device-stall-timeout=7s",
        ]
        .map(String::from)
        .to_vec(),
    }
}

fn fio(uri: &str, extra: &[&str]) {
    let uri = format!("--uri={uri}");
    let mut args = vec![
        "--name=v",
        "--ioengine=nbd",
        uri.as_str(),
        "--rw=randwrite",
        "--bssplit=4k/50:64k/30:1m/20",
        "--iodepth=16",
        "--size=48m",
        "--verify=crc32c",
        "--randseed=7",
    ];
    args.extend_from_slice(extra);
    tool_ok("fio", &args, LONG);
}

fn cluster_file(up: &Up) -> Value {
    serde_json::from_slice(&std::fs::read(up.dir.join("cluster.json")).unwrap()).unwrap()
}

/// Node name -> (id, pid) from cluster.json.
fn started_nodes(file: &Value) -> BTreeMap<String, (u64, u32)> {
    file["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let pid = n["pid"].as_u64().unwrap() as u32;
            (
                n["name"].as_str().unwrap().to_string(),
                (n["id"].as_u64().unwrap(), pid),
            )
        })
        .collect()
}

/// Whether `pid` runs (and is not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(
        |s| !matches!(s.rsplit(')').next().map(str::trim_start), Some(t) if t.starts_with('Z')),
    )
}

/// The processes whose command line names `dir`: the nodes and etcd of an `up` on it.
fn processes_under(dir: &Path) -> Vec<String> {
    let needle = dir.display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let pid: u32 = name.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (cmdline.contains(&needle) && pid != std::process::id() && alive(pid))
                .then(|| format!("{pid}: {cmdline}"))
        })
        .collect()
}

/// The names of a process's threads.
fn thread_names(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|t| {
            let t = t.unwrap().path();
            std::fs::read_to_string(t.join("comm"))
                .unwrap()
                .trim()
                .to_string()
        })
        .collect()
}

fn node(status: &Value, id: u64) -> &Value {
    status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"].as_u64() == Some(id))
        .unwrap_or_else(|| panic!("node {id} not in {status}"))
}

fn kill(pid: u32, sig: i32) {
    // SAFETY: signalling a process this test started (directly or through `basalt up`).
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

#[test]
fn three_node_processes_serve_survive_a_dead_node_and_restart_with_the_same_data() {
    let dir = tempfile::tempdir().unwrap();
    let mut up = Up::start(dir.path(), &opts());
    let data = up.dir.clone();
    let file = cluster_file(&up);
    let nodes = started_nodes(&file);
    assert_eq!(
        nodes.keys().collect::<Vec<_>>(),
        ["node1", "node2", "node3"],
        "{file}"
    );
    assert!(nodes.values().all(|(_, pid)| alive(*pid)), "{file}");
    // --node-arg reached every node (which accepted it: it runs).
    for (name, (_, pid)) in &nodes {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(
            cmdline.contains("--device-stall-timeout=7s"),
            "{name}: {cmdline}"
        );
    }
    fio(&up.uri("vol0"), &[]);
    // Run to completion: each node drives its store from the thread that serves its network
    // (`basalt node --threads 1`, the default), so no store I/O thread exists.
    for (name, (_, pid)) in &nodes {
        let threads = thread_names(*pid);
        assert!(
            !threads.iter().any(|t| t.starts_with("basalt-io-")),
            "{name} runs a store on a thread of its own: {threads:?}"
        );
    }

    let status = up.cli_json(&["status"]);
    assert_eq!(status["health"]["status"], "ok", "{status}");
    assert_eq!(status["nodes"].as_array().unwrap().len(), 3, "{status}");
    for (name, (id, pid)) in &nodes {
        let n = node(&status, *id);
        assert_eq!(n["state"], "up", "{status}");
        assert_eq!(n["name"], name.as_str(), "{status}");
        assert_eq!(n["pid"].as_u64(), Some(u64::from(*pid)), "{status}");
        assert_eq!(n["devices"].as_array().unwrap().len(), 1, "{status}");
    }
    let pgs = &status["pgs"];
    assert_eq!(
        pgs["total"], 256,
        "the default for 3 devices and 1 copy: {status}"
    );
    assert_eq!(pgs["active_clean"], pgs["total"], "{status}");
    assert_eq!(status["recovery"]["degraded_objects"], 0, "{status}");
    assert_eq!(status["recovery"]["misplaced_objects"], 0, "{status}");
    assert_eq!(status["recovery"]["eta_secs"], Value::Null, "{status}");
    let text = up.cli(&["status"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("health: OK") && text.contains("node2"),
        "{text}"
    );

    // A node dies: it shows as down with its device, the rest of the cluster keeps serving.
    let (victim, victim_pid) = nodes["node2"];
    let device = node(&status, victim)["devices"][0]["id"].as_u64().unwrap();
    kill(victim_pid, libc::SIGKILL);
    wait_until("status to show node2 down", Duration::from_secs(60), || {
        let s = up.cli_json(&["status"]);
        let n = node(&s, victim);
        n["state"] == "down"
            && n["devices"][0]["up"] == false
            && s["devices"]["down"] == serde_json::json!([device])
    });
    let status = up.cli_json(&["status"]);
    assert_eq!(status["health"]["status"], "error", "{status}");
    let checks: Vec<&str> = status["health"]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["check"].as_str().unwrap())
        .collect();
    assert!(
        checks.contains(&"pgs_unavailable") && checks.contains(&"nodes_down"),
        "{status}"
    );
    assert!(node(&status, victim)["pid"].is_null(), "{status}");
    assert!(up.child.try_wait().unwrap().is_none(), "up keeps running");
    let list = tool_ok(
        "nbdinfo",
        &["--list", &format!("nbd://{}", up.nbd)],
        Duration::from_secs(60),
    );
    assert!(list.contains("export=\"vol0\""), "{list}");

    // SIGTERM: the gateway, the nodes and etcd all stop; nothing is left behind.
    let mut pids: Vec<u32> = nodes.values().map(|(_, p)| *p).collect();
    pids.push(file["etcd_pid"].as_u64().unwrap() as u32);
    up.stop();
    assert!(pids.iter().all(|p| !alive(*p)), "{pids:?}");
    assert_eq!(processes_under(&data), Vec::<String>::new());
    assert!(!data.join("cluster.json").exists());

    // Started again: the same nodes (ids), the same data.
    up = Up::start(dir.path(), &opts());
    let again = started_nodes(&cluster_file(&up));
    let ids = |m: &BTreeMap<String, (u64, u32)>| m.values().map(|v| v.0).collect::<Vec<_>>();
    assert_eq!(ids(&again), ids(&nodes));
    fio(&up.uri("vol0"), &["--verify_only"]);

    // SIGKILL of `up`: the kernel stops its children.
    up.kill9();
    wait_until("the children of a killed up to exit", LONG, || {
        processes_under(&data).is_empty()
    });
}

#[test]
fn up_nodes_refuses_bad_combinations_and_a_single_node_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_arg = data.display().to_string();
    let run = |args: &[&str]| {
        let out = Command::new(BASALT)
            .arg("up")
            .args(["--data", &data_arg, "--nbd", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "basalt up {args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&["--nodes", "2", "--replicas", "3"]);
    assert!(err.contains("--replicas 3 needs at least 3 nodes"), "{err}");
    let err = run(&["--replicas", "1"]);
    assert!(err.contains("--nodes"), "{err}");
    let err = run(&["--node-arg=--heartbeat-grace=1s"]);
    assert!(err.contains("--nodes"), "{err}");
    let err = run(&["--local-gateway"]);
    assert!(err.contains("--nodes"), "{err}");
    let err = run(&["--nodes", "2", "--listen", "127.0.0.1:0"]);
    assert!(err.contains("cannot be used with"), "{err}");
    let err = run(&["--nodes", "0"]);
    assert!(err.contains("0"), "{err}");
    // A directory that holds a single-node cluster is not taken over, nor the reverse.
    std::fs::create_dir_all(data.join("node")).unwrap();
    let err = run(&["--nodes", "2"]);
    assert!(err.contains("single-node cluster"), "{err}");
    std::fs::remove_dir(data.join("node")).unwrap();
    std::fs::create_dir_all(data.join("node2")).unwrap();
    let err = run(&["--listen", "127.0.0.1:0"]);
    assert!(err.contains("--nodes 2"), "{err}");
    assert!(!data.join("etcd").exists(), "nothing was started");
}
