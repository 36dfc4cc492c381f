#!/usr/bin/env bash
# The floor under a durable replicated write on one shared disk: what this disk takes for a 4K
# write followed by fdatasync at QD1, and for a 4K O_DSYNC write, for one writer and for three
# writers at once (three
# copies of `basalt up --nodes 3` share one disk, so each replicated write waits for three such
# flushes). No server is involved: fio's psync engine on files in DIR.
#
#   bench/disk-floor.sh [DIR] [RUNTIME_SECONDS]     (default: a temporary directory, 10)
#
# Needs fio. Numbers, not assertions.
set -euo pipefail
DIR=${1:-}
RUNTIME=${2:-10}
if [ -z "$DIR" ]; then
  DIR=$(mktemp -d -p "${TMPDIR:-/var/tmp}")
  trap 'rm -rf "$DIR"' EXIT
fi
for jobs in 1 3; do
  fio --name=floor --directory="$DIR" --filename_format='floor.$jobnum' --size=256m \
    --rw=randwrite --bs=4k --iodepth=1 --direct=1 --fdatasync=1 --ioengine=psync \
    --numjobs="$jobs" --group_reporting --runtime="$RUNTIME" --time_based --output-format=json |
    python3 -c '
import json, sys
text = sys.stdin.read()
j = json.loads(text[text.index("{"):])["jobs"][0]
w, s = j["write"], j["sync"]
print("%d writer(s): %.0f durable 4K writes/s in all; each write %.0f us + fdatasync %.0f us = %.0f us" % (
    int(sys.argv[1]), w["iops"], w["clat_ns"]["mean"] / 1000, s["lat_ns"]["mean"] / 1000,
    (w["clat_ns"]["mean"] + s["lat_ns"]["mean"]) / 1000))' "$jobs"
  # The same writes each durable by itself (O_DSYNC, as RWF_DSYNC: the store's lone journal
  # record): one request where the above takes two.
  fio --name=floor --directory="$DIR" --filename_format='floor.$jobnum' --size=256m \
    --rw=randwrite --bs=4k --iodepth=1 --direct=1 --sync=dsync --ioengine=psync \
    --numjobs="$jobs" --group_reporting --runtime="$RUNTIME" --time_based --output-format=json |
    python3 -c '
import json, sys
text = sys.stdin.read()
j = json.loads(text[text.index("{"):])["jobs"][0]
w = j["write"]
print("%d writer(s): %.0f durable 4K writes/s in all; each O_DSYNC write %.0f us" % (
    int(sys.argv[1]), w["iops"], w["clat_ns"]["mean"] / 1000))' "$jobs"
done
