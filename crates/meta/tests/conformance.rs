//! One conformance suite, run against both backends: the embedded redb store and a real etcd
//! started by `EtcdProcess`. Each check is written once, against `Arc<dyn MetaStore>`; the
//! `conformance!` macro instantiates it for each backend.
//!
//! The etcd tests share one etcd process (each test uses its own key prefix); it is killed
//! when the last test using it finishes.

#[path = "conformance/backend_specific.rs"]
mod backend_specific;
#[path = "conformance/catalog.rs"]
mod catalog;
mod common;
#[path = "conformance/map.rs"]
mod map;
#[path = "conformance/records.rs"]
mod records;

use anyhow::{Context, Result, bail, ensure};
use basalt_meta::{
    Compare, CompareOp, MetaError, Txn, TxnOp, TxnOpResult, WATCH_BUFFER, WatchEvent,
};
use catalog::*;
use common::{Harness, next_event, wait_until};
use map::*;
use records::*;
use std::collections::BTreeSet;
use std::time::Duration;

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> anyhow::Result<()> {
                    super::$name(super::Harness::embedded().await?).await
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> anyhow::Result<()> {
                    super::$name(super::Harness::etcd(stringify!($name)).await?).await
                }
            )*
        }
    };
}

conformance!(
    crud_and_revisions,
    prefix_listing,
    revisions_are_global_and_monotonic,
    txn_compare_semantics,
    txn_concurrent_writers_exactly_one_wins,
    watch_sees_changes_in_order_from_a_revision,
    watch_that_falls_behind_reports_lost,
    lease_expiry_deletes_keys_and_notifies_watchers,
    lease_keep_alive_and_revoke,
    catalog_unique_volume_names_under_concurrent_creates,
    catalog_ids_are_never_reused,
    catalog_resize_is_compare_and_swap,
    catalog_rejects_bad_input_and_stores_nothing,
    catalog_map_cas_and_watch,
    catalog_map_watch_delivers_every_publication,
    catalog_map_writes_changed_chunks_in_batches_and_cleans_up,
    catalog_map_refuses_format_1,
    catalog_pg_ready_reports_are_removed_by_revision,
    catalog_device_registration_keeps_operator_state,
    catalog_pools_min_size_and_delete,
    catalog_volume_watch_follows_resize_and_delete,
    catalog_leader_election_and_fencing,
    catalog_nodes_live_under_a_lease_and_devices_persist,
    large_values_round_trip,
);

async fn crud_and_revisions(h: Harness) -> Result<()> {
    let s = &h.store;
    ensure!(s.get("/k").await?.is_none());
    let r1 = s.put("/k", b"one".to_vec(), None).await?;
    let kv = s.get("/k").await?.context("/k after put")?;
    ensure!(kv.value == b"one" && kv.key == "/k");
    ensure!(
        kv.create_revision == r1 && kv.mod_revision == r1 && kv.version == 1,
        "{kv:?}"
    );
    let r2 = s.put("/k", b"two".to_vec(), None).await?;
    ensure!(r2 > r1);
    let kv = s.get("/k").await?.context("/k after update")?;
    ensure!(
        kv.value == b"two" && kv.create_revision == r1 && kv.mod_revision == r2,
        "{kv:?}"
    );
    ensure!(kv.version == 2 && kv.lease.is_none());
    ensure!(
        s.delete("/k").await?,
        "delete of an existing key reports it"
    );
    ensure!(
        !s.delete("/k").await?,
        "delete of a missing key reports nothing"
    );
    ensure!(s.get("/k").await?.is_none());
    // Re-created keys start a new life.
    let r3 = s.put("/k", Vec::new(), None).await?;
    let kv = s.get("/k").await?.context("/k recreated")?;
    ensure!(kv.create_revision == r3 && kv.version == 1 && kv.value.is_empty());
    Ok(())
}

async fn prefix_listing(h: Harness) -> Result<()> {
    let s = &h.store;
    for k in ["/a/2", "/a/1", "/a/3", "/ab", "/b/1", "/a"] {
        s.put(k, k.as_bytes().to_vec(), None).await?;
    }
    let listing = s.list("/a/").await?;
    let keys: Vec<&str> = listing.kvs.iter().map(|kv| kv.key.as_str()).collect();
    ensure!(keys == ["/a/1", "/a/2", "/a/3"], "{keys:?}");
    ensure!(listing.kvs.iter().all(|kv| kv.value == kv.key.as_bytes()));
    let max = listing
        .kvs
        .iter()
        .map(|kv| kv.mod_revision)
        .max()
        .unwrap_or(0);
    ensure!(
        listing.revision >= max,
        "listing revision {} < {max}",
        listing.revision
    );
    ensure!(s.list("/zzz/").await?.kvs.is_empty());
    ensure!(
        s.list("/a").await?.kvs.len() == 5,
        "'/a' prefixes '/a', '/a/*' and '/ab'"
    );
    Ok(())
}

async fn revisions_are_global_and_monotonic(h: Harness) -> Result<()> {
    let s = &h.store;
    let start = s.revision().await?;
    let mut last = start;
    for i in 0..5 {
        let r = s.put(&format!("/m/{i}"), vec![i], None).await?;
        ensure!(r > last, "revision {r} after {last}");
        last = r;
    }
    ensure!(s.revision().await? >= last);
    // Reads and no-op deletes do not move the revision (a fresh embedded store is ours alone;
    // on a shared etcd others may write, so only check the embedded case exactly).
    s.get("/m/0").await?;
    s.list("/m/").await?;
    s.delete("/m/missing").await?;
    let reads_only = Txn::new().and_then([TxnOp::get("/m/0")]);
    let r = s.txn(reads_only).await?;
    if h.exclusive {
        ensure!(s.revision().await? == last, "reads changed the revision");
        ensure!(r.revision == last);
    }
    // All writes of one transaction share one revision.
    let txn = Txn::new().and_then([
        TxnOp::put("/m/x", b"x".to_vec()),
        TxnOp::put("/m/y", b"y".to_vec()),
        TxnOp::delete("/m/0"),
    ]);
    let r = s.txn(txn).await?;
    ensure!(r.succeeded && r.revision > last);
    for k in ["/m/x", "/m/y"] {
        let kv = s.get(k).await?.context("written by txn")?;
        ensure!(
            kv.mod_revision == r.revision,
            "{kv:?} vs txn revision {}",
            r.revision
        );
    }
    if h.exclusive {
        ensure!(r.revision == last + 1, "one txn = one revision");
    }
    Ok(())
}

async fn txn_compare_semantics(h: Harness) -> Result<()> {
    let s = &h.store;
    let run = |compares: Vec<Compare>| {
        let store = s.clone();
        async move {
            let txn = Txn::new()
                .when(compares)
                .and_then([TxnOp::get("/t/k")])
                .or_else([TxnOp::get("/t/k")]);
            Ok::<bool, MetaError>(store.txn(txn).await?.succeeded)
        }
    };
    // On a missing key: existence and zero revisions hold, value comparisons never do.
    ensure!(run(vec![Compare::missing("/t/k")]).await?);
    ensure!(!run(vec![Compare::exists("/t/k")]).await?);
    ensure!(run(vec![Compare::mod_revision_is("/t/k", 0)]).await?);
    ensure!(run(vec![Compare::version("/t/k", CompareOp::Equal, 0)]).await?);
    ensure!(!run(vec![Compare::value_equals("/t/k", b"".to_vec())]).await?);
    let ne = Compare {
        key: "/t/k".into(),
        target: basalt_meta::CompareTarget::Value(CompareOp::NotEqual, b"x".to_vec()),
    };
    ensure!(
        !run(vec![ne.clone()]).await?,
        "value compare on a missing key is false, even !="
    );

    let rev = s.put("/t/k", b"v1".to_vec(), None).await?;
    ensure!(run(vec![Compare::exists("/t/k")]).await?);
    ensure!(run(vec![Compare::value_equals("/t/k", b"v1".to_vec())]).await?);
    ensure!(run(vec![ne]).await?);
    ensure!(!run(vec![Compare::value_equals("/t/k", b"v2".to_vec())]).await?);
    ensure!(run(vec![Compare::mod_revision_is("/t/k", rev)]).await?);
    ensure!(
        run(vec![Compare::mod_revision(
            "/t/k",
            CompareOp::Less,
            rev + 1
        )])
        .await?
    );
    ensure!(
        run(vec![Compare::create_revision(
            "/t/k",
            CompareOp::Equal,
            rev
        )])
        .await?
    );
    ensure!(run(vec![Compare::version("/t/k", CompareOp::Greater, 0)]).await?);
    // All comparisons must hold.
    ensure!(!run(vec![Compare::exists("/t/k"), Compare::missing("/t/k")]).await?);

    // The failure branch runs when a comparison fails, and its reads see the current state.
    let txn = Txn::new()
        .when([Compare::mod_revision_is("/t/k", rev - 1)])
        .and_then([TxnOp::put("/t/k", b"lost".to_vec())])
        .or_else([TxnOp::get("/t/k"), TxnOp::put("/t/other", b"o".to_vec())]);
    let r = s.txn(txn).await?;
    ensure!(!r.succeeded && r.results.len() == 2);
    match &r.results[0] {
        TxnOpResult::Get(Some(kv)) => ensure!(kv.value == b"v1", "{kv:?}"),
        other => bail!("expected the current value, got {other:?}"),
    }
    ensure!(
        s.get("/t/other").await?.is_some(),
        "failure-branch writes apply"
    );
    ensure!(s.get("/t/k").await?.context("k")?.value == b"v1");

    // A branch may not write one key twice, as etcd refuses.
    let dup = Txn::new().and_then([TxnOp::put("/t/d", b"1".to_vec()), TxnOp::delete("/t/d")]);
    ensure!(matches!(s.txn(dup).await, Err(MetaError::InvalidTxn(_))));
    ensure!(s.get("/t/d").await?.is_none());
    Ok(())
}

async fn txn_concurrent_writers_exactly_one_wins(h: Harness) -> Result<()> {
    let mut tasks = Vec::new();
    for i in 0..16u8 {
        let s = h.store.clone();
        tasks.push(tokio::spawn(async move {
            let txn = Txn::new()
                .when([Compare::missing("/race/k")])
                .and_then([TxnOp::put("/race/k", vec![i])]);
            s.txn(txn).await.map(|r| (i, r.succeeded))
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        let (i, won) = t.await??;
        if won {
            winners.push(i);
        }
    }
    ensure!(winners.len() == 1, "winners: {winners:?}");
    let kv = h.store.get("/race/k").await?.context("race key")?;
    ensure!(kv.value == [winners[0]] && kv.version == 1);

    // Concurrent compare-and-swap increments: none lost.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let s = h.store.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                loop {
                    let cur = s.get("/race/n").await?;
                    let (n, guard) = match &cur {
                        Some(kv) => (
                            kv.value[0],
                            Compare::mod_revision_is("/race/n", kv.mod_revision),
                        ),
                        None => (0, Compare::missing("/race/n")),
                    };
                    let txn = Txn::new()
                        .when([guard])
                        .and_then([TxnOp::put("/race/n", vec![n + 1])]);
                    if s.txn(txn).await?.succeeded {
                        break;
                    }
                }
            }
            Ok::<(), MetaError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let n = h.store.get("/race/n").await?.context("counter")?;
    ensure!(n.value == [40], "40 increments, got {:?}", n.value);
    Ok(())
}

async fn watch_sees_changes_in_order_from_a_revision(h: Harness) -> Result<()> {
    let s = &h.store;
    let start = s.put("/w/start", Vec::new(), None).await?;
    // A live watcher, started before the changes.
    let mut live = s.watch_prefix("/w/", 0).await?;
    let r_a = s.put("/w/a", b"1".to_vec(), None).await?;
    let r_b = s.put("/w/b", b"2".to_vec(), None).await?;
    s.put("/other/x", b"not watched".to_vec(), None).await?;
    ensure!(s.delete("/w/a").await?);
    let t = s
        .txn(Txn::new().and_then([
            TxnOp::put("/w/c", b"3".to_vec()),
            TxnOp::put("/w/d", b"4".to_vec()),
        ]))
        .await?;
    let r_a2 = s.put("/w/a", b"5".to_vec(), None).await?;
    let expect = |events: &[WatchEvent]| -> Result<()> {
        let got: Vec<(char, &str, i64)> = events.iter().map(summary).collect::<Result<_>>()?;
        let del_rev = got.get(2).map_or(0, |e| e.2);
        let want = vec![
            ('P', "/w/a", r_a),
            ('P', "/w/b", r_b),
            ('D', "/w/a", del_rev),
            ('P', "/w/c", t.revision),
            ('P', "/w/d", t.revision),
            ('P', "/w/a", r_a2),
        ];
        ensure!(got == want, "got {got:?}\nwant {want:?}");
        ensure!(
            del_rev > r_b && del_rev < t.revision,
            "delete revision {del_rev}"
        );
        Ok(())
    };
    let mut events = Vec::new();
    for _ in 0..6 {
        events.push(next_event(&mut live).await?);
    }
    expect(&events)?;
    if let WatchEvent::Put(kv) = &events[5] {
        ensure!(
            kv.value == b"5" && kv.version == 1 && kv.create_revision == r_a2,
            "{kv:?}"
        );
    }
    // A watcher started afterwards from an old revision replays the same history...
    let mut late = s.watch_prefix("/w/", start + 1).await?;
    let mut replay = Vec::new();
    for _ in 0..6 {
        replay.push(next_event(&mut late).await?);
    }
    expect(&replay)?;
    // ...and one from the middle starts there.
    let mut mid = s.watch_prefix("/w/", t.revision).await?;
    let first_event = next_event(&mut mid).await?;
    let first = summary(&first_event)?;
    ensure!(first == ('P', "/w/c", t.revision), "{first:?}");
    // No further event is pending on the live watch.
    let extra = tokio::time::timeout(Duration::from_millis(200), live.recv()).await;
    ensure!(extra.is_err(), "unexpected extra event: {extra:?}");
    Ok(())
}

fn summary(e: &WatchEvent) -> Result<(char, &str, i64)> {
    Ok(match e {
        WatchEvent::Put(kv) => ('P', kv.key.as_str(), kv.mod_revision),
        WatchEvent::Delete(kv) => ('D', kv.key.as_str(), kv.mod_revision),
        WatchEvent::Lost(r) => bail!("watch lost: {r}"),
    })
}

async fn watch_that_falls_behind_reports_lost(h: Harness) -> Result<()> {
    let s = &h.store;
    let mut w = s.watch_prefix("/lag/", 0).await?;
    let total = WATCH_BUFFER + 300;
    for batch in 0..total.div_ceil(100) {
        let ops = (batch * 100..((batch + 1) * 100).min(total))
            .map(|i| TxnOp::put(format!("/lag/{i:05}"), vec![1]));
        s.txn(Txn::new().and_then(ops)).await?;
    }
    // The reader never read while the writes happened: it gets the buffered events, in order,
    // then Lost, then the end.
    let mut seen = 0usize;
    loop {
        match next_event(&mut w).await? {
            WatchEvent::Put(kv) => {
                ensure!(
                    kv.key == format!("/lag/{seen:05}"),
                    "event {seen} is {}",
                    kv.key
                );
                seen += 1;
            }
            WatchEvent::Lost(reason) => {
                ensure!(reason.contains("behind"), "{reason}");
                break;
            }
            other => bail!("unexpected {other:?}"),
        }
    }
    ensure!(seen == WATCH_BUFFER, "saw {seen} events before Lost");
    let end = tokio::time::timeout(Duration::from_secs(10), w.recv()).await?;
    ensure!(end.is_none(), "nothing may follow Lost: {end:?}");
    Ok(())
}

async fn lease_expiry_deletes_keys_and_notifies_watchers(h: Harness) -> Result<()> {
    let s = &h.store;
    let lease = s.grant_lease(Duration::from_secs(1)).await?;
    s.put("/l/a", b"a".to_vec(), Some(lease)).await?;
    s.put("/l/b", b"b".to_vec(), Some(lease)).await?;
    s.put("/l/keep", b"k".to_vec(), None).await?;
    ensure!(s.get("/l/a").await?.context("a")?.lease == Some(lease));
    let mut w = s.watch_prefix("/l/", 0).await?;
    wait_until(Duration::from_secs(20), || async {
        Ok(s.get("/l/a").await?.is_none())
    })
    .await?;
    let mut deleted = BTreeSet::new();
    let mut revs = BTreeSet::new();
    for _ in 0..2 {
        match next_event(&mut w).await? {
            WatchEvent::Delete(kv) => {
                revs.insert(kv.mod_revision);
                deleted.insert(kv.key);
            }
            other => bail!("expected a Delete, got {other:?}"),
        }
    }
    ensure!(deleted == BTreeSet::from(["/l/a".to_string(), "/l/b".to_string()]));
    ensure!(revs.len() == 1, "one expiry = one revision: {revs:?}");
    ensure!(s.get("/l/b").await?.is_none() && s.get("/l/keep").await?.is_some());
    ensure!(matches!(
        s.keep_alive(lease).await,
        Err(MetaError::LeaseNotFound(_))
    ));
    let put = s.put("/l/c", Vec::new(), Some(lease)).await;
    ensure!(matches!(put, Err(MetaError::LeaseNotFound(_))), "{put:?}");
    ensure!(s.get("/l/c").await?.is_none());
    Ok(())
}

async fn lease_keep_alive_and_revoke(h: Harness) -> Result<()> {
    let s = &h.store;
    let lease = s.grant_lease(Duration::from_secs(2)).await?;
    s.put("/ka/k", b"x".to_vec(), Some(lease)).await?;
    // Renewed every 500 ms, the key outlives its 2 s TTL twice over.
    let until = std::time::Instant::now() + Duration::from_secs(4);
    while std::time::Instant::now() < until {
        s.keep_alive(lease).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    ensure!(
        s.get("/ka/k").await?.is_some(),
        "a kept-alive lease must not expire"
    );
    let mut w = s.watch_prefix("/ka/", 0).await?;
    s.revoke_lease(lease).await?;
    ensure!(
        s.get("/ka/k").await?.is_none(),
        "revoke deletes the keys at once"
    );
    match next_event(&mut w).await? {
        WatchEvent::Delete(kv) => ensure!(kv.key == "/ka/k"),
        other => bail!("expected a Delete, got {other:?}"),
    }
    s.revoke_lease(lease)
        .await
        .context("revoking twice is fine")?;
    Ok(())
}

/// Cluster maps of big clusters are single values of a few MiB.
async fn large_values_round_trip(h: Harness) -> Result<()> {
    let s = &h.store;
    let big: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    let mut w = s.watch_prefix("/big/", 0).await?;
    s.put("/big/v", big.clone(), None).await?;
    ensure!(s.get("/big/v").await?.context("big")?.value == big);
    ensure!(s.list("/big/").await?.kvs[0].value == big);
    match next_event(&mut w).await? {
        WatchEvent::Put(kv) => ensure!(kv.value == big),
        other => bail!("expected the Put, got {other:?}"),
    }
    Ok(())
}
