//! Lease safety with a real etcd: while a node cannot renew its lease it stops acknowledging
//! data-path requests before the lease can have expired (answering `Busy`, which clients retry),
//! and after an outage longer than the lease it registers again by itself (a new lease, the same
//! node record) and serves again, without a restart.

mod common;

use basalt_meta::{Catalog, EtcdStore, MetaStore, keys};
use basalt_proto::{ErrorCode, Request, Response, WireError};
use basalt_types::{Epoch, NodeId, ObjectId, PoolId, Version, VolumeId};
use bytes::Bytes;
use common::node::NodeConn;
use common::{BASALT, Proc, wait_until};
use serde_json::Value;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(3);

/// Sends SIGCONT to etcd when dropped, so a failing test never leaves it stopped.
struct Stopped(u32);

impl Stopped {
    fn new(pid: u32) -> Stopped {
        signal(pid, libc::SIGSTOP);
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, libc::SIGCONT);
    }
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: signalling the etcd child this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

struct Fixture {
    rt: tokio::runtime::Runtime,
    catalog: Catalog,
    endpoint: String,
}

impl Fixture {
    fn cli(&self, args: &[&str]) -> Value {
        let out = Command::new(BASALT)
            .args(args)
            .args(["--json", "--etcd", &self.endpoint])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The lease the node record is attached to (None: no record).
    fn node_lease(&self, node: NodeId) -> Option<i64> {
        let kv = self
            .rt
            .block_on(self.catalog.store().get(&keys::node(node)))
            .unwrap()?;
        kv.lease.map(|l| l.0)
    }

    /// Whether the published map places every PG of every pool on some device.
    fn fully_placed(&self) -> bool {
        let Ok(Some((map, _))) = self
            .rt
            .block_on(self.catalog.get_map::<basalt_placement::ClusterMap>())
        else {
            return false;
        };
        !map.pools.is_empty()
            && map
                .pools
                .values()
                .all(|p| p.pgs.iter().all(|pg| map.pg_primary(pg).is_some()))
    }
}

/// One request on the raw connection; returns its answer.
fn call(c: &mut NodeConn, id: &mut u64, req: &Request) -> Result<Response, WireError> {
    *id += 1;
    c.send(*id, req);
    c.answer().expect("the node closed the connection")
}

#[test]
fn a_node_fences_itself_while_cut_off_and_rejoins_after_its_lease_expired() {
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
    fx.cli(&[
        "pool",
        "create",
        "default",
        "--replicas",
        "1",
        "--pg-count",
        "8",
    ]);
    let device = format!("{}:256MiB", dir.path().join("dev0.img").display());
    let ttl = format!("{}s", TTL.as_secs());
    let mut node = Proc(
        Command::new(BASALT)
            .args(["node", "--etcd", &fx.endpoint, "--listen", "127.0.0.1:0"])
            .args(["--device", &device, "--lease-ttl", &ttl, "--data"])
            .arg(dir.path().join("node"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("node.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_until(
        "the node's device to be placed",
        Duration::from_secs(60),
        || fx.fully_placed(),
    );
    // Placed is not yet peered: a PG still peering answers a write `Busy`.
    wait_until(
        "every PG active on the node",
        Duration::from_secs(60),
        || {
            let pgs = &fx.cli(&["status"])["nodes"][0]["status"]["pgs"];
            pgs.as_array()
                .is_some_and(|p| p.len() == 8 && p.iter().all(|p| p["state"] == "active"))
        },
    );
    let status = fx.cli(&["status"]);
    let addr = status["nodes"][0]["addr"].as_str().unwrap().to_string();
    let node_id = NodeId(status["nodes"][0]["id"].as_u64().unwrap() as u32);
    let vol = fx.cli(&["volume", "create", "v", "--size", "16MiB"])["id"]
        .as_u64()
        .unwrap();
    let oid = ObjectId::new(PoolId(1), VolumeId(vol), 0);
    let lease_before = fx.node_lease(node_id).expect("the node is registered");

    let mut c = NodeConn::connect(&addr);
    let mut epoch = c.hello();
    let mut id = 1;
    let data = Bytes::from(vec![0x5a; 8192]);
    let write = |epoch| Request::Write {
        epoch,
        oid,
        offset: 0,
        version: Version::NONE,
        fua: true,
        data: data.clone(),
        session: basalt_proto::Session::NONE,
    };
    let read = |epoch: Epoch| Request::Read {
        epoch,
        oid,
        offset: 0,
        len: 8192,
    };
    assert!(matches!(
        call(&mut c, &mut id, &write(epoch)),
        Ok(Response::Written { .. })
    ));

    // The outage: etcd stops answering. The node's last renewal was sent before this instant,
    // so etcd may expire its lease from `stopped + TTL` on: no acknowledgement after that.
    let pid = etcd.pid().expect("etcd runs");
    let stopped_at = Instant::now();
    let stopped = Stopped::new(pid);
    let mut acked_during_outage = 0;
    loop {
        let answer = call(&mut c, &mut id, &read(epoch));
        let at = stopped_at.elapsed();
        match answer {
            Ok(Response::Read { data: got }) => {
                assert!(
                    at < TTL,
                    "a read was acknowledged {at:?} into the outage (TTL {TTL:?})"
                );
                assert_eq!(got, data);
                acked_during_outage += 1;
            }
            Err(e) if e.code == ErrorCode::Busy => {
                assert!(e.message.contains("lease"), "{e:?}");
                break;
            }
            other => panic!("unexpected answer during the outage: {other:?}"),
        }
        assert!(
            at < TTL + Duration::from_secs(5),
            "the node never fenced itself"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        acked_during_outage > 0,
        "the node fenced itself before the lease's margin"
    );
    // Keep etcd away for longer than the TTL: every data-path request in between is refused,
    // writes included.
    while stopped_at.elapsed() < TTL * 2 {
        let w = call(&mut c, &mut id, &write(epoch));
        assert!(matches!(&w, Err(e) if e.code == ErrorCode::Busy), "{w:?}");
        let r = call(&mut c, &mut id, &read(epoch));
        assert!(matches!(&r, Err(e) if e.code == ErrorCode::Busy), "{r:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(stopped);

    // The node registers again by itself and serves again (following the map epochs the
    // leader publishes meanwhile).
    let deadline = Instant::now() + Duration::from_secs(60);
    let got = loop {
        match call(&mut c, &mut id, &read(epoch)) {
            Ok(Response::Read { data }) => break data,
            Err(e) if e.code == ErrorCode::StaleEpoch => epoch = e.epoch,
            Err(e) if e.code == ErrorCode::Busy || e.code == ErrorCode::NotPrimary => {}
            other => panic!("unexpected answer after the outage: {other:?}"),
        }
        assert!(Instant::now() < deadline, "the node did not serve again");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(got, data, "data written before the outage");
    assert!(
        node.0.try_wait().unwrap().is_none(),
        "the node process exited"
    );
    let lease_after = fx.node_lease(node_id).expect("the node registered again");
    assert_ne!(
        lease_after, lease_before,
        "the node record is on its old lease"
    );
    wait_until(
        "the map to place the node's device again",
        Duration::from_secs(30),
        || fx.fully_placed(),
    );
    let status = fx.cli(&["status"]);
    assert_eq!(status["nodes"][0]["id"].as_u64(), Some(node_id.0 as u64));
    let log = std::fs::read_to_string(dir.path().join("node.log")).unwrap();
    assert!(log.contains("registered again"), "{log}");
    drop(etcd);
}
