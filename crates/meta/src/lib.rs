//! Cluster metadata: the [`MetaStore`] trait with its two backends, the key schema, and the
//! typed [`Catalog`] every other crate uses.
//!
//! The layers, bottom up:
//!
//! 1. [`MetaStore`] (store.rs): get / put / delete / prefix list / compare-and-swap [`Txn`] /
//!    prefix watch from a revision / leases, with etcd's revision semantics.
//!    - [`EtcdStore`] (etcd.rs): a real etcd cluster, keys under a configurable prefix.
//!    - [`EmbeddedStore`] (embedded/): one redb file, for single-process clusters and tests.
//!    - Both deliver watch events the same way (watch.rs) and pass one conformance suite
//!      (tests/conformance.rs).
//! 2. [`keys`]: the whole key schema (docs/design/metadata-keys.md).
//! 3. [`Catalog`] (catalog.rs): versioned JSON records and compare-and-swap helpers, with one
//!    file per noun: pool.rs, volume.rs, node.rs (nodes and devices), map.rs (the cluster map:
//!    a header and chunks), pg_ready.rs (PG-ready reports), leader.rs (election), settings.rs (cluster-wide settings), report.rs (failure reports),
//!    volume_watch.rs (following volume records). lease.rs keeps a lease
//!    alive ([`KeepAlive`]).
//! 4. [`EtcdProcess`] (etcd_process.rs): a child etcd for `basalt up --etcd` and tests.
//! 5. [`remote`]: store calls as serde values, so a process that owns a store (a `basalt up`
//!    node with the embedded store) can serve it to other processes.
//!
//! Start here: [`Catalog::create_volume`] (a typical catalog operation), [`MetaStore::txn`]
//! (the primitive everything rests on), [`Catalog::watch_map`] (how clients follow the map).

mod catalog;
pub mod clock;
mod embedded;
mod error;
mod etcd;
mod etcd_process;
pub mod keys;
mod leader;
mod lease;
mod map;
mod node;
mod pg_history;
mod pg_ready;
mod pool;
pub mod remote;
mod remove;
mod report;
mod settings;
mod store;
mod volume;
mod volume_watch;
mod watch;

pub use catalog::{Catalog, RECORD_VERSION};
pub use embedded::EmbeddedStore;
pub use error::MetaError;
pub use etcd::{EtcdStore, REQUEST_TIMEOUT};
pub use etcd_process::{ETCD_DEFAULT_REQUEST_BYTES, EtcdOptions, EtcdProcess};
pub use keys::IdKind;
pub use leader::{LeaderRecord, Leadership};
pub use lease::KeepAlive;
pub use map::{MAP_TXN_BYTES, StoredMap};
pub use node::{
    DECLARED_LOST, DeviceRecord, DeviceRegistration, DeviceState, LEFT_BEHIND, NodeRecord,
    OutReason, default_weight,
};
pub use pg_history::{PgHistory, PgInterval};
pub use pg_ready::PgReadyRecord;
pub use pool::{
    FailureDomain, MAX_OBJECT_SIZE, MAX_PG_COUNT, MAX_REPLICAS, PoolRecord, PoolSpec,
    default_min_size,
};
pub use remove::{NodeDevices, RemovedRecord};
pub use report::FailureReport;
pub use settings::ClusterSettings;
pub use store::{
    Compare, CompareOp, CompareTarget, KeyValue, LeaseId, Listing, MetaStore, Revision, Txn, TxnOp,
    TxnOpResult, TxnResult, WATCH_BUFFER, WatchEvent, WatchReceiver,
};
pub use volume::{MAX_VOLUME_SIZE, VolumeRecord, VolumeState, validate_volume_size};
pub use volume_watch::{VolumeEvent, VolumeListing};
