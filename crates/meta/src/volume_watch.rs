//! Following volume records: how a gateway that holds volumes open learns that one was resized
//! or deleted (see [`Catalog::watch_volumes`]).

use crate::catalog::{Catalog, decode};
use crate::error::MetaError;
use crate::keys;
use crate::store::{MetaStore, Revision, WatchEvent};
use crate::volume::VolumeRecord;
use crate::watch::Backoff;
use std::sync::Arc;
use tokio::sync::mpsc;

/// A change to the volumes of a cluster, with the store revision it happened at (so that a
/// reader can tell it from a newer state it already has).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeEvent {
    /// Every volume as of `revision`. The first event, and again after the watch was lost: a
    /// volume missing from it is gone.
    All {
        volumes: Vec<VolumeRecord>,
        revision: Revision,
    },
    /// A volume was created, resized or marked deleting.
    Changed {
        record: VolumeRecord,
        revision: Revision,
    },
    /// The record of the volume with this name was removed.
    Removed { name: String, revision: Revision },
}

/// Every volume record as of one store revision ([`Catalog::list_volumes_at`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeListing {
    pub volumes: Vec<VolumeRecord>,
    /// Names of the records this version could not read (logged and left out of `volumes`):
    /// whoever concludes anything from a volume's absence must know that these exist.
    pub unreadable: Vec<String>,
    pub revision: Revision,
}

impl Catalog {
    /// Every volume this version can read, with the revision of the listing and how many
    /// records it could not read.
    pub async fn list_volumes_at(&self) -> Result<VolumeListing, MetaError> {
        listing(self.store().as_ref()).await
    }

    /// A volume by name, with the revision of its record (its `mod_revision`).
    pub async fn get_volume_at(
        &self,
        name: &str,
    ) -> Result<Option<(VolumeRecord, Revision)>, MetaError> {
        Ok(self
            .read(&keys::volume(name))
            .await?
            .map(|(rec, kv)| (rec, kv.mod_revision)))
    }

    /// Follows the volume records: the receiver yields [`VolumeEvent::All`] first, then every
    /// change in order. A lost watch or a store outage is handled inside (the volumes are
    /// listed again, as a new `All`). Dropping the receiver ends it.
    pub async fn watch_volumes(&self) -> Result<mpsc::Receiver<VolumeEvent>, MetaError> {
        // Fail early (and visibly) when the store is unreachable now.
        self.store().revision().await?;
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(follow(self.store().clone(), tx));
        Ok(rx)
    }
}

async fn follow(store: Arc<dyn MetaStore>, tx: mpsc::Sender<VolumeEvent>) {
    let mut backoff = Backoff::default();
    while backoff
        .after(follow_once(&*store, &tx).await, "the volumes", &tx)
        .await
    {}
}

/// Lists the volumes, then watches until the watch is lost or the receiver goes away.
async fn follow_once(
    store: &dyn MetaStore,
    tx: &mpsc::Sender<VolumeEvent>,
) -> Result<(), MetaError> {
    let listing = listing(store).await?;
    let all = VolumeEvent::All {
        volumes: listing.volumes,
        revision: listing.revision,
    };
    if tx.send(all).await.is_err() {
        return Ok(());
    }
    let from: Revision = listing.revision + 1;
    let mut events = store.watch_prefix(keys::VOLUMES, from).await?;
    loop {
        let event = tokio::select! {
            biased;
            ev = events.recv() => ev,
            _ = tx.closed() => return Ok(()),
        };
        let out = match event {
            Some(WatchEvent::Put(kv)) => match readable(&kv.key, &kv.value) {
                Some(record) => VolumeEvent::Changed {
                    record,
                    revision: kv.mod_revision,
                },
                None => continue,
            },
            Some(WatchEvent::Delete(kv)) => match keys::parse_volume(&kv.key) {
                Some(name) => VolumeEvent::Removed {
                    name: name.to_string(),
                    revision: kv.mod_revision,
                },
                None => continue,
            },
            Some(WatchEvent::Lost(reason)) => {
                tracing::debug!("volume watch lost ({reason}); listing again");
                return Ok(());
            }
            None => return Err(MetaError::Backend("the volume watch ended".into())),
        };
        if tx.send(out).await.is_err() {
            return Ok(());
        }
    }
}

async fn listing(store: &dyn MetaStore) -> Result<VolumeListing, MetaError> {
    let listing = store.list(keys::VOLUMES).await?;
    let mut volumes = Vec::with_capacity(listing.kvs.len());
    let mut unreadable = Vec::new();
    for kv in &listing.kvs {
        match readable(&kv.key, &kv.value) {
            Some(record) => volumes.push(record),
            None => unreadable.extend(keys::parse_volume(&kv.key).map(str::to_string)),
        }
    }
    Ok(VolumeListing {
        volumes,
        unreadable,
        revision: listing.revision,
    })
}

/// A record this version can read; an unreadable one (say, from a newer release) is logged and
/// skipped rather than stopping the watch for every other volume.
fn readable(key: &str, value: &[u8]) -> Option<VolumeRecord> {
    decode(key, value)
        .map_err(|e| tracing::warn!("skipping volume record {key}: {e}"))
        .ok()
}
