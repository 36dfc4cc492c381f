//! The simulated cluster: nodes over simulated disks, the metadata store in memory, the network,
//! and what a fault does to them (kill -9 and restart from the crash images, partitions, the
//! metadata store cut off, connections reset, devices out and in, a node added).

use crate::config::{Config, Rng};
use crate::trace::Trace;
use basalt_client::{Cluster as Client, ClusterConfig, Volume, VolumeOptions};
use basalt_engine::sim::{Latency, SimDisk, Spread};
use basalt_engine::{DeviceId, FormatOptions, OpenOptions, Store, format_sim};
use basalt_meta::{Catalog, EmbeddedStore, MetaStore, OutReason, PoolSpec};
use basalt_node::sim::{Host, SimMeta, SimNet};
use basalt_node::{Node, NodeConfig, Tuning};
use basalt_types::NodeId;
use std::sync::Arc;
use std::time::Duration;

/// Unix seconds of the simulated clock's start.
pub const CLOCK_START: u64 = 1_800_000_000;

/// The clients' host on the network.
pub const CLIENT: Host = 0;
const DISK_SIZE: u64 = 32 << 20;
const JOURNAL: u64 = 4 << 20;

pub struct Slot {
    pub host: Host,
    pub id: Option<NodeId>,
    pub addr: String,
    pub disks: Vec<SimDisk>,
    pub devices: Vec<DeviceId>,
    pub node: Option<Node>,
    pub meta: Arc<SimMeta>,
    /// A fault (kill, partition, cut from the metadata store) is on this node now.
    pub faulted: bool,
}

pub struct SimCluster {
    pub cfg: Config,
    pub net: SimNet,
    pub meta: Arc<dyn MetaStore>,
    pub catalog: Catalog,
    pub slots: Vec<Slot>,
    pub client: Client,
    pub rng: Rng,
    pub trace: Trace,
    pub kills: u64,
    pub restarts: u64,
    pub pool: Option<basalt_types::PoolId>,
}

pub fn tuning() -> Tuning {
    Tuning {
        retry: Duration::from_millis(500),
        ..Tuning::default()
    }
}

impl SimCluster {
    /// Starts the cluster: the metadata store, the pool, every node, the client and the
    /// volume; returns once every PG has a primary.
    pub async fn start(cfg: &Config, pool_first: bool) -> (SimCluster, Volume) {
        basalt_meta::clock::simulate(Some(CLOCK_START));
        let mut rng = Rng::new(cfg.seed.wrapping_mul(31).wrapping_add(7));
        let net = SimNet::new(
            rng.next(),
            (
                Duration::from_micros(cfg.net_delay.0),
                Duration::from_micros(cfg.net_delay.1),
            ),
        );
        let meta: Arc<dyn MetaStore> = Arc::new(EmbeddedStore::in_memory().expect("in memory"));
        let catalog = Catalog::new(meta.clone());
        let mut spec = PoolSpec::new("default");
        spec.replicas = cfg.replicas;
        spec.min_size = Some(cfg.min_size);
        spec.pg_count = cfg.pg_count;
        spec.object_size = cfg.object_size;
        net.boot(CLIENT);
        let client_meta: Arc<dyn MetaStore> = SimMeta::new(meta.clone());
        let client = Client::connect(
            client_meta,
            ClusterConfig {
                op_timeout: Duration::from_secs(30),
                ..ClusterConfig::default()
            },
        )
        .await
        .expect("client");
        let mut c = SimCluster {
            cfg: cfg.clone(),
            net,
            meta,
            catalog,
            slots: Vec::new(),
            client,
            rng,
            trace: Trace::default(),
            kills: 0,
            restarts: 0,
            pool: None,
        };
        // The pool is created once every node has registered, as `basalt up --nodes N` does
        // (`pool_created_before_its_nodes` in main.rs runs the other order).
        if pool_first {
            c.pool = Some(c.catalog.create_pool(&spec).await.expect("pool").id);
        }
        for _ in 0..cfg.nodes {
            c.add_node().await;
        }
        if !pool_first {
            c.pool = Some(c.catalog.create_pool(&spec).await.expect("pool").id);
        }
        let pool = c.pool.expect("pool created");
        c.client
            .wait_for_pool(pool, Duration::from_secs(300))
            .await
            .expect("every PG placed");
        let size = c.cfg.blocks * crate::model::BLOCK as u64;
        c.client
            .create_volume("v", size, "default")
            .await
            .expect("volume");
        let volume = c
            .client
            .open_volume("v", VolumeOptions::default())
            .await
            .expect("open");
        (c, volume)
    }

    fn latency(&mut self) -> Latency {
        let (lo, hi) = self.cfg.disk_latency;
        let us = Duration::from_micros;
        Latency {
            read: Spread::between(us(lo / 2), us(hi / 2)),
            write: Spread::between(us(lo), us(hi)),
            flush: Spread::between(us(lo), us(hi * 2)),
            slow: 0.01,
            slow_factor: 10,
        }
    }

    /// A new node with fresh disks.
    pub async fn add_node(&mut self) {
        let host = self.slots.len() as Host + 1;
        let mut disks = Vec::new();
        let mut devices = Vec::new();
        for k in 0..self.cfg.devices_per_node {
            let id = DeviceId(host * 10 + k);
            let disk = SimDisk::seeded(DISK_SIZE, self.rng.next());
            let opts = FormatOptions {
                device_id: id,
                object_size: self.cfg.object_size,
                journal_size: Some(JOURNAL),
                ..FormatOptions::default()
            };
            format_sim(&disk, &opts).expect("format");
            disks.push(disk);
            devices.push(id);
        }
        self.slots.push(Slot {
            host,
            id: None,
            addr: format!("sim-node-{host}:7000"),
            disks,
            devices,
            node: None,
            meta: SimMeta::new(self.meta.clone()),
            faulted: false,
        });
        self.trace.add(1, &[u64::from(host)]);
        self.boot(self.slots.len() - 1).await;
    }

    /// Starts the node of slot `i` on its disks (recovery runs on them).
    pub async fn boot(&mut self, i: usize) {
        let latency = self.latency();
        let slot = &mut self.slots[i];
        let inc = self.net.boot(slot.host);
        slot.meta = SimMeta::new(self.meta.clone());
        let mut stores = Vec::new();
        for disk in &slot.disks {
            disk.set_latency(latency);
            stores.push(Store::spawn_sim(disk, &OpenOptions::default()).expect("recovery"));
        }
        let mut config = NodeConfig::new("/nonexistent", "0.0.0.0:0".parse().expect("addr"));
        config.name = format!("n{}", slot.host);
        config.lease_ttl = self.cfg.lease_ttl;
        config.down_out_interval = self.cfg.down_out;
        config.connector = self.net.connector(slot.host, inc);
        config.peer_timeout = Duration::from_secs(2);
        config.tuning = tuning();
        let meta: Arc<dyn MetaStore> = slot.meta.clone();
        let node = Node::start_sim(config, meta, slot.id, stores, slot.addr.clone())
            .await
            .expect("node starts");
        slot.id = Some(node.id());
        self.net.attach(slot.host, inc, &slot.addr, node.service());
        self.client
            .add_local_node(node.id(), self.net.client_port(CLIENT, &slot.addr));
        slot.node = Some(node);
    }

    /// kill -9 of slot `i`: its disks keep what a power cut leaves.
    pub fn kill(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        let Some(node) = slot.node.take() else {
            return;
        };
        let mut images = Vec::new();
        for disk in &slot.disks {
            images.push(disk.crash(self.rng.next()));
        }
        node.kill();
        slot.meta.kill();
        self.net.kill(slot.host);
        for (disk, image) in slot.disks.iter().zip(&images) {
            self.trace.add(
                2,
                &[
                    u64::from(slot.host),
                    disk.durable_hash(),
                    image.durable_hash(),
                ],
            );
        }
        slot.disks = images;
        self.kills += 1;
    }

    pub async fn restart(&mut self, i: usize) {
        if self.slots[i].node.is_none() {
            self.trace.add(3, &[u64::from(self.slots[i].host)]);
            self.boot(i).await;
            self.restarts += 1;
        }
    }

    /// Marks a device out (`true`) or in, as an operator would.
    pub async fn set_out(&mut self, dev: DeviceId, out: bool) {
        let reason = out.then_some(OutReason::Operator);
        let done = self.catalog.set_device_out(dev, reason).await.is_ok();
        self.trace
            .add(4, &[u64::from(dev.0), u64::from(out), u64::from(done)]);
    }

    /// Heals every fault: partitions, cuts from the metadata store, dead nodes, devices out.
    pub async fn heal(&mut self) {
        self.net.heal_all();
        for i in 0..self.slots.len() {
            self.slots[i].meta.set_reachable(true);
            self.restart(i).await;
            self.slots[i].faulted = false;
        }
        let devices: Vec<DeviceId> = self.slots.iter().flat_map(|s| s.devices.clone()).collect();
        for dev in devices {
            if let Ok(Some(rec)) = self.catalog.get_device(dev).await
                && rec.out == Some(OutReason::Operator)
            {
                self.set_out(dev, false).await;
            }
        }
    }

    /// Stops everything at the end of a run (tasks are dropped with the runtime).
    pub fn stop(&mut self) {
        let kills = self.kills;
        for i in 0..self.slots.len() {
            self.kill(i);
        }
        self.kills = kills;
        basalt_meta::clock::simulate(None);
    }
}
