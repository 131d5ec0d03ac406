#!/usr/bin/env bash
# Builds the havip images: static release binaries (glibc, +crt-static, so a
# `FROM scratch` image needs nothing else and no base image is pulled), one build
# context per image under target/images/, then `docker build`.
#
#   hack/images.sh                 # havip/havip-operator:dev, havip/havip-agent:dev, havip/havip-e2e-tools:dev, havip/havip-frr:dev
#   IMAGE_PREFIX=ghcr.io/me TAG=0.1.0 hack/images.sh
#   hack/images.sh --binaries-only # just the static binaries
#
# Needs a Docker engine (DOCKER_HOST or the default socket); `hack/dockerd.sh start`
# starts Debian's dockerd in a way that leaves the test bridges alone.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="${IMAGE_PREFIX:-havip}"
tag="${TAG:-dev}"
triple="$(rustc -vV | sed -n 's/^host: //p')"
out="target/${triple}/release"

echo "images: static binaries for ${triple} (cargo build --release, +crt-static)" >&2
RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C target-feature=+crt-static" cargo build --release --target "$triple" \
  -p havip-operator --bin havip-operator \
  -p havip-node-agent --bin havip-agent \
  -p havip-e2e --bin e2e-tool
for b in havip-operator havip-agent e2e-tool; do
  if ldd "$out/$b" >/dev/null 2>&1 && ! ldd "$out/$b" 2>&1 | grep -q "statically linked"; then
    echo "images: $out/$b is not static:" >&2; ldd "$out/$b" >&2; exit 1
  fi
done
[[ "${1:-}" == "--binaries-only" ]] && exit 0

command -v docker >/dev/null || { echo "images: docker (client) not found" >&2; exit 1; }
docker version --format '{{.Server.Version}}' >/dev/null 2>&1 || {
  echo "images: no Docker engine reachable (DOCKER_HOST=${DOCKER_HOST:-unset}); try: eval \$(hack/dockerd.sh start)" >&2; exit 1; }
for spec in operator:havip-operator:havip-operator agent:havip-agent:havip-agent e2e-tools:e2e-tool:havip-e2e-tools; do
  IFS=: read -r file bin image <<<"$spec"
  ctx="target/images/${file}"
  rm -rf "$ctx"; mkdir -p "$ctx"
  cp "$out/$bin" "$ctx/"
  strip "$ctx/$bin" 2>/dev/null || true
  if ! docker build -q -f "images/${file}.Dockerfile" -t "${prefix}/${image}:${tag}" "$ctx" >"$ctx.log" 2>&1; then
    cat "$ctx.log" >&2; exit 1
  fi
  size=$(docker image inspect -f '{{.Size}}' "${prefix}/${image}:${tag}")
  echo "${prefix}/${image}:${tag} $(( size / 1024 / 1024 )) MiB"
done
# havip-frr: Debian's FRR for the chart's in-pod speaker (agent.bgp.frr.inPod), where FRR is
# installed here (hack/prereqs.sh installs it).
if [[ -x /usr/lib/frr/bgpd ]]; then
  IMAGE_PREFIX="$prefix" TAG="$tag" bash hack/frr-image.sh
fi
