#!/usr/bin/env bash
# Starts (or stops) a Docker engine for building and running the havip images on a
# test machine: Debian's dockerd with --iptables=false and --bridge=none, so it does
# not touch iptables FORWARD or bridge filtering (which would break the test
# bridges), on a private socket. Prints the DOCKER_HOST line to eval.
#
# When this machine's capability bounding set lacks capabilities the kernel knows (a VM
# without CAP_SYS_RESOURCE, for instance), every `--privileged` container (a kind node)
# would fail with "unable to apply caps"; then the engine runs containers through
# hack/runc-caps-wrapper.sh (copied next to the socket), which drops the unavailable
# capabilities from each container's spec.
#
#   eval "$(hack/dockerd.sh start)"    # export DOCKER_HOST=unix:///run/havip-docker/docker.sock
#   hack/dockerd.sh stop
set -euo pipefail
dir="${HAVIP_DOCKERD_DIR:-/run/havip-docker}"
sock="unix://${dir}/docker.sock"
case "${1:-start}" in
  start)
    last=$(cat /proc/sys/kernel/cap_last_cap)
    bnd=$((16#$(awk '/^CapBnd:/ {print $2}' /proc/self/status)))
    if DOCKER_HOST="$sock" docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
      if (( bnd != (1 << (last + 1)) - 1 )) && [[ "$(DOCKER_HOST="$sock" docker info --format '{{.DefaultRuntime}}' 2>/dev/null)" != havip-runc ]]; then
        echo "dockerd: the running engine does not use the capability wrapper this machine needs for --privileged containers (kind nodes): restart it with hack/dockerd.sh stop; hack/dockerd.sh start" >&2
      fi
      echo "export DOCKER_HOST=$sock"; exit 0
    fi
    command -v dockerd >/dev/null || { echo "dockerd not found (apt-get install docker.io)" >&2; exit 1; }
    mkdir -p "$dir"
    runtime=()
    if (( bnd != (1 << (last + 1)) - 1 )); then
      install -m 0755 "$(dirname "$0")/runc-caps-wrapper.sh" "$dir/runc-caps-wrapper"
      runtime=(--add-runtime "havip-runc=$dir/runc-caps-wrapper" --default-runtime havip-runc)
      echo "dockerd: the capability bounding set lacks some capabilities (CapBnd=$(awk '/^CapBnd:/ {print $2}' /proc/self/status)): containers run through $dir/runc-caps-wrapper" >&2
    fi
    nohup dockerd --iptables=false --ip6tables=false --bridge=none "${runtime[@]}" \
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
