#!/usr/bin/env bash
# Basalt in one command: installs what is needed (Debian packages, Rust), builds Basalt, starts a
# local cluster of three node processes keeping three copies of every object, with a volume
# (`basalt up --nodes 3`), and exercises it with real block clients: nbdinfo, fio (write +
# verify, then a short random read/write run), qemu-img; then kills one node with SIGKILL and
# verifies every block again from the two surviving copies. The cluster keeps running in the
# foreground until Ctrl-C (set QUICKSTART_EXIT=1 to stop right after the demo instead).
#
#   scripts/quickstart.sh [DATA_DIR]        default DATA_DIR: ./basalt-data
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DATA=${1:-$ROOT/basalt-data}
NBD=${BASALT_NBD:-127.0.0.1:10809}

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "Installing what Basalt needs"
scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

say "Building Basalt (release)"
cargo build --release --locked -p basalt
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/basalt

NODES=${QUICKSTART_NODES:-3}
say "Starting a local cluster of $NODES nodes: $BIN up --nodes $NODES --data $DATA"
mkdir -p "$DATA"
"$BIN" up --nodes "$NODES" --device-size "${QUICKSTART_DEVICE_SIZE:-2GiB}" --data "$DATA" --nbd "$NBD" \
  >"$DATA/up.log" 2>&1 &
UP=$!
trap 'kill -TERM $UP 2>/dev/null; wait $UP 2>/dev/null' EXIT
for _ in $(seq 1 600); do
  grep -q "Stop with Ctrl-C" "$DATA/up.log" 2>/dev/null && break
  kill -0 $UP 2>/dev/null || { cat "$DATA/up.log"; exit 1; }
  sleep 0.1
done
sed -n '/Basalt is up/,/Stop with/p' "$DATA/up.log"
export BASALT_DATA=$DATA

say "Volumes (basalt volume list)"
"$BIN" volume list

say "The export as an NBD client sees it (nbdinfo)"
nbdinfo "nbd://$NBD/vol0"

say "fio: write 256 MiB of mixed block sizes (4K-1M) and verify every block (crc32c)"
fio --name=write-verify --ioengine=nbd --uri="nbd://$NBD/vol0" --rw=randwrite \
    --bssplit=4k/40:64k/30:1m/30 --iodepth=16 --size=256m --verify=crc32c --verify_fatal=1 --verify_state_save=0 \
    --randseed=42 --group_reporting | grep -E "write:|read:|lat \(usec\): min|err="

# On the next 256 MiB: its writes reuse buffers its reads filled, so on the first 256 MiB they
# would overwrite the blocks the verify below checks with other blocks' fio headers.
say "fio: 10 s of 4K random read/write 70/30 at QD32 (every write durable on ack)"
fio --name=randrw --ioengine=nbd --uri="nbd://$NBD/vol0" --rw=randrw --rwmixread=70 --bs=4k \
    --iodepth=32 --runtime=10 --time_based --offset=256m --size=256m --group_reporting | grep -E "read:|write:|clat \(usec\)"

say "qemu-img: copy a 64 MiB image into a new volume and back out, byte for byte"
"$BIN" volume delete demo >/dev/null 2>&1 || true
"$BIN" volume create demo --size 64MiB >/dev/null
head -c 64M /dev/urandom >"$DATA/demo.raw"
qemu-img convert -n -f raw -O raw "$DATA/demo.raw" "nbd://$NBD/demo"
qemu-img convert -f raw -O raw "nbd://$NBD/demo" "$DATA/demo.back"
cmp "$DATA/demo.raw" "$DATA/demo.back" && echo "identical: $(stat -c %s "$DATA/demo.back") bytes"
rm -f "$DATA/demo.raw" "$DATA/demo.back"
"$BIN" volume delete demo

say "Cluster status (basalt status)"
"$BIN" status

if [ "$NODES" -ge 3 ]; then
  VICTIM=$(grep -o '"pid": *[0-9]*' "$DATA/cluster.json" | grep -o '[0-9]*$' | sed -n 2p)
  say "A failure: kill -9 of a node process (pid $VICTIM); its placement groups fail over"
  kill -9 "$VICTIM"
  say "fio: verify every block written above, now served by the two surviving copies"
  fio --name=write-verify --ioengine=nbd --uri="nbd://$NBD/vol0" --rw=randwrite \
      --bssplit=4k/40:64k/30:1m/30 --iodepth=16 --size=256m --verify=crc32c --verify_fatal=1 --verify_state_save=0 \
      --randseed=42 --verify_only --group_reporting | grep -E "read:|err="
  say "Cluster status after the failure (basalt status)"
  "$BIN" status
fi

if [ -n "${QUICKSTART_EXIT:-}" ]; then
  say "Stopping (QUICKSTART_EXIT is set)"
  exit 0
fi
say "Basalt keeps running: nbd://$NBD/vol0 — try 'basalt volume create NAME --size 8GiB'. Ctrl-C stops it."
echo "(binary: $BIN; data: $DATA; log: $DATA/up.log)"
trap - EXIT
trap 'kill -TERM $UP 2>/dev/null' INT TERM
wait $UP
