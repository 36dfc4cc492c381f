#!/usr/bin/env bash
# Side by side: two `basalt` binaries (say, the last release and this build), each serving a
# single-node `basalt up` on a fresh data directory, measured with the same fio jobs in
# alternation (old, new, old, new ...) so that the shared machine's noise hits both alike.
# Prints IOPS, mean latency and server CPU per I/O (user + system time of `up` and its node
# processes, etcd excluded) per job and binary, and new/old ratios.
#
#   bench/binaries.sh OLD_BINARY NEW_BINARY [RUNTIME_SECONDS] [ROUNDS]
#   BINARIES_NODES=3 bench/binaries.sh ...   # each binary serves `basalt up --nodes 3` (3 copies)
#   BINARIES_OLD_ARGS="..." BINARIES_NEW_ARGS="..."  # more `basalt up` options for each side,
#     e.g. the same binary twice: BINARIES_NODES=3 BINARIES_OLD_ARGS="--local-gateway
#     --node-arg=--nbd-reads=primary" BINARIES_NEW_ARGS=--local-gateway bench/binaries.sh B B
#   (results of one run on the 2-vCPU development VM are in the foundations issue's note)
#
# Needs fio with its nbd engine. Each binary's device file is 2 GiB in a temporary directory
# (BINARIES_DEVICE_SIZE; with BINARIES_NODES=3 that is six files: 1536MiB fits a 1 GiB volume),
# the volume 1 GiB (BINARIES_VOLUME_SIZE); it is filled once before measuring so that reads
# hit written data.
set -euo pipefail
OLD=$1
NEW=$2
RUNTIME=${3:-15}
ROUNDS=${4:-2}
DEVICE_SIZE=${BINARIES_DEVICE_SIZE:-2GiB}
VOLUME_SIZE=${BINARIES_VOLUME_SIZE:-1GiB}
FIO_SIZE=${VOLUME_SIZE%B}
FIO_SIZE=$(numfmt --from=iec "${FIO_SIZE%i}") # fio wants bytes
WORK=$(mktemp -d)
# errexit applies inside the trap too: a `kill` with no job left must not skip the removal.
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT

start() { # name binary port extra-args
  mkdir -p "$WORK/$1"
  local shape=(--listen 127.0.0.1:0)
  [ -n "${BINARIES_NODES:-}" ] && shape=(--nodes "$BINARIES_NODES")
  local extra
  read -r -a extra <<<"$4"
  "$2" up --data "$WORK/$1" --device-size "$DEVICE_SIZE" --volume-size "$VOLUME_SIZE" \
    --nbd "127.0.0.1:$3" \
    "${shape[@]}" "${extra[@]}" >"$WORK/$1/up.log" 2>&1 &
  for _ in $(seq 1 300); do
    grep -q "Stop with Ctrl-C" "$WORK/$1/up.log" 2>/dev/null && return 0
    sleep 0.1
  done
  cat "$WORK/$1/up.log"
  exit 1
}

ticks() { # name -> CPU ticks used so far by its `up` process and that process's children
  local pids total=0 t
  pids=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$WORK/$1/cluster.json" 2>/dev/null ||
    pgrep -f -- "--data $WORK/$1 " | head -1)
  for p in $pids $(pgrep -P "$pids" | xargs -r -n1 sh -c 'cat /proc/$0/comm | grep -qx etcd || echo $0'); do
    t=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)
    total=$((total + t))
  done
  echo "$total"
}

job() { # port rw bs iodepth runtime -> "iops mean_us ios"
  fio --name=j --ioengine=nbd --uri="nbd://127.0.0.1:$1/vol0" --rw="$2" --bs="$3" \
    --iodepth="$4" --size="$FIO_SIZE" --runtime="$5" --time_based --ramp_time=2 --randseed=1 \
    --output-format=json |
    python3 -c '
import json, sys
text = sys.stdin.read()
j = json.loads(text[text.index("{"):])["jobs"][0]  # fio may print a line before its JSON
side = j["write"] if j["write"]["io_bytes"] > 0 else j["read"]
print("%.0f %.0f %d" % (side["iops"], side["clat_ns"]["mean"] / 1000, side["total_ios"]))'
}

start old "$OLD" 10901 "${BINARIES_OLD_ARGS:-}"
start new "$NEW" 10902 "${BINARIES_NEW_ARGS:-}"
for port in 10901 10902; do
  fio --name=fill --ioengine=nbd --uri="nbd://127.0.0.1:$port/vol0" --rw=write --bs=1m \
    --iodepth=8 --size="$FIO_SIZE" >/dev/null
done

# BINARIES_JOBS="randwrite 4k 64;write 128k 16" picks jobs ("rw bs iodepth", ';'-separated).
IFS=';' read -r -a JOBS <<<"${BINARIES_JOBS:-randread 4k 64;randwrite 4k 64;randwrite 4k 1;randread 4k 1;write 128k 16}"
HZ=$(getconf CLK_TCK)
cpu_us() { # ticks ios -> µs of server CPU per I/O (includes the ramp's I/O-less share)
  python3 -c "import sys; print('%.0f' % ($1 * 1e6 / $HZ / max($2, 1)))"
}
printf '%-22s %10s %10s %11s %11s %9s %9s %8s\n' job "old IOPS" "new IOPS" "old mean µs" \
  "new mean µs" "old CPU/IO" "new CPU/IO" new/old
for spec in "${JOBS[@]}"; do
  read -r rw bs qd <<<"$spec"
  o_iops=0 n_iops=0 o_lat=0 n_lat=0 o_t=0 n_t=0 o_n=0 n_n=0
  for _ in $(seq 1 "$ROUNDS"); do
    t0=$(ticks old)
    read -r i l n < <(job 10901 "$rw" "$bs" "$qd" "$RUNTIME")
    o_t=$((o_t + $(ticks old) - t0)) o_iops=$((o_iops + i)) o_lat=$((o_lat + l)) o_n=$((o_n + n))
    t0=$(ticks new)
    read -r i l n < <(job 10902 "$rw" "$bs" "$qd" "$RUNTIME")
    n_t=$((n_t + $(ticks new) - t0)) n_iops=$((n_iops + i)) n_lat=$((n_lat + l)) n_n=$((n_n + n))
  done
  printf '%-22s %10d %10d %11d %11d %9s %9s %8s\n' "$rw $bs QD$qd" $((o_iops / ROUNDS)) \
    $((n_iops / ROUNDS)) $((o_lat / ROUNDS)) $((n_lat / ROUNDS)) "$(cpu_us $o_t $o_n)" \
    "$(cpu_us $n_t $n_n)" "$(python3 -c "print('%.2f' % ($n_iops / max($o_iops, 1)))")"
done
