#!/usr/bin/env bash
# Runs every test Basalt has, as CI does (.ci/run calls this):
#   1. installs what the tests need (scripts/setup.sh: etcd, fio, nbdkit, libnbd, qemu-img, ...)
#   2. cargo fmt --check and cargo clippy -D warnings on the whole workspace
#   3. cargo test --workspace: unit, property, conformance (engine over io_uring/psync/sim, both
#      metadata backends against a real etcd), crash (simulated power loss, kill -9 of a real
#      process), fuzz smoke runs, and end-to-end tests with fio, qemu-img, nbdinfo and nbdsh
#      against real `basalt up` processes, multi-host clusters in network namespaces with
#      partitions and a minute of random network and process faults (needs root), plus a short
#      `basalt bench` run producing its report.
# Set CARGO_TARGET_DIR to reuse a build between runs (default: ~/.cache/basalt/target).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/basalt/target}
export RUST_BACKTRACE=${RUST_BACKTRACE:-1}
start=$(date +%s)
step() { printf '\n== %s (+%ss)\n' "$*" "$(( $(date +%s) - start ))"; }
free_gib() { df -Pk "$1" | awk 'NR == 2 { print int($4 / 1048576) }'; }

# Cargo never collects its own garbage: incremental sessions alone grow by gigabytes, and the
# tests need room for their devices, fio's files and bench reports. On a low disk, drop them
# (the next build is slower; nothing else changes).
mkdir -p "$CARGO_TARGET_DIR"
if [ "$(free_gib "$CARGO_TARGET_DIR")" -lt 12 ]; then
  step "low disk ($(free_gib "$CARGO_TARGET_DIR") GiB free): removing $CARGO_TARGET_DIR/*/incremental"
  rm -rf "$CARGO_TARGET_DIR"/*/incremental
fi

step "format"
cargo fmt --all -- --check
step "lint"
cargo clippy --workspace --all-targets --locked -- -D warnings
step "build"
cargo test --workspace --locked --no-run
step "tests"
# At their peak the tests hold about 6 GiB of device files (fallocated), fio files and reports.
tmp=${TMPDIR:-/tmp}
if [ "$(free_gib "$tmp")" -lt 8 ]; then
  echo "only $(free_gib "$tmp") GiB free under $tmp: the tests need about 8 GiB" >&2
  exit 1
fi
cargo test --workspace --locked
step "all tests passed"
