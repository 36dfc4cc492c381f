//! `<data>/cluster.json`: written by a running `basalt up` so that CLI commands started later
//! find it without flags, removed when it stops.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterFile {
    /// Format version.
    pub v: u32,
    /// The `basalt up` process.
    pub pid: u32,
    /// A node's data-path address; serves metadata calls when `etcd` is empty.
    pub node_addr: String,
    pub nbd_addr: String,
    /// etcd endpoints when the cluster's metadata lives in etcd.
    #[serde(default)]
    pub etcd: Vec<String>,
    /// The etcd child of `basalt up --etcd` or `--nodes`, while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_pid: Option<u32>,
    /// The nodes `basalt up` started (in its own process, or as `basalt node` children).
    #[serde(default)]
    pub nodes: Vec<NodeEntry>,
}

/// One node started by `basalt up`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEntry {
    pub id: u32,
    pub name: String,
    /// Data-path address.
    pub addr: String,
    /// The node's data directory.
    pub data: PathBuf,
    /// Its process (that of `basalt up` itself for the node of a single-node cluster).
    pub pid: u32,
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

/// Whether `pid` is a running process (not a zombie) named `name` (`basalt`, `etcd`): the
/// name guards against a recycled pid.
pub fn is_running(pid: u32, name: &str) -> bool {
    // /proc/PID/stat: "PID (COMM) STATE ..."; COMM may itself hold parentheses.
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
        return false;
    };
    let state = stat[close + 1..].trim_start().chars().next();
    &stat[open + 1..close] == name && !matches!(state, Some('Z' | 'X'))
}
