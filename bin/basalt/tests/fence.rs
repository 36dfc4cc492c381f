//! Volume fencing on nodes, with real processes and a real etcd: a gateway cut off from the
//! metadata store cannot write past a shrunk end or into a deleted volume (its node checks every
//! write against the volume records it follows), and the objects of volumes that no longer exist
//! are collected from the node's device, while volumes created meanwhile are never touched.

mod common;

use basalt_meta::{Catalog, EtcdStore, MetaStore};
use basalt_proto::{ErrorCode, Request, Response, WireError};
use basalt_types::{Epoch, ObjectId, PoolId, Version, VolumeId};
use bytes::Bytes;
use common::nbd::NbdClient;
use common::node::NodeConn;
use common::proxy::Proxy;
use common::{BASALT, Proc, wait_until};
use serde_json::Value;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const EINVAL: u32 = 22;
const EIO: u32 = 5;
const MIB: u64 = 1 << 20;

/// etcd, one `basalt node` on a device file, and a catalog on the same etcd for the test.
struct Cluster {
    dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
    etcd: basalt_meta::EtcdProcess,
    catalog: Catalog,
    _node: Proc,
    /// The node's data-path address.
    node: String,
}

impl Cluster {
    fn start(node_args: &[&str]) -> Cluster {
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
        let store = rt
            .block_on(EtcdStore::connect(&[etcd.endpoint()], ""))
            .unwrap();
        let catalog = Catalog::new(Arc::new(store) as Arc<dyn MetaStore>);
        let device = format!("{}:256MiB", dir.path().join("dev0.img").display());
        let endpoint = etcd.endpoint();
        let mut c = Cluster {
            _node: Proc(
                Command::new(BASALT)
                    .args(["node", "--etcd", &endpoint, "--listen", "127.0.0.1:0"])
                    .args(["--device", &device])
                    .args(node_args)
                    .arg("--data")
                    .arg(dir.path().join("node"))
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(dir.path().join("node.log")).unwrap())
                    .spawn()
                    .unwrap(),
            ),
            node: String::new(),
            dir,
            rt,
            etcd,
            catalog,
        };
        c.cli(&[
            "pool",
            "create",
            "default",
            "--replicas",
            "1",
            "--pg-count",
            "8",
        ]);
        wait_until("the node to be placed", Duration::from_secs(60), || {
            c.status()["nodes"][0]["status"]["devices"][0]["id"].is_u64()
                && c.rt
                    .block_on(c.catalog.get_map::<basalt_placement::ClusterMap>())
                    .ok()
                    .flatten()
                    .is_some_and(|(m, _)| {
                        m.pools
                            .values()
                            .all(|p| p.pgs.iter().all(|pg| m.pg_primary(pg).is_some()))
                            && !m.pools.is_empty()
                    })
        });
        // Placed is not yet peered: a PG still peering answers a raw write `Busy`.
        wait_until(
            "every PG active on the node",
            Duration::from_secs(60),
            || {
                let pgs = &c.status()["nodes"][0]["status"]["pgs"];
                pgs.as_array()
                    .is_some_and(|p| p.len() == 8 && p.iter().all(|p| p["state"] == "active"))
            },
        );
        c.node = c.status()["nodes"][0]["addr"].as_str().unwrap().to_string();
        c
    }

    fn cli(&self, args: &[&str]) -> Value {
        let out = Command::new(BASALT)
            .args(args)
            .args(["--json", "--etcd", &self.etcd.endpoint()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "basalt {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn status(&self) -> Value {
        self.cli(&["status"])
    }

    /// The node's own report (collector counters, device objects).
    fn node_status(&self) -> Value {
        self.status()["nodes"][0]["status"].clone()
    }

    /// Live objects on the node's device (deletes leave tombstones, replicated like writes so
    /// a member that was away learns of them; the PG's primary trims them once every member
    /// has them).
    fn objects(&self) -> u64 {
        let st = self.node_status();
        st["devices"][0]["objects"].as_u64().unwrap()
    }
}

/// One request on a raw node connection: a gateway that follows no metadata at all.
struct Raw {
    conn: NodeConn,
    epoch: Epoch,
    id: u64,
}

impl Raw {
    fn connect(addr: &str) -> Raw {
        let mut conn = NodeConn::connect(addr);
        let epoch = conn.hello();
        Raw { conn, epoch, id: 1 }
    }

    fn call(&mut self, req: Request) -> Result<Response, WireError> {
        self.id += 1;
        self.conn.send(self.id, &req);
        self.conn.answer().expect("the node closed the connection")
    }

    fn write(&mut self, oid: ObjectId, offset: u32, data: &[u8]) -> Result<Response, WireError> {
        self.call(Request::Write {
            epoch: self.epoch,
            oid,
            offset,
            version: Version::NONE,
            fua: true,
            data: Bytes::copy_from_slice(data),
            session: basalt_proto::Session::NONE,
        })
    }

    fn read(&mut self, oid: ObjectId, len: u32) -> Vec<u8> {
        match self.call(Request::Read {
            epoch: self.epoch,
            oid,
            offset: 0,
            len,
        }) {
            Ok(Response::Read { data }) => data.to_vec(),
            other => panic!("read of {oid}: {other:?}"),
        }
    }
}

fn refused(answer: Result<Response, WireError>) -> Option<ErrorCode> {
    match answer {
        Ok(Response::Written { .. }) => None,
        Err(e) => Some(e.code),
        other => panic!("unexpected answer to a write: {other:?}"),
    }
}

#[test]
fn a_gateway_cut_off_from_etcd_cannot_write_past_a_shrink_or_into_a_deleted_volume() {
    let cluster = Cluster::start(&[]);
    cluster.cli(&["volume", "create", "v", "--size", "8MiB"]);
    // The gateway reaches etcd through a proxy the test can cut; everything else goes directly.
    let proxy = Proxy::start(cluster.etcd.endpoint().trim_start_matches("http://"));
    let listen = format!("127.0.0.1:{}", free_port());
    let _gateway = Proc(
        Command::new(BASALT)
            .args(["nbd", "--etcd", &format!("http://{}", proxy.addr)])
            .args(["--listen", &listen])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(cluster.dir.path().join("nbd.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_until("the gateway to listen", Duration::from_secs(30), || {
        std::net::TcpStream::connect(&listen).is_ok()
    });
    let mut c = NbdClient::connect(&listen, "v").unwrap();
    assert_eq!(c.write(0, &[1u8; 4096], 1).unwrap(), 0);
    assert_eq!(c.write(6 * MIB, &[2u8; 4096], 1).unwrap(), 0);

    proxy.cut();
    cluster.cli(&["volume", "resize", "v", "--size", "2MiB", "--allow-shrink"]);
    // The gateway did not learn of the shrink: it still serves reads past the new end.
    assert_eq!(c.read(6 * MIB, 4096).unwrap().unwrap(), vec![0u8; 4096]);
    // Its writes there are refused by the node; before the end they work.
    assert_eq!(c.write(6 * MIB, &[3u8; 4096], 1).unwrap(), EINVAL);
    assert_eq!(c.write(2 * MIB - 4096, &[3u8; 8192], 1).unwrap(), EINVAL);
    assert_eq!(c.write(2 * MIB - 4096, &[4u8; 4096], 1).unwrap(), 0);
    assert_eq!(c.read(0, 4096).unwrap().unwrap(), vec![1u8; 4096]);

    cluster.cli(&["volume", "delete", "v"]);
    assert_eq!(c.write(0, &[5u8; 4096], 1).unwrap(), EIO);
    assert_eq!(c.write(MIB, &[5u8; 4096], 1).unwrap(), EIO);
    assert_eq!(c.trim(0, 4096).unwrap(), EIO);
    // Nothing of the deleted volume is left on the node, and nothing came back.
    assert_eq!(cluster.objects(), 0, "{}", cluster.node_status());
    // A volume re-created under the name gets a new id; the old handle never reaches it.
    cluster.cli(&["volume", "create", "v", "--size", "8MiB"]);
    assert_eq!(c.write(0, &[6u8; 4096], 1).unwrap(), EIO);
    assert_eq!(cluster.objects(), 0, "{}", cluster.node_status());
    c.disconnect();
}

#[test]
fn a_stale_raw_writer_is_refused_and_what_it_left_is_collected() {
    let cluster = Cluster::start(&["--collect-interval", "100ms"]);
    let os = 128 * 1024;
    let doomed = VolumeId(
        cluster.cli(&["volume", "create", "doomed", "--size", "4MiB"])["id"]
            .as_u64()
            .unwrap(),
    );
    let oid = |v: VolumeId, i: u64| ObjectId::new(PoolId(1), v, i);
    let mut raw = Raw::connect(&cluster.node);
    for i in 0..5 {
        assert_eq!(refused(raw.write(oid(doomed, i), 0, &[9u8; 4096])), None);
    }
    // Past the end of the 4 MiB volume (32 objects), and across its last byte.
    assert_eq!(
        refused(raw.write(oid(doomed, 32), 0, &[9u8; 4096])),
        Some(ErrorCode::InvalidArgument)
    );
    assert_eq!(
        refused(raw.write(oid(doomed, 31), os - 4096, &[9u8; 8192])),
        Some(ErrorCode::InvalidArgument)
    );
    // Its record goes without its data ever being removed (what a delete that never reached
    // this node, or an earlier version's race, leaves behind).
    cluster.rt.block_on(async {
        cluster
            .catalog
            .mark_volume_deleting("doomed")
            .await
            .unwrap();
        cluster.catalog.remove_volume("doomed").await.unwrap();
    });
    // A volume created meanwhile, written at once (the node may not have seen its record yet).
    let fresh = VolumeId(
        cluster.cli(&["volume", "create", "fresh", "--size", "4MiB"])["id"]
            .as_u64()
            .unwrap(),
    );
    for i in 0..3 {
        let data = vec![i as u8 + 1; 4096];
        assert_eq!(refused(raw.write(oid(fresh, i), 0, &data)), None);
    }
    // The stale writer is refused once the node has seen the removal (each write it got in
    // before that is one more object for the collector).
    wait_until(
        "the node to refuse the deleted volume",
        Duration::from_secs(10),
        || refused(raw.write(oid(doomed, 7), 0, &[9u8; 4096])) == Some(ErrorCode::NotFound),
    );
    assert_eq!(
        refused(raw.write(oid(VolumeId(fresh.0 + 100), 0), 0, &[9u8; 4096])),
        Some(ErrorCode::NotFound),
        "an id never handed out"
    );
    wait_until(
        "the collector to remove the deleted volume's objects",
        Duration::from_secs(30),
        || cluster.objects() == 3,
    );
    let collected = cluster.node_status()["collected_objects"].as_u64().unwrap();
    assert!(collected >= 5, "{collected} objects collected");
    // Two more full passes leave the new volume alone.
    let passes = cluster.node_status()["collector_passes"].as_u64().unwrap();
    wait_until("two more passes", Duration::from_secs(30), || {
        cluster.node_status()["collector_passes"].as_u64().unwrap() >= passes + 2
    });
    assert_eq!(cluster.objects(), 3);
    for i in 0..3 {
        assert_eq!(raw.read(oid(fresh, i), 4096), vec![i as u8 + 1; 4096]);
    }
    assert_eq!(raw.read(oid(doomed, 0), 4096), vec![0u8; 4096]);
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
