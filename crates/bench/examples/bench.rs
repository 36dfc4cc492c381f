//! `basalt bench` without the rest of the CLI, for trying the benchmark before bin/basalt wires it:
//! `cargo run -p basalt-bench --example bench -- quick --uri nbd://127.0.0.1:10809/`.

use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "bench")]
struct Cli {
    #[command(flatten)]
    bench: basalt_bench::BenchArgs,
}

fn main() -> anyhow::Result<()> {
    basalt_bench::run(Cli::parse().bench)?;
    Ok(())
}
