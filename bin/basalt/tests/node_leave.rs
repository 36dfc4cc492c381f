//! A clean SIGTERM of `basalt node` leaves the cluster at once: the node revokes its lease, its
//! record vanishes and the leader marks its devices down within a small part of the lease TTL
//! (the lease here is 30 s), whether the node was the leader (a new one is elected at once) or
//! not; the process exits cleanly.

mod common;

use basalt_meta::{Catalog, EtcdStore, MetaStore};
use basalt_placement::ClusterMap;
use basalt_types::{DeviceId, NodeId};
use common::{BASALT, Proc, wait_until};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(30);
/// "At once": well under the TTL.
const LEAVE_LIMIT: Duration = Duration::from_secs(10);

struct Fixture {
    rt: tokio::runtime::Runtime,
    catalog: Catalog,
    endpoint: String,
}

impl Fixture {
    fn map(&self) -> Option<ClusterMap> {
        let got = self.rt.block_on(self.catalog.get_map::<ClusterMap>());
        got.ok().flatten().map(|(m, _)| m)
    }

    fn leader(&self) -> Option<String> {
        let got = self.rt.block_on(self.catalog.leader());
        got.ok().flatten().map(|l| l.name)
    }

    fn node(&self, dir: &Path, name: &str) -> (Proc, NodeId) {
        let device = format!("{}:256MiB", dir.join(format!("{name}.img")).display());
        let data = dir.join(name);
        let child = Command::new(BASALT)
            .args(["node", "--etcd", &self.endpoint, "--listen", "127.0.0.1:0"])
            .args(["--name", name, "--device", &device])
            .args(["--lease-ttl", &format!("{}s", TTL.as_secs()), "--data"])
            .arg(&data)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap())
            .spawn()
            .unwrap();
        let proc = Proc(child);
        let mut id = None;
        wait_until("the node's id", Duration::from_secs(60), || {
            id = std::fs::read_to_string(data.join("node.id"))
                .ok()
                .and_then(|s| s.trim().parse().ok());
            id.is_some()
        });
        (proc, NodeId(id.unwrap()))
    }

    /// The devices of `node` in the current map, and whether each is up.
    fn devices_of(&self, node: NodeId) -> Vec<(DeviceId, bool)> {
        let Some(map) = self.map() else {
            return Vec::new();
        };
        map.devices
            .iter()
            .filter(|(_, d)| d.node == node)
            .map(|(id, d)| (*id, d.up))
            .collect()
    }
}

/// SIGTERM to `proc`; waits until the map shows every device of `node` down (within
/// [`LEAVE_LIMIT`]) and the process has exited cleanly.
fn leave(fx: &Fixture, mut proc: Proc, node: NodeId, what: &str) {
    assert!(fx.devices_of(node).iter().all(|(_, up)| *up), "{what}: up");
    let sent = Instant::now();
    // SAFETY: signalling a child this test started.
    assert_eq!(unsafe { libc::kill(proc.0.id() as i32, libc::SIGTERM) }, 0);
    wait_until(
        &format!("{what}'s devices down after SIGTERM"),
        LEAVE_LIMIT,
        || {
            let devs = fx.devices_of(node);
            !devs.is_empty() && devs.iter().all(|(_, up)| !up)
        },
    );
    let took = sent.elapsed();
    wait_until(&format!("{what} to exit"), LEAVE_LIMIT, || {
        proc.0.try_wait().unwrap().is_some()
    });
    let status = proc.0.wait().unwrap();
    assert!(status.success(), "{what} exited with {status}");
    let record = fx.rt.block_on(fx.catalog.get_node(node)).unwrap();
    assert!(record.is_none(), "{what}'s record is gone");
    eprintln!("{what}: devices down {took:?} after SIGTERM (lease TTL {TTL:?})");
}

#[test]
fn a_node_stopped_with_sigterm_leaves_at_once_whether_it_leads_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let etcd = rt
        .block_on(basalt_meta::EtcdProcess::start_with(
            basalt_meta::EtcdOptions {
                data_dir: Some(dir.path().join("etcd")),
                ..Default::default()
            },
        ))
        .expect("start etcd");
    let endpoint = etcd.endpoint();
    let store = rt
        .block_on(EtcdStore::connect(std::slice::from_ref(&endpoint), ""))
        .unwrap();
    let fx = Fixture {
        catalog: Catalog::new(Arc::new(store) as Arc<dyn MetaStore>),
        rt,
        endpoint,
    };
    let mut nodes: Vec<(Proc, NodeId)> = ["a", "b", "c"]
        .iter()
        .map(|n| fx.node(dir.path(), n))
        .collect();
    wait_until("three devices up", Duration::from_secs(60), || {
        fx.map()
            .is_some_and(|m| m.devices.len() == 3 && m.devices.values().all(|d| d.up))
    });
    let out = Command::new(BASALT)
        .args([
            "pool",
            "create",
            "default",
            "--replicas",
            "1",
            "--pgs",
            "16",
            "--etcd",
        ])
        .arg(&fx.endpoint)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The leader leaves: another node is elected and marks its devices down.
    let leads = |id: NodeId| {
        fx.leader()
            .is_some_and(|l| l.starts_with(&format!("{id}@")))
    };
    wait_until("a leader", Duration::from_secs(30), || {
        nodes.iter().any(|(_, id)| leads(*id))
    });
    let i = nodes.iter().position(|(_, id)| leads(*id)).unwrap();
    let (proc, id) = nodes.remove(i);
    leave(&fx, proc, id, "the leader");
    assert!(
        fx.leader()
            .is_some_and(|l| !l.starts_with(&format!("{id}@")))
    );

    // A node that does not lead leaves.
    wait_until("a new leader", Duration::from_secs(30), || {
        nodes.iter().any(|(_, id)| leads(*id))
    });
    let i = nodes.iter().position(|(_, id)| !leads(*id)).unwrap();
    let (proc, id) = nodes.remove(i);
    leave(&fx, proc, id, "a node that does not lead");
    drop(nodes);
    drop(etcd);
}
