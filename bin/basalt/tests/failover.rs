//! A node dies in a two-node cluster (real etcd, two `basalt node` processes, a `basalt nbd`
//! gateway, one copy per object): its data is unavailable, never zeros; the other node keeps
//! serving reads and writes; when it comes back every byte written before and during the
//! outage reads back; `basalt node drain` then moves b's data to a, and a serves all of it
//! with b stopped; `basalt node remove` forgets b, which may not come back.

mod common;

use common::nbd::NbdClient;
use common::{BASALT, Proc, wait_exit, wait_until};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const OBJECT: usize = 128 << 10;
const OBJECTS: u64 = 128;
const PGS: u32 = 16;
const IO_TIMEOUT: Duration = Duration::from_secs(3);

struct Cluster {
    dir: PathBuf,
    endpoint: String,
}

impl Cluster {
    /// Runs a CLI command with `--json` that must succeed.
    fn json(&self, args: &[&str]) -> Value {
        let out = Command::new(BASALT)
            .args(args)
            .args(["--json", "--etcd", &self.endpoint])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "basalt {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON output")
    }

    /// Runs a CLI command.
    fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(BASALT)
            .args(args)
            .args(["--etcd", &self.endpoint])
            .output()
            .unwrap()
    }

    /// Starts `basalt node` number `n` (its own data dir and 256 MiB device file).
    fn node(&self, n: &str) -> Proc {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("node-{n}.log")))
            .unwrap();
        let device = format!("{}:256MiB", self.device_path(n).display());
        Proc(
            Command::new(BASALT)
                .args(["node", "--etcd", &self.endpoint, "--listen", "127.0.0.1:0"])
                .args(["--device", &device, "--lease-ttl", "2s", "--data"])
                .arg(self.dir.join(format!("node-{n}")))
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    }

    fn device_path(&self, n: &str) -> PathBuf {
        self.dir.join(format!("dev-{n}.img"))
    }

    /// Device id -> (up, path) from `device list`.
    fn devices(&self) -> Vec<(u64, bool, String)> {
        self.json(&["device", "list"])
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["id"].as_u64().unwrap(),
                    d["up"].as_bool().unwrap(),
                    d["path"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    fn device_of(&self, n: &str) -> u64 {
        let path = self.device_path(n).display().to_string();
        let devs = self.devices();
        devs.iter().find(|d| d.2 == path).expect("registered").0
    }

    fn is_up(&self, device: u64) -> bool {
        self.devices().iter().any(|d| d.0 == device && d.1)
    }
}

/// The bytes of object `i` written in generation `g`: every 8-byte word names both.
fn pattern(i: u64, g: u64) -> Vec<u8> {
    let word = ((g << 32) | i).to_le_bytes();
    word.iter().copied().cycle().take(OBJECT).collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn log_of(dir: &Path) -> String {
    ["node-a.log", "node-b.log", "gateway.log"]
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(dir.join(f)).unwrap_or_default();
            format!(
                "--- {f}\n{}",
                text.lines().rev().take(30).collect::<Vec<_>>().join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_dead_nodes_data_is_unavailable_never_zeros_and_comes_back_whole() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let etcd = rt
        .block_on(basalt_meta::EtcdProcess::start_with(
            basalt_meta::EtcdOptions {
                data_dir: Some(tmp.path().join("etcd")),
                // etcd's own default: the map must fit in requests of that size.
                max_request_bytes: basalt_meta::ETCD_DEFAULT_REQUEST_BYTES,
                ..Default::default()
            },
        ))
        .expect("start etcd");
    let c = Cluster {
        dir: tmp.path().to_path_buf(),
        endpoint: etcd.endpoint(),
    };
    let _a = c.node("a");
    let mut b = c.node("b");
    wait_until("two devices up", Duration::from_secs(60), || {
        let devs = c.devices();
        devs.len() == 2 && devs.iter().all(|d| d.1)
    });
    // The pool comes after both devices, so its placement groups start on both.
    c.json(&[
        "pool",
        "create",
        "default",
        "--replicas",
        "1",
        "--pgs",
        &PGS.to_string(),
    ]);
    let (da, db) = (c.device_of("a"), c.device_of("b"));
    let acting = || -> Vec<u64> {
        c.json(&["pg", "list"])
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["acting"][0].as_u64().unwrap_or(0))
            .collect()
    };
    wait_until("every PG placed", Duration::from_secs(30), || {
        acting().len() == PGS as usize
    });
    let by_pg = acting();
    assert!(by_pg.contains(&da) && by_pg.contains(&db), "{by_pg:?}");

    let vol = c.json(&["volume", "create", "v", "--size", "16MiB"]);
    let vid = basalt_types::VolumeId(vol["id"].as_u64().unwrap());
    let pool =
        basalt_types::PoolId(c.json(&["pool", "info", "default"])["id"].as_u64().unwrap() as u32);
    let on_b: Vec<u64> = (0..OBJECTS)
        .filter(|&i| {
            let pg = basalt_placement::pg_of(&basalt_types::ObjectId::new(pool, vid, i), PGS);
            by_pg[pg as usize] == db
        })
        .collect();
    let on_a: Vec<u64> = (0..OBJECTS).filter(|i| !on_b.contains(i)).collect();
    assert!(
        !on_a.is_empty() && on_b.len() >= 2,
        "objects on b: {on_b:?}"
    );

    let listen = format!("127.0.0.1:{}", free_port());
    let _gw = Proc(
        Command::new(BASALT)
            .args(["nbd", "--etcd", &c.endpoint, "--listen", &listen])
            .args(["--io-timeout", "3s"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(tmp.path().join("gateway.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_until("the gateway to listen", Duration::from_secs(30), || {
        std::net::TcpStream::connect(&listen).is_ok()
    });
    let mut nbd = NbdClient::connect(&listen, "v").unwrap();
    for i in 0..OBJECTS {
        let e = nbd.write(i * OBJECT as u64, &pattern(i, 1), 0).unwrap();
        assert_eq!(e, 0, "write of object {i}");
    }

    // kill -9 node b; its lease expires and the leader (a, or a after taking over) marks its
    // device down.
    // Nor declared lost: not without the confirmation, and not while it is up.
    let unconfirmed = c.cli(&["device", "lost", &db.to_string()]);
    let err = String::from_utf8_lossy(&unconfirmed.stderr);
    assert!(
        !unconfirmed.status.success() && err.contains("--yes-i-really-mean-it"),
        "{err}"
    );
    let up = c.cli(&["device", "lost", &db.to_string(), "--yes-i-really-mean-it"]);
    let err = String::from_utf8_lossy(&up.stderr);
    assert!(!up.status.success() && err.contains("is up"), "{err}");
    drop(b);
    wait_until("b's device down", Duration::from_secs(60), || !c.is_up(db));
    for &i in &on_b[..2] {
        let started = Instant::now();
        let got = nbd.read(i * OBJECT as u64, OBJECT as u32).unwrap();
        assert_eq!(
            got.as_ref().err(),
            Some(&5),
            "object {i} on the dead node must fail with EIO, not return data ({})",
            match &got {
                Ok(d) if d.iter().all(|b| *b == 0) => "zeros".to_string(),
                Ok(_) => "bytes".to_string(),
                Err(e) => format!("error {e}"),
            }
        );
        assert!(
            started.elapsed() >= IO_TIMEOUT / 2,
            "failed before the I/O timeout"
        );
    }
    let pgs = c.json(&["pg", "list", "--problems"]);
    let unavailable = pgs
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["state"] == "unavailable");
    assert_eq!(
        unavailable.count(),
        by_pg.iter().filter(|d| **d == db).count(),
        "every PG of b is unavailable, none was handed to a: {pgs}"
    );
    let e = nbd
        .write(on_b[0] * OBJECT as u64, &pattern(on_b[0], 9), 0)
        .unwrap();
    assert_eq!(e, 5, "a write to the dead node's data fails");
    for &i in &on_a {
        let got = nbd.read(i * OBJECT as u64, OBJECT as u32).unwrap();
        assert!(
            got == Ok(pattern(i, 1)),
            "object {i} on the live node\n{}",
            log_of(tmp.path())
        );
        let e = nbd.write(i * OBJECT as u64, &pattern(i, 2), 0).unwrap();
        assert_eq!(
            e, 0,
            "write of object {i} on the live node during the outage"
        );
    }

    // b comes back: everything reads back, b's objects as before the outage, a's as written
    // during it.
    b = c.node("b");
    wait_until("b's device up", Duration::from_secs(60), || c.is_up(db));
    for i in 0..OBJECTS {
        let want = if on_b.contains(&i) { 1 } else { 2 };
        let got = nbd.read(i * OBJECT as u64, OBJECT as u32).unwrap();
        assert!(
            got == Ok(pattern(i, want)),
            "object {i} after the restart (generation {want} expected)\n{}",
            log_of(tmp.path())
        );
    }

    // The operator drains b's node: its PGs are copied to a (backfill) while b still serves
    // them, then move; the drain reports when nothing is left on b. With b stopped, a serves
    // every object, b's included, at its latest generation.
    let node_b = c
        .json(&["device", "list"])
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["id"].as_u64() == Some(db))
        .and_then(|d| d["node"].as_u64())
        .expect("b's device in the device list");
    let out = Command::new(BASALT)
        .args(["node", "drain", &node_b.to_string(), "--timeout", "120s"])
        .args(["--etcd", &c.endpoint])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("may be stopped"),
        "drain: {said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pgs = c.json(&["pg", "list"]);
    for pg in pgs.as_array().unwrap() {
        let names_b = |set: &str| {
            pg[set]
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d.as_u64() == Some(db))
        };
        assert!(
            !names_b("up") && !names_b("acting") && pg["acting"][0].as_u64() == Some(da),
            "a PG still on b after the drain: {pg}"
        );
        // Its primary's node answered for it: nothing unfound.
        assert_eq!(pg["unfound_objects"].as_u64(), Some(0), "{pg}");
    }
    // While b runs it may not be removed.
    let refused = c.cli(&["node", "remove", &node_b.to_string()]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("it is running"),
        "{err}"
    );
    drop(b);
    wait_until("b's device down", Duration::from_secs(60), || !c.is_up(db));
    // Down (and drained): it may be declared lost; it then stays down and out, and nothing
    // waited for it (every PG is on a).
    let lost = c.json(&["device", "lost", &db.to_string(), "--yes-i-really-mean-it"]);
    assert_eq!(lost["lost"], true, "{lost}");
    let again = c.cli(&["device", "in", &db.to_string()]);
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && err.contains("declared lost"),
        "{err}"
    );
    for i in 0..OBJECTS {
        let want = if on_b.contains(&i) { 1 } else { 2 };
        let got = nbd.read(i * OBJECT as u64, OBJECT as u32).unwrap();
        assert!(
            got == Ok(pattern(i, want)),
            "object {i} after b was drained and stopped\n{}",
            log_of(tmp.path())
        );
    }

    // The operator removes b's node for good: its device leaves the device list and the
    // status (health no longer warns of a node down), and a, the only node, keeps serving.
    let node_arg = node_b.to_string();
    wait_until("b removed", Duration::from_secs(60), || {
        c.cli(&["node", "remove", &node_arg]).status.success()
    });
    assert!(c.devices().iter().all(|d| d.0 != db), "{:?}", c.devices());
    wait_until("the status without b", Duration::from_secs(60), || {
        let s = c.json(&["status"]);
        let ids: Vec<u64> = s["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["id"].as_u64().unwrap())
            .collect();
        !ids.contains(&node_b) && s["health"]["status"] == "ok"
    });
    let again = c.cli(&["node", "remove", &node_arg]);
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && err.contains("removed already"),
        "{err}"
    );
    // b's host comes back with its old data: it is refused, says why, and registers nothing.
    let mut back = c.node("b");
    let exit = wait_exit(&mut back.0, Duration::from_secs(60));
    let log = std::fs::read_to_string(tmp.path().join("node-b.log")).unwrap();
    assert!(
        !exit.success() && log.contains("was removed from the cluster"),
        "{exit}: {log}"
    );
    assert!(c.devices().iter().all(|d| d.0 != db), "{:?}", c.devices());
    for i in 0..OBJECTS {
        let want = if on_b.contains(&i) { 1 } else { 2 };
        let got = nbd.read(i * OBJECT as u64, OBJECT as u32).unwrap();
        assert!(got == Ok(pattern(i, want)), "object {i} after b's removal");
    }
    nbd.disconnect();
    drop(etcd);
}
