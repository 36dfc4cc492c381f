//! The fixture shared by the in-process cluster tests (`replication.rs`, `repair.rs`,
//! `stall.rs`): real nodes in one process on the embedded metadata store, TCP between them, the
//! client library.
#![allow(dead_code)]

use basalt_client::{Cluster as Client, ClusterConfig, Volume, VolumeOptions};
use basalt_engine::sim::SimDisk;
use basalt_meta::{Catalog, EmbeddedStore, MetaStore, PoolSpec};
use basalt_node::{DeviceConfig, Node, NodeConfig};
use basalt_placement::ClusterMap;
use basalt_types::DeviceId;
use bytes::Bytes;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub const WAIT: Duration = Duration::from_secs(60);
pub const OBJECT: u64 = 128 << 10;
pub const PGS: u32 = 8;

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub store: Arc<dyn MetaStore>,
    pub catalog: Catalog,
}

impl Cluster {
    pub async fn new() -> Cluster {
        // RUST_LOG=basalt_node=info shows what the nodes do (peering, recovery, repairs).
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn MetaStore> = Arc::new(
            EmbeddedStore::open(dir.path().join("meta.redb"))
                .await
                .unwrap(),
        );
        let catalog = Catalog::new(store.clone());
        Cluster {
            dir,
            store,
            catalog,
        }
    }

    /// A pool "default" of `replicas` copies with `min_size`, [`PGS`] PGs.
    pub async fn pool(&self, replicas: u8, min_size: u8) {
        let mut spec = PoolSpec::new("default");
        spec.replicas = replicas;
        spec.min_size = Some(min_size);
        spec.pg_count = PGS;
        self.catalog.create_pool(&spec).await.unwrap();
    }

    /// Starts (or restarts, with its data) node `name` with one device, which `device` makes
    /// from the node's data directory; `tune` adjusts the rest (leases and peer timeouts are
    /// 2 s).
    pub async fn start_node(
        &self,
        name: &str,
        device: impl FnOnce(&Path) -> DeviceConfig,
        tune: impl FnOnce(&mut NodeConfig),
    ) -> Node {
        let config = self.node_config(name, device, tune);
        Node::start(config, self.store.clone(), false)
            .await
            .unwrap()
    }

    /// The configuration [`Cluster::start_node`] starts node `name` with.
    pub fn node_config(
        &self,
        name: &str,
        device: impl FnOnce(&Path) -> DeviceConfig,
        tune: impl FnOnce(&mut NodeConfig),
    ) -> NodeConfig {
        let data = self.dir.path().join(name);
        let mut config = NodeConfig::new(&data, "127.0.0.1:0".parse().unwrap());
        config.name = name.into();
        config.lease_ttl = Duration::from_secs(2);
        config.peer_timeout = Duration::from_secs(2);
        config.devices.push(device(&data));
        tune(&mut config);
        config
    }

    pub async fn client(&self, op_timeout: Duration) -> Client {
        let config = ClusterConfig {
            op_timeout,
            ..ClusterConfig::default()
        };
        Client::connect(self.store.clone(), config).await.unwrap()
    }

    pub async fn volume(&self, client: &Client, name: &str, size: u64) -> Volume {
        client.create_volume(name, size, "default").await.unwrap();
        client
            .open_volume(name, VolumeOptions::default())
            .await
            .unwrap()
    }

    /// Waits (on the map watch) for a map satisfying `pred`.
    pub async fn map_where(&self, what: &str, pred: impl Fn(&ClusterMap) -> bool) -> ClusterMap {
        let mut maps = self.catalog.watch_map::<ClusterMap>().await.unwrap();
        let found = tokio::time::timeout(WAIT, async {
            while let Some(m) = maps.recv().await {
                if pred(&m) {
                    return m;
                }
            }
            panic!("the map watch ended");
        })
        .await;
        found.unwrap_or_else(|_| panic!("no map with {what} within {WAIT:?}"))
    }
}

/// Polls `cond` until it holds (or panics after [`WAIT`] with `what`).
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {WAIT:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The first device of `node`.
pub fn device_of(node: &Node) -> DeviceId {
    node.status().devices[0].id
}

/// The bytes of object `i` in generation `g`: every 8-byte word names both.
pub fn pattern(i: u64, g: u64) -> Bytes {
    let word = ((g << 32) | i).to_le_bytes();
    word.iter()
        .copied()
        .cycle()
        .take(OBJECT as usize)
        .collect::<Vec<u8>>()
        .into()
}

/// The device offsets of the 4 KiB blocks of `disk` equal to `block`, ascending (to damage a
/// copy found by its content).
pub fn blocks_holding(disk: &SimDisk, block: &[u8]) -> Vec<u64> {
    let raw = disk.read(0, disk.size() as usize);
    raw.chunks_exact(4096)
        .enumerate()
        .filter(|(_, b)| *b == block)
        .map(|(n, _)| n as u64 * 4096)
        .collect()
}
