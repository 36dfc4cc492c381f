//! [`Cluster`]: a connection to a Basalt cluster (its metadata store and its nodes).

use crate::error::ClientError;
use crate::flushset::Unflushed;
use crate::link::TcpLink;
use crate::mapcache::MapCache;
use crate::meta::{self, Catalog, MetaStore};
use crate::openvolumes::{LiveVolume, OpenVolumes};
use crate::volume::{Volume, VolumeOptions};
use basalt_placement::ClusterMap;
use basalt_proto::{Request, Response, Service, Session};
use basalt_types::{Epoch, NodeId};
use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Client settings.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Sent to nodes in the handshake; shows up in their logs.
    pub client_name: String,
    /// How long to wait for a TCP connection and handshake.
    pub connect_timeout: Duration,
    /// How long one operation may keep retrying (map changes, node restarts, a placement
    /// group whose devices are all down) before failing.
    pub op_timeout: Duration,
    /// How long a read waits for a copy on a near node ([`Cluster::read_near`]) before it
    /// reads from the primary instead (a near copy answers in microseconds; one that waits
    /// this long is stuck behind its device).
    pub near_read_timeout: Duration,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            client_name: format!("basalt-client/{}", env!("CARGO_PKG_VERSION")),
            connect_timeout: Duration::from_secs(5),
            op_timeout: Duration::from_secs(30),
            near_read_timeout: Duration::from_secs(1),
        }
    }
}

/// The connection to one node: created on first use, replaced when it breaks. The async mutex
/// makes concurrent first users share one connection attempt.
type LinkSlot = Arc<tokio::sync::Mutex<Option<Arc<TcpLink>>>>;

/// A handle to a cluster. Cheap to clone; all clones share connections and the map.
#[derive(Clone)]
pub struct Cluster {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) catalog: Catalog,
    pub(crate) maps: MapCache,
    pub(crate) config: ClusterConfig,
    local: RwLock<HashMap<NodeId, Arc<dyn Service>>>,
    /// Nodes whose copies reads try first ([`Cluster::read_near`]).
    near: RwLock<Vec<NodeId>>,
    links: Mutex<HashMap<NodeId, LinkSlot>>,
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// When the map was last re-read by [`Cluster::reload_map`] (retries share one re-read).
    last_reload: Mutex<Option<Instant>>,
    pub(crate) open: Arc<OpenVolumes>,
    /// Nodes holding acknowledged, not yet durable writes, per volume (`Volume::flush`).
    pub(crate) unflushed: Unflushed,
    /// This client's id and, per node, its session generation there ([`Cluster::session`]).
    client_id: u64,
    generations: Mutex<HashMap<NodeId, u64>>,
}

/// How often retrying operations may re-read the whole map from the metadata store.
const RELOAD_EVERY: Duration = Duration::from_millis(500);

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.watcher.lock().take() {
            task.abort();
        }
    }
}

impl Cluster {
    /// Connects to the cluster whose metadata lives in `meta`: loads the current map and follows
    /// new ones as they are published.
    pub async fn connect(
        meta: Arc<dyn MetaStore>,
        config: ClusterConfig,
    ) -> Result<Cluster, ClientError> {
        let catalog = Catalog::new(meta);
        let initial = meta::load_map(&catalog).await?;
        let cluster = Cluster {
            inner: Arc::new(Inner {
                catalog,
                maps: MapCache::new(initial),
                config,
                local: RwLock::new(HashMap::new()),
                near: RwLock::new(Vec::new()),
                links: Mutex::new(HashMap::new()),
                watcher: Mutex::new(None),
                last_reload: Mutex::new(None),
                open: Arc::default(),
                unflushed: Unflushed::default(),
                client_id: basalt_types::unique_u64(),
                generations: Mutex::new(HashMap::new()),
            }),
        };
        let task = tokio::spawn(follow_maps(Arc::downgrade(&cluster.inner)));
        *cluster.inner.watcher.lock() = Some(task);
        Ok(cluster)
    }

    /// Routes requests for `node` to `service` in this process instead of over TCP.
    pub fn add_local_node(&self, node: NodeId, service: Arc<dyn Service>) {
        self.inner.local.write().insert(node, service);
    }

    /// Reads of an object go first to the copy on `node`, when `node` holds one as a serving
    /// member that is not the primary (`ReadReplica`; a gateway in a node's process reads its
    /// own node's copies without a network hop). The node refuses when its copy may not
    /// answer now (docs/design/replication.md); the read then goes to the primary.
    pub fn read_near(&self, node: NodeId) {
        let mut near = self.inner.near.write();
        if !near.contains(&node) {
            near.push(node);
        }
    }

    /// Whether reads try copies on `node` first.
    pub(crate) fn is_near(&self, node: NodeId) -> bool {
        self.inner.near.read().contains(&node)
    }

    /// Whether reads try copies on some node first.
    pub(crate) fn reads_near(&self) -> bool {
        !self.inner.near.read().is_empty()
    }

    /// The metadata catalog this client uses.
    pub fn catalog(&self) -> &Catalog {
        &self.inner.catalog
    }

    /// The current cluster map.
    pub fn map(&self) -> Arc<ClusterMap> {
        self.inner.maps.get()
    }

    pub fn config(&self) -> &ClusterConfig {
        &self.inner.config
    }

    /// Opens a volume by name. The handle follows the volume's record: after a resize it checks
    /// I/O against the new size, after a delete it refuses I/O ([`ClientError::VolumeGone`]).
    pub async fn open_volume(
        &self,
        name: &str,
        options: VolumeOptions,
    ) -> Result<Volume, ClientError> {
        let (record, revision) = self
            .inner
            .catalog
            .get_volume_at(name)
            .await?
            .ok_or_else(|| ClientError::NoSuchVolume(name.to_string()))?;
        if record.state != meta::VolumeState::Active {
            return Err(ClientError::NoSuchVolume(name.to_string()));
        }
        let live = Arc::new(LiveVolume::new(&record, revision));
        self.inner.open.register(name, &live, &self.inner.catalog);
        // A change between the read above and the registration reached no handle: read again
        // (older states are ignored, so this cannot undo a newer event).
        live.reload(&self.inner.catalog, name).await?;
        Volume::new(self.clone(), record, live, options).await
    }

    /// Waits until a map with at least `epoch` is known, first asking the metadata store.
    pub async fn refresh_map(&self, epoch: Epoch) -> Result<(), ClientError> {
        if self.map().epoch >= epoch {
            return Ok(());
        }
        if let Some(map) = meta::load_map(&self.inner.catalog).await? {
            self.inner.maps.offer(map);
        }
        if self.map().epoch < epoch {
            self.inner
                .maps
                .wait_for(epoch, Duration::from_millis(500))
                .await;
        }
        Ok(())
    }

    /// Waits until the map's epoch is at least `epoch`, or `timeout` passes (the map watch
    /// installs new maps).
    pub(crate) async fn wait_for_map(&self, epoch: Epoch, timeout: Duration) {
        self.inner.maps.wait_for(epoch, timeout).await;
    }

    /// Waits until the map's epoch is at least `epoch`, with no time limit.
    pub(crate) async fn wait_until_map(&self, epoch: Epoch) {
        self.inner.maps.wait_until(epoch).await;
    }

    /// Reads the map from the metadata store (in case the watch missed a publication), at
    /// most once per [`RELOAD_EVERY`] however many operations are retrying: the map can be
    /// MiBs.
    pub(crate) async fn reload_map(&self) {
        {
            let mut last = self.inner.last_reload.lock();
            if last.is_some_and(|t| t.elapsed() < RELOAD_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        if let Ok(Some(map)) = meta::load_map(&self.inner.catalog).await {
            self.inner.maps.offer(map);
        }
    }

    /// Waits until every placement group of `pool` has a serving device (used at startup).
    pub async fn wait_for_pool(
        &self,
        pool: basalt_types::PoolId,
        timeout: Duration,
    ) -> Result<(), ClientError> {
        let deadline = Instant::now() + timeout;
        loop {
            let map = self.map();
            if let Some(p) = map.pools.get(&pool)
                && p.pgs.len() as u32 == p.pg_count
                && p.pgs.iter().all(|pg| map.pg_primary(pg).is_some())
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ClientError::NoMap);
            }
            self.refresh_map(map.epoch.next()).await?;
        }
    }

    /// The service that reaches `node`: its in-process object, or a (re)connected TCP link.
    pub(crate) async fn service(
        &self,
        map: &ClusterMap,
        node: NodeId,
    ) -> Result<Arc<dyn Service>, ClientError> {
        if let Some(local) = self.inner.local.read().get(&node) {
            return Ok(local.clone());
        }
        let slot = self.inner.links.lock().entry(node).or_default().clone();
        let mut guard = slot.lock().await;
        if let Some(link) = guard.as_ref()
            && link.is_open()
        {
            return Ok(link.clone());
        }
        let addr = map
            .nodes
            .get(&node)
            .map(|n| n.addr.clone())
            .ok_or_else(|| ClientError::Unavailable(format!("{node} is not in the map")))?;
        let cfg = &self.inner.config;
        let link = TcpLink::connect(&addr, &cfg.client_name, cfg.connect_timeout)
            .await
            .map_err(|detail| ClientError::Unreachable {
                node: node.to_string(),
                addr: addr.clone(),
                detail,
            })?;
        let link = Arc::new(link);
        *guard = Some(link.clone());
        Ok(link)
    }

    /// The session this client's writes to `node` carry now (`basalt_proto::Session`).
    pub(crate) fn session(&self, node: NodeId) -> Session {
        let generation = *self.inner.generations.lock().get(&node).unwrap_or(&1);
        Session {
            client: self.inner.client_id,
            generation,
        }
    }

    /// An attempt sent to `node` in `session` ended without its answer: the node may still
    /// hold it. The next write to `node` raises the generation, and from then on the node
    /// versions no write of an older one: the abandoned attempt can no longer land after a
    /// write sent later.
    pub(crate) fn abandoned(&self, node: NodeId, session: Session) {
        let mut generations = self.inner.generations.lock();
        let generation = generations.entry(node).or_insert(1);
        let next = session
            .generation
            .checked_add(1)
            .expect("fewer than 2^64 abandoned attempts");
        *generation = (*generation).max(next);
    }

    /// Forgets a broken connection so that the next call reconnects.
    pub(crate) fn drop_link(&self, node: NodeId) {
        self.inner.links.lock().remove(&node);
    }

    /// Sends one request to `node` as is (no epoch, no retry): admin and status calls.
    pub async fn call_node(&self, node: NodeId, req: Request) -> Result<Response, ClientError> {
        let map = self.map();
        let svc = self.service(&map, node).await?;
        svc.call(req).await.map_err(ClientError::from_wire)
    }

    /// Sends `data` to `node` and measures the round trip (network baseline probes).
    pub async fn ping(&self, node: NodeId, data: Bytes) -> Result<Duration, ClientError> {
        let map = self.map();
        let svc = self.service(&map, node).await?;
        let len = data.len();
        let start = Instant::now();
        match svc.call(Request::Ping { data }).await {
            Ok(Response::Pong { data }) if data.len() == len => Ok(start.elapsed()),
            Ok(other) => Err(ClientError::Protocol(format!(
                "unexpected answer to Ping: {other:?}"
            ))),
            Err(e) => Err(ClientError::from_wire(e)),
        }
    }
}

/// Follows map publications until the cluster handle is dropped.
async fn follow_maps(inner: std::sync::Weak<Inner>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let watch = strong.catalog.watch_map::<ClusterMap>().await;
        drop(strong);
        match watch {
            Ok(mut rx) => {
                backoff = Duration::from_millis(100);
                while let Some(map) = rx.recv().await {
                    let Some(strong) = inner.upgrade() else {
                        return;
                    };
                    strong.maps.offer(map);
                }
            }
            Err(e) => tracing::warn!("watching the cluster map failed: {e}; retrying"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
        if let Some(strong) = inner.upgrade()
            && let Ok(Some(map)) = meta::load_map(&strong.catalog).await
        {
            strong.maps.offer(map);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::{fixture, map};
    use crate::{ClientError, ClusterConfig};
    use basalt_types::{DeviceId, Epoch, PoolId};
    use std::time::Duration;

    #[tokio::test]
    async fn the_cluster_follows_every_published_map() {
        let fx = fixture(1, ClusterConfig::default()).await;
        assert_eq!(fx.cluster.map().epoch, Epoch(0));
        let rev = fx.catalog.put_map(&map(1, &[1]), None).await.unwrap();
        assert!(
            fx.cluster
                .inner
                .maps
                .wait_for(Epoch(1), Duration::from_secs(30))
                .await
        );
        fx.catalog.put_map(&map(2, &[2]), Some(&rev)).await.unwrap();
        assert!(
            fx.cluster
                .inner
                .maps
                .wait_for(Epoch(2), Duration::from_secs(30))
                .await
        );
        assert_eq!(
            fx.cluster.map().pools[&PoolId(1)].pgs[0].acting,
            [DeviceId(2)]
        );
        // An older map never replaces a newer one.
        assert!(!fx.cluster.inner.maps.offer(map(1, &[1])));
        assert_eq!(fx.cluster.map().epoch, Epoch(2));
    }

    #[tokio::test]
    async fn refresh_map_reads_the_store_at_once() {
        let fx = fixture(1, ClusterConfig::default()).await;
        fx.catalog.put_map(&map(3, &[1]), None).await.unwrap();
        fx.cluster.refresh_map(Epoch(3)).await.unwrap();
        assert_eq!(
            fx.cluster.map().epoch,
            Epoch(3),
            "not waiting for the watch"
        );
        // Asking for an epoch nobody published returns after a bounded wait, unchanged.
        fx.cluster.refresh_map(Epoch(9)).await.unwrap();
        assert_eq!(fx.cluster.map().epoch, Epoch(3));
    }

    #[tokio::test]
    async fn waiting_for_a_pool_ends_when_every_pg_has_a_device() {
        let fx = fixture(2, ClusterConfig::default()).await;
        let mut partial = map(1, &[1, 1]);
        partial.pools.get_mut(&PoolId(1)).unwrap().pgs[1]
            .acting
            .clear();
        let rev = fx.catalog.put_map(&partial, None).await.unwrap();
        let short = fx
            .cluster
            .wait_for_pool(PoolId(1), Duration::from_millis(300))
            .await;
        assert!(matches!(short, Err(ClientError::NoMap)), "{short:?}");
        fx.catalog
            .put_map(&map(2, &[1, 2]), Some(&rev))
            .await
            .unwrap();
        fx.cluster
            .wait_for_pool(PoolId(1), Duration::from_secs(30))
            .await
            .unwrap();
    }
}
