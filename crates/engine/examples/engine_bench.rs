//! Engine micro-benchmark: IOPS and latency of the store itself (no network), to compare with
//! `fio` on the same file.
//!
//! cargo run --release -p basalt-engine --example engine_bench -- --path /tmp/bench.img --size 2GiB

use anyhow::{Context, Result};
use basalt_engine::{
    DeviceId, FormatOptions, IoMode, ObjectId, OpenOptions, PoolId, Store, VolumeId, WriteOptions,
};
use bytes::Bytes;
use clap::Parser;
use hdrhistogram::Histogram;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// File (or block device) to format and use.
    #[arg(long)]
    path: PathBuf,
    /// Size of the file to create.
    #[arg(long, default_value = "2GiB")]
    size: String,
    #[arg(long, default_value = "128KiB")]
    object_size: String,
    /// auto, uring or psync.
    #[arg(long, default_value = "auto")]
    io: String,
    /// Seconds per workload.
    #[arg(long, default_value_t = 8)]
    runtime: u64,
    /// Only these workloads (comma separated): randread, randwrite, seqread, seqwrite, qd1read, qd1write.
    #[arg(long)]
    only: Option<String>,
}

struct Result1 {
    ops: u64,
    secs: f64,
    hist: Histogram<u64>,
}

fn oid(i: u64) -> ObjectId {
    ObjectId::new(PoolId(1), VolumeId(1), i)
}

/// Runs `qd` workers, each calling `op(worker, n)` until `runtime` has passed.
async fn run<F, Fut>(qd: u64, runtime: Duration, op: F) -> Result1
where
    F: Fn(u64, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let start = Instant::now();
    let deadline = start + runtime;
    let tasks: Vec<_> = (0..qd)
        .map(|w| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut h = Histogram::<u64>::new(3).unwrap();
                let mut n = 0;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    op(w, n).await;
                    h.record(t.elapsed().as_nanos() as u64).unwrap();
                    n += 1;
                }
                h
            })
        })
        .collect();
    let mut hist = Histogram::<u64>::new(3).unwrap();
    for t in tasks {
        hist.add(t.await.unwrap()).unwrap();
    }
    Result1 {
        ops: hist.len(),
        secs: start.elapsed().as_secs_f64(),
        hist,
    }
}

fn print(name: &str, bs: u64, r: &Result1) {
    let iops = r.ops as f64 / r.secs;
    println!(
        "{name:<28} {:>9.0} IOPS {:>8.1} MiB/s   lat avg {:>7.1} us  p50 {:>7.1} us  p99 {:>8.1} us",
        iops,
        iops * bs as f64 / (1 << 20) as f64,
        r.hist.mean() / 1000.0,
        r.hist.value_at_quantile(0.5) as f64 / 1000.0,
        r.hist.value_at_quantile(0.99) as f64 / 1000.0
    );
}

fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let size = basalt_types::size::parse_size(&args.size)?;
    let object_size = basalt_types::size::parse_size(&args.object_size)? as u32;
    let io = match args.io.as_str() {
        "uring" => IoMode::Uring,
        "psync" => IoMode::Psync,
        _ => IoMode::Auto,
    };
    let fmt = FormatOptions {
        device_id: DeviceId(1),
        object_size,
        size: Some(size),
        journal_size: None,
        force: true,
    };
    basalt_engine::format(&args.path, &fmt).context("format")?;
    let store = Store::open(
        &args.path,
        &OpenOptions {
            io,
            ..OpenOptions::default()
        },
    )
    .context("open")?;
    let info = store.info().clone();
    // Use 90% of the capacity: whole-object overwrites are redirected into free slots, and a
    // device that is completely full falls back to journaling them (written twice).
    let objects = info.capacity_bytes / u64::from(object_size) * 9 / 10;
    let blocks = u64::from(object_size / 4096);
    println!(
        "store: {} backend, direct={}, {} objects of {} KiB, journal {} MiB",
        info.io_backend,
        info.direct_io,
        objects,
        object_size / 1024,
        info.journal_size >> 20
    );
    let want = |w: &str| {
        args.only
            .as_deref()
            .is_none_or(|o| o.split(',').any(|x| x == w))
    };
    let rt = Duration::from_secs(args.runtime);
    let full = Bytes::from(vec![0x5au8; object_size as usize]);
    let block = Bytes::from(vec![0xa5u8; 4096]);

    // Fill every object once (whole-object writes) so that reads hit data.
    let t = Instant::now();
    let fillers: Vec<_> = (0..16u64)
        .map(|w| {
            let (s, f) = (store.clone(), full.clone());
            tokio::spawn(async move {
                let mut i = w;
                while i < objects {
                    s.write(oid(i), 0, f.clone(), WriteOptions::buffered())
                        .await
                        .unwrap();
                    i += 16;
                }
            })
        })
        .collect();
    for f in fillers {
        f.await?;
    }
    store.flush().await?;
    println!(
        "fill: {} objects in {:.1} s",
        objects,
        t.elapsed().as_secs_f64()
    );

    if want("randread") {
        let s = store.clone();
        let r = run(64, rt, move |w, n| {
            let s = s.clone();
            async move {
                let x = xorshift((w << 40) ^ n ^ 0x9e3779b97f4a7c15);
                s.read(oid(x % objects), ((x >> 32) % blocks * 4096) as u32, 4096)
                    .await
                    .unwrap();
            }
        })
        .await;
        print("4K randread QD64", 4096, &r);
    }
    if want("randwrite") {
        let (s, b) = (store.clone(), block.clone());
        let r = run(64, rt, move |w, n| {
            let (s, b) = (s.clone(), b.clone());
            async move {
                let x = xorshift((w << 40) ^ n ^ 0x51ed270b);
                s.write(
                    oid(x % objects),
                    ((x >> 32) % blocks * 4096) as u32,
                    b,
                    WriteOptions::durable(),
                )
                .await
                .unwrap();
            }
        })
        .await;
        print("4K randwrite QD64 durable", 4096, &r);
        let st = store.stats();
        println!(
            "    (flushes so far {}, write-back batches {})",
            st.flushes, st.writeback_batches
        );
    }
    if want("seqread") {
        let s = store.clone();
        let r = run(16, rt, move |w, n| {
            let s = s.clone();
            async move {
                s.read(oid((n * 16 + w) % objects), 0, object_size)
                    .await
                    .unwrap();
            }
        })
        .await;
        print("128K seqread QD16", u64::from(object_size), &r);
    }
    if want("seqwrite") {
        let (s, f) = (store.clone(), full.clone());
        let mut r = run(16, rt, move |w, n| {
            let (s, f) = (s.clone(), f.clone());
            async move {
                s.write(oid((n * 16 + w) % objects), 0, f, WriteOptions::buffered())
                    .await
                    .unwrap();
            }
        })
        .await;
        let t = Instant::now();
        store.flush().await?;
        r.secs += t.elapsed().as_secs_f64();
        print("128K seqwrite QD16 (+flush)", u64::from(object_size), &r);
    }
    if want("qd1read") {
        let s = store.clone();
        let r = run(1, rt, move |_, n| {
            let s = s.clone();
            async move {
                let x = xorshift(n ^ 0x1234_5678);
                s.read(oid(x % objects), ((x >> 32) % blocks * 4096) as u32, 4096)
                    .await
                    .unwrap();
            }
        })
        .await;
        print("4K randread QD1", 4096, &r);
    }
    if want("qd1write") {
        let (s, b) = (store.clone(), block.clone());
        let r = run(1, rt, move |_, n| {
            let (s, b) = (s.clone(), b.clone());
            async move {
                let x = xorshift(n ^ 0x8765_4321);
                s.write(
                    oid(x % objects),
                    ((x >> 32) % blocks * 4096) as u32,
                    b,
                    WriteOptions::durable(),
                )
                .await
                .unwrap();
            }
        })
        .await;
        print("4K randwrite QD1 durable", 4096, &r);
    }
    let st = store.stats();
    println!(
        "device: {} flushes, {} write-back batches, {:.2} device bytes per client byte written",
        st.flushes,
        st.writeback_batches,
        st.device_bytes_written as f64 / st.bytes_written.max(1) as f64
    );
    store.close().await?;
    Ok(())
}
