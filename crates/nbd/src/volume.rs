//! Basalt volumes as NBD exports: [`ClusterCatalog`] lists and opens volumes through the client
//! library, [`VolumeExport`] maps NBD commands onto [`basalt_client::Volume`].
//!
//! A volume is opened afresh for each connection (one metadata lookup), and the handle follows
//! the volume's record: I/O past a shrunk end is `EINVAL`, I/O on a deleted volume (or one
//! re-created under the same name) is `EIO`, never the new volume's data. Flushes and FUA go to the
//! cluster, which makes every acknowledged write durable on every node holding the volume's data,
//! so writes from one connection are covered by a flush on another: CAN_MULTI_CONN holds.

use crate::export::{Catalog, Export, ExportError, ExportErrorKind, ExportInfo};
use basalt_client::error::ErrorKind;
use basalt_client::{ClientError, Cluster, Volume, VolumeOptions};
use bytes::Bytes;
use std::sync::Arc;

/// The volumes of a cluster, one export per volume, named like the volume.
pub struct ClusterCatalog {
    cluster: Cluster,
    options: VolumeOptions,
    default: Option<String>,
}

impl ClusterCatalog {
    /// Serves every volume of `cluster`, opened with `options`. `default` is the volume served to
    /// a client asking for the empty export name.
    pub fn new(cluster: Cluster, options: VolumeOptions, default: Option<String>) -> Self {
        ClusterCatalog {
            cluster,
            options,
            default,
        }
    }
}

impl Catalog for ClusterCatalog {
    type Export = VolumeExport;

    async fn list(&self) -> Result<Vec<ExportInfo>, ExportError> {
        let volumes = self.cluster.list_volumes().await.map_err(export_error)?;
        Ok(volumes
            .into_iter()
            .filter(|v| v.state == basalt_client::meta::VolumeState::Active)
            .map(|v| ExportInfo {
                description: format!("basalt volume {} (pool {})", v.name, v.pool),
                name: v.name,
                size: v.size,
            })
            .collect())
    }

    async fn open(&self, name: &str) -> Result<Arc<VolumeExport>, ExportError> {
        let volume = self
            .cluster
            .open_volume(name, self.options)
            .await
            .map_err(|e| match e {
                ClientError::NoSuchVolume(_) => ExportError::not_found(name),
                other => export_error(other),
            })?;
        Ok(Arc::new(VolumeExport { volume }))
    }

    fn default_export(&self) -> Option<String> {
        self.default.clone()
    }
}

/// One open volume.
pub struct VolumeExport {
    volume: Volume,
}

/// NO_HOLE zeroes are written as real zero blocks, this many bytes per write.
const ZERO_CHUNK: u32 = 1 << 20;

impl Export for VolumeExport {
    fn size(&self) -> u64 {
        self.volume.size()
    }

    fn can_multi_conn(&self) -> bool {
        true
    }

    fn description(&self) -> Option<String> {
        Some(format!(
            "basalt volume {} (durability: {})",
            self.volume.name(),
            self.volume.durability()
        ))
    }

    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, ExportError> {
        self.volume.read(offset, len).await.map_err(export_error)
    }

    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), ExportError> {
        self.volume
            .write(offset, data, fua)
            .await
            .map_err(export_error)
    }

    async fn flush(&self) -> Result<(), ExportError> {
        self.volume.flush().await.map_err(export_error)
    }

    async fn trim(&self, offset: u64, len: u32) -> Result<(), ExportError> {
        self.volume
            .trim(offset, len as u64)
            .await
            .map_err(export_error)
    }

    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
        no_hole: bool,
    ) -> Result<(), ExportError> {
        if !no_hole {
            return self
                .volume
                .write_zeroes(offset, len as u64, fua)
                .await
                .map_err(export_error);
        }
        // The client asked for the range to stay allocated: write real zeros.
        let zeros = Bytes::from(vec![0u8; len.min(ZERO_CHUNK) as usize]);
        let mut done = 0u32;
        while done < len {
            let n = (len - done).min(ZERO_CHUNK);
            self.volume
                .write(offset + done as u64, zeros.slice(..n as usize), fua)
                .await
                .map_err(export_error)?;
            done += n;
        }
        Ok(())
    }
}

fn export_error(e: ClientError) -> ExportError {
    let kind = match e.kind() {
        ErrorKind::NotFound => ExportErrorKind::NotFound,
        ErrorKind::InvalidArgument => ExportErrorKind::InvalidArgument,
        ErrorKind::NoSpace => ExportErrorKind::NoSpace,
        ErrorKind::Shutdown => ExportErrorKind::Shutdown,
        ErrorKind::Exists | ErrorKind::Io => ExportErrorKind::Io,
    };
    ExportError::new(kind, e.to_string())
}
