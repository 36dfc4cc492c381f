//! The cluster map as it is stored: a small header and the PG tables cut into chunks.
//!
//! The metadata layer stores and follows [`MapParts`] without knowing what is inside; placement
//! encodes a map into parts and decodes it back ([`MapCodec`]). Keeping the contract here lets
//! neither crate depend on the other.

use crate::ids::{Epoch, PoolId};
use std::collections::BTreeMap;

/// One stored chunk of a pool's PG table: `index` is its position in the table, `written` the
/// map epoch whose publication wrote it. A chunk that did not change keeps its `written` epoch
/// (and its stored key), so a publication rewrites only the chunks that changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChunkId {
    pub pool: PoolId,
    pub index: u32,
    pub written: Epoch,
}

/// A cluster map cut into storable pieces: the header (format version, epoch, devices, nodes,
/// pools and which chunk holds each part of their PG tables) and the chunks.
///
/// When read back from the store, `chunks` may also hold chunks the header does not name
/// (left over from a publication that did not finish): decoders ignore them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapParts {
    pub header: Vec<u8>,
    pub chunks: BTreeMap<ChunkId, Vec<u8>>,
}

/// A map that can be stored as [`MapParts`].
pub trait MapCodec: Sized {
    /// Cuts the map into parts. A chunk whose bytes equal the chunk `prev`'s header names at the
    /// same place keeps that chunk's id, so it is not written again.
    fn to_parts(&self, prev: Option<&MapParts>) -> MapParts;

    /// Rebuilds the map from parts; the error says what is wrong.
    fn from_parts(parts: &MapParts) -> Result<Self, String>;

    /// The map's epoch.
    fn epoch(&self) -> Epoch;
}
