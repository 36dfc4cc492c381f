#!/usr/bin/env bash
# Recovery (backfill) speed against the raw disk, with and without client load, and the
# client's p99 latency during recovery.
#
#   bench/recovery.sh [BASALT_BINARY] [VOLUME_SIZE]     (default: target/release/basalt, 1GiB)
#
# For each of two runs (no client load; fio 4K randrw 70/30 QD16 through NBD while it moves):
# starts `basalt up --nodes 3` (3 copies) on a fresh directory on this disk, fills the volume,
# then adds a 4th node with `basalt node --join` and times the backfill until `basalt status`
# shows every PG clean; the bytes moved are the nodes' `recovered_bytes` (status --json). The
# raw limit is fio's sequential 1 MiB direct write to a file on the same file system. The
# throttle is lifted (`basalt config set recovery-rate unlimited`). Numbers, not assertions.
#
# Needs fio with its nbd engine, etcd, python3.
set -euo pipefail
BASALT=${1:-target/release/basalt}
VOLUME=${2:-1GiB}
BASALT=$(realpath "$BASALT")
WORK=$(mktemp -d -p "${TMPDIR:-/var/tmp}")
# errexit applies inside the trap too: a `kill` with no job left must not skip the removal.
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT

json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

raw=$(fio --name=raw --filename="$WORK/raw.img" --size=1g --bs=1m --rw=write --direct=1 \
  --ioengine=psync --end_fsync=1 --output-format=json | json "d['jobs'][0]['write']['bw']/1024")
rm -f "$WORK/raw.img"
echo "raw sequential write (1 MiB, direct, this disk): ${raw%.*} MiB/s"

report() { # fio-json-file label
  python3 - "$1" "$2" <<'EOF'
import json, sys
text = open(sys.argv[1]).read()
j = json.loads(text[text.index("{"):])["jobs"][0]
for op in ("read", "write"):
    p = j[op]["clat_ns"]["percentile"]
    print(f"  client 4K randrw 70/30 QD16 {op}: {j[op]['iops']:.0f} IOPS, "
          f"p99 {p['99.000000'] / 1000:.0f} us {sys.argv[2]}")
EOF
}

run() { # label load(0|1)
  local dir="$WORK/$1"
  mkdir -p "$dir"
  "$BASALT" up --nodes 3 --data "$dir/d" --device-size 2GiB --volume-size "$VOLUME" \
    --nbd 127.0.0.1:0 >"$dir/up.log" 2>&1 &
  local up=$!
  for _ in $(seq 1 600); do [ -f "$dir/d/cluster.json" ] && break; sleep 0.1; done
  local nbd
  nbd=$(json "d['nbd_addr']" <"$dir/d/cluster.json")
  fio --name=fill --ioengine=nbd --uri="nbd://$nbd/vol0" --rw=write --bs=1m --iodepth=8 \
    >/dev/null
  "$BASALT" config set recovery-rate unlimited --data "$dir/d" >/dev/null
  local fio_pid=""
  if [ "$2" = 1 ]; then
    # The same client job for 10 s without recovery, for comparison.
    fio --name=load --ioengine=nbd --uri="nbd://$nbd/vol0" --rw=randrw --rwmixread=70 \
      --bs=4k --iodepth=16 --time_based --runtime=10 --output-format=json \
      --output="$dir/base.json"
    report "$dir/base.json" "without recovery"
    fio --name=load --ioengine=nbd --uri="nbd://$nbd/vol0" --rw=randrw --rwmixread=70 \
      --bs=4k --iodepth=16 --time_based --runtime=600 --output-format=json \
      --output="$dir/load.json" &
    fio_pid=$!
    sleep 3
  fi
  local before start end after
  before=$("$BASALT" status --json --data "$dir/d" | json "d['recovery']['recovered_bytes']")
  start=$(date +%s.%N)
  "$BASALT" node --join "$dir/d" >"$dir/node4.log" 2>&1 &
  local node=$!
  sleep 2
  until "$BASALT" status --json --data "$dir/d" | json \
      "int(d['pgs']['active_clean']==d['pgs']['total'] and d['pgs']['remapped']==0 and d['recovery']['misplaced_objects']==0)" \
      | grep -q 1; do
    sleep 0.5
  done
  end=$(date +%s.%N)
  after=$("$BASALT" status --json --data "$dir/d" | json "d['recovery']['recovered_bytes']")
  # The joined node's counters count too (it may drive backfill as a primary).
  local moved secs
  moved=$(python3 -c "print(($after - $before) / 1048576)")
  secs=$(python3 -c "print($end - $start)")
  echo "$1: moved $(printf %.0f "$moved") MiB in $(printf %.1f "$secs") s:" \
    "$(python3 -c "print(round($moved / $secs, 1))") MiB/s" \
    "($(python3 -c "print(round(100 * $moved / $secs / $raw, 1))")% of the raw disk)"
  if [ -n "$fio_pid" ]; then
    kill -INT "$fio_pid"
    wait "$fio_pid" || true
    report "$dir/load.json" "during recovery (and the 3 s before it)"
  fi
  kill "$node"; wait "$node" || true
  kill "$up"; wait "$up" || true
  rm -rf "$dir"
}

run idle 0
run loaded 1
