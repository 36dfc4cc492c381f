//! Records placement reads: PG-ready reports, device registration (operator state survives
//! restarts), and pool settings (min_size, delete).

use crate::common::Harness;
use anyhow::{Context, Result, ensure};
use basalt_meta::{
    DeviceRegistration, DeviceState, MetaError, OutReason, PgReadyRecord, PoolSpec, keys,
};
use basalt_types::{DeviceId, Epoch, NodeId, PgId, PoolId};
use std::time::Duration;

pub(crate) async fn catalog_pg_ready_reports_are_removed_by_revision(h: Harness) -> Result<()> {
    let c = h.catalog();
    let pg = PgId {
        pool: PoolId(1),
        pg: 9,
    };
    let report = PgReadyRecord::new(pg, Epoch(4), vec![DeviceId(2), DeviceId(3)]);
    let r1 = c.put_pg_ready(&report).await?;
    // A report under the wrong key is not trusted.
    let other = PgId {
        pool: PoolId(1),
        pg: 10,
    };
    h.store
        .put(
            &keys::pg_ready(other),
            serde_json::to_vec(&serde_json::json!({
                "v": 1, "pg": pg, "epoch": 4, "up": [2], "at": 0
            }))?,
            None,
        )
        .await?;
    let listed = c.list_pg_ready().await?;
    ensure!(listed == vec![(report.clone(), r1)], "{listed:?}");
    let newer = PgReadyRecord::new(pg, Epoch(5), vec![DeviceId(2)]);
    let r2 = c.put_pg_ready(&newer).await?;
    let leader = c.campaign("test", Duration::from_secs(10)).await?;
    let leader = leader.context("no other leader")?;
    ensure!(
        !c.remove_pg_ready(pg, r1, &leader).await?,
        "a newer report survives the removal of the one that was read"
    );
    ensure!(c.list_pg_ready().await?.len() == 1);
    ensure!(c.remove_pg_ready(pg, r2, &leader).await?);
    ensure!(c.list_pg_ready().await?.is_empty());
    Ok(())
}

pub(crate) async fn catalog_device_registration_keeps_operator_state(h: Harness) -> Result<()> {
    let c = h.catalog();
    let reg = DeviceRegistration {
        id: DeviceId(4),
        node: NodeId(2),
        path: "/srv/d4.img".into(),
        class: "ssd".into(),
        capacity: 64 << 30,
        object_size: 131072,
    };
    let first = c.register_device(&reg).await?;
    ensure!(first.weight == 64 && first.state == DeviceState::Up && first.is_in());
    c.set_device_out(DeviceId(4), Some(OutReason::Operator))
        .await?;
    c.set_device_weight(DeviceId(4), 7).await?;
    c.set_device_state(DeviceId(4), DeviceState::Down).await?;
    // The node restarts on a grown file at another path.
    let again = DeviceRegistration {
        path: "/srv/renamed.img".into(),
        capacity: 128 << 30,
        class: "hdd".into(),
        ..reg.clone()
    };
    let back = c.register_device(&again).await?;
    ensure!(
        back.weight == 7 && back.out == Some(OutReason::Operator) && back.class == "ssd",
        "a restart keeps weight, out and class: {back:?}"
    );
    ensure!(back.state == DeviceState::Up && back.capacity == 128 << 30);
    ensure!(back.path == "/srv/renamed.img");
    // A device its node found faulty stays down across a restart, until an operator clears it.
    let faulty = c
        .report_device_fault(DeviceId(4), "its store is poisoned")
        .await?;
    ensure!(faulty.state == DeviceState::Down);
    let back = c.register_device(&again).await?;
    ensure!(
        back.state == DeviceState::Down && back.fault.as_deref() == Some("its store is poisoned"),
        "a restart keeps a fault: {back:?}"
    );
    let cleared = c.clear_device_fault(DeviceId(4)).await?;
    ensure!(cleared.state == DeviceState::Up && cleared.fault.is_none());
    ensure!(c.register_device(&again).await?.state == DeviceState::Up);
    // The automatic down-out rule never overrides an operator, and undoes only itself.
    let leader = c.campaign("test", Duration::from_secs(10)).await?;
    let leader = leader.context("no other leader")?;
    ensure!(!c.auto_out_device(DeviceId(4), &leader).await?);
    ensure!(!c.auto_in_device(DeviceId(4), &leader).await?);
    c.set_device_out(DeviceId(4), None).await?;
    ensure!(c.auto_out_device(DeviceId(4), &leader).await?);
    let d = c.get_device(DeviceId(4)).await?;
    ensure!(d.is_some_and(|d| d.out == Some(OutReason::Auto)));
    ensure!(c.auto_in_device(DeviceId(4), &leader).await?);
    ensure!(c.get_device(DeviceId(4)).await?.is_some_and(|d| d.is_in()));
    // Another node cannot take the device over.
    let thief = DeviceRegistration {
        node: NodeId(3),
        ..reg
    };
    let e = c.register_device(&thief).await;
    ensure!(matches!(e, Err(MetaError::DeviceOwned { .. })), "{e:?}");
    // A record of an older version ("state": "out") reads as out by an operator.
    h.store
        .put(
            &keys::device(DeviceId(9)),
            br#"{"v":1,"id":9,"node":2,"path":"/x","class":"ssd","capacity":1073741824,"weight":1,"state":"out"}"#.to_vec(),
            None,
        )
        .await?;
    let old = c.get_device(DeviceId(9)).await?;
    ensure!(
        old.as_ref()
            .is_some_and(|d| !d.is_in() && d.object_size == 0)
    );
    let reg9 = DeviceRegistration {
        id: DeviceId(9),
        node: NodeId(2),
        path: "/x".into(),
        class: "ssd".into(),
        capacity: 1 << 30,
        object_size: 131072,
    };
    let d9 = c.register_device(&reg9).await?;
    ensure!(d9.state == DeviceState::Up && d9.out == Some(OutReason::Operator));
    Ok(())
}

pub(crate) async fn catalog_pools_min_size_and_delete(h: Harness) -> Result<()> {
    let c = h.catalog();
    let mut spec = PoolSpec::new("p3");
    ensure!(
        c.create_pool(&spec).await?.min_size == 2,
        "2 of 3 by default"
    );
    spec.name = "p1".into();
    spec.replicas = 1;
    ensure!(c.create_pool(&spec).await?.min_size == 1);
    spec.name = "bad".into();
    spec.replicas = 2;
    spec.min_size = Some(3);
    let e = c.create_pool(&spec).await;
    ensure!(matches!(e, Err(MetaError::InvalidPool { .. })), "{e:?}");
    ensure!(c.get_pool_by_name("bad").await?.is_none());
    ensure!(c.set_pool_min_size("p3", 3).await?.min_size == 3);
    let e = c.set_pool_min_size("p3", 4).await;
    ensure!(matches!(e, Err(MetaError::InvalidPool { .. })), "{e:?}");
    ensure!(matches!(
        c.set_pool_min_size("nope", 1).await,
        Err(MetaError::NoSuchPool(_))
    ));

    c.create_volume("v", 1 << 20, "p3").await?;
    let e = c.delete_pool("p3").await;
    ensure!(
        matches!(&e, Err(MetaError::PoolInUse { volumes, .. }) if volumes == "v"),
        "{e:?}"
    );
    // The refused delete left the pool usable.
    c.create_volume("w", 1 << 20, "p3").await?;
    for v in ["v", "w"] {
        c.mark_volume_deleting(v).await?;
        c.remove_volume(v).await?;
    }
    let gone = c.delete_pool("p3").await?;
    ensure!(gone.name == "p3");
    ensure!(c.get_pool_by_name("p3").await?.is_none());
    ensure!(c.list_pools().await?.len() == 1);
    let e = c.create_volume("x", 1 << 20, "p3").await;
    ensure!(matches!(e, Err(MetaError::NoSuchPool(_))), "{e:?}");
    // A pool caught half-deleted refuses new volumes until the delete is run again.
    let mut rec = c.get_pool_by_name("p1").await?.expect("p1");
    rec.deleting = true;
    h.store
        .put(
            &keys::pool(rec.id),
            serde_json::to_vec(&serde_json::json!({"v": 1, "id": rec.id, "name": "p1",
                "replicas": 1, "min_size": 1, "pg_count": rec.pg_count, "object_size": rec.object_size,
                "failure_domain": "host", "device_class": null, "created_at": 0, "deleting": true}))?,
            None,
        )
        .await?;
    let e = c.create_volume("y", 1 << 20, "p1").await;
    ensure!(matches!(e, Err(MetaError::PoolDeleting(_))), "{e:?}");
    c.delete_pool("p1").await?;
    ensure!(c.list_pools().await?.is_empty());
    Ok(())
}
