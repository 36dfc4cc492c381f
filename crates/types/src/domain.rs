//! Failure domains: what the copies (or shards) of one placement group must not share.

use serde::{Deserialize, Serialize};

/// What must differ between the copies of one PG. Stored in pool records (metadata) and in the
/// cluster map (placement) with the same JSON: `"host"` or `"device"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureDomain {
    /// Copies on different nodes (hosts), so that losing a host loses at most one copy.
    #[default]
    Host,
    /// Copies on different devices only (a single-host, RAID-like pool).
    Device,
}
