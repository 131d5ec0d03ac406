#!/usr/bin/env bash
# Starts (or stops) a Docker engine for building and running the havip images on a
# test machine: Debian's dockerd with --iptables=false and --bridge=none, so it does
# not touch iptables FORWARD or bridge filtering (which would break the test
# bridges), on a private socket. Prints the DOCKER_HOST line to eval.
#
#   eval "$(hack/dockerd.sh start)"    # export DOCKER_HOST=unix:///run/havip-docker/docker.sock
#   hack/dockerd.sh stop
set -euo pipefail
dir="${HAVIP_DOCKERD_DIR:-/run/havip-docker}"
sock="unix://${dir}/docker.sock"
case "${1:-start}" in
  start)
    if DOCKER_HOST="$sock" docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
      echo "export DOCKER_HOST=$sock"; exit 0
    fi
    command -v dockerd >/dev/null || { echo "dockerd not found (apt-get install docker.io)" >&2; exit 1; }
    mkdir -p "$dir"
    nohup dockerd --iptables=false --ip6tables=false --bridge=none \
      -H "$sock" --pidfile "$dir/docker.pid" --data-root "${HAVIP_DOCKERD_ROOT:-/var/lib/havip-docker}" \
      --exec-root "$dir/exec" >"$dir/dockerd.log" 2>&1 &
    for _ in $(seq 1 100); do
      if DOCKER_HOST="$sock" docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
        echo "export DOCKER_HOST=$sock"; exit 0
      fi
      sleep 0.2
    done
    echo "dockerd did not come up; see $dir/dockerd.log" >&2; tail -5 "$dir/dockerd.log" >&2; exit 1 ;;
  stop)
    if [[ -f "$dir/docker.pid" ]]; then kill "$(cat "$dir/docker.pid")" 2>/dev/null || true; fi ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
