//! The shared fuzzing entry point.

/// Entry point shared by the cargo-fuzz target (`fuzz/fuzz_targets/proto_decode.rs`) and the
/// stable fuzz smoke test: decode an arbitrary byte stream as a node and as a client would,
/// re-encode every frame that decodes, and check the re-encoding decodes to the same message.
pub fn fuzz_decode_stream(input: &[u8]) {
    let mut buf = bytes::BytesMut::from(input);
    let mut decoder = crate::FrameDecoder::new();
    while let Ok(Some(frame)) = decoder.decode(&mut buf) {
        if let Ok(req) = crate::Request::decode(&frame) {
            let mut out = bytes::BytesMut::new();
            let data = crate::encode_request(frame.header.request_id, &req, &mut out);
            out.extend_from_slice(&data);
            let again = crate::FrameDecoder::new()
                .decode(&mut out)
                .expect("re-encoded request decodes")
                .expect("re-encoded request is whole");
            assert_eq!(crate::Request::decode(&again).expect("decodes"), req);
        }
        let _ = crate::Response::decode(&frame);
    }
}
