//! Messages between nodes: the sub-operation a PG's primary sends to the other members of its
//! acting set (and to backfill targets), and the peering/recovery control messages.
//!
//! | opcode | request body | request data | response body | response data |
//! |---|---|---|---|---|
//! | 11 Rep | epoch u64, device u32, pool u32, pg u32, interval u64, round u64, object, version, kind u8, 0u8×3, offset u32, len u32, committed version, prior version | write: the bytes | - | - |
//! | 12 Peer | epoch u64, json_len u32 | JSON message ‖ payload | json_len u32 | JSON answer ‖ payload |
//!
//! `kind`: 1 write (`len` = data length), 2 write-zeroes, 3 delete. A Rep is always durable on
//! the member before it is answered. `interval` and `round` are the primary's term (the PG
//! interval and its peering round); a member applies only sub-operations of the term it was
//! activated in, and none once it promised a newer term. `committed` is the primary's
//! watermark when it sent the sub-operation: every write of its term at or below it is durable on
//! every member (and acknowledged, or about to be); a member serves a read of its own copy
//! (`ReadReplica`) only of an object whose version is at or below the newest watermark it got.
//! `prior` is the version of the primary's write to the same object still in flight when it sent
//! this one (0.0: none): the member applies this write only onto that version, so a member where
//! the earlier write failed does not apply the later one either.
//! Peer messages are JSON (defined by the node: peering is rare and its shapes change more often
//! than the data path's), with an optional binary payload (object images) after the JSON.

use crate::error::ProtoError;
use basalt_types::{DeviceId, Epoch, ObjectId, PgId, PoolId, Term, Version, VolumeId};
use bytes::{Buf, BufMut, Bytes, BytesMut};

/// What a sub-operation does to the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RepKind {
    /// Write the request's data at `offset`.
    Write {
        offset: u32,
    },
    Zeroes {
        offset: u32,
        len: u32,
    },
    Delete,
}

/// One write-class operation, forwarded by a PG's primary to another member at the version the
/// primary assigned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepOp {
    /// The sender's map epoch.
    pub epoch: Epoch,
    /// The member (a device of the receiving node) that must apply it.
    pub device: DeviceId,
    pub pg: PgId,
    /// The primary's term (its interval and peering round) in which it assigned `version`.
    pub term: Term,
    pub oid: ObjectId,
    pub version: Version,
    pub kind: RepKind,
    pub data: Bytes,
    /// Every write of `term` at or below this version is durable on every member: the primary's
    /// commit watermark when it sent this one (this write is above it).
    pub committed: Version,
    /// The version this write follows: that of the primary's earlier write to the object still
    /// in flight when this one was sent (the member applies it only onto that version);
    /// `Version::NONE` when there was none (no check).
    pub prior: Version,
}

pub(crate) const REP_BODY_LEN: usize = 8 + 4 + 4 + 4 + 8 + 8 + 20 + 16 + 4 + 4 + 4 + 16 + 16;

const KIND_WRITE: u8 = 1;
const KIND_ZEROES: u8 = 2;
const KIND_DELETE: u8 = 3;

impl RepOp {
    pub(crate) fn write_body(&self, b: &mut BytesMut) -> Bytes {
        b.put_u64_le(self.epoch.0);
        b.put_u32_le(self.device.0);
        b.put_u32_le(self.pg.pool.0);
        b.put_u32_le(self.pg.pg);
        b.put_u64_le(self.term.interval.0);
        b.put_u64_le(self.term.round);
        b.put_u32_le(self.oid.pool.0);
        b.put_u64_le(self.oid.volume.0);
        b.put_u64_le(self.oid.index);
        b.put_u64_le(self.version.epoch);
        b.put_u64_le(self.version.seq);
        let (kind, offset, len) = match self.kind {
            RepKind::Write { offset } => (KIND_WRITE, offset, self.data.len() as u32),
            RepKind::Zeroes { offset, len } => (KIND_ZEROES, offset, len),
            RepKind::Delete => (KIND_DELETE, 0, 0),
        };
        b.put_u8(kind);
        b.put_bytes(0, 3);
        b.put_u32_le(offset);
        b.put_u32_le(len);
        b.put_u64_le(self.committed.epoch);
        b.put_u64_le(self.committed.seq);
        b.put_u64_le(self.prior.epoch);
        b.put_u64_le(self.prior.seq);
        self.data.clone()
    }

    pub(crate) fn decode(mut b: Bytes, data: Bytes) -> Result<RepOp, ProtoError> {
        if b.len() != REP_BODY_LEN {
            return Err(ProtoError::BadBodyLength {
                opcode: "Rep",
                len: b.len(),
                expected: REP_BODY_LEN,
            });
        }
        let epoch = Epoch(b.get_u64_le());
        let device = DeviceId(b.get_u32_le());
        let pg = PgId {
            pool: PoolId(b.get_u32_le()),
            pg: b.get_u32_le(),
        };
        let term = Term::new(Epoch(b.get_u64_le()), b.get_u64_le());
        let oid = ObjectId::new(
            PoolId(b.get_u32_le()),
            VolumeId(b.get_u64_le()),
            b.get_u64_le(),
        );
        let version = Version::new(b.get_u64_le(), b.get_u64_le());
        let kind = b.get_u8();
        b.advance(3);
        let (offset, len) = (b.get_u32_le(), b.get_u32_le());
        let committed = Version::new(b.get_u64_le(), b.get_u64_le());
        let prior = Version::new(b.get_u64_le(), b.get_u64_le());
        let bad = |detail: &str| ProtoError::Malformed {
            what: "Rep",
            detail: detail.to_string(),
        };
        if oid.pool != pg.pool {
            return Err(bad("object and PG are in different pools"));
        }
        let kind = match kind {
            KIND_WRITE if len as usize == data.len() && len > 0 => RepKind::Write { offset },
            KIND_ZEROES if data.is_empty() && len > 0 => RepKind::Zeroes { offset, len },
            KIND_DELETE if data.is_empty() && offset == 0 && len == 0 => RepKind::Delete,
            KIND_WRITE | KIND_ZEROES | KIND_DELETE => {
                return Err(bad("length does not match the kind and data"));
            }
            _ => return Err(bad("unknown kind")),
        };
        Ok(RepOp {
            epoch,
            device,
            pg,
            term,
            oid,
            version,
            kind,
            data,
            committed,
            prior,
        })
    }
}

/// Splits a Peer data part into its JSON and its payload.
pub(crate) fn split_peer(json_len: u32, data: Bytes) -> Result<(Bytes, Bytes), ProtoError> {
    let n = json_len as usize;
    if n > data.len() {
        return Err(ProtoError::Malformed {
            what: "Peer",
            detail: format!("JSON of {n} bytes in a data part of {}", data.len()),
        });
    }
    let mut json = data;
    let payload = json.split_off(n);
    Ok((json, payload))
}

/// Joins JSON and payload into one data part (copies them: peer messages are not on the hot
/// path).
pub(crate) fn join_peer(json: &Bytes, payload: &Bytes) -> Bytes {
    if payload.is_empty() {
        return json.clone();
    }
    let mut out = BytesMut::with_capacity(json.len() + payload.len());
    out.put_slice(json);
    out.put_slice(payload);
    out.freeze()
}
