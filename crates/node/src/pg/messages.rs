//! Peering and recovery messages between nodes, carried as JSON in `Peer` frames (object data
//! travels as the frame's binary payload). Every message names the member device it is for.

use super::info::MemberInfo;
use basalt_engine::{LogEntry, ObjectContent, ObjectImage, ObjectInfo};
use basalt_types::{DeviceId, Epoch, NodeId, ObjectId, PgId, Term, Version};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A request from a PG's primary to one member (or candidate member) of the PG.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum PeerMsg {
    /// A primary peers in `term`: promise to refuse sub-operations and messages of older terms,
    /// make everything applied so far durable, and say what you hold (answer `Holding`, or
    /// `Promised` when a newer term was promised already). The member promises once its map
    /// is at the primary's `epoch` and no read lease it granted at an older epoch runs, except
    /// to the primary's node `from` (`readlease.rs`).
    Query {
        device: DeviceId,
        pg: PgId,
        term: Term,
        #[serde(default)]
        epoch: Epoch,
        #[serde(default)]
        from: Option<NodeId>,
    },
    /// The PG's log after `since` (at most `limit` entries, oldest first).
    Log {
        device: DeviceId,
        pg: PgId,
        since: Version,
        limit: usize,
    },
    /// The current version (and whether it is a tombstone) of each object.
    Versions {
        device: DeviceId,
        pg: PgId,
        oids: Vec<ObjectId>,
    },
    /// The PG's objects and tombstones in object order after `after`.
    List {
        device: DeviceId,
        pg: PgId,
        after: Option<ObjectId>,
        limit: usize,
    },
    /// The whole object and its version (answer: `Image`, data as payload).
    Get {
        device: DeviceId,
        pg: PgId,
        oid: ObjectId,
    },
    /// The whole object as `Get`, except that blocks failing their checksum (or unreadable)
    /// read as zeros and are named instead of failing the answer (answer: `Salvaged`, data as payload): block-level
    /// repair merges such copies of one version (`pg/merge.rs`).
    Salvage {
        device: DeviceId,
        pg: PgId,
        oid: ObjectId,
    },
    /// The object's version, kind, allocation and a CRC-32C of its data (scrub): the member
    /// reads the whole object, which verifies every block's checksum (a bad block is refused
    /// with a checksum error).
    Digest {
        device: DeviceId,
        pg: PgId,
        oid: ObjectId,
    },
    /// Replace the object with this image (data as payload), durably. Like every message
    /// below that changes the member, refused when the member promised a newer term.
    Put {
        device: DeviceId,
        pg: PgId,
        term: Term,
        oid: ObjectId,
        image: ImageMeta,
    },
    /// Forget the object entirely (backfill removes what the primary does not have).
    Purge {
        device: DeviceId,
        pg: PgId,
        term: Term,
        oid: ObjectId,
    },
    /// `term` is active with this member: persist `info` (durably) and accept the term's
    /// sub-operations from now on. `readable`: the term is active with nothing missing on any
    /// member and no backfill target (`Primary::members_readable`), so the member may answer
    /// reads of its own copy (`replica_read.rs`).
    Activate {
        device: DeviceId,
        pg: PgId,
        term: Term,
        info: MemberInfo,
        #[serde(default)]
        readable: bool,
    },
    /// The PG's data is no longer needed on this device: forget all of it. Also refused when
    /// the member's own map still places the PG on the device.
    Remove {
        device: DeviceId,
        pg: PgId,
        term: Term,
    },
    /// Every member has every change up to `upto`: forget tombstones up to it.
    Trim {
        device: DeviceId,
        pg: PgId,
        term: Term,
        upto: Version,
    },
    /// Every write of `term` at or below `upto` is durable on every member: the commit
    /// watermark of `RepOp::committed`, sent once the PG's writes pause (`replica_read.rs`).
    Commit {
        device: DeviceId,
        pg: PgId,
        term: Term,
        upto: Version,
    },
}

impl PeerMsg {
    pub fn device(&self) -> DeviceId {
        match self {
            PeerMsg::Query { device, .. }
            | PeerMsg::Log { device, .. }
            | PeerMsg::Versions { device, .. }
            | PeerMsg::List { device, .. }
            | PeerMsg::Get { device, .. }
            | PeerMsg::Salvage { device, .. }
            | PeerMsg::Digest { device, .. }
            | PeerMsg::Put { device, .. }
            | PeerMsg::Purge { device, .. }
            | PeerMsg::Activate { device, .. }
            | PeerMsg::Remove { device, .. }
            | PeerMsg::Trim { device, .. }
            | PeerMsg::Commit { device, .. } => *device,
        }
    }
}

/// What a member holds of a PG, answered to `Query`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Holding {
    pub info: MemberInfo,
    /// The newest version in the member's log of the PG.
    pub last_update: Version,
    /// Changes up to this version may be missing from its log.
    pub log_tail: Version,
    pub objects: u64,
}

/// An object image's metadata; the data (for `Data`) is the message payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ImageMeta {
    pub version: Version,
    pub kind: ImageKind,
    /// Allocated blocks (bit b of word b/64), for `Data`.
    #[serde(default)]
    pub allocated: Vec<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ImageKind {
    Absent,
    Tombstone,
    Data,
}

impl ImageMeta {
    /// Splits an engine image into metadata and payload.
    pub fn of(image: ObjectImage) -> (ImageMeta, Bytes) {
        let (kind, allocated, data) = match image.content {
            ObjectContent::Absent => (ImageKind::Absent, Vec::new(), Bytes::new()),
            ObjectContent::Tombstone => (ImageKind::Tombstone, Vec::new(), Bytes::new()),
            ObjectContent::Data { data, allocated } => (ImageKind::Data, allocated, data),
        };
        (
            ImageMeta {
                version: image.version,
                kind,
                allocated,
            },
            data,
        )
    }

    /// Rebuilds the engine image from metadata and payload.
    pub fn into_image(self, data: Bytes) -> ObjectImage {
        let content = match self.kind {
            ImageKind::Absent => ObjectContent::Absent,
            ImageKind::Tombstone => ObjectContent::Tombstone,
            ImageKind::Data => ObjectContent::Data {
                data,
                allocated: self.allocated,
            },
        };
        ObjectImage {
            version: self.version,
            content,
        }
    }
}

/// What scrub compares of one copy of an object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ObjectDigest {
    pub version: Version,
    pub kind: ImageKind,
    #[serde(default)]
    pub allocated: Vec<u64>,
    /// CRC-32C of the object's data (zeros where unallocated); 0 for no data.
    pub crc: u32,
}

impl ObjectDigest {
    pub fn of(meta: &ImageMeta, data: &[u8]) -> ObjectDigest {
        ObjectDigest {
            version: meta.version,
            kind: meta.kind,
            allocated: meta.allocated.clone(),
            crc: if data.is_empty() {
                0
            } else {
                basalt_engine::crc32c(data)
            },
        }
    }
}

/// One object in a listing or a version answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Held {
    pub oid: ObjectId,
    pub version: Version,
    pub deleted: bool,
}

impl From<&ObjectInfo> for Held {
    fn from(o: &ObjectInfo) -> Held {
        Held {
            oid: o.oid,
            version: o.version,
            deleted: o.deleted,
        }
    }
}

impl From<&LogEntry> for Held {
    fn from(e: &LogEntry) -> Held {
        Held {
            oid: e.oid,
            version: e.version,
            deleted: e.deleted,
        }
    }
}

/// A member's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub(crate) enum PeerAnswer {
    Holding(Holding),
    /// The member promised this newer term already: the query is refused.
    Promised(Term),
    /// Log entries, or `trimmed` when changes since the asked version cannot be listed.
    Log {
        entries: Vec<Held>,
        trimmed: Option<Version>,
    },
    /// One per asked object, in order; `None`: the member knows nothing of it.
    Versions {
        held: Vec<Option<Held>>,
    },
    List {
        entries: Vec<Held>,
    },
    Image(ImageMeta),
    /// A salvaged image: the blocks listed failed their checksum (or could not be read) and
    /// read as zeros.
    Salvaged {
        image: ImageMeta,
        bad_blocks: Vec<u32>,
    },
    Digest(ObjectDigest),
    Done,
}

#[cfg(test)]
mod tests {
    use super::super::info::Backfill;
    use super::*;
    use basalt_types::{Epoch, PoolId, VolumeId};

    fn roundtrip<T: Serialize + for<'a> Deserialize<'a> + PartialEq + std::fmt::Debug>(v: T) {
        let json = serde_json::to_vec(&v).expect("serialises");
        let back: T = serde_json::from_slice(&json).expect("parses");
        assert_eq!(back, v);
    }

    #[test]
    fn every_message_and_answer_survives_json() {
        let (device, pg) = (
            DeviceId(3),
            PgId {
                pool: PoolId(1),
                pg: 7,
            },
        );
        let term = Term::new(Epoch(9), 2);
        let oid = ObjectId::new(PoolId(1), VolumeId(5), 11);
        let held = Held {
            oid,
            version: Version::new(9, 4),
            deleted: true,
        };
        let info = MemberInfo {
            les: Epoch(8),
            last_complete: Version::new(8, 1),
            backfill: Some(Backfill {
                term,
                cursor: Some(oid),
            }),
            activated: Epoch(9),
            suspect: false,
        };
        let image = ImageMeta {
            version: Version::new(9, 3),
            kind: ImageKind::Data,
            allocated: vec![1, u64::MAX],
        };
        let messages = [
            PeerMsg::Query {
                device,
                pg,
                term,
                epoch: Epoch(7),
                from: Some(NodeId(2)),
            },
            PeerMsg::Log {
                device,
                pg,
                since: Version::new(1, 2),
                limit: 10,
            },
            PeerMsg::Versions {
                device,
                pg,
                oids: vec![oid, oid],
            },
            PeerMsg::List {
                device,
                pg,
                after: Some(oid),
                limit: 5,
            },
            PeerMsg::Get { device, pg, oid },
            PeerMsg::Salvage { device, pg, oid },
            PeerMsg::Digest { device, pg, oid },
            PeerMsg::Put {
                device,
                pg,
                term,
                oid,
                image: image.clone(),
            },
            PeerMsg::Purge {
                device,
                pg,
                term,
                oid,
            },
            PeerMsg::Activate {
                device,
                pg,
                term,
                info,
                readable: true,
            },
            PeerMsg::Remove { device, pg, term },
            PeerMsg::Trim {
                device,
                pg,
                term,
                upto: Version::new(9, 9),
            },
            PeerMsg::Commit {
                device,
                pg,
                term,
                upto: Version::new(9, 8),
            },
        ];
        for m in messages {
            assert_eq!(m.device(), device);
            roundtrip(m);
        }
        let answers = [
            PeerAnswer::Holding(Holding {
                info,
                last_update: Version::new(9, 4),
                log_tail: Version::new(2, 0),
                objects: 12,
            }),
            PeerAnswer::Promised(term),
            PeerAnswer::Log {
                entries: vec![held],
                trimmed: Some(Version::new(1, 1)),
            },
            PeerAnswer::Versions {
                held: vec![Some(held), None],
            },
            PeerAnswer::List {
                entries: vec![held, held],
            },
            PeerAnswer::Digest(ObjectDigest::of(&image, &[7u8; 4096])),
            PeerAnswer::Salvaged {
                image: image.clone(),
                bad_blocks: vec![3, 9],
            },
            PeerAnswer::Image(image),
            PeerAnswer::Done,
        ];
        for a in answers {
            roundtrip(a);
        }
    }
}
