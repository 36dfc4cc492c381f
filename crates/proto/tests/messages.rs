//! Round trips of every message through encode -> byte stream -> decode, including streams cut
//! at every possible point, and rejection of corrupted frames.

use basalt_proto::{
    ErrorCode, FrameDecoder, ProtoError, RepKind, RepOp, Request, RequestKind, Response, Session,
    WireError, encode_request, encode_response,
};
use basalt_types::{DeviceId, Epoch, NodeId, ObjectId, PgId, PoolId, Term, Version, VolumeId};
use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

fn arb_oid() -> impl Strategy<Value = ObjectId> {
    (any::<u32>(), any::<u64>(), any::<u64>())
        .prop_map(|(p, v, i)| ObjectId::new(PoolId(p), VolumeId(v), i))
}

fn arb_data() -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..5000).prop_map(Bytes::from)
}

fn arb_session() -> impl Strategy<Value = Session> {
    (any::<u64>(), any::<u64>()).prop_map(|(client, generation)| Session { client, generation })
}

fn arb_request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (any::<u8>(), any::<u8>(), "[a-z0-9 -]{0,40}").prop_map(|(a, b, c)| Request::Hello {
            min_version: a,
            max_version: b,
            client: c
        }),
        (any::<u64>(), arb_oid(), any::<u32>(), any::<u32>()).prop_map(|(e, oid, offset, len)| {
            Request::Read {
                epoch: Epoch(e),
                oid,
                offset,
                len,
            }
        }),
        (any::<u64>(), arb_oid(), any::<u32>(), any::<u32>()).prop_map(|(e, oid, offset, len)| {
            Request::ReadReplica {
                epoch: Epoch(e),
                oid,
                offset,
                len,
            }
        }),
        (
            any::<u64>(),
            arb_oid(),
            any::<u32>(),
            (any::<u64>(), any::<u64>()),
            any::<bool>(),
            arb_data(),
            arb_session()
        )
            .prop_map(
                |(e, oid, offset, (ve, vs), fua, data, session)| Request::Write {
                    epoch: Epoch(e),
                    oid,
                    offset,
                    version: Version::new(ve, vs),
                    fua,
                    data,
                    session
                }
            ),
        (
            any::<u64>(),
            arb_oid(),
            any::<u32>(),
            any::<u32>(),
            any::<bool>(),
            arb_session()
        )
            .prop_map(|(e, oid, offset, len, fua, session)| Request::WriteZeroes {
                epoch: Epoch(e),
                oid,
                offset,
                len,
                fua,
                session
            }),
        (
            any::<u64>(),
            arb_oid(),
            any::<u32>(),
            any::<u32>(),
            arb_session()
        )
            .prop_map(|(e, oid, offset, len, session)| Request::Trim {
                epoch: Epoch(e),
                oid,
                offset,
                len,
                session,
            }),
        any::<u64>().prop_map(|e| Request::Flush { epoch: Epoch(e) }),
        (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(e, p, v, f)| {
            Request::DeleteVolume {
                epoch: Epoch(e),
                pool: PoolId(p),
                volume: VolumeId(v),
                from_index: f,
            }
        }),
        arb_data().prop_map(|data| Request::Ping { data }),
        arb_data().prop_map(|body| Request::Admin { body }),
        arb_data().prop_map(|body| Request::Meta { body }),
        arb_rep(),
        (any::<u64>(), arb_data(), arb_data()).prop_map(|(e, json, payload)| Request::Peer {
            epoch: Epoch(e),
            json,
            payload
        }),
    ]
}

/// A valid sub-operation: the object is in the PG's pool, and the length matches the kind.
fn arb_rep() -> impl Strategy<Value = Request> {
    (
        (any::<u64>(), any::<u32>(), any::<u32>(), any::<u64>()),
        arb_oid(),
        (any::<u64>(), any::<u64>()),
        0u8..3,
        (any::<u32>(), 1u32..u32::MAX),
        proptest::collection::vec(any::<u8>(), 1..5000),
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
    )
        .prop_map(
            |((e, d, pg, i), oid, (ve, vs), k, (offset, len), data, (ce, cs, pe, ps))| {
                let (kind, data) = match k {
                    0 => (RepKind::Write { offset }, Bytes::from(data)),
                    1 => (RepKind::Zeroes { offset, len }, Bytes::new()),
                    _ => (RepKind::Delete, Bytes::new()),
                };
                Request::Rep(RepOp {
                    epoch: Epoch(e),
                    device: DeviceId(d),
                    pg: PgId { pool: oid.pool, pg },
                    term: Term::new(Epoch(i), i ^ u64::from(d)),
                    oid,
                    version: Version::new(ve, vs),
                    kind,
                    data,
                    committed: Version::new(ce, cs),
                    prior: Version::new(pe, ps),
                })
            },
        )
}

fn arb_response() -> impl Strategy<Value = Result<Response, WireError>> {
    prop_oneof![
        (any::<u8>(), any::<u32>(), any::<u64>()).prop_map(|(v, n, e)| Ok(Response::Hello {
            version: v,
            node: NodeId(n),
            epoch: Epoch(e)
        })),
        arb_data().prop_map(|data| Ok(Response::Read { data })),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(e, s, i)| Ok(Response::Written {
            version: Version::new(e, s),
            incarnation: i
        })),
        any::<u64>().prop_map(|incarnation| Ok(Response::Flushed { incarnation })),
        Just(Ok(Response::RepDone)),
        (arb_data(), arb_data()).prop_map(|(json, payload)| Ok(Response::Peer { json, payload })),
        any::<u64>().prop_map(|objects| Ok(Response::Deleted { objects })),
        arb_data().prop_map(|data| Ok(Response::Pong { data })),
        arb_data().prop_map(|body| Ok(Response::Admin { body })),
        arb_data().prop_map(|body| Ok(Response::Meta { body })),
        (1u16..20, any::<u64>(), "[ -~]{0,80}").prop_map(|(c, e, m)| Err(WireError {
            code: ErrorCode::from_wire(c),
            epoch: Epoch(e),
            message: m
        })),
    ]
}

/// The request a response answers, so that its opcode matches.
fn request_for(resp: &Result<Response, WireError>) -> Request {
    let epoch = Epoch(1);
    let oid = ObjectId::default();
    match resp {
        Ok(Response::Hello { .. }) => Request::Hello {
            min_version: 1,
            max_version: 1,
            client: String::new(),
        },
        Ok(Response::Read { .. }) | Err(_) => Request::Read {
            epoch,
            oid,
            offset: 0,
            len: 0,
        },
        Ok(Response::Written { .. }) => Request::Trim {
            epoch,
            oid,
            offset: 0,
            len: 0,
            session: Session::NONE,
        },
        Ok(Response::Flushed { .. }) => Request::Flush { epoch },
        Ok(Response::Deleted { .. }) => Request::DeleteVolume {
            epoch,
            pool: PoolId(0),
            volume: VolumeId(0),
            from_index: 0,
        },
        Ok(Response::Pong { .. }) => Request::Ping { data: Bytes::new() },
        Ok(Response::Admin { .. }) => Request::Admin { body: Bytes::new() },
        Ok(Response::Meta { .. }) => Request::Meta { body: Bytes::new() },
        Ok(Response::RepDone) => Request::Rep(RepOp {
            epoch: Epoch(1),
            device: DeviceId(1),
            pg: PgId::default(),
            term: Term::new(Epoch(1), 0),
            oid: ObjectId::default(),
            version: Version::new(1, 1),
            kind: RepKind::Delete,
            data: Bytes::new(),
            committed: Version::NONE,
            prior: Version::NONE,
        }),
        Ok(Response::Peer { .. }) => Request::Peer {
            epoch: Epoch(1),
            json: Bytes::new(),
            payload: Bytes::new(),
        },
    }
}

fn stream_of_requests(reqs: &[Request]) -> Vec<u8> {
    let mut out = BytesMut::new();
    for (i, r) in reqs.iter().enumerate() {
        let data = encode_request(i as u64, r, &mut out);
        out.extend_from_slice(&data);
    }
    out.to_vec()
}

proptest! {
    #[test]
    fn requests_round_trip_in_a_stream(reqs in proptest::collection::vec(arb_request(), 1..8), chunk in 1usize..700) {
        let bytes = stream_of_requests(&reqs);
        // Feed the stream in chunks of `chunk` bytes, as a socket would deliver it.
        let mut dec = FrameDecoder::new();
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for piece in bytes.chunks(chunk) {
            buf.extend_from_slice(piece);
            while let Some(frame) = dec.decode(&mut buf).unwrap() {
                prop_assert_eq!(frame.header.request_id, got.len() as u64);
                got.push(Request::decode(&frame).unwrap());
            }
        }
        prop_assert_eq!(got, reqs);
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn responses_round_trip(resp in arb_response(), id in any::<u64>()) {
        let kind = RequestKind::of(&request_for(&resp));
        let mut out = BytesMut::new();
        let data = encode_response(id, &kind, &resp, &mut out);
        out.extend_from_slice(&data);
        let frame = FrameDecoder::new().decode(&mut out).unwrap().unwrap();
        prop_assert_eq!(frame.header.request_id, id);
        prop_assert_eq!(Response::decode(&frame).unwrap(), resp);
    }

    #[test]
    fn any_flipped_byte_is_rejected(req in arb_request(), pos in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut bytes = stream_of_requests(std::slice::from_ref(&req));
        let i = pos.index(bytes.len());
        bytes[i] ^= 1 << bit;
        let mut buf = BytesMut::from(&bytes[..]);
        match FrameDecoder::new().decode(&mut buf) {
            // A flip in a length field can make the decoder wait for more bytes; that is safe.
            Ok(None) => {}
            Ok(Some(frame)) => prop_assert!(false, "corrupt frame accepted: {:?}", frame.header),
            Err(_) => {}
        }
    }
}

#[test]
fn error_response_carries_the_epoch() {
    let err = WireError::stale_epoch(Epoch(9), Epoch(3));
    let req = Request::Flush { epoch: Epoch(3) };
    let mut out = BytesMut::new();
    let data = encode_response(5, &RequestKind::of(&req), &Err(err.clone()), &mut out);
    assert!(data.is_empty());
    let frame = FrameDecoder::new().decode(&mut out).unwrap().unwrap();
    let got = Response::decode(&frame).unwrap().unwrap_err();
    assert_eq!(got.code, ErrorCode::StaleEpoch);
    assert_eq!(got.epoch, Epoch(9));
    assert!(got.message.contains("older"), "{}", got.message);
}

#[test]
fn long_error_messages_are_cut_on_a_char_boundary() {
    let err = WireError::new(ErrorCode::Io, "é".repeat(2000));
    let req = Request::Flush { epoch: Epoch(3) };
    let mut out = BytesMut::new();
    encode_response(1, &RequestKind::of(&req), &Err(err), &mut out);
    let frame = FrameDecoder::new().decode(&mut out).unwrap().unwrap();
    let got = Response::decode(&frame).unwrap().unwrap_err();
    assert_eq!(got.message, "é".repeat(512));
}

#[test]
fn a_response_is_not_a_request_and_vice_versa() {
    let req = Request::Flush { epoch: Epoch(1) };
    let mut out = BytesMut::new();
    encode_response(
        1,
        &RequestKind::of(&req),
        &Ok(Response::Flushed { incarnation: 1 }),
        &mut out,
    );
    let frame = FrameDecoder::new().decode(&mut out).unwrap().unwrap();
    assert!(Request::decode(&frame).is_err());
    let mut out = BytesMut::new();
    encode_request(1, &req, &mut out);
    let frame = FrameDecoder::new().decode(&mut out).unwrap().unwrap();
    assert!(Response::decode(&frame).is_err());
}

#[test]
fn garbage_is_refused_not_waited_on() {
    let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n......"[..]);
    assert!(matches!(
        FrameDecoder::new().decode(&mut buf),
        Err(ProtoError::BadMagic(_))
    ));
}
