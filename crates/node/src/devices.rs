//! Opening the node's devices: format blank ones (with a cluster-unique device id), open every
//! store (recovery runs here), and register each in the catalog (keeping what an operator set).
//!
//! Format policy: a device holding a valid Basalt store is opened (never reformatted); one that
//! is blank is formatted; anything else (a file system, partition table, damaged store, any
//! non-zero byte in its first or last MiB) is refused unless the device's `force_format` is set.
//! Every device is used by this process alone (the engine locks it; another holder is named in
//! the error).
//!
//! A device this node registered before (once, at that path) whose store no longer opens
//! (damaged: `Corrupt`, or a media I/O error) does not keep the node from starting: it is
//! reported faulty (down until `basalt device clear-fault` and a restart of the node:
//! `faults.rs` keeps reporting it meanwhile) and the node serves its other devices; the
//! cluster rebuilds that device's copies elsewhere after the down-out interval. An unknown
//! device that fails to open still stops the start (a mistyped path must not go unnoticed).

use crate::config::DeviceConfig;
use crate::error::NodeError;
use basalt_engine::{EngineError, FormatOptions, IoMode, OpenOptions, Store};
use basalt_meta::{Catalog, DeviceRegistration, IdKind, LEFT_BEHIND};
use basalt_types::{DeviceId, NodeId};
use std::collections::BTreeMap;

/// The devices of a node: the open stores, and the registered devices that did not open (with
/// why: `faults.rs` keeps them reported down while the node runs).
#[derive(Default)]
pub(crate) struct Opened {
    pub stores: BTreeMap<DeviceId, Store>,
    pub unopened: BTreeMap<DeviceId, String>,
}

/// Formats (if needed), opens and registers every configured device.
pub(crate) async fn open_all(
    catalog: &Catalog,
    node: NodeId,
    configs: &[DeviceConfig],
    object_size: u32,
    io: IoMode,
    store_threads: bool,
) -> Result<Opened, NodeError> {
    let mut opened = Opened::default();
    let stores = &mut opened.stores;
    for cfg in configs {
        let store = match open_one(catalog, node, cfg, object_size, io, store_threads).await {
            Ok(store) => store,
            Err(NodeError::Device { path, source }) if fails_alone(&source) => {
                let Some(id) = registered(catalog, node, &path).await? else {
                    return Err(NodeError::Device { path, source });
                };
                let why = format!("the store did not open when its node started: {source}");
                catalog.report_device_fault(id, &why).await?;
                tracing::error!(device = %id, %path, "{why}; the node starts without it (the device stays down until `basalt device clear-fault {}` and a restart of the node)", id.0);
                opened.unopened.insert(id, why);
                continue;
            }
            Err(e) => return Err(e),
        };
        let info = store.info();
        let id = info.device_id;
        if stores.contains_key(&id) {
            return Err(NodeError::Config(format!(
                "{} is listed twice (device {id})",
                cfg.path.display()
            )));
        }
        register(
            catalog,
            node,
            &store,
            &cfg.path.display().to_string(),
            &cfg.class,
        )
        .await?;
        stores.insert(id, store);
    }
    Ok(opened)
}

/// Reports faulty every device registered to `node` that is neither among its open `stores`
/// nor in `unopened`: the node started without it (its drive was removed, or replaced by a
/// blank one that registered as a new device). Left as it was, the record would still say up,
/// and the map would route the device's PGs to a node that no longer has it. Reported at once,
/// before the node serves, and kept down while it runs (returned in `unopened`, for
/// `faults.rs`), until an operator clears the fault with the drive back on the node; gone for
/// good, it is marked out (its data is rebuilt elsewhere) and then removed (`basalt device
/// remove`, which accepts only a device its node left behind this way).
pub(crate) async fn report_missing(
    catalog: &Catalog,
    node: NodeId,
    stores: &BTreeMap<DeviceId, Store>,
    mut unopened: BTreeMap<DeviceId, String>,
) -> Result<BTreeMap<DeviceId, String>, NodeError> {
    for d in catalog.list_devices().await? {
        if d.node != node || stores.contains_key(&d.id) || unopened.contains_key(&d.id) {
            continue;
        }
        let why = format!(
            "{LEFT_BEHIND} (it was at {}): its drive was removed or replaced",
            d.path
        );
        catalog.report_device_fault(d.id, &why).await?;
        tracing::error!(
            device = %d.id,
            path = %d.path,
            "{why}; reported down (`basalt device out {0}` rebuilds its data elsewhere, `basalt device clear-fault {0}` once it is back)",
            d.id.0
        );
        unopened.insert(d.id, why);
    }
    Ok(unopened)
}

/// An open failure of a device that keeps only that device from serving: its store is damaged
/// or its I/O fails (at the open, or writing the marks right after it). Anything else (in use
/// by another process, not blank, an older format, refused arguments) is the operator's to fix
/// before the node starts.
fn fails_alone(e: &EngineError) -> bool {
    // Media errors only: a refused permission or a missing path is a setup mistake.
    const MEDIA: [i32; 3] = [5 /* EIO */, 6 /* ENXIO */, 19 /* ENODEV */];
    match e {
        EngineError::Corrupt(_) | EngineError::Poisoned(_) => true,
        EngineError::Io(io) => io.raw_os_error().is_some_and(|n| MEDIA.contains(&n)),
        _ => false,
    }
}

/// The device this node registered at `path` before, if exactly one (a drive replaced at the
/// same path leaves two records: which one failed is then not known, and the start fails).
async fn registered(
    catalog: &Catalog,
    node: NodeId,
    path: &str,
) -> Result<Option<DeviceId>, NodeError> {
    let ids: Vec<DeviceId> = catalog
        .list_devices()
        .await?
        .into_iter()
        .filter(|d| d.node == node && d.path == path)
        .map(|d| d.id)
        .collect();
    Ok(match ids[..] {
        [id] => Some(id),
        _ => None,
    })
}

/// Registers an open store as a device of `node` (compare-and-swap: an operator's out mark and
/// weight survive a restart).
pub(crate) async fn register(
    catalog: &Catalog,
    node: NodeId,
    store: &Store,
    path: &str,
    class: &str,
) -> Result<(), NodeError> {
    let info = store.info();
    let registration = DeviceRegistration {
        id: info.device_id,
        node,
        path: path.to_string(),
        class: class.to_string(),
        capacity: info.capacity_bytes,
        object_size: info.object_size,
    };
    let record = catalog.register_device(&registration).await?;
    if let Some(why) = &record.fault {
        tracing::error!(
            device = %info.device_id,
            path,
            "the device was found faulty ({why}): it stays down until `basalt device clear-fault {}`",
            info.device_id.0
        );
    }
    tracing::info!(
        device = %info.device_id,
        path,
        io = info.io_backend,
        capacity = info.capacity_bytes,
        weight = record.weight,
        out = ?record.out,
        "device open"
    );
    Ok(())
}

async fn open_one(
    catalog: &Catalog,
    node: NodeId,
    cfg: &DeviceConfig,
    object_size: u32,
    io: IoMode,
    store_threads: bool,
) -> Result<Store, NodeError> {
    let path = cfg.path.clone();
    let dev_err = |source| NodeError::Device {
        path: cfg.path.display().to_string(),
        source,
    };
    let mut opts = OpenOptions::default();
    if let Some(idle) = cfg.writeback_idle {
        opts.writeback_idle = idle;
    }
    if let Some(disk) = &cfg.sim {
        let store = open_sim(catalog, disk, object_size, &opts)
            .await
            .map_err(dev_err)?;
        mark(&store).await.map_err(dev_err)?;
        return Ok(store);
    }
    // A store of this device this process ran before (a node restarted in-process) may still
    // be letting go of it.
    Store::released(&path).await;
    let existing = if path.exists() {
        match basalt_engine::probe(&path) {
            Ok(found) => found,
            // A damaged store: reformatted only on request (format refuses it otherwise).
            Err(EngineError::Corrupt(why)) if cfg.force_format => {
                tracing::warn!(path = %path.display(), "reformatting a damaged store: {why}");
                None
            }
            Err(e) => return Err(dev_err(e)),
        }
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
                force: cfg.force_format,
                allow_sparse: cfg.allow_sparse,
            };
            let p = path.clone();
            tokio::task::spawn_blocking(move || basalt_engine::format(&p, &opts))
                .await
                .expect("format task panicked")
                .map_err(dev_err)?;
            tracing::info!(device = %id, path = %path.display(), "formatted new device");
        }
    }
    let opts = OpenOptions { io, ..opts };
    let store = if store_threads {
        tokio::task::spawn_blocking(move || Store::open(&path, &opts))
            .await
            .expect("open task panicked")
    } else {
        Store::spawn(&path, &opts).await
    }
    .map_err(dev_err)?;
    // Before anything else can fail: the store forgot what its open dropped.
    mark(&store).await.map_err(dev_err)?;
    Ok(store)
}

/// `cut::mark`, its failure said plainly: the cut is forgotten once the store has opened.
async fn mark(store: &Store) -> Result<(), EngineError> {
    crate::pg::cut::mark(store).await.map(|_| ()).map_err(|e| {
        if store.info().replay_cut.is_none() {
            return e;
        }
        EngineError::Corrupt(format!(
            "the store dropped journal records when it opened and marking what they may have              lost failed ({e}); its copies may lack acknowledged writes and nothing will say so              after a restart: reformat the device (--force-format) before clearing its fault"
        ))
    })
}

/// A store on a simulated disk (tests): formatted with a new device id when blank.
async fn open_sim(
    catalog: &Catalog,
    disk: &basalt_engine::sim::SimDisk,
    object_size: u32,
    opts: &OpenOptions,
) -> Result<Store, EngineError> {
    if basalt_engine::probe_sim(disk)?.is_none() {
        let id = catalog
            .next_id(IdKind::Device)
            .await
            .map_err(|e| EngineError::Io(std::io::Error::other(e.to_string())))?;
        let opts = FormatOptions {
            device_id: DeviceId(id as u32),
            object_size,
            ..FormatOptions::default()
        };
        basalt_engine::format_sim(disk, &opts)?;
    }
    Store::open_sim(disk, opts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_meta::EmbeddedStore;
    use std::io::{Seek, SeekFrom, Write};
    use std::path::Path;
    use std::sync::Arc;

    async fn catalog(dir: &Path) -> Catalog {
        Catalog::new(Arc::new(
            EmbeddedStore::open(&dir.join("meta.redb")).await.unwrap(),
        ))
    }

    fn device(path: &Path) -> DeviceConfig {
        DeviceConfig {
            size: Some(64 << 20),
            ..DeviceConfig::new(path)
        }
    }

    async fn open(catalog: &Catalog, cfg: &DeviceConfig) -> Result<Store, NodeError> {
        let stores = open_all(
            catalog,
            NodeId(1),
            std::slice::from_ref(cfg),
            128 << 10,
            IoMode::Psync,
            false,
        )
        .await?;
        Ok(stores.stores.into_values().next().expect("one store"))
    }

    fn scribble(path: &Path, at: u64, bytes: &[u8]) {
        let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        f.seek(SeekFrom::Start(at)).unwrap();
        f.write_all(bytes).unwrap();
    }

    #[test]
    fn only_damage_and_media_errors_let_the_node_start_without_a_device() {
        let io = |n| EngineError::Io(std::io::Error::from_raw_os_error(n));
        assert!(fails_alone(&EngineError::Corrupt("x".into())));
        assert!(fails_alone(&EngineError::Poisoned("x".into())));
        assert!(fails_alone(&io(5))); // EIO
        assert!(!fails_alone(&io(13))); // EACCES: a setup mistake
        assert!(!fails_alone(&io(2))); // ENOENT
        assert!(!fails_alone(&EngineError::InUse {
            path: "/dev/x".into(),
            holder: "pid 1".into(),
        }));
    }

    #[tokio::test]
    async fn a_blank_device_is_formatted_once_and_then_only_opened() {
        let dir = tempfile::tempdir().unwrap();
        let cat = catalog(dir.path()).await;
        let cfg = device(&dir.path().join("dev.img"));
        let store = open(&cat, &cfg).await.unwrap();
        let id = store.info().device_id;
        let oid =
            basalt_engine::ObjectId::new(basalt_engine::PoolId(1), basalt_engine::VolumeId(1), 0);
        store
            .write(
                oid,
                0,
                bytes::Bytes::from(vec![3u8; 4096]),
                Default::default(),
            )
            .await
            .unwrap();
        store.close().await.unwrap();
        // Even with force_format, a valid store is opened, never reformatted.
        let forced = DeviceConfig {
            force_format: true,
            ..cfg.clone()
        };
        let store = open(&cat, &forced).await.unwrap();
        assert_eq!(store.info().device_id, id);
        assert_eq!(
            &store.read(oid, 0, 4096).await.unwrap()[..],
            &[3u8; 4096][..]
        );
        assert_eq!(
            cat.get_device(id).await.unwrap().unwrap().path,
            cfg.path.display().to_string()
        );
        // While it is open, nobody else can use it, not even this process.
        match open(&cat, &cfg).await {
            Err(NodeError::Device {
                source: EngineError::InUse { holder, .. },
                ..
            }) => {
                assert!(
                    holder.contains(&format!("pid {}", std::process::id())),
                    "{holder}"
                );
            }
            Err(e) => panic!("expected InUse, got {e}"),
            Ok(_) => panic!("expected InUse, opened it twice"),
        }
    }

    #[tokio::test]
    async fn a_device_with_data_is_refused_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        let cat = catalog(dir.path()).await;
        let path = dir.path().join("dev.img");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        // An ext2/3/4 superblock magic where file systems keep it.
        scribble(&path, 1080, &[0x53, 0xEF]);
        let err = open(&cat, &device(&path)).await.expect_err("refused");
        assert!(
            matches!(
                err,
                NodeError::Device {
                    source: EngineError::NotBlank { .. },
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("ext2 file system"), "{err}");
        let mut head = vec![0u8; 2048];
        std::io::Read::read_exact(&mut std::fs::File::open(&path).unwrap(), &mut head).unwrap();
        assert_eq!(
            &head[1080..1082],
            &[0x53, 0xEF],
            "the refused device was changed"
        );
        let forced = DeviceConfig {
            force_format: true,
            ..device(&path)
        };
        open(&cat, &forced).await.expect("formatted when forced");
    }

    #[tokio::test]
    async fn a_damaged_store_is_refused_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        let cat = catalog(dir.path()).await;
        let cfg = device(&dir.path().join("dev.img"));
        let first = open(&cat, &cfg).await.unwrap();
        let id = first.info().device_id;
        first.close().await.unwrap();
        // One flipped byte inside the first superblock: repaired from the backup copy.
        scribble(&cfg.path, 100, &[0xFF]);
        let repaired = open(&cat, &cfg)
            .await
            .expect("opened from the backup superblock");
        assert_eq!(repaired.info().device_id, id);
        repaired.close().await.unwrap();
        // Both copies damaged (their CRCs fail, the magic stays): never formatted. This node's
        // device: reported faulty, the node starts without it.
        let size = std::fs::metadata(&cfg.path).unwrap().len();
        scribble(&cfg.path, 100, &[0xFF]);
        scribble(&cfg.path, size - 4096 + 100, &[0xFF]);
        let stores = open_all(
            &cat,
            NodeId(1),
            std::slice::from_ref(&cfg),
            128 << 10,
            IoMode::Psync,
            false,
        )
        .await
        .expect("the node starts without it");
        assert!(stores.stores.is_empty());
        assert!(stores.unopened.contains_key(&id));
        let rec = cat.get_device(id).await.unwrap().unwrap();
        assert_eq!(rec.state, basalt_meta::DeviceState::Down);
        assert!(
            rec.fault
                .is_some_and(|f| f.contains("Corrupt") || f.contains("corrupt"))
        );
        // A device no node registered: refused (a mistyped path must not go unnoticed).
        let other = tempfile::tempdir().unwrap();
        let err = open(&catalog(other.path()).await, &cfg)
            .await
            .expect_err("refused");
        assert!(
            matches!(
                err,
                NodeError::Device {
                    source: EngineError::Corrupt(_),
                    ..
                }
            ),
            "{err}"
        );
        let forced = DeviceConfig {
            force_format: true,
            ..cfg.clone()
        };
        let store = open(&cat, &forced).await.expect("reformatted when forced");
        assert_ne!(
            store.info().device_id,
            id,
            "a new device id (ids are never reused)"
        );
    }
}
