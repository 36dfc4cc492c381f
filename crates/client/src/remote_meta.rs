//! [`RemoteMetaStore`]: the metadata store of a running single-process cluster (`basalt up`),
//! reached through its node with `Meta` frames. Lets CLI commands and gateways in other
//! processes use a store only that process can open.
//!
//! Every [`MetaStore`] call is one round trip, except watches: the node does not stream watch
//! events over this proxy, so a watch here polls the prefix (every [`POLL`]) and reports the
//! differences. Intermediate states between two polls are coalesced, which the cluster-map and
//! registration watchers tolerate (they only need the latest value).

use crate::link::TcpLink;
use async_trait::async_trait;
use basalt_meta::remote::{MetaAnswer, MetaCall};
use basalt_meta::{
    KeyValue, LeaseId, Listing, MetaError, MetaStore, Revision, Txn, TxnResult, WATCH_BUFFER,
    WatchEvent, WatchReceiver,
};
use basalt_proto::{Request, Response, Service};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

/// How often a proxied watch re-lists its prefix.
pub const POLL: Duration = Duration::from_millis(200);

/// A [`MetaStore`] served by a node (see `basalt_node::admin`).
#[derive(Clone)]
pub struct RemoteMetaStore {
    inner: Arc<Inner>,
}

struct Inner {
    addr: String,
    link: Mutex<Option<Arc<TcpLink>>>,
}

impl std::fmt::Debug for RemoteMetaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteMetaStore")
            .field("addr", &self.inner.addr)
            .finish()
    }
}

impl RemoteMetaStore {
    /// Connects to the node at `addr` and checks that it serves its metadata store.
    pub async fn connect(addr: &str) -> Result<RemoteMetaStore, MetaError> {
        let store = RemoteMetaStore {
            inner: Arc::new(Inner {
                addr: addr.to_string(),
                link: Mutex::new(None),
            }),
        };
        store.revision().await?;
        Ok(store)
    }

    async fn link(&self) -> Result<Arc<TcpLink>, MetaError> {
        let mut guard = self.inner.link.lock().await;
        if let Some(l) = guard.as_ref()
            && l.is_open()
        {
            return Ok(l.clone());
        }
        let link = TcpLink::connect(
            &self.inner.addr,
            "basalt-meta-proxy",
            Duration::from_secs(5),
        )
        .await
        .map_err(|detail| self.unavailable(detail))?;
        let link = Arc::new(link);
        *guard = Some(link.clone());
        Ok(link)
    }

    fn unavailable(&self, detail: String) -> MetaError {
        MetaError::Unavailable {
            endpoint: self.inner.addr.clone(),
            detail,
        }
    }

    async fn call(&self, call: MetaCall) -> Result<MetaAnswer, MetaError> {
        let body = serde_json::to_vec(&call).map_err(|e| MetaError::Backend(e.to_string()))?;
        let link = self.link().await?;
        match link.call(Request::Meta { body: body.into() }).await {
            Ok(Response::Meta { body }) => {
                let answer: MetaAnswer = serde_json::from_slice(&body)
                    .map_err(|e| MetaError::Backend(format!("bad answer from the node: {e}")))?;
                answer.into_result()
            }
            Ok(other) => Err(MetaError::Backend(format!(
                "unexpected answer to a metadata call: {other:?}"
            ))),
            Err(e) => Err(self.unavailable(e.to_string())),
        }
    }
}

fn unexpected(a: MetaAnswer) -> MetaError {
    MetaError::Backend(format!("unexpected metadata answer {a:?}"))
}

#[async_trait]
impl MetaStore for RemoteMetaStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, MetaError> {
        match self.call(MetaCall::Get { key: key.into() }).await? {
            MetaAnswer::Value(v) => Ok(v),
            a => Err(unexpected(a)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Listing, MetaError> {
        match self
            .call(MetaCall::List {
                prefix: prefix.into(),
            })
            .await?
        {
            MetaAnswer::Listing(l) => Ok(l),
            a => Err(unexpected(a)),
        }
    }

    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<Revision, MetaError> {
        match self
            .call(MetaCall::Put {
                key: key.into(),
                value,
                lease,
            })
            .await?
        {
            MetaAnswer::Revision(r) => Ok(r),
            a => Err(unexpected(a)),
        }
    }

    async fn delete(&self, key: &str) -> Result<bool, MetaError> {
        match self.call(MetaCall::Delete { key: key.into() }).await? {
            MetaAnswer::Deleted(d) => Ok(d),
            a => Err(unexpected(a)),
        }
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult, MetaError> {
        match self.call(MetaCall::Txn { txn }).await? {
            MetaAnswer::Txn(r) => Ok(r),
            a => Err(unexpected(a)),
        }
    }

    async fn watch_prefix(&self, prefix: &str, from: Revision) -> Result<WatchReceiver, MetaError> {
        let first = self.list(prefix).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BUFFER);
        // Changes already in the first listing that the caller asked for (from > 0).
        if from > 0 {
            for kv in first.kvs.iter().filter(|kv| kv.mod_revision >= from) {
                let _ = tx.try_send(WatchEvent::Put(kv.clone()));
            }
        }
        let known: HashMap<String, KeyValue> = first
            .kvs
            .into_iter()
            .map(|kv| (kv.key.clone(), kv))
            .collect();
        tokio::spawn(poll_watch(self.clone(), prefix.to_string(), known, tx));
        Ok(rx)
    }

    async fn revision(&self) -> Result<Revision, MetaError> {
        match self.call(MetaCall::Revision).await? {
            MetaAnswer::Revision(r) => Ok(r),
            a => Err(unexpected(a)),
        }
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, MetaError> {
        let ttl_ms = ttl.as_millis() as u64;
        match self.call(MetaCall::GrantLease { ttl_ms }).await? {
            MetaAnswer::Lease(l) => Ok(l),
            a => Err(unexpected(a)),
        }
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<(), MetaError> {
        match self.call(MetaCall::KeepAlive { lease }).await? {
            MetaAnswer::Done => Ok(()),
            a => Err(unexpected(a)),
        }
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<(), MetaError> {
        match self.call(MetaCall::RevokeLease { lease }).await? {
            MetaAnswer::Done => Ok(()),
            a => Err(unexpected(a)),
        }
    }
}

/// Re-lists `prefix` every [`POLL`] and sends the differences, until the receiver is dropped.
async fn poll_watch(
    store: RemoteMetaStore,
    prefix: String,
    mut known: HashMap<String, KeyValue>,
    tx: tokio::sync::mpsc::Sender<WatchEvent>,
) {
    loop {
        tokio::select! {
            biased;
            _ = tokio::time::sleep(POLL) => {}
            _ = tx.closed() => return,
        }
        let listing = match store.list(&prefix).await {
            Ok(l) => l,
            Err(e) => {
                let _ = tx.send(WatchEvent::Lost(e.to_string())).await;
                return;
            }
        };
        let mut events = Vec::new();
        let mut now: HashMap<String, KeyValue> = HashMap::with_capacity(listing.kvs.len());
        for kv in listing.kvs {
            let changed = known
                .get(&kv.key)
                .is_none_or(|old| old.mod_revision != kv.mod_revision);
            if changed {
                events.push(WatchEvent::Put(kv.clone()));
            }
            now.insert(kv.key.clone(), kv);
        }
        for (key, old) in &known {
            if !now.contains_key(key) {
                events.push(WatchEvent::Delete(KeyValue {
                    key: key.clone(),
                    value: Vec::new(),
                    mod_revision: listing.revision,
                    ..old.clone()
                }));
            }
        }
        events.sort_by_key(|e| match e {
            WatchEvent::Put(kv) | WatchEvent::Delete(kv) => kv.mod_revision,
            WatchEvent::Lost(_) => 0,
        });
        for e in events {
            if tx.send(e).await.is_err() {
                return;
            }
        }
        known = now;
    }
}
