//! What wakes the leader: a change under one of the prefixes placement reads (pools, nodes,
//! devices, PG-ready reports, failure reports) or of the cluster settings (`noout`). Volume records and the map itself are not watched. A lost watch
//! is re-opened and counts as a change (something may have been missed).

use basalt_meta::{Catalog, MetaStore, WatchEvent, keys};
use std::sync::Arc;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// The prefixes whose changes can change placement.
const PREFIXES: [&str; 6] = [
    keys::POOLS,
    keys::NODES,
    keys::DEVICES,
    keys::PG_READY,
    keys::FAILURE_REPORTS,
    keys::SETTINGS,
];

/// Watches [`PREFIXES`]; [`Changes::next`] resolves after each burst of changes.
pub(crate) struct Changes {
    notify: Arc<Notify>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Changes {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Changes {
    /// Starts watching from now; fails if a watch cannot be opened.
    pub(crate) async fn watch(catalog: &Catalog) -> Result<Changes, basalt_meta::MetaError> {
        let notify = Arc::new(Notify::new());
        let mut tasks = Vec::new();
        for prefix in PREFIXES {
            let rx = catalog.store().watch_prefix(prefix, 0).await?;
            let store = catalog.store().clone();
            tasks.push(tokio::spawn(forward(store, prefix, rx, notify.clone())));
        }
        Ok(Changes { notify, tasks })
    }

    /// Waits for the next change (changes since the last call coalesce into one).
    pub(crate) async fn next(&mut self) {
        self.notify.notified().await;
    }
}

async fn forward(
    store: Arc<dyn MetaStore>,
    prefix: &'static str,
    mut rx: basalt_meta::WatchReceiver,
    notify: Arc<Notify>,
) {
    loop {
        match rx.recv().await {
            // A consumed report going away changes nothing.
            Some(WatchEvent::Delete(_)) if prefix == keys::PG_READY => continue,
            Some(WatchEvent::Put(_)) | Some(WatchEvent::Delete(_)) => {}
            Some(WatchEvent::Lost(_)) | None => {
                rx = loop {
                    match store.watch_prefix(prefix, 0).await {
                        Ok(rx) => break rx,
                        Err(e) => {
                            tracing::debug!("re-watching {prefix}: {e}");
                            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                        }
                    }
                };
            }
        }
        notify.notify_one();
    }
}
