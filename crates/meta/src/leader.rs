//! Leader election on [`keys::LEADER`]: the key is created under the candidate's lease by a
//! transaction that requires it to be missing, so at most one candidate holds it; it vanishes
//! when the leader's lease ends (crash, partition, resignation) and the next campaign wins.
//!
//! The key's `create_revision` identifies one term of leadership: [`Leadership::holds_key`]
//! compares on it, so a deposed leader's fenced writes fail even if it has not noticed yet.

use crate::catalog::{Catalog, encode, now_secs};
use crate::error::MetaError;
use crate::keys;
use crate::lease::KeepAlive;
use crate::store::{Compare, CompareOp, Revision, Txn, TxnOp, WatchEvent};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The value of the leader key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderRecord {
    /// Who leads (a node name or any process identity).
    pub name: String,
    /// Unix seconds when it won.
    pub elected_at: u64,
}

/// Holding the leader key. Dropping it stops renewing the lease (the key expires a TTL later);
/// [`Leadership::resign`] hands over at once.
#[derive(Debug)]
pub struct Leadership {
    catalog: Catalog,
    record: LeaderRecord,
    revision: Revision,
    keep: KeepAlive,
}

impl Leadership {
    pub fn record(&self) -> &LeaderRecord {
        &self.record
    }

    /// The revision that created the leader key: identifies this term.
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// A transaction comparison that holds only while this term's leader key exists.
    pub fn holds_key(&self) -> Compare {
        Compare::create_revision(keys::LEADER, CompareOp::Equal, self.revision)
    }

    /// Whether the lease behind the key is known to be gone.
    pub fn is_lost(&self) -> bool {
        self.keep.is_lost()
    }

    /// Resolves when the leadership is lost (the lease expired or was revoked). Stop acting
    /// as leader at once.
    pub async fn lost(&self) {
        self.keep.lost().await
    }

    /// Gives up leadership now: deletes the key (if still ours) and revokes the lease.
    pub async fn resign(self) -> Result<(), MetaError> {
        let txn = Txn::new()
            .when([self.holds_key()])
            .and_then([TxnOp::delete(keys::LEADER)]);
        self.catalog.store().txn(txn).await?;
        self.keep.revoke().await
    }
}

impl Catalog {
    /// Tries once to become leader as `name`, with a lease of `ttl`. Returns `None` when
    /// someone else leads.
    pub async fn campaign(
        &self,
        name: &str,
        ttl: Duration,
    ) -> Result<Option<Leadership>, MetaError> {
        let store = self.store();
        let lease = store.grant_lease(ttl).await?;
        let record = LeaderRecord {
            name: name.to_string(),
            elected_at: now_secs(),
        };
        let txn = Txn::new()
            .when([Compare::missing(keys::LEADER)])
            .and_then([TxnOp::put_with_lease(keys::LEADER, encode(&record), lease)]);
        let result = match store.txn(txn).await {
            Ok(r) => r,
            Err(e) => {
                let _ = store.revoke_lease(lease).await;
                return Err(e);
            }
        };
        if !result.succeeded {
            store.revoke_lease(lease).await?;
            return Ok(None);
        }
        Ok(Some(Leadership {
            catalog: self.clone(),
            record,
            revision: result.revision,
            keep: KeepAlive::spawn(store.clone(), lease, ttl),
        }))
    }

    /// Campaigns until this process wins: between attempts it waits for the current leader's
    /// key to go away.
    pub async fn elect(&self, name: &str, ttl: Duration) -> Result<Leadership, MetaError> {
        loop {
            if let Some(l) = self.campaign(name, ttl).await? {
                return Ok(l);
            }
            let listing = self.store().list(keys::LEADER).await?;
            if !listing.kvs.iter().any(|kv| kv.key == keys::LEADER) {
                continue;
            }
            let mut events = self
                .store()
                .watch_prefix(keys::LEADER, listing.revision + 1)
                .await?;
            while let Some(ev) = events.recv().await {
                match ev {
                    WatchEvent::Delete(kv) if kv.key == keys::LEADER => break,
                    WatchEvent::Lost(_) => break,
                    _ => {}
                }
            }
        }
    }

    /// Whether `leadership`'s term still holds the leader key (after a guarded write of it
    /// failed: was it the guard?).
    pub(crate) async fn still_leads(&self, leadership: &Leadership) -> Result<bool, MetaError> {
        let key = self.store().get(keys::LEADER).await?;
        Ok(key.is_some_and(|kv| kv.create_revision == leadership.revision()))
    }

    /// The current leader, if any.
    pub async fn leader(&self) -> Result<Option<LeaderRecord>, MetaError> {
        Ok(self.read(keys::LEADER).await?.map(|(rec, _)| rec))
    }
}
