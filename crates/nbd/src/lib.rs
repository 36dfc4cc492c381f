//! The Basalt NBD server: serves block volumes to NBD clients (the Linux kernel's nbd driver,
//! qemu, libnbd tools, fio) over TCP.
//!
//! The server knows volumes only through two traits a backend implements ([`export`]):
//! [`Catalog`] lists and opens exports by name, [`Export`] reads, writes, flushes, trims and
//! zeroes one of them. [`volume`] implements both for Basalt volumes (through the client
//! library); [`mem`] implements both in RAM for tests and benchmarks.
//!
//! Flow of one connection (`server.rs` spawns one task per connection):
//! 1. `negotiate.rs` runs the fixed-newstyle option phase: greeting, client
//!    flags, then options (`LIST`, `INFO`, `GO`, `EXPORT_NAME`, `ABORT`; everything else gets
//!    `NBD_REP_ERR_UNSUP`). The bytes are parsed and encoded by the sans-io [`option`] module.
//! 2. `transmit.rs` serves requests: [`request::RequestDecoder`] cuts the
//!    stream into requests, [`request::validate`] checks each against the export's
//!    [`ExportCaps`], the export runs many at once, and [`reply::ReplyQueue`] batches the
//!    replies into vectored writes, out of order, matched by cookie.
//! 3. Shutdown ([`NbdServer::serve`]'s future completes): stop accepting, finish in-flight
//!    requests within a grace period, close.
//!
//! The byte layouts and the semantics choices (errors, FLUSH/FUA, limits) are in
//! `docs/design/nbd.md`.
//!
//! Start here: [`NbdServer`] and [`serve`], the [`Export`]/[`Catalog`] traits, then
//! `transmit.rs` for the data path.

pub mod caps;
pub mod config;
pub mod error;
pub mod export;
mod fuzzing;
pub mod mem;
mod negotiate;
pub mod option;
pub mod reply;
pub mod request;
mod server;
mod transmit;
pub mod volume;
pub mod wire;

pub use caps::ExportCaps;
pub use config::{DEFAULT_MAX_PAYLOAD, Dispatch, ServerConfig};
pub use error::NbdError;
pub use export::{Catalog, Export, ExportError, ExportErrorKind, ExportInfo};
pub use fuzzing::{FUZZ_EXPORT, FUZZ_EXPORT_SIZE, fuzz_handshake, fuzz_session};
pub use mem::{MemCatalog, MemExport, MemStats};
pub use negotiate::MAX_OPTION_LEN;
pub use server::{NbdServer, serve};
pub use tokio_util::sync::CancellationToken;
pub use volume::{ClusterCatalog, VolumeExport};
