//! The cluster map under [`keys::MAP`], stored as an opaque serde value (JSON) so that meta
//! does not depend on placement: `M` is `basalt_placement::ClusterMap` in practice.

use crate::catalog::Catalog;
use crate::error::MetaError;
use crate::keys;
use crate::leader::Leadership;
use crate::store::{Compare, MetaStore, Revision, Txn, TxnOp, TxnOpResult, WatchEvent};
use crate::watch::Backoff;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::sync::Arc;
use tokio::sync::mpsc;

impl Catalog {
    /// The published map and the revision it was published at (its `mod_revision`, the
    /// `expected` value for the next [`Catalog::put_map`]).
    pub async fn get_map<M: DeserializeOwned>(&self) -> Result<Option<(M, Revision)>, MetaError> {
        let Some(kv) = self.store().get(keys::MAP).await? else {
            return Ok(None);
        };
        let map =
            serde_json::from_slice(&kv.value).map_err(|e| MetaError::corrupt(keys::MAP, e))?;
        Ok(Some((map, kv.mod_revision)))
    }

    /// Publishes a map if the published one is still the one at revision `expected`
    /// (`None` = no map may exist yet). Otherwise fails with [`MetaError::MapConflict`] and
    /// publishes nothing. Returns the new map's revision.
    pub async fn put_map<M: Serialize>(
        &self,
        map: &M,
        expected: Option<Revision>,
    ) -> Result<Revision, MetaError> {
        self.publish(map, expected, None).await
    }

    /// Like [`Catalog::put_map`], and only while `leadership` still holds the leader key: a
    /// deposed leader cannot publish (fails with [`MetaError::NotLeader`]).
    pub async fn put_map_as_leader<M: Serialize>(
        &self,
        map: &M,
        expected: Option<Revision>,
        leadership: &Leadership,
    ) -> Result<Revision, MetaError> {
        self.publish(map, expected, Some(leadership)).await
    }

    async fn publish<M: Serialize>(
        &self,
        map: &M,
        expected: Option<Revision>,
        leadership: Option<&Leadership>,
    ) -> Result<Revision, MetaError> {
        let value = serde_json::to_vec(map).map_err(|e| MetaError::corrupt(keys::MAP, e))?;
        let mut compares = vec![Compare::mod_revision_is(keys::MAP, expected.unwrap_or(0))];
        if let Some(l) = leadership {
            compares.push(l.holds_key());
        }
        let txn = Txn::new()
            .when(compares)
            .and_then([TxnOp::put(keys::MAP, value)])
            .or_else([TxnOp::get(keys::MAP), TxnOp::get(keys::LEADER)]);
        let result = self.store().txn(txn).await?;
        if result.succeeded {
            return Ok(result.revision);
        }
        let found = match result.results.first() {
            Some(TxnOpResult::Get(kv)) => kv.as_ref().map(|kv| kv.mod_revision),
            _ => None,
        };
        if found != expected {
            return Err(MetaError::MapConflict { expected, found });
        }
        Err(MetaError::NotLeader)
    }

    /// Follows the published map: the receiver yields the current map (if any) and then every
    /// newly published one, in order. Lost watches and store outages are handled inside (it
    /// re-reads and re-watches, so no publication is skipped except ones superseded while the
    /// store was unreachable). Ends when the receiver is dropped.
    pub async fn watch_map<M>(&self) -> Result<mpsc::Receiver<M>, MetaError>
    where
        M: DeserializeOwned + Send + 'static,
    {
        // Fail early (and visibly) when the store is unreachable now.
        self.store().revision().await?;
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(follow_map(self.store().clone(), tx));
        Ok(rx)
    }
}

async fn follow_map<M: DeserializeOwned + Send + 'static>(
    store: Arc<dyn MetaStore>,
    tx: mpsc::Sender<M>,
) {
    let mut last: Revision = 0;
    let mut backoff = Backoff::default();
    while backoff
        .after(
            follow_once(&*store, &tx, &mut last).await,
            "the cluster map",
            &tx,
        )
        .await
    {}
}

/// Reads the current map, then watches until the watch is lost or the receiver goes away.
async fn follow_once<M: DeserializeOwned>(
    store: &dyn MetaStore,
    tx: &mpsc::Sender<M>,
    last: &mut Revision,
) -> Result<(), MetaError> {
    let listing = store.list(keys::MAP).await?;
    if let Some(kv) = listing.kvs.iter().find(|kv| kv.key == keys::MAP) {
        deliver(tx, &kv.value, kv.mod_revision, last).await;
    }
    let mut events = store.watch_prefix(keys::MAP, listing.revision + 1).await?;
    loop {
        let event = tokio::select! {
            ev = events.recv() => ev,
            _ = tx.closed() => return Ok(()),
        };
        match event {
            Some(WatchEvent::Put(kv)) if kv.key == keys::MAP => {
                deliver(tx, &kv.value, kv.mod_revision, last).await;
            }
            Some(WatchEvent::Lost(reason)) => {
                tracing::debug!("map watch lost ({reason}); re-reading");
                return Ok(());
            }
            Some(_) => {}
            None => return Err(MetaError::Backend("the map watch ended".into())),
        }
    }
}

async fn deliver<M: DeserializeOwned>(
    tx: &mpsc::Sender<M>,
    value: &[u8],
    rev: Revision,
    last: &mut Revision,
) {
    if rev <= *last {
        return;
    }
    *last = rev;
    match serde_json::from_slice(value) {
        Ok(map) => {
            let _ = tx.send(map).await;
        }
        Err(e) => tracing::warn!("skipping an unreadable cluster map at revision {rev}: {e}"),
    }
}
