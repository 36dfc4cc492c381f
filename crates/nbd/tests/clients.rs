//! Real NBD clients against the in-process server: nbdinfo, nbdsh, qemu-img, nbdcopy, fio.

mod common;

use basalt_nbd::{MemCatalog, MemExport, ServerConfig};
use common::*;
use rand::{RngCore, SeedableRng, rngs::StdRng};
use serde_json::Value;
use std::io::Read as _;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const TOOL_LIMIT: Duration = Duration::from_secs(120);

fn server() -> TestServer {
    let c = MemCatalog::new().with_default("vol");
    c.add(
        "vol",
        MemExport::new(64 * MIB).with_description("main volume"),
    );
    c.add("small", MemExport::new(3 * MIB + 4096));
    c.add("ro", MemExport::new(MIB).with_read_only(true));
    TestServer::start(c, ServerConfig::default())
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("bad JSON ({e}): {text}"))
}

#[test]
fn nbdinfo_lists_every_export_and_shows_the_advertised_flags() {
    let s = server();
    let uri = format!("nbd://{}", s.addr);
    let list = json(&run_ok("nbdinfo", &["--list", "--json", &uri], TOOL_LIMIT));
    let mut exports: Vec<(String, u64)> = list["exports"]
        .as_array()
        .expect("exports")
        .iter()
        .map(|e| {
            let name = e["export-name"].as_str().unwrap().to_owned();
            (name, e["export-size"].as_u64().unwrap())
        })
        .collect();
    exports.sort();
    assert_eq!(
        exports,
        [
            ("ro".to_owned(), MIB),
            ("small".to_owned(), 3 * MIB + 4096),
            ("vol".to_owned(), 64 * MIB)
        ]
    );

    let info = json(&run_ok("nbdinfo", &["--json", &s.uri("vol")], TOOL_LIMIT));
    assert_eq!(info["protocol"], "newstyle-fixed");
    let vol = &info["exports"][0];
    assert_eq!(vol["export-size"], 64 * MIB);
    assert_eq!(vol["description"], "main volume");
    for (flag, want) in [
        ("is_read_only", false),
        ("can_flush", true),
        ("can_fua", true),
        ("can_trim", true),
        ("can_zero", true),
        ("can_multi_conn", true),
        ("can_df", false),
        ("can_cache", false),
        ("can_fast_zero", false),
    ] {
        assert_eq!(vol[flag], want, "{flag} in {vol}");
    }
    assert_eq!(vol["block_size_minimum"], 1);
    assert_eq!(vol["block_size_preferred"], 4096);
    assert_eq!(vol["block_size_maximum"], 32 * MIB);

    let ro = json(&run_ok("nbdinfo", &["--json", &s.uri("ro")], TOOL_LIMIT));
    let ro = &ro["exports"][0];
    for (flag, want) in [
        ("is_read_only", true),
        ("can_trim", false),
        ("can_zero", false),
        ("can_fua", false),
    ] {
        assert_eq!(ro[flag], want, "{flag} in {ro}");
    }

    let missing = run_tool("nbdinfo", &[&s.uri("missing")], TOOL_LIMIT);
    assert!(!missing.status.success(), "an unknown export fails");
}

#[test]
fn qemu_img_and_nbdcopy_round_trips_are_byte_identical() {
    let s = server();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.raw");
    let mut data = vec![0u8; (3 * MIB + 4096) as usize];
    StdRng::seed_from_u64(7).fill_bytes(&mut data);
    // Some zero runs, so converters take their zero/trim paths.
    data[MIB as usize..(MIB + 256 * 1024) as usize].fill(0);
    std::fs::write(&src, &data).unwrap();
    let uri = s.uri("small");

    let src_s = src.to_str().unwrap();
    run_ok(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", src_s, &uri],
        TOOL_LIMIT,
    );
    assert!(s.catalog.get("small").unwrap().snapshot(0, data.len()) == data);
    let back = dir.path().join("back.raw");
    let back_s = back.to_str().unwrap();
    run_ok(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", &uri, back_s],
        TOOL_LIMIT,
    );
    assert!(std::fs::read(&back).unwrap() == data, "qemu-img round trip");

    // nbdcopy: several connections and many requests in flight.
    s.catalog.add("small", MemExport::new(3 * MIB + 4096));
    run_ok("nbdcopy", &["--connections=4", src_s, &uri], TOOL_LIMIT);
    let back2 = dir.path().join("back2.raw");
    let back2_s = back2.to_str().unwrap();
    run_ok("nbdcopy", &[&uri, back2_s], TOOL_LIMIT);
    let mut got = Vec::new();
    std::fs::File::open(&back2)
        .unwrap()
        .read_to_end(&mut got)
        .unwrap();
    assert!(got == data, "nbdcopy round trip");
}

#[test]
fn fio_verifies_random_and_sequential_writes_of_mixed_sizes() {
    let s = server();
    let uri = s.uri("vol");
    // Two jobs, each on its own connection and its own 24 MiB region: random writes and
    // sequential writes with 4 KiB..1 MiB blocks, then fio reads everything back and checks
    // every block's CRC-32C.
    let out = run_ok(
        "fio",
        &[
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--size=24m",
            "--iodepth=32",
            "--bssplit=4k/40:16k/20:64k/20:256k/10:1m/10",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--output-format=json",
            "--name=random",
            "--rw=randwrite",
            "--offset=0",
            "--name=sequential",
            "--rw=write",
            "--offset=32m",
        ],
        TOOL_LIMIT,
    );
    let report = json(&out[out.find('{').expect("fio JSON")..]);
    for job in report["jobs"].as_array().expect("jobs") {
        assert_eq!(job["error"], 0, "{job}");
        let written = job["write"]["io_bytes"].as_u64().unwrap();
        let verified = job["read"]["io_bytes"].as_u64().unwrap();
        assert_eq!(written, 24 * MIB, "job {} wrote its region", job["jobname"]);
        assert!(
            verified >= written,
            "job {} read back what it wrote",
            job["jobname"]
        );
    }
    assert_eq!(
        s.catalog.get("vol").unwrap().allocated_chunks(),
        2 * 24 * 16
    );
}

#[test]
fn nbdsh_out_of_range_gets_einval_and_the_connection_stays_usable() {
    let s = server();
    // A garbage client at the same time does not disturb the real one.
    let (mut bad, _, _) = RawClient::go(s.addr, "vol");
    bad.send(&[0xFF; 100]);
    let script = "
h.set_strict_mode(0)
for call in (lambda: h.pread(4096, h.get_size() - 100),
             lambda: h.pwrite(b'x' * 512, h.get_size()),
             lambda: h.pread(512, 2**64 - 256)):
    try:
        call()
        print('no error')
    except nbd.Error as e:
        print(e.errno)
h.pwrite(b'still usable', 4096)
print(h.pread(12, 4096).decode())
";
    let out = run_ok(
        "env",
        &[
            "PATH=/usr/bin:/bin",
            "nbdsh",
            "-u",
            &s.uri("vol"),
            "-c",
            script,
        ],
        TOOL_LIMIT,
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        ["EINVAL", "EINVAL", "EINVAL", "still usable"],
        "{out}"
    );
    assert!(bad.closed());
}
