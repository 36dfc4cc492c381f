//! [`SimMeta`]: one node's handle on the shared metadata store, which the simulator can cut
//! off (a partition between the node and the store) or kill (the node was killed: whatever of
//! it still runs must not reach the store).

use async_trait::async_trait;
use basalt_meta::{
    KeyValue, LeaseId, Listing, MetaError, MetaStore, Revision, Txn, TxnResult, WATCH_BUFFER,
    WatchReceiver,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// A node's handle on the metadata store. While cut off (or dead) every call fails with
/// `Unavailable` at once, as a store that refuses connections would, and open watches end.
pub struct SimMeta {
    inner: Arc<dyn MetaStore>,
    /// True while the store is reachable.
    reachable: watch::Sender<bool>,
    dead: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for SimMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimMeta")
            .field("reachable", &*self.reachable.borrow())
            .finish()
    }
}

impl SimMeta {
    pub fn new(inner: Arc<dyn MetaStore>) -> Arc<SimMeta> {
        Arc::new(SimMeta {
            inner,
            reachable: watch::channel(true).0,
            dead: Default::default(),
        })
    }

    /// Cuts the node off from the store (`false`) or reconnects it (`true`).
    pub fn set_reachable(&self, reachable: bool) {
        let dead = self.dead.load(std::sync::atomic::Ordering::SeqCst);
        self.reachable.send_replace(reachable && !dead);
    }

    pub fn is_reachable(&self) -> bool {
        *self.reachable.borrow()
    }

    /// The node was killed: this handle never reaches the store again.
    pub fn kill(&self) {
        self.dead.store(true, std::sync::atomic::Ordering::SeqCst);
        self.reachable.send_replace(false);
    }

    fn check(&self) -> Result<(), MetaError> {
        match *self.reachable.borrow() {
            true => Ok(()),
            false => Err(MetaError::Unavailable {
                endpoint: "sim".into(),
                detail: "cut off from the metadata store by the simulator".into(),
            }),
        }
    }
}

#[async_trait]
impl MetaStore for SimMeta {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, MetaError> {
        self.check()?;
        self.inner.get(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Listing, MetaError> {
        self.check()?;
        self.inner.list(prefix).await
    }
    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<Revision, MetaError> {
        self.check()?;
        self.inner.put(key, value, lease).await
    }
    async fn delete(&self, key: &str) -> Result<bool, MetaError> {
        self.check()?;
        self.inner.delete(key).await
    }
    async fn txn(&self, txn: Txn) -> Result<TxnResult, MetaError> {
        self.check()?;
        self.inner.txn(txn).await
    }
    async fn watch_prefix(&self, prefix: &str, from: Revision) -> Result<WatchReceiver, MetaError> {
        self.check()?;
        let mut events = self.inner.watch_prefix(prefix, from).await?;
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let mut reachable = self.reachable.subscribe();
        // Forwards events until the node is cut off (the stream ends, as a broken etcd watch
        // does) or the watcher goes away.
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    _ = async { let _ = reachable.wait_for(|r| !*r).await.is_ok(); } => return,
                    ev = events.recv() => match ev {
                        Some(ev) => if tx.send(ev).await.is_err() { return },
                        None => return,
                    },
                }
            }
        });
        Ok(rx)
    }
    async fn revision(&self) -> Result<Revision, MetaError> {
        self.check()?;
        self.inner.revision().await
    }
    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, MetaError> {
        self.check()?;
        self.inner.grant_lease(ttl).await
    }
    async fn keep_alive(&self, lease: LeaseId) -> Result<(), MetaError> {
        self.check()?;
        self.inner.keep_alive(lease).await
    }
    async fn revoke_lease(&self, lease: LeaseId) -> Result<(), MetaError> {
        self.check()?;
        self.inner.revoke_lease(lease).await
    }
}
