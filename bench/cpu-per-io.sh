#!/usr/bin/env bash
# Where the server's CPU goes per I/O, process by process: one fio job through NBD against a
# fresh `basalt up` (single node, or `--nodes N`), and for `up` and each `basalt node` child,
# measured over the middle of the run: user and system CPU time per I/O, syscalls per I/O and
# context switches per I/O (`perf stat`). Reads where the cost is (per-process work, wake-ups,
# kernel time) before choosing what to change; compare two builds with bench/binaries.sh.
#
#   bench/cpu-per-io.sh [BASALT_BINARY] [RW] [IODEPTH] [SECONDS] [NODES]
#     defaults: target/release/basalt randwrite 64 10 3   (NODES 0: single-node `basalt up`)
#   UP_ARGS="--local-gateway" bench/cpu-per-io.sh ...   adds options to `basalt up` (here: the
#     NBD gateway in node1's process)
#
# Needs fio with its nbd engine, perf, python3; etcd for NODES > 0. The volume (1 GiB) is
# filled before measuring so that reads hit written data. Numbers, not assertions: this VM is
# shared and noisy, run it twice.
set -euo pipefail
BASALT=$(realpath "${1:-target/release/basalt}")
RW=${2:-randwrite}
QD=${3:-64}
SECS=${4:-10}
NODES=${5:-3}
# shellcheck source=bench/lib-up.sh
source "$(dirname "$0")/lib-up.sh"
start_filled_up "$BASALT" "$NODES"
PIDS="$UP $( (pgrep -P "$UP" -f 'basalt node' || true) | tr '\n' ' ')"

fio --name=j --ioengine=nbd --uri="$URI" --rw="$RW" --bs=4k --iodepth="$QD" --size=1G \
  --runtime="$SECS" --time_based --ramp_time=2 --randseed=1 --output-format=json \
  >"$WORK/fio.out" 2>/dev/null &
FIO=$!
# Measure over the middle: from 3 s in (past the ramp) for SECS - 3 s.
sleep 3
SPAN=$((SECS - 3))
for p in $PIDS; do awk '{print $14, $15}' "/proc/$p/stat" >"$WORK/cpu0.$p"; done
PERFS=()
for p in $PIDS; do
  perf stat -e raw_syscalls:sys_enter,context-switches -p "$p" -x, -o "$WORK/stat.$p" \
    -- sleep "$SPAN" &
  PERFS+=($!)
done
sleep "$SPAN"
for p in $PIDS; do awk '{print $14, $15}' "/proc/$p/stat" >"$WORK/cpu1.$p"; done
wait "$FIO" "${PERFS[@]}"

python3 - "$WORK" "$SPAN" "$(getconf CLK_TCK)" $PIDS <<'PY'
import json, sys
work, span, tck, pids = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
text = open(f"{work}/fio.out").read()
job = json.loads(text[text.index("{"):])["jobs"][0]
iops = job["read"]["iops"] + job["write"]["iops"]
lat = [job[d]["lat_ns"]["mean"] / 1000 for d in ("read", "write") if job[d]["iops"] > 0]
print(f"{iops:.0f} IOPS, mean latency {' / '.join(f'{l:.0f}' for l in lat)} us")
ios = iops * span
print(f"{'process':<10} {'user us/IO':>11} {'sys us/IO':>10} {'syscalls/IO':>12} {'switches/IO':>12}")
total = 0.0
for i, pid in enumerate(pids):
    u0, s0 = map(int, open(f"{work}/cpu0.{pid}").read().split())
    u1, s1 = map(int, open(f"{work}/cpu1.{pid}").read().split())
    user = (u1 - u0) / tck * 1e6 / ios
    system = (s1 - s0) / tck * 1e6 / ios
    total += user + system
    counts = {}
    for line in open(f"{work}/stat.{pid}"):
        f = line.strip().split(",")
        if len(f) > 2 and f[0].replace(".", "").isdigit():
            counts[f[2]] = float(f[0])
    name = "up" if i == 0 else f"node{i}"
    print(f"{name:<10} {user:>11.1f} {system:>10.1f} "
          f"{counts.get('raw_syscalls:sys_enter', 0) / ios:>12.2f} "
          f"{counts.get('context-switches', 0) / ios:>12.2f}")
print(f"server CPU per I/O, all processes: {total:.1f} us")
PY
