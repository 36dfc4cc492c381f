//! Catalog checks of the conformance suite (instantiated for both backends in conformance.rs).

use crate::common::Harness;
use crate::map::TestMap;
use anyhow::{Context, Result, bail, ensure};
use basalt_meta::{
    Catalog, DeviceRecord, DeviceState, IdKind, KeyValue, MetaError, PgReadyRecord, PoolSpec,
    VolumeState, keys,
};
use basalt_types::{DeviceId, Epoch, NodeId, PgId, PoolId};
use std::time::Duration;

async fn make_pool(c: &Catalog, name: &str) -> Result<basalt_meta::PoolRecord> {
    let mut spec = PoolSpec::new(name);
    spec.replicas = 2;
    spec.pg_count = 32;
    Ok(c.create_pool(&spec).await?)
}

pub(crate) async fn catalog_unique_volume_names_under_concurrent_creates(h: Harness) -> Result<()> {
    let c = h.catalog();
    make_pool(&c, "p").await?;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            c.create_volume("vol", 1 << 20, "p").await
        }));
    }
    let (mut ok, mut exists) = (Vec::new(), 0);
    for t in tasks {
        match t.await? {
            Ok(rec) => ok.push(rec),
            Err(MetaError::VolumeExists(name)) => {
                ensure!(name == "vol");
                exists += 1;
            }
            Err(e) => bail!("unexpected error: {e}"),
        }
    }
    ensure!(
        ok.len() == 1 && exists == 7,
        "{} created, {exists} refused",
        ok.len()
    );
    let stored = c.get_volume("vol").await?.context("vol")?;
    ensure!(stored == ok[0], "the stored record is the winner's");
    ensure!(c.list_volumes().await?.len() == 1);
    // The same holds for pools.
    let dup = c.create_pool(&PoolSpec::new("p")).await;
    ensure!(matches!(dup, Err(MetaError::PoolExists(_))), "{dup:?}");
    Ok(())
}

pub(crate) async fn catalog_ids_are_never_reused(h: Harness) -> Result<()> {
    let c = h.catalog();
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..3 {
                ids.push(c.next_id(IdKind::Node).await?);
            }
            Ok::<_, MetaError>(ids)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    all.sort_unstable();
    ensure!(all == (1..=30).collect::<Vec<u64>>(), "{all:?}");
    ensure!(
        c.next_id(IdKind::Device).await? == 1,
        "each kind counts on its own"
    );

    ensure!(c.last_id(IdKind::Node).await? == 30, "the node counter");
    ensure!(
        c.last_id(IdKind::Volume).await? == 0,
        "no volume id handed out yet"
    );

    let pool = make_pool(&c, "p").await?;
    let v1 = c.create_volume("v", 4096, "p").await?;
    ensure!(c.last_id(IdKind::Volume).await? == v1.id.0);
    c.mark_volume_deleting("v").await?;
    c.remove_volume("v").await?;
    let v2 = c.create_volume("v", 4096, "p").await?;
    ensure!(
        v2.id > v1.id,
        "a re-created volume gets a new id: {:?} then {:?}",
        v1.id,
        v2.id
    );
    ensure!(v2.pool == pool.id);
    Ok(())
}

pub(crate) async fn catalog_resize_is_compare_and_swap(h: Harness) -> Result<()> {
    let c = h.catalog();
    make_pool(&c, "p").await?;
    let v = c.create_volume("v", 1 << 20, "p").await?;
    let r = c.resize_volume("v", 2 << 20).await?;
    ensure!(r.size == 2 << 20 && r.id == v.id && r.created_at == v.created_at);
    // Concurrent resizes: each applies in turn, none is lost or torn.
    let sizes: Vec<u64> = (1..=6).map(|i| i << 24).collect();
    let mut tasks = Vec::new();
    for &size in &sizes {
        let c = c.clone();
        tasks.push(tokio::spawn(
            async move { c.resize_volume("v", size).await },
        ));
    }
    for t in tasks {
        t.await??;
    }
    let now = c.get_volume("v").await?.context("v")?;
    ensure!(
        sizes.contains(&now.size),
        "final size {} is one of the requested",
        now.size
    );
    // Of two resizes prepared for the same size, only the first commits.
    let grow = |to: u64| {
        let c = c.clone();
        async move { c.resize_volume_from("v", Some(now.size), to).await }
    };
    let first = grow(now.size + (1 << 20)).await?;
    let second = grow(now.size + (2 << 20)).await;
    ensure!(
        matches!(second, Err(MetaError::VolumeChanged { expected, found, .. })
            if expected == now.size && found == first.size),
        "{second:?}"
    );
    let now = c.get_volume("v").await?.context("v")?;
    ensure!(now.size == first.size, "{now:?}");
    // A resize never overwrites a concurrent state change.
    c.mark_volume_deleting("v").await?;
    let r = c.resize_volume("v", 4 << 20).await;
    ensure!(matches!(r, Err(MetaError::VolumeDeleting(_))), "{r:?}");
    let after = c.get_volume("v").await?.context("v")?;
    ensure!(after.state == VolumeState::Deleting && after.size == now.size);
    let r = c.resize_volume("nope", 4096).await;
    ensure!(matches!(r, Err(MetaError::NoSuchVolume(_))), "{r:?}");
    let r = c.resize_volume("v", 4097).await;
    ensure!(matches!(r, Err(MetaError::InvalidSize { .. })), "{r:?}");
    Ok(())
}

pub(crate) async fn catalog_rejects_bad_input_and_stores_nothing(h: Harness) -> Result<()> {
    let c = h.catalog();
    make_pool(&c, "p").await?;
    for name in ["", "a/b", "-x", "has space", &"x".repeat(65)] {
        let r = c.create_volume(name, 4096, "p").await;
        ensure!(
            matches!(r, Err(MetaError::InvalidName(_))),
            "{name:?}: {r:?}"
        );
    }
    for size in [0, 1, 4095, 12_345, (1u64 << 50) + 4096, u64::MAX] {
        let r = c.create_volume("v", size, "p").await;
        ensure!(
            matches!(r, Err(MetaError::InvalidSize { .. })),
            "{size}: {r:?}"
        );
    }
    let r = c.create_volume("v", 4096, "no-such-pool").await;
    match r {
        Err(e @ MetaError::NoSuchPool(_)) => {
            ensure!(e.to_string().contains("no-such-pool"), "{e}");
        }
        other => bail!("expected NoSuchPool, got {other:?}"),
    }
    let mut bad = PoolSpec::new("q");
    bad.replicas = 0;
    ensure!(matches!(
        c.create_pool(&bad).await,
        Err(MetaError::InvalidPool { .. })
    ));
    bad.replicas = 2;
    bad.object_size = 5000;
    ensure!(matches!(
        c.create_pool(&bad).await,
        Err(MetaError::InvalidPool { .. })
    ));
    ensure!(
        c.list_volumes().await?.is_empty(),
        "rejected creates stored nothing"
    );
    ensure!(c.list_pools().await?.len() == 1);
    let r = c.remove_volume("v").await;
    ensure!(matches!(r, Err(MetaError::NoSuchVolume(_))), "{r:?}");
    let v = c.create_volume("v", 1u64 << 50, "p").await?;
    ensure!(
        v.size == 1 << 50,
        "1 PiB is the documented limit and allowed"
    );
    let r = c.remove_volume("v").await;
    ensure!(matches!(r, Err(MetaError::VolumeNotDeleting(_))), "{r:?}");
    Ok(())
}

pub(crate) async fn catalog_volume_watch_follows_resize_and_delete(h: Harness) -> Result<()> {
    use basalt_meta::VolumeEvent;
    let c = h.catalog();
    make_pool(&c, "p").await?;
    let a = c.create_volume("a", 1 << 20, "p").await?;
    // A record this version cannot read is skipped, in the listing and as a change.
    h.store
        .put(&keys::volume("zz"), b"not a record".to_vec(), None)
        .await?;
    let listed = c.list_volumes_at().await?;
    ensure!(
        listed.volumes == vec![a.clone()] && listed.unreadable == ["zz"],
        "the listing counts the record it cannot read: {listed:?}"
    );
    let (_, a_at) = c.get_volume_at("a").await?.context("a")?;
    ensure!(a_at <= listed.revision, "{listed:?} predates a at {a_at}");
    let mut rx = c.watch_volumes().await?;
    let mut next = async || -> Result<VolumeEvent> {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await?
            .context("the volume watch ended")
    };
    let first = next().await?;
    let VolumeEvent::All { volumes, revision } = first else {
        bail!("the current volumes come first: {first:?}");
    };
    ensure!(volumes == vec![a.clone()], "{volumes:?}");
    let (_, at) = c.get_volume_at("a").await?.context("a")?;
    ensure!(
        at <= revision,
        "listing at {revision} predates a's record at {at}"
    );
    h.store
        .put(&keys::volume("zz"), b"still not a record".to_vec(), None)
        .await?;
    let b = c.create_volume("b", 1 << 20, "p").await?;
    let grown = c.resize_volume("a", 2 << 20).await?;
    let (_, grown_at) = c.get_volume_at("a").await?.context("a")?;
    let deleting = c.mark_volume_deleting("b").await?;
    c.remove_volume("b").await?;
    let mut last = revision;
    let mut seen = Vec::new();
    for _ in 0..4 {
        let ev = next().await?;
        let rev = match &ev {
            VolumeEvent::Changed { revision, .. } | VolumeEvent::Removed { revision, .. } => {
                *revision
            }
            VolumeEvent::All { .. } => bail!("unexpected re-listing: {ev:?}"),
        };
        ensure!(rev > last, "revisions increase: {ev:?} after {last}");
        last = rev;
        seen.push(ev);
    }
    ensure!(
        matches!(&seen[0], VolumeEvent::Changed { record, .. } if *record == b)
            && matches!(&seen[1], VolumeEvent::Changed { record, revision } if *record == grown && *revision == grown_at)
            && matches!(&seen[2], VolumeEvent::Changed { record, .. } if *record == deleting)
            && matches!(&seen[3], VolumeEvent::Removed { name, .. } if name == "b"),
        "{seen:?}"
    );
    Ok(())
}

pub(crate) async fn catalog_leader_election_and_fencing(h: Harness) -> Result<()> {
    let c = h.catalog();
    let ttl = Duration::from_secs(2);
    ensure!(c.leader().await?.is_none());
    let a = c
        .campaign("a", ttl)
        .await?
        .context("the first candidate wins")?;
    ensure!(
        c.campaign("b", ttl).await?.is_none(),
        "a second candidate loses"
    );
    ensure!(c.leader().await?.context("leader")?.name == "a");
    let r = c
        .put_map_as_leader(&TestMap::new(1, &[b"x"]), None, &a)
        .await?;
    // b waits in elect(); a resigns; b takes over.
    let c2 = c.clone();
    let b = tokio::spawn(async move { c2.elect("b", ttl).await });
    a.resign().await?;
    let b = tokio::time::timeout(Duration::from_secs(20), b).await???;
    ensure!(c.leader().await?.context("leader")?.name == "b");
    // b's lease is revoked behind its back (as if it expired): b learns it lost, and its
    // fenced writes fail although the map did not change.
    let lease = c
        .store()
        .get(keys::LEADER)
        .await?
        .and_then(|kv: KeyValue| kv.lease);
    c.store()
        .revoke_lease(lease.context("leader key has a lease")?)
        .await?;
    tokio::time::timeout(Duration::from_secs(20), b.lost()).await?;
    ensure!(b.is_lost());
    let w = c
        .put_map_as_leader(&TestMap::new(2, &[b"y"]), Some(&r), &b)
        .await;
    ensure!(matches!(w, Err(MetaError::NotLeader)), "{w:?}");
    ensure!(c.leader().await?.is_none());
    // Nor may it consume a PG-ready report or apply the down-out rule, whether another leader
    // was elected meanwhile or not.
    let pg = PgId {
        pool: PoolId(1),
        pg: 3,
    };
    let report = c
        .put_pg_ready(&PgReadyRecord::new(pg, Epoch(2), vec![DeviceId(5)]))
        .await?;
    let dev = DeviceRecord {
        id: DeviceId(5),
        node: NodeId(1),
        path: "/dev/vdb".into(),
        class: "ssd".into(),
        capacity: 1 << 30,
        weight: 1,
        object_size: 131072,
        state: DeviceState::Down,
        out: None,
        fault: None,
        lost: false,
    };
    c.put_device(&dev).await?;
    for round in 0..2 {
        let _successor = match round {
            1 => Some(c.campaign("c", ttl).await?.context("c wins")?),
            _ => None,
        };
        let w = c.remove_pg_ready(pg, report, &b).await;
        ensure!(matches!(w, Err(MetaError::NotLeader)), "{w:?}");
        let w = c.auto_out_device(DeviceId(5), &b).await;
        ensure!(matches!(w, Err(MetaError::NotLeader)), "{w:?}");
    }
    ensure!(
        c.list_pg_ready().await?.len() == 1,
        "the report was deleted"
    );
    ensure!(
        c.get_device(DeviceId(5)).await? == Some(dev),
        "the device changed"
    );
    Ok(())
}

pub(crate) async fn catalog_nodes_live_under_a_lease_and_devices_persist(h: Harness) -> Result<()> {
    use basalt_meta::{NodeRecord, default_weight};

    let c = h.catalog();
    let node = NodeRecord::new(NodeId(3), "host-a", "127.0.0.1:7000");
    let keep = c.register_node(&node, Duration::from_secs(2)).await?;
    ensure!(c.list_nodes().await? == vec![node.clone()]);
    ensure!(c.get_node(NodeId(3)).await? == Some(node));
    let dev = DeviceRecord {
        id: DeviceId(7),
        node: NodeId(3),
        path: "/dev/vdb".into(),
        class: "ssd".into(),
        capacity: 100 << 30,
        weight: default_weight(100 << 30),
        object_size: 131072,
        state: DeviceState::Up,
        out: None,
        fault: None,
        lost: false,
    };
    c.put_device(&dev).await?;
    ensure!(dev.weight == 100);
    let down = c.set_device_state(DeviceId(7), DeviceState::Down).await?;
    ensure!(down.state == DeviceState::Down && down.path == dev.path);
    ensure!(matches!(
        c.set_device_state(DeviceId(8), DeviceState::Up).await,
        Err(MetaError::NoSuchDevice(_))
    ));
    // A device its registered node reports up is not lost.
    c.set_device_state(DeviceId(7), DeviceState::Up).await?;
    ensure!(matches!(
        c.mark_device_lost(DeviceId(7)).await,
        Err(MetaError::DeviceInUse(_))
    ));
    ensure!(!c.get_device(DeviceId(7)).await?.unwrap().lost);
    keep.revoke().await?;
    ensure!(
        c.list_nodes().await?.is_empty(),
        "the node record goes with its lease"
    );
    ensure!(c.list_devices().await?.len() == 1, "device records stay");
    // Declared lost: down, out and faulty for good; neither clear-fault nor `in` undoes it,
    // and registering it again keeps it down.
    let lost = c.mark_device_lost(DeviceId(7)).await?;
    ensure!(lost.lost && lost.state == DeviceState::Down && !lost.is_in());
    ensure!(lost.fault.as_deref() == Some(basalt_meta::DECLARED_LOST));
    ensure!(matches!(
        c.clear_device_fault(DeviceId(7)).await,
        Err(MetaError::DeviceLost(_))
    ));
    ensure!(matches!(
        c.set_device_out(DeviceId(7), None).await,
        Err(MetaError::DeviceLost(_))
    ));
    let reg = basalt_meta::DeviceRegistration {
        id: DeviceId(7),
        node: NodeId(3),
        path: "/dev/vdb".into(),
        class: "ssd".into(),
        capacity: 100 << 30,
        object_size: 131072,
    };
    let again = c.register_device(&reg).await?;
    ensure!(again.lost && again.state == DeviceState::Down && !again.is_in());
    // A fault its node reported (it started without the device) stays: it may be removed.
    let missing = format!("{} (it was at /dev/vdb)", basalt_meta::LEFT_BEHIND);
    c.report_device_fault(DeviceId(7), &missing).await?;
    let kept = c.mark_device_lost(DeviceId(7)).await?;
    ensure!(kept.lost && kept.left_behind(), "{kept:?}");
    Ok(())
}
