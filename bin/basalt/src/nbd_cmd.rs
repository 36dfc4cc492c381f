//! `basalt nbd`: an NBD gateway serving every volume of a cluster.

use crate::connect::ClusterArgs;
use anyhow::Context;
use basalt_client::{Durability, VolumeOptions};
use basalt_nbd::{CancellationToken, ClusterCatalog, NbdServer, ServerConfig};
use clap::Args;
use std::net::SocketAddr;
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct NbdArgs {
    /// NBD listen address.
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub listen: SocketAddr,
    /// When an acknowledged write is durable: `sync` (on ack) or `flush` (at FLUSH/FUA).
    #[arg(long, default_value = "sync")]
    pub durability: Durability,
    /// Volume served to clients asking for the empty export name.
    #[arg(long)]
    pub default_export: Option<String>,
    /// How long one I/O may wait (node restarts, map changes, a placement group whose devices
    /// are all down) before it fails with EIO, e.g. 30s.
    #[arg(long, value_parser = crate::duration::parse_duration, default_value = "30s")]
    pub io_timeout: std::time::Duration,
    /// Threads of the gateway: 1 (the default) serves every connection on one thread, a
    /// request crossing no thread switch; 0 a thread per core; N that many.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(0..=256))]
    pub threads: u16,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

pub async fn run(args: NbdArgs) -> anyhow::Result<()> {
    let cluster = args.cluster.connect_with_timeout(args.io_timeout).await?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let catalog = ClusterCatalog::new(
        cluster,
        VolumeOptions {
            durability: args.durability,
        },
        args.default_export,
    );
    let server = NbdServer::new(Arc::new(catalog), ServerConfig::default());
    println!("serving volumes over NBD on {addr} (nbd://{addr}/<volume>)");
    let stop = CancellationToken::new();
    let task = {
        let stop = stop.clone();
        tokio::spawn(async move { server.serve(listener, stop.cancelled_owned()).await })
    };
    crate::up::wait_for_signal().await;
    stop.cancel();
    task.await??;
    Ok(())
}
