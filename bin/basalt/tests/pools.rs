//! The pool, device and pg commands against a running `basalt up`: settings, bad input answered
//! with a clear error that changes nothing, and a device marked out that keeps serving the data
//! it holds.

mod common;

use common::nbd::NbdClient;
use common::{Up, UpOptions, wait_until};
use std::time::Duration;

fn fails_with(up: &Up, args: &[&str], needle: &str) {
    let out = up.cli(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "basalt {args:?} succeeded");
    assert!(
        err.contains(needle),
        "basalt {args:?}: expected {needle:?} in:\n{err}"
    );
}

#[test]
fn pool_device_and_pg_commands() {
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start(dir.path(), &UpOptions::default());

    // Pools.
    fails_with(
        &up,
        &["pool", "create", "big", "--object-size", "1MiB"],
        "no device can hold pool big",
    );
    fails_with(
        &up,
        &["pool", "create", "wide", "--replicas", "6"],
        "6 is not in 1..=5",
    );
    // Without --replicas: 3 copies, or one per host when fewer hosts can hold the pool.
    let one = up.cli_json(&["pool", "create", "one", "--pgs", "8"]);
    assert_eq!(
        (&one["replicas"], &one["min_size"]),
        (&1.into(), &1.into()),
        "{one}"
    );
    up.cli_json(&["pool", "delete", "one"]);
    let r3 = up.cli_json(&["pool", "create", "r3", "--replicas", "3", "--pgs", "8"]);
    assert_eq!(r3["min_size"], 2, "{r3}");
    fails_with(
        &up,
        &["pool", "set", "r3", "--min-size", "4"],
        "use 1 to replicas (3)",
    );
    assert_eq!(
        up.cli_json(&["pool", "set", "r3", "--min-size", "3"])["min_size"],
        3
    );
    fails_with(
        &up,
        &["pool", "delete", "default"],
        "still holds volumes (vol0)",
    );
    up.cli_json(&["pool", "delete", "r3"]);
    let names: Vec<String> = up
        .cli_json(&["pool", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["default"]);
    let info = up.cli_json(&["pool", "info", "default"]);
    assert_eq!(info["unavailable_pgs"], 0, "{info}");
    assert_eq!(info["devices"], 1, "{info}");

    // Devices and placement groups.
    fails_with(&up, &["device", "out", "99"], "no device dev.99");
    fails_with(&up, &["device", "out", "x1"], "is not a device id");
    fails_with(
        &up,
        &["pg", "mark-lost", "default", "0"],
        "--yes-i-really-mean-it",
    );
    fails_with(
        &up,
        &["pg", "mark-unfound-lost", "default", "3"],
        "--yes-i-really-mean-it",
    );
    fails_with(
        &up,
        &[
            "pg",
            "mark-unfound-lost",
            "default",
            "64",
            "--yes-i-really-mean-it",
        ],
        "has no PG 64",
    );
    let out = up.cli(&[
        "pg",
        "mark-unfound-lost",
        "default",
        "3",
        "--yes-i-really-mean-it",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("has no unfound objects"),
        "{out:?}"
    );
    let devs = up.cli_json(&["device", "list"]);
    let dev = &devs[0];
    assert_eq!(dev["up"], true, "{devs}");
    assert_eq!(dev["acting_pgs"], 64, "{devs}");
    let id = dev["id"].as_u64().unwrap().to_string();
    assert_eq!(up.cli_json(&["device", "reweight", &id, "5"])["weight"], 5);
    assert_eq!(
        up.cli_json(&["pg", "list", "--problems"])
            .as_array()
            .unwrap()
            .len(),
        0
    );

    // Out, with nowhere else to go: refused, saying why, unless forced; forced, placement has
    // no device for the PGs, but the device still holds their data and keeps serving them.
    let mut c = NbdClient::connect(&up.nbd, "vol0").unwrap();
    assert_eq!(c.write(0, &[0x5A; 4096], 1).unwrap(), 0);
    fails_with(
        &up,
        &["device", "out", &id],
        "64 placement groups could not get all their copies",
    );
    assert_eq!(
        up.cli_json(&["device", "list"])[0]["out"],
        serde_json::Value::Null
    );
    up.cli_json(&["device", "out", &id, "--force"]);
    wait_until("the PGs remapped", Duration::from_secs(30), || {
        up.cli_json(&["pg", "list", "--problems"])
            .as_array()
            .unwrap()
            .len()
            == 64
    });
    let pgs = up.cli_json(&["pg", "list"]);
    assert_eq!(pgs[0]["state"], "active+remapped", "{}", pgs[0]);
    assert_eq!(pgs[0]["up"].as_array().unwrap().len(), 0);
    assert_eq!(c.read(0, 4096).unwrap(), Ok(vec![0x5A; 4096]));
    assert_eq!(c.write(4096, &[0x6B; 4096], 1).unwrap(), 0);
    fails_with(
        &up,
        &["pg", "mark-lost", "default", "0", "--yes-i-really-mean-it"],
        "no device to serve it",
    );
    up.cli_json(&["device", "in", &id]);
    wait_until("the PGs back in place", Duration::from_secs(30), || {
        up.cli_json(&["pg", "list", "--problems"])
            .as_array()
            .unwrap()
            .is_empty()
    });
    assert_eq!(c.read(4096, 4096).unwrap(), Ok(vec![0x6B; 4096]));
    c.disconnect();
    up.stop();
}

/// `basalt up --nodes 2 --replicas 1` on 64 MiB devices, its default volume `volume_size`.
fn two_small_nodes(dir: &std::path::Path, volume_size: &'static str) -> Up {
    Up::start(
        dir,
        &UpOptions {
            device_size: "64MiB",
            volume_size,
            extra: ["--nodes", "2", "--replicas", "1"]
                .map(String::from)
                .to_vec(),
        },
    )
}

/// Fills volume `name` with `byte` up to 1.1x a device's capacity: more than both devices
/// hold below the backfill-full limit (90%) together. Returns the client and the status read
/// before.
fn fill_past_a_device(up: &Up, name: &str, byte: u8) -> (NbdClient, serde_json::Value) {
    let status = up.cli_json(&["status"]);
    let capacity = status["nodes"][0]["status"]["devices"][0]["capacity_bytes"]
        .as_u64()
        .unwrap();
    let mut c = NbdClient::connect(&up.nbd, name).unwrap();
    let chunk = vec![byte; 1 << 20];
    for off in (0..capacity * 11 / 10).step_by(1 << 20) {
        assert_eq!(c.write(off, &chunk, 0).unwrap(), 0, "write at {off}");
    }
    (c, status)
}

/// Drains the second node of `status`: refused for too little room, nothing marked out.
/// Returns the node's id. (Without the check the drain would wait for good: bounded here so
/// that it fails.)
fn drain_refused_for_room(up: &Up, status: &serde_json::Value) -> String {
    let node = status["nodes"][1]["id"].as_u64().unwrap().to_string();
    fails_with(
        up,
        &["node", "drain", &node, "--timeout", "20s"],
        "too little room",
    );
    let devices = up.cli_json(&["device", "list"]);
    for d in devices.as_array().unwrap() {
        assert!(d["out"].is_null(), "marked out: {d}");
    }
    node
}

/// `basalt node drain` refuses to move more data than the other devices have room for below
/// the backfill-full limit (its placement groups would stop at full devices), saying how
/// much; nothing is marked out. Forced, it goes ahead.
#[test]
fn a_drain_the_other_devices_have_no_room_for_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let up = two_small_nodes(dir.path(), "128MiB");
    // Neither device's data fits in the other's room, whichever way it is spread.
    let (mut c, status) = fill_past_a_device(&up, "vol0", 0x5A);
    let node = drain_refused_for_room(&up, &status);
    // Forced: its devices are out (the moves stop at the backfill-full limit).
    up.cli_json(&["node", "drain", &node, "--force", "--no-wait"]);
    let devices = up.cli_json(&["device", "list"]);
    let out = devices
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["out"] == "operator");
    assert_eq!(out.count(), 1, "{devices}");
    assert_eq!(c.read(0, 4096).unwrap(), Ok(vec![0x5A; 4096]));
    c.disconnect();
    up.stop();
}

/// The room check counts only the devices the data would move to: a pool of one device class
/// drained off one of its two devices is refused when the other has too little room, although
/// a device of another class, which the pool does not use, has plenty (before, the room of
/// every device was summed, and the drain was accepted and then never finished).
#[test]
fn a_drain_counts_only_the_room_of_the_devices_its_data_would_move_to() {
    let dir = tempfile::tempdir().unwrap();
    let up = two_small_nodes(dir.path(), "16MiB");
    up.cli_json(&[
        "pool",
        "create",
        "fast",
        "--replicas",
        "1",
        "--device-class",
        "ssd",
        "--pgs",
        "16",
    ]);
    up.cli_json(&[
        "volume", "create", "v", "--size", "128MiB", "--pool", "fast",
    ]);
    let (mut c, status) = fill_past_a_device(&up, "v", 0x3C);
    // A third node with a large device of another class.
    let data = dir.path().join("node3");
    std::fs::create_dir_all(&data).unwrap();
    let big = format!("{}:1GiB:hdd", data.join("big.img").display());
    let log = std::fs::File::create(data.join("node.log")).unwrap();
    let _node3 = common::Proc(
        std::process::Command::new(common::BASALT)
            .args(["node", "--join"])
            .arg(&up.dir)
            .arg("--data")
            .arg(&data)
            .args(["--device", &big])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    wait_until("the hdd device up", Duration::from_secs(60), || {
        let devices = up.cli_json(&["device", "list"]);
        devices
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["class"] == "hdd" && d["up"] == true)
    });
    drain_refused_for_room(&up, &status);
    assert_eq!(c.read(0, 4096).unwrap(), Ok(vec![0x3C; 4096]));
    c.disconnect();
    up.stop();
}

/// A node of a local `basalt up --nodes` cluster drained, killed and removed: `basalt status`
/// no longer lists it (the cluster file still names it) and health is back to ok.
#[test]
fn a_removed_node_of_a_local_cluster_leaves_the_status() {
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start(
        dir.path(),
        &UpOptions {
            device_size: "256MiB",
            volume_size: "64MiB",
            extra: ["--nodes", "2", "--replicas", "1"]
                .map(String::from)
                .to_vec(),
        },
    );
    let mut c = NbdClient::connect(&up.nbd, "vol0").unwrap();
    for i in 0..16u64 {
        assert_eq!(c.write(i << 20, &[i as u8; 4096], 0).unwrap(), 0);
    }
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(up.dir.join("cluster.json")).unwrap()).unwrap();
    let victim = &file["nodes"][1];
    let id = victim["id"].as_u64().unwrap();
    let out = up.cli(&["node", "drain", &id.to_string(), "--timeout", "60s"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("may be stopped"),
        "{said}"
    );
    let pid = victim["pid"].as_u64().unwrap() as i32;
    // SAFETY: kill(2) on a child process of the `up` this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let listed = |s: &serde_json::Value| -> Vec<u64> {
        let nodes = s["nodes"].as_array().unwrap();
        nodes.iter().map(|n| n["id"].as_u64().unwrap()).collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let out = up.cli(&["node", "remove", &id.to_string()]);
        if out.status.success() {
            break;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(std::time::Instant::now() < deadline, "not removed: {err}");
        std::thread::sleep(Duration::from_millis(200));
    }
    wait_until("the status without it", Duration::from_secs(60), || {
        let s = up.cli_json(&["status"]);
        !listed(&s).contains(&id) && s["health"]["status"] == "ok"
    });
    for i in 0..16u64 {
        assert_eq!(c.read(i << 20, 4096).unwrap(), Ok(vec![i as u8; 4096]));
    }
    c.disconnect();
    up.stop();
}
