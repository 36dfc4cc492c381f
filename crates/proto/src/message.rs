//! Typed requests and responses, and their body layouts.
//!
//! Requests and their successful responses share an opcode; a response sets `FLAG_RESPONSE`, an
//! error response also sets `FLAG_ERROR` and carries a [`WireError`] body. All integers are
//! little-endian. An object reference is 20 bytes: `pool u32 | volume u64 | index u64`; a version
//! is 16 bytes: `epoch u64 | seq u64`.
//!
//! | opcode | request body | request data | response body | response data |
//! |---|---|---|---|---|
//! | 1 Hello | min_ver u8, max_ver u8, name_len u16, name | - | version u8, 0u8×3, node u32, epoch u64 | - |
//! | 2 Read | epoch u64, object, offset u32, len u32 | - | - | the bytes |
//! | 3 Write | epoch u64, object, offset u32, version, session | the bytes | version, incarnation u64 | - |
//! | 4 WriteZeroes | epoch u64, object, offset u32, len u32, session | - | version, incarnation u64 | - |
//! | 5 Trim | epoch u64, object, offset u32, len u32, session | - | version, incarnation u64 | - |
//! | 6 Flush | epoch u64 | - | incarnation u64 | - |
//! | 7 DeleteVolume | epoch u64, pool u32, volume u64, from_index u64 | - | objects u64 | - |
//! | 8 Ping | - | any bytes | - | the same bytes |
//! | 9 Admin | - | JSON request | - | JSON response |
//! | 10 Meta | - | JSON metadata call | - | JSON answer |
//! | 13 ReadReplica | epoch u64, object, offset u32, len u32 | - | - | the bytes |
//!
//! A session is 16 bytes: `client u64 | generation u64` ([`Session`]).
//!
//! Error body: `code u16 | 0u16 | epoch u64 | msg_len u16 | msg (UTF-8, at most 1024 bytes)`.

use crate::decoder::Frame;
use crate::error::{ErrorCode, ProtoError, WireError};
use crate::frame::{FLAG_ERROR, FLAG_FUA, FLAG_RESPONSE, FrameHeader, PROTOCOL_VERSION};
use crate::replication::{RepOp, join_peer, split_peer};
use basalt_types::{Epoch, NodeId, ObjectId, PoolId, Version, VolumeId};
use bytes::{Buf, BufMut, Bytes, BytesMut};

const OP_HELLO: u8 = 1;
const OP_READ: u8 = 2;
const OP_WRITE: u8 = 3;
const OP_WRITE_ZEROES: u8 = 4;
const OP_TRIM: u8 = 5;
const OP_FLUSH: u8 = 6;
const OP_DELETE_VOLUME: u8 = 7;
const OP_PING: u8 = 8;
const OP_ADMIN: u8 = 9;
const OP_META: u8 = 10;
const OP_REP: u8 = 11;
const OP_PEER: u8 = 12;
const OP_READ_REPLICA: u8 = 13;

const OBJECT_LEN: usize = 20;
const VERSION_LEN: usize = 16;
const SESSION_LEN: usize = 16;
const MAX_NAME_LEN: usize = 256;
const MAX_MESSAGE_LEN: usize = 1024;

/// A request from a client (or another node) to a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// First message on a connection: the range of protocol versions the client speaks.
    Hello {
        min_version: u8,
        max_version: u8,
        client: String,
    },
    Read {
        epoch: Epoch,
        oid: ObjectId,
        offset: u32,
        len: u32,
    },
    /// Reads from the receiving node's own copy of the object, which is not the primary's: served
    /// only when that copy is a serving member's that may answer reads in its term (see the
    /// node's `pg/replica_read.rs`), else refused (`Busy`): the client reads from the primary
    /// instead. A gateway sends it to the node in its own process, skipping a network hop.
    ReadReplica {
        epoch: Epoch,
        oid: ObjectId,
        offset: u32,
        len: u32,
    },
    /// Writes `data` at `offset` in the object. `version` is [`Version::NONE`] for "next version"
    /// (what clients send); a primary forwarding to replicas sets the version it assigned.
    Write {
        epoch: Epoch,
        oid: ObjectId,
        offset: u32,
        version: Version,
        fua: bool,
        data: Bytes,
        session: Session,
    },
    WriteZeroes {
        epoch: Epoch,
        oid: ObjectId,
        offset: u32,
        len: u32,
        fua: bool,
        session: Session,
    },
    Trim {
        epoch: Epoch,
        oid: ObjectId,
        offset: u32,
        len: u32,
        session: Session,
    },
    /// Makes every write this node acknowledged before the flush durable.
    Flush { epoch: Epoch },
    /// Removes every object of a volume held by this node whose index is `from_index` or more
    /// (0 deletes the volume's data; a larger value truncates it after a shrink).
    DeleteVolume {
        epoch: Epoch,
        pool: PoolId,
        volume: VolumeId,
        from_index: u64,
    },
    /// Echoes `data`: round-trip time and throughput probes.
    Ping { data: Bytes },
    /// A control-plane request, JSON-encoded (see the node's admin module).
    Admin { body: Bytes },
    /// A metadata-store call, JSON-encoded (`basalt_meta::remote`), answered by a node that
    /// serves its embedded metadata store to other processes.
    Meta { body: Bytes },
    /// A sub-operation from a PG's primary to another member (see [`crate::replication`]).
    Rep(RepOp),
    /// A peering or recovery message between nodes: JSON, then an optional binary payload.
    Peer {
        epoch: Epoch,
        json: Bytes,
        payload: Bytes,
    },
}

/// Who sent a write, for the node to refuse one its client may have given up on: `client` names
/// one client (the random id of a `basalt_client::Cluster`; 0: none, never refused), `generation` grows
/// each time that client ends an attempt at this node without its answer (a timeout, a lost
/// connection, a reroute). A node remembers the newest generation each client sent it and
/// versions no write of an older one: a write the client stopped waiting for can no longer
/// land after a write it sent later (see the node's `sessions.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Session {
    pub client: u64,
    pub generation: u64,
}

impl Session {
    /// No session: the write is never refused for one (tools, tests, node-internal writes).
    pub const NONE: Session = Session {
        client: 0,
        generation: 0,
    };
}

/// A node's successful answer. Errors travel as [`WireError`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    Hello {
        version: u8,
        node: NodeId,
        epoch: Epoch,
    },
    Read {
        data: Bytes,
    },
    /// Answer to Write, WriteZeroes and Trim: the object's new version, and the
    /// [durability incarnation](Response::Flushed) of the node that acknowledged it, or 0 when
    /// the write is durable already (FUA, or a replicated PG: no flush owes it anything).
    Written {
        version: Version,
        incarnation: u64,
    },
    /// Every write the node acknowledged before the flush is durable, unless the node lost
    /// writes it acknowledged in between: `incarnation` changes whenever the node starts
    /// after a stop that may have lost acknowledged writes that were not durable yet (a crash),
    /// so a client compares it with the one its writes were acknowledged in.
    Flushed {
        incarnation: u64,
    },
    Deleted {
        objects: u64,
    },
    Pong {
        data: Bytes,
    },
    Admin {
        body: Bytes,
    },
    Meta {
        body: Bytes,
    },
    /// The member has the sub-operation durable.
    RepDone,
    Peer {
        json: Bytes,
        payload: Bytes,
    },
}

impl Request {
    fn opcode(&self) -> u8 {
        match self {
            Request::Hello { .. } => OP_HELLO,
            Request::Read { .. } => OP_READ,
            Request::ReadReplica { .. } => OP_READ_REPLICA,
            Request::Write { .. } => OP_WRITE,
            Request::WriteZeroes { .. } => OP_WRITE_ZEROES,
            Request::Trim { .. } => OP_TRIM,
            Request::Flush { .. } => OP_FLUSH,
            Request::DeleteVolume { .. } => OP_DELETE_VOLUME,
            Request::Ping { .. } => OP_PING,
            Request::Admin { .. } => OP_ADMIN,
            Request::Meta { .. } => OP_META,
            Request::Rep(_) => OP_REP,
            Request::Peer { .. } => OP_PEER,
        }
    }

    /// The epoch a data-path request was sent with; `None` for Hello, Ping and Admin.
    pub fn epoch(&self) -> Option<Epoch> {
        match self {
            Request::Read { epoch, .. }
            | Request::ReadReplica { epoch, .. }
            | Request::Write { epoch, .. }
            | Request::WriteZeroes { epoch, .. }
            | Request::Trim { epoch, .. }
            | Request::Flush { epoch }
            | Request::DeleteVolume { epoch, .. }
            | Request::Peer { epoch, .. } => Some(*epoch),
            Request::Rep(op) => Some(op.epoch),
            Request::Hello { .. }
            | Request::Ping { .. }
            | Request::Admin { .. }
            | Request::Meta { .. } => None,
        }
    }

    /// Sets the session of a client's write (Write, WriteZeroes, Trim) and says whether it is
    /// one; other requests carry none.
    pub fn set_session(&mut self, to: Session) -> bool {
        if let Request::Write { session, .. }
        | Request::WriteZeroes { session, .. }
        | Request::Trim { session, .. } = self
        {
            *session = to;
            return true;
        }
        false
    }

    fn write_body(&self, b: &mut BytesMut) -> (u16, Bytes) {
        match self {
            Request::Hello {
                min_version,
                max_version,
                client,
            } => {
                let mut end = client.len().min(MAX_NAME_LEN);
                while !client.is_char_boundary(end) {
                    end -= 1;
                }
                let name = &client.as_bytes()[..end];
                b.put_u8(*min_version);
                b.put_u8(*max_version);
                b.put_u16_le(name.len() as u16);
                b.put_slice(name);
                (0, Bytes::new())
            }
            Request::Read {
                epoch,
                oid,
                offset,
                len,
            }
            | Request::ReadReplica {
                epoch,
                oid,
                offset,
                len,
            } => {
                put_range(b, *epoch, oid, *offset, *len);
                (0, Bytes::new())
            }
            Request::Write {
                epoch,
                oid,
                offset,
                version,
                fua,
                data,
                session,
            } => {
                b.put_u64_le(epoch.0);
                put_object(b, oid);
                b.put_u32_le(*offset);
                put_version(b, *version);
                put_session(b, *session);
                (fua_flag(*fua), data.clone())
            }
            Request::WriteZeroes {
                epoch,
                oid,
                offset,
                len,
                fua,
                session,
            } => {
                put_range(b, *epoch, oid, *offset, *len);
                put_session(b, *session);
                (fua_flag(*fua), Bytes::new())
            }
            Request::Trim {
                epoch,
                oid,
                offset,
                len,
                session,
            } => {
                put_range(b, *epoch, oid, *offset, *len);
                put_session(b, *session);
                (0, Bytes::new())
            }
            Request::Flush { epoch } => {
                b.put_u64_le(epoch.0);
                (0, Bytes::new())
            }
            Request::DeleteVolume {
                epoch,
                pool,
                volume,
                from_index,
            } => {
                b.put_u64_le(epoch.0);
                b.put_u32_le(pool.0);
                b.put_u64_le(volume.0);
                b.put_u64_le(*from_index);
                (0, Bytes::new())
            }
            Request::Ping { data } => (0, data.clone()),
            Request::Admin { body } | Request::Meta { body } => (0, body.clone()),
            Request::Rep(op) => (FLAG_FUA, op.write_body(b)),
            Request::Peer {
                epoch,
                json,
                payload,
            } => {
                b.put_u64_le(epoch.0);
                b.put_u32_le(json.len() as u32);
                (0, join_peer(json, payload))
            }
        }
    }

    /// Decodes a request frame (one without `FLAG_RESPONSE`).
    pub fn decode(frame: &Frame) -> Result<Request, ProtoError> {
        let h = &frame.header;
        if h.is_response() {
            return Err(malformed("request", "frame is marked as a response"));
        }
        let fua = h.flags & FLAG_FUA != 0;
        let mut b = frame.body.clone();
        let data = frame.data.clone();
        let req = match h.opcode {
            OP_HELLO => {
                need_at_least(&b, 4, "Hello")?;
                let min_version = b.get_u8();
                let max_version = b.get_u8();
                let len = b.get_u16_le() as usize;
                expect_len(&b, len, "Hello")?;
                let client = String::from_utf8(b.to_vec())
                    .map_err(|_| malformed("Hello", "client name is not UTF-8"))?;
                Request::Hello {
                    min_version,
                    max_version,
                    client,
                }
            }
            OP_READ => {
                let (epoch, oid, offset, len) = get_range(&mut b, "Read")?;
                Request::Read {
                    epoch,
                    oid,
                    offset,
                    len,
                }
            }
            OP_READ_REPLICA => {
                let (epoch, oid, offset, len) = get_range(&mut b, "ReadReplica")?;
                Request::ReadReplica {
                    epoch,
                    oid,
                    offset,
                    len,
                }
            }
            OP_WRITE => {
                expect_len(&b, 8 + OBJECT_LEN + 4 + VERSION_LEN + SESSION_LEN, "Write")?;
                let epoch = Epoch(b.get_u64_le());
                let oid = get_object(&mut b);
                let offset = b.get_u32_le();
                let version = get_version(&mut b);
                Request::Write {
                    epoch,
                    oid,
                    offset,
                    version,
                    fua,
                    data,
                    session: get_session(&mut b),
                }
            }
            OP_WRITE_ZEROES => {
                let (epoch, oid, offset, len, session) = get_range_in(&mut b, "WriteZeroes")?;
                Request::WriteZeroes {
                    epoch,
                    oid,
                    offset,
                    len,
                    fua,
                    session,
                }
            }
            OP_TRIM => {
                let (epoch, oid, offset, len, session) = get_range_in(&mut b, "Trim")?;
                Request::Trim {
                    epoch,
                    oid,
                    offset,
                    len,
                    session,
                }
            }
            OP_FLUSH => {
                expect_len(&b, 8, "Flush")?;
                Request::Flush {
                    epoch: Epoch(b.get_u64_le()),
                }
            }
            OP_DELETE_VOLUME => {
                expect_len(&b, 28, "DeleteVolume")?;
                Request::DeleteVolume {
                    epoch: Epoch(b.get_u64_le()),
                    pool: PoolId(b.get_u32_le()),
                    volume: VolumeId(b.get_u64_le()),
                    from_index: b.get_u64_le(),
                }
            }
            OP_PING => {
                expect_len(&b, 0, "Ping")?;
                Request::Ping { data }
            }
            OP_ADMIN => {
                expect_len(&b, 0, "Admin")?;
                Request::Admin { body: data }
            }
            OP_META => {
                expect_len(&b, 0, "Meta")?;
                Request::Meta { body: data }
            }
            OP_REP => Request::Rep(RepOp::decode(b, data)?),
            OP_PEER => {
                expect_len(&b, 12, "Peer")?;
                let epoch = Epoch(b.get_u64_le());
                let (json, payload) = split_peer(b.get_u32_le(), data)?;
                Request::Peer {
                    epoch,
                    json,
                    payload,
                }
            }
            other => return Err(ProtoError::UnknownOpcode(other)),
        };
        if !matches!(
            req,
            Request::Write { .. }
                | Request::Ping { .. }
                | Request::Admin { .. }
                | Request::Meta { .. }
                | Request::Rep(_)
                | Request::Peer { .. }
        ) && !frame.data.is_empty()
        {
            return Err(malformed("request", "unexpected data part"));
        }
        Ok(req)
    }
}

impl Response {
    fn opcode(&self) -> u8 {
        match self {
            Response::Hello { .. } => OP_HELLO,
            Response::Read { .. } => OP_READ,
            Response::Written { .. } => OP_WRITE,
            Response::Flushed { .. } => OP_FLUSH,
            Response::Deleted { .. } => OP_DELETE_VOLUME,
            Response::Pong { .. } => OP_PING,
            Response::Admin { .. } => OP_ADMIN,
            Response::Meta { .. } => OP_META,
            Response::RepDone => OP_REP,
            Response::Peer { .. } => OP_PEER,
        }
    }

    fn write_body(&self, b: &mut BytesMut) -> Bytes {
        match self {
            Response::Hello {
                version,
                node,
                epoch,
            } => {
                b.put_u8(*version);
                b.put_slice(&[0; 3]);
                b.put_u32_le(node.0);
                b.put_u64_le(epoch.0);
                Bytes::new()
            }
            Response::Read { data } => data.clone(),
            Response::Written {
                version,
                incarnation,
            } => {
                put_version(b, *version);
                b.put_u64_le(*incarnation);
                Bytes::new()
            }
            Response::Flushed { incarnation } => {
                b.put_u64_le(*incarnation);
                Bytes::new()
            }
            Response::Deleted { objects } => {
                b.put_u64_le(*objects);
                Bytes::new()
            }
            Response::Pong { data } => data.clone(),
            Response::Admin { body } | Response::Meta { body } => body.clone(),
            Response::RepDone => Bytes::new(),
            Response::Peer { json, payload } => {
                b.put_u32_le(json.len() as u32);
                join_peer(json, payload)
            }
        }
    }

    /// Decodes a response frame: `Ok(Ok(_))` for success, `Ok(Err(_))` for an error the node sent.
    /// The opcode of a successful answer to Write, WriteZeroes and Trim, and to Read and
    /// ReadReplica, is that of the request.
    pub fn decode(frame: &Frame) -> Result<Result<Response, WireError>, ProtoError> {
        let h = &frame.header;
        if !h.is_response() {
            return Err(malformed("response", "frame is not marked as a response"));
        }
        let mut b = frame.body.clone();
        if h.is_error() {
            return decode_error(&mut b).map(Err);
        }
        let resp = match h.opcode {
            OP_HELLO => {
                expect_len(&b, 16, "Hello response")?;
                let version = b.get_u8();
                b.advance(3);
                Response::Hello {
                    version,
                    node: NodeId(b.get_u32_le()),
                    epoch: Epoch(b.get_u64_le()),
                }
            }
            OP_READ | OP_READ_REPLICA => {
                expect_len(&b, 0, "Read response")?;
                Response::Read {
                    data: frame.data.clone(),
                }
            }
            OP_WRITE | OP_WRITE_ZEROES | OP_TRIM => {
                expect_len(&b, VERSION_LEN + 8, "Write response")?;
                Response::Written {
                    version: get_version(&mut b),
                    incarnation: b.get_u64_le(),
                }
            }
            OP_FLUSH => {
                expect_len(&b, 8, "Flush response")?;
                Response::Flushed {
                    incarnation: b.get_u64_le(),
                }
            }
            OP_DELETE_VOLUME => {
                expect_len(&b, 8, "DeleteVolume response")?;
                Response::Deleted {
                    objects: b.get_u64_le(),
                }
            }
            OP_PING => Response::Pong {
                data: frame.data.clone(),
            },
            OP_ADMIN => Response::Admin {
                body: frame.data.clone(),
            },
            OP_META => Response::Meta {
                body: frame.data.clone(),
            },
            OP_REP => {
                expect_len(&b, 0, "Rep response")?;
                Response::RepDone
            }
            OP_PEER => {
                expect_len(&b, 4, "Peer response")?;
                let (json, payload) = split_peer(b.get_u32_le(), frame.data.clone())?;
                Response::Peer { json, payload }
            }
            other => return Err(ProtoError::UnknownOpcode(other)),
        };
        Ok(Ok(resp))
    }
}

/// Encodes a request: header and body are appended to `out`; the returned data part must be
/// written right after them (it is not copied).
pub fn encode_request(request_id: u64, req: &Request, out: &mut BytesMut) -> Bytes {
    let start = out.len();
    out.put_bytes(0, crate::HEADER_LEN);
    let (flags, data) = req.write_body(out);
    finish(out, start, req.opcode(), flags, request_id, &data);
    data
}

/// Encodes a response (or an error response, for the request's opcode) like [`encode_request`].
pub fn encode_response(
    request_id: u64,
    opcode_of: &RequestKind,
    resp: &Result<Response, WireError>,
    out: &mut BytesMut,
) -> Bytes {
    let start = out.len();
    out.put_bytes(0, crate::HEADER_LEN);
    let (opcode, flags, data) = match resp {
        Ok(r) => {
            let data = r.write_body(out);
            // Written answers Write, WriteZeroes and Trim, Read answers Read and ReadReplica:
            // keep the request's opcode.
            let op = match r {
                Response::Written { .. } | Response::Read { .. } => opcode_of.0,
                other => other.opcode(),
            };
            (op, FLAG_RESPONSE, data)
        }
        Err(e) => {
            put_error(out, e);
            (opcode_of.0, FLAG_RESPONSE | FLAG_ERROR, Bytes::new())
        }
    };
    finish(out, start, opcode, flags, request_id, &data);
    data
}

/// The opcode of a request, kept by a server so it can frame the matching response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestKind(u8);

impl RequestKind {
    pub fn of(req: &Request) -> RequestKind {
        RequestKind(req.opcode())
    }

    /// The opcode from a frame header, for answering frames that failed to decode.
    pub fn from_header(h: &FrameHeader) -> RequestKind {
        RequestKind(h.opcode)
    }
}

fn finish(out: &mut BytesMut, start: usize, opcode: u8, flags: u16, id: u64, data: &Bytes) {
    let body = &out[start + crate::HEADER_LEN..];
    let header = FrameHeader {
        version: PROTOCOL_VERSION,
        opcode,
        flags,
        request_id: id,
        body_len: body.len() as u32,
        data_len: data.len() as u32,
        payload_crc: crate::crc32c_two(body, data),
    };
    let mut raw = Vec::with_capacity(crate::HEADER_LEN);
    header.encode(&mut raw);
    out[start..start + crate::HEADER_LEN].copy_from_slice(&raw);
}

fn fua_flag(fua: bool) -> u16 {
    if fua { FLAG_FUA } else { 0 }
}

fn put_object(b: &mut BytesMut, oid: &ObjectId) {
    b.put_u32_le(oid.pool.0);
    b.put_u64_le(oid.volume.0);
    b.put_u64_le(oid.index);
}

fn get_object(b: &mut Bytes) -> ObjectId {
    ObjectId {
        pool: PoolId(b.get_u32_le()),
        volume: VolumeId(b.get_u64_le()),
        index: b.get_u64_le(),
    }
}

fn put_version(b: &mut BytesMut, v: Version) {
    b.put_u64_le(v.epoch);
    b.put_u64_le(v.seq);
}

fn get_version(b: &mut Bytes) -> Version {
    Version::new(b.get_u64_le(), b.get_u64_le())
}

fn put_session(b: &mut BytesMut, s: Session) {
    b.put_u64_le(s.client);
    b.put_u64_le(s.generation);
}

fn get_session(b: &mut Bytes) -> Session {
    Session {
        client: b.get_u64_le(),
        generation: b.get_u64_le(),
    }
}

fn put_range(b: &mut BytesMut, epoch: Epoch, oid: &ObjectId, offset: u32, len: u32) {
    b.put_u64_le(epoch.0);
    put_object(b, oid);
    b.put_u32_le(offset);
    b.put_u32_le(len);
}

fn get_range(b: &mut Bytes, what: &'static str) -> Result<(Epoch, ObjectId, u32, u32), ProtoError> {
    expect_len(b, 8 + OBJECT_LEN + 8, what)?;
    Ok((
        Epoch(b.get_u64_le()),
        get_object(b),
        b.get_u32_le(),
        b.get_u32_le(),
    ))
}

/// A range followed by a session (WriteZeroes, Trim).
fn get_range_in(
    b: &mut Bytes,
    what: &'static str,
) -> Result<(Epoch, ObjectId, u32, u32, Session), ProtoError> {
    expect_len(b, 8 + OBJECT_LEN + 8 + SESSION_LEN, what)?;
    Ok((
        Epoch(b.get_u64_le()),
        get_object(b),
        b.get_u32_le(),
        b.get_u32_le(),
        get_session(b),
    ))
}

fn put_error(b: &mut BytesMut, e: &WireError) {
    let mut end = e.message.len().min(MAX_MESSAGE_LEN);
    while !e.message.is_char_boundary(end) {
        end -= 1;
    }
    b.put_u16_le(e.code.to_wire());
    b.put_u16_le(0);
    b.put_u64_le(e.epoch.0);
    b.put_u16_le(end as u16);
    b.put_slice(&e.message.as_bytes()[..end]);
}

fn decode_error(b: &mut Bytes) -> Result<WireError, ProtoError> {
    need_at_least(b, 14, "error response")?;
    let code = ErrorCode::from_wire(b.get_u16_le());
    b.advance(2);
    let epoch = Epoch(b.get_u64_le());
    let len = b.get_u16_le() as usize;
    expect_len(b, len, "error response")?;
    let message = String::from_utf8_lossy(b).into_owned();
    Ok(WireError {
        code,
        epoch,
        message,
    })
}

fn expect_len(b: &Bytes, expected: usize, what: &'static str) -> Result<(), ProtoError> {
    if b.len() != expected {
        return Err(ProtoError::BadBodyLength {
            opcode: what,
            len: b.len(),
            expected,
        });
    }
    Ok(())
}

fn need_at_least(b: &Bytes, min: usize, what: &'static str) -> Result<(), ProtoError> {
    if b.len() < min {
        return Err(ProtoError::BadBodyLength {
            opcode: what,
            len: b.len(),
            expected: min,
        });
    }
    Ok(())
}

fn malformed(what: &'static str, detail: &str) -> ProtoError {
    ProtoError::Malformed {
        what,
        detail: detail.to_string(),
    }
}
