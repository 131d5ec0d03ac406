#!/usr/bin/env bash
# Installs what a make target needs on this machine, saying what and why.
#
#   hack/prereqs.sh demo    before `make demo`: network namespaces, nftables, setpriv
#   hack/prereqs.sh demo-bgp  before `make demo-bgp`: the above and FRR
#   hack/prereqs.sh test    before `make test`: the above, keepalived, faketime, a C toolchain
#   hack/prereqs.sh ci      before CI's `make test`: the above, Docker and the kind image tools
#   hack/prereqs.sh kind    before the kind suite (make kind-e2e, kind-up, kind-node-image): as ci
#   hack/prereqs.sh check <target>   only report what is missing (exit 1 if anything is)
#   hack/prereqs.sh list <target>    print the target's packages, one per line
#
# Debian packages are installed with apt-get when the machine has it and this runs as
# root; otherwise it prints the exact command to run and stops (demo, ci) or carries on
# with a warning (test: without root the network-namespace suites skip themselves, and
# they are the ones that need these tools). Rust (cargo) and Go are not installed here:
# the message says where to get them.
set -euo pipefail

what="${1:-}"
mode=install
if [[ "$what" == check || "$what" == list ]]; then
  mode="$what"
  what="${2:-}"
fi

say() { printf '[prereqs] %s\n' "$*" >&2; }

# package|command that proves it is there|why
demo_pkgs=(
  "iproute2|ip|network namespaces, veth cables and bridges of the lab nodes (ip netns, ip link)"
  "nftables|nft|the lab's cable cuts and packet loss (nft rules inside the node namespaces)"
  "util-linux|setpriv|child processes that die with the lab (setpriv --pdeathsig)"
)
frr_pkg="frr|/usr/lib/frr/bgpd|the routed lab: FRR (zebra, bgpd, bfdd) on the router and the members (BGP mode)"
demo_bgp_pkgs=(
  "${demo_pkgs[@]}"
  "$frr_pkg"
)
test_pkgs=(
  "${demo_pkgs[@]}"
  "keepalived|keepalived|the side-by-side tests and benchmarks against keepalived VRRP"
  "faketime|faketime|an agent whose wall clock stepped (libfaketime)"
  "$frr_pkg"
  "bird2|bird|the routed lab with BIRD as the members' BGP speaker"
  "make|make|the build entry points"
  "gcc|gcc|crates with build scripts (ring) and the pause binary of the kind image"
  "pkg-config|pkg-config|crates that locate system libraries"
  "ca-certificates|update-ca-certificates|fetching crates and Go modules over TLS"
)
ci_pkgs=(
  "${test_pkgs[@]}"
  "docker.io|dockerd|building the container images (and the kind suite's cluster)"
  "mmdebstrap|mmdebstrap|the Debian root file systems of the kind node image"
  "libseccomp-dev|/usr/include/seccomp.h|runc for the kind node image"
  "zstd|zstd|the kind node image cache"
  "jq|jq|the kind node image build"
)

case "$what" in
  demo) pkgs=("${demo_pkgs[@]}") ;;
  demo-bgp) pkgs=("${demo_bgp_pkgs[@]}") ;;
  test) pkgs=("${test_pkgs[@]}") ;;
  # The kind suite's entry points (make kind-e2e, kind-up, kind-node-image) need what CI
  # needs: Docker, and what builds the offline node image.
  ci|kind) pkgs=("${ci_pkgs[@]}") ;;
  *)
    echo "usage: hack/prereqs.sh [check|list] demo|demo-bgp|test|ci|kind" >&2
    exit 2
    ;;
esac

if [[ "$mode" == list ]]; then
  for entry in "${pkgs[@]}"; do
    echo "${entry%%|*}"
  done
  exit 0
fi

present() {
  local probe="$1"
  if [[ "$probe" == /* ]]; then
    [[ -e "$probe" ]]
  else
    command -v "$probe" >/dev/null 2>&1 || [[ -x "/usr/sbin/$probe" || -x "/sbin/$probe" ]]
  fi
}

missing=()
for entry in "${pkgs[@]}"; do
  IFS='|' read -r pkg probe why <<<"$entry"
  if ! present "$probe"; then
    missing+=("$pkg")
    say "missing: $pkg ($probe) — needed for $why"
  fi
done

toolchain_ok=1
if ! command -v cargo >/dev/null 2>&1; then
  say "missing: cargo — install Rust with rustup (https://rustup.rs); rust-toolchain.toml pins the version"
  toolchain_ok=0
fi
if [[ "$what" != demo* ]] && ! command -v go >/dev/null 2>&1; then
  say "missing: go — the test tooling (kube-apiserver, etcd, kubectl, helm, kind) is built from Go modules; install Go 1.25 or newer from https://go.dev/dl"
  toolchain_ok=0
fi

if ((${#missing[@]} == 0)); then
  ((toolchain_ok)) || exit 1
  exit 0
fi

cmd="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if [[ "$mode" == check ]]; then
  say "to install them: $cmd"
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  say "this machine has no apt-get: install the packages above (or their equivalents) with its package manager"
  exit 1
fi
if [[ $(id -u) -ne 0 ]]; then
  if [[ "$what" == test ]]; then
    say "not root: not installing. The suites that need these run only as root and skip themselves now; to run them: sudo sh -c '$cmd' && sudo make test"
    exit 0
  fi
  say "not root: cannot install. Run: sudo sh -c '$cmd'"
  exit 1
fi

say "installing with apt-get: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  say "apt-get failed (its output is above); the command was: $cmd"
  rm -f "$log"
  exit 1
fi
rm -f "$log"
# keepalived's, frr's, bird2's and docker.io's packages start daemons: the tests run their own instances
# (docker's own service would set the iptables FORWARD policy to DROP).
if command -v systemctl >/dev/null 2>&1; then
  for m in "${missing[@]}"; do
    case "$m" in
      keepalived) systemctl disable --now keepalived >/dev/null 2>&1 || true ;;
      frr) systemctl disable --now frr >/dev/null 2>&1 || true ;;
      bird2) systemctl disable --now bird >/dev/null 2>&1 || true ;;
      docker.io) systemctl disable --now docker.socket docker >/dev/null 2>&1 || true ;;
    esac
  done
fi
say "installed: ${missing[*]}"
((toolchain_ok)) || exit 1
