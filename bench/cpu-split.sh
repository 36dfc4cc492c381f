#!/usr/bin/env bash
# Where all of the machine's CPU goes per I/O, not only the server's: one fio job through NBD
# against a fresh `basalt up` (single node, or `--nodes N`), a system-wide `perf record -a -g`
# over the middle of the run, each sample put in one bucket: idle, kernel workers (direct-I/O
# completions, the block layer), and for basalt and fio their user code and their time in
# io_uring submissions, TCP sends, TCP receives, epoll waits and interrupts. Also, from
# `basalt status --json` before and after the run, how the journal batched: writes per journal
# record, records written with RWF_DSYNC (a lone record: no flush after it), flushes.
# bench/cpu-per-io.sh splits the server's CPU process by process; this adds fio, the kernel's
# workers and idle time: the whole budget of a CPU-bound run.
#
#   bench/cpu-split.sh [BASALT_BINARY] [RW] [IODEPTH] [NODES]
#     defaults: target/release/basalt randwrite 64 3   (NODES 0: single-node `basalt up`)
#   UP_ARGS="--local-gateway" bench/cpu-split.sh ...   adds options to `basalt up`
#
# Needs fio with its nbd engine, perf, python3; etcd for NODES > 0. Numbers, not assertions:
# the profile itself costs some CPU, and this VM is shared and noisy.
set -euo pipefail
BASALT=$(realpath "${1:-target/release/basalt}")
RW=${2:-randwrite}
QD=${3:-64}
NODES=${4:-3}
# shellcheck source=bench/lib-up.sh
source "$(dirname "$0")/lib-up.sh"
start_filled_up "$BASALT" "$NODES"
"$BASALT" status --data "$WORK/d" --json >"$WORK/status0.json"
fio --name=j --ioengine=nbd --uri="$URI" --rw="$RW" --bs=4k --iodepth="$QD" --size=1G \
  --runtime=12 --time_based --ramp_time=2 --randseed=1 --output-format=json \
  >"$WORK/fio.out" 2>/dev/null &
FIO=$!
sleep 4
perf record -a -g -o "$WORK/perf.data" -- sleep 6 >/dev/null 2>&1
wait "$FIO"
"$BASALT" status --data "$WORK/d" --json >"$WORK/status1.json"
perf script -i "$WORK/perf.data" -F comm,ip,sym >"$WORK/stacks" 2>/dev/null

python3 - "$WORK" <<'PY'
import collections, json, re, sys
work = sys.argv[1]
text = open(f"{work}/fio.out").read()
job = json.loads(text[text.index("{"):])["jobs"][0]
iops = job["read"]["iops"] + job["write"]["iops"]
print(f"{iops:.0f} IOPS (fio's whole run; the profile covers 6 s of it)")

samples, cur, comm = [], [], None
for line in open(f"{work}/stacks"):
    s = line.rstrip()
    if not s:
        if cur:
            samples.append((comm, cur))
        cur = []
    elif not line[0].isspace():
        comm = s.split()[0]
    else:
        parts = s.split(None, 1)
        cur.append(re.sub(r"\+0x[0-9a-f]+$", "", parts[-1]))
if cur:
    samples.append((comm, cur))

def bucket(comm, frames):
    joined = " ".join(frames)
    if comm.startswith("swapper"):
        return "idle (and interrupts taken there)"
    if comm.startswith("kworker"):
        if "iomap_dio" in joined or "dio" in comm:
            return "kernel workers: direct-I/O completions"
        return "kernel workers: other (block layer)"
    who = comm if comm in ("basalt", "fio", "etcd") else "other processes"
    for key, name in (("io_uring_enter", "io_uring submissions"), ("tcp_sendmsg", "TCP send"),
                      ("tcp_recvmsg", "TCP receive"), ("epoll_wait", "epoll wait"),
                      ("handle_softirqs", "interrupts"), ("common_interrupt", "interrupts")):
        if key in joined:
            return f"{who}: {name}"
    if "do_syscall_64" in joined:
        return f"{who}: other system calls"
    return f"{who}: user code"

counts = collections.Counter(bucket(c, f) for c, f in samples)
n = len(samples)
print(f"{'where':<45} {'share':>6}")
for k, v in counts.most_common():
    if v / n >= 0.002:
        print(f"{k:<45} {v / n * 100:>5.1f}%")

def devices(doc):
    found = {}
    def walk(x):
        if isinstance(x, dict):
            if "journal_records" in x and "writes" in x and "id" in x:
                found[x["id"]] = x
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(doc)
    return found

before = devices(json.load(open(f"{work}/status0.json")))
after = devices(json.load(open(f"{work}/status1.json")))
print(f"{'device':<8} {'writes':>8} {'per record':>11} {'RWF_DSYNC records':>18} {'flushes':>8}")
for dev, b in sorted(after.items()):
    a = before.get(dev, {})
    d = {k: b[k] - a.get(k, 0) for k in ("writes", "journal_records", "durable_records", "flushes")}
    rec = max(d["journal_records"], 1)
    print(f"{dev!s:<8} {d['writes']:>8} {d['writes'] / rec:>11.1f} "
          f"{d['durable_records'] / rec * 100:>17.0f}% {d['flushes']:>8}")
PY
