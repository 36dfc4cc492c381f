//! Helpers for the node's unit tests: a node's shared state over simulated-disk stores, and the
//! embedded metadata store with failures switched on and off (and its listings counted).

use crate::admin::AdminHandler;
use crate::lease::Fence;
use crate::mapstate::MapState;
use crate::peers::Peers;
use crate::pg::{Ctx, Pgs, Recovery, Tuning};
use crate::service::NodeShared;
use crate::volumes::Volumes;
use async_trait::async_trait;
use basalt_engine::sim::SimDisk;
use basalt_engine::{DeviceId, FormatOptions, OpenOptions, Store};
use basalt_link::TcpConnector;
use basalt_meta::{Catalog, KeyValue};
use basalt_meta::{
    EmbeddedStore, LeaseId, Listing, MetaError, MetaStore, Revision, Txn, TxnResult, WatchReceiver,
};
use basalt_types::NodeId;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// A store on a fresh simulated disk.
pub(crate) fn sim_store(device: u32) -> Store {
    sim_store_on(&SimDisk::new(64 << 20), device)
}

/// [`sim_store`] on `disk` (the test keeps it to stall it, say).
pub(crate) fn sim_store_on(disk: &SimDisk, device: u32) -> Store {
    let opts = FormatOptions {
        device_id: DeviceId(device),
        ..FormatOptions::default()
    };
    basalt_engine::format_sim(disk, &opts).unwrap();
    Store::open_sim(disk, &OpenOptions::default()).unwrap()
}

/// The shared state of node `id` with these stores, a fence for `ttl` (closed) and PGs that use
/// `catalog`.
pub(crate) fn shared(
    id: NodeId,
    ttl: Duration,
    stores: Vec<Store>,
    catalog: Catalog,
) -> Arc<NodeShared> {
    shared_with_leases(id, ttl, stores, catalog, Duration::ZERO)
}

/// [`shared`], with read leases of `lease` (zero: off) and no earlier process.
pub(crate) fn shared_with_leases(
    id: NodeId,
    ttl: Duration,
    stores: Vec<Store>,
    catalog: Catalog,
    lease: Duration,
) -> Arc<NodeShared> {
    shared_after(id, ttl, stores, catalog, lease, Duration::ZERO)
}

/// [`shared_with_leases`], started after a process whose grants may run for `earlier` more.
pub(crate) fn shared_after(
    id: NodeId,
    ttl: Duration,
    stores: Vec<Store>,
    catalog: Catalog,
    lease: Duration,
    earlier: Duration,
) -> Arc<NodeShared> {
    let stores: BTreeMap<_, _> = stores
        .into_iter()
        .map(|s| (s.info().device_id, s))
        .collect();
    let maps = Arc::new(MapState::new(stores.clone()));
    let volumes = Volumes::new(Some(catalog.clone()));
    let ctx = Arc::new(Ctx {
        maps: maps.clone(),
        catalog,
        peers: Arc::new(Peers::new(
            id,
            Arc::new(TcpConnector),
            Duration::from_secs(5),
        )),
        tuning: Tuning::default(),
        recovery: Recovery::new(&Tuning::default()),
        leases: Arc::new(crate::readlease::ReadLeases::new(lease, earlier)),
        stopped: Default::default(),
        sessions: Default::default(),
    });
    Arc::new(NodeShared {
        id,
        in_flight: Default::default(),
        maps,
        pgs: Pgs::new(ctx, stores),
        admin: AdminHandler {
            meta: None,
            name: "test".into(),
            addr: "127.0.0.1:1".into(),
            started: std::time::Instant::now(),
        },
        stopping: Default::default(),
        fence: Arc::new(Fence::new(id, ttl)),
        server_stats: Arc::default(),
        volumes,
        collector: Default::default(),
        replica_reads: Default::default(),
        hung: tokio::sync::watch::channel(Default::default()).0,
        latency: Default::default(),
        removed: tokio::sync::watch::channel(None).0,
        incarnation: 1,
    })
}

/// The embedded store (real), which can be made unreachable: while `down`, every call fails
/// with `Unavailable`, as etcd's do during an outage. Records when keep-alives were sent.
#[derive(Debug)]
pub(crate) struct Flaky {
    inner: EmbeddedStore,
    down: AtomicBool,
    renewals: Mutex<Vec<Instant>>,
    lists: AtomicUsize,
    /// While true, prefix listings wait (`hold_lists`); how many wait now.
    hold: tokio::sync::watch::Sender<bool>,
    held_lists: AtomicUsize,
    /// While true, the next transaction is applied only once this turns false, whether its
    /// caller still waits or not (`delay_next_txn`): a request the store applies late.
    late_txn: tokio::sync::watch::Sender<bool>,
    late_armed: AtomicBool,
    late_applied: Arc<AtomicUsize>,
    late_waiting: AtomicUsize,
    granted: Mutex<Vec<LeaseId>>,
    /// While true, puts and deletes are applied and then answered with an error, as when
    /// the answer is lost (`lose_answers`).
    lose_answers: AtomicBool,
}

impl Flaky {
    pub(crate) async fn open(path: &std::path::Path) -> Arc<Flaky> {
        Arc::new(Flaky {
            inner: EmbeddedStore::open(path).await.unwrap(),
            down: AtomicBool::new(false),
            renewals: Mutex::new(Vec::new()),
            lists: AtomicUsize::new(0),
            hold: tokio::sync::watch::channel(false).0,
            held_lists: AtomicUsize::new(0),
            late_txn: tokio::sync::watch::channel(false).0,
            late_armed: AtomicBool::new(false),
            late_applied: Arc::new(AtomicUsize::new(0)),
            late_waiting: AtomicUsize::new(0),
            granted: Mutex::new(Vec::new()),
            lose_answers: AtomicBool::new(false),
        })
    }

    pub(crate) fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// When the last successful keep-alive was sent.
    pub(crate) fn last_renewal(&self) -> Option<Instant> {
        self.renewals.lock().last().copied()
    }

    pub(crate) fn renewals(&self) -> usize {
        self.renewals.lock().len()
    }

    /// Prefix listings answered so far.
    pub(crate) fn lists(&self) -> usize {
        self.lists.load(Ordering::SeqCst)
    }

    /// Makes prefix listings wait (`true`) until released (`false`).
    pub(crate) fn hold_lists(&self, hold: bool) {
        self.hold.send_replace(hold);
    }

    /// Makes the next transaction wait for [`Flaky::apply_late_txn`] before the store
    /// applies it, even if its caller gives up meanwhile (a request lost in transit, applied
    /// late).
    pub(crate) fn delay_next_txn(&self) {
        self.late_txn.send_replace(true);
        self.late_armed.store(true, Ordering::SeqCst);
    }

    /// Lets the delayed transaction be applied.
    pub(crate) fn apply_late_txn(&self) {
        self.late_txn.send_replace(false);
    }

    /// Applies puts and deletes but answers them with an error (`true`), as a store whose
    /// answer is lost on the way (a timeout, a connection broken after the request).
    pub(crate) fn lose_answers(&self, on: bool) {
        self.lose_answers.store(on, Ordering::SeqCst);
    }

    fn answer<T>(&self, r: Result<T, MetaError>) -> Result<T, MetaError> {
        match (r, self.lose_answers.load(Ordering::SeqCst)) {
            (Ok(_), true) => Err(MetaError::Unavailable {
                endpoint: "flaky".into(),
                detail: "the answer was lost (test)".into(),
            }),
            (r, _) => r,
        }
    }

    /// Delayed transactions the store has received so far.
    pub(crate) fn late_waiting(&self) -> usize {
        self.late_waiting.load(Ordering::SeqCst)
    }

    /// The leases granted so far, oldest first.
    pub(crate) fn granted(&self) -> Vec<LeaseId> {
        self.granted.lock().clone()
    }

    /// Delayed transactions the store has applied (or refused) so far.
    pub(crate) fn late_applied(&self) -> usize {
        self.late_applied.load(Ordering::SeqCst)
    }

    /// Prefix listings waiting for the release now.
    pub(crate) fn held_lists(&self) -> usize {
        self.held_lists.load(Ordering::SeqCst)
    }

    fn check(&self) -> Result<(), MetaError> {
        match self.down.load(Ordering::SeqCst) {
            true => Err(MetaError::Unavailable {
                endpoint: "flaky".into(),
                detail: "switched off by the test".into(),
            }),
            false => Ok(()),
        }
    }
}

#[async_trait]
impl MetaStore for Flaky {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, MetaError> {
        self.check()?;
        self.inner.get(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Listing, MetaError> {
        self.check()?;
        let mut hold = self.hold.subscribe();
        if *hold.borrow_and_update() {
            self.held_lists.fetch_add(1, Ordering::SeqCst);
            let _ = hold.wait_for(|h| !*h).await;
            self.held_lists.fetch_sub(1, Ordering::SeqCst);
        }
        let listing = self.inner.list(prefix).await;
        self.lists.fetch_add(1, Ordering::SeqCst);
        listing
    }
    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<Revision, MetaError> {
        self.check()?;
        self.answer(self.inner.put(key, value, lease).await)
    }
    async fn delete(&self, key: &str) -> Result<bool, MetaError> {
        self.check()?;
        self.answer(self.inner.delete(key).await)
    }
    async fn txn(&self, txn: Txn) -> Result<TxnResult, MetaError> {
        self.check()?;
        if !self.late_armed.swap(false, Ordering::SeqCst) {
            return self.inner.txn(txn).await;
        }
        self.late_waiting.fetch_add(1, Ordering::SeqCst);
        let inner = self.inner.clone();
        let mut late = self.late_txn.subscribe();
        let done = self.late_applied.clone();
        let applied = tokio::spawn(async move {
            let _ = late.wait_for(|l| !*l).await;
            let result = inner.txn(txn).await;
            done.fetch_add(1, Ordering::SeqCst);
            result
        });
        applied.await.expect("the delayed transaction panicked")
    }
    async fn watch_prefix(&self, prefix: &str, from: Revision) -> Result<WatchReceiver, MetaError> {
        self.check()?;
        self.inner.watch_prefix(prefix, from).await
    }
    async fn revision(&self) -> Result<Revision, MetaError> {
        self.check()?;
        self.inner.revision().await
    }
    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, MetaError> {
        self.check()?;
        let lease = self.inner.grant_lease(ttl).await?;
        self.granted.lock().push(lease);
        Ok(lease)
    }
    async fn keep_alive(&self, lease: LeaseId) -> Result<(), MetaError> {
        self.check()?;
        let sent = Instant::now();
        self.inner.keep_alive(lease).await?;
        self.renewals.lock().push(sent);
        Ok(())
    }
    async fn revoke_lease(&self, lease: LeaseId) -> Result<(), MetaError> {
        self.check()?;
        self.inner.revoke_lease(lease).await
    }
}

/// The peering query by which a primary of `term` asks `dev` about `pg` (and takes its promise).
pub(crate) fn query_msg(
    dev: DeviceId,
    pg: basalt_types::PgId,
    term: basalt_types::Term,
) -> crate::pg::messages::PeerMsg {
    crate::pg::messages::PeerMsg::Query {
        device: dev,
        pg,
        term,
        epoch: basalt_types::Epoch(0),
        from: None,
    }
}

/// The activation of `dev` as a serving member of `pg` in `term` (not readable).
pub(crate) fn activate_msg(
    dev: DeviceId,
    pg: basalt_types::PgId,
    term: basalt_types::Term,
) -> crate::pg::messages::PeerMsg {
    crate::pg::messages::PeerMsg::Activate {
        device: dev,
        pg,
        term,
        info: crate::pg::info::MemberInfo {
            les: term.interval,
            activated: term.interval,
            ..Default::default()
        },
        readable: false,
    }
}

/// Makes `dev` of `node` a serving member of `pg` in `term`: promised by a peering query, then
/// activated (not readable), as a primary's peering does.
pub(crate) async fn activate_member(
    node: &NodeShared,
    dev: DeviceId,
    pg: basalt_types::PgId,
    term: basalt_types::Term,
) {
    let (query, activate) = (query_msg(dev, pg, term), activate_msg(dev, pg, term));
    for msg in [query, activate] {
        node.pgs.peer(msg, bytes::Bytes::new()).await.unwrap();
    }
}

/// Answers every request (with a Pong) once `release` is notified, counting the calls that got
/// that far: a request that outlives its caller, or not.
pub(crate) struct Finish {
    pub(crate) release: Arc<tokio::sync::Notify>,
    pub(crate) finished: Arc<std::sync::atomic::AtomicU64>,
}

impl basalt_proto::Service for Finish {
    fn call(&self, _req: basalt_proto::Request) -> basalt_proto::ResponseFuture {
        let (release, finished) = (self.release.clone(), self.finished.clone());
        Box::pin(async move {
            release.notified().await;
            finished.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(basalt_proto::Response::Pong {
                data: bytes::Bytes::new(),
            })
        })
    }
}
