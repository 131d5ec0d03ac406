#!/usr/bin/env bash
# `make demo`: step 1 (build havip, showing progress but not a line per crate), then
# `lab demo` runs steps 2–9 against a new lab that it leaves running. `--bgp` (`make
# demo-bgp`): the routed tour (a router with FRR, a VIP advertised over BGP).
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO="${CARGO:-cargo}"

if [[ $(id -u) -ne 0 ]]; then
  echo "make demo needs root: it creates network namespaces (run it as root, or with sudo -E)" >&2
  exit 1
fi

bgp=
[[ "${1:-}" == --bgp ]] && bgp=--bgp
if [[ -n "$bgp" ]]; then
  echo "havip demo (routed): a VIP advertised over BGP by the holder's FRR, a router in front, a cut cable and a planned failover, all on this machine"
else
  echo "havip demo: a floating IP on a pair of nodes, a cut cable and a planned failover, all on this machine"
fi
echo
# nftables, iproute2 and util-linux (and FRR for --bgp) through apt-get where missing
# (it says what and why).
bash hack/prereqs.sh "demo${bgp:+-bgp}"
echo "[1/9] building havip (cargo build --workspace --bins; the first build takes several minutes) …"
start=$SECONDS
if [[ -t 2 ]]; then
  # On a terminal: cargo's progress bar only (-q alone would hide it too).
  CARGO_TERM_PROGRESS_WHEN=always CARGO_TERM_PROGRESS_WIDTH="$(tput cols 2>/dev/null || echo 80)" \
    "$CARGO" build -q --workspace --bins
else
  # Otherwise a line every 25 crates (about 230 from scratch); warnings and errors as
  # cargo prints them.
  "$CARGO" build --color never --workspace --bins 2>&1 | awk '
    /^ *Compiling / { n++; if (n % 25 == 0) printf "      … %d crates compiled (last: %s %s)\n", n, $2, $3; fflush(); next }
    /^ *(Finished|Locking|Updating|Downloading|Downloaded|Blocking|Adding) / { next }
    { print; fflush() }'
fi
took=$((SECONDS - start))
if ((took >= 60)); then took="$((took / 60)) min $((took % 60)) s"; else took="$took s"; fi
echo "      built in $took: havip-agent, havip-operator, kubectl-havip and the lab in target/debug"
exec ./target/debug/lab demo $bgp
