//! Proxying [`MetaStore`] calls to a process that owns the store (a `basalt up` node owns its
//! embedded store; CLI commands and gateways in other processes reach it through the node).
//!
//! The calls and answers are serde types, carried as JSON by the transport (the node's `Meta`
//! frames). The serving side runs [`serve`]; the calling side sends a [`MetaCall`] and turns the
//! [`MetaAnswer`] back into a result with [`MetaAnswer::into_result`]. Watches are not proxied:
//! the calling side polls (see `basalt_client::remote_meta`).

use crate::error::MetaError;
use crate::store::{KeyValue, LeaseId, Listing, MetaStore, Revision, Txn, TxnResult};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// One [`MetaStore`] call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
#[non_exhaustive]
pub enum MetaCall {
    Get {
        key: String,
    },
    List {
        prefix: String,
    },
    Put {
        key: String,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    },
    Delete {
        key: String,
    },
    Txn {
        txn: Txn,
    },
    Revision,
    GrantLease {
        ttl_ms: u64,
    },
    KeepAlive {
        lease: LeaseId,
    },
    RevokeLease {
        lease: LeaseId,
    },
}

/// The answer to a [`MetaCall`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MetaAnswer {
    Value(Option<KeyValue>),
    Listing(Listing),
    Revision(Revision),
    Deleted(bool),
    Txn(TxnResult),
    Lease(LeaseId),
    Done,
    Error(RemoteError),
}

/// A [`MetaError`] as it crosses the process boundary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteError {
    pub kind: RemoteErrorKind,
    /// The serving side's error message.
    pub message: String,
}

/// The error kinds a caller may act on; everything else is `Other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RemoteErrorKind {
    Unavailable,
    LeaseNotFound(LeaseId),
    InvalidTxn,
    Other,
}

impl From<&MetaError> for RemoteError {
    fn from(e: &MetaError) -> RemoteError {
        let kind = match e {
            MetaError::Unavailable { .. } => RemoteErrorKind::Unavailable,
            MetaError::LeaseNotFound(l) => RemoteErrorKind::LeaseNotFound(*l),
            MetaError::InvalidTxn(_) => RemoteErrorKind::InvalidTxn,
            _ => RemoteErrorKind::Other,
        };
        RemoteError {
            kind,
            message: e.to_string(),
        }
    }
}

impl MetaAnswer {
    /// The answer, or the error the serving side reported.
    pub fn into_result(self) -> Result<MetaAnswer, MetaError> {
        let MetaAnswer::Error(e) = self else {
            return Ok(self);
        };
        Err(match e.kind {
            RemoteErrorKind::Unavailable => MetaError::Unavailable {
                endpoint: "the store behind the node".into(),
                detail: e.message,
            },
            RemoteErrorKind::LeaseNotFound(l) => MetaError::LeaseNotFound(l),
            RemoteErrorKind::InvalidTxn => MetaError::InvalidTxn(e.message),
            RemoteErrorKind::Other => MetaError::Backend(e.message),
        })
    }
}

/// Runs one call on `store` (the serving side).
pub async fn serve(store: &dyn MetaStore, call: MetaCall) -> MetaAnswer {
    let result = match call {
        MetaCall::Get { key } => store.get(&key).await.map(MetaAnswer::Value),
        MetaCall::List { prefix } => store.list(&prefix).await.map(MetaAnswer::Listing),
        MetaCall::Put { key, value, lease } => store
            .put(&key, value, lease)
            .await
            .map(MetaAnswer::Revision),
        MetaCall::Delete { key } => store.delete(&key).await.map(MetaAnswer::Deleted),
        MetaCall::Txn { txn } => store.txn(txn).await.map(MetaAnswer::Txn),
        MetaCall::Revision => store.revision().await.map(MetaAnswer::Revision),
        MetaCall::GrantLease { ttl_ms } => store
            .grant_lease(Duration::from_millis(ttl_ms))
            .await
            .map(MetaAnswer::Lease),
        MetaCall::KeepAlive { lease } => store.keep_alive(lease).await.map(|()| MetaAnswer::Done),
        MetaCall::RevokeLease { lease } => {
            store.revoke_lease(lease).await.map(|()| MetaAnswer::Done)
        }
    };
    result.unwrap_or_else(|e| MetaAnswer::Error(RemoteError::from(&e)))
}
