//! Two processes never open the same store: a node locks its data directory and every device
//! (flock), and opens block devices exclusively (O_EXCL), so a second `basalt node` on the same
//! directory or device, or a node given a block device that is mounted or held by someone else,
//! refuses to start with an error naming the holder. Needs root for the loop devices.

mod common;

use common::host::{Loop, must_fail, up_args};
use common::{BASALT, Proc, wait_until};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

struct Cluster {
    _etcd: basalt_meta::EtcdProcess,
    endpoint: String,
}

impl Cluster {
    fn start(dir: &Path) -> Cluster {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let etcd = rt
            .block_on(basalt_meta::EtcdProcess::start_with(
                basalt_meta::EtcdOptions {
                    data_dir: Some(dir.join("etcd")),
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
                "--replicas",
                "1",
                "--pg-count",
                "8",
            ])
            .args(["--etcd", &endpoint])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Cluster {
            _etcd: etcd,
            endpoint,
        }
    }

    fn node_args(&self, data: &Path, device: &str) -> Vec<String> {
        vec![
            "node".into(),
            "--etcd".into(),
            self.endpoint.clone(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--device".into(),
            device.into(),
            "--data".into(),
            data.display().to_string(),
        ]
    }

    /// Starts a node and waits until it registered.
    fn node(&self, data: &Path, device: &str, log: &Path) -> Proc {
        let child = Command::new(BASALT)
            .args(self.node_args(data, device))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap();
        let node = Proc(child);
        wait_until("the node to register", LIMIT, || {
            let out = Command::new(BASALT)
                .args(["status", "--json", "--etcd", &self.endpoint])
                .output()
                .unwrap();
            out.status.success()
                && serde_json::from_slice::<serde_json::Value>(&out.stdout)
                    .is_ok_and(|v| v["nodes"].as_array().is_some_and(|n| !n.is_empty()))
        });
        node
    }

    fn second_node_fails(&self, data: &Path, device: &str) -> String {
        let args = self.node_args(data, device);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        String::from_utf8_lossy(&must_fail(&args, LIMIT).stderr).into_owned()
    }
}

#[test]
fn a_second_node_on_the_same_directory_or_device_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path());
    let dev0 = format!("{}:256MiB", dir.path().join("dev0.img").display());
    let dev1 = format!("{}:256MiB", dir.path().join("dev1.img").display());
    let first = cluster.node(&dir.path().join("n0"), &dev0, &dir.path().join("n0.log"));
    let pid = first.0.id();
    // Same data directory, another device.
    let err = cluster.second_node_fails(&dir.path().join("n0"), &dev1);
    assert!(err.contains("is in use by"), "{err}");
    assert!(err.contains(&format!("pid {pid}")), "{err}");
    // Another directory, the same device file.
    let err = cluster.second_node_fails(&dir.path().join("n1"), &dev0);
    assert!(err.contains("is in use by"), "{err}");
    assert!(err.contains(&format!("pid {pid}")), "{err}");
    // The first node was not disturbed.
    let log = std::fs::read_to_string(dir.path().join("n0.log")).unwrap();
    assert!(!log.contains("ERROR"), "{log}");
    let out = Command::new(BASALT)
        .args(["status", "--etcd", &cluster.endpoint])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_block_device_held_by_someone_else_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("disk.img");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let dev = Loop::attach(&backing);
    // Held exclusively (as a mounted file system or a device-mapper target would hold it).
    let held = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(&dev.0)
        .expect("open the loop device exclusively");
    let mut args = up_args(&dir.path().join("data"));
    args.extend(["--device".into(), dev.0.clone()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let err = String::from_utf8_lossy(&must_fail(&args, LIMIT).stderr).into_owned();
    assert!(err.contains("is in use by"), "{err}");
    assert!(
        err.contains(&format!("pid {}", std::process::id())),
        "the holder is not named: {err}"
    );
    // The device was not written.
    drop(held);
    let mut head = vec![0u8; 1 << 20];
    std::io::Read::read_exact(&mut std::fs::File::open(&backing).unwrap(), &mut head).unwrap();
    assert!(head.iter().all(|&b| b == 0), "the held device was written");
}
