//! Test harness: a fresh store of either backend, and waiting helpers (poll with a deadline,
//! never a fixed sleep).

#![allow(dead_code)]

use anyhow::{Context, Result, bail};
use basalt_meta::{
    Catalog, EmbeddedStore, EtcdProcess, EtcdStore, MetaStore, WatchEvent, WatchReceiver,
};
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The etcd shared by the tests running at the same time; killed when the last one ends.
static SHARED_ETCD: tokio::sync::Mutex<Weak<EtcdProcess>> =
    tokio::sync::Mutex::const_new(Weak::new());

/// A store for one test.
pub struct Harness {
    pub store: Arc<dyn MetaStore>,
    /// Nobody else writes to this store (so exact revision arithmetic holds).
    pub exclusive: bool,
    _etcd: Option<Arc<EtcdProcess>>,
    _dir: Option<tempfile::TempDir>,
}

impl Harness {
    /// A fresh embedded store in a temporary directory.
    pub async fn embedded() -> Result<Harness> {
        let dir = tempfile::tempdir()?;
        let store = EmbeddedStore::open(dir.path().join("meta.redb")).await?;
        Ok(Harness {
            store: Arc::new(store),
            exclusive: true,
            _etcd: None,
            _dir: Some(dir),
        })
    }

    /// A store on the shared etcd, under a prefix no other test uses.
    pub async fn etcd(test: &str) -> Result<Harness> {
        let etcd = shared_etcd().await?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos();
        let prefix = format!("/test-{test}-{}-{nanos}", std::process::id());
        let store = EtcdStore::connect(&[etcd.endpoint()], &prefix).await?;
        Ok(Harness {
            store: Arc::new(store),
            exclusive: false,
            _etcd: Some(etcd),
            _dir: None,
        })
    }

    pub fn catalog(&self) -> Catalog {
        Catalog::new(self.store.clone())
    }
}

pub async fn shared_etcd() -> Result<Arc<EtcdProcess>> {
    let mut slot = SHARED_ETCD.lock().await;
    if let Some(etcd) = slot.upgrade() {
        return Ok(etcd);
    }
    let etcd = Arc::new(
        EtcdProcess::start()
            .await
            .context("starting etcd for the tests")?,
    );
    *slot = Arc::downgrade(&etcd);
    Ok(etcd)
}

/// The next watch event, failing after 10 s or if the watch ended.
pub async fn next_event(rx: &mut WatchReceiver) -> Result<WatchEvent> {
    match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
        Ok(Some(e)) => Ok(e),
        Ok(None) => bail!("the watch ended"),
        Err(_) => bail!("no watch event within 10 s"),
    }
}

/// Polls `cond` every 50 ms until it holds, failing after `timeout`.
pub async fn wait_until<F, Fut>(timeout: Duration, mut cond: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if cond().await? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("condition not met within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
