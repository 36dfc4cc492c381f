//! Metadata in a real etcd: `basalt up --etcd` (which starts its own etcd), and a multi-process
//! cluster — `basalt node` and a separate `basalt nbd` gateway reaching the node over TCP — run
//! from the same etcd.

mod common;

use common::{BASALT, Proc, Up, UpOptions, tool_ok, wait_until};
use std::process::{Command, Stdio};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(300);

fn fio_verify(uri: &str, extra: &[&str]) {
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
        "--randseed=3",
    ];
    args.extend_from_slice(extra);
    tool_ok("fio", &args, LONG);
}

#[test]
fn up_with_its_own_etcd_keeps_data_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let opts = UpOptions {
        extra: vec!["--etcd".into()],
        ..UpOptions::default()
    };
    let up = Up::start(dir.path(), &opts);
    // The CLI finds the etcd endpoints through cluster.json.
    up.cli_json(&["volume", "create", "e1", "--size", "64MiB"]);
    fio_verify(&up.uri("e1"), &["--do_verify=0"]);
    up.stop();
    let up = Up::start(dir.path(), &opts);
    fio_verify(&up.uri("e1"), &["--verify_only"]);
    let names: Vec<String> = up
        .cli_json(&["volume", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["e1", "vol0"]);
    up.stop();
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn node_and_gateway_processes_share_an_etcd() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let etcd = rt
        .block_on(basalt_meta::EtcdProcess::start_with(
            basalt_meta::EtcdOptions {
                data_dir: Some(dir.path().join("etcd")),
                ..Default::default()
            },
        ))
        .expect("start etcd");
    let endpoint = etcd.endpoint();
    let cli = |args: &[&str]| {
        let out = Command::new(BASALT)
            .args(args)
            .args(["--etcd", &endpoint])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "basalt {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // A pool must exist before volumes; the node's leader places it once the node registers.
    // Replicated pools are accepted; more than 5 copies are not. With no device registered
    // yet, a pool created without --replicas keeps 3 copies (asserted below).
    let out = Command::new(BASALT)
        .args([
            "pool",
            "create",
            "wide",
            "--replicas",
            "6",
            "--etcd",
            &endpoint,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success(), "6 copies were accepted");
    let triple: serde_json::Value =
        serde_json::from_str(&cli(&["pool", "create", "triple", "--json"])).unwrap();
    assert_eq!(
        (&triple["replicas"], &triple["min_size"]),
        (&serde_json::json!(3), &serde_json::json!(2)),
        "{triple}"
    );
    cli(&["pool", "delete", "triple"]);
    cli(&[
        "pool",
        "create",
        "default",
        "--replicas",
        "1",
        "--pg-count",
        "16",
    ]);
    assert!(cli(&["pool", "list"]).contains("default"));
    let node_log = std::fs::File::create(dir.path().join("node.log")).unwrap();
    let device = format!("{}:512MiB", dir.path().join("dev0.img").display());
    let _node = Proc(
        Command::new(BASALT)
            .args([
                "node",
                "--etcd",
                &endpoint,
                "--listen",
                "127.0.0.1:0",
                "--device",
                &device,
                "--data",
            ])
            .arg(dir.path().join("node"))
            .stdout(Stdio::null())
            .stderr(node_log)
            .spawn()
            .unwrap(),
    );
    wait_until("the node to be placed", Duration::from_secs(60), || {
        let out = Command::new(BASALT)
            .args(["status", "--json", "--etcd", &endpoint])
            .output()
            .unwrap();
        out.status.success()
            && serde_json::from_slice::<serde_json::Value>(&out.stdout).is_ok_and(|v| {
                v["epoch"].as_u64() >= Some(1)
                    && v["nodes"].as_array().is_some_and(|n| n.len() == 1)
            })
    });
    // A pool whose objects no device can hold (the device has 128 KiB objects) is refused.
    let out = Command::new(BASALT)
        .args(["pool", "create", "big", "--object-size", "4MiB"])
        .args(["--etcd", &endpoint])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no device can hold pool big"),
        "a 4 MiB pool on 128 KiB devices: {err}"
    );
    cli(&["volume", "create", "shared", "--size", "64MiB"]);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let _gw = Proc(
        Command::new(BASALT)
            .args(["nbd", "--etcd", &endpoint, "--listen", &listen])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until("the gateway to listen", Duration::from_secs(30), || {
        std::net::TcpStream::connect(&listen).is_ok()
    });
    let uri = format!("nbd://{listen}/shared");
    fio_verify(&uri, &[]);
    let list = tool_ok(
        "nbdinfo",
        &["--list", &format!("nbd://{listen}")],
        Duration::from_secs(60),
    );
    assert!(list.contains("export=\"shared\""), "{list}");
    let status = cli(&["status"]);
    assert!(status.contains("node.1"), "{status}");

    // The gateway process follows a resize and a delete made by another process (etcd watch).
    let mut c = common::nbd::NbdClient::connect(&listen, "shared").unwrap();
    let tail = 48u64 << 20;
    assert!(c.read(tail, 4096).unwrap().is_ok());
    cli(&[
        "volume",
        "resize",
        "shared",
        "--size",
        "32MiB",
        "--allow-shrink",
    ]);
    wait_until(
        "the gateway sees the shrink",
        Duration::from_secs(10),
        || c.read(tail, 4096).unwrap() == Err(22),
    );
    assert_eq!(c.write(0, &[7u8; 4096], 1).unwrap(), 0);
    cli(&["volume", "delete", "shared"]);
    wait_until(
        "the gateway sees the delete",
        Duration::from_secs(10),
        || c.read(0, 4096).unwrap() == Err(5),
    );
    c.disconnect();
    drop(etcd);
}

#[test]
fn a_node_listening_on_every_address_advertises_one_other_hosts_can_reach() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let etcd = rt
        .block_on(basalt_meta::EtcdProcess::start_with(
            basalt_meta::EtcdOptions {
                data_dir: Some(dir.path().join("etcd")),
                ..Default::default()
            },
        ))
        .expect("start etcd");
    let endpoint = etcd.endpoint();
    let out = Command::new(BASALT)
        .args([
            "pool",
            "create",
            "default",
            "--pg-count",
            "8",
            "--etcd",
            &endpoint,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let device = format!("{}:256MiB", dir.path().join("dev0.img").display());
    let _node = Proc(
        Command::new(BASALT)
            .args(["node", "--etcd", &endpoint, "--listen", "0.0.0.0:0"])
            .args(["--device", &device, "--data"])
            .arg(dir.path().join("node"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut addr = String::new();
    wait_until("the node to register", Duration::from_secs(60), || {
        let out = Command::new(BASALT)
            .args(["status", "--json", "--etcd", &endpoint])
            .output()
            .unwrap();
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
            return false;
        };
        match v["nodes"][0]["addr"].as_str() {
            Some(a) => {
                addr = a.to_string();
                true
            }
            None => false,
        }
    });
    let sock: std::net::SocketAddr = addr.parse().unwrap();
    assert!(
        !sock.ip().is_loopback() && !sock.ip().is_unspecified(),
        "a node listening on 0.0.0.0 advertises {addr}: other hosts would dial themselves"
    );
    let mut c = common::node::NodeConn::connect(&addr);
    c.hello();
    drop(etcd);
}
