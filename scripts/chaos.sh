#!/usr/bin/env bash
# Real-process chaos: a `basalt up --nodes 3` cluster (3 copies, min_size 2) under fio writes
# that verify, while faults hit the nodes one after another, 2 to 8 s apart (often before
# recovery from the last has finished: a PG may then wait for a node, never serve older data):
# SIGKILL (a crash) or SIGTERM (a clean stop) and a start with the node's own command line 1 to
# 6 s later, a SIGSTOP of 1 to 6 s (a frozen process: past the 3 s lease it is marked down
# while it holds requests, then runs on), or a SIGKILL of two nodes at once. Each fio round
# writes 128 MiB of mixed-size random blocks (`verify=crc32c`) over one of four 256 MiB
# regions, then reads every block it wrote back and checks it (`verify_fatal`); a failed
# check, a failed I/O (fio's error count) or a node that does not come back stops the run and
# keeps the logs. At the end every node runs, the cluster is waited on until every PG is
# clean, and the last four rounds' blocks (one per region) are checked again.
#
#   scripts/chaos.sh [BASALT_BINARY] [MINUTES] [SEED]   (defaults: target/release/basalt 10 1;
#   SEED seeds the choice of victims, signals and delays; the timing is not reproducible)
#
# Not in the test command (it runs for minutes); the seeded cluster simulation covers the same
# failures with injected time (docs/design/simulation.md). Needs fio with its nbd engine,
# etcd, python3.
set -euo pipefail
BASALT=$(realpath "${1:-target/release/basalt}")
MINUTES=${2:-10}
SEED=${3:-1}
WORK=$(mktemp -d -p "${TMPDIR:-/var/tmp}")
KEEP=0
cleanup() {
  kill $(jobs -p) 2>/dev/null || true
  # SIGKILL: a node may be stopped (SIGSTOP) right now, where a SIGTERM would wait.
  pkill -KILL -f -- "--data $WORK/d/" 2>/dev/null || true
  wait 2>/dev/null || true
  if [ "$KEEP" = 1 ]; then echo "logs kept in $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
# A command that fails outside `fail` (set -e) keeps the logs too, and says where.
trap 'KEEP=1; echo "FAILED at line $LINENO" >&2' ERR
fail() {
  KEEP=1
  echo "FAILED: $*" >&2
  tail -n 20 "$WORK"/*.log "$WORK"/d/*/*.log 2>/dev/null >&2 || true
  exit 1
}

"$BASALT" up --nodes 3 --data "$WORK/d" --device-size 2GiB --volume-size 1GiB \
  --lease-ttl 3s --nbd 127.0.0.1:0 >"$WORK/up.log" 2>&1 &
for _ in $(seq 1 900); do [ -f "$WORK/d/cluster.json" ] && break; sleep 0.1; done
[ -f "$WORK/d/cluster.json" ] || fail "basalt up did not start"
NBD=$(python3 -c "import json; print(json.load(open('$WORK/d/cluster.json'))['nbd_addr'])") ||
  fail "no NBD address in cluster.json"
URI="nbd://$NBD/vol0"

status() { "$BASALT" status --json --data "$WORK/d" 2>/dev/null; }
# The pid of each node process, by name (node1..node3), from the process table.
node_pid() { pgrep -f -- "--name $1 .*--data $WORK/d/$1\$" | head -n1; }
clean() {
  status | python3 -c "
import json, sys
s = json.load(sys.stdin)
p = s['pgs']
sys.exit(0 if p['total'] > 0 and p['active_clean'] == p['total'] else 1)" 2>/dev/null
}

# fio over round R's region (R mod 4 of the volume's four 256 MiB regions), its JSON output
# in OUT; extra args follow.
fio_round() { # R OUT [ARGS]
  local r=$1 out=$2
  shift 2
  fio --name="r$r" --ioengine=nbd --uri="$URI" --rw=randwrite \
    --bssplit=4k/50:64k/30:128k/20 --iodepth=16 --offset=$(((r % 4) * 256))m --size=256m \
    --io_size=128m --verify=crc32c --verify_fatal=1 --randseed="$r" \
    --output-format=json --output="$out" "$@" >>"$WORK/fio.log" 2>&1
}
fio_errors() {
  python3 -c "
import json, sys
t = open(sys.argv[1]).read()
j = json.loads(t[t.index('{'):])['jobs'][0]
print(j['error'], j['write']['total_ios'], j['read']['total_ios'])" "$1"
}

# Stops node NAME with signal SIG and waits until it has exited; prints its command line
# (NUL-separated) to FILE for `start`.
stop() { # NAME SIG FILE
  local pid
  pid=$(node_pid "$1") || true
  [ -n "$pid" ] || return 1
  cat "/proc/$pid/cmdline" >"$3" || return 1
  kill -"$2" "$pid" || return 1
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
}
start() { # NAME FILE
  local cmdline=()
  mapfile -d '' cmdline <"$2"
  # Detached from this shell's jobs (a later SIGKILL is not reported here), with the
  # environment `basalt up` gives its nodes.
  (env -u BASALT_ETCD_PREFIX "${cmdline[@]}" >>"$WORK/d/$1/restarted.log" 2>&1 &)
}
log() { echo "$(date +%T) $*" >>"$WORK/chaos.log"; }
# A node that should run and does not (it did not come back, or exited by itself): the
# chaos loop stops, and the round loop fails with WHY.
lost() { # WHY
  log "$1"
  echo "$1" >"$WORK/failed"
}

# One fault at a time, until the file `stop` exists (the fault under way is finished): a
# SIGKILL (2 in 5), a SIGTERM (1 in 5), a SIGSTOP for 1 to 6 s (1 in 5: a frozen process that
# loses its lease while it holds requests, then runs on), or a SIGKILL of two nodes at once (1
# in 5: below min_size, I/O waits until one returns).
chaos() {
  # Seeded here: a background subshell draws its own RANDOM sequence.
  RANDOM=$SEED
  local n=0
  while [ ! -e "$WORK/stop" ]; do
    sleep $((2 + RANDOM % 7))
    [ -e "$WORK/stop" ] && break
    n=$((n + 1))
    local a="node$((1 + RANDOM % 3))" kind=$((RANDOM % 5)) down=$((1 + RANDOM % 6))
    local b="node$((1 + (${a#node} % 3)))"
    case $kind in
    0 | 1 | 2)
      local sig=KILL
      [ "$kind" = 2 ] && sig=TERM
      log "#$n $sig $a, down ${down}s"
      stop "$a" "$sig" "$WORK/cmd.$a" || { lost "$a is not running"; return; }
      sleep "$down"
      start "$a" "$WORK/cmd.$a"
      ;;
    3)
      local pid
      pid=$(node_pid "$a") || true
      [ -n "$pid" ] || { lost "$a is not running"; return; }
      log "#$n STOP $a for ${down}s"
      kill -STOP "$pid" || { lost "$a exited before its SIGSTOP"; return; }
      sleep "$down"
      kill -CONT "$pid" || { lost "$a exited while stopped"; return; }
      ;;
    4)
      log "#$n KILL $a and $b, down ${down}s"
      stop "$a" KILL "$WORK/cmd.$a" || { lost "$a is not running"; return; }
      stop "$b" KILL "$WORK/cmd.$b" || { lost "$b is not running"; return; }
      sleep "$down"
      start "$a" "$WORK/cmd.$a"
      start "$b" "$WORK/cmd.$b"
      ;;
    esac
    log "#$n over"
  done
}

fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1m --iodepth=8 \
  --output="$WORK/fill.log" >/dev/null 2>&1 || fail "the first fill failed"
chaos &
CHAOS=$!
END=$(($(date +%s) + MINUTES * 60))
ROUNDS=0
while [ "$(date +%s)" -lt "$END" ]; do
  ROUNDS=$((ROUNDS + 1))
  fio_round "$ROUNDS" "$WORK/fio.$ROUNDS.json" ||
    fail "round $ROUNDS: fio failed ($(tail -n 3 "$WORK/fio.log" | tr '\n' ' '))"
  read -r err writes reads < <(fio_errors "$WORK/fio.$ROUNDS.json") || true
  [ "$err" = 0 ] || fail "round $ROUNDS: fio error ${err:-unreadable}"
  [ ! -e "$WORK/failed" ] || fail "$(cat "$WORK/failed")"
  kill -0 "$CHAOS" 2>/dev/null || fail "the chaos loop ended (see chaos.log)"
  echo "round $ROUNDS: $writes writes, $reads verified reads; $(grep -c ' over$' "$WORK/chaos.log" || true) faults so far"
done
touch "$WORK/stop"
wait "$CHAOS" || fail "the chaos loop failed"
[ ! -e "$WORK/failed" ] || fail "$(cat "$WORK/failed")"
for name in node1 node2 node3; do
  [ -n "$(node_pid "$name")" ] || fail "$name is not running at the end (see chaos.log)"
done
for _ in $(seq 1 1200); do clean && break; sleep 0.5; done
clean || fail "the PGs are not clean 10 minutes after the chaos ended: $(status | head -c 2000)"
# The last four rounds' regions are whole as their round left them.
for r in $(seq $((ROUNDS > 3 ? ROUNDS - 3 : 1)) "$ROUNDS"); do
  fio_round "$r" "$WORK/verify.$r.json" --verify_only ||
    fail "round $r's data does not verify after the chaos"
  read -r err _ reads < <(fio_errors "$WORK/verify.$r.json") || true
  [ "$err" = 0 ] || fail "round $r: verify error ${err:-unreadable}"
  echo "round $r verified again after the chaos: $reads reads"
done
echo "chaos: $ROUNDS rounds, $(grep -c ' over$' "$WORK/chaos.log" || true) faults ($(grep -c ' KILL ' "$WORK/chaos.log" || true) SIGKILL, $(grep -c ' TERM ' "$WORK/chaos.log" || true) SIGTERM, $(grep -c ' STOP ' "$WORK/chaos.log" || true) SIGSTOP), no acknowledged write lost"
