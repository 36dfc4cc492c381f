//! The node's identity: an id allocated once from the catalog and kept in `<data_dir>/node.id`.

use crate::error::NodeError;
use basalt_meta::{Catalog, IdKind};
use basalt_types::NodeId;
use std::io::Write;
use std::path::Path;

/// The node's id, and whether it was allocated now (a node that never ran before).
pub(crate) async fn load_or_allocate(
    catalog: &Catalog,
    dir: &Path,
) -> Result<(NodeId, bool), NodeError> {
    let path = dir.join("node.id");
    let io_err = |source| NodeError::Io {
        path: path.display().to_string(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(s) => {
            let id = s.trim().parse().map(NodeId).map_err(|_| {
                NodeError::Config(format!("{} does not hold a node id", path.display()))
            })?;
            Ok((id, false))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(io_err)?;
            let id = NodeId(catalog.next_id(IdKind::Node).await? as u32);
            // Write to a temporary file, fsync, rename, fsync the directory: the id survives a
            // crash whole or not at all (then a new one is allocated; ids are never reused).
            let tmp = dir.join("node.id.tmp");
            let mut f = std::fs::File::create(&tmp).map_err(io_err)?;
            writeln!(f, "{}", id.0).map_err(io_err)?;
            f.sync_all().map_err(io_err)?;
            std::fs::rename(&tmp, &path).map_err(io_err)?;
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io_err)?;
            Ok((id, true))
        }
        Err(e) => Err(io_err(e)),
    }
}
