#!/usr/bin/env bash
# CPU cost per request of the NBD server, beside nbdkit's memory plugin on the same runs.
#
#   crates/nbd/scripts/bench-fio.sh            # RUNTIME=10 seconds per run, SIZE=1g
#
# For each server (ours with inline dispatch, ours with a task per request, nbdkit memory):
# start it on a free loopback port, fill the export with fio (1 MiB sequential writes), then run
# fio --ioengine=nbd 4K random reads and 4K random writes at QD64, and read the server's CPU
# time (utime+stime from /proc/PID/stat) before and after each run. Prints IOPS and server CPU
# microseconds per I/O. The machine's 2 cores are shared by fio and the server.
set -euo pipefail

RUNTIME=${RUNTIME:-10}
SIZE=${SIZE:-1g}
HERE=$(cd "$(dirname "$0")/../../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/target/nbd}
BIN=$CARGO_TARGET_DIR/release/examples/mem_server
TICK=$(getconf CLK_TCK)

(cd "$HERE" && cargo build --quiet --release -p basalt-nbd --example mem_server)

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

cpu_ticks() { # "utime stime" of a process, in clock ticks
    awk '{print $14, $15}' "/proc/$1/stat"
}

wait_ready() { # until nbdinfo can talk to the server (30 s at most)
    for _ in $(seq 300); do
        nbdinfo --size "$1" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "server at $1 did not come up" >&2
    return 1
}

run_fio() { # uri rw -> "iops total_ios"
    fio --name=bench --ioengine=nbd --uri="$1" --rw="$2" --bs=4k --iodepth=64 \
        --size="$SIZE" --time_based --runtime="$RUNTIME" --output-format=json 2>/dev/null |
        python3 -c '
import json, sys
text = sys.stdin.read()
job = json.loads(text[text.index("{"):])["jobs"][0]
side = job["read"] if job["read"]["total_ios"] else job["write"]
print(int(side["iops"]), side["total_ios"])'
}

measure() { # label pid uri
    local label=$1 pid=$2 uri=$3
    wait_ready "$uri"
    fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1m --iodepth=8 \
        --size="$SIZE" >/dev/null 2>&1
    for rw in randread randwrite; do
        local u0 s0 u1 s1 iops ios
        read -r u0 s0 < <(cpu_ticks "$pid")
        read -r iops ios < <(run_fio "$uri" "$rw")
        read -r u1 s1 < <(cpu_ticks "$pid")
        python3 -c "
us = lambda ticks: ticks / $TICK * 1e6 / $ios
usr, sys = us($u1 - $u0), us($s1 - $s0)
print(f'{\"$label\":<22} {\"$rw\":<10} {$iops:>7} IOPS  server CPU {usr + sys:5.2f} us/IO (user {usr:4.2f}, kernel {sys:4.2f})')"
    done
    kill "$pid"
    wait "$pid" 2>/dev/null || true
}

echo "fio 4K QD64, ${RUNTIME}s per run, export $SIZE"
for dispatch in inline spawn; do
    port=$(free_port)
    "$BIN" --port "$port" --size "$(numfmt --from=iec "${SIZE^^}")" --dispatch "$dispatch" >/dev/null &
    measure "basalt-nbd ($dispatch)" $! "nbd://127.0.0.1:$port/mem"
done
port=$(free_port)
nbdkit -f --exit-with-parent --port "$port" memory "$SIZE" &
measure "nbdkit memory" $! "nbd://127.0.0.1:$port/"
