//! Memory of an open store: what it costs per slot of capacity (allocated at open, whatever is
//! stored) and per stored object, measured as the process's resident memory.
//!
//! cargo run --release -p basalt-engine --example engine_memory -- --path /tmp/mem.img --size 32GiB --objects 200000
//!
//! The file is sparse: format writes only the journal and the tables; each object gets one
//! 4 KiB block (so it takes a slot and a full slot-table entry, as any object does), then the
//! store is closed (everything written back) and reopened, so the figures are the steady state
//! after recovery rather than a write-heavy moment.

use anyhow::{Context, Result};
use basalt_engine::{
    DeviceId, FormatOptions, ObjectId, OpenOptions, PoolId, Store, VolumeId, WriteOptions,
};
use bytes::Bytes;
use clap::Parser;
use std::path::PathBuf;

#[derive(Parser, Debug)]
struct Args {
    #[arg(long)]
    path: PathBuf,
    /// Size of the (sparse) device file, bytes with an optional KiB/MiB/GiB suffix.
    #[arg(long, default_value = "32GiB")]
    size: String,
    /// Objects to write.
    #[arg(long, default_value_t = 200_000)]
    objects: u64,
    /// Of those, how many to delete afterwards (they become tombstones).
    #[arg(long, default_value_t = 0)]
    delete: u64,
    /// PGs the objects are spread over.
    #[arg(long, default_value_t = 128)]
    pgs: u32,
    /// (internal) Only open the store left by the fill and measure, in this fresh process.
    #[arg(long, hide = true)]
    measure: bool,
}

fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn parse_size(s: &str) -> Result<u64> {
    let (num, mul) = match s {
        _ if s.ends_with("GiB") => (&s[..s.len() - 3], 1u64 << 30),
        _ if s.ends_with("MiB") => (&s[..s.len() - 3], 1 << 20),
        _ if s.ends_with("KiB") => (&s[..s.len() - 3], 1 << 10),
        _ => (s, 1),
    };
    Ok(num.trim().parse::<u64>().context("size")? * mul)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.measure {
        return measure(&args).await;
    }
    let size = parse_size(&args.size)?;
    let _ = std::fs::remove_file(&args.path);
    let fmt = FormatOptions {
        device_id: DeviceId(1),
        size: Some(size),
        ..FormatOptions::default()
    };
    basalt_engine::format(&args.path, &fmt)?;
    // The empty store, measured in a fresh process (so nothing left by others counts).
    let status = std::process::Command::new(std::env::current_exe()?)
        .args(["--measure", "--path"])
        .arg(&args.path)
        .args(["--objects", "0"])
        .status()?;
    anyhow::ensure!(status.success(), "measuring the empty store failed");
    let store = Store::open(&args.path, &OpenOptions::default())?;
    let oid = |i: u64| ObjectId::new(PoolId(1), VolumeId(1 + i % 7), i);
    let slots = store.info().capacity_bytes / u64::from(store.info().object_size);
    anyhow::ensure!(
        args.objects <= slots,
        "{} objects do not fit in {slots} slots",
        args.objects
    );
    let block = Bytes::from(vec![0x5au8; 4096]);
    for chunk in (0..args.objects).collect::<Vec<_>>().chunks(512) {
        let writes = chunk.iter().map(|&i| {
            let opts = WriteOptions::buffered().in_pg((i % u64::from(args.pgs)) as u32);
            store.write(oid(i), 0, block.clone(), opts)
        });
        for r in futures::future::join_all(writes).await {
            r?;
        }
    }
    for chunk in (0..args.delete).collect::<Vec<_>>().chunks(512) {
        let deletes = chunk.iter().map(|&i| {
            let opts = WriteOptions::buffered().in_pg((i % u64::from(args.pgs)) as u32);
            store.delete(oid(i), opts)
        });
        for r in futures::future::join_all(deletes).await {
            r?;
        }
    }
    store.close().await?;
    drop(store);
    let status = std::process::Command::new(std::env::current_exe()?)
        .args(["--measure", "--path"])
        .arg(&args.path)
        .args(["--objects", &args.objects.to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "measuring the filled store failed");
    std::fs::remove_file(&args.path)?;
    Ok(())
}

/// Opens the store (recovery rebuilds the whole index) and reports resident memory. The slot
/// table's arrays are touched in full so that pages the kernel has not faulted in yet count.
async fn measure(args: &Args) -> Result<()> {
    let base = rss();
    let store = Store::open(&args.path, &OpenOptions::default())?;
    let info = store.info().clone();
    let slots = info.capacity_bytes / u64::from(info.object_size);
    let opened = rss();
    let st = store.stats();
    let per_slot = opened.saturating_sub(base) as f64 / slots as f64;
    let per_object = if args.objects > 0 {
        opened.saturating_sub(base) as f64 / args.objects as f64
    } else {
        0.0
    };
    let tb_slots = (1u64 << 40) as f64 / f64::from(info.object_size);
    println!(
        "device {} GiB, object size {} KiB, {} slots; {} objects, {} tombstones; resident after open {} MiB (before {} MiB)",
        info.device_size >> 30,
        info.object_size >> 10,
        slots,
        st.objects,
        st.tombstones,
        opened >> 20,
        base >> 20,
    );
    if args.objects == 0 {
        println!("  empty store: {per_slot:.1} bytes per slot of capacity");
    } else {
        println!(
            "  {per_object:.1} bytes per stored object (all costs); a full TiB of {} KiB objects: {:.2} GiB",
            info.object_size >> 10,
            per_object * tb_slots / f64::from(1u32 << 30)
        );
    }
    store.close().await?;
    Ok(())
}
