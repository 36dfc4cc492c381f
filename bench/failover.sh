#!/usr/bin/env bash
# The I/O stall a running client sees when a node is killed with SIGKILL (kill -9): every node is
# the primary of some placement groups, so I/O to those waits until the failure is detected
# (lease expiry or peer reports) and the new map makes the next copy primary (peering).
#
#   bench/failover.sh [BASALT_BINARY] [LEASE_TTL] [FREEZE]   (default: target/release/basalt, 4s, 8)
#
# Five runs, each on a fresh `basalt up --nodes 3` (3 copies, min_size 2, the node lease
# LEASE_TTL): fio 4K random reads and writes (50/50) QD16 through NBD; 5 s in, one node is
# killed with SIGKILL: first a node that is not the leader, then the leader (whose successor
# must win the election first). Then twice a node that is not the leader is stopped and, 7 s
# in, started again with its own command line (what a rolling upgrade does): once stopped
# cleanly (SIGTERM), once killed (SIGKILL). Last, a node that is not the leader is frozen
# (SIGSTOP: a hung process, a paused VM) for FREEZE seconds and then continued (SIGCONT): its
# lease and its peers' heartbeats run out while it holds requests and it is marked down (that
# it acknowledges nothing of its old term when it runs again is the tests' job, not this
# script's). Prints, for reads and for writes, the longest
# stretch of 100 ms intervals without one completed I/O and fio's slowest I/O (the stall;
# reads also wait for the read leases of failure-model.md rule 9), separately after the stop
# and after the return, fio's errors (must be 0: I/O waits and is retried, never fails) and
# the IOPS before and after. Numbers, not assertions.
#
# Needs fio with its nbd engine, etcd, python3.
set -euo pipefail
BASALT=$(realpath "${1:-target/release/basalt}")
TTL=${2:-4s}
FREEZE=${3:-8}
WORK=$(mktemp -d -p "${TMPDIR:-/var/tmp}")
# errexit applies inside the trap too: a `kill` with no job left must not skip the removal.
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT

run() { # label victim(leader|other) [restart signal (TERM|KILL), or STOP: frozen, then SIGCONT]
  local dir="$WORK/$1"
  mkdir -p "$dir"
  "$BASALT" up --nodes 3 --data "$dir/d" --device-size 2GiB --volume-size 1GiB \
    --lease-ttl "$TTL" --nbd 127.0.0.1:0 >"$dir/up.log" 2>&1 &
  local up=$!
  for _ in $(seq 1 900); do [ -f "$dir/d/cluster.json" ] && break; sleep 0.1; done
  local nbd
  nbd=$(python3 -c "import json; print(json.load(open('$dir/d/cluster.json'))['nbd_addr'])")
  fio --name=fill --ioengine=nbd --uri="nbd://$nbd/vol0" --rw=write --bs=1m --iodepth=8 >/dev/null
  local victim
  victim=$("$BASALT" status --json --data "$dir/d" | python3 -c "
import json, sys
s = json.load(sys.stdin)
leader = s.get('leader') or ''
nodes = [n for n in s['nodes'] if n.get('pid')]
pick = [n for n in nodes if (leader.startswith('node.%d@' % n['id'])) == ('$2' == 'leader')]
print(pick[0]['pid'])")
  (cd "$dir" && fio --name=w --ioengine=nbd --uri="nbd://$nbd/vol0" --rw=randrw --rwmixread=50 --bs=4k \
    --iodepth=16 --time_based --runtime=25 --log_avg_msec=100 --write_iops_log=w \
    --output-format=json --output=fio.json) &
  local fio_pid=$! fio_at
  fio_at=$(date +%s%N)
  local cmdline=() back_at=0 back=""
  mapfile -d '' cmdline <"/proc/$victim/cmdline"
  sleep 5
  if [ -z "${3:-}" ]; then
    kill -9 "$victim"
  elif [ "$3" = STOP ]; then
    kill -STOP "$victim"
    sleep "$FREEZE"
    back_at=$((($(date +%s%N) - fio_at) / 1000000))
    kill -CONT "$victim"
  else
    kill -"$3" "$victim"
    while kill -0 "$victim" 2>/dev/null; do sleep 0.05; done
    sleep 2
    back_at=$((($(date +%s%N) - fio_at) / 1000000))
    "${cmdline[@]}" >>"$dir/restarted.log" 2>&1 &
    back=$!
  fi
  wait "$fio_pid" || true
  python3 - "$dir" "$1" "$back_at" <<'EOF'
import glob, json, sys
d, label, back_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open(d + "/fio.json").read()
j = json.loads(text[text.index("{"):])["jobs"][0]
rows = {0: [], 1: []}  # fio's direction column: 0 read, 1 write
for f in glob.glob(d + "/w_iops.*.log"):
    for line in open(f):
        t, v, ddir = (int(x) for x in line.split(",")[:3])
        rows[ddir].append((t, v))
avg = lambda xs: sum(xs) / max(1, len(xs))  # fio logs IOPS (a rate) per interval
def longest(r, lo, hi):
    # Intervals with completions; fio may log an empty interval as 0 or not at all.
    busy = [lo] + [t for t, v in r if v > 0 and lo < t < hi] + [min(hi, r[-1][0])]
    return max(0, max(b - a for a, b in zip(busy, busy[1:])) - 100)

parts = []
for ddir, name in ((0, "read"), (1, "write")):
    r = sorted(rows[ddir])
    stop_end = back_at if back_at else 10**9
    stall = f"{longest(r, 5000, stop_end)} ms"
    if back_at:
        stall += f" after the stop, {longest(r, back_at, 10**9)} ms after the return"
    before = [v for t, v in r if 1000 <= t < 5000]
    after = [v for t, v in r if r and t >= r[-1][0] - 5000]
    slowest = j[name]["clat_ns"]["max"] / 1e9
    parts.append(f"{name}s: longest stretch without one completed {stall}, "
                 f"slowest {slowest:.2f} s, IOPS before {avg(before):.0f} after {avg(after):.0f}")
print(f"{label}: " + "; ".join(parts) + f"; errors {j['error']}")
EOF
  if [ -n "$back" ]; then kill -TERM "$back"; wait "$back" 2>/dev/null || true; fi
  kill -INT "$up"
  wait "$up" 2>/dev/null || true
}

echo "node lease $TTL; fio 4K random reads and writes 50/50 QD16 through NBD; one node stopped 5 s in"
run kill-other other
run kill-leader leader
run stop-and-return other TERM
run kill-and-return other KILL
run freeze-and-continue other STOP
