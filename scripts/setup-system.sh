#!/usr/bin/env bash
# Installs the Debian packages agentrl's tests and sandboxes need. Idempotent.
set -euo pipefail
need=()
command -v unshare >/dev/null || need+=(util-linux)
command -v prlimit >/dev/null || need+=(util-linux)
# LocalSandbox: the sandbox sees only the system's /usr, so run_code("python") needs the
# Debian python3 (not a venv's or pyenv's), and its tests use ps.
[ -x /usr/bin/python3 ] || need+=(python3)
command -v ps >/dev/null || need+=(procps)
# The trajectory inspector's browser test (tests/integration/test_inspector_browser.py)
# drives Debian's headless Chromium.
command -v chromium >/dev/null || need+=(chromium)
if ((${#need[@]})); then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
