//! [`Volume`]: an open block volume.

use crate::cluster::Cluster;
use crate::error::ClientError;
use crate::meta::VolumeRecord;
use crate::openvolumes::LiveVolume;
use basalt_types::{PoolId, VolumeId};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// When an acknowledged write is durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// Every write is durable on the devices before it is acknowledged (write-through). The mode
    /// the benchmarks report, and what Ceph RBD gives.
    #[default]
    Sync,
    /// Writes are durable at the next flush or when sent with FUA, like a drive with a volatile
    /// write cache (write-back).
    Flush,
}

impl std::str::FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sync" => Ok(Durability::Sync),
            "flush" => Ok(Durability::Flush),
            other => Err(format!(
                "unknown durability '{other}': use 'sync' (durable on ack) or 'flush' (durable at FLUSH/FUA)"
            )),
        }
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Durability::Sync => "sync",
            Durability::Flush => "flush",
        })
    }
}

/// How a volume is opened.
#[derive(Clone, Copy, Debug, Default)]
pub struct VolumeOptions {
    pub durability: Durability,
}

/// An open volume. Share it (`Arc<Volume>`) between connections: all operations are `&self`.
pub struct Volume {
    pub(crate) cluster: Cluster,
    pub(crate) name: String,
    pub(crate) id: VolumeId,
    pub(crate) pool: PoolId,
    pub(crate) object_size: u32,
    pub(crate) durability: Durability,
    live: Arc<LiveVolume>,
    /// The losses of the volume's writes this handle's flushes reported, or that were found
    /// before it opened (`flushset.rs`).
    losses_seen: AtomicU64,
}

impl Volume {
    pub(crate) async fn new(
        cluster: Cluster,
        record: VolumeRecord,
        live: Arc<LiveVolume>,
        options: VolumeOptions,
    ) -> Result<Volume, ClientError> {
        let pool = cluster
            .catalog()
            .get_pool(record.pool)
            .await?
            .ok_or_else(|| ClientError::NoSuchPool(record.pool.to_string()))?;
        let losses_seen = AtomicU64::new(cluster.inner.unflushed.losses(record.id));
        Ok(Volume {
            losses_seen,
            cluster,
            name: record.name,
            id: record.id,
            pool: record.pool,
            object_size: pool.object_size,
            durability: options.durability,
            live,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn id(&self) -> VolumeId {
        self.id
    }

    pub fn pool(&self) -> PoolId {
        self.pool
    }

    /// Size in bytes, as of the newest record this handle has seen (it follows resizes).
    pub fn size(&self) -> u64 {
        self.live.size()
    }

    /// Whether the volume was deleted (or replaced by a new one of the same name) since it was
    /// opened; I/O then fails with [`ClientError::VolumeGone`].
    pub fn is_gone(&self) -> bool {
        self.live.is_gone()
    }

    pub fn object_size(&self) -> u32 {
        self.object_size
    }

    pub fn durability(&self) -> Durability {
        self.durability
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// Re-reads the volume's record from the metadata store now, without waiting for the watch.
    pub async fn refresh(&self) -> Result<u64, ClientError> {
        self.live.reload(self.cluster.catalog(), &self.name).await?;
        self.check_range(0, 0)?;
        Ok(self.size())
    }

    pub(crate) fn losses_seen(&self) -> u64 {
        self.losses_seen.load(Ordering::Acquire)
    }

    /// This handle reported the volume's first `count` losses.
    pub(crate) fn saw_losses(&self, count: u64) {
        self.losses_seen.fetch_max(count, Ordering::AcqRel);
    }

    pub(crate) fn check_range(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        if self.live.is_gone() {
            return Err(ClientError::VolumeGone(self.name.clone()));
        }
        let size = self.size();
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(ClientError::OutOfRange { offset, len, size }),
        }
    }
}
