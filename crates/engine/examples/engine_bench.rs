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
    /// Only these workloads (comma separated): randread, randwrite, seqread, seqwrite,
    /// seqwrite-durable, qd1read, qd1write.
    #[arg(long)]
    only: Option<String>,
    /// Journal size (default: the store's default for the device size).
    #[arg(long)]
    journal: Option<String>,
    /// Skip format and fill: reuse a store left by an earlier run with --keep.
    #[arg(long)]
    reuse: bool,
}

struct Result1 {
    ops: u64,
    secs: f64,
    hist: Histogram<u64>,
}

/// CPU time (ns) of the whole process and of the store's I/O thread, and the store counters,
/// at one instant; the difference of two samples describes one workload.
struct Sample {
    proc_ns: u64,
    io_ns: u64,
    stats: basalt_engine::StoreStats,
}

fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Run time (ns) of the thread named `basalt-io-*`, from /proc/self/task/*/schedstat.
fn io_thread_cpu_ns() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    for t in dir.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.starts_with("basalt-io") {
            let st = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
            return st
                .split_whitespace()
                .next()
                .and_then(|x| x.parse().ok())
                .unwrap_or(0);
        }
    }
    0
}

fn sample(store: &Store) -> Sample {
    Sample {
        proc_ns: process_cpu_ns(),
        io_ns: io_thread_cpu_ns(),
        stats: store.stats(),
    }
}

/// Waits until write-back has emptied the journal (at most 60 s); returns how long it took.
async fn drain(store: &Store) -> f64 {
    let t = Instant::now();
    while store.stats().journal_used > 0 && t.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    t.elapsed().as_secs_f64()
}

/// Prints CPU per op, flushes per op and write amplification between two samples.
fn print_costs(ops: u64, a: &Sample, b: &Sample, drain_secs: Option<f64>) {
    let ops = ops.max(1) as f64;
    let user = b.stats.bytes_written - a.stats.bytes_written;
    let dev = b.stats.device_bytes_written - a.stats.device_bytes_written;
    let mut line = format!(
        "    cpu/op: process {:.1} us, io thread {:.1} us; flushes/op {:.3}; write-back batches {}",
        (b.proc_ns - a.proc_ns) as f64 / ops / 1000.0,
        (b.io_ns - a.io_ns) as f64 / ops / 1000.0,
        (b.stats.flushes - a.stats.flushes) as f64 / ops,
        b.stats.writeback_batches - a.stats.writeback_batches,
    );
    if user > 0 {
        line += &format!(
            "; write amp {:.2} (device {} MiB / user {} MiB)",
            dev as f64 / user as f64,
            dev >> 20,
            user >> 20
        );
    }
    if let Some(d) = drain_secs {
        line += &format!("; drain {d:.2} s");
    }
    println!("{line}");
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
    let us = |q: f64| r.hist.value_at_quantile(q) as f64 / 1000.0;
    let over_10ms = r.hist.count_between(10_000_000, u64::MAX);
    println!(
        "{name:<28} {:>9.0} IOPS {:>8.1} MiB/s  lat avg {:>7.1} p50 {:>7.1} p99 {:>8.1} p99.9 {:>8.1} max {:>8.1} us; >10ms {}",
        iops,
        iops * bs as f64 / (1 << 20) as f64,
        r.hist.mean() / 1000.0,
        us(0.5),
        us(0.99),
        us(0.999),
        r.hist.max() as f64 / 1000.0,
        over_10ms
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
    if !args.reuse {
        let fmt = FormatOptions {
            device_id: DeviceId(1),
            object_size,
            size: Some(size),
            journal_size: args
                .journal
                .as_deref()
                .map(basalt_types::size::parse_size)
                .transpose()?,
            force: true,
            ..FormatOptions::default()
        };
        basalt_engine::format(&args.path, &fmt).context("format")?;
    }
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

    if !args.reuse {
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
        drain(&store).await;
        println!(
            "fill: {} objects in {:.1} s",
            objects,
            t.elapsed().as_secs_f64()
        );
    }

    if want("randread") {
        let s = store.clone();
        let a = sample(&store);
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
        print_costs(r.ops, &a, &sample(&store), None);
    }
    if want("randwrite") {
        let (s, b) = (store.clone(), block.clone());
        let a = sample(&store);
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
        let mid = sample(&store);
        print_costs(r.ops, &a, &mid, None);
        let d = drain(&store).await;
        print_costs(r.ops, &a, &sample(&store), Some(d));
    }
    if want("seqread") {
        let s = store.clone();
        let a = sample(&store);
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
        print_costs(r.ops, &a, &sample(&store), None);
    }
    for (name, durable) in [("seqwrite", false), ("seqwrite-durable", true)] {
        if !want(name) {
            continue;
        }
        let (s, f) = (store.clone(), full.clone());
        let a = sample(&store);
        let mut r = run(16, rt, move |w, n| {
            let (s, f) = (s.clone(), f.clone());
            let opts = if durable {
                WriteOptions::durable()
            } else {
                WriteOptions::buffered()
            };
            async move {
                s.write(oid((n * 16 + w) % objects), 0, f, opts)
                    .await
                    .unwrap();
            }
        })
        .await;
        let t = Instant::now();
        store.flush().await?;
        r.secs += t.elapsed().as_secs_f64();
        let label = if durable {
            "128K seqwrite QD16 durable"
        } else {
            "128K seqwrite QD16 (+flush)"
        };
        print(label, u64::from(object_size), &r);
        let d = drain(&store).await;
        print_costs(r.ops, &a, &sample(&store), Some(d));
    }
    if want("qd1read") {
        let s = store.clone();
        let a = sample(&store);
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
        print_costs(r.ops, &a, &sample(&store), None);
    }
    if want("qd1write") {
        let (s, b) = (store.clone(), block.clone());
        let a = sample(&store);
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
        let d = drain(&store).await;
        print_costs(r.ops, &a, &sample(&store), Some(d));
    }
    store.close().await?;
    Ok(())
}
