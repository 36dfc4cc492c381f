#!/usr/bin/env bash
# Installs everything Basalt needs to build, run and test on Debian 12 (bookworm):
#   - build: a C toolchain (for crates with C parts), protoc (etcd-client), pkg-config
#   - run:   nothing beyond the binary (etcd only for multi-process clusters)
#   - test:  etcd-server, fio, nbdkit, libnbd tools, qemu-img, jq; iproute2 and nftables for the
#            multi-host tests (network namespaces, bridges, packet filters; they need root)
#   - Rust:  rustup stable if cargo is missing (Debian's rustc is too old for edition 2024)
# Idempotent: packages already present are skipped, so a second run takes a second.
set -euo pipefail

PACKAGES=(
  build-essential pkg-config protobuf-compiler libprotobuf-dev
  etcd-server etcd-client fio nbdkit libnbd-bin python3-libnbd qemu-utils
  jq iproute2 nftables procps psmisc mount curl ca-certificates
)

log() { printf '[setup] %s\n' "$*"; }

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  log "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  # No service is started by the packages we need (etcd is started by Basalt's tests and by
  # `basalt up --etcd` on loopback ports of their choosing).
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  log "Debian packages: all present"
fi

if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    log "installing Rust (rustup, stable)"
    curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component clippy,rustfmt
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
fi
need_minor=95
have_minor=$(rustc --version | sed -E 's/^rustc 1\.([0-9]+).*/\1/')
if [ "$have_minor" -lt "$need_minor" ]; then
  log "rustc 1.$have_minor is older than 1.$need_minor; updating the stable toolchain"
  rustup update stable
fi
log "toolchain: $(rustc --version)"
