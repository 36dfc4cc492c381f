//! `report.html`: one self-contained page (inline CSS, inline SVG plots, no scripts, no network).
//! Numeric cells carry `data-step`, `data-metric` and `data-value` (full precision), so a reader or
//! a test can trace every number to its `fio/<step>.json`.

use super::format::{fmt_iops, fmt_mib, fmt_pct, fmt_us};
use crate::model::{Cell, RunReport, Section, Step, Table};
use std::collections::BTreeMap;
use std::fmt::Write as _;

const CSS: &str = "body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1200px;color:#222;padding:0 16px}
h1{font-size:1.6em}h2{border-bottom:2px solid #0072b2;padding-bottom:4px;margin-top:2em}h3{font-size:1.05em;margin-bottom:4px}
table{border-collapse:collapse;margin:8px 0 4px;font-size:0.9em}th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#eef3f8}td:first-child,th:first-child{text-align:left}caption{caption-side:bottom;text-align:left;color:#555;font-size:0.85em;padding-top:4px;max-width:1100px}
td.failed{background:#fde2e2;color:#a00;font-weight:bold}td.text{text-align:left}.kv td{text-align:left}.kv td:first-child{font-weight:bold;background:#f7f7f7}
.method{color:#333;max-width:1000px}.findings li{margin:2px 0}.warn{background:#fff4d6;border-left:4px solid #e69f00;padding:6px 10px}
figure{margin:12px 0}figcaption{font-size:0.85em;color:#555}details{margin:8px 0}summary{cursor:pointer;color:#0072b2}
.small{font-size:0.8em;color:#555}";

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The whole page.
pub fn render(r: &RunReport, plots: &BTreeMap<String, Result<String, String>>) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>basalt bench {p}: {d}</title><style>{CSS}</style></head><body>\n<h1>basalt bench: {p}</h1>\n<p>Started {d}, took {t:.0} s. Command: <code>{c}</code></p>\n",
        p = esc(&r.profile),
        d = esc(&r.started),
        t = r.duration_s,
        c = esc(&r.command)
    );
    if !r.warnings.is_empty() {
        h.push_str("<div class=\"warn\"><b>Warnings</b><ul>");
        for w in &r.warnings {
            let _ = write!(h, "<li>{}</li>", esc(w));
        }
        h.push_str("</ul></div>\n");
    }
    setup(&mut h, r);
    baselines(&mut h, r);
    for s in &r.sections {
        section(&mut h, s, plots);
    }
    method_notes(&mut h, r);
    h.push_str("</body></html>\n");
    h
}

fn kv(h: &mut String, rows: &[(&str, String)]) {
    h.push_str("<table class=\"kv\">");
    for (k, v) in rows {
        let _ = write!(h, "<tr><td>{}</td><td>{}</td></tr>", esc(k), esc(v));
    }
    h.push_str("</table>\n");
}

fn setup(h: &mut String, r: &RunReport) {
    let e = &r.env;
    h.push_str("<h2>Setup</h2>\n");
    let disk = &e.disk;
    kv(
        h,
        &[
            (
                "machine",
                format!(
                    "{} ({}), {} cores, {:.1} GiB memory",
                    e.hostname, e.cpu_model, e.cores, e.memory_gib
                ),
            ),
            ("system", format!("{}, kernel {}", e.os, e.kernel)),
            (
                "disk under the scratch directory",
                format!(
                    "{} {} ({}), {}, write cache: {}, {}; scratch: {}",
                    disk.device,
                    disk.model,
                    disk.size_gib
                        .map(|g| format!("{g:.0} GiB"))
                        .unwrap_or_default(),
                    match disk.rotational {
                        Some(true) => "reports rotational",
                        Some(false) => "reports non-rotational",
                        None => "rotational unknown",
                    },
                    if disk.write_cache.is_empty() {
                        "unknown"
                    } else {
                        &disk.write_cache
                    },
                    disk.filesystem,
                    disk.path
                ),
            ),
            (
                "software",
                format!(
                    "fio: {}; nbdkit: {}; basalt-bench {}",
                    e.fio_version.clone().unwrap_or("-".into()),
                    e.nbdkit_version.clone().unwrap_or("-".into()),
                    e.bench_version
                ),
            ),
            ("client", e.client.clone()),
            (
                "run length",
                format!(
                    "{} s measured per step after a {} s warm-up that is excluded from every number",
                    e.runtime_s, e.ramp_s
                ),
            ),
            (
                "quiet machine",
                format!(
                    "steps wait until other processes use at most {:.0}% of a core; a step disturbed by more is repeated; the foreign CPU of each step is in the step table",
                    e.quiet_max_pct
                ),
            ),
        ],
    );
    h.push_str("<h3>Targets</h3><table><tr><th>label</th><th>kind</th><th>what it is</th><th>volumes</th><th>size</th><th>fill</th><th>durability</th><th>version</th><th>server pids</th></tr>");
    for t in &e.targets {
        let size = t
            .size_bytes
            .map(basalt_types::size::format_size)
            .unwrap_or("-".into());
        let fill = match (t.filled_bytes, t.size_bytes) {
            (Some(f), Some(s)) if s > 0 => format!(
                "{:.0}% (written once, sequential 1 MiB)",
                f as f64 / s as f64 * 100.0
            ),
            (Some(f), _) => format!("{} written", basalt_types::size::format_size(f)),
            _ => "not preconditioned".into(),
        };
        let _ = write!(
            h,
            "<tr><td>{}</td><td class=text>{}</td><td class=text>{}</td><td class=text>{}</td><td>{}</td><td class=text>{}</td><td class=text>{}</td><td class=text>{}</td><td class=text>{}</td></tr>",
            esc(&t.label),
            esc(&t.kind),
            esc(&t.description),
            esc(&t.volumes.join(" ")),
            esc(&size),
            esc(&fill),
            esc(&t.durability),
            esc(t.version.as_deref().unwrap_or("-")),
            esc(&t
                .server_pids
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(" "))
        );
    }
    h.push_str("</table>\n");
}

fn baselines(h: &mut String, r: &RunReport) {
    let Some(b) = &r.baselines else {
        h.push_str("<h2>Raw limits</h2><p>No baseline was measured in this run (--no-baseline), so results are not shown as fractions of a raw limit.</p>\n");
        return;
    };
    h.push_str("<h2>Raw limits (baselines)</h2>\n<p class=\"method\">Measured first, on this machine: the disk under the scratch directory with fio io_uring and O_DIRECT on a file, and the network with Basalt's own TCP probe (one stream for throughput; 64-byte ping-pong for round-trip time). Later results are shown as fractions of the limit that applies to them.</p>\n");
    let f = |v: Option<f64>, g: &dyn Fn(f64) -> String| v.map(g).unwrap_or("-".into());
    kv(
        h,
        &[
            ("disk: sequential read, 1 MiB, QD16", f(b.seq_read_bytes_s, &|v| format!("{} MiB/s", fmt_mib(v / 1048576.0)))),
            ("disk: sequential write, 1 MiB, QD16", f(b.seq_write_bytes_s, &|v| format!("{} MiB/s", fmt_mib(v / 1048576.0)))),
            ("disk: 4K random read, QD64", f(b.rand_read_iops, &|v| format!("{} IOPS", fmt_iops(v)))),
            ("disk: 4K random write, QD64 (not synced)", f(b.rand_write_iops, &|v| format!("{} IOPS", fmt_iops(v)))),
            ("disk: 4K random write, QD64, fdatasync every 32 (durable)", f(b.rand_write_durable_iops, &|v| format!("{} IOPS", fmt_iops(v)))),
            (
                "network",
                b.net
                    .as_ref()
                    .map(|n| format!("{}: {:.2} Gbit/s one TCP stream; RTT mean {}, p50 {}, p99 {} ({} pings)", n.path, n.gbit_s(), fmt_us(Some(n.rtt_mean_us)), fmt_us(Some(n.rtt_p50_us)), fmt_us(Some(n.rtt_p99_us)), n.pings))
                    .unwrap_or("-".into()),
            ),
        ],
    );
}

fn section(h: &mut String, s: &Section, plots: &BTreeMap<String, Result<String, String>>) {
    let _ = write!(
        h,
        "<h2 id=\"{}\">{}</h2>\n<p class=\"method\">{}</p>\n",
        esc(&s.id),
        esc(&s.title),
        esc(&s.method)
    );
    if !s.findings.is_empty() {
        h.push_str("<ul class=\"findings\">");
        for f in &s.findings {
            let _ = write!(h, "<li>{}</li>", esc(f));
        }
        h.push_str("</ul>\n");
    }
    for t in &s.tables {
        table(h, t);
    }
    for p in &s.plots {
        match plots.get(&p.id) {
            Some(Ok(svg)) => {
                let _ = writeln!(
                    h,
                    "<figure>{svg}<figcaption>Figure: {} (plots/{}.svg)</figcaption></figure>",
                    esc(&p.title),
                    esc(&p.id)
                );
            }
            Some(Err(e)) => {
                let _ = write!(
                    h,
                    "<p class=\"warn\">Plot {} could not be drawn: {}</p>",
                    esc(&p.title),
                    esc(e)
                );
            }
            None => {}
        }
    }
    let failed: Vec<&Step> = s.steps.iter().filter(|st| st.stats().is_none()).collect();
    if !failed.is_empty() {
        h.push_str("<div class=\"warn\"><b>Failed steps</b> (shown as \"failed\" in the tables; not dropped, not zero)<ul>");
        for st in failed {
            let _ = write!(
                h,
                "<li><code>{}</code> {} on {}: {}</li>",
                esc(&st.id),
                esc(&st.job.label()),
                esc(&st.target),
                esc(st.outcome.error().unwrap_or(""))
            );
        }
        h.push_str("</ul></div>\n");
    }
    if !s.steps.is_empty() {
        let _ = writeln!(
            h,
            "<details><summary>All {} steps of this section (CPU, raw limit, warnings, raw fio output)</summary>",
            s.steps.len()
        );
        steps_table(h, &s.steps);
        h.push_str("</details>\n");
    }
}

fn cell(c: &Cell) -> String {
    let mut attrs = String::new();
    if let Some(s) = &c.step {
        let _ = write!(attrs, " data-step=\"{}\"", esc(s));
    }
    if let Some(m) = &c.metric {
        let _ = write!(attrs, " data-metric=\"{}\"", esc(m));
    }
    if let Some(v) = c.value {
        let _ = write!(attrs, " data-value=\"{v}\"");
    }
    if let Some(n) = &c.note {
        let _ = write!(attrs, " title=\"{}\"", esc(n));
    }
    if c.failed {
        attrs.push_str(" class=\"failed\"");
    } else if c.value.is_none() {
        attrs.push_str(" class=\"text\"");
    }
    format!("<td{attrs}>{}</td>", esc(&c.text))
}

/// One model table.
pub fn table(h: &mut String, t: &Table) {
    let _ = write!(
        h,
        "<h3>{}</h3><table><caption>{}</caption><tr>",
        esc(&t.title),
        esc(&t.caption)
    );
    for c in &t.columns {
        let _ = write!(h, "<th>{}</th>", esc(c));
    }
    h.push_str("</tr>\n");
    for row in &t.rows {
        h.push_str("<tr>");
        for c in row {
            h.push_str(&cell(c));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n");
}

fn steps_table(h: &mut String, steps: &[Step]) {
    h.push_str("<table><tr><th>step</th><th>target</th><th>workload</th><th>IOPS</th><th>MiB/s</th><th>mean lat</th><th>p99 lat</th><th>server CPU % of a core</th><th>client CPU %</th><th>server CPU µs/IO</th><th>client CPU µs/IO</th><th>of raw limit</th><th>other procs CPU %</th><th>attempts</th><th>notes</th><th>fio</th></tr>\n");
    for s in steps {
        let cpu = s.cpu.as_ref();
        let o = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or("-".into());
        let (iops, mib, mean, p99) = match s.stats() {
            Some(st) => (
                fmt_iops(st.iops()),
                fmt_mib(st.mib_s()),
                fmt_us(st.lat_mean_us()),
                fmt_us(st.lat_pct_us(99.0)),
            ),
            None => ("failed".into(), "-".into(), "-".into(), "-".into()),
        };
        let lim = s
            .limit
            .as_ref()
            .map(|l| format!("{} of {}", fmt_pct(l.fraction), l.name))
            .unwrap_or("-".into());
        let mut notes = s.warnings.join("; ");
        if let Some(e) = s.outcome.error() {
            notes = format!("{e} {notes}");
        }
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td class=text>{}</td><td class=text>{}</td><td data-step=\"{}\" data-metric=\"iops\" data-value=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=text>{}</td><td>{}</td><td>{}</td><td class=text>{}</td><td class=text><a href=\"{}\">json</a> <a href=\"{}\">job</a></td></tr>",
            esc(&s.id),
            esc(&s.target),
            esc(&s.job.label()),
            esc(&s.id),
            s.stats().map(|x| x.iops()).unwrap_or(f64::NAN),
            iops,
            mib,
            mean,
            p99,
            o(cpu.and_then(|c| c.server_pct)),
            o(cpu.and_then(|c| c.client_pct)),
            o(cpu.and_then(|c| c.server_us_per_io)),
            o(cpu.and_then(|c| c.client_us_per_io)),
            esc(&lim),
            o(cpu.map(|c| c.foreign_pct)),
            s.attempts,
            esc(&notes),
            esc(&s.fio_json),
            esc(&s.fio_jobfile)
        );
    }
    h.push_str("</table>\n");
}

fn method_notes(h: &mut String, r: &RunReport) {
    let _ = write!(
        h,
        "<h2>How these numbers were measured</h2><ul class=\"method\">
<li>Every step is one fio run (job file and JSON output in <code>fio/</code>). fio runs its jobs as threads of one process (<code>thread=1</code>) with <code>group_reporting</code>; IOPS and bandwidth are fio's, over the measured window only (the {ramp} s warm-up, fio <code>ramp_time</code>, is excluded).</li>
<li>Latency is fio's total latency (<code>lat_ns</code>: submission + completion), mean and percentiles (<code>lat_percentiles=1</code>). For a mixed workload the latency shown is the worse of read and write unless the table says otherwise.</li>
<li>CPU is read from <code>/proc</code>: utime+stime of the server processes (all threads) and of the fio process (all threads, including libnbd/librbd) between two snapshots that bracket the measured window; CPU per IO = CPU rate / IOPS. \"Other procs\" is every other user-space process over the same window (processes that exited during it are counted through their parent's cutime, less what they had used before the window); a step during which they used more than the limit is repeated.</li>
<li>Throughput in Mbit/s is 10<sup>6</sup> bits per second; MiB/s is 2<sup>20</sup> bytes per second.</li>
<li>Nothing is extrapolated: every number was measured on the machine and targets described above, with the client on the same host.</li>
<li>Raw data: <code>results.json</code> (everything), <code>results.csv</code> (one row per step), <code>env.json</code>, <code>plots/*.svg</code>. Profile: {profile}.</li></ul>\n",
        ramp = r.env.ramp_s,
        profile = esc(&r.profile)
    );
}
