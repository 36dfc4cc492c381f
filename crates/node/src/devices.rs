//! Opening the node's devices: format new ones (with a cluster-unique device id), open every store
//! (recovery runs here), and register each in the catalog.

use crate::config::DeviceConfig;
use crate::error::NodeError;
use basalt_engine::{FormatOptions, IoMode, OpenOptions, Store};
use basalt_meta::{Catalog, DeviceRecord, DeviceState, IdKind, default_weight};
use basalt_types::{DeviceId, NodeId};
use std::collections::HashMap;

/// Formats (if needed), opens and registers every configured device.
pub(crate) async fn open_all(
    catalog: &Catalog,
    node: NodeId,
    configs: &[DeviceConfig],
    object_size: u32,
    io: IoMode,
) -> Result<HashMap<DeviceId, Store>, NodeError> {
    let mut stores = HashMap::new();
    for cfg in configs {
        let store = open_one(catalog, node, cfg, object_size, io).await?;
        let info = store.info();
        let id = info.device_id;
        if stores.contains_key(&id) {
            return Err(NodeError::Config(format!(
                "{} is listed twice (device {id})",
                cfg.path.display()
            )));
        }
        let record = DeviceRecord {
            id,
            node,
            path: cfg.path.display().to_string(),
            class: cfg.class.clone(),
            capacity: info.capacity_bytes,
            weight: default_weight(info.capacity_bytes),
            state: DeviceState::Up,
        };
        catalog.put_device(&record).await?;
        tracing::info!(
            device = %id,
            path = %cfg.path.display(),
            io = info.io_backend,
            capacity = info.capacity_bytes,
            "device open"
        );
        stores.insert(id, store);
    }
    Ok(stores)
}

async fn open_one(
    catalog: &Catalog,
    node: NodeId,
    cfg: &DeviceConfig,
    object_size: u32,
    io: IoMode,
) -> Result<Store, NodeError> {
    let path = cfg.path.clone();
    let dev_err = |source| NodeError::Device {
        path: cfg.path.display().to_string(),
        source,
    };
    let existing = if path.exists() {
        basalt_engine::probe(&path).map_err(dev_err)?
    } else {
        None
    };
    match existing {
        Some(info) => {
            // A device formatted for another node must not be adopted silently.
            if let Some(rec) = catalog.get_device(info.device_id).await?
                && rec.node != node
            {
                return Err(NodeError::Config(format!(
                    "{} holds device {} of {}, not of this node ({node}); \
                     give each node its own devices",
                    path.display(),
                    info.device_id,
                    rec.node
                )));
            }
        }
        None => {
            let id = DeviceId(catalog.next_id(IdKind::Device).await? as u32);
            let opts = FormatOptions {
                device_id: id,
                object_size,
                size: cfg.size,
                journal_size: cfg.journal_size,
                ..FormatOptions::default()
            };
            let p = path.clone();
            tokio::task::spawn_blocking(move || basalt_engine::format(&p, &opts))
                .await
                .expect("format task panicked")
                .map_err(dev_err)?;
            tracing::info!(device = %id, path = %path.display(), "formatted new device");
        }
    }
    let opts = OpenOptions {
        io,
        ..OpenOptions::default()
    };
    tokio::task::spawn_blocking(move || Store::open(&path, &opts))
        .await
        .expect("open task panicked")
        .map_err(dev_err)
}
