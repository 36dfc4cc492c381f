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
    let size = parse_size(&args.size)?;
    let _ = std::fs::remove_file(&args.path);
    let fmt = FormatOptions {
        device_id: DeviceId(1),
        size: Some(size),
        ..FormatOptions::default()
    };
    let info = basalt_engine::format(&args.path, &fmt)?;
    let slots = info.capacity_bytes / u64::from(info.object_size);
    let base = rss();
    let store = Store::open(&args.path, &OpenOptions::default())?;
    let empty = rss();
    let oid = |i: u64| ObjectId::new(PoolId(1), VolumeId(1 + i % 7), i);
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
    let store = Store::open(&args.path, &OpenOptions::default())?;
    let full = rss();
    let st = store.stats();
    let per_slot = (empty - base) as f64 / slots as f64;
    let per_object = (full.saturating_sub(empty)) as f64 / args.objects as f64;
    let tb_slots = (1u64 << 40) as f64 / f64::from(info.object_size);
    println!(
        "device {} GiB, object size {} KiB, {} slots; {} objects, {} tombstones",
        size >> 30,
        info.object_size >> 10,
        slots,
        st.objects,
        st.tombstones
    );
    println!(
        "resident: before open {} MiB, open and empty {} MiB, with the objects {} MiB",
        base >> 20,
        empty >> 20,
        full >> 20
    );
    println!("per slot of capacity (paid at open): {per_slot:.1} bytes");
    println!("per stored object (index, PG index and log): {per_object:.1} bytes");
    println!(
        "per TiB of {} KiB objects, full: {:.2} GiB",
        info.object_size >> 10,
        (per_slot + per_object) * tb_slots / f64::from(1u32 << 30)
    );
    store.close().await?;
    std::fs::remove_file(&args.path)?;
    Ok(())
}
