//! Latency of basic metadata operations on both backends (sequential, one client).
//!
//! `cargo run --release -p basalt-meta --example meta_latency`
//! (starts its own etcd; the embedded store lives in a temporary directory).

use basalt_meta::{
    Catalog, Compare, EmbeddedStore, EtcdProcess, EtcdStore, MetaStore, PoolSpec, Txn, TxnOp,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

const N: u32 = 300;

async fn measure(name: &str, store: Arc<dyn MetaStore>) -> anyhow::Result<()> {
    let per_op = |t: Duration| t / N;
    let t = Instant::now();
    for i in 0..N {
        store
            .put(&format!("/bench/{i}"), vec![0; 200], None)
            .await?;
    }
    let put = per_op(t.elapsed());
    let t = Instant::now();
    for i in 0..N {
        store.get(&format!("/bench/{i}")).await?;
    }
    let get = per_op(t.elapsed());
    let t = Instant::now();
    for i in 0..N {
        let txn = Txn::new()
            .when([Compare::missing(format!("/bench/cas/{i}"))])
            .and_then([TxnOp::put(format!("/bench/cas/{i}"), vec![1])]);
        store.txn(txn).await?;
    }
    let cas = per_op(t.elapsed());
    let catalog = Catalog::new(store.clone());
    catalog.create_pool(&PoolSpec::new("bench")).await?;
    let t = Instant::now();
    for i in 0..N {
        catalog
            .create_volume(&format!("v{i}"), 1 << 30, "bench")
            .await?;
    }
    let create = per_op(t.elapsed());
    println!(
        "{name:9} | put {put:>10.1?} | get {get:>10.1?} | cas txn {cas:>10.1?} | create_volume {create:>10.1?}"
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    println!("mean latency per operation, {N} sequential operations each");
    let dir = tempfile::tempdir()?;
    let embedded = EmbeddedStore::open(dir.path().join("meta.redb")).await?;
    measure("embedded", Arc::new(embedded)).await?;
    let etcd = EtcdProcess::start().await?;
    let store = EtcdStore::connect(&[etcd.endpoint()], "").await?;
    measure("etcd", Arc::new(store)).await?;
    Ok(())
}
