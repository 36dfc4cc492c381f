//! The proxy types survive JSON and reproduce the store's answers and errors.

use anyhow::{Result, ensure};
use basalt_meta::remote::{MetaAnswer, MetaCall, serve};
use basalt_meta::{Compare, EmbeddedStore, LeaseId, MetaError, Txn, TxnOp};

/// Sends `call` through JSON both ways, as the node's frames carry it.
async fn round_trip(
    store: &EmbeddedStore,
    call: MetaCall,
) -> Result<Result<MetaAnswer, MetaError>> {
    let call: MetaCall = serde_json::from_slice(&serde_json::to_vec(&call)?)?;
    let answer = serve(store, call).await;
    let answer: MetaAnswer = serde_json::from_slice(&serde_json::to_vec(&answer)?)?;
    Ok(answer.into_result())
}

#[tokio::test]
async fn calls_and_errors_cross_json() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let store = EmbeddedStore::open(dir.path().join("m.redb")).await?;
    let put = MetaCall::Put {
        key: "/a".into(),
        value: vec![0, 255, 7],
        lease: None,
    };
    let Ok(MetaAnswer::Revision(rev)) = round_trip(&store, put).await? else {
        anyhow::bail!("put failed");
    };
    let got = round_trip(&store, MetaCall::Get { key: "/a".into() }).await??;
    let MetaAnswer::Value(Some(kv)) = got else {
        anyhow::bail!("get: {got:?}")
    };
    ensure!(kv.value == [0, 255, 7] && kv.mod_revision == rev);
    let txn = Txn::new()
        .when([Compare::mod_revision_is("/a", rev)])
        .and_then([TxnOp::put("/b", b"x".to_vec())]);
    let r = round_trip(&store, MetaCall::Txn { txn }).await??;
    ensure!(matches!(r, MetaAnswer::Txn(t) if t.succeeded && t.revision == rev + 1));
    let r = round_trip(&store, MetaCall::KeepAlive { lease: LeaseId(42) }).await?;
    ensure!(
        matches!(r, Err(MetaError::LeaseNotFound(LeaseId(42)))),
        "{r:?}"
    );
    let dup = Txn::new().and_then([TxnOp::put("/c", vec![]), TxnOp::put("/c", vec![])]);
    let r = round_trip(&store, MetaCall::Txn { txn: dup }).await?;
    ensure!(matches!(r, Err(MetaError::InvalidTxn(_))), "{r:?}");
    let r = round_trip(&store, MetaCall::GrantLease { ttl_ms: 1500 }).await??;
    ensure!(matches!(r, MetaAnswer::Lease(_)));
    let listing = round_trip(&store, MetaCall::List { prefix: "/".into() }).await??;
    ensure!(matches!(listing, MetaAnswer::Listing(l) if l.kvs.len() == 2 && l.revision == rev + 1));
    Ok(())
}
