//! Baselines first (MinIO seed): the raw disk through fio io_uring O_DIRECT on a file (preconditioned
//! so reads hit real extents, not holes), and the network through the TCP probe.

use super::{Metric, cell};
use crate::baseline::Baselines;
use crate::error::BenchError;
use crate::job::{JobSpec, Pattern};
use crate::model::{Cell, Section, Table};
use crate::net::NetProbe;
use crate::report::format::fmt_us;
use crate::runner::Runner;
use std::time::Duration;

/// Measures the raw limits on target `raw` (a raw file) and through `probe`.
pub fn run(
    r: &mut Runner,
    raw: usize,
    probes: &[&dyn NetProbe],
    net_s: f64,
) -> Result<(Section, Baselines), BenchError> {
    let mut s = Section::new(
        "baseline",
        "Baselines: raw disk and network",
        "The disk: a file on the same file system as the targets' data, written once, then fio io_uring with O_DIRECT: 1 MiB sequential read and write at QD16 (like dd/dperf), 4K random read and write at QD64, and 4K random write with fdatasync every 32 writes (the durable-write limit). The network: measured by Basalt itself — to the cluster's node through Basalt's own protocol (Ping frames echoed by the node: 8 x 1 MiB in flight for throughput, 64-byte pings for round-trip time) when the bench started the cluster, otherwise a TCP probe over loopback.",
    );
    let plan: Vec<(&str, JobSpec)> = vec![
        ("seq-write-1m", r.job(Pattern::Sequential, 1 << 20, 0, 16)),
        ("seq-read-1m", r.job(Pattern::Sequential, 1 << 20, 100, 16)),
        ("rand-read-4k", r.job(Pattern::Random, 4096, 100, 64)),
        ("rand-write-4k", r.job(Pattern::Random, 4096, 0, 64)),
        ("rand-write-4k-fdatasync32", {
            let mut j = r.job(Pattern::Random, 4096, 0, 64);
            j.fdatasync = Some(32);
            j
        }),
    ];
    r.plan(plan.len());
    if let Err(e) = r.ensure_filled(raw, 1) {
        r.warnings
            .push(format!("baseline file could not be preconditioned: {e}"));
    }
    let mut b = Baselines {
        device_path: r.targets[raw]
            .info
            .volumes
            .first()
            .cloned()
            .unwrap_or_default(),
        ..Baselines::default()
    };
    for (point, job) in &plan {
        let st = r.measure(&mut s, point, raw, job)?;
        let Some(stats) = st.stats() else { continue };
        match *point {
            "seq-write-1m" => b.seq_write_bytes_s = Some(stats.bw_bytes()),
            "seq-read-1m" => b.seq_read_bytes_s = Some(stats.bw_bytes()),
            "rand-read-4k" => b.rand_read_iops = Some(stats.iops()),
            "rand-write-4k" => b.rand_write_iops = Some(stats.iops()),
            _ => b.rand_write_durable_iops = Some(stats.iops()),
        }
    }
    let mut t = Table {
        title: "Raw disk (fio io_uring, O_DIRECT, file on the data file system)".into(),
        caption: "IOPS and MiB/s over the measured window; latency is fio's total latency. These are the limits later results are compared with.".into(),
        columns: ["workload", "IOPS", "MiB/s", "mean latency", "p99 latency", "client CPU µs/IO"].map(String::from).to_vec(),
        rows: Vec::new(),
    };
    for (point, job) in &plan {
        let st = s.step(point, r.targets[raw].label());
        let mut label = job.label();
        if job.fdatasync.is_some() {
            label.push_str(", fdatasync every 32");
        }
        t.rows.push(vec![
            Cell::text(label),
            cell(st, Metric::Iops),
            cell(st, Metric::MibS),
            cell(st, Metric::LatMean),
            cell(st, Metric::LatP99),
            cell(st, Metric::ClientUsPerIo),
        ]);
    }
    s.tables.push(t);
    // Every probe is measured and shown; the first one that succeeds is the network limit
    // results are compared with (the path the client's traffic takes).
    let mut rows = Vec::new();
    for p in probes {
        r.say(&format!("  network probe: {}", p.path()));
        match p.measure(Duration::from_secs_f64(net_s.max(0.2)), 2000) {
            Ok(n) => {
                s.findings.push(format!(
                    "network {}: {:.2} Gbit/s, round trip mean {}, p99 {}",
                    n.path,
                    n.gbit_s(),
                    fmt_us(Some(n.rtt_mean_us)),
                    fmt_us(Some(n.rtt_p99_us))
                ));
                rows.push(vec![
                    Cell::text(&n.path),
                    Cell {
                        text: format!("{:.2}", n.gbit_s()),
                        value: Some(n.gbit_s()),
                        metric: Some("gbit_s".into()),
                        ..Cell::default()
                    },
                    Cell {
                        text: format!("{:.0}", n.throughput_bytes_s / 1048576.0),
                        value: Some(n.throughput_bytes_s / 1048576.0),
                        ..Cell::default()
                    },
                    Cell::text(fmt_us(Some(n.rtt_mean_us))),
                    Cell::text(fmt_us(Some(n.rtt_p50_us))),
                    Cell::text(fmt_us(Some(n.rtt_p99_us))),
                    Cell::text(n.pings.to_string()),
                ]);
                if b.net.is_none() {
                    b.net = Some(n);
                }
            }
            Err(e) => r
                .warnings
                .push(format!("network baseline {} failed: {e}", p.path())),
        }
    }
    if !rows.is_empty() {
        s.tables.push(Table {
            title: "Network (measured by Basalt)".into(),
            caption: "TCP probe: one stream of 1 MiB writes for throughput, 64-byte ping-pong with TCP_NODELAY for round-trip time. Basalt protocol: Ping frames echoed by the node (8 x 1 MiB in flight; payload counted once), 64-byte pings for round-trip time. The first row is the limit later results are compared with.".into(),
            columns: ["path", "Gbit/s", "MiB/s", "RTT mean", "RTT p50", "RTT p99", "pings"].map(String::from).to_vec(),
            rows,
        });
    }
    Ok((s, b))
}
