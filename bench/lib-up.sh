# Sourced by bench scripts (not run): a fresh `basalt up` in a temporary directory, its 1 GiB
# volume written once so that reads hit written data.
#
#   start_filled_up BASALT NODES   NODES 0: single-node `basalt up`, else `--nodes NODES`;
#                                  UP_ARGS adds options to `basalt up`
#
# Sets WORK (a temporary directory, removed at exit, when every background job is killed),
# UP (the pid of `basalt up`) and URI (the volume's NBD URI).
start_filled_up() {
  local basalt=$1 nodes=$2 port shape extra
  WORK=$(mktemp -d -p "${TMPDIR:-/var/tmp}")
  # errexit applies inside the trap too: a `kill` with no job left must not skip the removal.
  trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  shape=(--listen 127.0.0.1:0)
  [ "$nodes" -gt 0 ] && shape=(--nodes "$nodes")
  read -r -a extra <<<"${UP_ARGS:-}"
  "$basalt" up --data "$WORK/d" "${shape[@]}" "${extra[@]}" --device-size 1536MiB \
    --volume-size 1GiB --nbd "127.0.0.1:$port" >"$WORK/up.log" 2>&1 &
  UP=$!
  for _ in $(seq 1 600); do
    grep -q "Stop with Ctrl-C" "$WORK/up.log" && break
    kill -0 "$UP" 2>/dev/null || { cat "$WORK/up.log"; exit 1; }
    sleep 0.1
  done
  URI="nbd://127.0.0.1:$port/vol0"
  fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1M --iodepth=8 --size=1G >/dev/null
}
