//! The [`MetaStore`] trait: the small subset of etcd's v3 API that Basalt needs, with etcd's
//! semantics, so that the etcd and embedded backends are interchangeable.
//!
//! Semantics every backend follows (tests/conformance.rs checks them on both):
//! - One global revision counter. Every change (a put, a delete that removed something, a txn
//!   branch with writes, the expiry or revocation of a lease holding keys) increases it by one;
//!   all keys changed together share that revision. Reads do not change it.
//! - Each key-value carries `create_revision` (when the key was created), `mod_revision` (its
//!   last change) and `version` (changes since creation, 1 on creation).
//! - A transaction compares, then runs either its success or its failure ops, atomically. A
//!   comparison on a missing key compares zeros (revisions and version 0), except a value
//!   comparison, which is false. A txn may not write the same key twice.
//! - Watches deliver every change under a prefix from a start revision, in revision order.
//!   A watcher that falls behind gets [`WatchEvent::Lost`] and nothing after it: re-list and
//!   watch again from the listing's revision + 1.
//! - Keys put with a lease vanish when the lease expires or is revoked (watchers see Deletes).

use crate::error::MetaError;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio::sync::mpsc;

/// A store revision. Revisions start at 1 on an empty store; 0 means "none" (a missing key's
/// create/mod revision) or, for [`MetaStore::watch_prefix`], "from now on".
pub type Revision = i64;

/// A lease: keys attached to it are deleted when it expires or is revoked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LeaseId(pub i64);

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "lease {:x}", self.0)
    }
}

/// A stored key and value with its revisions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    /// The revision that created the key (0 in a Delete event).
    pub create_revision: Revision,
    /// The revision of the key's last change (in a Delete event: the revision of the delete).
    pub mod_revision: Revision,
    /// Number of changes since creation; 1 when created (0 in a Delete event).
    pub version: i64,
    /// The lease the key is attached to, if any.
    pub lease: Option<LeaseId>,
}

/// The result of a prefix listing: the keys in key order, and the store revision they were read
/// at (watch from `revision + 1` to miss nothing).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    pub kvs: Vec<KeyValue>,
    pub revision: Revision,
}

/// How a comparison compares the stored quantity with the given one (`stored OP given`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareOp {
    Equal,
    NotEqual,
    Greater,
    Less,
}

/// What a transaction compares.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum CompareTarget {
    /// The value (false when the key is missing).
    Value(CompareOp, Vec<u8>),
    ModRevision(CompareOp, Revision),
    CreateRevision(CompareOp, Revision),
    Version(CompareOp, i64),
}

/// One comparison of a transaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compare {
    pub key: String,
    pub target: CompareTarget,
}

impl Compare {
    /// The key exists.
    pub fn exists(key: impl Into<String>) -> Compare {
        Compare::create_revision(key, CompareOp::Greater, 0)
    }

    /// The key does not exist.
    pub fn missing(key: impl Into<String>) -> Compare {
        Compare::create_revision(key, CompareOp::Equal, 0)
    }

    /// The key's value equals `value` (false when the key is missing).
    pub fn value_equals(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Compare {
        Compare {
            key: key.into(),
            target: CompareTarget::Value(CompareOp::Equal, value.into()),
        }
    }

    /// The key was last changed at `rev` (0 = the key is missing).
    pub fn mod_revision_is(key: impl Into<String>, rev: Revision) -> Compare {
        Compare::mod_revision(key, CompareOp::Equal, rev)
    }

    pub fn mod_revision(key: impl Into<String>, op: CompareOp, rev: Revision) -> Compare {
        Compare {
            key: key.into(),
            target: CompareTarget::ModRevision(op, rev),
        }
    }

    pub fn create_revision(key: impl Into<String>, op: CompareOp, rev: Revision) -> Compare {
        Compare {
            key: key.into(),
            target: CompareTarget::CreateRevision(op, rev),
        }
    }

    pub fn version(key: impl Into<String>, op: CompareOp, version: i64) -> Compare {
        Compare {
            key: key.into(),
            target: CompareTarget::Version(op, version),
        }
    }
}

/// One operation of a transaction branch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum TxnOp {
    Put {
        key: String,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    },
    Delete {
        key: String,
    },
    Get {
        key: String,
    },
}

impl TxnOp {
    pub fn put(key: impl Into<String>, value: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp::Put {
            key: key.into(),
            value: value.into(),
            lease: None,
        }
    }

    pub fn put_with_lease(
        key: impl Into<String>,
        value: impl Into<Vec<u8>>,
        lease: LeaseId,
    ) -> TxnOp {
        TxnOp::Put {
            key: key.into(),
            value: value.into(),
            lease: Some(lease),
        }
    }

    pub fn delete(key: impl Into<String>) -> TxnOp {
        TxnOp::Delete { key: key.into() }
    }

    pub fn get(key: impl Into<String>) -> TxnOp {
        TxnOp::Get { key: key.into() }
    }

    fn written_key(&self) -> Option<&str> {
        match self {
            TxnOp::Put { key, .. } | TxnOp::Delete { key } => Some(key),
            TxnOp::Get { .. } => None,
        }
    }
}

/// A transaction: if every comparison holds, run `success`, else run `failure`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Txn {
    pub compares: Vec<Compare>,
    pub success: Vec<TxnOp>,
    pub failure: Vec<TxnOp>,
}

impl Txn {
    pub fn new() -> Txn {
        Txn::default()
    }

    pub fn when(mut self, compares: impl IntoIterator<Item = Compare>) -> Txn {
        self.compares.extend(compares);
        self
    }

    pub fn and_then(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Txn {
        self.success.extend(ops);
        self
    }

    pub fn or_else(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Txn {
        self.failure.extend(ops);
        self
    }

    /// The most operations in one branch (etcd's default `--max-txn-ops`).
    pub const MAX_OPS: usize = 128;

    /// Refuses what etcd refuses: a branch writing one key twice, or too many ops.
    pub fn validate(&self) -> Result<(), MetaError> {
        for branch in [&self.success, &self.failure] {
            if branch.len() > Self::MAX_OPS {
                return Err(MetaError::InvalidTxn(format!(
                    "{} operations in one branch; the limit is {}: split the transaction",
                    branch.len(),
                    Self::MAX_OPS
                )));
            }
            let mut seen = std::collections::HashSet::new();
            for key in branch.iter().filter_map(TxnOp::written_key) {
                if !seen.insert(key) {
                    return Err(MetaError::InvalidTxn(format!(
                        "key '{key}' is written twice in one transaction branch"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// The outcome of one op of the branch that ran.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum TxnOpResult {
    Put,
    Delete { deleted: bool },
    Get(Option<KeyValue>),
}

/// The outcome of a transaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnResult {
    /// Whether the comparisons held (the success branch ran).
    pub succeeded: bool,
    /// The store revision after the transaction (the revision of its writes, if any).
    pub revision: Revision,
    /// One result per op of the branch that ran, in order.
    pub results: Vec<TxnOpResult>,
}

/// A change delivered by a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// The key was created or changed; `kv` is the new state.
    Put(KeyValue),
    /// The key was deleted at `kv.mod_revision`; `kv.value` is empty.
    Delete(KeyValue),
    /// The watch cannot deliver further changes (it fell behind, or the start revision was
    /// compacted away, or the connection to the store broke). Nothing follows this event:
    /// re-list the prefix and watch again from the listing's revision + 1.
    Lost(String),
}

/// The receiving end of a watch. Dropping it cancels the watch.
pub type WatchReceiver = mpsc::Receiver<WatchEvent>;

/// How many undelivered events a watch buffers before it gives up with [`WatchEvent::Lost`].
pub const WATCH_BUFFER: usize = 1024;

/// The metadata store. Object-safe: use it as `Arc<dyn MetaStore>`.
///
/// Keys are non-empty UTF-8 strings (the schema's all start with `/basalt/`, see [`crate::keys`]);
/// values are bytes.
#[async_trait]
pub trait MetaStore: Send + Sync + std::fmt::Debug {
    /// Reads one key.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, MetaError>;

    /// Reads every key starting with `prefix`, in key order.
    async fn list(&self, prefix: &str) -> Result<Listing, MetaError>;

    /// Writes one key, optionally attached to a lease. Returns the new revision.
    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<Revision, MetaError>;

    /// Deletes one key. Returns whether it existed.
    async fn delete(&self, key: &str) -> Result<bool, MetaError>;

    /// Runs a compare-and-swap transaction.
    async fn txn(&self, txn: Txn) -> Result<TxnResult, MetaError>;

    /// Watches every key starting with `prefix`, delivering changes with revision >= `from`
    /// (0 = changes after now).
    async fn watch_prefix(&self, prefix: &str, from: Revision) -> Result<WatchReceiver, MetaError>;

    /// The current store revision.
    async fn revision(&self) -> Result<Revision, MetaError>;

    /// Grants a lease that lives `ttl` (rounded up to whole seconds) unless kept alive.
    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, MetaError>;

    /// Renews a lease for its full TTL. Fails with [`MetaError::LeaseNotFound`] when it has
    /// expired or was revoked.
    async fn keep_alive(&self, lease: LeaseId) -> Result<(), MetaError>;

    /// Revokes a lease now, deleting its keys. Revoking a lease that is gone is not an error.
    async fn revoke_lease(&self, lease: LeaseId) -> Result<(), MetaError>;
}

/// Whole seconds of a lease TTL, rounded up, at least 1.
pub(crate) fn ttl_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    secs.clamp(1, i64::MAX as u64) as i64
}
