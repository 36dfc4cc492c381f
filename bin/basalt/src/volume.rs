//! `basalt volume create|list|info|resize|delete`.

use crate::connect::Common;
use crate::output;
use basalt_client::meta::VolumeRecord;
use basalt_types::size::{format_size, format_size_approx, parse_size};
use clap::Subcommand;
use serde::Serialize;

#[derive(Subcommand)]
pub enum VolumeCommand {
    /// Create a volume.
    Create {
        /// Volume name: 1-64 characters of letters, digits, '.', '_' and '-'.
        name: String,
        /// Size, e.g. 8GiB, 512MiB, 10GB (a multiple of 4 KiB).
        #[arg(long, value_parser = parse_size)]
        size: u64,
        /// Pool to create it in.
        #[arg(long, default_value = "default")]
        pool: String,
        #[command(flatten)]
        common: Common,
    },
    /// List volumes.
    List {
        #[command(flatten)]
        common: Common,
    },
    /// Show one volume.
    Info {
        name: String,
        #[command(flatten)]
        common: Common,
    },
    /// Change a volume's size.
    Resize {
        name: String,
        /// New size, e.g. 16GiB.
        #[arg(long, value_parser = parse_size)]
        size: u64,
        /// Allow a smaller size; the data past the new end is discarded.
        #[arg(long)]
        allow_shrink: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Delete a volume and its data.
    Delete {
        name: String,
        #[command(flatten)]
        common: Common,
    },
}

/// A volume as printed.
#[derive(Serialize)]
struct VolumeView {
    name: String,
    id: u64,
    pool: String,
    size: u64,
    size_human: String,
    created_at: String,
    state: String,
}

pub async fn run(cmd: VolumeCommand) -> anyhow::Result<()> {
    match cmd {
        VolumeCommand::Create {
            name,
            size,
            pool,
            common,
        } => {
            let cluster = common.cluster.connect().await?;
            let rec = cluster.create_volume(&name, size, &pool).await?;
            show_one(&cluster, rec, common.json, "created").await
        }
        VolumeCommand::List { common } => {
            let cluster = common.cluster.connect().await?;
            let pools = pool_names(&cluster).await?;
            let views: Vec<VolumeView> = cluster
                .list_volumes()
                .await?
                .into_iter()
                .map(|r| view(r, &pools))
                .collect();
            if common.json {
                return output::json(&views);
            }
            let mut t = output::table(&["NAME", "SIZE", "POOL", "CREATED", "STATE"]);
            for v in &views {
                t.add_row([&v.name, &v.size_human, &v.pool, &v.created_at, &v.state]);
            }
            println!("{t}");
            Ok(())
        }
        VolumeCommand::Info { name, common } => {
            let cluster = common.cluster.connect().await?;
            let rec = cluster.volume_info(&name).await?;
            show_one(&cluster, rec, common.json, "").await
        }
        VolumeCommand::Resize {
            name,
            size,
            allow_shrink,
            common,
        } => {
            let cluster = common.cluster.connect().await?;
            let rec = cluster.resize_volume(&name, size, allow_shrink).await?;
            show_one(&cluster, rec, common.json, "resized").await
        }
        VolumeCommand::Delete { name, common } => {
            let cluster = common.cluster.connect().await?;
            let objects = cluster.delete_volume(&name).await?;
            if common.json {
                return output::json(&serde_json::json!({"deleted": name, "objects": objects}));
            }
            println!("deleted volume {name} ({objects} objects removed)");
            Ok(())
        }
    }
}

async fn pool_names(
    cluster: &basalt_client::Cluster,
) -> anyhow::Result<std::collections::HashMap<basalt_types::PoolId, String>> {
    Ok(cluster
        .list_pools()
        .await?
        .into_iter()
        .map(|p| (p.id, p.name))
        .collect())
}

fn view(
    r: VolumeRecord,
    pools: &std::collections::HashMap<basalt_types::PoolId, String>,
) -> VolumeView {
    VolumeView {
        pool: pools
            .get(&r.pool)
            .cloned()
            .unwrap_or_else(|| r.pool.to_string()),
        id: r.id.0,
        size_human: if r.size.is_multiple_of(1024) {
            format_size(r.size)
        } else {
            format_size_approx(r.size)
        },
        size: r.size,
        created_at: output::utc(r.created_at),
        state: format!("{:?}", r.state).to_lowercase(),
        name: r.name,
    }
}

async fn show_one(
    cluster: &basalt_client::Cluster,
    rec: VolumeRecord,
    json: bool,
    verb: &str,
) -> anyhow::Result<()> {
    let pools = pool_names(cluster).await?;
    let v = view(rec, &pools);
    if json {
        return output::json(&v);
    }
    if !verb.is_empty() {
        println!("{verb} volume {}", v.name);
    }
    let mut t = output::table(&["FIELD", "VALUE"]);
    for (k, val) in [
        ("name", v.name.clone()),
        ("id", v.id.to_string()),
        ("pool", v.pool.clone()),
        ("size", format!("{} ({} bytes)", v.size_human, v.size)),
        ("created", v.created_at.clone()),
        ("state", v.state.clone()),
    ] {
        t.add_row([k.to_string(), val]);
    }
    println!("{t}");
    Ok(())
}
