#!/usr/bin/env bash
# The previous release, for the kind suite's upgrade scenario
# (`helm_upgrade_from_the_previous_release_with_skewed_versions_loses_no_connect`): its chart
# and its operator and agent images, built here from this repository's own history — never
# pulled.
#
#   hack/previous-release.sh          # builds what is missing; prints the release directory
#   hack/previous-release.sh commit   # prints the pinned commit
#
# The previous release is pinned below: the last commit CI passed before the control-plane
# mode, the chaos run and the doctor landed (2026-12-03). havip has no tagged release yet;
# when it has, pin the last tag instead.
#
# The directory ($HAVIP_CACHE/previous/<commit>) holds `chart/` (charts/havip of that
# commit), `crds/` (its CRDs) and `commit`; the images are <prefix>/havip-operator:prev and
# <prefix>/havip-agent:prev (static release binaries on scratch, from that commit's
# Dockerfiles). The binaries are cached in the same directory (the build tree is removed),
# so later runs only build the images when Docker lacks them.
# Needs git history containing the commit, cargo, and a Docker engine (DOCKER_HOST).
set -euo pipefail
cd "$(dirname "$0")/.."
COMMIT="${HAVIP_PREVIOUS_RELEASE:-8b6f7f7bcb0ebb90a595adcbd12ed25c745fcecc}"
if [[ "${1:-}" == "commit" ]]; then echo "$COMMIT"; exit 0; fi
CACHE="${HAVIP_CACHE:-$HOME/.cache/havip}"
prefix="${IMAGE_PREFIX:-havip}"
dir="$CACHE/previous/$COMMIT"
log() { printf '[previous-release] %s\n' "$*" >&2; }

if ! git cat-file -e "$COMMIT^{commit}" 2>/dev/null && [[ "$(git rev-parse --is-shallow-repository)" == true ]]; then
  log "a shallow clone: fetching the history that holds $COMMIT"
  git fetch --quiet --unshallow >&2 || true
fi
git cat-file -e "$COMMIT^{commit}" 2>/dev/null || {
  log "commit $COMMIT is not in this repository's history (a shallow clone? git fetch --unshallow)"; exit 1; }
mkdir -p "$dir"
if [[ ! -f "$dir/.source-complete" ]]; then
  rm -rf "$dir/src"
  mkdir -p "$dir/src"
  git archive "$COMMIT" | tar -x -C "$dir/src"
  rm -rf "$dir/chart" "$dir/crds"
  cp -r "$dir/src/charts/havip" "$dir/chart"
  cp -r "$dir/src/charts/havip/charts/crds/crds" "$dir/crds"
  echo "$COMMIT" >"$dir/commit"
  touch "$dir/.source-complete"
fi

triple="$(rustc -vV | sed -n 's/^host: //p')"
if [[ ! -x "$dir/bin/havip-agent" || ! -x "$dir/bin/havip-operator" ]]; then
  log "building havip-operator and havip-agent of $COMMIT (release, static; minutes when cold)"
  (
    cd "$dir/src"
    RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C target-feature=+crt-static" CARGO_TARGET_DIR="$CACHE/previous/target" \
      cargo build --release --locked --target "$triple" \
      -p havip-operator --bin havip-operator -p havip-node-agent --bin havip-agent >&2
  )
  mkdir -p "$dir/bin"
  for b in havip-operator havip-agent; do
    install -m 0755 "$CACHE/previous/target/$triple/release/$b" "$dir/bin/$b"
    strip "$dir/bin/$b" 2>/dev/null || true
  done
  # The binaries are what is kept; the build tree (about 1 GiB) is not.
  rm -rf "$CACHE/previous/target"
fi

command -v docker >/dev/null || { log "docker (client) not found"; exit 1; }
for spec in operator:havip-operator:havip-operator agent:havip-agent:havip-agent; do
  IFS=: read -r file bin image <<<"$spec"
  ref="${prefix}/${image}:prev"
  want="$COMMIT"
  have=$(docker image inspect -f '{{ index .Config.Labels "io.havip.commit" }}' "$ref" 2>/dev/null || true)
  [[ "$have" == "$want" ]] && continue
  ctx="$dir/images/$file"
  rm -rf "$ctx"; mkdir -p "$ctx"
  cp "$dir/bin/$bin" "$ctx/"
  docker build -q --label "io.havip.commit=$COMMIT" -f "$dir/src/images/${file}.Dockerfile" -t "$ref" "$ctx" >/dev/null
  log "$ref built from $COMMIT"
done
echo "$dir"
