#!/usr/bin/env bash
# Installs the Debian packages agentrl's tests and sandboxes need. Idempotent.
set -euo pipefail
need=()
for pkg in "$@"; do :; done
command -v unshare >/dev/null || need+=(util-linux)
command -v prlimit >/dev/null || need+=(util-linux)
if ((${#need[@]})); then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
