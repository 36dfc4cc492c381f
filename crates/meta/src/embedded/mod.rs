//! [`EmbeddedStore`]: the single-process metadata store, one redb file with etcd's semantics.
//!
//! - Keys and their revisions live in the redb table `kv`; the global revision in the table
//!   `meta`. Every change commits with redb's immediate durability (fsync before the call
//!   returns), so an acknowledged change survives a crash and revisions never go back.
//! - One mutex orders writers: a write takes the next revision, commits, then hands its events
//!   to the watchers, so watchers see changes in revision order without gaps.
//! - Watches and leases live in memory ([`watchers`], [`lease`]). Watch history is bounded and
//!   starts at open: watching from an older revision yields `Lost`, as a compacted revision does
//!   in etcd. Leases do not survive a restart: on open, every key attached to a lease is deleted
//!   (its owner, in the same process, is gone too).

mod lease;
mod record;
mod txn;
mod watchers;
mod write;

use crate::error::MetaError;
use crate::store::{
    KeyValue, LeaseId, Listing, MetaStore, Revision, Txn, TxnResult, WatchReceiver,
};
use async_trait::async_trait;
use lease::Leases;
use parking_lot::{Mutex, RwLock};
use record::Record;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Notify;
use watchers::Hub;

/// Key -> encoded [`Record`].
const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
/// `"revision"` -> the store revision; `"format"` -> the file format version.
const META: TableDefinition<&str, i64> = TableDefinition::new("meta");
const FILE_FORMAT: i64 = 1;

/// The embedded metadata store. Cheap to clone; clones share the open file, which is closed
/// when the last clone is dropped (a reopen right after succeeds; open watches end).
pub struct EmbeddedStore {
    inner: Arc<Inner>,
}

impl Clone for EmbeddedStore {
    fn clone(&self) -> Self {
        self.inner.handles.fetch_add(1, Ordering::SeqCst);
        EmbeddedStore {
            inner: self.inner.clone(),
        }
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        if self.inner.handles.fetch_sub(1, Ordering::SeqCst) == 1 {
            // Background work (the lease timer, an in-flight call) may still hold `Inner` for a
            // moment; close the file now so that it can be opened again at once.
            self.inner.close();
        }
    }
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("path", &self.inner.path)
            .finish()
    }
}

pub(crate) struct Inner {
    path: PathBuf,
    /// `None` once the last handle is dropped. Held (read) for the whole of each operation.
    db: RwLock<Option<Database>>,
    /// Live [`EmbeddedStore`] handles.
    handles: AtomicUsize,
    state: Mutex<State>,
    /// Wakes the lease-expiry task (new lease, or the store is closing).
    wake: Arc<Notify>,
    /// Calls run on the caller's task instead of a blocking thread ([`EmbeddedStore::in_memory`]).
    inline: bool,
}

pub(crate) struct State {
    revision: Revision,
    hub: Hub,
    leases: Leases,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

impl EmbeddedStore {
    /// Opens (or creates) the store file at `path`. Must be called inside a tokio runtime (the
    /// lease-expiry timer is a task). Keys attached to leases from a previous run are deleted.
    pub async fn open(path: impl AsRef<Path>) -> Result<EmbeddedStore, MetaError> {
        let path = path.as_ref().to_path_buf();
        let inner = tokio::task::spawn_blocking(move || Inner::open(path))
            .await
            .map_err(|e| {
                MetaError::Backend(format!("opening the embedded store panicked: {e}"))
            })??;
        Ok(EmbeddedStore::start(inner))
    }

    /// A store in memory (nothing on disk), whose calls run on the calling task rather than on
    /// tokio's blocking threads: for the deterministic simulator, where every task shares one
    /// thread and virtual time (a call never yields, so its effects are ordered with the
    /// caller's). Same semantics as a file store otherwise. Must be called inside a tokio
    /// runtime.
    pub fn in_memory() -> Result<EmbeddedStore, MetaError> {
        let path = PathBuf::from("<memory>");
        let db = redb::Builder::new()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .map_err(|e| embedded_err(&path, e))?;
        let mut inner = Inner::from_db(path, db)?;
        inner.inline = true;
        Ok(EmbeddedStore::start(inner))
    }

    fn start(inner: Inner) -> EmbeddedStore {
        let inner = Arc::new(inner);
        lease::spawn_expiry(Arc::downgrade(&inner), inner.wake.clone());
        EmbeddedStore { inner }
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T, MetaError> + Send + 'static,
    ) -> Result<T, MetaError> {
        let inner = self.inner.clone();
        if inner.inline {
            return f(&inner);
        }
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| MetaError::Backend(format!("embedded store task failed: {e}")))?
    }
}

impl Inner {
    fn open(path: PathBuf) -> Result<Inner, MetaError> {
        let db = Database::create(&path).map_err(|e| embedded_err(&path, e))?;
        Inner::from_db(path, db)
    }

    fn from_db(path: PathBuf, db: Database) -> Result<Inner, MetaError> {
        let revision = init_tables(&db).map_err(|e| embedded_err(&path, e))?;
        let inner = Inner {
            state: Mutex::new(State {
                revision,
                hub: Hub::new(revision + 1),
                leases: Leases::new(),
            }),
            path,
            db: RwLock::new(Some(db)),
            handles: AtomicUsize::new(1),
            wake: Arc::new(Notify::new()),
            inline: false,
        };
        inner.drop_leased_keys()?;
        let mut st = inner.state.lock();
        let rev = st.revision;
        st.hub = Hub::new(rev + 1);
        drop(st);
        Ok(inner)
    }

    /// Leases are in memory only: keys attached to one from a previous run are deleted.
    fn drop_leased_keys(&self) -> Result<(), MetaError> {
        let leased: Vec<String> = {
            self.with_db(|db| {
                let rtx = db.begin_read().map_err(|e| self.err(e))?;
                let table = rtx.open_table(KV).map_err(|e| self.err(e))?;
                let mut keys = Vec::new();
                for entry in table.iter().map_err(|e| self.err(e))? {
                    let (k, v) = entry.map_err(|e| self.err(e))?;
                    if Record::decode(k.value(), v.value())?.lease.is_some() {
                        keys.push(k.value().to_string());
                    }
                }
                Ok(keys)
            })?
        };
        if !leased.is_empty() {
            tracing::info!(
                keys = leased.len(),
                "deleting keys of leases from a previous run"
            );
            self.write(|ctx| {
                for key in &leased {
                    ctx.delete(key)?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    fn err(&self, e: impl Into<redb::Error>) -> MetaError {
        embedded_err(&self.path, e)
    }

    /// Runs `f` on the open database; the file stays open until `f` returns.
    pub(crate) fn with_db<T>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, MetaError>,
    ) -> Result<T, MetaError> {
        let guard = self.db.read();
        let db = guard.as_ref().ok_or_else(|| MetaError::Embedded {
            path: self.path.display().to_string(),
            detail: "the store is closed".into(),
        })?;
        f(db)
    }

    /// Closes the file (after the operations in progress) and ends every watch.
    fn close(&self) {
        let db = self.db.write().take();
        drop(db);
        let watchers = std::mem::replace(&mut self.state.lock().hub, Hub::new(0));
        drop(watchers);
        self.wake.notify_one();
    }

    fn get(&self, key: &str) -> Result<Option<KeyValue>, MetaError> {
        self.with_db(|db| {
            let rtx = db.begin_read().map_err(|e| self.err(e))?;
            let table = rtx.open_table(KV).map_err(|e| self.err(e))?;
            let found = table.get(key).map_err(|e| self.err(e))?;
            found
                .map(|v| Record::decode(key, v.value()).map(|r| r.into_kv(key)))
                .transpose()
        })
    }

    fn list(&self, prefix: &str) -> Result<Listing, MetaError> {
        self.with_db(|db| {
            let rtx = db.begin_read().map_err(|e| self.err(e))?;
            let table = rtx.open_table(KV).map_err(|e| self.err(e))?;
            let meta = rtx.open_table(META).map_err(|e| self.err(e))?;
            // The same read transaction: the revision matches the keys read.
            let revision = meta
                .get("revision")
                .map_err(|e| self.err(e))?
                .map_or(1, |v| v.value());
            let mut kvs = Vec::new();
            for entry in table.range(prefix..).map_err(|e| self.err(e))? {
                let (k, v) = entry.map_err(|e| self.err(e))?;
                let key = k.value();
                if !key.starts_with(prefix) {
                    break;
                }
                kvs.push(Record::decode(key, v.value())?.into_kv(key));
            }
            Ok(Listing { kvs, revision })
        })
    }
}

/// Creates the tables of a new file, checks the format of an existing one, and returns the
/// store revision (1 for a new store, as in etcd).
fn init_tables(db: &Database) -> Result<Revision, redb::Error> {
    let wtx = db.begin_write()?;
    let revision = {
        wtx.open_table(KV)?;
        let mut meta = wtx.open_table(META)?;
        let format = meta.get("format")?.map(|v| v.value());
        match format {
            None => {
                meta.insert("format", FILE_FORMAT)?;
            }
            Some(FILE_FORMAT) => {}
            Some(other) => {
                return Err(redb::Error::Corrupted(format!(
                    "file format {other} is not supported (this build reads {FILE_FORMAT}); \
                     upgrade basalt"
                )));
            }
        }
        let rev = meta.get("revision")?.map_or(1, |v| v.value());
        meta.insert("revision", rev)?;
        rev
    };
    // Durability: the default (immediate) commit fsyncs, so a new file is complete on disk.
    wtx.commit()?;
    Ok(revision)
}

fn embedded_err(path: &Path, e: impl Into<redb::Error>) -> MetaError {
    let e: redb::Error = e.into();
    let detail = match e {
        redb::Error::DatabaseAlreadyOpen => {
            "already open (by this or another process); only one process may use an embedded \
             store, use etcd for more"
                .to_string()
        }
        other => other.to_string(),
    };
    MetaError::Embedded {
        path: path.display().to_string(),
        detail,
    }
}

#[async_trait]
impl MetaStore for EmbeddedStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, MetaError> {
        let key = key.to_string();
        self.blocking(move |inner| inner.get(&key)).await
    }

    async fn list(&self, prefix: &str) -> Result<Listing, MetaError> {
        let prefix = prefix.to_string();
        self.blocking(move |inner| inner.list(&prefix)).await
    }

    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<Revision, MetaError> {
        let key = key.to_string();
        self.blocking(move |inner| {
            inner
                .write(|ctx| ctx.put(&key, value, lease))
                .map(|((), rev)| rev)
        })
        .await
    }

    async fn delete(&self, key: &str) -> Result<bool, MetaError> {
        let key = key.to_string();
        self.blocking(move |inner| inner.write(|ctx| ctx.delete(&key)).map(|(d, _)| d))
            .await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult, MetaError> {
        txn.validate()?;
        self.blocking(move |inner| {
            let ((succeeded, results), revision) = inner.write(|ctx| ctx.run_txn(&txn))?;
            Ok(TxnResult {
                succeeded,
                revision,
                results,
            })
        })
        .await
    }

    async fn watch_prefix(&self, prefix: &str, from: Revision) -> Result<WatchReceiver, MetaError> {
        let prefix = prefix.to_string();
        self.blocking(move |inner| {
            let mut st = inner.state.lock();
            let current = st.revision;
            Ok(st.hub.subscribe(&prefix, from, current))
        })
        .await
    }

    async fn revision(&self) -> Result<Revision, MetaError> {
        self.blocking(|inner| Ok(inner.state.lock().revision)).await
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, MetaError> {
        let id = self
            .blocking(move |inner| Ok(inner.state.lock().leases.grant(ttl)))
            .await?;
        self.inner.wake.notify_one();
        Ok(id)
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<(), MetaError> {
        self.blocking(move |inner| inner.state.lock().leases.keep_alive(lease))
            .await
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<(), MetaError> {
        self.blocking(move |inner| inner.remove_lease(lease).map(|_| ()))
            .await
    }
}
