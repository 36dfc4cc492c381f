//! A slow disk, made slow by the kernel's block layer: one node of a `basalt up --nodes 3`
//! cluster is moved into a cgroup whose I/O to the disk under its device file is throttled to
//! 10 requests per second (cgroup v1 `blkio.throttle.*_iops_device`, or v2 `io.max`; needs
//! root). While fio writes, `basalt status` names that node's device slow (`device_slow`) and
//! no other; once the throttle is lifted, the warning goes with the next 10 s window.

mod common;

use common::upcluster::UpCluster;
use common::{Proc, wait_until};
use serde_json::Value;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A cgroup limiting its processes' I/O to one disk; removed (its processes moved back to the
/// root) when dropped.
struct Throttle {
    dir: PathBuf,
    root: PathBuf,
    disk: String,
    v2: bool,
}

impl Throttle {
    /// A new cgroup for the block-I/O controller, throttling `disk` (`major:minor`).
    fn new(disk: &str) -> Throttle {
        let name = format!("basalt-slow-{}", std::process::id());
        let v1 = PathBuf::from("/sys/fs/cgroup/blkio");
        let unified = PathBuf::from("/sys/fs/cgroup");
        let (root, v2) = if v1.join("cgroup.procs").exists() {
            (v1, false)
        } else if std::fs::read_to_string(unified.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "io"))
        {
            // The io controller must be enabled for the root's children.
            std::fs::write(unified.join("cgroup.subtree_control"), "+io")
                .expect("enabling the io controller (needs root)");
            (unified, true)
        } else {
            panic!(
                "this test needs the cgroup block-I/O controller (v1 blkio at \
                 /sys/fs/cgroup/blkio, or v2 io) and root"
            );
        };
        let dir = root.join(name);
        std::fs::create_dir(&dir).expect("creating a cgroup (needs root)");
        Throttle {
            dir,
            root,
            disk: disk.to_string(),
            v2,
        }
    }

    /// Limits reads and writes to `iops` per second each (0: no limit).
    fn limit(&self, iops: u32) {
        let write = |file: &str, text: String| {
            std::fs::write(self.dir.join(file), &text)
                .unwrap_or_else(|e| panic!("{file} <- {text}: {e}"))
        };
        let disk = &self.disk;
        if self.v2 {
            let v = if iops == 0 {
                "max".to_string()
            } else {
                iops.to_string()
            };
            write("io.max", format!("{disk} riops={v} wiops={v}"));
        } else {
            write("blkio.throttle.read_iops_device", format!("{disk} {iops}"));
            write("blkio.throttle.write_iops_device", format!("{disk} {iops}"));
        }
    }

    /// Moves process `pid` (all its threads) into the cgroup.
    fn add(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).expect("moving the node");
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// `major:minor` of the whole disk under the file system holding `path`.
fn disk_of(path: &Path) -> String {
    let dev = std::fs::metadata(path).expect("device file").dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    assert!(
        sys.exists(),
        "{} is on {major}:{minor}, not a block device: the block layer cannot throttle it",
        path.display()
    );
    // A partition's throttle is its disk's.
    let disk = if sys.join("partition").exists() {
        sys.join("../dev")
    } else {
        sys.join("dev")
    };
    std::fs::read_to_string(disk).unwrap().trim().to_string()
}

/// The ids of the devices `basalt status` lists as slow, and whether health warns about them.
fn slow(c: &UpCluster) -> (Vec<u64>, bool) {
    let s: Value = c.up.cli_json(&["status"]);
    let ids = s["devices"]["slow"]
        .as_array()
        .expect("devices.slow")
        .iter()
        .map(|d| d["id"].as_u64().unwrap())
        .collect();
    let warned = s["health"]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["check"] == "device_slow");
    (ids, warned)
}

#[test]
fn a_throttled_disk_is_named_slow_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let c = UpCluster::start(dir.path(), 3, "64MiB", &[]);
    c.wait_clean(Duration::from_secs(60));
    let victim = c.node(2);
    let device_file = victim.dir.join("dev0.img");
    let throttle = Throttle::new(&disk_of(&device_file));
    throttle.limit(10);
    throttle.add(victim.pid.expect("node 2 runs"));

    // Writes over the whole volume, for longer than the test needs (killed at the end).
    let _fio = Proc(
        Command::new("fio")
            .args([
                "--name=load",
                "--ioengine=nbd",
                "--rw=randwrite",
                "--bs=4k",
                "--iodepth=16",
                "--time_based",
                "--runtime=300",
                "--size=64m",
                &format!("--uri={}", c.up.uri("vol0")),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("fio runs (scripts/setup.sh installs it)"),
    );
    let mut last = (Vec::new(), false);
    wait_until(
        "basalt status names the throttled device slow",
        Duration::from_secs(90),
        || {
            last = slow(&c);
            last.0.contains(&victim.device)
        },
    );
    assert_eq!(last.0, [victim.device], "only the throttled device is slow");
    assert!(last.1, "health warns device_slow");
    let status = c.up.cli(&["status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains(&format!("dev.{} is slow:", victim.device)),
        "{text}"
    );

    // Lifted: the warning goes once the slow I/O is out of the node's 10 s window.
    throttle.limit(0);
    wait_until(
        "no device is slow once the throttle is lifted",
        Duration::from_secs(60),
        || {
            last = slow(&c);
            last.0.is_empty() && !last.1
        },
    );
    drop(throttle);
    c.stop();
}
