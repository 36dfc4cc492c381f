//! A short, deterministic fuzz run of the frame decoder on stable Rust: random byte streams and
//! mutations of valid streams never panic, and whatever decodes re-encodes to the same message.
//! The same entry point backs the cargo-fuzz target in `fuzz/` for long runs.

use basalt_proto::{Request, Session, encode_request, fuzz_decode_stream};
use basalt_types::{Epoch, ObjectId, PoolId, Version, VolumeId};
use bytes::{Bytes, BytesMut};
use rand::{Rng, SeedableRng, rngs::StdRng};

fn valid_stream() -> Vec<u8> {
    let oid = ObjectId::new(PoolId(1), VolumeId(2), 3);
    let reqs = [
        Request::Hello {
            min_version: 1,
            max_version: 1,
            client: "fuzz".into(),
        },
        Request::Write {
            epoch: Epoch(4),
            oid,
            offset: 512,
            version: Version::NONE,
            fua: true,
            data: Bytes::from(vec![7u8; 100]),
            session: Session {
                client: 5,
                generation: 1,
            },
        },
        Request::Read {
            epoch: Epoch(4),
            oid,
            offset: 0,
            len: 4096,
        },
        Request::Flush { epoch: Epoch(4) },
    ];
    let mut out = BytesMut::new();
    for (i, r) in reqs.iter().enumerate() {
        let data = encode_request(i as u64, r, &mut out);
        out.extend_from_slice(&data);
    }
    out.to_vec()
}

#[test]
fn decoder_survives_random_and_mutated_input() {
    let seed = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x00BA_5A17_u64);
    let iterations: usize = std::env::var("FUZZ_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let mut rng = StdRng::seed_from_u64(seed);
    let base = valid_stream();
    for _ in 0..iterations {
        let mut input = if rng.random_bool(0.3) {
            (0..rng.random_range(0..200))
                .map(|_| rng.random())
                .collect()
        } else {
            base.clone()
        };
        for _ in 0..rng.random_range(0..4) {
            if input.is_empty() {
                break;
            }
            let i = rng.random_range(0..input.len());
            match rng.random_range(0..3) {
                0 => input[i] ^= 1 << rng.random_range(0..8),
                1 => input.truncate(i),
                _ => input.insert(i, rng.random()),
            }
        }
        fuzz_decode_stream(&input);
    }
    // The unmutated stream must decode completely.
    fuzz_decode_stream(&base);
}
