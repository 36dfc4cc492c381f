//! Parsing, aggregation, searches and report generation on recorded fio output
//! (tests/fixtures/*.json: fio 3.33, ioengine=nbd against `nbdkit memory`, written by the same kind
//! of job file the bench writes; `failed-connect` is fio pointed at a closed port).

use basalt_bench::env::Env;
use basalt_bench::fio::{StepOutcome, classify};
use basalt_bench::job::{JobSpec, Pattern};
use basalt_bench::model::{PlotKind, PlotSpec, RunReport, Section, Series, Step, Table};
use basalt_bench::parse::{IoStats, aggregate, parse_fio_json};
use basalt_bench::profiles::{Metric, cell};
use basalt_bench::report;
use basalt_bench::search::{
    LatStat, LatencyGoal, SearchOutcome, best_within, find_knee, ramp_until, rate_search,
};
use serde_json::Value;
use std::path::PathBuf;

fn fixture(name: &str) -> String {
    // Where the package is now (cargo sets it when it runs the test): a test binary built in
    // another clone sharing the target directory keeps that clone's compile-time path.
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    let p = dir.join("tests/fixtures").join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The JSON document of a fixture read independently of the crate's parser.
fn raw(name: &str) -> Value {
    let text = fixture(&format!("{name}.json"));
    let start = text.find('{').expect("a JSON object");
    serde_json::from_str(&text[start..]).expect("valid JSON")
}

fn stats(name: &str) -> IoStats {
    let out = parse_fio_json(&fixture(&format!("{name}.json"))).expect("parses");
    aggregate(&out)
}

#[test]
fn parses_what_fio_wrote_including_the_leading_noise() {
    let text = fixture("randread-4k-qd1.json");
    assert!(
        text.starts_with("fio: connected to NBD server"),
        "fixture keeps fio's own prefix line"
    );
    let s = stats("randread-4k-qd1");
    let j = &raw("randread-4k-qd1")["jobs"][0];
    assert_eq!(s.read.iops, j["read"]["iops"].as_f64().expect("iops"));
    assert_eq!(
        s.read.total_ios,
        j["read"]["total_ios"].as_u64().expect("ios")
    );
    let mean = j["read"]["lat_ns"]["mean"].as_f64().expect("mean") / 1000.0;
    assert!((s.read.lat_mean_us.expect("mean") - mean).abs() < 1e-9);
    let p99 = j["read"]["lat_ns"]["percentile"]["99.000000"]
        .as_f64()
        .expect("p99")
        / 1000.0;
    assert_eq!(s.read.pct(99.0), Some(p99));
    assert_eq!(s.write.iops, 0.0);
    assert_eq!(
        s.write.lat_mean_us, None,
        "a direction without IO has no latency, not 0"
    );
    assert_eq!(s.lat_mean_us(), s.read.lat_mean_us);
}

#[test]
fn mixed_workload_weights_latency_by_completed_ios() {
    let s = stats("randrw70-4k-qd16");
    let j = &raw("randrw70-4k-qd16")["jobs"][0];
    let (ri, wi) = (
        j["read"]["total_ios"].as_f64().expect("r"),
        j["write"]["total_ios"].as_f64().expect("w"),
    );
    let (rm, wm) = (
        j["read"]["lat_ns"]["mean"].as_f64().expect("r"),
        j["write"]["lat_ns"]["mean"].as_f64().expect("w"),
    );
    let want = (rm * ri + wm * wi) / (ri + wi) / 1000.0;
    assert!((s.lat_mean_us().expect("mean") - want).abs() < 1e-6);
    assert_eq!(
        s.iops(),
        j["read"]["iops"].as_f64().expect("r") + j["write"]["iops"].as_f64().expect("w")
    );
    let worst = s
        .read
        .pct(99.0)
        .expect("r")
        .max(s.write.pct(99.0).expect("w"));
    assert_eq!(s.lat_pct_us(99.0), Some(worst));
    assert!(s.mbit_s() > 0.0 && (s.mbit_s() - s.bw_bytes() * 8.0 / 1e6).abs() < 1e-9);
}

#[test]
fn several_jobs_are_summed_and_percentiles_take_the_worst() {
    let a = raw("randread-4k-qd1");
    let b = raw("randread-4k-qd64");
    let mut doc = a.clone();
    doc["jobs"] = Value::Array(vec![a["jobs"][0].clone(), b["jobs"][0].clone()]);
    let s = aggregate(&parse_fio_json(&doc.to_string()).expect("parses"));
    let (sa, sb) = (stats("randread-4k-qd1"), stats("randread-4k-qd64"));
    assert!((s.read.iops - (sa.read.iops + sb.read.iops)).abs() < 1e-6);
    assert_eq!(s.read.total_ios, sa.read.total_ios + sb.read.total_ios);
    assert_eq!(
        s.read.pct(99.0),
        Some(
            sa.read
                .pct(99.0)
                .expect("a")
                .max(sb.read.pct(99.0).expect("b"))
        )
    );
}

#[test]
fn a_failed_run_is_a_failure_with_fios_message_and_zero_io_is_flagged() {
    let json = fixture("failed-connect.json");
    let stderr = fixture("failed-connect.stderr");
    match classify(false, &stderr, Some(&json)) {
        StepOutcome::Failed { error } => assert!(error.contains("Connection refused"), "{error}"),
        o => panic!("expected a failure, got {o:?}"),
    }
    // The same JSON with a zero exit status: a successful run with 0 IOPS, flagged, no latency.
    match classify(true, "", Some(&json)) {
        StepOutcome::Ok { stats, warning } => {
            assert_eq!(stats.iops(), 0.0);
            assert_eq!(stats.lat_mean_us(), None);
            assert!(warning.is_some_and(|w| w.contains("0 IOPS")));
        }
        o => panic!("expected ok with a warning, got {o:?}"),
    }
    assert!(classify(true, "", Some("not json")).error().is_some());
}

const QDS: [u32; 7] = [1, 2, 4, 8, 16, 32, 64];

#[test]
fn knee_of_the_recorded_qd_sweep() {
    let values: Vec<Option<f64>> = QDS
        .iter()
        .map(|q| Some(stats(&format!("randread-4k-qd{q}")).iops()))
        .collect();
    let k = find_knee(&values, 0.05, 2);
    let i = k.index.expect("the recorded sweep flattens out");
    assert!(k.stalled);
    // The defining property: the next two points do not beat the knee by 5%, and no earlier point
    // beats it.
    let v = |j: usize| values[j].expect("value");
    for j in i + 1..=i + 2 {
        assert!(v(j) <= v(i) * 1.05, "point {j} grew past the knee");
    }
    assert!((0..i).all(|j| v(j) <= v(i)));
    // On this recording that is QD4 (23.6k IOPS; QD8 adds 1.7%, QD16 drops).
    assert_eq!(QDS[i], 4);
    // A failed point ends the scan without a knee.
    let mut broken = values.clone();
    broken[1] = None;
    assert_eq!(find_knee(&broken, 0.05, 2).index, None);
}

/// Offered rate -> the recorded run with the highest recorded rate not above it.
fn by_rate(rate: Option<u64>) -> (Option<IoStats>, String) {
    let name = match rate {
        None => "randread-4k-qd16".to_string(),
        Some(r) => {
            let rec = [2000u64, 8000, 16000]
                .into_iter()
                .filter(|x| *x <= r)
                .max()
                .unwrap_or(2000);
            format!("randread-4k-qd16-rate{rec}")
        }
    };
    (Some(stats(&name)), name)
}

#[test]
fn latency_target_search_on_recorded_runs() {
    let goal = |us: f64| LatencyGoal {
        read_us: us,
        write_us: us,
        stat: LatStat::Mean,
    };
    // Unthrottled QD16 has a mean of ~959 µs: a 300 µs target needs throttling; 8000 IOPS offered
    // gave ~224 µs.
    let r = rate_search(&goal(300.0), 4, by_rate);
    assert_eq!(r.outcome, SearchOutcome::MetThrottled);
    let best = r.best().expect("found");
    assert_eq!(best.step, "randread-4k-qd16-rate8000");
    assert_eq!(best.iops, Some(stats("randread-4k-qd16-rate8000").iops()));
    assert!(best.lat_us.expect("lat") <= 300.0);
    assert_eq!(r.points.len(), 5, "unthrottled + 4 bisections");
    assert!(r.points.iter().all(|p| p.meets.is_some()));
    // A target no recorded rate meets (the 2000 IOPS run has ~141 µs).
    let never = rate_search(&goal(100.0), 4, by_rate);
    assert_eq!(never.outcome, SearchOutcome::NeverMet);
    assert!(never.best().is_none());
    // Generous target: met unthrottled, one step.
    let easy = rate_search(&goal(5000.0), 4, by_rate);
    assert_eq!(
        (easy.outcome, easy.points.len()),
        (SearchOutcome::MetUnthrottled, 1)
    );
    // The unthrottled step failed: the search says so.
    let failed = rate_search(&goal(300.0), 4, |_| (None, "failed-connect".into()));
    assert_eq!(failed.outcome, SearchOutcome::Failed);
    // A p99 target uses the p99 column.
    let p99 = rate_search(
        &LatencyGoal {
            read_us: 1e9,
            write_us: 1e9,
            stat: LatStat::Pct(99.0),
        },
        2,
        by_rate,
    );
    assert_eq!(
        p99.points[0].lat_us,
        stats("randread-4k-qd16").read.pct(99.0)
    );
}

#[test]
fn latency_load_ramp_stops_past_the_limit() {
    let measure = |qd: u32| {
        let n = format!("randread-4k-qd{qd}");
        (Some(stats(&n)), n)
    };
    let pts = ramp_until(&QDS, 1000.0, LatStat::Mean, measure);
    let last = pts.last().expect("points");
    assert_eq!(last.meets, Some(false), "the first point over 1 ms is kept");
    assert!(pts[..pts.len() - 1].iter().all(|p| p.meets == Some(true)));
    assert!(pts.len() < QDS.len(), "stopped before the end of the list");
    let best = best_within(&pts).expect("some QD is under 1 ms");
    let max_under = pts
        .iter()
        .filter(|p| p.meets == Some(true))
        .map(|p| p.iops.expect("iops"))
        .fold(0.0, f64::max);
    assert_eq!(best.iops, Some(max_under));
    // Over the limit already at QD1: one point, no answer.
    let pts = ramp_until(&QDS, 10.0, LatStat::Mean, measure);
    assert_eq!(pts.len(), 1);
    assert!(best_within(&pts).is_none());
}

fn step(id: &str, point: &str, fixture_name: &str, ok: bool) -> Step {
    let json = fixture(&format!("{fixture_name}.json"));
    let stderr = if ok {
        String::new()
    } else {
        fixture(&format!("{fixture_name}.stderr"))
    };
    Step {
        id: id.into(),
        section: "matrix".into(),
        point: point.into(),
        target: "basalt".into(),
        job: JobSpec::new(Pattern::Random, 4096, 100, 1),
        outcome: classify(ok, &stderr, Some(&json)),
        cpu: None,
        limit: None,
        wall_s: 1.0,
        attempts: 1,
        quiet_wait_s: 0.0,
        settle_wait_s: 0.0,
        warnings: Vec::new(),
        fio_json: format!("fio/{id}.json"),
        fio_jobfile: format!("fio/{id}.fio"),
    }
}

#[test]
fn report_files_carry_the_recorded_numbers_and_show_failures() {
    let steps = vec![
        step("001-qd1", "qd1", "randread-4k-qd1", true),
        step("002-mix", "mix", "randrw70-4k-qd16", true),
        step("003-down", "down", "failed-connect", false),
    ];
    let mut sec = Section::new("matrix", "Recorded", "three recorded fio runs");
    sec.tables.push(Table {
        title: "IOPS".into(),
        caption: "recorded".into(),
        columns: vec!["point".into(), "IOPS".into(), "mean".into()],
        rows: steps
            .iter()
            .map(|s| {
                vec![
                    basalt_bench::model::Cell::text(&s.point),
                    cell(Some(s), Metric::IopsExact),
                    cell(Some(s), Metric::LatMean),
                ]
            })
            .collect(),
    });
    sec.plots.push(PlotSpec {
        id: "recorded".into(),
        title: "Recorded IOPS".into(),
        x_label: "step".into(),
        y_label: "IOPS".into(),
        kind: PlotKind::Bar {
            categories: vec!["qd1".into(), "mix".into(), "down".into()],
        },
        series: vec![Series {
            name: "basalt".into(),
            points: steps
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.stats().map(|x| (i as f64, x.iops())))
                .collect(),
        }],
        hlines: Vec::new(),
    });
    sec.steps = steps;
    let run = RunReport {
        format_version: basalt_bench::model::FORMAT_VERSION,
        profile: "recorded".into(),
        command: "test".into(),
        started: "2026-11-22T00:00:00Z".into(),
        duration_s: 3.0,
        env: Env::default(),
        baselines: None,
        sections: vec![sec],
        warnings: vec![],
    };
    let dir = tempfile::tempdir().expect("tempdir");
    report::write_all(&run, dir.path()).expect("writes");
    let html = std::fs::read_to_string(dir.path().join("report.html")).expect("html");
    for (id, name) in [
        ("001-qd1", "randread-4k-qd1"),
        ("002-mix", "randrw70-4k-qd16"),
    ] {
        let j = &raw(name)["jobs"][0];
        let iops = j["read"]["iops"].as_f64().expect("r") + j["write"]["iops"].as_f64().expect("w");
        let needle = format!("data-step=\"{id}\" data-metric=\"iops\" data-value=\"{iops}\"");
        assert!(html.contains(&needle), "missing {needle}");
    }
    assert!(
        html.contains("class=\"failed\""),
        "the failed step is shown as failed"
    );
    assert!(html.contains("Connection refused"), "with fio's error");
    assert!(html.contains("<svg"), "the plot is inline");
    assert!(dir.path().join("plots/recorded.svg").exists());
    let csv = std::fs::read_to_string(dir.path().join("results.csv")).expect("csv");
    assert_eq!(csv.lines().count(), 4);
    assert!(
        csv.lines()
            .nth(3)
            .is_some_and(|l| l.contains(",failed,") && l.contains("Connection refused"))
    );
    let back: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("results.json")).expect("json"),
    )
    .expect("parses");
    assert_eq!(back["format_version"], 1);
    assert_eq!(back["sections"][0]["steps"][2]["status"], "failed");
    assert_eq!(
        back["sections"][0]["steps"][0]["stats"]["read"]["iops"],
        raw("randread-4k-qd1")["jobs"][0]["read"]["iops"]
    );
}
