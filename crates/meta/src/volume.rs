//! Volumes: named block devices in a pool.
//!
//! Life of a volume: [`Catalog::create_volume`] (Active) -> [`Catalog::resize_volume`]* ->
//! [`Catalog::mark_volume_deleting`] (Deleting; the client then removes the data) ->
//! [`Catalog::remove_volume`] (the record goes). A Deleting volume cannot be resized or
//! re-created until it is removed, so an interrupted delete is finished by running it again.

use crate::catalog::{Catalog, encode, now_secs};
use crate::error::MetaError;
use crate::keys::{self, IdKind};
use crate::store::{Compare, Txn, TxnOp, TxnOpResult};
use basalt_types::name::validate_name;
use basalt_types::size::format_size;
use basalt_types::{BLOCK_SIZE, PoolId, VolumeId};
use serde::{Deserialize, Serialize};

/// The largest volume: 1 PiB.
pub const MAX_VOLUME_SIZE: u64 = 1 << 50;

/// A stored volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub id: VolumeId,
    pub name: String,
    pub pool: PoolId,
    /// Bytes; a multiple of 4096.
    pub size: u64,
    /// Unix seconds.
    pub created_at: u64,
    pub state: VolumeState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum VolumeState {
    Active,
    /// Being deleted: its data is being removed; the record goes last.
    Deleting,
}

/// Checks a volume size: positive, a multiple of 4096, at most [`MAX_VOLUME_SIZE`].
pub fn validate_volume_size(name: &str, size: u64) -> Result<(), MetaError> {
    let bad = |reason: String| MetaError::InvalidSize {
        name: name.to_string(),
        size,
        reason,
    };
    if size == 0 {
        return Err(bad("a volume needs a size above zero, e.g. 10GiB".into()));
    }
    if size > MAX_VOLUME_SIZE {
        return Err(bad(format!(
            "the largest volume is {}",
            format_size(MAX_VOLUME_SIZE)
        )));
    }
    if !size.is_multiple_of(BLOCK_SIZE) {
        let up = size.div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
        return Err(bad(format!(
            "use a multiple of {BLOCK_SIZE} bytes, e.g. {}",
            format_size(up)
        )));
    }
    Ok(())
}

impl Catalog {
    /// Creates volume `name` of `size` bytes in the pool named `pool`.
    ///
    /// The name must be valid and unused, the size valid, the pool existing; one transaction
    /// checks name and pool, so of several concurrent creators of one name exactly one wins
    /// and the others get [`MetaError::VolumeExists`].
    pub async fn create_volume(
        &self,
        name: &str,
        size: u64,
        pool: &str,
    ) -> Result<VolumeRecord, MetaError> {
        validate_name(name)?;
        validate_volume_size(name, size)?;
        let key = keys::volume(name);
        if let Some(existing) = self.get_volume(name).await? {
            return Err(exists_error(&existing));
        }
        let id = VolumeId(self.next_id(IdKind::Volume).await?);
        // The transaction compares the pool record's revision: a pool being deleted (or
        // changed) meanwhile makes it fail, and it is tried again on the new state.
        for _ in 0..10 {
            let (pool_rec, pool_rev) = self.pool_for_volume(pool).await?;
            let record = VolumeRecord {
                id,
                name: name.to_string(),
                pool: pool_rec.id,
                size,
                created_at: now_secs(),
                state: VolumeState::Active,
            };
            let pool_key = keys::pool(pool_rec.id);
            let txn = Txn::new()
                .when([
                    Compare::missing(&key),
                    Compare::mod_revision_is(&pool_key, pool_rev),
                ])
                .and_then([TxnOp::put(&key, encode(&record))])
                .or_else([TxnOp::get(&key)]);
            let result = self.store().txn(txn).await?;
            if result.succeeded {
                return Ok(record);
            }
            if let Some(TxnOpResult::Get(Some(kv))) = result.results.first() {
                let existing: VolumeRecord = crate::catalog::decode(&key, &kv.value)?;
                return Err(exists_error(&existing));
            }
        }
        Err(MetaError::Contention {
            key: keys::volume(name),
            attempts: 10,
        })
    }

    /// The pool named `pool` and its record's revision, if volumes may be created in it.
    async fn pool_for_volume(
        &self,
        pool: &str,
    ) -> Result<(crate::pool::PoolRecord, crate::store::Revision), MetaError> {
        let id = self
            .get_pool_by_name(pool)
            .await?
            .ok_or_else(|| MetaError::NoSuchPool(pool.to_string()))?
            .id;
        let (rec, rev) = self
            .get_pool_at(id)
            .await?
            .ok_or_else(|| MetaError::NoSuchPool(pool.to_string()))?;
        if rec.deleting {
            return Err(MetaError::PoolDeleting(pool.to_string()));
        }
        Ok((rec, rev))
    }

    /// A volume by name.
    pub async fn get_volume(&self, name: &str) -> Result<Option<VolumeRecord>, MetaError> {
        Ok(self.read(&keys::volume(name)).await?.map(|(rec, _)| rec))
    }

    /// Every volume, by name.
    pub async fn list_volumes(&self) -> Result<Vec<VolumeRecord>, MetaError> {
        self.read_all(keys::VOLUMES).await
    }

    /// Sets a volume's size (bigger or smaller; the caller deals with data past a new end).
    /// A compare-and-swap on the record: a concurrent change (another resize, a delete) is never
    /// overwritten with stale fields; the resize is re-applied to the new state or refused.
    pub async fn resize_volume(
        &self,
        name: &str,
        new_size: u64,
    ) -> Result<VolumeRecord, MetaError> {
        self.resize_volume_from(name, None, new_size).await
    }

    /// Like [`Catalog::resize_volume`], but only while the volume is still `from` bytes (when
    /// given): a resize that prepared the data for one size never commits over another one's.
    pub async fn resize_volume_from(
        &self,
        name: &str,
        from: Option<u64>,
        new_size: u64,
    ) -> Result<VolumeRecord, MetaError> {
        validate_volume_size(name, new_size)?;
        let (record, _) = self
            .update(&keys::volume(name), |cur: Option<VolumeRecord>| {
                let mut v = cur.ok_or_else(|| MetaError::NoSuchVolume(name.to_string()))?;
                if v.state == VolumeState::Deleting {
                    return Err(MetaError::VolumeDeleting(name.to_string()));
                }
                if let Some(from) = from
                    && v.size != from
                {
                    return Err(MetaError::VolumeChanged {
                        name: name.to_string(),
                        expected: from,
                        found: v.size,
                    });
                }
                v.size = new_size;
                Ok(v)
            })
            .await?;
        Ok(record)
    }

    /// Marks a volume Deleting (idempotent) and returns its record.
    pub async fn mark_volume_deleting(&self, name: &str) -> Result<VolumeRecord, MetaError> {
        let (record, _) = self
            .update(&keys::volume(name), |cur: Option<VolumeRecord>| {
                let mut v = cur.ok_or_else(|| MetaError::NoSuchVolume(name.to_string()))?;
                v.state = VolumeState::Deleting;
                Ok(v)
            })
            .await?;
        Ok(record)
    }

    /// Removes the record of a volume marked Deleting (after its data is gone).
    pub async fn remove_volume(&self, name: &str) -> Result<(), MetaError> {
        let key = keys::volume(name);
        let (record, kv) = self
            .read::<VolumeRecord>(&key)
            .await?
            .ok_or_else(|| MetaError::NoSuchVolume(name.to_string()))?;
        if record.state != VolumeState::Deleting {
            return Err(MetaError::VolumeNotDeleting(name.to_string()));
        }
        let txn = Txn::new()
            .when([Compare::mod_revision_is(&key, kv.mod_revision)])
            .and_then([TxnOp::delete(&key)]);
        if self.store().txn(txn).await?.succeeded {
            Ok(())
        } else {
            // Only a concurrent remove can change a Deleting record.
            Err(MetaError::NoSuchVolume(name.to_string()))
        }
    }
}

fn exists_error(existing: &VolumeRecord) -> MetaError {
    match existing.state {
        VolumeState::Deleting => MetaError::VolumeDeleting(existing.name.clone()),
        _ => MetaError::VolumeExists(existing.name.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked() {
        assert!(validate_volume_size("v", 4096).is_ok());
        assert!(validate_volume_size("v", MAX_VOLUME_SIZE).is_ok());
        for bad in [0, 1, 4095, 4097, MAX_VOLUME_SIZE + 4096, u64::MAX] {
            assert!(
                matches!(
                    validate_volume_size("v", bad),
                    Err(MetaError::InvalidSize { .. })
                ),
                "{bad} accepted"
            );
        }
        let msg = validate_volume_size("v", 5000)
            .expect_err("5000")
            .to_string();
        assert!(
            msg.contains("multiple of 4096") && msg.contains("8KiB"),
            "{msg}"
        );
    }
}
