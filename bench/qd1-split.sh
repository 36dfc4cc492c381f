#!/usr/bin/env bash
# Where a QD1 write's time goes: the same fio job (4K random write, QD1, through NBD) against a
# fresh `basalt up` of one node and of `--nodes 3` (3 copies), each with its device files on the
# disk (DISK_DIR) and on tmpfs (/dev/shm: no device latency, so what remains is the processes,
# the hops between them and the store's own work). Rep3 minus one node on tmpfs is what the
# extra hops cost (gateway -> primary -> replicas and back); the disk runs minus the tmpfs runs
# are what the device writes cost. Prints mean and p99 latency per run. Numbers, not
# assertions: this VM is shared and noisy, run it twice.
#
#   bench/qd1-split.sh [BASALT_BINARY] [RUNS] [DISK_DIR]
#     defaults: target/release/basalt 2 ${TMPDIR:-/var/tmp}
#
# Needs fio with its nbd engine, etcd, python3, and about 5 GiB free in /dev/shm and DISK_DIR.
set -euo pipefail
BASALT=$(realpath "${1:-target/release/basalt}")
RUNS=${2:-2}
DISK_DIR=${3:-${TMPDIR:-/var/tmp}}
WORK=$(mktemp -d -p "$DISK_DIR")
SHM=$(mktemp -d -p /dev/shm)
# `up` runs in a subshell (`one`), not as a job of this shell: found by its data directory.
trap 'pkill -f -- "up --data ($WORK|$SHM)/d " 2>/dev/null || true; sleep 1; rm -rf "$WORK" "$SHM"' EXIT

one() { # DIR NODES(0: one node) -> "mean p99" in µs
  local dir=$1/d shape=(--listen 127.0.0.1:0)
  [ "$2" -gt 0 ] && shape=(--nodes "$2")
  rm -rf "$dir"
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$BASALT" up --data "$dir" "${shape[@]}" --device-size 1536MiB --volume-size 1GiB \
    --nbd "127.0.0.1:$port" >"$WORK/up.log" 2>&1 &
  local up=$!
  for _ in $(seq 1 600); do
    grep -q "Stop with Ctrl-C" "$WORK/up.log" && break
    kill -0 "$up" 2>/dev/null || { cat "$WORK/up.log" >&2; exit 1; }
    sleep 0.1
  done
  local uri="nbd://127.0.0.1:$port/vol0"
  fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=256M \
    >/dev/null
  fio --name=j --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=1 --size=256M \
    --runtime=10 --ramp_time=2 --time_based --randseed=1 --output-format=json \
    --output="$WORK/fio.json" >/dev/null
  kill "$up"
  wait "$up" 2>/dev/null || true
  rm -rf "$dir"
  python3 - "$WORK/fio.json" <<'EOF'
import json, sys
t = open(sys.argv[1]).read()
w = json.loads(t[t.index("{"):])["jobs"][0]["write"]["clat_ns"]
print("%.0f %.0f" % (w["mean"] / 1000, w["percentile"]["99.000000"] / 1000))
EOF
}

printf '%-6s %-8s %-6s %10s %10s\n' run target files "mean µs" "p99 µs"
for r in $(seq 1 "$RUNS"); do
  for nodes in 3 0; do
    for place in disk tmpfs; do
      dir=$WORK
      [ "$place" = tmpfs ] && dir=$SHM
      out=$(one "$dir" "$nodes") || exit 1
      read -r mean p99 <<<"$out"
      label="1 node"
      [ "$nodes" -gt 0 ] && label="rep3"
      printf '%-6s %-8s %-6s %10s %10s\n' "$r" "$label" "$place" "$mean" "$p99"
    done
  done
done
