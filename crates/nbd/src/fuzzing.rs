//! The shared fuzzing entry point: one whole NBD session against a [`MemCatalog`] over an
//! in-memory pipe.

use crate::config::ServerConfig;
use crate::mem::{MemCatalog, MemExport};
use crate::option::{InfoRequest, OptionHeader};
use crate::server::NbdServer;
use crate::wire::{self, client, info, opt};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// Name of the export [`fuzz_session`] serves (1 MiB, also the default export).
pub const FUZZ_EXPORT: &str = "fuzz";
/// Size of that export.
pub const FUZZ_EXPORT_SIZE: u64 = 1 << 20;

/// The bytes of a valid option phase that ends with `NBD_OPT_GO` for [`FUZZ_EXPORT`].
pub fn fuzz_handshake() -> Vec<u8> {
    let mut out = (client::FIXED_NEWSTYLE | client::NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    let go = InfoRequest {
        name: FUZZ_EXPORT.into(),
        items: vec![info::NAME, info::BLOCK_SIZE],
    }
    .encode();
    let header = OptionHeader {
        option: opt::GO,
        len: go.len() as u32,
    };
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(&go);
    out
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime for fuzzing");
}

/// Feeds `input` to a fresh server connection as the client's byte stream, then closes the
/// client's sending side. If the first byte is odd, a valid handshake ([`fuzz_handshake`]) is
/// sent first, so the rest exercises the transmission phase.
///
/// Panics if the server panics, or does not close the connection within 10 s after the input
/// ended (a wedged connection), or does not greet, or (with the handshake) does not accept GO.
pub fn fuzz_session(input: &[u8]) {
    let Some((&mode, body)) = input.split_first() else {
        return;
    };
    let with_handshake = mode & 1 == 1;
    let mut stream = if with_handshake {
        fuzz_handshake()
    } else {
        Vec::new()
    };
    stream.extend_from_slice(body);

    let catalog = MemCatalog::new().with_default(FUZZ_EXPORT);
    catalog.add(FUZZ_EXPORT, MemExport::new(FUZZ_EXPORT_SIZE));
    let config = ServerConfig {
        max_payload: 256 << 10,
        max_inflight_bytes: 1 << 20,
        max_inflight_requests: 16,
        handshake_timeout: Duration::from_secs(5),
        ..ServerConfig::default()
    };
    let server = NbdServer::new(Arc::new(catalog), config);

    let out = RUNTIME.with(|rt| {
        rt.block_on(async {
            let (client, server_io) = tokio::io::duplex(64 << 10);
            let (mut crd, mut cwr) = tokio::io::split(client);
            let serve = server.serve_connection(server_io, CancellationToken::new());
            let write = async move {
                // The server may close first; a broken pipe here is expected.
                let _ = cwr.write_all(&stream).await;
                let _ = cwr.shutdown().await;
            };
            let read = async move {
                let mut out = Vec::new();
                let _ = crd.read_to_end(&mut out).await;
                out
            };
            let session = async { futures::join!(serve, write, read).2 };
            tokio::time::timeout(Duration::from_secs(10), session)
                .await
                .expect("the server neither finished nor closed within 10 s of the input's end")
        })
    });

    assert!(
        out.starts_with(&wire::NBDMAGIC.to_be_bytes()),
        "server did not greet"
    );
    if with_handshake {
        let ack = [
            &wire::OPTION_REPLY_MAGIC.to_be_bytes()[..],
            &opt::GO.to_be_bytes(),
            &wire::rep::ACK.to_be_bytes(),
        ]
        .concat();
        assert!(
            out.windows(ack.len()).any(|w| w == ack),
            "server did not accept a valid GO"
        );
    }
}
