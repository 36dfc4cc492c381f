//! A short, deterministic fuzz run on stable Rust: random byte streams and mutations of valid
//! sessions are fed to a server connection over an in-memory pipe. `fuzz_session` panics if
//! the server panics, wedges (does not close within 10 s of the input's end), or stops
//! greeting or accepting a valid GO. The same entry point backs the cargo-fuzz target in
//! `crates/nbd/fuzz/` for long runs. FUZZ_SEED and FUZZ_ITERATIONS override the defaults.

use basalt_nbd::request::RequestHeader;
use basalt_nbd::wire::{cflag, cmd};
use basalt_nbd::{FUZZ_EXPORT_SIZE, fuzz_handshake, fuzz_session};
use rand::{Rng, SeedableRng, rngs::StdRng};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A plausible transmission-phase stream: reads, writes, flushes, trims, zeroes, maybe DISC.
fn valid_requests(rng: &mut StdRng) -> Vec<u8> {
    let mut out = Vec::new();
    for cookie in 0..rng.random_range(1..12u64) {
        let kind = [
            cmd::READ,
            cmd::WRITE,
            cmd::FLUSH,
            cmd::TRIM,
            cmd::WRITE_ZEROES,
        ][rng.random_range(0..5)];
        let len = rng.random_range(0..70_000u32);
        let offset = rng.random_range(0..FUZZ_EXPORT_SIZE);
        let flags = if rng.random_bool(0.3) { cflag::FUA } else { 0 };
        let h = RequestHeader {
            flags,
            kind,
            cookie,
            offset,
            len: if kind == cmd::FLUSH { 0 } else { len },
        };
        out.extend_from_slice(&h.encode());
        if kind == cmd::WRITE {
            out.extend((0..len).map(|i| i as u8));
        }
    }
    if rng.random_bool(0.5) {
        let disc = RequestHeader {
            flags: 0,
            kind: cmd::DISC,
            cookie: 99,
            offset: 0,
            len: 0,
        };
        out.extend_from_slice(&disc.encode());
    }
    out
}

fn mutate(rng: &mut StdRng, input: &mut Vec<u8>) {
    for _ in 0..rng.random_range(1..6) {
        if input.is_empty() {
            input.push(rng.random());
            continue;
        }
        let at = rng.random_range(0..input.len());
        match rng.random_range(0..5) {
            0 => input[at] ^= 1 << rng.random_range(0..8),
            1 => input[at] = rng.random(),
            2 => input.truncate(at),
            3 => {
                let junk: Vec<u8> = (0..rng.random_range(1..40)).map(|_| rng.random()).collect();
                input.splice(at..at, junk);
            }
            _ => {
                // Duplicate a slice: repeated headers, torn payloads.
                let end = (at + rng.random_range(1..64)).min(input.len());
                let copy = input[at..end].to_vec();
                input.splice(at..at, copy);
            }
        }
    }
}

#[test]
fn server_survives_random_and_mutated_sessions() {
    let seed = env_or("FUZZ_SEED", 0x00BA_5A17_u64);
    let iterations = env_or("FUZZ_ITERATIONS", 5000usize);
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..iterations {
        let mut input = match i % 4 {
            // Pure noise, from the first byte of the session.
            0 => {
                let mut v = vec![0u8];
                v.extend((0..rng.random_range(0..300)).map(|_| rng.random::<u8>()));
                v
            }
            // A mutated handshake followed by valid requests.
            1 => {
                let mut hs = fuzz_handshake();
                mutate(&mut rng, &mut hs);
                let mut v = vec![0u8];
                v.extend(hs);
                v.extend(valid_requests(&mut rng));
                v
            }
            // A valid handshake, then mutated requests.
            _ => {
                let mut reqs = valid_requests(&mut rng);
                mutate(&mut rng, &mut reqs);
                let mut v = vec![1u8];
                v.extend(reqs);
                v
            }
        };
        if i % 7 == 0 {
            // Now and then, noise right after a valid handshake.
            input = vec![1u8];
            input.extend((0..rng.random_range(0..100)).map(|_| rng.random::<u8>()));
        }
        fuzz_session(&input);
    }
}

#[test]
fn valid_session_is_answered() {
    // Sanity check of the harness itself: a clean session with a DISC ends normally.
    let mut input = vec![1u8];
    let h = RequestHeader {
        flags: 0,
        kind: cmd::DISC,
        cookie: 1,
        offset: 0,
        len: 0,
    };
    input.extend_from_slice(&h.encode());
    fuzz_session(&input);
}
