#!/usr/bin/env bash
# Builds havip/havip-frr:<tag>: FRR's zebra, bgpd and bfdd (and vtysh) from this machine's
# Debian `frr` package, with exactly the shared libraries they load, on scratch — the image
# the chart's in-pod FRR runs (agent.bgp.frr.inPod) and the kind suite's router. Nothing is
# pulled; FRR is not rebuilt (the Debian binaries are copied, as a distribution image would).
#
#   hack/frr-image.sh              # havip/havip-frr:dev
#   IMAGE_PREFIX=… TAG=… hack/frr-image.sh
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="${IMAGE_PREFIX:-havip}"
tag="${TAG:-dev}"
[[ -x /usr/lib/frr/bgpd ]] || { echo "frr-image: Debian's frr is not installed (hack/prereqs.sh)" >&2; exit 1; }
ctx=target/images/frr
rm -rf "$ctx"; mkdir -p "$ctx/rootfs/etc" "$ctx/rootfs/var/run/frr" "$ctx/rootfs/etc/frr" "$ctx/rootfs/var/tmp/frr" "$ctx/rootfs/tmp"
bins=(/usr/lib/frr/zebra /usr/lib/frr/bgpd /usr/lib/frr/bfdd /usr/bin/vtysh)
files=("${bins[@]}")
for b in "${bins[@]}"; do
  # Libraries (`name => /path`) and the dynamic loader (`/lib64/ld-linux-….so.2`).
  while read -r lib; do files+=("$lib"); done < <(ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
done
for f in $(printf '%s\n' "${files[@]}" | sort -u); do
  cp --parents -L "$f" "$ctx/rootfs/"
done
# The daemons look their user and groups up by name (they run as root here: -u root -g root).
printf 'root:x:0:0:root:/root:/nonexistent\nfrr:x:100:101:frr:/var/run/frr:/nonexistent\n' >"$ctx/rootfs/etc/passwd"
printf 'root:x:0:\nfrr:x:101:root\nfrrvty:x:102:root\n' >"$ctx/rootfs/etc/group"
cat >"$ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
LABEL org.opencontainers.image.title="havip-frr" \
      org.opencontainers.image.description="FRR zebra, bgpd, bfdd and vtysh from Debian's frr package, for havip's in-pod BGP speaker"
COPY rootfs/ /
DOCKERFILE
docker build -q -t "${prefix}/havip-frr:${tag}" "$ctx" >"$ctx.log" 2>&1 || { cat "$ctx.log" >&2; exit 1; }
size=$(docker image inspect -f '{{.Size}}' "${prefix}/havip-frr:${tag}")
echo "${prefix}/havip-frr:${tag} $(( size / 1024 / 1024 )) MiB ($(dpkg-query -W -f '${Version}' frr))"
