//! The option phase of one connection (fixed newstyle): greet, read client flags, answer options
//! until the client picks an export (`GO` or `EXPORT_NAME`) or leaves (`ABORT`, EOF).
//!
//! Reads exactly the bytes of each option (no read-ahead), so requests a client pipelines right
//! after `GO` stay in the socket for the transmission phase.

use crate::caps::ExportCaps;
use crate::config::ServerConfig;
use crate::error::NbdError;
use crate::export::{Catalog, Export, ExportErrorKind};
use crate::option::{self, InfoRequest, OptionHeader};
use crate::wire::{self, OPTION_HEADER_LEN, client, info, opt, rep};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// Options longer than this are skipped unread and refused with `NBD_REP_ERR_TOO_BIG`
/// (the longest valid one, `GO` with a 4096-byte name and a few info items, is ~4.1 KiB).
pub const MAX_OPTION_LEN: u32 = 64 << 10;

/// The export a client chose, ready for the transmission phase.
pub(crate) struct Negotiated<E> {
    pub export: Arc<E>,
    pub name: String,
    pub caps: ExportCaps,
}

enum Step<E> {
    Continue,
    Abort,
    Transmit(Negotiated<E>),
}

/// Runs the option phase. `Ok(None)`: the client aborted the negotiation.
pub(crate) async fn negotiate<C, R, W>(
    rd: &mut R,
    wr: &mut W,
    catalog: &C,
    config: &ServerConfig,
    shutdown: &CancellationToken,
) -> Result<Option<Negotiated<C::Export>>, NbdError>
where
    C: Catalog,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut out = Vec::with_capacity(512);
    option::put_greeting(&mut out);
    send(wr, &mut out).await?;

    let client_flags = rd.read_u32().await?;
    if client_flags & !client::KNOWN != 0 {
        // The protocol requires dropping the connection on flags we did not offer.
        return Err(NbdError::protocol(format!(
            "unknown client flags {client_flags:#x}"
        )));
    }
    let no_zeroes = client_flags & client::NO_ZEROES != 0;

    loop {
        let mut header = [0u8; OPTION_HEADER_LEN];
        rd.read_exact(&mut header).await?;
        let Some(h) = OptionHeader::parse(&header) else {
            return Err(NbdError::protocol("option without the IHAVEOPT magic"));
        };
        if h.len > MAX_OPTION_LEN {
            if h.option == opt::EXPORT_NAME {
                return Err(NbdError::protocol(format!(
                    "EXPORT_NAME of {} bytes is longer than any export name",
                    h.len
                )));
            }
            skip(rd, h.len).await?;
            let msg = format!("option data of {} bytes exceeds {MAX_OPTION_LEN}", h.len);
            option::put_error(&mut out, h.option, rep::ERR_TOO_BIG, &msg);
            send(wr, &mut out).await?;
            continue;
        }
        let mut data = vec![0u8; h.len as usize];
        rd.read_exact(&mut data).await?;
        let step = answer(
            h.option, &data, catalog, config, shutdown, no_zeroes, &mut out,
        )
        .await?;
        send(wr, &mut out).await?;
        match step {
            Step::Continue => {}
            Step::Abort => return Ok(None),
            Step::Transmit(n) => return Ok(Some(n)),
        }
    }
}

/// Answers one option into `out`.
async fn answer<C: Catalog>(
    option: u32,
    data: &[u8],
    catalog: &C,
    config: &ServerConfig,
    shutdown: &CancellationToken,
    no_zeroes: bool,
    out: &mut Vec<u8>,
) -> Result<Step<C::Export>, NbdError> {
    match option {
        opt::EXPORT_NAME => export_name(data, catalog, config, shutdown, no_zeroes, out).await,
        opt::ABORT => {
            option::put_reply(out, option, rep::ACK, &[]);
            Ok(Step::Abort)
        }
        _ if shutdown.is_cancelled() => {
            let msg = "the server is shutting down";
            option::put_error(out, option, rep::ERR_SHUTDOWN, msg);
            Ok(Step::Continue)
        }
        opt::LIST => {
            list(data, catalog, out).await;
            Ok(Step::Continue)
        }
        opt::INFO | opt::GO => info_or_go(option, data, catalog, config, out).await,
        _ => {
            let msg = format!(
                "option {option} ({}) is not supported by this server",
                wire::option_name(option)
            );
            option::put_error(out, option, rep::ERR_UNSUP, &msg);
            Ok(Step::Continue)
        }
    }
}

/// `NBD_OPT_EXPORT_NAME`: no error reply exists, so any failure closes the connection.
async fn export_name<C: Catalog>(
    data: &[u8],
    catalog: &C,
    config: &ServerConfig,
    shutdown: &CancellationToken,
    no_zeroes: bool,
    out: &mut Vec<u8>,
) -> Result<Step<C::Export>, NbdError> {
    if shutdown.is_cancelled() {
        return Err(NbdError::protocol(
            "EXPORT_NAME during shutdown cannot be refused; closing",
        ));
    }
    let name = option::parse_string(data).map_err(NbdError::Protocol)?;
    let name = resolve(catalog, name)
        .ok_or_else(|| NbdError::protocol("empty export name and no default export"))?;
    let export = catalog.open(&name).await?;
    let caps = ExportCaps::of(&*export, config.max_payload);
    option::put_export_name_reply(out, caps.size, caps.transmission_flags(), no_zeroes);
    Ok(Step::Transmit(Negotiated { export, name, caps }))
}

/// `NBD_OPT_LIST`: one `NBD_REP_SERVER` per export, then `ACK`.
async fn list<C: Catalog>(data: &[u8], catalog: &C, out: &mut Vec<u8>) {
    if !data.is_empty() {
        let msg = "LIST carries no data";
        option::put_error(out, opt::LIST, rep::ERR_INVALID, msg);
        return;
    }
    match catalog.list().await {
        Ok(exports) => {
            for e in &exports {
                option::put_server(out, &e.name, &e.description);
            }
            option::put_reply(out, opt::LIST, rep::ACK, &[]);
        }
        Err(e) => {
            let reply = match e.kind {
                ExportErrorKind::Shutdown => rep::ERR_SHUTDOWN,
                _ => rep::ERR_UNKNOWN,
            };
            option::put_error(out, opt::LIST, reply, &format!("cannot list exports: {e}"));
        }
    }
}

/// `NBD_OPT_INFO` and `NBD_OPT_GO`: `NBD_REP_INFO` items (EXPORT and BLOCK_SIZE always, NAME
/// and DESCRIPTION when asked for), then `ACK`; `GO` then enters transmission.
async fn info_or_go<C: Catalog>(
    option: u32,
    data: &[u8],
    catalog: &C,
    config: &ServerConfig,
    out: &mut Vec<u8>,
) -> Result<Step<C::Export>, NbdError> {
    let req = match InfoRequest::parse(data) {
        Ok(req) => req,
        Err(msg) => {
            option::put_error(out, option, rep::ERR_INVALID, &msg);
            return Ok(Step::Continue);
        }
    };
    let Some(name) = resolve(catalog, req.name.clone()) else {
        let msg = "empty export name and this server has no default export; name one";
        option::put_error(out, option, rep::ERR_UNKNOWN, msg);
        return Ok(Step::Continue);
    };
    let export = match catalog.open(&name).await {
        Ok(export) => export,
        Err(e) => {
            let reply = match e.kind {
                ExportErrorKind::Shutdown => rep::ERR_SHUTDOWN,
                _ => rep::ERR_UNKNOWN,
            };
            option::put_error(out, option, reply, &e.to_string());
            return Ok(Step::Continue);
        }
    };
    let caps = ExportCaps::of(&*export, config.max_payload);
    option::put_info_export(out, option, caps.size, caps.transmission_flags());
    let preferred = config.preferred_block_size.min(config.max_payload).max(1);
    option::put_info_block_size(out, option, 1, preferred, config.max_payload);
    if req.wants(info::NAME) {
        option::put_info_string(out, option, info::NAME, &name);
    }
    if req.wants(info::DESCRIPTION)
        && let Some(description) = export.description()
    {
        option::put_info_string(out, option, info::DESCRIPTION, &description);
    }
    option::put_reply(out, option, rep::ACK, &[]);
    if option == opt::GO {
        Ok(Step::Transmit(Negotiated { export, name, caps }))
    } else {
        Ok(Step::Continue)
    }
}

/// The empty name means the catalog's default export.
fn resolve<C: Catalog>(catalog: &C, name: String) -> Option<String> {
    if name.is_empty() {
        catalog.default_export()
    } else {
        Some(name)
    }
}

/// Reads and drops `len` bytes.
async fn skip<R: AsyncRead + Unpin>(rd: &mut R, len: u32) -> Result<(), NbdError> {
    let copied = tokio::io::copy(&mut rd.take(len as u64), &mut tokio::io::sink()).await?;
    if copied < len as u64 {
        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
    }
    Ok(())
}

async fn send<W: AsyncWrite + Unpin>(wr: &mut W, out: &mut Vec<u8>) -> Result<(), NbdError> {
    wr.write_all(out).await?;
    wr.flush().await?;
    out.clear();
    Ok(())
}
