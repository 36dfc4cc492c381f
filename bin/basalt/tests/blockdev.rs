//! A store on a real block device (a loop device over a file, with direct I/O): formatted on first
//! start, verified data across a restart. Needs root and losetup (scripts/setup.sh installs it).

mod common;

use common::host::Loop;
use common::{Up, UpOptions, tool_ok};
use std::time::Duration;

#[test]
fn a_block_device_is_formatted_and_keeps_data_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("disk.img");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(384 << 20)
        .unwrap();
    let dev = Loop::attach(&backing);
    let opts = UpOptions {
        volume_size: "128MiB",
        extra: vec!["--device".into(), dev.0.clone()],
        ..UpOptions::default()
    };
    let up = Up::start(dir.path(), &opts);
    let st = up.cli_json(&["status"]);
    let capacity = st["nodes"][0]["status"]["devices"][0]["capacity_bytes"]
        .as_u64()
        .unwrap();
    assert!(
        capacity > 256 << 20 && capacity < 384 << 20,
        "capacity {capacity} does not come from the 384 MiB block device"
    );
    let uri = format!("--uri={}", up.uri("vol0"));
    let args = [
        "--name=b",
        "--ioengine=nbd",
        &uri,
        "--rw=randwrite",
        "--bssplit=4k/50:128k/50",
        "--iodepth=8",
        "--size=64m",
        "--verify=crc32c",
        "--randseed=5",
    ];
    let mut write = args.to_vec();
    write.push("--do_verify=0");
    tool_ok("fio", &write, Duration::from_secs(300));
    up.stop();
    let up = Up::start(dir.path(), &opts);
    let uri = format!("--uri={}", up.uri("vol0"));
    let mut check = args.to_vec();
    check[2] = &uri;
    check.push("--verify_only");
    tool_ok("fio", &check, Duration::from_secs(300));
    up.stop();
}
