//! The volume CLI against a running `basalt up`: every command with `--json`, and every kind of
//! bad input answered with a clear error that changes nothing.

mod common;

use common::nbd::NbdClient;
use common::{BASALT, Up, UpOptions};
use std::process::Command;

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
fn volume_lifecycle_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start(dir.path(), &UpOptions::default());

    let v = up.cli_json(&["volume", "create", "db-1", "--size", "8GiB"]);
    assert_eq!(v["name"], "db-1");
    assert_eq!(v["size"], 8u64 << 30);
    assert_eq!(v["pool"], "default");
    let info = up.cli_json(&["volume", "info", "db-1"]);
    assert_eq!(info["size"], 8u64 << 30);
    let names: Vec<String> = up
        .cli_json(&["volume", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["db-1", "vol0"]);

    // Bad input: each refused with a message that says what to do; nothing is created.
    fails_with(
        &up,
        &["volume", "create", "bad name", "--size", "1GiB"],
        "use only letters, digits",
    );
    fails_with(
        &up,
        &["volume", "create", ".lead", "--size", "1GiB"],
        "must start with a letter or a digit",
    );
    fails_with(
        &up,
        &["volume", "create", "zero", "--size", "0"],
        "above zero",
    );
    fails_with(
        &up,
        &["volume", "create", "odd", "--size", "1000"],
        "multiple of 4096",
    );
    fails_with(&up, &["volume", "create", "huge", "--size", "2PiB"], "huge");
    fails_with(
        &up,
        &["volume", "create", "junk", "--size", "12XB"],
        "unknown unit",
    );
    fails_with(
        &up,
        &["volume", "create", "db-1", "--size", "1GiB"],
        "already exists",
    );
    fails_with(
        &up,
        &["volume", "create", "p", "--size", "1GiB", "--pool", "nope"],
        "no pool 'nope'",
    );
    fails_with(&up, &["volume", "info", "missing"], "does not exist");
    fails_with(&up, &["volume", "delete", "missing"], "missing");
    fails_with(
        &up,
        &["volume", "resize", "db-1", "--size", "1GiB"],
        "--allow-shrink",
    );
    assert_eq!(
        up.cli_json(&["volume", "list"]).as_array().unwrap().len(),
        2
    );
    assert_eq!(up.cli_json(&["volume", "info", "db-1"])["size"], 8u64 << 30);

    let v = up.cli_json(&["volume", "resize", "db-1", "--size", "16GiB"]);
    assert_eq!(v["size"], 16u64 << 30);
    let d = up.cli_json(&["volume", "delete", "db-1"]);
    assert_eq!(d["deleted"], "db-1");
    fails_with(&up, &["volume", "info", "db-1"], "does not exist");

    let st = up.cli_json(&["status"]);
    assert!(st["epoch"].as_u64().unwrap() >= 1, "{st}");
    assert_eq!(st["nodes"].as_array().unwrap().len(), 1, "{st}");
    assert_eq!(st["volumes"], 1);
    up.stop();
}

#[test]
fn shrink_discards_data_and_delete_frees_space() {
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start(dir.path(), &UpOptions::default());
    up.cli_json(&["volume", "create", "s", "--size", "4MiB"]);
    let mut c = NbdClient::connect(&up.nbd, "s").unwrap();
    let ones = vec![0xAAu8; 4 << 20];
    assert_eq!(c.write(0, &ones, 1).unwrap(), 0);
    c.disconnect();
    let used = |up: &Up| {
        up.cli_json(&["status"])["nodes"][0]["status"]["devices"][0]["used_bytes"]
            .as_u64()
            .unwrap()
    };
    let before = used(&up);
    assert!(before >= 4 << 20, "4 MiB written but {before} bytes used");

    // Shrink to 1 MiB + 512 bytes (mid-object), grow back: the cut range reads as zeros.
    up.cli_json(&[
        "volume",
        "resize",
        "s",
        "--size",
        &((1 << 20) + 4096).to_string(),
        "--allow-shrink",
    ]);
    up.cli_json(&["volume", "resize", "s", "--size", "4MiB"]);
    let mut c = NbdClient::connect(&up.nbd, "s").unwrap();
    let data = c.read(0, 4 << 20).unwrap().unwrap();
    let keep = (1 << 20) + 4096;
    assert!(
        data[..keep].iter().all(|&b| b == 0xAA),
        "data before the cut changed"
    );
    assert!(
        data[keep..].iter().all(|&b| b == 0),
        "old data reappeared after shrink and grow"
    );
    c.disconnect();

    up.cli_json(&["volume", "delete", "s"]);
    let after = used(&up);
    assert!(
        after + (1 << 20) <= before,
        "delete freed nothing: {before} -> {after}"
    );
    let list = common::tool_ok(
        "nbdinfo",
        &["--list", "--json", &format!("nbd://{}", up.nbd)],
        std::time::Duration::from_secs(60),
    );
    assert!(
        !list.contains("\"s\""),
        "deleted volume still exported: {list}"
    );
    up.stop();
}

#[test]
fn commands_without_a_cluster_say_how_to_start_one() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BASALT)
        .args(["volume", "list"])
        .env("BASALT_DATA", dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("basalt up"), "{err}");
}

#[test]
fn a_second_up_on_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start(dir.path(), &UpOptions::default());
    let out = Command::new(BASALT)
        .args([
            "up",
            "--nbd",
            "127.0.0.1:0",
            "--listen",
            "127.0.0.1:0",
            "--data",
        ])
        .arg(&up.dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another basalt process"), "{err}");
    // The first one still serves.
    let mut c = NbdClient::connect(&up.nbd, "vol0").unwrap();
    assert!(c.read(0, 4096).unwrap().is_ok());
    c.disconnect();
    up.stop();
}

/// `basalt config`: set, read back (also as the nodes apply it, in `status`), unset; bad values
/// are refused and change nothing. `basalt node --join` names why it cannot join.
#[test]
fn config_sets_the_recovery_throttle_and_refuses_bad_values() {
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start(dir.path(), &UpOptions::default());
    let got = up.cli_json(&["config", "get"]);
    assert_eq!(got["recovery_rate"], serde_json::Value::Null, "{got}");
    up.cli_json(&["config", "set", "recovery-rate", "64MiB"]);
    up.cli_json(&["config", "set", "backfill-full", "80%"]);
    let got = up.cli_json(&["config", "set", "recovery-share", "30%"]);
    assert_eq!(got["recovery_rate"], 64 << 20, "{got}");
    assert_eq!(got["recovery_share"], 30, "{got}");
    assert_eq!(got["backfill_full"], 80, "{got}");
    common::wait_until(
        "the node to apply the throttle",
        std::time::Duration::from_secs(30),
        || {
            let s = up.cli_json(&["status"]);
            let limits = &s["nodes"][0]["status"]["recovery"]["limits"];
            limits["bytes_per_sec"] == 64 << 20
                && limits["share_percent"] == 30
                && limits["backfill_full_percent"] == 80
        },
    );
    fails_with(
        &up,
        &["config", "set", "backfill-full", "101%"],
        "1% to 100%",
    );
    fails_with(
        &up,
        &["config", "set", "recovery-share", "0%"],
        "1% to 100%",
    );
    fails_with(
        &up,
        &["config", "set", "recovery-rate", "fast"],
        "bad recovery-rate",
    );
    assert_eq!(up.cli_json(&["config", "get"]), got);
    let got = up.cli_json(&["config", "unset", "recovery-rate"]);
    assert_eq!(got["recovery_rate"], serde_json::Value::Null, "{got}");
    assert_eq!(got["recovery_share"], 30, "{got}");
    // Maintenance: `noout` on is a health warning until it is unset.
    let noout = |s: &serde_json::Value| {
        s["health"]["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["check"] == "noout")
    };
    assert!(!noout(&up.cli_json(&["status"])));
    let got = up.cli_json(&["config", "set", "noout", "on"]);
    assert_eq!(got["noout"], true, "{got}");
    assert!(noout(&up.cli_json(&["status"])));
    fails_with(&up, &["config", "set", "noout", "maybe"], "on or off");
    let got = up.cli_json(&["config", "unset", "noout"]);
    assert_eq!(got["noout"], false, "{got}");
    assert!(!noout(&up.cli_json(&["status"])));

    let data = up.dir.display().to_string();
    let out = Command::new(BASALT)
        .args(["node", "--join", &data])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("embedded store"),
        "{err}"
    );
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(BASALT)
        .args(["node", "--join"])
        .arg(empty.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no running `basalt up`"),
        "{err}"
    );
    up.stop();
}
