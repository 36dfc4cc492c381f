//! What only one backend can show: the embedded file across reopen, etcd across a crash.

use crate::common::{next_event, shared_etcd, wait_until};
use anyhow::{Context, Result, ensure};
use basalt_meta::{
    EmbeddedStore, EtcdProcess, EtcdStore, MetaError, MetaStore, Txn, TxnOp, WatchEvent,
};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_persists_across_reopen() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("meta.redb");
    let (kv_before, rev_before) = {
        let s = EmbeddedStore::open(&path).await?;
        s.put("/p/a", b"1".to_vec(), None).await?;
        s.put("/p/a", b"2".to_vec(), None).await?;
        s.txn(Txn::new().and_then([TxnOp::put("/p/b", b"b".to_vec())]))
            .await?;
        let lease = s.grant_lease(Duration::from_secs(60)).await?;
        s.put("/p/leased", b"l".to_vec(), Some(lease)).await?;
        // A second open of the same file is refused while this one lives.
        let second = EmbeddedStore::open(&path).await;
        ensure!(
            matches!(&second, Err(MetaError::Embedded { detail, .. }) if detail.contains("already open")),
            "{second:?}"
        );
        (s.get("/p/a").await?.context("a")?, s.revision().await?)
    };
    let s = EmbeddedStore::open(&path).await?;
    let kv_after = s.get("/p/a").await?.context("a after reopen")?;
    ensure!(kv_after == kv_before, "{kv_after:?} != {kv_before:?}");
    ensure!(s.get("/p/b").await?.context("b")?.value == b"b");
    ensure!(
        s.get("/p/leased").await?.is_none(),
        "leases do not survive a restart"
    );
    let rev = s.revision().await?;
    ensure!(
        rev == rev_before + 1,
        "dropping the leased key is one change: {rev_before} -> {rev}"
    );
    ensure!(
        s.put("/p/c", Vec::new(), None).await? == rev + 1,
        "revisions continue"
    );
    // History starts at open: older revisions are reported as lost, not silently skipped.
    let mut w = s.watch_prefix("/p/", 2).await?;
    ensure!(matches!(next_event(&mut w).await?, WatchEvent::Lost(_)));
    let mut w = s.watch_prefix("/p/", rev + 1).await?;
    ensure!(matches!(next_event(&mut w).await?, WatchEvent::Put(kv) if kv.key == "/p/c"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_survives_sigkill_and_restart() -> Result<()> {
    let mut etcd = EtcdProcess::start().await?;
    let pid = etcd.pid().context("running")?;
    let s = EtcdStore::connect(&[etcd.endpoint()], "/crash").await?;
    let rev = s.put("/k", b"durable".to_vec(), None).await?;
    etcd.kill()?;
    // Every kind of call reports the outage as transient (retry later), none hangs.
    let down = [
        s.get("/k").await.err(),
        s.put("/k2", Vec::new(), None).await.err(),
        s.list("/").await.err(),
        s.txn(Txn::new().and_then([TxnOp::delete("/k")]))
            .await
            .err(),
    ];
    for e in &down {
        ensure!(matches!(e, Some(e) if e.is_transient()), "{down:?}");
    }
    etcd.restart().await?;
    // The client reconnects on its own.
    wait_until(Duration::from_secs(20), || async {
        Ok(s.get("/k").await.is_ok())
    })
    .await?;
    let kv = s
        .get("/k")
        .await?
        .context("acknowledged before the crash")?;
    ensure!(kv.value == b"durable" && kv.mod_revision == rev);
    let new_pid = etcd.pid().context("restarted")?;
    drop(s);
    drop(etcd);
    for p in [pid, new_pid] {
        ensure!(
            !std::path::Path::new(&format!("/proc/{p}")).exists(),
            "etcd {p} still runs"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_prefixes_isolate_stores() -> Result<()> {
    let etcd = shared_etcd().await?;
    let a = EtcdStore::connect(&[etcd.endpoint()], "/iso-a").await?;
    let b = EtcdStore::connect(&[etcd.endpoint()], "/iso-b").await?;
    a.put("/k", b"a".to_vec(), None).await?;
    ensure!(b.get("/k").await?.is_none());
    ensure!(a.list("/").await?.kvs.iter().all(|kv| kv.key == "/k"));
    ensure!(
        a.get("/k").await?.context("a's key")?.key == "/k",
        "keys come back unprefixed"
    );
    a.delete("/k").await?;
    Ok(())
}

/// An etcd with its default request limit (1.5 MiB) refuses a 3 MiB value, which is what one
/// cluster map of that size used to be; the split map of the same size is published in
/// batches, read back, and followed by a watcher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_with_default_limits_takes_a_map_bigger_than_a_request() -> Result<()> {
    use crate::map::TestMap;
    let etcd = EtcdProcess::start_with(basalt_meta::EtcdOptions {
        max_request_bytes: basalt_meta::ETCD_DEFAULT_REQUEST_BYTES,
        ..Default::default()
    })
    .await?;
    let store: std::sync::Arc<dyn MetaStore> =
        std::sync::Arc::new(EtcdStore::connect(&[etcd.endpoint()], "").await?);
    let one_value = store.put("/big", vec![7u8; 3 << 20], None).await;
    ensure!(one_value.is_err(), "etcd took a 3 MiB request");
    let c = basalt_meta::Catalog::new(store);
    let map = TestMap {
        epoch: 1,
        chunks: (0..100u8).map(|i| vec![i; 32 << 10]).collect(),
    };
    let stored = c.put_map(&map, None).await?;
    ensure!(c.get_map::<TestMap>().await?.context("map")?.0 == map);
    let mut maps = c.watch_map::<TestMap>().await?;
    ensure!(tokio::time::timeout(Duration::from_secs(10), maps.recv()).await? == Some(map.clone()));
    let mut next = map;
    next.epoch = 2;
    for c in next.chunks.iter_mut().step_by(2) {
        c[0] = 255;
    }
    c.put_map(&next, Some(&stored)).await?;
    let got = tokio::time::timeout(Duration::from_secs(10), maps.recv()).await?;
    ensure!(
        got == Some(next),
        "the watcher follows a batched publication"
    );
    Ok(())
}
