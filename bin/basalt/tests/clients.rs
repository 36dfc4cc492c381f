//! Real NBD clients against `basalt up`: nbdinfo, fio with verification, qemu-img, several
//! connections at once, and restart persistence.

mod common;

use common::nbd::NbdClient;
use common::{Up, UpOptions, tool_ok};
use std::time::Duration;

const MIN: Duration = Duration::from_secs(60);
const LONG: Duration = Duration::from_secs(300);

#[test]
fn nbdinfo_lists_every_volume_with_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start(dir.path(), &UpOptions::default());
    up.cli_json(&["volume", "create", "second", "--size", "96MiB"]);
    let out = tool_ok(
        "nbdinfo",
        &["--list", "--json", &format!("nbd://{}", up.nbd)],
        MIN,
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut exports: Vec<(String, u64)> = v["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["export-name"].as_str().unwrap().to_string(),
                e["export-size"].as_u64().unwrap(),
            )
        })
        .collect();
    exports.sort();
    assert_eq!(
        exports,
        vec![
            ("second".to_string(), 96 << 20),
            ("vol0".to_string(), 256 << 20)
        ]
    );
    let info = tool_ok("nbdinfo", &["--json", &up.uri("vol0")], MIN);
    let v: serde_json::Value = serde_json::from_str(&info).unwrap();
    let e = &v["exports"][0];
    for flag in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_multi_conn",
    ] {
        assert_eq!(e[flag], true, "{flag} not advertised: {e}");
    }
    up.stop();
}

/// Runs fio against `uri` and returns its JSON report.
fn fio(uri: &str, extra: &[&str]) -> String {
    let out = tempfile::NamedTempFile::new().unwrap();
    let uri_arg = format!("--uri={uri}");
    let out_arg = format!("--output={}", out.path().display());
    let mut args = vec![
        "--name=verify",
        "--ioengine=nbd",
        "--output-format=json",
        &uri_arg,
        &out_arg,
    ];
    args.extend_from_slice(extra);
    tool_ok("fio", &args, LONG);
    let text = std::fs::read_to_string(out.path()).unwrap();
    // fio writes notices ("Any use of blockalign= turns off randommap") into the file too.
    text[text.find('{').unwrap_or(0)..].to_string()
}

fn fio_errors(json: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(json).expect("fio JSON");
    v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["error"].as_u64().unwrap())
        .sum()
}

#[test]
fn fio_verifies_random_and_sequential_mixed_block_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start(dir.path(), &UpOptions::default());
    let uri = up.uri("vol0");
    for rw in ["randwrite", "write"] {
        let out = fio(
            &uri,
            &[
                &format!("--rw={rw}"),
                "--bssplit=4k/40:8k/10:64k/20:128k/15:1m/15",
                "--iodepth=16",
                "--size=128m",
                "--verify=crc32c",
                "--verify_fatal=1",
            ],
        );
        assert_eq!(fio_errors(&out), 0, "{rw}: {out}");
    }
    // Unaligned I/O (512-byte granularity) with verification.
    let out = fio(
        &uri,
        &[
            "--rw=randwrite",
            "--bs=1536",
            "--ba=512",
            "--iodepth=8",
            "--size=8m",
            "--verify=md5",
        ],
    );
    assert_eq!(fio_errors(&out), 0, "unaligned: {out}");
    up.stop();
}

#[test]
fn fio_verify_catches_wrong_data() {
    // The verification used in these tests can fail: after part of the verified pattern is
    // overwritten with zeros, a verify-only pass reports the mismatch.
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start(dir.path(), &UpOptions::default());
    let uri = up.uri("vol0");
    let pattern = [
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=4",
        "--size=4m",
        "--verify=crc32c",
        "--randseed=1",
    ];
    let mut write: Vec<&str> = pattern.to_vec();
    write.push("--do_verify=0");
    fio(&uri, &write);
    let mut check: Vec<&str> = pattern.to_vec();
    check.push("--verify_only");
    assert_eq!(fio_errors(&fio(&uri, &check)), 0);
    fio(
        &uri,
        &[
            "--rw=write",
            "--bs=64k",
            "--size=64k",
            "--offset=1m",
            "--zero_buffers",
        ],
    );
    let uri_arg = format!("--uri={uri}");
    let mut args = vec!["--name=x", "--ioengine=nbd", uri_arg.as_str()];
    args.extend(check.iter().copied());
    let out = common::tool("fio", &args, LONG);
    assert!(!out.status.success(), "verify passed over zeroed data");
    up.stop();
}

#[test]
fn qemu_img_convert_round_trip_is_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start(dir.path(), &UpOptions::default());
    let src = dir.path().join("src.raw");
    let back = dir.path().join("back.raw");
    // 40 MiB of varied content with holes.
    let mut data = vec![0u8; 40 << 20];
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for (i, chunk) in data.chunks_mut(4096).enumerate() {
        if i % 5 == 3 {
            continue;
        }
        for b in chunk.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
    }
    std::fs::write(&src, &data).unwrap();
    up.cli_json(&["volume", "create", "img", "--size", "40MiB"]);
    tool_ok(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            src.to_str().unwrap(),
            &up.uri("img"),
        ],
        LONG,
    );
    tool_ok(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &up.uri("img"),
            back.to_str().unwrap(),
        ],
        LONG,
    );
    assert!(
        std::fs::read(&back).unwrap() == data,
        "round trip through the volume changed the data"
    );
    let cmp = common::tool(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            src.to_str().unwrap(),
            &up.uri("img"),
        ],
        MIN,
    );
    assert!(
        cmp.status.success(),
        "qemu-img compare: {}",
        String::from_utf8_lossy(&cmp.stdout)
    );
    up.stop();
}

#[test]
fn several_connections_see_each_others_writes() {
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start(dir.path(), &UpOptions::default());
    let mut conns: Vec<NbdClient> = (0..4)
        .map(|_| NbdClient::connect(&up.nbd, "vol0").unwrap())
        .collect();
    for round in 0..50u64 {
        let writer = (round % 4) as usize;
        let offset = (round * 12_345) % (200 << 20) / 512 * 512;
        let data: Vec<u8> = (0..8192u64).map(|i| (i * 31 + round * 7) as u8).collect();
        assert_eq!(conns[writer].write(offset, &data, 0).unwrap(), 0);
        // Another connection flushes (CAN_MULTI_CONN: it covers the first one's write) and reads.
        let other = (writer + 1) % 4;
        assert_eq!(conns[other].flush().unwrap(), 0);
        for c in conns.iter_mut() {
            assert!(
                c.read(offset, 8192).unwrap().unwrap() == data,
                "round {round}: a connection read stale data"
            );
        }
    }
    // Concurrent fio jobs on disjoint ranges, one connection each, verified.
    let out = fio(
        &up.uri("vol0"),
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=8",
            "--numjobs=4",
            "--size=16m",
            "--offset_increment=32m",
            "--verify=crc32c",
        ],
    );
    assert_eq!(fio_errors(&out), 0, "{out}");
    for c in conns {
        c.disconnect();
    }
    up.stop();
}

#[test]
fn restart_serves_the_same_data() {
    let dir = tempfile::tempdir().unwrap();
    let opts = UpOptions::default();
    let up = Up::start(dir.path(), &opts);
    let uri = up.uri("vol0");
    let args = [
        "--rw=randwrite",
        "--bssplit=4k/50:64k/30:1m/20",
        "--iodepth=8",
        "--size=64m",
        "--verify=crc32c",
        "--randseed=7",
    ];
    let mut write: Vec<&str> = args.to_vec();
    write.push("--do_verify=0");
    fio(&uri, &write);
    up.stop();
    let up = Up::start(dir.path(), &opts);
    let mut check: Vec<&str> = args.to_vec();
    check.push("--verify_only");
    let out = fio(&up.uri("vol0"), &check);
    assert_eq!(fio_errors(&out), 0, "{out}");
    // The default volume is not created twice.
    let list = up.cli_json(&["volume", "list"]);
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    up.stop();
}

#[test]
fn map_changes_during_io_are_retried_transparently() {
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start(dir.path(), &UpOptions::default());
    let epoch0 = up.cli_json(&["status"])["epoch"].as_u64().unwrap();
    // A separate gateway process: it follows the map through the node (by polling), so it lags
    // behind the node after each change and its requests carry stale epochs for a while.
    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let _gw = common::Proc(
        std::process::Command::new(common::BASALT)
            .args(["nbd", "--cluster", &up.node, "--listen", &listen])
            .env("RUST_LOG", "basalt_client=debug")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("gw.err")).unwrap())
            .spawn()
            .unwrap(),
    );
    common::wait_until("the gateway", Duration::from_secs(30), || {
        std::net::TcpStream::connect(&listen).is_ok()
    });
    let uri = format!("nbd://{listen}/vol0");
    let fio_run = std::thread::spawn(move || {
        fio(
            &uri,
            &[
                "--rw=randrw",
                "--bs=4k",
                "--iodepth=16",
                "--size=64m",
                "--time_based",
                "--runtime=6",
                "--verify=crc32c",
                "--verify_backlog=256",
            ],
        )
    });
    // Each new pool makes the leader publish a new map epoch; requests still carrying the old
    // one are refused by the node (StaleEpoch) and retried by the client.
    for i in 0..4 {
        std::thread::sleep(Duration::from_millis(700));
        up.cli_json(&["pool", "create", &format!("p{i}"), "--pg-count", "8"]);
    }
    let out = fio_run.join().unwrap();
    assert_eq!(fio_errors(&out), 0, "{out}");
    let epoch1 = up.cli_json(&["status"])["epoch"].as_u64().unwrap();
    assert!(
        epoch1 >= epoch0 + 4,
        "the map epoch went from {epoch0} to {epoch1}"
    );
    let log = std::fs::read_to_string(dir.path().join("gw.err")).unwrap();
    assert!(
        log.contains("retrying"),
        "no request was ever retried; the test did not exercise a stale epoch"
    );
    up.stop();
}
