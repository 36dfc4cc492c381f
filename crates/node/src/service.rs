//! [`NodeService`]: the node's answer to every request, whatever transport brought it.

use crate::admin::AdminHandler;
use crate::collect::CollectStats;
use crate::lease::Fence;
use crate::mapstate::MapState;
use crate::pg::messages::PeerMsg;
use crate::pg::{Pg, Pgs};
use crate::server::ServerStats;
use crate::volumes::Volumes;
use crate::{delete, flush, read, write};
use basalt_proto::{
    ErrorCode, PROTOCOL_VERSION, Request, Response, ResponseFuture, Service, WireError,
};
use basalt_types::{DeviceId, Epoch, NodeId, ObjectId};
use bytes::Bytes;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::watch;

/// State shared by every request handler of one node.
pub(crate) struct NodeShared {
    pub(crate) id: NodeId,
    /// The requests being answered (`drain.rs`): counted for a clean stop, timed for status.
    pub(crate) in_flight: Arc<crate::drain::InFlight>,
    pub(crate) maps: Arc<MapState>,
    pub(crate) pgs: Arc<Pgs>,
    pub(crate) admin: AdminHandler,
    pub(crate) stopping: AtomicBool,
    /// Whether the node's lease still allows acknowledging data-path requests (`lease.rs`).
    pub(crate) fence: Arc<Fence>,
    /// Counters of the TCP server (`server.rs`).
    pub(crate) server_stats: Arc<ServerStats>,
    /// The volume records as the node knows them; writes are checked against them
    /// (`volumes/`).
    pub(crate) volumes: Volumes,
    /// What the collector of deleted volumes' objects did (`collect.rs`).
    pub(crate) collector: CollectStats,
    /// Reads served from (or refused by) this node's own copies as a member (`read.rs`).
    pub(crate) replica_reads: read::ReplicaReads,
    /// Local devices whose I/O hangs (`faults.rs`): sub-operations waiting on them are
    /// answered with an error instead of holding their connection's budget forever.
    pub(crate) hung: watch::Sender<BTreeSet<DeviceId>>,
    /// Each local device's recent latency (`latency.rs`), for `basalt status`.
    pub(crate) latency: crate::latency::Latencies,
    /// Why the node must stop for good: it was removed from the cluster while cut off from
    /// the metadata store (`lease.rs`; [`crate::Node::removed`]).
    pub(crate) removed: watch::Sender<Option<String>>,
    /// Changes when the node starts after a stop that may have lost acknowledged writes
    /// (`incarnation.rs`); in every write's and flush's answer.
    pub(crate) incarnation: u64,
}

/// The node as a [`Service`]: the TCP server calls it for each decoded frame, and a client in the
/// same process calls it directly.
#[derive(Clone)]
pub struct NodeService {
    pub(crate) shared: Arc<NodeShared>,
}

impl Service for NodeService {
    fn call(&self, req: Request) -> ResponseFuture {
        let shared = self.shared.clone();
        match req {
            // Handed to the store now, before the connection decodes its next frame: a PG's
            // sub-operations apply in the order the primary sent them.
            Request::Rep(op) => match shared.admit_data_path() {
                Ok(()) => {
                    let dev = op.device;
                    let pending = shared.pgs.rep(op);
                    Box::pin(async move {
                        let answer = shared.unless_hung(dev, pending).await;
                        if answer.is_ok() {
                            shared.fence.check()?;
                        }
                        answer
                    })
                }
                Err(e) => Box::pin(async move { Err(e) }),
            },
            req => Box::pin(async move { shared.handle(req).await }),
        }
    }
}

impl NodeShared {
    /// Answers one request. A data-path request (one that carries an epoch) is refused while
    /// the node is stopping or its lease is not confirmed, and its answer is checked against
    /// the lease again when it is ready: a node never acknowledges after its lease may have
    /// expired (`lease.rs`).
    pub(crate) async fn handle(&self, req: Request) -> Result<Response, WireError> {
        let data_path = req.epoch().is_some();
        if data_path {
            self.admit_data_path()?;
        }
        let answer = self.dispatch(req).await;
        if data_path && answer.is_ok() {
            self.fence.check()?;
        }
        answer
    }

    async fn dispatch(&self, req: Request) -> Result<Response, WireError> {
        match req {
            Request::Hello {
                min_version,
                max_version,
                ..
            } => self.hello(min_version, max_version),
            Request::Read {
                epoch,
                oid,
                offset,
                len,
            } => read::read(self, epoch, oid, offset, len).await,
            Request::ReadReplica {
                epoch,
                oid,
                offset,
                len,
            } => read::read_replica(self, epoch, oid, offset, len).await,
            Request::Write {
                epoch,
                oid,
                offset,
                version: _,
                fua,
                data,
                session,
            } => write::write(self, epoch, oid, offset, fua, data, session).await,
            Request::WriteZeroes {
                epoch,
                oid,
                offset,
                len,
                fua,
                session,
            } => write::write_zeroes(self, epoch, oid, offset, len, fua, session).await,
            Request::Trim {
                epoch,
                oid,
                offset,
                len,
                session,
            } => write::trim(self, epoch, oid, offset, len, session).await,
            Request::Flush { epoch } => flush::flush(self, epoch).await,
            Request::DeleteVolume {
                epoch,
                pool,
                volume,
                from_index,
            } => delete::delete_volume(self, epoch, pool, volume, from_index).await,
            Request::Ping { data } => Ok(Response::Pong {
                data: self.pgs.ctx.leases.answer(data, || self.maps.epoch()),
            }),
            Request::Admin { body } => self.admin.handle(self, body).await,
            Request::Meta { body } => self.admin.meta(body).await,
            Request::Rep(op) => self.pgs.rep(op).await,
            Request::Peer { json, payload, .. } => self.peer(json, payload).await,
        }
    }

    /// Refuses data-path requests while the node is stopping or its lease is not confirmed.
    fn admit_data_path(&self) -> Result<(), WireError> {
        if self.stopping.load(Ordering::Acquire) {
            return Err(WireError::new(
                ErrorCode::ShuttingDown,
                format!("{} is shutting down", self.id),
            ));
        }
        self.fence.check()
    }

    /// The PG whose primary is a device of this node, for a client request on `oid` sent with
    /// map `epoch` (older epochs are refused, newer ones wait for this node's map).
    pub(crate) async fn primary_pg(
        &self,
        epoch: Epoch,
        oid: &ObjectId,
    ) -> Result<Arc<Pg>, WireError> {
        let map = self.maps.admit(epoch).await?;
        let (pg, dev) = self.maps.primary_of(&map, oid)?;
        Ok(self
            .pgs
            .get(dev, pg)
            .expect("the primary is a local device"))
    }

    /// A peering or recovery message (JSON, then an optional payload).
    async fn peer(&self, json: Bytes, payload: Bytes) -> Result<Response, WireError> {
        let msg: PeerMsg = serde_json::from_slice(&json).map_err(|e| {
            WireError::new(ErrorCode::InvalidArgument, format!("bad peer message: {e}"))
        })?;
        let dev = msg.device();
        let (answer, payload) = self.unless_hung(dev, self.pgs.peer(msg, payload)).await?;
        let json = serde_json::to_vec(&answer).expect("answers serialise");
        Ok(Response::Peer {
            json: json.into(),
            payload,
        })
    }

    /// Waits for `work` on local device `dev`, unless the device hangs: once this node reported
    /// it down for that (`faults.rs`), the request fails instead. A hung device never answers,
    /// and a request waiting on it would hold a slot and its payload's bytes of the one
    /// connection another node reaches all of this node's devices on (`server.rs` budget)
    /// forever. Whatever the request began stays submitted; failing it is conservative (a
    /// sub-operation not acknowledged, a peering answer not given).
    async fn unless_hung<T>(
        &self,
        dev: DeviceId,
        work: impl Future<Output = Result<T, WireError>>,
    ) -> Result<T, WireError> {
        let mut hung = self.hung.subscribe();
        tokio::select! {
            biased;
            answer = work => answer,
            _ = hung.wait_for(|h| h.contains(&dev)) => Err(WireError::new(
                ErrorCode::DeviceFailed,
                format!("{dev} hangs (its node reported it down); the request is abandoned"),
            )),
        }
    }

    fn hello(&self, min: u8, max: u8) -> Result<Response, WireError> {
        if !(min..=max).contains(&PROTOCOL_VERSION) {
            return Err(WireError::new(
                ErrorCode::VersionMismatch,
                format!(
                    "client speaks protocol versions {min}..={max}; this node speaks {PROTOCOL_VERSION}"
                ),
            ));
        }
        Ok(Response::Hello {
            version: PROTOCOL_VERSION,
            node: self.id,
            epoch: self.maps.epoch(),
        })
    }
}
