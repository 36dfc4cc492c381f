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
use basalt_node::{Node, NodeConfig, PgSummary, Tuning};
use basalt_types::{NodeId, PgId};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

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
    /// The stores of the running node (one per disk), to ask what they hold.
    pub stores: Vec<Store>,
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
    /// The gateway beside the first node (`Config::gateway`): its client, and its handle on
    /// the metadata store (cut off with the node's).
    pub gateway: Option<(Client, Arc<SimMeta>)>,
    pub rng: Rng,
    pub trace: Trace,
    pub kills: u64,
    /// Clean stops (SIGTERM), each started again soon after.
    pub stops: u64,
    pub restarts: u64,
    /// Bits flipped in client data on the disks (media faults).
    pub flips: u64,
    /// The objects a bit was flipped in, and the device: each object on one device only, so
    /// its other copies stay good and the cluster must always be able to repair it.
    pub flipped: std::collections::BTreeMap<basalt_types::ObjectId, DeviceId>,
    /// Sectors of client data made unreadable (latent sector errors), counted apart from
    /// `flips` (and in `flipped` alike).
    pub read_faults: u64,
    /// Bits flipped in the newest journal record of a killed node's disk.
    pub tail_flips: u64,
    /// Devices whose journal tail was damaged, with the PGs that made suspect there (`None`:
    /// every PG): no other device gets a bit flipped in an object of those.
    pub damaged_tails: Vec<(DeviceId, Option<Vec<basalt_types::PgId>>)>,
    /// Drives that died while their node was down, each replaced by a blank one: (old, new).
    pub replaced: Vec<(DeviceId, DeviceId)>,
    pub pool: Option<basalt_types::PoolId>,
    /// The clients' volume.
    pub volume: Option<basalt_types::VolumeId>,
}

/// How long after every fault healed (and the final reads) every PG must be clean.
pub const SETTLE: Duration = Duration::from_secs(120);

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
            gateway: None,
            rng,
            trace: Trace::default(),
            kills: 0,
            stops: 0,
            restarts: 0,
            flips: 0,
            flipped: Default::default(),
            damaged_tails: Vec::new(),
            replaced: Vec::new(),
            tail_flips: 0,
            read_faults: 0,
            pool: None,
            volume: None,
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
        c.volume = Some(volume.id());
        if cfg.gateway {
            c.start_gateway().await;
        }
        (c, volume)
    }

    /// The gateway beside the first node: a client on that node's host, reaching every node
    /// from there and reading the first node's copies first.
    async fn start_gateway(&mut self) {
        let meta = SimMeta::new(self.meta.clone());
        let handle: Arc<dyn MetaStore> = meta.clone();
        let config = ClusterConfig {
            op_timeout: Duration::from_secs(30),
            ..ClusterConfig::default()
        };
        let client = Client::connect(handle, config).await.expect("gateway");
        let host = self.slots[0].host;
        for slot in &self.slots {
            let id = slot.id.expect("registered");
            client.add_local_node(id, self.net.client_port(host, &slot.addr));
        }
        client.read_near(self.slots[0].id.expect("registered"));
        self.gateway = Some((client, meta));
    }

    /// The gateway's handle on the volume.
    pub async fn gateway_volume(&self) -> Option<Volume> {
        let (client, _) = self.gateway.as_ref()?;
        Some(
            client
                .open_volume("v", VolumeOptions::default())
                .await
                .expect("the gateway opens the volume"),
        )
    }

    /// Holds back the maps of slot `i`'s node (`true`: its map watch lags) or lets them in
    /// again; the gateway beside it loses (and regains) the metadata store meanwhile, so its
    /// map lags too.
    pub fn lag_maps(&self, i: usize, lag: bool) {
        if let Some(node) = &self.slots[i].node {
            node.hold_back_maps(lag);
        }
        if i == 0
            && let Some((_, meta)) = &self.gateway
        {
            meta.set_reachable(!lag);
        }
    }

    /// Cuts slot `i` off from the metadata store (`false`) or reconnects it, and with it the
    /// gateway beside it.
    pub fn set_meta_reachable(&self, i: usize, reachable: bool) {
        self.slots[i].meta.set_reachable(reachable);
        if i == 0
            && let Some((_, meta)) = &self.gateway
        {
            meta.set_reachable(reachable);
        }
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

    /// A fresh disk, formatted as device `id`.
    fn blank_disk(&mut self, id: DeviceId) -> SimDisk {
        let disk = SimDisk::seeded(DISK_SIZE, self.rng.next());
        let opts = FormatOptions {
            device_id: id,
            object_size: self.cfg.object_size,
            journal_size: Some(JOURNAL),
            ..FormatOptions::default()
        };
        format_sim(&disk, &opts).expect("format");
        disk
    }

    /// A new node with fresh disks.
    pub async fn add_node(&mut self) {
        let host = self.slots.len() as Host + 1;
        let mut disks = Vec::new();
        let mut devices = Vec::new();
        for k in 0..self.cfg.devices_per_node {
            let id = DeviceId(host * 10 + k);
            disks.push(self.blank_disk(id));
            devices.push(id);
        }
        self.slots.push(Slot {
            host,
            id: None,
            addr: format!("sim-node-{host}:7000"),
            disks,
            devices,
            stores: Vec::new(),
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
        let gateway_host = self.slots[0].host;
        let slot = &mut self.slots[i];
        let inc = self.net.boot(slot.host);
        slot.meta = SimMeta::new(self.meta.clone());
        let mut stores = Vec::new();
        for disk in &slot.disks {
            disk.set_latency(latency);
            let opts = OpenOptions {
                writeback_idle: self.cfg.writeback_idle,
                ..OpenOptions::default()
            };
            stores.push(Store::spawn_sim(disk, &opts).expect("recovery"));
        }
        let mut config = NodeConfig::new("/nonexistent", "0.0.0.0:0".parse().expect("addr"));
        config.name = format!("n{}", slot.host);
        config.lease_ttl = self.cfg.lease_ttl;
        config.down_out_interval = self.cfg.down_out;
        config.connector = self.net.connector(slot.host, inc);
        config.peer_timeout = Duration::from_secs(2);
        config.tuning = Tuning {
            map_lag: self.cfg.map_lag,
            ..tuning()
        };
        let meta: Arc<dyn MetaStore> = slot.meta.clone();
        slot.stores = stores.clone();
        let node = Node::start_sim(config, meta, slot.id, stores, slot.addr.clone())
            .await
            .expect("node starts");
        slot.id = Some(node.id());
        self.net.attach(slot.host, inc, &slot.addr, node.service());
        self.client
            .add_local_node(node.id(), self.net.client_port(CLIENT, &slot.addr));
        if let Some((gateway, _)) = &self.gateway {
            let port = self.net.client_port(gateway_host, &slot.addr);
            gateway.add_local_node(node.id(), port);
        }
        if (i as u32) < self.cfg.near_reads {
            self.client.read_near(node.id());
        }
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

    /// A clean stop of slot `i` (SIGTERM): the node leaves the cluster at once, its stores
    /// close (everything written back and flushed), then the process is gone.
    pub async fn stop_node(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        let Some(node) = slot.node.take() else {
            return;
        };
        node.shutdown().await;
        slot.meta.kill();
        self.net.kill(slot.host);
        self.trace.add(4, &[u64::from(slot.host)]);
        self.stops += 1;
    }

    pub async fn restart(&mut self, i: usize) {
        if self.slots[i].node.is_none() {
            self.trace.add(3, &[u64::from(self.slots[i].host)]);
            self.boot(i).await;
            self.restarts += 1;
        }
    }

    /// Media corruption on a live node: flips one bit in a block of client data in the slots
    /// of one of its disks. Only where the cluster can repair it: the block's object is held
    /// at the same version by a device of another running node (so a good copy exists; a
    /// single up-to-date copy, the others waiting for recovery, is not flipped: that would be a
    /// double failure), and no other device had a bit of that object flipped (two bad copies
    /// of a 2-copy object are a double failure too). With `read_faults`, half of the time
    /// (by the bit drawn) the sector holding the byte becomes unreadable instead. Returns the
    /// device, the byte, and whether its sector was made unreadable.
    pub async fn flip(
        &mut self,
        i: usize,
        block_of: impl Fn(u64) -> Option<u64>,
    ) -> Option<(DeviceId, u64, bool)> {
        self.slots[i].node.as_ref()?;
        let k = self.rng.range(0, self.slots[i].disks.len() as u64 - 1) as usize;
        let disk = self.slots[i].disks[k].clone();
        let slots = disk.regions()?.slots;
        let dev = self.slots[i].devices[k];
        let (pool, volume) = (self.pool?, self.volume?);
        let object_size = u64::from(self.cfg.object_size);
        let oid_of = |block: u64| {
            basalt_types::ObjectId::new(
                pool,
                volume,
                block * crate::model::BLOCK as u64 / object_size,
            )
        };
        let blocks: Vec<(u64, u64)> = valued_blocks(&disk, slots.start, slots.end)
            .into_iter()
            .filter_map(|(off, value)| block_of(value).map(|b| (off, b)))
            .filter(|(_, b)| self.flipped.get(&oid_of(*b)).is_none_or(|d| *d == dev))
            .filter(|(_, b)| !self.suspect_elsewhere(dev, &oid_of(*b)))
            .collect();
        if blocks.is_empty() {
            return None;
        }
        let (off, block) = blocks[self.rng.range(0, blocks.len() as u64 - 1) as usize];
        let byte = off + self.rng.range(0, crate::model::BLOCK as u64 - 1);
        let bit = self.rng.range(0, 7) as u8;
        let oid = oid_of(block);
        let held = |info: Option<basalt_engine::ObjectInfo>| info.filter(|o| !o.deleted);
        let version = held(self.slots[i].stores[k].object_info(oid).await.ok()?)?.version;
        let mut elsewhere = false;
        for (j, slot) in self.slots.iter().enumerate() {
            if j == i || slot.node.is_none() || slot.faulted {
                continue;
            }
            for store in &slot.stores {
                let info = held(store.object_info(oid).await.ok().flatten());
                elsewhere |= info.is_some_and(|o| o.version == version);
            }
        }
        if !elsewhere {
            return None;
        }
        // No further draw: a seed without read faults keeps its schedule.
        let unreadable = self.cfg.faults.read_faults && bit < 4;
        if unreadable {
            let sector = byte / 512 * 512;
            disk.fail_reads(sector..sector + 512);
            self.read_faults += 1;
        } else {
            disk.flip_bit(byte, bit);
            self.flips += 1;
        }
        self.flipped.insert(oid, dev);
        Some((dev, byte, unreadable))
    }

    /// Media damage a killed node meets when it restarts, in the newest record of one of its
    /// disks' crash images: half of the time a bit flipped in a journaled data block of a
    /// record of block writes, else a bit flipped in the record's header past the fields a
    /// journal scan reads (any record: PG records too; the store then cannot tell which PGs
    /// the record held). Either way its store drops the record as a torn tail although it may
    /// have been acknowledged. Only where the cluster can repair it: each object write of the
    /// record is held, at its version or newer, by a device of another running node, and no
    /// other device had a bit of those objects flipped. Returns the device and the byte
    /// flipped.
    pub async fn damage_tail(&mut self, i: usize) -> Option<(DeviceId, u64)> {
        // After a drive was lost, a PG whose copies on it were needed to prove what an
        // interval wrote would have only suspect ones left: a double failure.
        if !self.replaced.is_empty() {
            return None;
        }
        let k = self.rng.range(0, self.slots[i].disks.len() as u64 - 1) as usize;
        let image = self.slots[i].disks[k].clone();
        let dev = self.slots[i].devices[k];
        let (byte, oids, whole) = if self.rng.chance(0.5) {
            let header = basalt_engine::sim::newest_record_header(&image)?;
            let range = header.damageable;
            let writes: Vec<_> = header
                .entries
                .iter()
                .filter(|e| !e.pg_record)
                .map(|e| (e.oid, e.version))
                .collect();
            // The store cannot tell which PGs the record held: every PG of the device turns
            // suspect, so no object of any has a bad copy elsewhere.
            if !self.held_elsewhere(i, dev, &writes).await || !self.no_flips_but_on(dev, None) {
                return None;
            }
            let byte = range.start + self.rng.range(0, range.end - range.start - 1);
            (
                byte,
                writes.into_iter().map(|w| w.0).collect::<Vec<_>>(),
                true,
            )
        } else {
            let entries = basalt_engine::sim::newest_record(&image)?;
            let writes: Vec<_> = entries.iter().map(|e| (e.0, e.1)).collect();
            let oids: Vec<_> = writes.iter().map(|w| w.0).collect();
            if !self.held_elsewhere(i, dev, &writes).await
                || !self.no_flips_but_on(dev, Some(&oids))
            {
                return None;
            }
            let blocks: Vec<u64> = entries.iter().flat_map(|e| e.2.iter().copied()).collect();
            if blocks.is_empty() {
                return None;
            }
            let off = blocks[self.rng.range(0, blocks.len() as u64 - 1) as usize];
            let byte = off + self.rng.range(0, crate::model::BLOCK as u64 - 1);
            (byte, writes.into_iter().map(|w| w.0).collect(), false)
        };
        let bit = self.rng.range(0, 7) as u8;
        // Not where a later record proves the damaged one durable: the store then refuses to
        // open (a failed device, which the harness does not model) instead of cutting.
        let trial = image.crash_image(0);
        trial.flip_bit(byte, bit);
        Store::spawn_sim(&trial, &OpenOptions::default())
            .ok()?
            .crash();
        image.flip_bit(byte, bit);
        self.tail_flips += 1;
        let map = self.client.map();
        let pgs = (!whole).then(|| oids.iter().filter_map(|o| Some(map.locate(o)?.0)).collect());
        self.damaged_tails.push((dev, pgs));
        for oid in oids {
            self.flipped.insert(oid, dev);
        }
        Some((dev, byte))
    }

    /// A drive of killed slot `i` dies while its node is down: the operator marks it out,
    /// declares it lost (`basalt device lost`: its data is gone, so PGs must not wait for it
    /// where it was an interval's one witness that is not suspect) and puts a blank drive (a
    /// new device) in its place, so the copies it held are gone for good and must be rebuilt
    /// from the others. Only where they can be: every object and tombstone
    /// of its crash image is held, at its version or newer, by a device of another running
    /// node; no other device had a bit flipped in them or its journal tail damaged (its copies
    /// would be suspect). Once per run. Returns the old and the new device.
    pub async fn replace_disk(&mut self, i: usize) -> Option<(DeviceId, DeviceId)> {
        if !self.replaced.is_empty() || !self.damaged_tails.is_empty() {
            return None;
        }
        let k = self.rng.range(0, self.slots[i].disks.len() as u64 - 1) as usize;
        let old = self.slots[i].devices[k];
        let trial = self.slots[i].disks[k].crash_image(0);
        let store = Store::spawn_sim(&trial, &OpenOptions::default()).ok()?;
        let listed = store.list_objects().await;
        store.crash();
        let writes: Vec<_> = listed.ok()?.iter().map(|o| (o.oid, o.version)).collect();
        if !self.held_elsewhere(i, old, &writes).await || !self.no_flips_but_on(old, None) {
            return None;
        }
        // Device ids are host * 10 + k (k < devices_per_node <= 2).
        let new = DeviceId(old.0 + 5);
        self.slots[i].disks[k] = self.blank_disk(new);
        self.slots[i].devices[k] = new;
        self.set_out(old, true).await;
        self.replaced.push((old, new));
        self.declare_lost().await;
        Some((old, new))
    }

    /// Whether no device but `dev` had a bit flipped in an object of the PGs of `oids` (`None`:
    /// of any PG). A journal tail the store cuts makes whole PGs suspect on the device (what
    /// it lacks proves nothing), so a bad copy elsewhere of any object of them, newer there
    /// by a write that never reached `dev`, would have no good copy left: a double failure
    /// (seed 200424: a flip on one member, a partial write only it got, a header flip on the
    /// other's tail).
    fn no_flips_but_on(&self, dev: DeviceId, oids: Option<&[basalt_types::ObjectId]>) -> bool {
        let map = self.client.map();
        let pg = |oid: &basalt_types::ObjectId| map.locate(oid).map(|(id, _)| id);
        let pgs: Option<Vec<_>> = oids.map(|o| o.iter().filter_map(pg).collect());
        self.flipped.iter().all(|(oid, d)| {
            *d == dev
                || pgs
                    .as_ref()
                    .is_some_and(|p| !pg(oid).is_some_and(|g| p.contains(&g)))
        })
    }

    /// Whether a device other than `dev` had its journal tail damaged in `oid`'s PG (or in
    /// every PG): its copies there are suspect, so a flip here would be a double failure.
    fn suspect_elsewhere(&self, dev: DeviceId, oid: &basalt_types::ObjectId) -> bool {
        let map = self.client.map();
        let pg = map.locate(oid).map(|(id, _)| id);
        self.damaged_tails.iter().any(|(d, pgs)| {
            *d != dev
                && pgs
                    .as_ref()
                    .is_none_or(|p| pg.is_none_or(|g| p.contains(&g)))
        })
    }

    /// Each of `writes` (object, version) is of the test's volume, held at that version or
    /// newer by a device of another running node than `i`, and had no bit flipped on another
    /// device than `dev`.
    async fn held_elsewhere(
        &self,
        i: usize,
        dev: DeviceId,
        writes: &[(basalt_types::ObjectId, basalt_types::Version)],
    ) -> bool {
        let (Some(pool), Some(volume)) = (self.pool, self.volume) else {
            return false;
        };
        for (oid, version) in writes {
            let ours = oid.pool == pool && oid.volume == volume;
            if !ours || self.flipped.get(oid).is_some_and(|d| *d != dev) {
                return false;
            }
            let mut elsewhere = false;
            for (j, slot) in self.slots.iter().enumerate() {
                if j == i || slot.node.is_none() || slot.faulted {
                    continue;
                }
                for store in &slot.stores {
                    let info = store.object_info(*oid).await.ok().flatten();
                    elsewhere |= info.is_some_and(|o| o.version >= *version);
                }
            }
            if !elsewhere {
                return false;
            }
        }
        true
    }

    /// Marks a device out (`true`) or in, as an operator would.
    pub async fn set_out(&mut self, dev: DeviceId, out: bool) {
        let reason = out.then_some(OutReason::Operator);
        let done = self.catalog.set_device_out(dev, reason).await.is_ok();
        self.trace
            .add(4, &[u64::from(dev.0), u64::from(out), u64::from(done)]);
    }

    /// Declares the replaced drives lost (`basalt device lost`), as an operator does once
    /// the store lets it: refused while the dead drive's node is still registered (its lease
    /// not yet expired) and has not reported the drive down; tried again at each replacement
    /// and at the heal.
    async fn declare_lost(&mut self) {
        for (old, _) in self.replaced.clone() {
            if let Ok(Some(rec)) = self.catalog.get_device(old).await
                && rec.lost
            {
                continue;
            }
            let lost = self.catalog.mark_device_lost(old).await.is_ok();
            self.trace.add(4, &[u64::from(old.0), 2, u64::from(lost)]);
        }
    }

    /// Heals every fault: partitions, cuts from the metadata store, dead nodes, devices out.
    pub async fn heal(&mut self) {
        self.net.heal_all();
        for i in 0..self.slots.len() {
            self.set_meta_reachable(i, true);
            self.lag_maps(i, false);
            self.restart(i).await;
            self.slots[i].faulted = false;
        }
        self.declare_lost().await;
        let devices: Vec<DeviceId> = self.slots.iter().flat_map(|s| s.devices.clone()).collect();
        for dev in devices {
            if let Ok(Some(rec)) = self.catalog.get_device(dev).await
                && rec.out == Some(OutReason::Operator)
            {
                self.set_out(dev, false).await;
            }
        }
    }

    /// Waits (virtual time, up to [`SETTLE`]) until every PG of the pool is active and clean on
    /// its primary, once every fault is healed: a PG that stays inactive or unclean for good
    /// (waiting for an operator although every device is back) is a liveness failure the
    /// final reads miss when no client block lies in it. Returns what is not clean then.
    pub async fn settled(&self) -> Result<(), String> {
        let deadline = Instant::now() + SETTLE;
        loop {
            let pgs: Vec<_> = self
                .slots
                .iter()
                .filter_map(|s| s.node.as_ref())
                .flat_map(|n| n.status().pgs)
                .filter(|p| Some(p.pg.pool) == self.pool)
                .collect();
            // Every PG shown, and each row of it (a deposed primary may still show one) active
            // and clean.
            let settled = |p: &PgSummary| p.status.state == "active" && p.clean;
            let shown: BTreeSet<PgId> = pgs.iter().map(|p| p.pg).collect();
            let unsettled: BTreeSet<PgId> =
                pgs.iter().filter(|p| !settled(p)).map(|p| p.pg).collect();
            if shown.len() == self.cfg.pg_count as usize && unsettled.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let clean = shown.len() - unsettled.len();
                let not: Vec<String> = pgs
                    .iter()
                    .filter(|p| !settled(p))
                    .map(|p| {
                        format!(
                            "{} on {}: {} {}",
                            p.pg,
                            p.device,
                            p.status.state,
                            p.status.why.as_deref().unwrap_or("")
                        )
                    })
                    .collect();
                return Err(format!(
                    "{clean} of {} PGs clean {SETTLE:?} after every fault healed: {not:?}",
                    self.cfg.pg_count
                ));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Reads the running nodes answered from their own copies as members (`ReadReplica`), and
    /// those they refused.
    pub fn replica_reads(&self) -> (u64, u64) {
        self.slots
            .iter()
            .filter_map(|s| s.node.as_ref())
            .map(|n| n.status())
            .fold((0, 0), |(a, b), s| {
                (a + s.replica_reads, b + s.replica_reads_refused)
            })
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

/// The 4 KiB blocks of `disk` in `start..end` that look like a client's value (a pattern
/// block: first and last word alike, not zero): (offset, value).
fn valued_blocks(disk: &SimDisk, start: u64, end: u64) -> Vec<(u64, u64)> {
    let raw = disk.read(start, (end - start) as usize);
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    raw.chunks_exact(crate::model::BLOCK)
        .enumerate()
        .filter_map(|(n, b)| {
            let first = word(&b[..8]);
            (first != 0 && first == word(&b[b.len() - 8..]))
                .then_some((start + (n * crate::model::BLOCK) as u64, first))
        })
        .collect()
}
