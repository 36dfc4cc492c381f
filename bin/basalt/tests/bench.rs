//! `basalt bench` end to end: it starts a real local cluster (`basalt up`, this package's binary),
//! runs real fio steps of about a second against its volume, and writes the report. The checks
//! read fio's own JSON files independently and look for the same numbers in report.html.

mod common;

use basalt_bench::readback::{data_cells, run_short as run};
use common::{BASALT, Proc, wait_until};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

fn fio_json(dir: &Path, step: &str) -> Value {
    let text = std::fs::read_to_string(dir.join("fio").join(format!("{step}.json")))
        .expect("fio json kept");
    let start = text.find("\n{").map_or(0, |i| i + 1);
    serde_json::from_str(&text[start..]).expect("fio wrote JSON")
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

#[test]
fn matrix_on_a_local_cluster_writes_a_report_with_fios_numbers() {
    let out = tempfile::tempdir().expect("out");
    let scratch = tempfile::tempdir().expect("scratch");
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_basalt"));
    let dir = run(
        &[
            "matrix",
            "--bs",
            "4k",
            "--mixes",
            "100,0,70",
            "--jobs",
            "1",
            "--iodepth",
            "4",
            "--basalt-bin",
            bin.to_str().expect("utf8"),
        ],
        out.path(),
        scratch.path(),
    )
    .expect("the run completes");
    for f in [
        "report.html",
        "results.json",
        "results.csv",
        "env.json",
        "plots/matrix-4k.svg",
    ] {
        assert!(dir.join(f).exists(), "{f} written");
    }
    let html = std::fs::read_to_string(dir.join("report.html")).expect("html");
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).expect("json"))
            .expect("parses");

    // Every IOPS and Mbit/s cell equals what fio wrote for that step.
    let cells: Vec<_> = data_cells(&html)
        .into_iter()
        .map(|c| (c.step, c.metric, c.value))
        .collect();
    let mut checked = 0;
    for (step, metric, value) in &cells {
        let j = &fio_json(&dir, step)["jobs"][0];
        let sum =
            |k: &str| j["read"][k].as_f64().unwrap_or(0.0) + j["write"][k].as_f64().unwrap_or(0.0);
        let want = match metric.as_str() {
            "iops" => sum("iops"),
            "mbit_s" => sum("bw_bytes") * 8.0 / 1e6,
            "mib_s" => sum("bw_bytes") / 1048576.0,
            _ => continue,
        };
        assert!(
            (value - want).abs() <= want.abs() * 1e-12,
            "{step} {metric}: report {value}, fio {want}"
        );
        checked += 1;
    }
    // Three matrix steps x (IOPS table + Mbit/s table + per-section step table), plus baselines.
    assert!(checked >= 9, "only {checked} numeric cells checked");
    for m in ["4k-rand-r100", "4k-rand-r0", "4k-rand-r70", "4k-seq-r70"] {
        assert!(
            cells.iter().any(|(s, k, _)| s.contains(m) && k == "iops"),
            "matrix step {m} in a table"
        );
    }
    assert!(html.contains("Table 1: IOPS, Random access pattern with 4K block size"));
    assert!(
        html.contains("of disk 4K random"),
        "results are shown as a fraction of the raw limit"
    );

    // Every Basalt step has server CPU per IO (the server pid is known) and is a success.
    let steps: Vec<&Value> = results["sections"]
        .as_array()
        .expect("sections")
        .iter()
        .flat_map(|s| s["steps"].as_array().expect("steps"))
        .collect();
    let matrix: Vec<&&Value> = steps.iter().filter(|s| s["section"] == "matrix").collect();
    assert_eq!(matrix.len(), 6);
    for s in &matrix {
        assert_eq!(s["status"], "ok", "{s}");
        assert!(
            s["cpu"]["server_us_per_io"]
                .as_f64()
                .is_some_and(|v| v > 0.0),
            "server CPU per IO: {}",
            s["cpu"]
        );
        // fio's own CPU is counted in clock ticks (10 ms): over a 1 s step on a loaded machine
        // it can round to zero, but it is always measured.
        assert!(
            s["cpu"]["client_us_per_io"]
                .as_f64()
                .is_some_and(|v| v >= 0.0),
            "client CPU per IO: {}",
            s["cpu"]
        );
        assert!(s["limit"]["fraction"].as_f64().is_some_and(|v| v > 0.0));
    }
    // Honesty fields.
    let env = &results["env"];
    assert_eq!(env["runtime_s"], 1.0);
    assert_eq!(env["targets"][0]["kind"], "basalt-local");
    assert_eq!(env["targets"][0]["size_bytes"], 64 << 20);
    assert_eq!(env["targets"][0]["filled_bytes"], 64 << 20);
    // The cluster's device is sized for the run, not for the disk (tests run side by side).
    let device = basalt_bench::device_size_for(64 << 20, 1);
    assert!(
        env["targets"][0]["description"]
            .as_str()
            .is_some_and(|d| d.contains(&format!(" --device-size {device} "))),
        "{}",
        env["targets"][0]["description"]
    );
    assert!(
        results["baselines"]["rand_read_iops"]
            .as_f64()
            .is_some_and(|v| v > 0.0)
    );
    assert!(
        results["baselines"]["net"]["throughput_bytes_s"]
            .as_f64()
            .is_some_and(|v| v > 0.0)
    );
    // The network baseline: the client's loopback path is the limit, and the node was also
    // measured through Basalt's own protocol.
    let path = results["baselines"]["net"]["path"]
        .as_str()
        .unwrap_or_default();
    assert!(path.starts_with("loopback"), "network limit path: {path}");
    assert!(
        html.contains("basalt protocol to node.1 at 127.0.0.1:"),
        "node probe row missing"
    );

    // The cluster the bench started is gone.
    let pid = env["targets"][0]["server_pids"][0].as_u64().expect("pid") as u32;
    assert!(!alive(pid), "server {pid} still running after the bench");
}

/// `compare` against a real local cluster, nbdkit and the raw file: every ratio in the IOPS
/// table and in the durable-write table is the quotient of the two steps' IOPS as fio wrote them.
#[test]
fn compare_ratios_come_from_fios_numbers() {
    let out = tempfile::tempdir().expect("out");
    let scratch = tempfile::tempdir().expect("scratch");
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_basalt"));
    let dir = run(
        &[
            "compare",
            "--no-baseline",
            "--basalt-bin",
            bin.to_str().expect("utf8"),
        ],
        out.path(),
        scratch.path(),
    )
    .expect("the run completes");
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).expect("json"))
            .expect("parses");
    let section = results["sections"]
        .as_array()
        .expect("sections")
        .iter()
        .find(|s| s["id"] == "compare")
        .expect("compare section");
    let iops = |step: &Value| {
        let j = &fio_json(&dir, step.as_str().expect("step id"))["jobs"][0];
        j["read"]["iops"].as_f64().unwrap_or(0.0) + j["write"]["iops"].as_f64().unwrap_or(0.0)
    };
    let table = |title: &str| {
        section["tables"]
            .as_array()
            .expect("tables")
            .iter()
            .find(|t| t["title"] == title)
            .unwrap_or_else(|| panic!("table {title}"))
            .clone()
    };
    let ratio = |a: f64, b: f64, cell: &Value, what: &str| {
        let got = cell["value"]
            .as_f64()
            .unwrap_or_else(|| panic!("{what}: {cell}"));
        assert!(
            (got - a / b).abs() <= got * 1e-9,
            "{what}: report {got}, fio {a} / {b}"
        );
    };

    // IOPS: job, basalt, nbdkit-file, raw-file, basalt / nbdkit-file, basalt / raw-file.
    let t = table("Compare: IOPS");
    let cols: Vec<&str> = t["columns"]
        .as_array()
        .expect("columns")
        .iter()
        .map(|c| c.as_str().expect("column"))
        .collect();
    let col = |name: &str| cols.iter().position(|c| *c == name).expect(name);
    let mut checked = 0;
    for row in t["rows"].as_array().expect("rows") {
        let Some(b) = row[col("basalt")]["step"]
            .as_str()
            .map(|_| iops(&row[col("basalt")]["step"]))
        else {
            continue;
        };
        let job = row[0]["text"].as_str().expect("job");
        for target in ["basalt", "nbdkit-file", "raw-file"] {
            let step = row[col(target)]["step"].as_str().expect("step");
            assert!(step.ends_with(&format!("-{job}-{target}")), "{job}: {step}");
        }
        for peer in ["nbdkit-file", "raw-file"] {
            let p = iops(&row[col(peer)]["step"]);
            ratio(
                b,
                p,
                &row[col(&format!("basalt / {peer}"))],
                &format!("{} / {peer}", row[0]["text"]),
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 14, "7 jobs x 2 peers");

    // Durable write: basalt's 4K random write QD64 over the raw file's fdatasync=32 line.
    let t = table("Compare: 4K random write QD64 against the durable raw limit");
    let row = t["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r[0]["text"] == "basalt")
        .expect("basalt row");
    assert_eq!(row[1]["text"], "sync");
    let write_step = row[2]["step"].as_str().expect("write step");
    assert!(
        write_step.ends_with("-compare-randwrite-4k-qd64-basalt"),
        "{write_step}"
    );
    let durable_step = row[3]["step"].as_str().expect("durable step");
    assert!(
        durable_step.ends_with("randwrite-4k-qd64-fdatasync32-raw-file"),
        "{durable_step}"
    );
    ratio(
        iops(&row[2]["step"]),
        iops(&row[3]["step"]),
        &row[4],
        "durable ratio",
    );
}

/// `cluster`: a real `basalt up --nodes 3` (3 copies) beside single-node Basalt and
/// `nbdkit memory`, one job. The cluster's server CPU is summed over `up`, its 3 nodes and etcd
/// (5 pids); its ratios to the other two are the quotients of fio's own numbers; everything the
/// bench started is gone afterwards.
#[test]
fn cluster_profile_puts_a_replicated_cluster_beside_one_node() {
    let out = tempfile::tempdir().expect("out");
    let scratch = tempfile::tempdir().expect("scratch");
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_basalt"));
    let dir = run(
        &[
            "cluster",
            "--only",
            "randwrite-4k-qd64",
            // Four devices (three nodes and the single one): 512 MiB each instead of the
            // default 1.1 GiB keeps the test's disk footprint small.
            "--device-size",
            "512MiB",
            "--no-baseline",
            "--basalt-bin",
            bin.to_str().expect("utf8"),
        ],
        out.path(),
        scratch.path(),
    )
    .expect("the run completes");
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).expect("json"))
            .expect("parses");
    let targets = results["env"]["targets"].as_array().expect("targets");
    let kinds: Vec<&str> = targets
        .iter()
        .map(|t| t["kind"].as_str().expect("kind"))
        .collect();
    assert_eq!(kinds, ["basalt-cluster", "basalt-local", "nbdkit-memory"]);
    assert_eq!(targets[0]["label"], "basalt-rep3");
    assert!(
        targets[0]["description"]
            .as_str()
            .is_some_and(|d| d.contains(" up ") && d.contains(" --nodes 3 ")),
        "{}",
        targets[0]["description"]
    );
    let pids = |t: &Value| -> Vec<u32> {
        t["server_pids"]
            .as_array()
            .expect("pids")
            .iter()
            .map(|p| p.as_u64().expect("pid") as u32)
            .collect()
    };
    let cluster_pids = pids(&targets[0]);
    assert_eq!(cluster_pids.len(), 5, "up, 3 nodes, etcd: {cluster_pids:?}");

    let section = results["sections"]
        .as_array()
        .expect("sections")
        .iter()
        .find(|s| s["id"] == "cluster")
        .expect("cluster section");
    let steps = section["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 3, "one job on three targets");
    for s in steps {
        assert_eq!(s["status"], "ok", "{s}");
        assert!(
            s["cpu"]["server_us_per_io"]
                .as_f64()
                .is_some_and(|v| v > 0.0),
            "server CPU per IO of {}: {}",
            s["target"],
            s["cpu"]
        );
    }
    let row = |title: &str| {
        let t = section["tables"]
            .as_array()
            .expect("tables")
            .iter()
            .find(|t| t["title"] == title)
            .unwrap_or_else(|| panic!("table {title}"))
            .clone();
        let cols: Vec<String> = t["columns"]
            .as_array()
            .expect("columns")
            .iter()
            .map(|c| c.as_str().expect("column").to_string())
            .collect();
        (cols, t["rows"][0].clone())
    };
    // Ratios of the cluster to each other target, from fio's JSON (IOPS) and from the steps'
    // own CPU figures (server CPU per IO).
    let (cols, r) = row("Cluster: IOPS");
    let col = |name: &str| cols.iter().position(|c| c == name).expect(name);
    let iops = |target: &str| {
        let step = r[col(target)]["step"].as_str().expect("step");
        assert!(
            step.ends_with(&format!("-cluster-randwrite-4k-qd64-{target}")),
            "{step}"
        );
        let j = &fio_json(&dir, step)["jobs"][0];
        j["read"]["iops"].as_f64().unwrap_or(0.0) + j["write"]["iops"].as_f64().unwrap_or(0.0)
    };
    for other in ["basalt", "nbdkit-memory"] {
        let got = r[col(&format!("basalt-rep3 / {other}"))]["value"]
            .as_f64()
            .expect("ratio");
        let want = iops("basalt-rep3") / iops(other);
        assert!(
            (got - want).abs() <= want * 1e-9,
            "{other}: {got} vs {want}"
        );
    }
    let (cols, r) = row("Cluster: server CPU µs per IO");
    let cpu = |target: &str| {
        steps
            .iter()
            .find(|s| s["target"] == target)
            .and_then(|s| s["cpu"]["server_us_per_io"].as_f64())
            .expect("cpu")
    };
    let c = cols
        .iter()
        .position(|c| c == "basalt-rep3 / basalt")
        .expect("cpu ratio column");
    let got = r[c]["value"].as_f64().expect("cpu ratio");
    let want = cpu("basalt-rep3") / cpu("basalt");
    assert!((got - want).abs() <= want * 1e-9, "cpu: {got} vs {want}");

    // Nothing the bench started is left: up, its nodes and etcd, the single node, nbdkit.
    for t in targets {
        for p in pids(t) {
            assert!(
                !alive(p),
                "{} pid {p} still running after the bench",
                t["label"]
            );
        }
    }
}

/// Children of `pid` (all its threads).
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// Kills a process that is not our child (the bench's `basalt up`) when the test ends, whatever
/// happened.
struct KillOnDrop(u32);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: sending a signal; the pid was checked to be the bench's `basalt up`.
        unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGKILL) };
    }
}

/// A bench killed with SIGKILL (no chance to clean up) still leaves no cluster running: the
/// `basalt up` it started stops with it.
#[test]
fn a_killed_bench_leaves_no_cluster_running() {
    let out = tempfile::tempdir().expect("out");
    let mut bench = Proc(
        Command::new(BASALT)
            .args([
                "bench",
                "matrix",
                "--bs",
                "4k",
                "--mixes",
                "100",
                "--runtime",
                "60",
            ])
            .args([
                "--size",
                "64MiB",
                "--no-baseline",
                "--no-precondition",
                "--no-progress",
            ])
            .args(["--quiet-timeout", "0", "--settle-timeout", "0", "--out"])
            .arg(out.path().join("r"))
            .arg("--scratch")
            .arg(out.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("bench starts"),
    );
    let is_up = |c: &u32| {
        std::fs::read(format!("/proc/{c}/cmdline"))
            .is_ok_and(|s| s.split(|b| *b == 0).any(|a| a == b"up"))
    };
    let mut up = None;
    wait_until(
        "the bench's `basalt up` child",
        Duration::from_secs(60),
        || {
            up = children(bench.0.id()).into_iter().find(is_up);
            up.is_some()
        },
    );
    let up = up.expect("found");
    let _up_guard = KillOnDrop(up);
    bench.0.kill().expect("SIGKILL the bench");
    bench.0.wait().expect("reaped");
    wait_until(
        "basalt up to stop after its bench was killed",
        Duration::from_secs(30),
        || !alive(up),
    );
}
