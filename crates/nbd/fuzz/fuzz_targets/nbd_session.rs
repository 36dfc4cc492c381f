//! One whole NBD session per input: the first byte chooses whether a valid handshake comes
//! first (odd) or the input starts at the client flags (even). See `basalt_nbd::fuzz_session`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    basalt_nbd::fuzz_session(data);
});
