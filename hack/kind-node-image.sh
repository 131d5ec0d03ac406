#!/usr/bin/env bash
# Builds the kind node image havip/kind-node:v1.37.2 without pulling anything: every
# binary is compiled from Go modules (or, for pause, from the C file shipped in the
# kubernetes module), the Debian root filesystems come from mmdebstrap, and kind's own
# node files (entrypoint, systemd units, containerd config) are taken from the kind
# module in the Go module cache at build time. Then the steps of `kind build
# node-image` are replayed by hand (it cannot be used: it pulls images).
#
#   hack/kind-node-image.sh [build]   build (or reuse) the image; prints its name last
#   hack/kind-node-image.sh check     exit 0 if the image is cached (Docker or $HAVIP_CACHE)
#   hack/kind-node-image.sh hash      print the content hash of the inputs
#   hack/kind-node-image.sh image     print the image name
#   hack/kind-node-image.sh binaries  only compile the binaries (into $HAVIP_CACHE)
#
# Cache: $HAVIP_CACHE/kind-node (default ~/.cache/havip/kind-node): compiled binaries per
# component version, the Debian root filesystems (tar) per package list, and the
# finished image as node-<hash>.tar.zst. The hash covers this script, hack/kind-node/,
# the component versions and the Go version; the image carries it as the label
# io.havip.kind-node.hash, so an unchanged input reuses the image in seconds.
#
# Needs: root, a Docker engine (DOCKER_HOST; `hack/dockerd.sh start`), Go, gcc,
# libseccomp-dev (runc), mmdebstrap, zstd, jq. Progress lines go to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

K8S_VERSION="${HAVIP_K8S_VERSION:-1.37.2}"
KIND_VERSION="${HAVIP_KIND_VERSION:-0.33.0}"
CONTAINERD_VERSION=2.3.4
RUNC_VERSION=1.4.3
CRICTL_VERSION=1.36.0
CNI_PLUGINS_VERSION=1.9.1
COREDNS_VERSION=1.14.6
ETCD_VERSION="${HAVIP_ETCD_VERSION:-3.7.0}"
PAUSE_VERSION=3.10.2
DEBIAN_SUITE=bookworm
CACHE="${HAVIP_CACHE:-$HOME/.cache/havip}"
W="$CACHE/kind-node"
IMAGE="${HAVIP_KIND_NODE_IMAGE:-havip/kind-node:v$K8S_VERSION}"
HASH_LABEL=io.havip.kind-node.hash
what="${1:-build}"

t0=$(date +%s)
step() { printf '[kind-node %4ss] %s\n' "$(( $(date +%s) - t0 ))" "$*" >&2; }
die() { step "error: $*"; exit 1; }

gomodcache=$(go env GOMODCACHE)
staging_version="v0.${K8S_VERSION#1.}"

# go_build <dir> <out-dir> <ldflags> <tags> <cgo> <package>...: `go build` of main
# packages inside <dir> (a module root), each binary into <out-dir>, with a progress
# line every 50 compiled packages.
go_build() {
  local dir="$1" out="$2" ldflags="$3" tags="$4" cgo="$5"
  shift 5
  mkdir -p "$out.tmp"
  (
    cd "$dir"
    local n=0
    CGO_ENABLED="$cgo" nice -n 10 go build -v -trimpath -tags "$tags" -ldflags="-s -w $ldflags" -o "$out.tmp/" "$@" 2>&1 |
      while IFS= read -r line; do
        n=$((n + 1))
        if (( n % 50 == 0 )); then step "  … $n packages compiled (last: $line)"; fi
        case "$line" in *.go:*) printf '%s\n' "$line" >&2 ;; esac
      done
    test "${PIPESTATUS[0]}" -eq 0
  )
  mkdir -p "$out"
  mv "$out.tmp"/* "$out/"
  rmdir "$out.tmp"
}

# The module's own directory in the module cache (downloaded if missing): building
# there uses the module's own go.mod and go.sum, exactly as a checkout of the tag.
module_dir() {
  go mod download -json "$1" | jq -r '.Dir // error(.Error)'
}

kube_bins() {
  local out="$W/bin/kubernetes-$K8S_VERSION"
  local tools=(kubelet kubeadm kube-proxy kube-controller-manager kube-scheduler)
  local missing=()
  for t in "${tools[@]}"; do [[ -x "$out/$t" ]] || missing+=("k8s.io/kubernetes/cmd/$t"); done
  if ((${#missing[@]})); then
    step "compiling ${missing[*]##*/} v$K8S_VERSION from k8s.io/kubernetes (the longest step: 10-25 min cold)"
    local work
    work=$(mktemp -d)
    go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" >/dev/null
    {
      echo "module havip.local/kind-node"
      echo "go 1.26"
      echo "require k8s.io/kubernetes v$K8S_VERSION"
      # k8s.io/kubernetes replaces its staging modules with local paths that are not
      # part of its module zip: point each at its published version instead.
      grep -E '^\s*k8s.io/[^ ]+ => ./staging/' "$gomodcache/k8s.io/kubernetes@v$K8S_VERSION/go.mod" |
        awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
    } >"$work/go.mod"
    for p in "${missing[@]}"; do (cd "$work" && GOFLAGS=-mod=mod go get -tool "$p" >&2 2>/dev/null); done
    local minor="${K8S_VERSION#1.}"
    minor="${minor%%.*}"
    local v="k8s.io/component-base/version"
    GOFLAGS=-mod=mod go_build "$work" "$out" \
      "-X $v.gitVersion=v$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=v$K8S_VERSION" \
      "" 0 "${missing[@]}"
    rm -rf "$work"
  fi
  # kube-apiserver, kubectl and etcd: the binaries the local control plane tests use.
  local tb
  tb=$(bash hack/testbin.sh control-plane 2>/dev/null | tail -1)
  for t in kube-apiserver kubectl etcd; do
    [[ -x "$out/$t" ]] || cp "$tb/$t" "$out/$t"
  done
  "$out/kubelet" --version >/dev/null || die "kubelet does not run"
}

containerd_bins() {
  local out="$W/bin/containerd-$CONTAINERD_VERSION"
  [[ -x "$out/containerd" && -x "$out/ctr" && -x "$out/containerd-shim-runc-v2" ]] && return
  step "compiling containerd v$CONTAINERD_VERSION (containerd, ctr, containerd-shim-runc-v2)"
  local dir pkg=github.com/containerd/containerd/v2
  dir=$(module_dir "$pkg@v$CONTAINERD_VERSION")
  go_build "$dir" "$out" \
    "-X $pkg/version.Version=v$CONTAINERD_VERSION -X $pkg/version.Package=$pkg" \
    "no_aufs no_zfs no_btrfs no_devmapper urfave_cli_no_docs" 0 ./cmd/containerd ./cmd/ctr ./cmd/containerd-shim-runc-v2
}

runc_bin() {
  local out="$W/bin/runc-$RUNC_VERSION"
  [[ -x "$out/runc" ]] && return
  step "compiling runc v$RUNC_VERSION (cgo, seccomp: needs libseccomp-dev; linked against Debian $DEBIAN_SUITE's libseccomp2)"
  [[ -e /usr/include/seccomp.h ]] || die "libseccomp-dev is missing (apt-get install libseccomp-dev)"
  local dir
  dir=$(module_dir "github.com/opencontainers/runc@v$RUNC_VERSION")
  go_build "$dir" "$out" "-X main.gitCommit=v$RUNC_VERSION" "seccomp urfave_cli_no_docs" 1 .
  mv "$out/runc@v$RUNC_VERSION" "$out/runc" 2>/dev/null || true
  [[ -x "$out/runc" ]] || mv "$out"/* "$out/runc"
}

crictl_bin() {
  local out="$W/bin/crictl-$CRICTL_VERSION"
  [[ -x "$out/crictl" ]] && return
  step "compiling crictl v$CRICTL_VERSION"
  local dir
  dir=$(module_dir "sigs.k8s.io/cri-tools@v$CRICTL_VERSION")
  go_build "$dir" "$out" "-X sigs.k8s.io/cri-tools/pkg/version.Version=v$CRICTL_VERSION" "" 0 ./cmd/crictl
}

cni_bins() {
  local out="$W/bin/cni-plugins-$CNI_PLUGINS_VERSION"
  [[ -x "$out/ptp" && -x "$out/host-local" && -x "$out/loopback" && -x "$out/portmap" ]] && return
  step "compiling CNI plugins v$CNI_PLUGINS_VERSION (ptp, host-local, loopback, portmap)"
  local dir
  dir=$(module_dir "github.com/containernetworking/plugins@v$CNI_PLUGINS_VERSION")
  go_build "$dir" "$out" "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=v$CNI_PLUGINS_VERSION" "" 0 \
    ./plugins/main/ptp ./plugins/ipam/host-local ./plugins/main/loopback ./plugins/meta/portmap
}

# CoreDNS with only the plugins kubeadm's Corefile uses (errors, health, ready,
# kubernetes, prometheus, forward, cache, loop, reload, loadbalance; plus log): CoreDNS's
# documented way to build a custom server, a main package that imports coremain and the
# plugins. The full plugin set compiles about four times as many packages.
COREDNS_PLUGINS=(cache errors forward health kubernetes loadbalance log loop metrics ready reload)
coredns_bin() {
  local out="$W/bin/coredns-$COREDNS_VERSION-kubeadm"
  [[ -x "$out/coredns" ]] && return
  step "compiling CoreDNS v$COREDNS_VERSION with the plugins kubeadm's Corefile uses (${COREDNS_PLUGINS[*]})"
  local work
  work=$(mktemp -d)
  {
    echo "module havip.local/coredns"
    echo "go 1.26"
    echo "require github.com/coredns/coredns v$COREDNS_VERSION"
  } >"$work/go.mod"
  {
    echo "// A CoreDNS server with the plugins of kubeadm's Corefile (hack/kind-node-image.sh)."
    echo "package main"
    echo "import ("
    echo "  \"github.com/coredns/coredns/coremain\""
    echo "  _ \"github.com/coredns/caddy/onevent\""
    for p in "${COREDNS_PLUGINS[@]}"; do echo "  _ \"github.com/coredns/coredns/plugin/$p\""; done
    echo ")"
    echo "func main() { coremain.Run() }"
  } >"$work/main.go"
  (cd "$work" && GOFLAGS=-mod=mod go mod tidy >&2 2>/dev/null)
  GOFLAGS=-mod=mod go_build "$work" "$out" "-X github.com/coredns/coredns/coremain.GitCommit=v$COREDNS_VERSION" "" 0 .
  [[ -x "$out/coredns" ]] || mv "$out"/* "$out/coredns"
  rm -rf "$work"
}

pause_bin() {
  local out="$W/bin/pause-$PAUSE_VERSION"
  [[ -x "$out/pause" ]] && return
  step "compiling pause $PAUSE_VERSION (gcc -static, pause.c of the kubernetes module)"
  mkdir -p "$out"
  go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" >/dev/null
  gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION-havip" \
    -o "$out/pause" "$gomodcache/k8s.io/kubernetes@v$K8S_VERSION/build/pause/linux/pause.c"
  strip "$out/pause"
}

binaries() {
  kube_bins
  containerd_bins
  runc_bin
  crictl_bin
  cni_bins
  coredns_bin
  pause_bin
  step "binaries ready in $W/bin"
}


kind_dir() {
  module_dir "sigs.k8s.io/kind@v$KIND_VERSION"
}

# The content hash of every input of the image.
content_hash() {
  {
    echo "k8s=$K8S_VERSION kind=$KIND_VERSION containerd=$CONTAINERD_VERSION runc=$RUNC_VERSION crictl=$CRICTL_VERSION"
    echo "cni=$CNI_PLUGINS_VERSION coredns=$COREDNS_VERSION etcd=$ETCD_VERSION pause=$PAUSE_VERSION debian=$DEBIAN_SUITE"
    go version
    cat "$repo/hack/kind-node-image.sh" "$repo"/hack/kind-node/*
  } | sha256sum | cut -c1-16
}

NODE_PACKAGES=(systemd dbus iptables nftables iproute2 kmod mount util-linux procps jq ca-certificates
  conntrack ethtool socat libseccomp2 pigz fuse-overlayfs e2fsprogs bash)
# kube-proxy and the CNI daemon: iptables/nftables, routes, and curl + jq for the API.
TOOLS_PACKAGES=(iptables nftables conntrack iproute2 kmod curl jq ca-certificates)

# rootfs_tar <name> <package>...: a Debian root filesystem as a tar in the cache (by
# suite and package list), from mmdebstrap; prints its path.
rootfs_tar() {
  local name="$1"
  shift
  local pkgs h tar
  pkgs=$(printf '%s\n' "$@" | sort -u | paste -sd, -)
  h=$(printf '%s %s v2' "$DEBIAN_SUITE" "$pkgs" | sha256sum | cut -c1-12)
  tar="$W/rootfs/$name-$DEBIAN_SUITE-$h.tar"
  if [[ ! -f "$tar" ]]; then
    command -v mmdebstrap >/dev/null || die "mmdebstrap is missing (apt-get install mmdebstrap)"
    step "Debian $DEBIAN_SUITE root filesystem '$name' (mmdebstrap --variant=minbase, $# packages, about a minute)"
    mkdir -p "$W/rootfs"
    rm -f "$W/rootfs/$name-"*.tar
    # Merged /usr by the hook rather than by the usrmerge package (which drags perl in);
    # no Recommends: the package lists name what the images need.
    nice -n 10 mmdebstrap --quiet --variant=minbase --format=tar --include="$pkgs" \
      --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr --aptopt='APT::Install-Recommends "false"' \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
      --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      "$DEBIAN_SUITE" "$tar.tmp" \
      "deb http://deb.debian.org/debian $DEBIAN_SUITE main" \
      "deb http://deb.debian.org/debian $DEBIAN_SUITE-updates main" \
      "deb http://deb.debian.org/debian-security $DEBIAN_SUITE-security main" >"$W/rootfs/$name.log" 2>&1 ||
      { tail -30 "$W/rootfs/$name.log" >&2; die "mmdebstrap failed (log: $W/rootfs/$name.log)"; }
    mv "$tar.tmp" "$tar"
  fi
  echo "$tar"
}

docker_build() {
  # docker_build <tag> <context dir>: the legacy builder, no network (nothing is pulled).
  DOCKER_BUILDKIT=0 docker build --network=none -q -t "$1" "$2" >"$2/build.log" 2>&1 ||
    { cat "$2/build.log" >&2; die "docker build of $1 failed"; }
}

# The images kubeadm and the default CNI run, named exactly as kubeadm expects them.
IMAGES=()
component_images() {
  local kb="$W/bin/kubernetes-$K8S_VERSION" ctx="$tmp/images" tools_tar
  tools_tar=$(rootfs_tar tools "${TOOLS_PACKAGES[@]}")
  step "component images (FROM scratch, kube-proxy and the CNI daemon on a small Debian root filesystem)"
  docker import "$tools_tar" "havip/kind-tools-base:$hash" >/dev/null
  mkimage() {
    # mkimage <tag> <base> <entrypoint json> <file:dest>...
    local tag="$1" base="$2" ep="$3" d
    shift 3
    d="$ctx/$(echo "$tag" | tr '/:' '__')"
    mkdir -p "$d"
    {
      echo "FROM $base"
      echo "ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin"
      for f in "$@"; do
        install -m 0755 "${f%%:*}" "$d/"
        echo "COPY $(basename "${f%%:*}") ${f#*:}"
      done
      [[ -n "$ep" ]] && echo "ENTRYPOINT $ep"
    } >"$d/Dockerfile"
    docker_build "$tag" "$d"
    IMAGES+=("$tag")
  }
  local r=registry.k8s.io v="v$K8S_VERSION"
  mkimage "$r/kube-apiserver:$v" scratch "" "$kb/kube-apiserver:/usr/local/bin/kube-apiserver"
  mkimage "$r/kube-controller-manager:$v" scratch "" "$kb/kube-controller-manager:/usr/local/bin/kube-controller-manager"
  mkimage "$r/kube-scheduler:$v" scratch "" "$kb/kube-scheduler:/usr/local/bin/kube-scheduler"
  mkimage "$r/etcd:$ETCD_VERSION-0" scratch "" "$kb/etcd:/usr/local/bin/etcd"
  mkimage "$r/coredns/coredns:v$COREDNS_VERSION" scratch '["/coredns"]' "$W/bin/coredns-$COREDNS_VERSION-kubeadm/coredns:/coredns"
  mkimage "$r/pause:$PAUSE_VERSION" scratch '["/pause"]' "$W/bin/pause-$PAUSE_VERSION/pause:/pause"
  mkimage "$r/kube-proxy:$v" "havip/kind-tools-base:$hash" "" "$kb/kube-proxy:/usr/local/bin/kube-proxy"
  mkimage "$CNI_IMAGE" "havip/kind-tools-base:$hash" '["/usr/local/bin/havip-kind-cni"]' "$repo/hack/kind-node/cni-routes.sh:/usr/local/bin/havip-kind-cni"
  # The sandbox image kind's containerd configuration names (it may differ from kubeadm's).
  local sandbox
  sandbox=$(sed -n 's/^\s*sandbox_image\s*=\s*"\(.*\)"/\1/p' "$kdir/images/base/files/etc/containerd/config.toml")
  if [[ -n "$sandbox" && "$sandbox" != "$r/pause:$PAUSE_VERSION" ]]; then
    docker tag "$r/pause:$PAUSE_VERSION" "$sandbox"
    IMAGES+=("$sandbox")
  fi
}

# The base image: Debian root filesystem + kind's node files + the binaries, one layer.
base_image() {
  local tag="$1" node_tar r kf
  node_tar=$(rootfs_tar node "${NODE_PACKAGES[@]}")
  step "assembling the node file system (kind v$KIND_VERSION images/base/files from the module cache + binaries)"
  r="$tmp/root"
  mkdir -p "$r"
  tar -xf "$node_tar" -C "$r"
  kf="$kdir/images/base/files"
  # What kind's images/base/Dockerfile does, in the same order.
  install -m 0755 "$kf"/usr/local/bin/* "$r/usr/local/bin/"
  mkdir -p "$r/kind" "$r/LICENSES"
  cp -r "$kf/kind/." "$r/kind/"
  chmod -R u+w,a+rX "$r/kind"
  find "$r/kind" -type f -exec chmod 0644 {} +
  chmod 0755 "$r/kind" "$r/kind/bin" "$r"/kind/bin/*
  install -m 0644 "$kf"/LICENSES/* "$r/LICENSES/"
  find "$kf/etc" -maxdepth 1 -type f -exec install -m 0644 {} "$r/etc/" \;
  for d in containerd default sysctl.d systemd/system systemd/system/kubelet.service.d; do
    mkdir -p "$r/etc/$d"
    find "$kf/etc/$d" -maxdepth 1 -type f -exec install -m 0644 {} "$r/etc/$d/" \;
  done
  find "$r/lib/systemd/system/sysinit.target.wants/" -name "systemd-tmpfiles-setup.service" -delete
  rm -f "$r"/lib/systemd/system/multi-user.target.wants/* "$r"/etc/systemd/system/*.wants/* \
    "$r"/lib/systemd/system/local-fs.target.wants/* "$r"/lib/systemd/system/sockets.target.wants/*udev* \
    "$r"/lib/systemd/system/sockets.target.wants/*initctl* "$r"/lib/systemd/system/basic.target.wants/*
  echo "ReadKMsg=no" >>"$r/etc/systemd/journald.conf"
  ln -sf /usr/lib/systemd/systemd "$r/sbin/init"
  systemctl --root="$r" enable kubelet.service containerd.service undo-mount-hacks.service >/dev/null 2>&1
  systemctl --root="$r" mask systemd-binfmt.service >/dev/null 2>&1
  mkdir -p "$r/etc/kubernetes/manifests" "$r/opt/cni/bin" "$r/usr/local/sbin"
  local cb="$W/bin/containerd-$CONTAINERD_VERSION"
  install -m 0755 "$cb/containerd" "$cb/ctr" "$cb/containerd-shim-runc-v2" "$W/bin/crictl-$CRICTL_VERSION/crictl" "$r/usr/local/bin/"
  install -m 0755 "$W/bin/runc-$RUNC_VERSION/runc" "$r/usr/local/sbin/runc"
  install -m 0755 "$W/bin/cni-plugins-$CNI_PLUGINS_VERSION"/* "$r/opt/cni/bin/"
  install -m 0755 "$W/bin/kubernetes-$K8S_VERSION"/{kubeadm,kubelet,kubectl} "$r/usr/bin/"
  # kind's base image: the default OCI spec with its product_uuid hook and no rlimits.
  "$cb/ctr" oci spec |
    jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' |
    jq 'del(.process.rlimits)' >"$r/etc/containerd/cri-base.json"
  # Where the machine cannot grant CAP_SYS_RESOURCE (a VM whose bounding set lacks it),
  # no process may lower its oom_score_adj, and runc fails on the negative scores the
  # kubelet gives critical pods. containerd then clamps the score to its own; on other
  # machines this changes nothing that matters (containerd runs at -999).
  sed -i 's/^\(\s*restrict_oom_score_adj\s*=\s*\)false/\1true/' "$r/etc/containerd/config.toml"
  grep -q 'restrict_oom_score_adj = true' "$r/etc/containerd/config.toml" || die "could not set restrict_oom_score_adj in kind's containerd config"
  # What `kind build node-image` writes.
  echo "v$K8S_VERSION" >"$r/kind/version"
  mkdir -p "$r/kind/manifests"
  sed "s|@CNI_IMAGE@|docker.io/$CNI_IMAGE|" "$repo/hack/kind-node/cni.yaml" >"$r/kind/manifests/default-cni.yaml"
  install -m 0644 "$repo/hack/kind-node/storage.yaml" "$r/kind/manifests/default-storage.yaml"
  step "importing the node file system as $tag"
  tar -C "$r" -c . | docker import - "$tag-rootfs" >/dev/null
  rm -rf "$r"
  # `docker import --change` knows no STOPSIGNAL: the metadata of kind's base image in
  # a Dockerfile (no RUN: nothing is executed).
  mkdir -p "$tmp/base"
  cat >"$tmp/base/Dockerfile" <<DOCKERFILE
FROM $tag-rootfs
# systemd in a container (https://systemd.io/CONTAINER_INTERFACE/); it exits on SIGRTMIN+3.
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]
DOCKERFILE
  docker_build "$tag" "$tmp/base"
}

# Loads the images into the node's containerd (namespace k8s.io, pinned, not unpacked)
# in a build container, then commits it: the replay of `kind build node-image`.
node_image() {
  local base="$1" c="havip-kind-build-$$"
  step "importing ${#IMAGES[@]} images into containerd in a build container ($c)"
  docker run -d --name "$c" --entrypoint=sleep --security-opt seccomp=unconfined "$base" infinity >/dev/null
  build_container="$c"
  docker exec "$c" bash -c 'nohup containerd >/dev/null 2>&1 &'
  docker exec "$c" bash -c 'for i in $(seq 1 50); do [ -S /run/containerd/containerd.sock ] && ctr version >/dev/null 2>&1 && exit 0; sleep 0.2; done; exit 1' ||
    die "containerd did not start in the build container"
  docker save "${IMAGES[@]}" | docker exec -i "$c" ctr --namespace=k8s.io images import \
    --label=io.cri-containerd.pinned=pinned --all-platforms --no-unpack --digests - >/dev/null 2>"$tmp/import.log" ||
    { cat "$tmp/import.log" >&2; die "ctr images import failed"; }
  local names
  names=$(docker exec "$c" ctr --namespace=k8s.io images list -q 2>/dev/null | grep -v -e '^sha256:' -e '^import-')
  step "  $(wc -l <<<"$names") images in the node's containerd:"
  sed 's/^/[kind-node]     /' <<<"$names" >&2
  docker exec "$c" pkill containerd || true
  # `sleep` (PID 1 of the build container) reaps nothing: a stopped containerd stays
  # as a zombie, so wait for no live one.
  docker exec "$c" bash -c 'for i in $(seq 1 100); do ps -C containerd -o stat= | grep -qv "^Z" || exit 0; sleep 0.2; done; exit 1' ||
    die "containerd did not stop in the build container"
  step "committing $IMAGE"
  local previous
  previous=$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
  docker commit \
    --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' \
    --change "LABEL $HASH_LABEL=$hash" \
    "$c" "$IMAGE" >/dev/null
  # The image this one replaces, unless a container (a running cluster) still uses it.
  [[ -n "$previous" ]] && docker rmi "$previous" >/dev/null 2>&1 || true
}

cleanup() {
  [[ -n "${build_container:-}" ]] && docker rm -f -v "$build_container" >/dev/null 2>&1
  [[ -n "${tmp:-}" && -d "$tmp" ]] && rm -rf "$tmp"
  if ((${#IMAGES[@]})); then docker rmi "${IMAGES[@]}" >/dev/null 2>&1 || true; fi
  docker rmi "havip/kind-tools-base:${hash:-none}" "havip/kind-node-base:${hash:-none}" \
    "havip/kind-node-base:${hash:-none}-rootfs" >/dev/null 2>&1 || true
}

image_hash() {
  docker image inspect -f "{{index .Config.Labels \"$HASH_LABEL\"}}" "$IMAGE" 2>/dev/null || true
}

# 0 when the image for this hash is in Docker or in the cache (loading it from there).
cached() {
  local load="$1"
  [[ "$(image_hash)" == "$hash" ]] && return 0
  local tar="$W/node-$hash.tar.zst"
  [[ -f "$tar" ]] || return 1
  [[ "$load" == load ]] || return 0
  step "loading $IMAGE from $tar"
  zstd -dcq "$tar" | docker load -q >/dev/null
  [[ "$(image_hash)" == "$hash" ]]
}

build() {
  command -v docker >/dev/null || die "docker (client) not found"
  docker version --format '{{.Server.Version}}' >/dev/null 2>&1 ||
    die "no Docker engine reachable (DOCKER_HOST=${DOCKER_HOST:-unset}); try: eval \$(hack/dockerd.sh start)"
  if cached load; then
    step "$IMAGE is up to date (inputs $hash)"
    echo "$IMAGE"
    return
  fi
  step "building $IMAGE (inputs $hash): Kubernetes v$K8S_VERSION, containerd v$CONTAINERD_VERSION, runc v$RUNC_VERSION, kind v$KIND_VERSION node files"
  binaries
  kdir=$(kind_dir)
  mkdir -p "$W"
  tmp=$(mktemp -d "$W/tmp.XXXXXX")
  trap cleanup EXIT
  base_image "havip/kind-node-base:$hash"
  component_images
  node_image "havip/kind-node-base:$hash"
  step "saving $IMAGE to $W/node-$hash.tar.zst (the cache for the next machine state without this Docker engine's data)"
  rm -f "$W"/node-*.tar.zst
  docker save "$IMAGE" | zstd -T0 -3 -q -o "$W/node-$hash.tar.zst.tmp"
  mv "$W/node-$hash.tar.zst.tmp" "$W/node-$hash.tar.zst"
  local size
  size=$(docker image inspect -f '{{.Size}}' "$IMAGE")
  step "built $IMAGE ($(( size / 1024 / 1024 )) MiB) in $(( $(date +%s) - t0 ))s"
  echo "$IMAGE"
}

hash=$(content_hash)
CNI_IMAGE="havip/kind-cni:v$K8S_VERSION-$hash"
case "$what" in
  build) build ;;
  check)
    if cached noload; then echo "$IMAGE cached (inputs $hash)"; else echo "$IMAGE not cached (inputs $hash)"; exit 1; fi ;;
  hash) echo "$hash" ;;
  image) echo "$IMAGE" ;;
  binaries) binaries ;;
  *) echo "usage: $0 [build|check|hash|image|binaries]" >&2; exit 2 ;;
esac
