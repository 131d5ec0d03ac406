#!/usr/bin/env bash
# `make kind-e2e`: havip's end-to-end scenarios on a kind cluster built entirely on this
# machine. In order: a Docker engine (hack/dockerd.sh, unless DOCKER_HOST is set), the
# test binaries (kind, helm, kubectl), havip's images (hack/images.sh), the previous
# release's chart and images (hack/previous-release.sh, cached), the kind node
# image (hack/kind-node-image.sh, cached), `kind-e2e up` (cluster, `kind load`, helm
# install, responders), `kind-e2e run` (every scenario, one JSON line each), and
# `kind-e2e down` — also when something failed, after `kind export logs`.
#
#   hack/kind-e2e.sh [kind-e2e run flags, e.g. --only NAME]
#   HAVIP_KIND_KEEP=1 hack/kind-e2e.sh     # keep the cluster afterwards (make kind-down)
#
# Logs and timings: $HAVIP_KIND_LOGS (default /tmp/havip-kind/logs): timings.jsonl (one
# line per phase), results.jsonl (one line per scenario), and on failure kind's node
# logs (journal, kubelet, containerd, pod logs) under export/.
set -euo pipefail
cd "$(dirname "$0")/.."
logs="${HAVIP_KIND_LOGS:-/tmp/havip-kind/logs}"
mkdir -p "$logs"
: >"$logs/timings.jsonl"
t0=$(date +%s)
log() { printf '[kind-e2e %5ss] %s\n' "$(( $(date +%s) - t0 ))" "$*" >&2; }

# phase <name> <command…>: runs it, records its duration.
phase() {
  local name="$1" s rc=0
  shift
  s=$(date +%s)
  log "$name …"
  "$@" || rc=$?
  local d=$(( $(date +%s) - s ))
  printf '{"phase":"%s","seconds":%d,"ok":%s}\n' "$name" "$d" "$([[ $rc == 0 ]] && echo true || echo false)" >>"$logs/timings.jsonl"
  log "$name: $([[ $rc == 0 ]] && echo done || echo "FAILED (exit $rc)") in ${d}s"
  return "$rc"
}

if [[ -z "${DOCKER_HOST:-}" ]]; then eval "$(bash hack/dockerd.sh start)"; fi
export DOCKER_HOST
kind="$(bash hack/testbin.sh kind | tail -1)/kind"
helm="$(bash hack/testbin.sh helm | tail -1)/helm"
kubectl="$(bash hack/testbin.sh control-plane 2>/dev/null | tail -1)/kubectl"

phase images nice -n 10 bash hack/images.sh
# The previous release's chart and images for the upgrade scenario (built from this
# repository's history once, cached in $HAVIP_CACHE/previous/).
phase previous-release nice -n 10 bash hack/previous-release.sh >"$logs/previous-release.dir"
previous=$(tail -1 "$logs/previous-release.dir")
phase node-image bash hack/kind-node-image.sh >/dev/null
node_image=$(bash hack/kind-node-image.sh image)
phase build-suite nice -n 10 cargo build -q -p havip-e2e --bin kind-e2e -p kubectl-havip
suite=(./target/debug/kind-e2e --kind "$kind" --helm "$helm" --kubectl "$kubectl" --node-image "$node_image"
  --previous-release "$previous")

down() {
  local rc=$?
  if [[ $rc != 0 ]]; then
    log "exporting the cluster's logs to $logs/export"
    rm -rf "$logs/export"
    "$kind" export logs "$logs/export" --name havip-e2e >/dev/null 2>&1 || true
  fi
  if [[ -n "${HAVIP_KIND_KEEP:-}" ]]; then
    log "keeping the cluster (HAVIP_KIND_KEEP): make kind-down deletes it"
  else
    phase cluster-delete "${suite[@]}" down || true
  fi
  log "total $(( $(date +%s) - t0 ))s; timings in $logs/timings.jsonl"
  exit "$rc"
}
trap down EXIT
phase cluster-up "${suite[@]}" up
phase scenarios bash -c 'set -o pipefail; "$@" | tee "'"$logs"'/results.jsonl"' _ "${suite[@]}" run "$@"
