#!/usr/bin/env bash
# Side by side: two `basalt` binaries (say, the last release and this build), each serving a
# single-node `basalt up` on a fresh data directory, measured with the same fio jobs in
# alternation (old, new, old, new ...) so that the shared machine's noise hits both alike.
# Prints IOPS and mean latency per job and binary, and new/old ratios.
#
#   bench/binaries.sh OLD_BINARY NEW_BINARY [RUNTIME_SECONDS] [ROUNDS]
#   (results of one run on the 2-vCPU development VM are in the foundations issue's note)
#
# Needs fio with its nbd engine. Each binary's device file is 2 GiB in a temporary directory;
# the volume is filled once before measuring so that reads hit written data.
set -euo pipefail
OLD=$1
NEW=$2
RUNTIME=${3:-15}
ROUNDS=${4:-2}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT

start() { # name binary port
  mkdir -p "$WORK/$1"
  "$2" up --data "$WORK/$1" --device-size 2GiB --volume-size 1GiB --nbd "127.0.0.1:$3" \
    --listen 127.0.0.1:0 >"$WORK/$1/up.log" 2>&1 &
  for _ in $(seq 1 300); do
    grep -q "Stop with Ctrl-C" "$WORK/$1/up.log" 2>/dev/null && return 0
    sleep 0.1
  done
  cat "$WORK/$1/up.log"
  exit 1
}

job() { # port rw bs iodepth runtime -> "iops mean_us"
  fio --name=j --ioengine=nbd --uri="nbd://127.0.0.1:$1/vol0" --rw="$2" --bs="$3" \
    --iodepth="$4" --size=1g --runtime="$5" --time_based --ramp_time=2 --randseed=1 \
    --output-format=json |
    python3 -c '
import json, sys
text = sys.stdin.read()
j = json.loads(text[text.index("{"):])["jobs"][0]  # fio may print a line before its JSON
side = j["write"] if j["write"]["io_bytes"] > 0 else j["read"]
print("%.0f %.0f" % (side["iops"], side["clat_ns"]["mean"] / 1000))'
}

start old "$OLD" 10901
start new "$NEW" 10902
for port in 10901 10902; do
  fio --name=fill --ioengine=nbd --uri="nbd://127.0.0.1:$port/vol0" --rw=write --bs=1m \
    --iodepth=8 --size=1g >/dev/null
done

# BINARIES_JOBS="randwrite 4k 64;write 128k 16" picks jobs ("rw bs iodepth", ';'-separated).
IFS=';' read -r -a JOBS <<<"${BINARIES_JOBS:-randread 4k 64;randwrite 4k 64;randwrite 4k 1;randread 4k 1;write 128k 16}"
printf '%-22s %12s %12s %12s %12s %8s\n' job "old IOPS" "new IOPS" "old mean µs" "new mean µs" new/old
for spec in "${JOBS[@]}"; do
  read -r rw bs qd <<<"$spec"
  o_iops=0 n_iops=0 o_lat=0 n_lat=0
  for _ in $(seq 1 "$ROUNDS"); do
    read -r i l < <(job 10901 "$rw" "$bs" "$qd" "$RUNTIME"); o_iops=$((o_iops + i)); o_lat=$((o_lat + l))
    read -r i l < <(job 10902 "$rw" "$bs" "$qd" "$RUNTIME"); n_iops=$((n_iops + i)); n_lat=$((n_lat + l))
  done
  printf '%-22s %12d %12d %12d %12d %8s\n' "$rw $bs QD$qd" $((o_iops / ROUNDS)) $((n_iops / ROUNDS)) \
    $((o_lat / ROUNDS)) $((n_lat / ROUNDS)) "$(python3 -c "print('%.2f' % ($n_iops / max($o_iops, 1)))")"
done
