#!/usr/bin/env bash
# Builds the real control plane (kube-apiserver, kube-scheduler, kube-controller-manager,
# kubectl, etcd, kwok), helm (the chart's tests), kustomize (README's `kustomize edit`),
# gpuqueue-argocd-lua (Argo CD's Lua
# interpreter for the health check's tests) and gpuqueue-flux-health (Flux's kstatus and CEL
# health checks, for theirs), and fetches the Prometheus Operator's CRDs (the chart's tests),
# from the Go module proxy at the versions pinned in e2e/tools/*/go.mod; caches them outside
# the repository, keyed by version and lockfile hash, so a second run does nothing.
#
# Usage: e2e/scripts/build-tools.sh        prints the binary directory on its last line
#        e2e/scripts/build-tools.sh --real-node
#                                           also builds kubelet (same module) and our fake
#                                           device plugin, for e2e/kubelet/ (opt-in: slow)
#        e2e/scripts/build-tools.sh --containerd
#                                           also builds containerd v2 and its runc shim, for a
#                                           real node with the Evented PLEG (opt-in)
#        e2e/scripts/build-tools.sh --peers also builds Kueue, the peer `make bench-peers`
#                                           measures against (opt-in: ~280 CPU-seconds, 1.9 GB)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
tools="$here/tools"
cache_root=${GPUQUEUE_E2E_CACHE:-$HOME/.cache/gpuqueue-e2e}

export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"

# version_of MODULE DIR: the version DIR's go.mod requires of MODULE.
version_of() { sed -n "s|^[[:space:]]*\(require[[:space:]]*\)\{0,1\}$1 \(v[^ ]*\).*|\2|p" "$2/go.mod" | head -n1; }
lock_hash() { cat "$1/go.mod" "$1/go.sum" $(ls "$1"/*.go 2>/dev/null) | sha256sum | cut -c1-12; }

k8s_version=$(version_of k8s.io/kubernetes "$tools/k8s")
etcd_version=$(version_of go.etcd.io/etcd/server/v3 "$tools/etcd")
kwok_version=$(version_of sigs.k8s.io/kwok "$tools/kwok")
helm_version=$(version_of helm.sh/helm/v4 "$tools/helm")
kustomize_version=$(version_of sigs.k8s.io/kustomize/kustomize/v5 "$tools/kustomize")

k8s_dir="$cache_root/kubernetes-$k8s_version-$(lock_hash "$tools/k8s")"
etcd_dir="$cache_root/etcd-$etcd_version-$(lock_hash "$tools/etcd")"
kwok_dir="$cache_root/kwok-$kwok_version-$(lock_hash "$tools/kwok")"
helm_dir="$cache_root/helm-$helm_version-$(lock_hash "$tools/helm")"
kustomize_dir="$cache_root/kustomize-$kustomize_version-$(lock_hash "$tools/kustomize")"
bin_dir="$cache_root/bin-k8s-$k8s_version-etcd-$etcd_version-kwok-$kwok_version"

real_node=false peers=false containerd=false
for arg in "$@"; do
  case $arg in
    --real-node) real_node=true ;;
    --containerd) containerd=true ;;
    --peers) peers=true ;;
    *) echo "build-tools.sh: unknown flag $arg (known: --real-node, --containerd, --peers)" >&2; exit 2 ;;
  esac
done

log() { printf '[build-tools] %s\n' "$*" >&2; }

argocd_lua_dir="$cache_root/argocd-lua-$(lock_hash "$tools/argocd-lua")"
flux_health_dir="$cache_root/flux-health-$(lock_hash "$tools/flux-health")"
prometheus_crds_dir="$cache_root/prometheus-operator-crds-$(lock_hash "$tools/prometheus-operator")"
kubelet_dir="$cache_root/kubelet-$k8s_version-$(lock_hash "$tools/kubelet")"
plugin_dir="$cache_root/deviceplugin-$(lock_hash "$tools/deviceplugin")"
containerd_version=$(version_of github.com/containerd/containerd/v2 "$tools/containerd")
containerd_dir="$cache_root/containerd-$containerd_version-$(lock_hash "$tools/containerd")"
kueue_version=$(version_of sigs.k8s.io/kueue "$tools/kueue")
kueue_dir="$cache_root/kueue-$kueue_version-$(lock_hash "$tools/kueue")"

# Everything this call needs, named by version and lock hash: when a finished run left its
# stamp, print the directory without waiting on the lock (a long opt-in build, such as
# Kueue's, must not hold up every test that only needs the cached control plane).
needed="$k8s_dir $etcd_dir $kwok_dir $helm_dir $kustomize_dir $argocd_lua_dir $flux_health_dir $prometheus_crds_dir"
$real_node && needed="$needed $kubelet_dir $plugin_dir"
$containerd && needed="$needed $containerd_dir"
$peers && needed="$needed $kueue_dir"
stamp="$bin_dir/.ready-$(echo "$needed" | sha256sum | cut -c1-12)"
if [[ -f "$stamp" ]]; then
  touch "$stamp"
echo "$bin_dir"
  exit 0
fi

# One build at a time per cache (two checkouts running `make test` at once share it).
mkdir -p "$cache_root"
exec 9>"$cache_root/.lock"
flock 9

# build_into DIR MODULE_DIR PACKAGES...: go build into DIR unless DIR/.complete exists.
build_into() {
  local out=$1 mod=$2; shift 2
  if [[ -f "$out/.complete" ]]; then
    log "cached: $out"
    return
  fi
  log "building $* into $out (cold builds take minutes)"
  local start=$SECONDS tmp="$out.partial.$$"
  rm -rf "$tmp" && mkdir -p "$tmp"
  if ! (cd "$mod" && go mod download && go build -trimpath -ldflags "$LDFLAGS" -o "$tmp/" "$@"); then
    rm -rf "$tmp"
    log "FAILED to build $* (module $mod); the go error is above"
    exit 1
  fi
  rm -rf "$out" && mv "$tmp" "$out" && touch "$out/.complete"
  log "built in $((SECONDS - start))s: $(ls "$out" | tr '\n' ' ')"
}

minor=$(echo "$k8s_version" | cut -d. -f2)
LDFLAGS="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LDFLAGS="$LDFLAGS -X $p.gitVersion=$k8s_version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  LDFLAGS="$LDFLAGS -X $p.gitTreeState=clean -X $p.gitCommit=unknown -X $p.buildDate=1970-01-01T00:00:00Z"
done
build_into "$k8s_dir" "$tools/k8s" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl
k8s_ldflags=$LDFLAGS

LDFLAGS="-s -w"
build_into "$etcd_dir" "$tools/etcd" .
[[ -x "$etcd_dir/etcd" ]] || mv "$etcd_dir"/etcd* "$etcd_dir/etcd" 2>/dev/null || true

LDFLAGS="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$kwok_version"
build_into "$kwok_dir" "$tools/kwok" sigs.k8s.io/kwok/cmd/kwok

LDFLAGS="-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version"
build_into "$helm_dir" "$tools/helm" helm.sh/helm/v4/cmd/helm

LDFLAGS="-s -w -X sigs.k8s.io/kustomize/api/provenance.version=$kustomize_version"
build_into "$kustomize_dir" "$tools/kustomize" sigs.k8s.io/kustomize/kustomize/v5

LDFLAGS="-s -w"
build_into "$argocd_lua_dir" "$tools/argocd-lua" .
build_into "$flux_health_dir" "$tools/flux-health" .

# KWOK's fast stages ship in its module; the bare kwok binary needs them as a config file.
stages="$kwok_dir/kwok-stages.yaml"
if [[ ! -f "$stages" ]]; then
  kwok_mod=$(cd "$tools/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
  for f in node/fast/node-initialize.yaml pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    cat "$kwok_mod/kustomize/stage/$f"
    echo '---'
  done >"$stages.tmp"
  mv "$stages.tmp" "$stages"
fi

# The Prometheus Operator's CRDs for the objects config/prometheus holds, from its module.
prometheus_crds="$prometheus_crds_dir/prometheus-operator-crds.yaml"
if [[ ! -f "$prometheus_crds" ]]; then
  crd_mod=$(cd "$tools/prometheus-operator" && go mod download github.com/prometheus-operator/prometheus-operator &&
    go list -m -f '{{.Dir}}' github.com/prometheus-operator/prometheus-operator)
  mkdir -p "$prometheus_crds_dir"
  for kind in servicemonitors prometheusrules; do
    cat "$crd_mod/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml"
    echo '---'
  done >"$prometheus_crds.tmp"
  mv "$prometheus_crds.tmp" "$prometheus_crds"
fi

# One directory of links so callers need a single path.
mkdir -p "$bin_dir"
for f in "$k8s_dir"/* "$etcd_dir"/etcd "$kwok_dir"/kwok "$helm_dir"/helm "$kustomize_dir"/kustomize \
  "$argocd_lua_dir"/gpuqueue-argocd-lua "$flux_health_dir"/gpuqueue-flux-health \
  "$stages" "$prometheus_crds"; do
  ln -sfn "$f" "$bin_dir/$(basename "$f")"
done

# The real node: kubelet from the same pinned module (its own cache directory, so the
# control plane's stays valid) and the fake device plugin from its own module.
if $real_node; then
  LDFLAGS=$k8s_ldflags
  build_into "$kubelet_dir" "$tools/kubelet" k8s.io/kubernetes/cmd/kubelet

  LDFLAGS="-s -w"
  build_into "$plugin_dir" "$tools/deviceplugin" .
  ln -sfn "$kubelet_dir/kubelet" "$bin_dir/kubelet"
  ln -sfn "$plugin_dir/gpuqueue-fake-deviceplugin" "$bin_dir/gpuqueue-fake-deviceplugin"
fi
# containerd v2 (Debian's 1.6 sends the kubelet no container events), with its shim beside it
# under their own names: the real node puts the directory first in containerd's PATH.
if $containerd; then
  LDFLAGS="-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version"
  build_into "$containerd_dir" "$tools/containerd" -tags "no_btrfs no_devmapper no_zfs" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
  ln -sfn "$containerd_dir" "$bin_dir/containerd-v2"
fi
# The peer: Kueue from its pinned module. Its CRDs and webhook manifest stay in the module
# directory, linked beside the binary so the harness reads them from there at run time.
if $peers; then
  LDFLAGS="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$kueue_version"
  build_into "$kueue_dir" "$tools/kueue" sigs.k8s.io/kueue/cmd/kueue
  kueue_mod=$(cd "$tools/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
  ln -sfn "$kueue_dir/kueue" "$bin_dir/kueue"
  ln -sfn "$kueue_mod/config/components" "$bin_dir/kueue-config"
fi
touch "$stamp"
echo "$bin_dir"
