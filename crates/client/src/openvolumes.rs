//! Open volumes follow their metadata records: a resize changes the size every open handle
//! checks I/O against, a delete (or a re-creation under the same name) makes every handle of the
//! old volume refuse I/O. One watch per [`crate::Cluster`], started when it first opens a volume.
//!
//! Each state carries the store revision it was read at, so an event older than what a handle
//! already knows (the handle was opened after the change) is ignored.

use crate::meta::{Catalog, MetaError, Revision, VolumeEvent, VolumeRecord, VolumeState};
use basalt_types::VolumeId;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// What every handle of one open volume shares.
#[derive(Debug)]
pub(crate) struct LiveVolume {
    pub(crate) id: VolumeId,
    size: AtomicU64,
    gone: AtomicBool,
    /// Revision of the newest state applied; updates take this lock.
    revision: Mutex<Revision>,
}

impl LiveVolume {
    pub(crate) fn new(record: &VolumeRecord, revision: Revision) -> LiveVolume {
        LiveVolume {
            id: record.id,
            size: AtomicU64::new(record.size),
            gone: AtomicBool::new(record.state != VolumeState::Active),
            revision: Mutex::new(revision),
        }
    }

    pub(crate) fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// Deleted, being deleted, or replaced by a new volume of the same name.
    pub(crate) fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// Reads the record of `name` now and applies it (a newer state already applied wins).
    pub(crate) async fn reload(&self, catalog: &Catalog, name: &str) -> Result<(), MetaError> {
        match catalog.get_volume_at(name).await? {
            Some((record, revision)) => self.apply(Some(&record), revision),
            None => self.apply(None, catalog.store().revision().await?),
        }
        Ok(())
    }

    /// Applies the record of this volume's name as of `revision` (`None`: no record).
    pub(crate) fn apply(&self, record: Option<&VolumeRecord>, revision: Revision) {
        let mut at = self.revision.lock();
        if revision < *at {
            return;
        }
        *at = revision;
        match record {
            Some(r) if r.id == self.id && r.state == VolumeState::Active => {
                self.size.store(r.size, Ordering::Release);
            }
            _ => self.gone.store(true, Ordering::Release),
        }
    }
}

/// The open volumes of one cluster handle, by name.
#[derive(Default)]
pub(crate) struct OpenVolumes {
    by_name: Mutex<HashMap<String, Vec<Weak<LiveVolume>>>>,
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for OpenVolumes {
    fn drop(&mut self) {
        if let Some(task) = self.watcher.lock().take() {
            task.abort();
        }
    }
}

impl OpenVolumes {
    /// Tracks `live` under `name`; starts the watch on the first call (it holds only a weak
    /// reference, and ends when the registry is dropped with its cluster handle).
    pub(crate) fn register(
        self: &Arc<Self>,
        name: &str,
        live: &Arc<LiveVolume>,
        catalog: &Catalog,
    ) {
        {
            let mut map = self.by_name.lock();
            let handles = map.entry(name.to_string()).or_default();
            handles.retain(|w| w.strong_count() > 0);
            handles.push(Arc::downgrade(live));
        }
        let mut watcher = self.watcher.lock();
        if watcher.is_none() {
            *watcher = Some(tokio::spawn(follow(catalog.clone(), Arc::downgrade(self))));
        }
    }

    fn apply(&self, event: &VolumeEvent) {
        let mut map = self.by_name.lock();
        map.retain(|_, handles| {
            handles.retain(|w| w.strong_count() > 0);
            !handles.is_empty()
        });
        let each = |name: &str, f: &dyn Fn(&LiveVolume)| {
            for live in map
                .get(name)
                .into_iter()
                .flatten()
                .filter_map(Weak::upgrade)
            {
                f(&live);
            }
        };
        match event {
            VolumeEvent::All { volumes, revision } => {
                let by_name: HashMap<&str, &VolumeRecord> =
                    volumes.iter().map(|v| (v.name.as_str(), v)).collect();
                for name in map.keys() {
                    each(name, &|l| {
                        l.apply(by_name.get(name.as_str()).copied(), *revision)
                    });
                }
            }
            VolumeEvent::Changed { record, revision } => {
                each(&record.name, &|l| l.apply(Some(record), *revision));
            }
            VolumeEvent::Removed { name, revision } => {
                each(name, &|l| l.apply(None, *revision));
            }
        }
    }
}

/// Applies volume events to the registry until the cluster handle is dropped.
async fn follow(catalog: Catalog, registry: Weak<OpenVolumes>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match catalog.watch_volumes().await {
            Ok(mut rx) => {
                backoff = Duration::from_millis(100);
                while let Some(event) = rx.recv().await {
                    let Some(open) = registry.upgrade() else {
                        return;
                    };
                    open.apply(&event);
                }
            }
            Err(e) => tracing::warn!("watching the volumes failed: {e}; retrying"),
        }
        if registry.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{FakeNode, fixture, map};
    use crate::{ClientError, ClusterConfig, VolumeOptions};
    use bytes::Bytes;

    async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !cond() {
            assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn open_handles_follow_resizes_deletes_and_re_creations() {
        let fx = fixture(1, ClusterConfig::default()).await;
        let _node = FakeNode::install(&fx.cluster, 1);
        fx.cluster.inner.maps.offer(map(1, &[1]));
        let vol = fx
            .cluster
            .open_volume("v", VolumeOptions::default())
            .await
            .unwrap();
        assert_eq!(vol.size(), 1 << 20);
        let past_old_end = Bytes::from(vec![1u8; 4096]);
        assert!(matches!(
            vol.write(1 << 20, past_old_end.clone(), false).await,
            Err(ClientError::OutOfRange { .. })
        ));
        fx.catalog
            .resize_volume_from("v", Some(1 << 20), 2 << 20)
            .await
            .unwrap();
        wait_until("the handle sees the grow", || vol.size() == 2 << 20).await;
        vol.write(1 << 20, past_old_end, false).await.unwrap();
        fx.catalog.mark_volume_deleting("v").await.unwrap();
        wait_until("the handle sees the delete", || vol.is_gone()).await;
        assert!(matches!(
            vol.read(0, 512).await,
            Err(ClientError::VolumeGone(_))
        ));
        fx.catalog.remove_volume("v").await.unwrap();
        // A new volume under the same name is never reached through the old handle.
        let again = fx
            .catalog
            .create_volume("v", 1 << 20, "default")
            .await
            .unwrap();
        assert_ne!(again.id, fx.volume.id);
        let new = fx
            .cluster
            .open_volume("v", VolumeOptions::default())
            .await
            .unwrap();
        assert_eq!(new.id(), again.id);
        new.read(0, 512).await.unwrap();
        assert!(vol.is_gone());
        assert!(matches!(
            vol.refresh().await,
            Err(ClientError::VolumeGone(_))
        ));
    }

    #[test]
    fn an_older_state_never_undoes_a_newer_one() {
        let rec = |size, state| VolumeRecord {
            id: VolumeId(5),
            name: "v".into(),
            pool: basalt_types::PoolId(1),
            size,
            created_at: 0,
            state,
        };
        let live = LiveVolume::new(&rec(1 << 20, VolumeState::Active), 10);
        live.apply(Some(&rec(2 << 20, VolumeState::Active)), 12);
        live.apply(Some(&rec(1 << 20, VolumeState::Active)), 11);
        assert_eq!(live.size(), 2 << 20, "an older resize was applied");
        live.apply(None, 13);
        assert!(live.is_gone());
        live.apply(Some(&rec(3 << 20, VolumeState::Active)), 12);
        assert!(live.is_gone(), "an older record revived a deleted volume");
        let other = LiveVolume::new(&rec(1 << 20, VolumeState::Active), 1);
        let mut newer = rec(1 << 20, VolumeState::Active);
        newer.id = VolumeId(6);
        other.apply(Some(&newer), 2);
        assert!(other.is_gone(), "a re-created volume of the same name");
    }
}
