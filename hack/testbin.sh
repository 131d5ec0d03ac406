#!/usr/bin/env bash
# Provides pinned, real test binaries (kube-apiserver, etcd, kubectl, and optionally helm, kind
# and MetalLB) for the havip test suites.
#
#   hack/testbin.sh [control-plane|helm|kind|metallb|promtool|prometheus|all]   (default: control-plane)
#
# `metallb` builds MetalLB's controller and speaker (go.universe.tf/metallb, test tooling only:
# bench-failover's `metallb-l2` rows and tests/metallb_l2.rs) and copies its CRDs from the
# module into the same cache directory; nothing of MetalLB is vendored into this repository.
#
# Prints the directory that holds the binaries as its last line.
#
# Sources, in order:
#   1. $KUBEBUILDER_ASSETS, when it names a directory that holds kube-apiserver and etcd
#      and kubectl (the layout `setup-envtest use -p path` produces): used as is.
#   2. The cache $HAVIP_CACHE/testbin/<versions> (default ~/.cache/havip): reused when present.
#   3. Otherwise built from Go modules with the Go toolchain into that cache. The first
#      build of kube-apiserver takes several minutes on 2 cores; progress is shown.
set -euo pipefail

K8S_VERSION="${HAVIP_K8S_VERSION:-1.37.2}"
ETCD_VERSION="${HAVIP_ETCD_VERSION:-3.7.0}"
HELM_VERSION="${HAVIP_HELM_VERSION:-3.22.0}"
KIND_VERSION="${HAVIP_KIND_VERSION:-0.33.0}"
# promtool (github.com/prometheus/prometheus v0.316.0 is Prometheus 3.x's module version):
# `promtool test rules` evaluates the chart's alert rules in tests/chart_render.rs; the
# Prometheus server of the same version scrapes a live lab and runs every dashboard query
# (tests/dashboard_live.rs).
PROMETHEUS_VERSION="${HAVIP_PROMETHEUS_VERSION:-0.316.0}"
# Must match e2e/src/harness/testbin.rs (METALLB_VERSION).
METALLB_VERSION="${HAVIP_METALLB_VERSION:-0.15.2}"
CACHE="${HAVIP_CACHE:-$HOME/.cache/havip}"
what="${1:-control-plane}"

log() { printf '[testbin] %s\n' "$*" >&2; }

# Staging modules of k8s.io/kubernetes are published as k8s.io/<name> v0.<minor>.<patch>.
staging_version="v0.${K8S_VERSION#1.}"

build_module_tool() {
  # build_module_tool <workdir> <out> <package> [extra ldflags] [module version for go get]
  # Without a version, `go get` takes the package's module at its latest release.
  local work="$1" out="$2" pkg="$3" ldflags="${4:-}" version="${5:-}"
  (
    cd "$work"
    log "resolving $pkg${version:+@$version} (go get -tool)"
    GOFLAGS=-mod=mod go get -tool "$pkg${version:+@$version}" >&2
    log "compiling $pkg → $out (this can take minutes; go build -v lists packages as they compile)"
    local n=0
    GOFLAGS=-mod=mod CGO_ENABLED=0 go build -v -trimpath -ldflags="-s -w $ldflags" -o "$out.tmp" "$pkg" 2>&1 |
      while IFS= read -r line; do
        n=$((n + 1))
        if (( n % 50 == 0 )); then log "  … $n packages compiled (last: $line)"; fi
      done
    test "${PIPESTATUS[0]}" -eq 0
    mv "$out.tmp" "$out"
  )
}

control_plane() {
  if [[ -n "${KUBEBUILDER_ASSETS:-}" && -x "$KUBEBUILDER_ASSETS/kube-apiserver" && -x "$KUBEBUILDER_ASSETS/etcd" && -x "$KUBEBUILDER_ASSETS/kubectl" ]]; then
    log "using binaries from KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"
    echo "$KUBEBUILDER_ASSETS"
    return
  fi
  local dir="$CACHE/testbin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
  mkdir -p "$dir"
  if [[ ! -x "$dir/kube-apiserver" || ! -x "$dir/kubectl" ]]; then
    log "building kube-apiserver and kubectl v$K8S_VERSION from Go modules"
    local work
    work=$(mktemp -d)
    (
      cd "$work"
      go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" >/dev/null
      local kmod
      kmod=$(go env GOMODCACHE)/k8s.io/kubernetes@v$K8S_VERSION/go.mod
      {
        echo "module havip.local/testbin"
        echo "go 1.26"
        echo "require k8s.io/kubernetes v$K8S_VERSION"
        # k8s.io/kubernetes replaces its staging modules with local paths, which
        # `go get` cannot follow: point each at its published version instead.
        grep -E '^\s*k8s.io/[^ ]+ => ./staging/' "$kmod" | awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
      } >go.mod
    )
    local minor="${K8S_VERSION#1.}"
    minor="${minor%%.*}"
    # Stamp the version the way the Kubernetes release build does, so that discovery
    # (`kubectl version`) reports it.
    local v="k8s.io/component-base/version"
    local stamp="-X $v.gitVersion=v$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=v$K8S_VERSION"
    for tool in kube-apiserver kubectl; do
      [[ -x "$dir/$tool" ]] || build_module_tool "$work" "$dir/$tool" "k8s.io/kubernetes/cmd/$tool" "$stamp"
    done
    rm -rf "$work"
  fi
  if [[ ! -x "$dir/etcd" ]]; then
    log "building etcd v$ETCD_VERSION from Go modules"
    local work2
    work2=$(mktemp -d)
    (
      cd "$work2"
      {
        echo "module havip.local/testbin-etcd"
        echo "go 1.26"
        echo "require go.etcd.io/etcd/server/v3 v$ETCD_VERSION"
        # The etcd server module replaces its sibling modules with ../ paths.
        for m in api/v3 client/pkg/v3 client/v3 pkg/v3; do
          echo "replace go.etcd.io/etcd/$m => go.etcd.io/etcd/$m v$ETCD_VERSION"
        done
      } >go.mod
    )
    build_module_tool "$work2" "$dir/etcd" go.etcd.io/etcd/server/v3
    rm -rf "$work2"
  fi
  "$dir/kube-apiserver" --version >&2
  "$dir/kubectl" version --client 2>/dev/null | sed -n 1p >&2
  "$dir/etcd" --version | sed -n 1p >&2
  echo "$dir"
}

simple_tool() {
  # simple_tool <name> <module/pkg> <version>
  local name="$1" pkg="$2" version="$3"
  local dir="$CACHE/testbin/$name-$version"
  mkdir -p "$dir"
  if [[ ! -x "$dir/$name" ]]; then
    log "building $name v$version from Go modules"
    GOBIN="$dir" CGO_ENABLED=0 go install -trimpath "$pkg@v$version" >&2
  fi
  echo "$dir"
}

metallb() {
  # MetalLB's go.mod has no replace directives, so its packages build as tools of a tiny
  # module that requires exactly that version (the same build list as MetalLB's own).
  local dir="$CACHE/testbin/metallb-$METALLB_VERSION"
  local mod="go.universe.tf/metallb"
  mkdir -p "$dir"
  if [[ ! -x "$dir/controller" || ! -x "$dir/speaker" ]]; then
    log "building the MetalLB controller and speaker v$METALLB_VERSION from Go modules"
    local work
    work=$(mktemp -d)
    printf 'module havip.local/testbin-metallb\ngo 1.26\nrequire %s v%s\n' "$mod" "$METALLB_VERSION" >"$work/go.mod"
    for tool in controller speaker; do
      [[ -x "$dir/$tool" ]] || build_module_tool "$work" "$dir/$tool" "$mod/$tool" "" "v$METALLB_VERSION"
    done
    rm -rf "$work"
  fi
  if [[ ! -f "$dir/crds/.complete" ]]; then
    # The CRDs as released with this version: the module's config/crd/bases (the kustomize
    # patch that adds the BGPPeer conversion webhook is not applied: the lab runs no webhook).
    local src
    src=$(go mod download -json "$mod@v$METALLB_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [[ -d "$src/config/crd/bases" ]] || { log "no config/crd/bases in $mod@v$METALLB_VERSION ($src)"; exit 1; }
    rm -rf "$dir/crds"
    mkdir -p "$dir/crds"
    install -m 0644 "$src"/config/crd/bases/*.yaml "$dir/crds/"
    touch "$dir/crds/.complete"
    log "copied $(ls "$dir/crds" | wc -l) MetalLB CRDs from $src/config/crd/bases"
  fi
  log "MetalLB v$METALLB_VERSION: controller, speaker and $(ls "$dir/crds" | wc -l) CRDs in $dir"
  echo "$dir"
}

case "$what" in
  control-plane) control_plane ;;
  metallb) metallb ;;
  helm) simple_tool helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" ;;
  kind) simple_tool kind sigs.k8s.io/kind "$KIND_VERSION" ;;
  promtool) simple_tool promtool github.com/prometheus/prometheus/cmd/promtool "$PROMETHEUS_VERSION" ;;
  prometheus) simple_tool prometheus github.com/prometheus/prometheus/cmd/prometheus "$PROMETHEUS_VERSION" ;;
  all)
    simple_tool helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" >/dev/null
    simple_tool kind sigs.k8s.io/kind "$KIND_VERSION" >/dev/null
    metallb >/dev/null
    control_plane
    ;;
  *) echo "usage: $0 [control-plane|helm|kind|metallb|promtool|prometheus|all]" >&2; exit 2 ;;
esac
