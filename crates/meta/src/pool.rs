//! Pools: a protection scheme, a PG count, an object size and a placement rule.

use crate::catalog::{Catalog, encode, now_secs};
use crate::error::MetaError;
use crate::keys::{self, IdKind};
use crate::store::{Compare, Txn, TxnOp};
pub use basalt_types::FailureDomain;
use basalt_types::name::validate_name;
use basalt_types::{BLOCK_SIZE, DEFAULT_OBJECT_SIZE, PoolId};
use serde::{Deserialize, Serialize};

/// Most copies a pool may keep.
pub const MAX_REPLICAS: u8 = 16;
/// Most placement groups a pool may have.
pub const MAX_PG_COUNT: u32 = 65_536;
/// Largest object size (objects are the unit of atomic writes and of device slots).
pub const MAX_OBJECT_SIZE: u32 = 16 << 20;

/// A stored pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRecord {
    pub id: PoolId,
    pub name: String,
    pub replicas: u8,
    pub pg_count: u32,
    pub object_size: u32,
    pub failure_domain: FailureDomain,
    #[serde(default)]
    pub device_class: Option<String>,
    /// Unix seconds.
    pub created_at: u64,
}

/// What to create: a pool's settings without its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSpec {
    pub name: String,
    pub replicas: u8,
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
            pg_count: spec.pg_count,
            object_size: spec.object_size,
            failure_domain: spec.failure_domain,
            device_class: spec.device_class.clone(),
            created_at: now_secs(),
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
        Ok(self.read(&keys::pool(id)).await?.map(|(rec, _)| rec))
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
        self.read_all(keys::POOLS).await
    }
}
