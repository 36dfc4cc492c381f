//! `basalt pool create|list`.

use crate::connect::Common;
use crate::output;
use basalt_meta::{Catalog, FailureDomain, PoolSpec};
use basalt_types::size::{format_size, parse_size};
use clap::{Subcommand, ValueEnum};

#[derive(Subcommand)]
pub enum PoolCommand {
    /// Create a pool.
    Create {
        /// Pool name.
        name: String,
        /// Copies of every object. This version stores one copy (replication comes with
        /// multi-node clusters); larger values are refused.
        #[arg(long, default_value_t = 1)]
        replicas: u8,
        /// Placement groups.
        #[arg(long, default_value_t = 64)]
        pg_count: u32,
        /// Object size: a power of two from 4KiB to 4MiB; must match the devices' format.
        #[arg(long, value_parser = parse_size, default_value = "128KiB")]
        object_size: u64,
        /// What copies must not share.
        #[arg(long, value_enum, default_value = "host")]
        failure_domain: Domain,
        /// Only devices of this class hold the pool's data.
        #[arg(long)]
        device_class: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// List pools.
    List {
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Domain {
    Host,
    Device,
}

pub async fn run(cmd: PoolCommand) -> anyhow::Result<()> {
    match cmd {
        PoolCommand::Create {
            name,
            replicas,
            pg_count,
            object_size,
            failure_domain,
            device_class,
            common,
        } => {
            if replicas != 1 {
                anyhow::bail!(
                    "--replicas {replicas}: this version stores one copy per object; \
                     replicated pools arrive with multi-node replication"
                );
            }
            let catalog = Catalog::new(common.cluster.meta().await?);
            let spec = PoolSpec {
                name,
                replicas,
                pg_count,
                object_size: u32::try_from(object_size)
                    .map_err(|_| anyhow::anyhow!("--object-size {object_size} is too large"))?,
                failure_domain: match failure_domain {
                    Domain::Host => FailureDomain::Host,
                    Domain::Device => FailureDomain::Device,
                },
                device_class,
            };
            let rec = catalog.create_pool(&spec).await?;
            if common.json {
                return output::json(&rec);
            }
            println!("created pool {} ({})", rec.name, rec.id);
            Ok(())
        }
        PoolCommand::List { common } => {
            let catalog = Catalog::new(common.cluster.meta().await?);
            let pools = catalog.list_pools().await?;
            if common.json {
                return output::json(&pools);
            }
            let mut t = output::table(&[
                "NAME",
                "ID",
                "REPLICAS",
                "PGS",
                "OBJECT SIZE",
                "DOMAIN",
                "CLASS",
            ]);
            for p in &pools {
                t.add_row([
                    p.name.clone(),
                    p.id.to_string(),
                    p.replicas.to_string(),
                    p.pg_count.to_string(),
                    format_size(p.object_size as u64),
                    format!("{:?}", p.failure_domain).to_lowercase(),
                    p.device_class.clone().unwrap_or_else(|| "any".into()),
                ]);
            }
            println!("{t}");
            Ok(())
        }
    }
}
