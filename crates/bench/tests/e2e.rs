//! End to end without a cluster: failures are reported as failures. (The run against a real local
//! Basalt cluster is `bin/basalt/tests/bench.rs`, where the `basalt` binary is built.)

use basalt_bench::readback::{data_cells, run_short as run};

#[test]
fn an_unreachable_target_gives_failed_steps_not_zeros() {
    let out = tempfile::tempdir().expect("out");
    let scratch = tempfile::tempdir().expect("scratch");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let uri = format!("nbd://127.0.0.1:{port}/");
    let dir = run(
        &[
            "matrix",
            "--bs",
            "4k",
            "--mixes",
            "100",
            "--uri",
            &uri,
            "--no-baseline",
            "--no-precondition",
        ],
        out.path(),
        scratch.path(),
    )
    .expect("a run with failed steps still writes its report");
    let html = std::fs::read_to_string(dir.join("report.html")).expect("html");
    assert!(html.contains("class=\"failed\""));
    assert!(html.contains("Failed steps"));
    assert!(
        html.contains("could not connect") || html.contains("Connection refused"),
        "fio's error is shown"
    );
    assert!(
        !data_cells(&html)
            .iter()
            .any(|c| c.metric == "iops" && c.value == 0.0),
        "no zero IOPS cells for failed steps"
    );
    let csv = std::fs::read_to_string(dir.join("results.csv")).expect("csv");
    assert_eq!(
        csv.lines()
            .skip(1)
            .filter(|l| l.contains(",failed,"))
            .count(),
        2
    );
}

#[test]
fn a_cluster_that_does_not_start_is_a_clear_error() {
    let out = tempfile::tempdir().expect("out");
    let scratch = tempfile::tempdir().expect("scratch");
    let err = run(
        &["baseline", "--basalt-bin", "/bin/false"],
        out.path(),
        scratch.path(),
    )
    .expect_err("cannot start");
    let msg = err.to_string();
    assert!(
        msg.contains("exited") && msg.contains("before listening"),
        "{msg}"
    );
}
