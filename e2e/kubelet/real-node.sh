#!/usr/bin/env bash
# One real node for a harness cluster: containerd + runc (Debian), kubelet v1.36.3 built from
# the pinned module, our fake device plugin advertising nvidia.com/gpu, and the fake vLLM and
# pause images built offline (static binaries, FROM scratch) and imported into containerd.
#
# Usage (as root; needs `apt-get install -y containerd runc buildah`):
#   e2e/kubelet/real-node.sh up   --kubeconfig FILE --run-dir DIR [--node-name real-node-0] [--gpus 8]
#                                 [--evented-pleg]
#   e2e/kubelet/real-node.sh down --run-dir DIR
#
# --evented-pleg runs containerd v2 (built from the Go module proxy: Debian's 1.6 sends no
# container events) and the kubelet with its alpha EventedPLEG feature gate, which learns of a
# container's exit from containerd's events instead of its 1 s relist.
#
# Everything lives under DIR (containerd root/state/socket, kubelet root, CNI state, logs),
# except the kubelet's device-plugin socket directory, which kubelet v1.36 hard-codes to
# /var/lib/kubelet/device-plugins/: one real node per machine, held by a lock there.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
plugin_dir=/var/lib/kubelet/device-plugins

log() { printf '[real-node] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

action=${1:-}; shift || true
kubeconfig='' run='' node=real-node-0 gpus=8 evented_pleg=false
while [[ $# -gt 0 ]]; do
  case $1 in
    --evented-pleg) evented_pleg=true; shift ;;
    --kubeconfig) kubeconfig=$2; shift 2 ;;
    --run-dir) run=$2; shift 2 ;;
    --node-name) node=$2; shift 2 ;;
    --gpus) gpus=$2; shift 2 ;;
    *) die "unknown argument $1 (see the usage at the top of $0)" ;;
  esac
done
[[ -n $run ]] || die "--run-dir is required: the directory that holds this node's state"
run=$(realpath -m "$run")

# spawn NAME CMD...: runs CMD in its own session with output in $run/logs/NAME.log and
# records "pid NAME" in $run/pids, so `down` stops exactly what `up` started.
spawn() {
  local name=$1; shift
  setsid "$@" </dev/null >"$run/logs/$name.log" 2>&1 &
  echo "$! $name" >>"$run/pids"
}

wait_until() { # wait_until WHAT SECONDS CMD...
  local what=$1 secs=$2; shift 2
  for ((i = 0; i < secs * 10; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  die "timed out after ${secs}s waiting for $what (logs in $run/logs/)"
}

ctr_() { ctr -a "$run/containerd.sock" -n k8s.io "$@"; }

# build_images: the pause image from pause.c and the fake vLLM from crates/fake-vllm, both
# static, FROM scratch, built by buildah with its own storage under $run and imported.
build_images() {
  local b="buildah --root $run/buildah/root --runroot $run/buildah/run --storage-driver vfs"
  mkdir -p "$run/images/pause" "$run/images/fake-vllm"
  gcc -static -Os -Wall -Wextra -o "$run/images/pause/pause" "$here/pause.c"
  log "building the static fake vLLM (cargo, release, crt-static)"
  (cd "$repo" && RUSTFLAGS='-C target-feature=+crt-static' cargo build --release -q \
    -p gpuqueue-fake-vllm --bin fake-vllm --target x86_64-unknown-linux-gnu)
  cp "$repo/target/x86_64-unknown-linux-gnu/release/fake-vllm" "$run/images/fake-vllm/"
  local image
  for image in pause fake-vllm; do
    $b bud -q --isolation chroot -f "$here/Containerfile.$image" \
      -t "localhost/gpuqueue/$image:offline" "$run/images/$image" >/dev/null
    rm -f "$run/images/$image.tar"
    $b push -q "localhost/gpuqueue/$image:offline" \
      "oci-archive:$run/images/$image.tar:localhost/gpuqueue/$image:offline"
    ctr_ images import "$run/images/$image.tar" >/dev/null
  done
  log "images in containerd: $(ctr_ images ls -q | grep '^localhost/' | tr '\n' ' ')"
}

up() {
  [[ -n $kubeconfig ]] || die "--kubeconfig is required: the cluster's admin kubeconfig"
  [[ -e $run/pids ]] && die "$run already holds a node; run '$0 down --run-dir $run' first"
  local tool
  for tool in containerd containerd-shim-runc-v2 runc ctr buildah gcc; do
    command -v "$tool" >/dev/null || die "$tool is missing: apt-get install -y containerd runc buildah gcc"
  done
  local bin
  if $evented_pleg; then
    bin=$("$repo/e2e/scripts/build-tools.sh" --real-node --containerd | tail -n1)
  else
    bin=$("$repo/e2e/scripts/build-tools.sh" --real-node | tail -n1)
  fi

  mkdir -p "$run/logs" "$run/cni" "$run/kubelet" "$plugin_dir"
  exec 8>"$plugin_dir/.gpuqueue-real-node.lock"
  flock -n 8 || die "another real node holds $plugin_dir (kubelet hard-codes that directory)"
  : >"$run/pids"
  printf '%s\n%s\n%s\n' "$bin" "$kubeconfig" "$node" >"$run/node"

  sed "s|@RUN@|$run|g" "$here/containerd.toml.in" >"$run/containerd.toml"
  if $evented_pleg; then
    # containerd finds its shim on its PATH: ours first.
    spawn containerd env PATH="$bin/containerd-v2:$PATH" containerd --config "$run/containerd.toml"
  else
    spawn containerd containerd --config "$run/containerd.toml"
  fi
  wait_until "containerd" 30 ctr_ version
  build_images

  local pod_cidr=10.88.0.0/24
  cat >"$run/cni/10-gpuqueue-real-node.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "gpuqueue-real-node", "plugins": [
  {"type": "bridge", "bridge": "gqreal0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$pod_cidr"}]], "dataDir": "$run/cni-ipam"}}]}
EOF
  sed -e "s|@RUN@|$run|g" -e "s|@PORT@|10350|" -e "s|@HEALTHZ_PORT@|10348|" \
    -e "s|@POD_CIDR@|$pod_cidr|" "$here/kubelet.yaml.in" >"$run/kubelet.yaml"
  if $evented_pleg; then printf 'featureGates:\n  EventedPLEG: true\n' >>"$run/kubelet.yaml"; fi
  local node_ip
  node_ip=$(ip -4 route get 1.1.1.1 | sed -n 's/.* src \([0-9.]*\).*/\1/p')
  spawn kubelet "$bin/kubelet" --config="$run/kubelet.yaml" --kubeconfig="$kubeconfig" \
    --root-dir="$run/kubelet" --cert-dir="$run/kubelet/pki" --hostname-override="$node" \
    --node-ip="$node_ip" --v=2 \
    --node-labels="gpuqueue.io/real-node=true,nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3,nvidia.com/gpu.memory=81559,nvidia.com/gpu.count=$gpus"
  wait_until "kubelet's device-plugin socket" 60 test -S "$plugin_dir/kubelet.sock"
  spawn deviceplugin "$bin/gpuqueue-fake-deviceplugin" --count="$gpus" --dir="$plugin_dir"

  local kubectl="$bin/kubectl --kubeconfig=$kubeconfig"
  wait_until "node $node Ready with $gpus nvidia.com/gpu" 120 bash -c \
    "[[ \$($kubectl get node $node -o jsonpath='{.status.allocatable.nvidia\.com/gpu}{\" \"}{.status.conditions[?(@.type==\"Ready\")].status}') == '$gpus True' ]]"
  log "node $node is Ready with $gpus nvidia.com/gpu (state and logs in $run)"
}

# ours PID NAME: whether PID still runs what `up` recorded under NAME (not a reused pid).
ours() {
  local token
  case $2 in
    containerd) token="$run/containerd.toml" ;;
    kubelet) token="$run/kubelet.yaml" ;;
    deviceplugin) token=gpuqueue-fake-deviceplugin ;;
  esac
  [[ -r /proc/$1/cmdline ]] && tr '\0' ' ' </proc/"$1"/cmdline | grep -qF -- "$token"
}

# stop_recorded: SIGTERM, then SIGKILL after 5 s, to each recorded process still ours.
stop_recorded() {
  local pid name
  while read -r pid name; do
    ours "$pid" "$name" || continue
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do ours "$pid" "$name" || break; sleep 0.1; done
    if ours "$pid" "$name"; then kill -KILL "$pid" 2>/dev/null || true; fi
    log "stopped $name ($pid)"
  done < <(tac "$run/pids")
}

down() {
  [[ -e $run/pids ]] || { log "no node state in $run; nothing to stop"; return; }
  local bin='' kubeconfig='' node=''
  [[ -e $run/node ]] && { read -r bin; read -r kubeconfig; read -r node; } <"$run/node"
  # The kubelet first, so it restarts nothing; then every container containerd still runs.
  local pid name
  while read -r pid name; do
    if [[ $name == kubelet ]] && ours "$pid" kubelet; then kill -TERM "$pid" 2>/dev/null || true; fi
  done <"$run/pids"
  if ctr_ version >/dev/null 2>&1; then
    local task
    for task in $(ctr_ tasks ls -q 2>/dev/null); do
      ctr_ tasks kill -s SIGKILL "$task" 2>/dev/null || true
    done
    sleep 0.5
    for task in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$task" >/dev/null 2>&1 || true; done
    for task in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$task" >/dev/null 2>&1 || true; done
  fi
  stop_recorded
  # Shims outlive containerd by design; ours name our socket on their command line.
  for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $run/containerd.sock" || true); do
    kill -KILL "$pid" 2>/dev/null || true
  done
  # Mounts the kubelet and containerd left under $run (deepest first), the CNI bridge.
  awk -v r="$run/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n1 umount -l
  ip link delete gqreal0 2>/dev/null || true
  rm -f "$plugin_dir/kubelet.sock" "$plugin_dir/gpuqueue-fake-gpu.sock" "$plugin_dir/kubelet_internal_checkpoint"
  # The kubelet's cgroups (kubepods/…), now empty; deepest first.
  find /sys/fs/cgroup/*/kubepods -depth -type d -exec rmdir {} + 2>/dev/null || true
  # Nothing marks the node NotReady in the harness (no node lifecycle or pod GC controller):
  # remove it, and its pods, which no kubelet will confirm deleted now.
  if [[ -n $node && -x $bin/kubectl && -e $kubeconfig ]]; then
    "$bin/kubectl" --kubeconfig="$kubeconfig" delete pods -A --field-selector="spec.nodeName=$node" \
      --grace-period=0 --force >/dev/null 2>&1 || true
    "$bin/kubectl" --kubeconfig="$kubeconfig" delete node "$node" --ignore-not-found >/dev/null || true
  fi
  rm -rf "$run"
  log "node stopped; removed $run"
}

case $action in
  up) up ;;
  down) down ;;
  *) die "usage: $0 up|down --run-dir DIR [--kubeconfig FILE] (see the top of $0)" ;;
esac
