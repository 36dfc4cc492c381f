//! Pools: a protection scheme, a PG count, an object size and a placement rule.

use crate::catalog::{Catalog, encode, now_secs};
use crate::error::MetaError;
use crate::keys::{self, IdKind};
use crate::store::{Compare, Revision, Txn, TxnOp};
pub use basalt_types::FailureDomain;
use basalt_types::name::validate_name;
use basalt_types::{BLOCK_SIZE, DEFAULT_OBJECT_SIZE, PoolId};
use serde::{Deserialize, Serialize};

/// Most copies a pool may keep.
pub const MAX_REPLICAS: u8 = 16;
/// Most placement groups a pool may have (2^20: ~100 per device for 30 000 devices at 3 copies).
pub const MAX_PG_COUNT: u32 = 1 << 20;
/// Largest object size (objects are the unit of atomic writes and of device slots).
pub const MAX_OBJECT_SIZE: u32 = 16 << 20;

/// A stored pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRecord {
    pub id: PoolId,
    pub name: String,
    pub replicas: u8,
    /// Copies a PG needs to accept writes (used once replication exists). 0 in records of
    /// older versions: read as the default for `replicas` ([`default_min_size`]).
    #[serde(default)]
    pub min_size: u8,
    pub pg_count: u32,
    pub object_size: u32,
    pub failure_domain: FailureDomain,
    #[serde(default)]
    pub device_class: Option<String>,
    /// Unix seconds.
    pub created_at: u64,
    /// Set while `basalt pool delete` checks that the pool holds no volume; volumes cannot be
    /// created in it meanwhile.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
}

/// The default `min_size` of a pool with `replicas` copies: a majority, `replicas -
/// replicas / 2` (2 of 3, 1 of 1 or 2).
pub fn default_min_size(replicas: u8) -> u8 {
    replicas - replicas / 2
}

impl PoolRecord {
    /// Fills in what records of older versions lack.
    fn normalized(mut self) -> PoolRecord {
        if self.min_size == 0 {
            self.min_size = default_min_size(self.replicas);
        }
        self
    }
}

/// What to create: a pool's settings without its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSpec {
    pub name: String,
    pub replicas: u8,
    /// `None` = [`default_min_size`] of `replicas`.
    pub min_size: Option<u8>,
    pub pg_count: u32,
    pub object_size: u32,
    pub failure_domain: FailureDomain,
    pub device_class: Option<String>,
}

impl PoolSpec {
    /// A pool named `name` with the defaults: 3 copies on different hosts, 128 PGs, 128 KiB
    /// objects, any device class.
    pub fn new(name: impl Into<String>) -> PoolSpec {
        PoolSpec {
            name: name.into(),
            replicas: 3,
            min_size: None,
            pg_count: 128,
            object_size: DEFAULT_OBJECT_SIZE,
            failure_domain: FailureDomain::Host,
            device_class: None,
        }
    }

    /// Checks the settings; the error says which one is wrong and what is allowed.
    pub fn validate(&self) -> Result<(), MetaError> {
        validate_name(&self.name)?;
        let bad = |reason: String| MetaError::InvalidPool {
            name: self.name.clone(),
            reason,
        };
        if !(1..=MAX_REPLICAS).contains(&self.replicas) {
            return Err(bad(format!(
                "replicas is {}; use 1 to {MAX_REPLICAS}",
                self.replicas
            )));
        }
        validate_min_size(&self.name, self.replicas, self.min_size())?;
        if !(1..=MAX_PG_COUNT).contains(&self.pg_count) {
            return Err(bad(format!(
                "pg_count is {}; use 1 to {MAX_PG_COUNT}",
                self.pg_count
            )));
        }
        let os = self.object_size;
        if !os.is_power_of_two() || u64::from(os) < BLOCK_SIZE || os > MAX_OBJECT_SIZE {
            return Err(bad(format!(
                "object_size is {os}; use a power of two from {BLOCK_SIZE} to {MAX_OBJECT_SIZE}"
            )));
        }
        if let Some(class) = &self.device_class {
            validate_name(class)?;
        }
        Ok(())
    }
}

impl PoolSpec {
    /// The `min_size` the pool gets.
    pub fn min_size(&self) -> u8 {
        self.min_size
            .unwrap_or_else(|| default_min_size(self.replicas))
    }
}

fn validate_min_size(name: &str, replicas: u8, min_size: u8) -> Result<(), MetaError> {
    if (1..=replicas).contains(&min_size) {
        return Ok(());
    }
    Err(MetaError::InvalidPool {
        name: name.to_string(),
        reason: format!("min_size is {min_size}; use 1 to replicas ({replicas})"),
    })
}

/// The value of a pool-name index key.
#[derive(Serialize, Deserialize)]
struct PoolName {
    id: PoolId,
}

impl Catalog {
    /// Creates a pool. Names are unique, enforced by a transaction even under concurrent
    /// creates: exactly one of several creators of one name succeeds, the others get
    /// [`MetaError::PoolExists`].
    pub async fn create_pool(&self, spec: &PoolSpec) -> Result<PoolRecord, MetaError> {
        spec.validate()?;
        let id = PoolId(
            u32::try_from(self.next_id(IdKind::Pool).await?).map_err(|_| {
                MetaError::InvalidPool {
                    name: spec.name.clone(),
                    reason: "pool ids are exhausted".into(),
                }
            })?,
        );
        let record = PoolRecord {
            id,
            name: spec.name.clone(),
            replicas: spec.replicas,
            min_size: spec.min_size(),
            pg_count: spec.pg_count,
            object_size: spec.object_size,
            failure_domain: spec.failure_domain,
            device_class: spec.device_class.clone(),
            created_at: now_secs(),
            deleting: false,
        };
        let name_key = keys::pool_name(&spec.name);
        let txn = Txn::new().when([Compare::missing(&name_key)]).and_then([
            TxnOp::put(keys::pool(id), encode(&record)),
            TxnOp::put(&name_key, encode(&PoolName { id })),
        ]);
        if self.store().txn(txn).await?.succeeded {
            Ok(record)
        } else {
            Err(MetaError::PoolExists(spec.name.clone()))
        }
    }

    /// A pool by id.
    pub async fn get_pool(&self, id: PoolId) -> Result<Option<PoolRecord>, MetaError> {
        Ok(self.get_pool_at(id).await?.map(|(rec, _)| rec))
    }

    /// A pool by id, with the revision of its record.
    pub(crate) async fn get_pool_at(
        &self,
        id: PoolId,
    ) -> Result<Option<(PoolRecord, Revision)>, MetaError> {
        let found = self.read::<PoolRecord>(&keys::pool(id)).await?;
        Ok(found.map(|(rec, kv)| (rec.normalized(), kv.mod_revision)))
    }

    /// A pool by name.
    pub async fn get_pool_by_name(&self, name: &str) -> Result<Option<PoolRecord>, MetaError> {
        let Some((index, _)) = self.read::<PoolName>(&keys::pool_name(name)).await? else {
            return Ok(None);
        };
        self.get_pool(index.id).await
    }

    /// Every pool, by id.
    pub async fn list_pools(&self) -> Result<Vec<PoolRecord>, MetaError> {
        let pools: Vec<PoolRecord> = self.read_all(keys::POOLS).await?;
        Ok(pools.into_iter().map(PoolRecord::normalized).collect())
    }

    /// Sets a pool's `min_size` (1 to its replicas); compare-and-swap on the record.
    pub async fn set_pool_min_size(
        &self,
        name: &str,
        min_size: u8,
    ) -> Result<PoolRecord, MetaError> {
        let id = self.pool_id(name).await?;
        let (record, _) = self
            .update(&keys::pool(id), |cur: Option<PoolRecord>| {
                let mut p = cur
                    .ok_or_else(|| MetaError::NoSuchPool(name.to_string()))?
                    .normalized();
                validate_min_size(name, p.replicas, min_size)?;
                p.min_size = min_size;
                Ok(p)
            })
            .await?;
        Ok(record)
    }

    /// Deletes a pool that holds no volume. The pool is first marked `deleting` (so volume
    /// creation, which compares the pool record's revision, cannot slip in), then checked for
    /// volumes: if it has some it is unmarked and [`MetaError::PoolInUse`] names them.
    pub async fn delete_pool(&self, name: &str) -> Result<PoolRecord, MetaError> {
        let id = self.pool_id(name).await?;
        let (marked, rev) = self
            .update(&keys::pool(id), |cur: Option<PoolRecord>| {
                let mut p = cur.ok_or_else(|| MetaError::NoSuchPool(name.to_string()))?;
                p.deleting = true;
                Ok(p)
            })
            .await?;
        let volumes: Vec<String> = self
            .list_volumes()
            .await?
            .into_iter()
            .filter(|v| v.pool == id)
            .map(|v| v.name)
            .collect();
        if !volumes.is_empty() {
            self.update(&keys::pool(id), |cur: Option<PoolRecord>| {
                let mut p = cur.ok_or_else(|| MetaError::NoSuchPool(name.to_string()))?;
                p.deleting = false;
                Ok(p)
            })
            .await?;
            return Err(MetaError::PoolInUse {
                pool: name.to_string(),
                volumes: volumes.join(", "),
            });
        }
        let txn = Txn::new()
            .when([Compare::mod_revision_is(keys::pool(id), rev)])
            .and_then([
                TxnOp::delete(keys::pool(id)),
                TxnOp::delete(keys::pool_name(name)),
            ]);
        if !self.store().txn(txn).await?.succeeded {
            return Err(MetaError::Contention {
                key: keys::pool(id),
                attempts: 1,
            });
        }
        Ok(marked.normalized())
    }

    async fn pool_id(&self, name: &str) -> Result<PoolId, MetaError> {
        let (index, _) = self
            .read::<PoolName>(&keys::pool_name(name))
            .await?
            .ok_or_else(|| MetaError::NoSuchPool(name.to_string()))?;
        Ok(index.id)
    }
}
