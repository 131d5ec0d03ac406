#!/usr/bin/env bash
# Cargo tools `make lint` runs, built from crates.io into $HAVIP_CACHE/cargo-tools (pinned
# versions, --locked) once and reused: cargo-deny (licences, bans, sources, advisories) and
# cargo-machete (dependencies a crate declares but does not use). Prints the bin directory.
set -euo pipefail
root="${HAVIP_CACHE:-$HOME/.cache/havip}/cargo-tools"
mkdir -p "$root"
need() { # name version
  local bin="$root/bin/$1"
  if [[ -x "$bin" ]] && "$bin" --version 2>/dev/null | grep -Eq "(^| )$2\$"; then
    return 0
  fi
  echo "building $1 $2 into $root (once)" >&2
  cargo install --quiet --locked --root "$root" --version "$2" "$1" >&2
}
need cargo-deny "${CARGO_DENY_VERSION:-0.20.2}"
need cargo-machete "${CARGO_MACHETE_VERSION:-0.9.2}"
echo "$root/bin"
