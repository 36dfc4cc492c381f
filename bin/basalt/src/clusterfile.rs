//! `<data>/cluster.json`: written by a running `basalt up` so that CLI commands started later
//! find it without flags, removed when it stops.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterFile {
    /// Format version.
    pub v: u32,
    pub pid: u32,
    /// The node's data-path address; serves metadata calls when `etcd` is empty.
    pub node_addr: String,
    pub nbd_addr: String,
    /// etcd endpoints when the cluster's metadata lives in etcd.
    #[serde(default)]
    pub etcd: Vec<String>,
}

pub fn path(data: &Path) -> PathBuf {
    data.join("cluster.json")
}

pub fn write(data: &Path, file: &ClusterFile) -> std::io::Result<()> {
    let tmp = data.join("cluster.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(file).expect("serialisable"))?;
    std::fs::rename(tmp, path(data))
}

pub fn read(data: &Path) -> Option<ClusterFile> {
    let bytes = std::fs::read(path(data)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

pub fn remove(data: &Path) {
    let _ = std::fs::remove_file(path(data));
}

/// The default data directory: `$BASALT_DATA`, else `$XDG_DATA_HOME/basalt`, else
/// `~/.local/share/basalt`.
pub fn default_data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_DATA_HOME") {
        return PathBuf::from(d).join("basalt");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
    PathBuf::from(home).join(".local/share/basalt")
}
