#!/usr/bin/env bash
# Scaling with nodes, as simplyblock's table: IOPS of 1, 2, ... N node processes, each node's
# CPU capped alike (a cgroup CPU quota per node process), so that the cap, not the one shared
# disk or the client, is the limit. Prints IOPS, IOPS per node and the share of linear scaling
# (IOPS of N nodes / (N x IOPS of 1 node)) for 4K random reads and writes, with each node's
# measured CPU use (it should sit at the cap: else something else limits) and the gateway's
# (`basalt up`, uncapped: near 1.0 core per thread it limits instead).
#
#   bench/scaling.sh [BASALT_BINARY] [MAX_NODES] [CPU_PER_NODE] [RUNTIME_SECONDS]
#   (defaults: target/release/basalt, 4, 0.1 of a core, 15)
#   SCALING_REPLICAS=3 bench/scaling.sh ...   # a pool of 3 copies (from 3 nodes on) instead of 1
#   SCALING_JOBS=8 SCALING_QD=128 (the defaults): fio jobs (NBD connections) and depth of each
#   SCALING_UP_THREADS=1 (the default): `basalt up --threads` (the gateway's threads)
#
# Each step starts `basalt up --nodes N` on a fresh directory (its own etcd; pool `default`
# with SCALING_REPLICAS copies, default 1, so that every node serves its share of primaries),
# fills the volume, puts every `basalt node` process in a cgroup of its own with the quota
# (cgroup v1 `cpu` controller or cgroup v2; needs root), and runs fio (ioengine=nbd, 8 jobs x
# QD128 through the gateway, which stays uncapped like fio and etcd). Numbers, not assertions.
# The client keeps enough I/O in flight that every node has a deep queue (1024: 256 per node at
# 4). With 256 in flight (QD32) the 4-node step reached only 74-80% of linear though every node
# sat at its cap, so each request cost more CPU there; the likely cause: 64 requests per node
# are served in smaller batches (more wake-ups and system calls per request) than 256 at one.
#
# Needs root, fio with its nbd engine, etcd, python3.
set -euo pipefail
BASALT=$(realpath "${1:-target/release/basalt}")
MAX=${2:-4}
CPU=${3:-0.1}
RUNTIME=${4:-15}
REPLICAS=${SCALING_REPLICAS:-1}
JOBS=${SCALING_JOBS:-8}
QD=${SCALING_QD:-128}
UP_THREADS=${SCALING_UP_THREADS:-1}
WORK=$(mktemp -d -p "${TMPDIR:-/var/tmp}")
CG_ROOT=""
CG_V2=0
if [ -d /sys/fs/cgroup/cpu ] && [ -f /sys/fs/cgroup/cpu/cgroup.procs ]; then
  CG_ROOT=/sys/fs/cgroup/cpu/basalt-scaling-$$
elif [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
  CG_ROOT=/sys/fs/cgroup/basalt-scaling-$$
  CG_V2=1
else
  echo "no cgroup cpu controller found (need cgroup v1 'cpu' or v2 with 'cpu')" >&2
  exit 1
fi

cleanup() {
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
  for g in "$CG_ROOT"/node*; do [ -d "$g" ] && rmdir "$g" 2>/dev/null || true; done
  rmdir "$CG_ROOT" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

mkdir -p "$CG_ROOT"
[ "$CG_V2" = 1 ] && echo +cpu >"$CG_ROOT/cgroup.subtree_control"
PERIOD=10000 # 10 ms periods: a capped node runs in short slices, not 100 ms bursts
QUOTA=$(python3 -c "print(max(1000, int($CPU * $PERIOD)))")

cap() { # pid name: moves the process (all its threads) into a capped cgroup of its own
  local g="$CG_ROOT/$2"
  mkdir -p "$g"
  if [ "$CG_V2" = 1 ]; then
    echo "$QUOTA $PERIOD" >"$g/cpu.max"
  else
    echo "$PERIOD" >"$g/cpu.cfs_period_us"
    echo "$QUOTA" >"$g/cpu.cfs_quota_us"
  fi
  echo "$1" >"$g/cgroup.procs"
}

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

fio_job() { # nbd rw -> "iops"
  fio --name=j --ioengine=nbd --uri="nbd://$1/vol0" --rw="$2" --bs=4k --iodepth="$QD" --numjobs="$JOBS" \
    --group_reporting --size=1g --runtime="$RUNTIME" --time_based --ramp_time=3 --randseed=7 \
    --output-format=json |
    python3 -c '
import json, sys
text = sys.stdin.read()
j = json.loads(text[text.index("{"):])["jobs"][0]
side = j["write"] if j["write"]["io_bytes"] > 0 else j["read"]
print("%.0f" % side["iops"])'
}

declare -A FIRST
printf 'cap: %s of a core per node process (quota %s us per %s us); pool: %s copies; fio %s jobs x QD%s\n' \
  "$CPU" "$QUOTA" "$PERIOD" "$REPLICAS" "$JOBS" "$QD"
printf '%-6s %-10s %10s %10s %9s %8s %s\n' nodes job IOPS "per node" linear gateway "node CPU (cores)"
for n in $(seq 1 "$MAX"); do
  [ "$n" -lt "$REPLICAS" ] && continue
  dir="$WORK/n$n"
  mkdir -p "$dir"
  "$BASALT" up --nodes "$n" --replicas "$REPLICAS" --data "$dir/d" --device-size 2GiB \
    --volume-size 1GiB --nbd 127.0.0.1:0 --threads "$UP_THREADS" >"$dir/up.log" 2>&1 &
  up=$!
  for _ in $(seq 1 900); do [ -f "$dir/d/cluster.json" ] && break; sleep 0.1; done
  [ -f "$dir/d/cluster.json" ] || { cat "$dir/up.log"; exit 1; }
  nbd=$(python3 -c "import json; print(json.load(open('$dir/d/cluster.json'))['nbd_addr'])")
  pids=$(python3 -c "import json; print(' '.join(str(x['pid']) for x in json.load(open('$dir/d/cluster.json'))['nodes']))")
  fio --name=fill --ioengine=nbd --uri="nbd://$nbd/vol0" --rw=write --bs=1m --iodepth=8 >/dev/null
  k=0
  for p in $pids; do k=$((k + 1)); cap "$p" "node$n-$k"; done
  for rw in randread randwrite; do
    before=()
    for p in $pids; do before+=("$(ticks "$p")"); done
    up_before=$(ticks "$up")
    t0=$(date +%s.%N)
    iops=$(fio_job "$nbd" "$rw")
    t1=$(date +%s.%N)
    used=""
    i=0
    for p in $pids; do
      used+=$(python3 -c "print('%.2f ' % (($(ticks "$p") - ${before[$i]}) / $(getconf CLK_TCK) / ($t1 - $t0)))")
      i=$((i + 1))
    done
    gw=$(python3 -c "print('%.2f' % (($(ticks "$up") - $up_before) / $(getconf CLK_TCK) / ($t1 - $t0)))")
    [ -z "${FIRST[$rw]:-}" ] && FIRST[$rw]=$((iops / n))
    linear=$(python3 -c "print('%.0f%%' % (100 * $iops / ($n * ${FIRST[$rw]})))")
    printf '%-6s %-10s %10s %10s %9s %8s %s\n' "$n" "$rw" "$iops" "$((iops / n))" "$linear" "$gw" "$used"
  done
  kill -INT "$up"
  wait "$up" 2>/dev/null || true
  for g in "$CG_ROOT"/node"$n"-*; do rmdir "$g" 2>/dev/null || true; done
done
