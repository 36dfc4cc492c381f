//! `basalt`: the one binary. The composition root: it parses the command line, builds the
//! pieces from the library crates and runs them. No storage logic lives here.

/// mimalloc instead of glibc malloc: the data path allocates small, short-lived boxes (futures,
/// channels, frames) at a high rate, and glibc spent about a tenth of a node's CPU on them.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod children;
mod clusterfile;
mod config;
mod connect;
mod device;
mod drain;
mod duration;
mod health;
mod nbd_cmd;
mod node_cmd;
mod outcheck;
mod output;
mod pg;
mod pg_lost;
mod pool;
mod scrub;
mod slow;
mod status;
mod up;
mod up_nodes;
mod volume;

use clap::{Parser, Subcommand};

/// Basalt: pools drives into a self-healing store served as block volumes (NBD).
#[derive(Parser)]
#[command(name = "basalt", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a local cluster in the foreground, with a volume served over NBD: one node in this
    /// process, or N node processes with --nodes N.
    Up(up::UpArgs),
    /// Run a storage node of a multi-process cluster (metadata in etcd).
    Node(Box<node_cmd::NodeArgs>),
    /// Serve a cluster's volumes over NBD (a gateway process).
    Nbd(nbd_cmd::NbdArgs),
    /// Create, list, inspect, resize and delete volumes.
    #[command(subcommand)]
    Volume(volume::VolumeCommand),
    /// Create, list, inspect, change and delete pools.
    #[command(subcommand)]
    Pool(pool::PoolCommand),
    /// List devices; mark them out or in; change their weight.
    #[command(subcommand)]
    Device(device::DeviceCommand),
    /// List placement groups; declare one's data lost.
    #[command(subcommand)]
    Pg(pg::PgCommand),
    /// Show or change cluster-wide settings (the recovery throttle).
    #[command(subcommand)]
    Config(config::ConfigCommand),
    /// Show the cluster: health, nodes, devices, placement groups by state, pools, volumes.
    Status(status::StatusArgs),
    /// Compare the copies of every object (of a pool) and repair bad ones from a good copy.
    Scrub(scrub::ScrubArgs),
    /// Benchmark a cluster (or any NBD target) and write reports.
    Bench(Box<basalt_bench::BenchArgs>),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Daemons log their progress; one-shot commands only report errors (their background
    // machinery, torn down at exit, has nothing to tell the user).
    let daemon = matches!(cli.command, Command::Up(_) | Command::Nbd(_))
        || matches!(&cli.command, Command::Node(a) if a.action.is_none());
    init_logging(if daemon {
        "warn,basalt=info,basalt_node=info"
    } else {
        "error"
    });
    // Daemons serve on as many threads as they are told (one by default: run to completion);
    // one-shot commands on a thread per core.
    let threads = match &cli.command {
        Command::Node(a) if a.action.is_none() => usize::from(a.threads),
        Command::Up(a) => usize::from(a.threads),
        Command::Nbd(a) => usize::from(a.threads),
        _ => 0,
    };
    let result = match cli.command {
        Command::Bench(args) => basalt_bench::run(*args).map_err(anyhow::Error::from),
        command => runtime(threads).block_on(run(command)),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", describe(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, skipping a cause whose text the message already
/// contains (many library errors include their source in their own message).
fn describe(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Up(args) => up::run(args).await,
        Command::Node(args) => node_cmd::run(*args).await,
        Command::Nbd(args) => nbd_cmd::run(args).await,
        Command::Volume(cmd) => volume::run(cmd).await,
        Command::Pool(cmd) => pool::run(cmd).await,
        Command::Device(cmd) => device::run(cmd).await,
        Command::Pg(cmd) => pg::run(cmd).await,
        Command::Status(args) => status::run(args).await,
        Command::Scrub(args) => scrub::run(args).await,
        Command::Config(cmd) => config::run(cmd).await,
        Command::Bench(_) => unreachable!("handled before the runtime starts"),
    }
}

/// The runtime: `threads` 1 is a current-thread runtime (every task on the main thread), 0 a
/// worker per core, N that many workers.
fn runtime(threads: usize) -> tokio::runtime::Runtime {
    let mut builder = match threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    if threads > 1 {
        builder.worker_threads(threads);
    }
    builder
        .enable_all()
        .thread_name("basalt")
        .build()
        .expect("cannot start the tokio runtime")
}

/// Logs go to stderr; `RUST_LOG` overrides the default filter.
fn init_logging(default: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}
