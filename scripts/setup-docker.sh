#!/usr/bin/env bash
# Makes a Docker engine answer on this machine. Idempotent; run as root.
#
#  1. installs docker.io (engine + CLI) and debootstrap (base images) if missing;
#  2. starts dockerd in the background if no engine answers: storage driver
#     overlay2, falling back to vfs; no bridge and no iptables (agentrl's
#     sandboxes have no network, so none is needed);
#  3. waits (bounded) until `docker info` answers, else prints the log's tail.
#
# Environment: AGENTRL_DOCKERD_LOG (default /var/log/agentrl-dockerd.log),
# AGENTRL_DOCKERD_WAIT_S (default 60), AGENTRL_DOCKERD_DATA_ROOT (default
# /var/lib/docker).
set -euo pipefail

LOG=${AGENTRL_DOCKERD_LOG:-/var/log/agentrl-dockerd.log}
WAIT_S=${AGENTRL_DOCKERD_WAIT_S:-60}
DATA_ROOT=${AGENTRL_DOCKERD_DATA_ROOT:-/var/lib/docker}

say() { echo "setup-docker: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

engine_up() { timeout 10 docker info >/dev/null 2>&1; }

if command -v docker >/dev/null 2>&1 && engine_up; then
  say "engine already answers"
  command -v debootstrap >/dev/null 2>&1 && exit 0
fi

SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    die "no Docker engine answers and this user ($(id -un)) is not root and has no" \
        "password-less sudo: cannot install or start one. Start dockerd as root" \
        "(or run this script as root), or point DOCKER_HOST at a running engine."
  fi
fi

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if ((${#need[@]})); then
  say "installing ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${need[@]}" >/dev/null
fi

engine_up && exit 0

start_dockerd() {  # $1 = storage driver
  say "starting dockerd (storage driver $1), log: $LOG"
  $SUDO mkdir -p "$DATA_ROOT" "$(dirname "$LOG")"
  # setsid + nohup: the daemon outlives this script and the shell that ran it. It must
  # not inherit this script's other file descriptors: a lock (`flock LOCK make test`) or
  # a pipe held by the daemon would be held for as long as the daemon runs.
  (
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      ((fd > 2)) && eval "exec $fd>&-"
    done 2>/dev/null
    exec $SUDO setsid nohup dockerd \
      --storage-driver="$1" \
      --data-root="$DATA_ROOT" \
      --iptables=false --ip6tables=false --bridge=none --ip-forward=false \
      >>"$LOG" 2>&1 </dev/null
  ) &
}

wait_engine() {  # $1 = seconds
  local deadline=$((SECONDS + $1))
  while ((SECONDS < deadline)); do
    engine_up && return 0
    pgrep -x dockerd >/dev/null 2>&1 || return 1
    sleep 0.5
  done
  return 1
}

stop_dockerd() {
  local pid
  pid=$(pgrep -x dockerd || true)
  [ -n "$pid" ] || return 0
  $SUDO kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  $SUDO kill -9 "$pid" 2>/dev/null || true
}

if pgrep -x dockerd >/dev/null 2>&1; then
  say "dockerd is running but not answering yet; waiting"
  wait_engine "$WAIT_S" && exit 0
  die "dockerd runs but does not answer after ${WAIT_S}s; log tail ($LOG):
$(tail -n 30 "$LOG" 2>/dev/null)"
fi

for driver in overlay2 vfs; do
  start_dockerd "$driver"
  if wait_engine "$WAIT_S"; then
    say "engine up ($(docker info --format '{{.Driver}}' 2>/dev/null))"
    exit 0
  fi
  say "dockerd with $driver did not come up; log tail:"
  tail -n 15 "$LOG" >&2 || true
  stop_dockerd
done
die "could not start a Docker engine (tried overlay2 and vfs); log tail ($LOG):
$(tail -n 30 "$LOG" 2>/dev/null)"
