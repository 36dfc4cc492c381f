//! Control-plane requests carried as JSON in `Admin` frames: node status, scrub (`basalt
//! scrub`) and the background scrub's rate, giving up unfound objects (`basalt pg
//! mark-unfound-lost`), and — on a node that
//! owns an embedded metadata store (`basalt up`) — a proxy to that store, so that CLI commands and
//! gateways in other processes can use it.

use crate::pg::PgSummary;
use crate::pg::throttle::NodeRecovery;
use crate::readlease::ReadLeaseStatus;
use crate::service::NodeShared;
use basalt_meta::MetaStore;
use basalt_proto::{ErrorCode, Response, WireError};
use basalt_types::{DeviceId, Epoch, NodeId, PgId, PoolId};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// A control-plane request.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum AdminRequest {
    /// The node's identity, map epoch and devices.
    Status,
    /// Scrub now every PG (of `pool`, if given) a device of this node is the active primary
    /// of: compare the copies of every object and repair bad ones. Answer: a `ScrubReport`.
    Scrub {
        #[serde(default)]
        pool: Option<PoolId>,
    },
    /// Set the background scrub's rate (bytes of object data per second; 0: off) until the node
    /// restarts. Answer: `Status`.
    SetScrubRate { bytes_per_sec: u64 },
    /// What a device of the node holds of each PG (`Vec<HeldPg>`).
    DevicePgs { device: DeviceId },
    /// Declare lost every unfound object of `pg` (a device of this node must be its active
    /// primary): each is deleted on every serving member. Answer: a `LostReport`.
    MarkUnfoundLost { pg: PgId },
}

/// A request in flight this long counts as slow in [`NodeStatus::slow_requests`].
pub const SLOW_REQUEST: std::time::Duration = std::time::Duration::from_secs(5);

/// What `Status` returns.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeStatus {
    pub node: NodeId,
    pub name: String,
    pub addr: String,
    pub version: String,
    /// The node's process id (on its own host).
    #[serde(default)]
    pub pid: Option<u32>,
    pub epoch: Epoch,
    pub uptime_secs: u64,
    /// Whether this node serves its metadata store to other processes.
    pub serves_meta: bool,
    /// Whether the node refuses data-path requests now because it cannot confirm its lease
    /// (metadata store unreachable, or registering again).
    #[serde(default)]
    pub fenced: bool,
    /// Times a client connection was paused because it had its in-flight budget in use.
    #[serde(default)]
    pub backpressure_pauses: u64,
    /// Passes the collector of deleted volumes' objects completed since the node started.
    #[serde(default)]
    pub collector_passes: u64,
    /// Objects and tombstones of deleted volumes the collector removed since the node started.
    #[serde(default)]
    pub collected_objects: u64,
    /// Copies this node repaired as a PG primary (read repair and scrub), and objects it found
    /// with no good copy, since it started.
    #[serde(default)]
    pub repaired_objects: u64,
    #[serde(default)]
    pub unrepairable_objects: u64,
    /// The background scrub's rate (bytes of object data per second; 0: off).
    #[serde(default)]
    pub scrub_bytes_per_sec: u64,
    /// PGs and objects scrubbed (background and `basalt scrub`) since the node started.
    #[serde(default)]
    pub scrubbed_pgs: u64,
    #[serde(default)]
    pub scrubbed_objects: u64,
    /// Reads this node answered from its own copies as a serving member (`ReadReplica`, from a
    /// gateway in its process), and those it refused (read from the primary instead), since
    /// it started.
    #[serde(default)]
    pub replica_reads: u64,
    #[serde(default)]
    pub replica_reads_refused: u64,
    /// Client I/O and replication sub-operations in flight here for [`SLOW_REQUEST`] or
    /// longer (`drain.rs::InFlight::waiting`: a member or device that does not answer, an
    /// object waiting for its recovery), and how long the oldest in flight has waited, ms.
    #[serde(default)]
    pub slow_requests: u64,
    #[serde(default)]
    pub oldest_request_ms: Option<u64>,
    pub devices: Vec<DeviceStatus>,
    /// The PGs whose primary is a device of this node: state, missing objects, recovery.
    #[serde(default)]
    pub pgs: Vec<PgSummary>,
    /// What the node's recovery moved, its rate over the last seconds, its throttle.
    #[serde(default)]
    pub recovery: NodeRecovery,
    /// Read leases granted and held (`readlease.rs`, failure-model.md rule 9).
    #[serde(default)]
    pub read_leases: ReadLeaseStatus,
}

/// One device in [`NodeStatus`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeviceStatus {
    pub id: DeviceId,
    pub io_backend: String,
    pub object_size: u32,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub objects: u64,
    /// Deleted objects the store remembers (until their log is trimmed or they are collected).
    #[serde(default)]
    pub tombstones: u64,
    pub journal_used: u64,
    pub journal_size: u64,
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    /// Bytes clients wrote, bytes the store wrote to the device for them (journal, slots,
    /// tables: the quotient is the write amplification), and the journal records that
    /// carried them (bytes per record: how well concurrent writes share a record).
    #[serde(default)]
    pub bytes_written: u64,
    #[serde(default)]
    pub device_bytes_written: u64,
    #[serde(default)]
    pub journal_records: u64,
    /// Of those, records written durable by themselves (`RWF_DSYNC`: a lone durable write, no
    /// flush after it).
    #[serde(default)]
    pub durable_records: u64,
    pub checksum_errors: u64,
    /// Device reads of object data that failed on the medium (a latent sector error, a
    /// failing drive): handled as checksum errors (repaired from another copy where one is
    /// good).
    #[serde(default)]
    pub read_errors: u64,
    /// How long the oldest I/O in flight on the device has waited, in milliseconds (`None`:
    /// nothing in flight). A device that hangs shows here; past `--device-stall-timeout` its
    /// node reports it down (`faults.rs`).
    #[serde(default)]
    pub oldest_io_ms: Option<u64>,
    /// Mean milliseconds per device read or write completed in the last 10 s (`None`: none
    /// completed), and how many completed (`latency.rs`). `basalt status` warns about a device
    /// much slower than its peers (`device_slow`).
    #[serde(default)]
    pub io_latency_ms: Option<f64>,
    #[serde(default)]
    pub recent_ios: u64,
    /// Mean milliseconds per device flush (fdatasync) completed in the last 10 s.
    #[serde(default)]
    pub flush_latency_ms: Option<f64>,
    /// PGs of this device marked suspect: its store dropped journal records of theirs as a
    /// torn tail when it opened (a write that never completed, or damage to its newest
    /// records), so they may lack writes it acknowledged until a peering recovers them.
    #[serde(default)]
    pub suspect_pgs: u64,
}

pub(crate) struct AdminHandler {
    pub(crate) meta: Option<Arc<dyn MetaStore>>,
    pub(crate) name: String,
    pub(crate) addr: String,
    pub(crate) started: Instant,
}

impl AdminHandler {
    pub(crate) async fn handle(
        &self,
        node: &NodeShared,
        body: Bytes,
    ) -> Result<Response, WireError> {
        let req: AdminRequest = serde_json::from_slice(&body).map_err(|e| {
            WireError::new(
                ErrorCode::InvalidArgument,
                format!("bad admin request: {e}"),
            )
        })?;
        let answer = match req {
            AdminRequest::Status => serde_json::to_vec(&self.status(node)),
            AdminRequest::Scrub { pool } => serde_json::to_vec(&node.pgs.scrub_now(pool).await),
            AdminRequest::SetScrubRate { bytes_per_sec } => {
                node.pgs.scrub.rate.store(bytes_per_sec, Relaxed);
                tracing::info!(bytes_per_sec, "background scrub rate set");
                serde_json::to_vec(&self.status(node))
            }
            AdminRequest::MarkUnfoundLost { pg } => {
                serde_json::to_vec(&node.pgs.mark_unfound_lost(pg).await?)
            }
            AdminRequest::DevicePgs { device } => match node.pgs.held(device).await {
                Some(Ok(held)) => serde_json::to_vec(&held),
                Some(Err(e)) => return Err(WireError::new(ErrorCode::Internal, e.to_string())),
                None => {
                    return Err(WireError::new(
                        ErrorCode::NotFound,
                        format!("{device} is not a device of this node"),
                    ));
                }
            },
        };
        let body = answer
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("encoding answer: {e}")))?;
        Ok(Response::Admin { body: body.into() })
    }

    /// Answers a metadata-store call from another process (only on a node serving its store).
    pub(crate) async fn meta(&self, body: Bytes) -> Result<Response, WireError> {
        let Some(store) = &self.meta else {
            return Err(WireError::new(
                ErrorCode::Unsupported,
                "this node does not serve its metadata store; use the cluster's etcd",
            ));
        };
        let call: basalt_meta::remote::MetaCall = serde_json::from_slice(&body).map_err(|e| {
            WireError::new(
                ErrorCode::InvalidArgument,
                format!("bad metadata call: {e}"),
            )
        })?;
        let answer = basalt_meta::remote::serve(store.as_ref(), call).await;
        let body = serde_json::to_vec(&answer)
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("encoding answer: {e}")))?;
        Ok(Response::Meta { body: body.into() })
    }

    pub(crate) fn status(&self, node: &NodeShared) -> NodeStatus {
        let latency = node.latency.lock().expect("latency map lock").clone();
        let mut devices: Vec<DeviceStatus> = node
            .maps
            .stores()
            .values()
            .map(|s| {
                let (info, st) = (s.info(), s.stats());
                let lat = latency.get(&info.device_id).copied().unwrap_or_default();
                DeviceStatus {
                    id: info.device_id,
                    io_backend: info.io_backend.to_string(),
                    object_size: info.object_size,
                    capacity_bytes: st.capacity_bytes,
                    used_bytes: st.used_bytes,
                    free_bytes: st.free_bytes,
                    objects: st.objects,
                    tombstones: st.tombstones,
                    journal_used: st.journal_used,
                    journal_size: st.journal_size,
                    reads: st.reads,
                    writes: st.writes,
                    flushes: st.flushes,
                    bytes_written: st.bytes_written,
                    device_bytes_written: st.device_bytes_written,
                    journal_records: st.journal_records,
                    durable_records: st.durable_records,
                    checksum_errors: st.checksum_errors,
                    read_errors: st.read_errors,
                    oldest_io_ms: st
                        .oldest_io_age
                        .map(|a| u64::try_from(a.as_millis()).unwrap_or(u64::MAX)),
                    io_latency_ms: lat.io_ms,
                    recent_ios: lat.ios,
                    flush_latency_ms: lat.flush_ms,
                    suspect_pgs: node.pgs.suspect_count(info.device_id),
                }
            })
            .collect();
        devices.sort_by_key(|d| d.id);
        let waiting = node.in_flight.waiting(SLOW_REQUEST);
        NodeStatus {
            node: node.id,
            name: self.name.clone(),
            addr: self.addr.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            pid: Some(std::process::id()),
            epoch: node.maps.epoch(),
            uptime_secs: self.started.elapsed().as_secs(),
            serves_meta: self.meta.is_some(),
            fenced: node.fence.check().is_err(),
            backpressure_pauses: node
                .server_stats
                .pauses
                .load(std::sync::atomic::Ordering::Relaxed),
            collector_passes: node.collector.passes.load(Relaxed),
            collected_objects: node.collector.objects.load(Relaxed),
            repaired_objects: node.pgs.repaired(),
            unrepairable_objects: node.pgs.unrepairable(),
            scrub_bytes_per_sec: node.pgs.scrub.rate.load(Relaxed),
            scrubbed_pgs: node.pgs.scrub.pgs.load(Relaxed),
            scrubbed_objects: node.pgs.scrub.objects.load(Relaxed),
            replica_reads: node.replica_reads.served.load(Relaxed),
            replica_reads_refused: node.replica_reads.refused.load(Relaxed),
            slow_requests: waiting.count,
            oldest_request_ms: waiting
                .oldest
                .map(|a| u64::try_from(a.as_millis()).unwrap_or(u64::MAX)),
            devices,
            pgs: node.pgs.summaries(),
            recovery: node.pgs.recovery(),
            read_leases: node.pgs.ctx.leases.status(),
        }
    }
}
