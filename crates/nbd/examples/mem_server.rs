//! An NBD server of one RAM-backed export, for benchmarks and manual tests.
//!
//! ```text
//! cargo run --release -p basalt-nbd --example mem_server -- \
//!     [--port 10809] [--size 1073741824] [--name mem] [--workers 2] [--dispatch inline|spawn]
//! ```
//! Serves until SIGINT/SIGTERM, then prints the operations served and the process's CPU time
//! (user + system, from getrusage) per operation.

use anyhow::{Context, bail};
use basalt_nbd::{Dispatch, MemCatalog, MemExport, ServerConfig, serve};
use std::sync::Arc;

struct Args {
    port: u16,
    size: u64,
    name: String,
    workers: usize,
    dispatch: Dispatch,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        port: 10809,
        size: 1 << 30,
        name: "mem".into(),
        workers: 2,
        dispatch: Dispatch::Inline,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--port" => args.port = value.parse()?,
            "--size" => args.size = value.parse()?,
            "--name" => args.name = value,
            "--workers" => args.workers = value.parse()?,
            "--dispatch" => {
                args.dispatch = match value.as_str() {
                    "inline" => Dispatch::Inline,
                    "spawn" => Dispatch::Spawn,
                    other => bail!("--dispatch is inline or spawn, not {other:?}"),
                }
            }
            other => bail!("unknown flag {other}; see the example's doc comment"),
        }
    }
    Ok(args)
}

/// User + system CPU seconds of this process.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.workers)
        .enable_all()
        .build()?;
    let catalog = MemCatalog::new().with_default(args.name.clone());
    let export = catalog.add(args.name.clone(), MemExport::new(args.size));
    let config = ServerConfig {
        dispatch: args.dispatch,
        ..ServerConfig::default()
    };
    let cpu_start = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await?;
        println!(
            "listening on nbd://{}/{}",
            listener.local_addr()?,
            args.name
        );
        let cpu_start = cpu_seconds();
        let stop = async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        };
        serve(listener, Arc::new(catalog), config, stop).await?;
        anyhow::Ok(cpu_start)
    })?;
    let cpu = cpu_seconds() - cpu_start;
    let st = export.stats();
    let ops = st.reads + st.writes + st.flushes + st.trims + st.write_zeroes;
    println!(
        "ops {ops} (reads {}, writes {}), cpu {cpu:.3} s, {:.2} us/op",
        st.reads,
        st.writes,
        if ops > 0 { cpu * 1e6 / ops as f64 } else { 0.0 }
    );
    Ok(())
}
