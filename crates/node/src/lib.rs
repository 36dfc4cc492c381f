//! The Basalt storage node (`basalt node`, and inside `basalt up`).
//!
//! A node owns one store per device (`basalt-engine`) and serves the wire protocol
//! (`basalt-proto`) over TCP ([`server`]) and, for clients in the same process, as a direct
//! [`basalt_proto::Service`] ([`Node::service`]).
//!
//! Flow of a request:
//! 1. `server.rs` decodes a frame (or a local client calls the service directly).
//! 2. `service.rs::NodeShared::handle` dispatches by kind to `read.rs`, `write.rs`, `flush.rs`,
//!    `delete.rs` or `admin.rs`.
//! 3. Each data-path handler first passes `mapstate.rs::MapState::admit` (the request's map
//!    epoch must be the node's: stale epochs are refused) and `primary_store` (this node must
//!    hold the primary of the object's PG: the first up member of its acting set); writes then
//!    pass `volumes/mod.rs::Volumes::admit_write` or `admit_discard` (the volume exists and the
//!    write ends within its size), then the handler calls the store.
//! 4. Store errors become wire errors in one place, `error.rs::engine_to_wire`.
//!
//! Around that: `node.rs` starts and stops a node (identity, devices, registration under a
//! lease, map and volume following; a clean stop finishes the requests in flight, `drain.rs`,
//! and then revokes the lease so that the node leaves at once), `collect.rs` removes the
//! objects of deleted volumes in the background, `faults.rs` reports devices whose store failed
//! (or that return repeated checksum errors) down, `pg/scrub.rs` compares the copies of every
//! object in the background, and `leader.rs` is the elected leader
//! computing and publishing maps (input from `gather.rs`, woken by `changes.rs`; nodes its
//! peers cannot reach marked down by `reports.rs`, from the failure reports each node's
//! `heartbeat.rs` writes).
//!
//! Start here: [`Node::start`], then `service.rs`.

pub mod admin;
mod advertise;
mod changes;
mod collect;
pub mod config;
mod delete;
mod devices;
mod drain;
pub mod error;
mod faults;
mod filed;
mod flush;
mod gather;
mod heartbeat;
mod identity;
mod incarnation;
mod latency;
mod leader;
mod lease;
mod leasebound;
mod mapstate;
mod node;
mod peers;
mod pg;
mod read;
mod readlease;
mod reports;
mod server;
mod service;
mod sessions;
#[cfg(feature = "sim")]
pub mod sim;
mod stopmark;
#[cfg(test)]
mod testing;
mod volumes;
mod write;

pub use admin::{AdminRequest, DeviceStatus, NodeStatus, SLOW_REQUEST};
pub use basalt_engine::{DirLock, lock_dir};
pub use config::{
    DEFAULT_CHECKSUM_ERROR_LIMIT, DEFAULT_CHECKSUM_ERROR_WINDOW, DEFAULT_COLLECT_INTERVAL,
    DEFAULT_COLLECT_RATE, DEFAULT_DEVICE_STALL_TIMEOUT, DEFAULT_DOWN_OUT_INTERVAL,
    DEFAULT_SCRUB_RATE, DeviceConfig, NodeConfig,
};
pub use error::NodeError;
pub use heartbeat::HeartbeatConfig;
pub use node::Node;
pub use pg::held::HeldPg;
pub use pg::lost::LostReport;
pub use pg::scrub::{PgScrub, ScrubReport};
pub use pg::throttle::{Limits as RecoveryLimits, NodeRecovery, RateView};
pub use pg::{PgStatusView, PgSummary, Tuning};
pub use readlease::{LeaseGrant, ReadLeaseStatus};
pub use reports::ReportRules;
pub use server::{MAX_IN_FLIGHT, MAX_IN_FLIGHT_BYTES};
