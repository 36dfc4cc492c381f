//! Helpers for the client's unit tests: a real embedded metadata store with a pool and a
//! volume, cluster maps placing the pool's PGs on chosen nodes, and in-process nodes that
//! record what they were sent and answer as told.

use crate::cluster::{Cluster, ClusterConfig};
use crate::meta::{Catalog, MetaStore, VolumeRecord};
use basalt_meta::{EmbeddedStore, PoolSpec};
use basalt_placement::{ClusterMap, DeviceInfo, FailureDomain, NodeInfo, PgMap, PoolMap};
use basalt_proto::{ErrorCode, Request, Response, ResponseFuture, Service, WireError};
use basalt_types::{DeviceId, Epoch, NodeId, PoolId, Version};
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;

/// A cluster handle over a fresh embedded store holding pool `default` (`pgs` PGs, one copy)
/// and a 1 MiB volume `v`.
pub(crate) struct Fixture {
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) catalog: Catalog,
    pub(crate) cluster: Cluster,
    pub(crate) volume: VolumeRecord,
}

pub(crate) async fn fixture(pgs: u32, config: ClusterConfig) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn MetaStore> = Arc::new(
        EmbeddedStore::open(&dir.path().join("meta.redb"))
            .await
            .unwrap(),
    );
    let catalog = Catalog::new(store.clone());
    let mut spec = PoolSpec::new("default");
    spec.replicas = 1;
    spec.pg_count = pgs;
    catalog.create_pool(&spec).await.unwrap();
    let volume = catalog
        .create_volume("v", 1 << 20, "default")
        .await
        .unwrap();
    let cluster = Cluster::connect(store, config).await.unwrap();
    Fixture {
        _dir: dir,
        catalog,
        cluster,
        volume,
    }
}

/// A map at `epoch` placing PG `i` of pool 1 on device `primaries[i]`, device `d` being on
/// node `d`.
pub(crate) fn map(epoch: u64, primaries: &[u32]) -> ClusterMap {
    let mut m = ClusterMap {
        epoch: Epoch(epoch),
        ..ClusterMap::default()
    };
    for &d in primaries {
        m.devices
            .insert(DeviceId(d), DeviceInfo::new(NodeId(d), "ssd", 1, 128 << 10));
        m.nodes.insert(
            NodeId(d),
            NodeInfo {
                addr: format!("127.0.0.1:{}", 1 + d),
            },
        );
    }
    m.pools.insert(
        PoolId(1),
        PoolMap {
            pg_count: primaries.len() as u32,
            replicas: 1,
            min_size: 1,
            object_size: 128 << 10,
            failure_domain: FailureDomain::Host,
            device_class: None,
            pgs: primaries
                .iter()
                .map(|&d| PgMap {
                    up: vec![DeviceId(d)],
                    acting: vec![DeviceId(d)],
                    since: Epoch(epoch),
                })
                .collect(),
        },
    );
    m
}

/// A fixture with in-process nodes 1 and 2, and a map (epoch 1) that makes node 1 the primary.
pub(crate) async fn two_nodes(config: ClusterConfig) -> (Fixture, Arc<FakeNode>, Arc<FakeNode>) {
    let fx = fixture(1, config).await;
    let n1 = FakeNode::install(&fx.cluster, 1);
    let n2 = FakeNode::install(&fx.cluster, 2);
    fx.cluster.inner.maps.offer(map(1, &[1]));
    (fx, n1, n2)
}

/// An in-process node: records every request and answers it as the test scripted (by default,
/// success).
#[derive(Default)]
pub(crate) struct FakeNode {
    pub(crate) seen: Mutex<Vec<Request>>,
    /// Errors to answer with, in order, before answering normally again.
    pub(crate) script: Mutex<VecDeque<WireError>>,
    /// Answer every Flush with this error.
    pub(crate) fail_flushes: Mutex<Option<ErrorCode>>,
    /// Run once, while handling the next request, before answering it.
    pub(crate) before_answer: Mutex<Option<BeforeAnswer>>,
    /// The incarnation its answers carry (a test changes it as a node's crash and restart
    /// would; 0 in a write's answer: the write is durable).
    pub(crate) incarnation: Mutex<u64>,
}

pub(crate) type BeforeAnswer = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

impl FakeNode {
    pub(crate) fn install(cluster: &Cluster, id: u32) -> Arc<FakeNode> {
        let node = Arc::new(FakeNode::default());
        // Writes not durable until flushed, as from a PG served by one copy.
        *node.incarnation.lock() = 1;
        cluster.add_local_node(NodeId(id), Arc::new(FakeService(node.clone())));
        node
    }

    pub(crate) fn flushes(&self) -> usize {
        self.seen
            .lock()
            .iter()
            .filter(|r| matches!(r, Request::Flush { .. }))
            .count()
    }

    pub(crate) fn epochs(&self) -> Vec<Epoch> {
        self.seen.lock().iter().filter_map(Request::epoch).collect()
    }
}

struct FakeService(Arc<FakeNode>);

impl Service for FakeService {
    fn call(&self, req: Request) -> ResponseFuture {
        let node = self.0.clone();
        Box::pin(async move {
            node.seen.lock().push(req.clone());
            let hook = node.before_answer.lock().take();
            if let Some(hook) = hook {
                hook.await;
            }
            if let Some(e) = node.script.lock().pop_front() {
                return Err(e);
            }
            match req {
                Request::Flush { .. } => match *node.fail_flushes.lock() {
                    Some(code) => Err(WireError::new(code, "flush failed")),
                    None => Ok(Response::Flushed {
                        incarnation: *node.incarnation.lock(),
                    }),
                },
                Request::Read { len, .. } => Ok(Response::Read {
                    data: Bytes::from(vec![0u8; len as usize]),
                }),
                Request::DeleteVolume { .. } => Ok(Response::Deleted { objects: 0 }),
                _ => Ok(Response::Written {
                    version: Version::new(0, 1),
                    incarnation: *node.incarnation.lock(),
                }),
            }
        })
    }
}
