//! [`Node`]: starting and stopping a storage node.

use crate::admin::{AdminHandler, NodeStatus};
use crate::collect::CollectConfig;
use crate::config::NodeConfig;
use crate::drain::{Detached, InFlight, Tracked};
use crate::error::NodeError;
use crate::lease::Fence;
use crate::mapstate::MapState;
use crate::peers::Peers;
use crate::pg::{Ctx, Pgs, Recovery};
use crate::readlease::ReadLeases;
use crate::server::Limits;
use crate::service::{NodeService, NodeShared};
use crate::volumes::Volumes;
use crate::{
    advertise, collect, devices, faults, heartbeat, identity, leader, lease, server, volumes,
};
use crate::{incarnation, leasebound, stopmark};
use basalt_engine::{DirLock, Store};
use basalt_meta::{Catalog, MetaStore, NodeRecord};
use basalt_placement::ClusterMap;
use basalt_proto::Service;
use basalt_types::{DeviceId, Epoch, NodeId};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running storage node.
pub struct Node {
    shared: Arc<NodeShared>,
    catalog: Catalog,
    local_addr: SocketAddr,
    stop_tx: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    computations: Arc<AtomicU64>,
    /// Requests being answered (over TCP or in process): a leaving node finishes them first.
    in_flight: Arc<InFlight>,
    /// A store whose oldest I/O is older than this hangs: a leaving node does not wait for it
    /// to close (zero: it always waits).
    stall_limit: Duration,
    /// Held while the node runs: no other process may use its data directory (none in the
    /// simulator, which has no directories).
    _dir_lock: Option<DirLock>,
    /// Where a clean stop leaves its mark: until when its read-lease grants run
    /// (`stopmark.rs`; none in the simulator).
    stop_mark: Option<std::path::PathBuf>,
    /// The service its PGs reach their members on this node through (held weakly there): kept
    /// alive with the node, listener or not.
    _local: Arc<dyn Service>,
}

/// What [`Node::run`] starts a node from.
pub(crate) struct Parts {
    pub config: NodeConfig,
    pub meta: Arc<dyn MetaStore>,
    pub serve_meta: bool,
    pub catalog: Catalog,
    pub id: NodeId,
    pub stores: BTreeMap<DeviceId, Store>,
    /// Registered devices whose stores did not open, and why (kept reported down).
    pub unopened: BTreeMap<DeviceId, String>,
    /// The address other nodes and clients reach it at.
    pub addr: String,
    pub local_addr: SocketAddr,
    /// The data-path listener (`None`: reached only in process or through a simulated network).
    pub listener: Option<tokio::net::TcpListener>,
    /// The read leases this process grants, made by its start: they wait for those earlier
    /// processes of the node granted, for none when its id was allocated now, what a clean
    /// stop's mark says (`stopmark.rs`), else the longer of a lease length and the bound the
    /// last start left (`leasebound.rs`). A failed start asks them when its grants end.
    pub leases: Arc<ReadLeases>,
    /// The node's durability incarnation (`incarnation.rs`).
    pub incarnation: u64,
}

impl Node {
    /// Starts a node: locks its data directory, allocates or loads its id, opens (formatting if
    /// blank) and registers its devices, lists the volume records, listens, registers itself
    /// under a lease (and again whenever it loses it, `lease.rs`), follows the cluster map and
    /// the volume records, collects the objects of deleted volumes, scrubs its PGs in the
    /// background (`pg/scrub.rs`), reports faulty devices down (`faults.rs`) and, if eligible,
    /// campaigns to be the leader that publishes maps.
    ///
    /// With `serve_meta`, the node also answers metadata requests for `meta` (single-process
    /// clusters, whose embedded store other processes cannot open).
    pub async fn start(
        config: NodeConfig,
        meta: Arc<dyn MetaStore>,
        serve_meta: bool,
    ) -> Result<Node, NodeError> {
        let dir_lock = basalt_engine::lock_dir(&config.data_dir).map_err(NodeError::DataDir)?;
        let catalog = Catalog::new(meta.clone());
        let (id, fresh) = identity::load_or_allocate(&catalog, &config.data_dir).await?;
        if let Some(removed) = catalog.removed_node(id).await? {
            // `basalt node remove`: its devices' data is stale (registering would be refused
            // too; this says so before any device is opened).
            return Err(basalt_meta::MetaError::NodeRemoved {
                node: id.to_string(),
                by: removed.by,
                at: removed.at,
            }
            .into());
        }
        let mark = stopmark::take(&config.data_dir).map_err(|source| NodeError::Io {
            path: config.data_dir.join("leases-ended").display().to_string(),
            source,
        })?;
        let bound = leasebound::read(&config.data_dir).map_err(|source| NodeError::Io {
            path: config.data_dir.join("lease-bound").display().to_string(),
            source,
        })?;
        let earlier_grants = earlier_grants(fresh, mark, bound, &config);
        // Before this process can grant anything: a later start after a crash waits this long.
        let lease_length = config.heartbeat.lease_length();
        leasebound::write(&config.data_dir, earlier_grants.max(lease_length)).map_err(
            |source| NodeError::Io {
                path: config.data_dir.join("lease-bound").display().to_string(),
                source,
            },
        )?;
        let kept = incarnation::take(&config.data_dir).map_err(|source| NodeError::Io {
            path: config.data_dir.join("stores-closed").display().to_string(),
            source,
        })?;
        let incarnation = kept.unwrap_or_else(incarnation::fresh);
        let data_dir = config.data_dir.clone();
        let leases = Arc::new(ReadLeases::new(lease_length, earlier_grants));
        let started = Node::open(
            config,
            meta,
            serve_meta,
            catalog,
            id,
            leases.clone(),
            incarnation,
        )
        .await;
        match started {
            Ok(mut node) => {
                node.stop_mark = Some(data_dir);
                node._dir_lock = Some(dir_lock);
                Ok(node)
            }
            Err(e) => {
                // Nothing was acknowledged in this incarnation (the fence opens only once the
                // node registered, the last step that can fail), and the stores lost nothing
                // by opening: the next start may keep the one a clean stop left, as this one
                // would have. Written back under the directory lock, before another process
                // may take it; if that fails, the next start draws a new one (a flush fails
                // that need not, none succeeds that must not).
                if let Some(kept) = kept
                    && let Err(w) = incarnation::write(&data_dir, kept)
                {
                    tracing::warn!("putting back the stores-closed mark after a failed start: {w}");
                }
                // The read leases' clean-stop mark too, as a clean stop writes it: when every
                // grant ends that an earlier process or this one (its heartbeats may have
                // granted some before the registration failed) may have made, so that the next
                // start does not wait a whole lease length again. If that fails, it waits the
                // bound.
                if leases.enabled() || mark.is_some() {
                    let until = leases.close();
                    if let Err(w) = stopmark::write(&data_dir, until) {
                        tracing::warn!(
                            "putting back the clean-stop mark after a failed start: {w}"
                        );
                    }
                }
                drop(dir_lock);
                Err(e)
            }
        }
    }

    /// The part of [`Node::start`] after the marks are taken: opens the devices, listens, and
    /// [`Node::run`]s the node (without its directory lock and stop mark, which `start` adds).
    async fn open(
        config: NodeConfig,
        meta: Arc<dyn MetaStore>,
        serve_meta: bool,
        catalog: Catalog,
        id: NodeId,
        leases: Arc<ReadLeases>,
        incarnation: u64,
    ) -> Result<Node, NodeError> {
        let devices::Opened { stores, unopened } = devices::open_all(
            &catalog,
            id,
            &config.devices,
            config.object_size,
            config.io,
            config.store_threads,
        )
        .await?;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| NodeError::Listen {
                addr: config.listen.to_string(),
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| NodeError::Listen {
            addr: config.listen.to_string(),
            source,
        })?;
        let addr = advertise::address(config.advertise.as_deref(), local_addr)?;
        Node::run(Parts {
            config,
            meta,
            serve_meta,
            catalog,
            id,
            stores,
            unopened,
            addr,
            local_addr,
            listener: Some(listener),
            leases,
            incarnation,
        })
        .await
    }

    /// The part of [`Node::start`] after the devices are open and the address is known: PG
    /// records, shared state, the background tasks and the registration under a lease.
    pub(crate) async fn run(parts: Parts) -> Result<Node, NodeError> {
        let Parts {
            config,
            meta,
            serve_meta,
            catalog,
            id,
            stores,
            unopened,
            addr,
            local_addr,
            listener,
            leases,
            incarnation,
        } = parts;
        let unopened = devices::report_missing(&catalog, id, &stores, unopened).await?;
        let maps = Arc::new(MapState::new(stores.clone()));
        let peers = Arc::new(Peers::new(
            id,
            config.connector.clone(),
            config.peer_timeout,
        ));
        let ctx = Arc::new(Ctx {
            maps: maps.clone(),
            catalog: catalog.clone(),
            peers: peers.clone(),
            tuning: config.tuning.clone(),
            recovery: Recovery::new(&config.tuning),
            leases,
            stopped: Default::default(),
            sessions: Default::default(),
        });
        let pgs = Pgs::new(ctx, stores.clone());
        pgs.scrub
            .rate
            .store(config.scrub_bytes_per_sec, Ordering::Relaxed);
        pgs.load().await.map_err(|source| NodeError::Device {
            path: "(loading PG records)".into(),
            source,
        })?;
        let in_flight = Arc::new(InFlight::default());
        let shared = Arc::new(NodeShared {
            id,
            in_flight: in_flight.clone(),
            maps,
            pgs: pgs.clone(),
            admin: AdminHandler {
                meta: serve_meta.then_some(meta),
                name: config.name.clone(),
                addr: addr.clone(),
                started: Instant::now(),
            },
            stopping: Default::default(),
            fence: Arc::new(Fence::new(id, config.lease_ttl)),
            server_stats: Arc::default(),
            volumes: Volumes::new(Some(catalog.clone())),
            collector: Default::default(),
            replica_reads: Default::default(),
            hung: watch::channel(BTreeSet::new()).0,
            latency: Default::default(),
            removed: watch::channel(None).0,
            incarnation,
        });
        if let Some((map, _)) = catalog.get_map::<ClusterMap>().await? {
            shared.maps.offer(map);
        }
        // Writes are checked against the volume records: the node knows them all before it
        // serves (the fence opens only after registration, below).
        shared.volumes.list_now().await?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let service = Arc::new(Tracked {
            inner: Arc::new(NodeService {
                shared: shared.clone(),
            }),
            in_flight: in_flight.clone(),
        });
        let local: Arc<dyn Service> = service.clone();
        peers.set_local(Arc::downgrade(&local));
        let mut tasks = vec![
            tokio::spawn(follow_maps(
                catalog.clone(),
                shared.clone(),
                stop_rx.clone(),
            )),
            tokio::spawn(drive_pgs(shared.clone(), stop_rx.clone())),
            tokio::spawn(crate::pg::throttle::follow(
                catalog.clone(),
                shared.pgs.ctx.recovery.throttle.clone(),
                stop_rx.clone(),
            )),
            tokio::spawn(heartbeat::run(
                catalog.clone(),
                shared.clone(),
                config.connector.clone(),
                peers.clone(),
                config.heartbeat.clone(),
                stop_rx.clone(),
            )),
            tokio::spawn(volumes::follow(
                catalog.clone(),
                shared.clone(),
                stop_rx.clone(),
            )),
            tokio::spawn(collect::run(
                catalog.clone(),
                shared.clone(),
                CollectConfig {
                    interval: config.collect_interval,
                    rate: config.collect_rate,
                },
                stop_rx.clone(),
            )),
            tokio::spawn(crate::pg::scrub::background(
                shared.pgs.clone(),
                stop_rx.clone(),
            )),
            tokio::spawn(crate::latency::watch(
                stores.clone(),
                shared.latency.clone(),
                stop_rx.clone(),
            )),
            tokio::spawn(faults::watch(
                catalog.clone(),
                stores,
                unopened,
                shared.hung.clone(),
                faults::FaultConfig {
                    checksum_limit: config.checksum_error_limit,
                    checksum_window: config.checksum_error_window,
                    stall_limit: config.device_stall_timeout,
                },
                stop_rx.clone(),
            )),
        ];
        if let Some(listener) = listener {
            tasks.push(tokio::spawn(server::serve(
                listener,
                service,
                shared.fence.clone(),
                Limits::default(),
                shared.server_stats.clone(),
                stop_rx.clone(),
            )));
        }
        let record = NodeRecord::new(id, config.name.clone(), addr.clone());
        let registration = match catalog.register_node(&record, config.lease_ttl).await {
            Ok(registration) => registration,
            Err(e) => {
                // Not started: what was spawned (the server, with its fence closed; the PGs'
                // drivers and primaries) must not go on in the background, holding the stores.
                let _ = stop_tx.send(true);
                for task in &tasks {
                    task.abort();
                }
                for task in tasks {
                    let _ = task.await;
                }
                stop_primaries(&shared);
                return Err(e.into());
            }
        };
        let computations = Arc::new(AtomicU64::new(0));
        shared.fence.confirmed(*registration.confirmed().borrow());
        tasks.push(tokio::spawn(lease::maintain(
            catalog.clone(),
            record,
            config.lease_ttl,
            shared.clone(),
            registration,
            stop_rx.clone(),
        )));
        if config.leader_eligible {
            let cfg = leader::LeaderConfig {
                name: format!("{id}@{addr}"),
                ttl: config.leader_ttl.min(config.lease_ttl),
                down_out_interval: config.down_out_interval,
                computations: computations.clone(),
                reports: config.reports.clone(),
            };
            tasks.push(tokio::spawn(leader::run(catalog.clone(), cfg, stop_rx)));
        }
        tracing::info!(node = %id, %addr, "node started");
        Ok(Node {
            shared,
            catalog,
            local_addr,
            stop_tx,
            tasks,
            computations,
            in_flight,
            stall_limit: config.device_stall_timeout,
            stop_mark: None,
            _dir_lock: None,
            _local: local,
        })
    }

    /// Simulation: starts a node over stores already open (`Store::spawn_sim`), reached at
    /// `addr` through the simulator's network (`config.connector`): no data directory, no
    /// listener. `id` is the node's id from an earlier start (`None`: a new node, allocated from
    /// the catalog). The rest is [`Node::start`].
    #[cfg(feature = "sim")]
    pub async fn start_sim(
        config: NodeConfig,
        meta: Arc<dyn MetaStore>,
        id: Option<NodeId>,
        stores: Vec<Store>,
        addr: String,
    ) -> Result<Node, NodeError> {
        let catalog = Catalog::new(meta.clone());
        let earlier_grants = earlier_grants(id.is_none(), None, None, &config);
        let leases = Arc::new(ReadLeases::new(
            config.heartbeat.lease_length(),
            earlier_grants,
        ));
        let id = match id {
            Some(id) => id,
            None => NodeId(catalog.next_id(basalt_meta::IdKind::Node).await? as u32),
        };
        let mut map = BTreeMap::new();
        for store in stores {
            let dev = store.info().device_id;
            devices::register(&catalog, id, &store, &format!("sim:{dev}"), "ssd").await?;
            map.insert(dev, store);
        }
        Node::run(Parts {
            config,
            meta,
            serve_meta: false,
            catalog,
            id,
            stores: map,
            unopened: BTreeMap::new(),
            addr,
            local_addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            listener: None,
            leases,
            incarnation: incarnation::fresh(),
        })
        .await
    }

    /// Holds newer maps back from this node (`true`), as a map watch that lags would, or lets
    /// them in again (the newest one held back is installed at once, as the watch catching up
    /// would). For tests.
    #[cfg(feature = "sim")]
    pub fn hold_back_maps(&self, held: bool) {
        self.shared.maps.hold_back(held);
    }

    /// Simulation: kill -9. Refuses every request from now on, drops the node's tasks, ends
    /// its PGs' primaries and stops every store at once (`Store::crash`: take the disks' crash
    /// images first; a store on an I/O thread is let go, `Store::detach`). Nothing is flushed,
    /// nothing is revoked: its lease expires by its TTL.
    #[cfg(feature = "sim")]
    pub fn kill(mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        for task in self.tasks.drain(..) {
            task.abort();
        }
        for store in self.shared.maps.stores().values() {
            store.crash();
            // A store on an I/O thread (in-process tests) waits for I/O the crashed disk
            // never completes: dropping it must not wait for that thread.
            store.detach();
        }
        self.stop_primaries();
    }

    /// Ends every PG this node leads: their drivers return (else, in a process that goes on,
    /// such as a test's, they would keep peering on behalf of a stopped node).
    fn stop_primaries(&self) {
        stop_primaries(&self.shared);
    }

    /// Tests: the store of one of this node's devices, to change a copy behind the PG's back
    /// (as media or a bug would) and check that scrub finds it.
    #[cfg(feature = "sim")]
    pub fn store_for_test(&self, dev: basalt_types::DeviceId) -> Option<Store> {
        self.shared.maps.stores().get(&dev).cloned()
    }

    pub fn id(&self) -> NodeId {
        self.shared.id
    }

    /// Requests this node is answering now (over TCP or in process).
    pub fn requests_in_flight(&self) -> u64 {
        self.in_flight.count()
    }

    /// The address the data-path listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The node as a [`Service`], for clients in the same process: each call but reads runs as
    /// a task of its own, as a request over TCP does, so that a caller dropping its future does
    /// not cancel it halfway ([`Detached`]).
    pub fn service(&self) -> Arc<dyn Service> {
        Arc::new(Detached(Arc::new(Tracked {
            inner: Arc::new(NodeService {
                shared: self.shared.clone(),
            }),
            in_flight: self.in_flight.clone(),
        })))
    }

    pub fn epoch(&self) -> Epoch {
        self.shared.maps.epoch()
    }

    /// Resolves once the cluster removed this node (`basalt node remove`) while it was cut off
    /// from the metadata store, with why: it acknowledges nothing from then on (its lease is
    /// gone and it cannot register again), and its process should stop (`basalt node` does; a
    /// program that embeds a node must watch this itself).
    pub async fn removed(&self) -> String {
        let mut rx = self.shared.removed.subscribe();
        let why = rx.wait_for(|r| r.is_some()).await.map(|r| r.clone());
        match why {
            Ok(Some(why)) => why,
            // The sender lives as long as the node.
            _ => std::future::pending().await,
        }
    }

    pub fn status(&self) -> NodeStatus {
        self.shared.admin.status(&self.shared)
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// How many times this node, as leader, has computed a cluster map (whether or not it
    /// changed). Tests use it to check what wakes the leader.
    pub fn map_computations(&self) -> u64 {
        self.computations.load(Ordering::Relaxed)
    }

    /// Waits until the node holds a map in which each of its devices is up and a member of
    /// some PG's `up` set (or `timeout`). Returns whether it did.
    pub async fn wait_until_placed(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut rx = self.shared.maps.subscribe();
        loop {
            if self.is_placed() {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, rx.changed()).await.is_err() {
                return self.is_placed();
            }
        }
    }

    fn is_placed(&self) -> bool {
        let map = self.shared.maps.map();
        let used: std::collections::BTreeSet<_> = map
            .pools
            .values()
            .flat_map(|p| p.pgs.iter().flat_map(|pg| pg.up.iter().copied()))
            .collect();
        !map.pools.is_empty()
            && self
                .shared
                .maps
                .stores()
                .keys()
                .all(|d| used.contains(d) && map.is_up(*d))
    }

    /// Leaves the cluster at once (a clean stop, e.g. on SIGTERM): refuses new data-path
    /// requests (`ShuttingDown`, which clients retry elsewhere), finishes the requests in
    /// flight (for at most `DRAIN_LIMIT`, 5 s), then closes its fence and revokes its lease, so
    /// that its record vanishes and the leader marks its devices down now rather than when the
    /// lease would have expired, resigns the leadership if it holds it, stops listening, and
    /// closes every store (which drains and syncs it). Gives the metadata store at most
    /// `STOP_LIMIT` (5 s) for the revocation and resignation (if it does not answer, the lease
    /// expires by its TTL). Then it grants no more read leases and leaves a mark in its data
    /// directory saying until when the last one runs, so that the next start waits only for
    /// what is left of it before promising new terms (`stopmark.rs`).
    pub async fn shutdown(mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        if !self.in_flight.wait_idle(DRAIN_LIMIT).await {
            tracing::warn!(
                node = %self.shared.id,
                "{} request(s) still running after {DRAIN_LIMIT:?}; leaving anyway (their \
                 answers are refused)",
                self.in_flight.count()
            );
        }
        let _ = self.stop_tx.send(true);
        let tasks = futures::future::join_all(self.tasks.iter_mut());
        if tokio::time::timeout(STOP_LIMIT, tasks).await.is_err() {
            tracing::warn!(
                node = %self.shared.id,
                "the metadata store did not confirm the leave within {STOP_LIMIT:?}; the \
                 node's lease expires by its TTL"
            );
            for task in &self.tasks {
                task.abort();
            }
        }
        self.tasks.clear();
        self.stop_primaries();
        // It left: no more read leases; the last one granted runs out by `leases_end`.
        let leases = self.shared.pgs.ctx.leases.clone();
        let leases_end = leases.close();
        let mut closed = true;
        for store in self.shared.maps.stores().values() {
            closed &= close_store(store, self.stall_limit).await;
        }
        if let (Some(dir), true) = (&self.stop_mark, leases.enabled()) {
            // So that the next start waits for what is left of them, not a lease length.
            if let Err(e) = stopmark::write(dir, leases_end) {
                tracing::warn!(node = %self.shared.id, "writing the clean-stop mark: {e}");
            }
        }
        if let (Some(dir), true) = (&self.stop_mark, closed) {
            // Every acknowledged write is durable: the next start keeps the incarnation.
            if let Err(e) = incarnation::write(dir, self.shared.incarnation) {
                tracing::warn!(node = %self.shared.id, "writing the stores-closed mark: {e}");
            }
        }
        tracing::info!(node = %self.shared.id, "node stopped");
    }
}

/// Ends the primaries of the node's PGs (their drivers return), for good: `Ctx::stopped` keeps
/// a late failed write from starting one again.
fn stop_primaries(shared: &NodeShared) {
    // First, so that a primary restarting meanwhile sees it (under the PG's lock).
    shared.pgs.ctx.stopped.store(true, Ordering::Release);
    for pg in shared.pgs.all() {
        if pg.st.lock().primary.is_some() {
            pg.stop_primary();
        }
    }
}

/// Closes a store (drains it, writes its journal back, flushes), unless its device hangs: once
/// its oldest I/O is older than `limit` (non-zero), the store is let go without waiting
/// ([`Store::detach`]), so a node whose device hangs can still stop (and be restarted).
/// Returns whether it closed without an error.
async fn close_store(store: &Store, limit: Duration) -> bool {
    let dev = store.info().device_id;
    let close = store.close();
    tokio::pin!(close);
    loop {
        tokio::select! {
            biased;
            r = &mut close => {
                if let Err(e) = &r {
                    tracing::warn!("closing store {dev}: {e}");
                }
                return r.is_ok();
            }
            _ = tokio::time::sleep(Duration::from_millis(500)) => {
                if let Some(age) = store.oldest_io_age().filter(|a| !limit.is_zero() && *a > limit) {
                    tracing::error!(
                        device = %dev,
                        "not waiting for the store to close: an I/O has waited {:.1} s for the \
                         device (it hangs); its requests are abandoned with the process",
                        age.as_secs_f64()
                    );
                    store.detach();
                    return false;
                }
            }
        }
    }
}

/// Lets the PGs react to every installed map (peering where an interval changed), in order.
async fn drive_pgs(shared: Arc<NodeShared>, mut stop: watch::Receiver<bool>) {
    let mut rx = shared.maps.subscribe();
    let mut done = Epoch(0);
    loop {
        let map = shared.maps.map();
        if map.epoch > done {
            let lag = shared.pgs.ctx.tuning.map_lag;
            if !lag.is_zero() {
                tokio::time::sleep(lag).await;
            }
            done = map.epoch;
            shared.pgs.on_map(map).await;
            continue;
        }
        tokio::select! {
            biased;
            r = rx.changed() => if r.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// How long a leaving node waits for the requests in flight.
pub(crate) const DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// How long a leaving node waits for the metadata store to revoke its lease and leadership.
pub(crate) const STOP_LIMIT: Duration = Duration::from_secs(5);

/// Installs every map the catalog publishes, until `stop`.
async fn follow_maps(catalog: Catalog, shared: Arc<NodeShared>, mut stop: watch::Receiver<bool>) {
    loop {
        let rx = tokio::select! {
            biased;
            r = catalog.watch_map::<ClusterMap>() => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        match rx {
            Ok(mut rx) => loop {
                tokio::select! {
                    biased;
                    m = rx.recv() => match m {
                        Some(map) => { shared.maps.offer(map); }
                        None => break,
                    },
                    _ = stop.wait_for(|s| *s) => return,
                }
            },
            Err(e) => tracing::warn!("watching the map failed: {e}"),
        }
        // The watch ended: catch up from a fresh read, then watch again.
        if let Ok(Some((map, _))) = catalog.get_map::<ClusterMap>().await {
            shared.maps.offer(map);
        }
        tokio::select! {
            biased;
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// How long read leases earlier processes of a node may still run ([`Parts::leases`]):
/// none when `fresh` (its id allocated now); else what the clean-stop mark said (whatever the
/// grace was then); else (a crash leaves no mark) the longer of a lease length now and the
/// bound the last start left (`leasebound.rs`: a crashed process that ran with a longer grace).
fn earlier_grants(
    fresh: bool,
    mark: Option<Duration>,
    bound: Option<Duration>,
    config: &NodeConfig,
) -> Duration {
    match (fresh, mark) {
        (true, _) => Duration::ZERO,
        (false, Some(left)) => left,
        (false, None) => config
            .heartbeat
            .lease_length()
            .max(bound.unwrap_or(Duration::ZERO)),
    }
}
