//! How a CLI command finds the cluster: etcd endpoints, or the address of a running
//! `basalt up`, or — with no flags — the `cluster.json` that `basalt up` left in its data
//! directory.

use crate::clusterfile;
use anyhow::{Context, bail};
use basalt_client::{Cluster, ClusterConfig};
use basalt_meta::{EtcdStore, MetaStore};
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;

/// What every one-shot command takes: where the cluster is, and the output format.
#[derive(Args, Debug)]
pub struct Common {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

#[derive(Args, Clone, Debug)]
pub struct ClusterArgs {
    /// etcd endpoints of the cluster's metadata (comma-separated), e.g. http://127.0.0.1:2379.
    #[arg(long, env = "BASALT_ETCD", value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// Key prefix of the cluster in etcd.
    #[arg(long, env = "BASALT_ETCD_PREFIX", default_value = "")]
    pub etcd_prefix: String,
    /// Address of a running `basalt up` (its node listener), e.g. 127.0.0.1:10810.
    #[arg(long, env = "BASALT_CLUSTER")]
    pub cluster: Option<String>,
    /// Data directory of a local `basalt up`, used to find it when no address is given.
    #[arg(long, env = "BASALT_DATA")]
    pub data: Option<PathBuf>,
}

impl ClusterArgs {
    /// The cluster's metadata store.
    pub async fn meta(&self) -> anyhow::Result<Arc<dyn MetaStore>> {
        if !self.etcd.is_empty() {
            return etcd(&self.etcd, &self.etcd_prefix).await;
        }
        if let Some(addr) = &self.cluster {
            return remote(addr).await;
        }
        let data = self
            .data
            .clone()
            .unwrap_or_else(clusterfile::default_data_dir);
        let Some(file) = clusterfile::read(&data) else {
            bail!(
                "no running Basalt cluster found (no {}); start one with `basalt up`, \
                 or pass --cluster ADDR (a running `basalt up`) or --etcd URL",
                clusterfile::path(&data).display()
            );
        };
        if !file.etcd.is_empty() {
            return etcd(&file.etcd, "").await;
        }
        remote(&file.node_addr).await.with_context(|| {
            format!(
                "{} names a cluster at {} (pid {}) that does not answer; is `basalt up` still running?",
                clusterfile::path(&data).display(),
                file.node_addr,
                file.pid
            )
        })
    }

    /// The `cluster.json` of a local `basalt up` when the cluster is found through it (no
    /// `--etcd`, no `--cluster`): it names the processes `up` started.
    pub fn cluster_file(&self) -> Option<clusterfile::ClusterFile> {
        if !self.etcd.is_empty() || self.cluster.is_some() {
            return None;
        }
        let data = self
            .data
            .clone()
            .unwrap_or_else(clusterfile::default_data_dir);
        clusterfile::read(&data)
    }

    /// A client connected to the cluster.
    pub async fn connect(&self) -> anyhow::Result<Cluster> {
        self.connect_with_timeout(ClusterConfig::default().op_timeout)
            .await
    }

    /// A client whose operations give up after `op_timeout`.
    pub async fn connect_with_timeout(
        &self,
        op_timeout: std::time::Duration,
    ) -> anyhow::Result<Cluster> {
        let meta = self.meta().await?;
        let config = ClusterConfig {
            op_timeout,
            ..ClusterConfig::default()
        };
        Ok(Cluster::connect(meta, config).await?)
    }
}

async fn etcd(endpoints: &[String], prefix: &str) -> anyhow::Result<Arc<dyn MetaStore>> {
    let store = EtcdStore::connect(endpoints, prefix)
        .await
        .with_context(|| format!("cannot reach etcd at {}", endpoints.join(",")))?;
    Ok(Arc::new(store))
}

async fn remote(addr: &str) -> anyhow::Result<Arc<dyn MetaStore>> {
    let store = basalt_client::RemoteMetaStore::connect(addr)
        .await
        .with_context(|| format!("cannot reach the Basalt cluster at {addr}"))?;
    Ok(Arc::new(store))
}
