//! Decodes arbitrary bytes as a stream of Basalt protocol frames (see
//! `basalt_proto::fuzz_decode_stream`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    basalt_proto::fuzz_decode_stream(data);
});
