#!/usr/bin/env bash
# Cargo tools built from crates.io into $HAVIP_CACHE/cargo-tools (pinned versions, --locked)
# once and reused. Without arguments the ones `make lint` runs: cargo-deny (licences, bans,
# sources, advisories) and cargo-machete (dependencies a crate declares but does not use);
# `hack/cargo-tools.sh mdbook` the one `make docs` runs. Prints the bin directory.
set -euo pipefail
root="${HAVIP_CACHE:-$HOME/.cache/havip}/cargo-tools"
mkdir -p "$root"
need() { # name version
  local bin="$root/bin/$1"
  if [[ -x "$bin" ]] && "$bin" --version 2>/dev/null | grep -Eq "(^| |v)$2\$"; then
    return 0
  fi
  echo "building $1 $2 into $root (once)" >&2
  cargo install --quiet --locked --root "$root" --version "$2" "$1" >&2
}
if [[ $# -eq 0 ]]; then
  set -- cargo-deny cargo-machete
fi
for tool in "$@"; do
  case "$tool" in
    cargo-deny) need cargo-deny "${CARGO_DENY_VERSION:-0.20.2}" ;;
    cargo-machete) need cargo-machete "${CARGO_MACHETE_VERSION:-0.9.2}" ;;
    mdbook) need mdbook "${MDBOOK_VERSION:-0.5.4}" ;;
    *) echo "hack/cargo-tools.sh: unknown tool $tool" >&2; exit 2 ;;
  esac
done
echo "$root/bin"
