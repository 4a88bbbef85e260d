#!/usr/bin/env bash
# Handovers through the operator on the real node (e2e/kubelet/real-node.sh up): real
# SIGTERM, real grace period, the kubelet's device manager releasing the GPU, the owner's
# container started. The shape of `make bench-handover`, by hand: queue `batch` (guaranteed 0,
# burstable 8, checkpoint through the fake vLLM's POST /pause, which takes --pause-latency)
# fills the node's 8 GPUs with one-GPU fake vLLM pods; each round an owner pod of queue
# `online` (guaranteed 8) asks for one GPU, the operator reclaims it, the owner is bound and
# started; then the owner is deleted and a borrower refills the node.
#
# Usage: e2e/kubelet/handover.sh --kubeconfig FILE --work-dir DIR [--rounds 10]
#          [--checkpoint vllm|none] [--pause-latency 1200ms]
# Prints one line per handover (the operator's record, status.lastHandovers, plus the owner's
# container start) and a summary; leaves the operator's log in DIR.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
kubeconfig='' work='' rounds=10 checkpoint=vllm pause_latency=1200ms
while [[ $# -gt 0 ]]; do
  case $1 in
    --kubeconfig) kubeconfig=$2; shift 2 ;;
    --work-dir) work=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --checkpoint) checkpoint=$2; shift 2 ;;
    --pause-latency) pause_latency=$2; shift 2 ;;
    *) echo "unknown argument $1 (see the usage at the top of $0)" >&2; exit 1 ;;
  esac
done
[[ -n $kubeconfig && -n $work ]] || { echo "--kubeconfig and --work-dir are required" >&2; exit 1; }
mkdir -p "$work" && rm -f "$work/records.jsonl"
bin=$("$repo/e2e/scripts/build-tools.sh" 2>/dev/null | tail -n1)
export KUBECONFIG=$kubeconfig PATH="$bin:$PATH"
metrics_port=${HANDOVER_METRICS_PORT:-28080} webhook_port=${HANDOVER_WEBHOOK_PORT:-29443}

until_true() { # until_true WHAT CMD...: up to 60 s
  local what=$1; shift
  for _ in $(seq 1 600); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "handover: timed out waiting for $what" >&2
  exit 1
}

# The operator as in `make demo`: config/ applied but the Deployment, the webhook calling
# this machine, the operator running here as its ServiceAccount.
(cd "$repo" && cargo build -q --locked -p gpuqueue-operator)
kubectl apply --server-side -f "$repo/crds/" >/dev/null
kubectl apply --server-side -f "$repo/config/namespace.yaml" >/dev/null
# A rerun: the patched webhook (url) and config/'s (service) cannot be merged; start anew.
kubectl delete mutatingwebhookconfiguration gpuqueue-operator --ignore-not-found >/dev/null
for k in rbac policy webhook; do kubectl apply --server-side -k "$repo/config/$k" >/dev/null; done
kubectl patch mutatingwebhookconfiguration gpuqueue-operator --type=json -p \
  "[{\"op\": \"replace\", \"path\": \"/webhooks/0/clientConfig\", \"value\": {\"url\": \"https://127.0.0.1:$webhook_port/mutate-pods\"}}]" >/dev/null
op_kubeconfig=$work/operator.kubeconfig
kubectl config view --raw --minify >"$op_kubeconfig"
kubectl --kubeconfig="$op_kubeconfig" config set-credentials gpuqueue-operator \
  --token="$(kubectl -n gpuqueue-system create token gpuqueue-operator --duration=24h)" >/dev/null
kubectl --kubeconfig="$op_kubeconfig" config set-context --current --user=gpuqueue-operator >/dev/null
"$repo/target/debug/gpuqueue-operator" --kubeconfig="$op_kubeconfig" --namespace=gpuqueue-system \
  --metrics-addr="127.0.0.1:$metrics_port" --webhook-addr="127.0.0.1:$webhook_port" \
  --webhook-extra-san=127.0.0.1 --lease-identity=real-node >"$work/operator.log" 2>&1 &
operator=$!
# Waits for the operator to end (its webhook drains for 5 s), so that a next run finds its ports free.
trap 'kill $operator 2>/dev/null && wait $operator 2>/dev/null || true' EXIT
until_true "the operator to be ready" curl -fsS "http://127.0.0.1:$metrics_port/readyz"

case $checkpoint in
  vllm) reclaim="{checkpoint: {driver: vllm, port: 8000, timeout: 1500ms}, victimGracePeriodSeconds: 1}" ;;
  none) reclaim="{checkpoint: {driver: none}, victimGracePeriodSeconds: 1}" ;;
  *) echo "--checkpoint must be vllm or none" >&2; exit 1 ;;
esac
# A run before this one leaves its pods for inspection; start from none.
kubectl delete gq online batch --ignore-not-found >/dev/null
kubectl delete namespace online batch --ignore-not-found --timeout=120s >/dev/null
for ns in online batch; do kubectl create namespace $ns --dry-run=client -o yaml | kubectl apply -f - >/dev/null; done
kubectl apply --server-side -f - >/dev/null <<EOF
apiVersion: gpuqueue.io/v1alpha1
kind: GpuQueue
metadata: {name: online}
spec:
  namespaces: [online]
  resources: [{name: nvidia.com/gpu, guaranteed: 8, burstable: 0}]
  reclaim: {}
---
apiVersion: gpuqueue.io/v1alpha1
kind: GpuQueue
metadata: {name: batch}
spec:
  namespaces: [batch]
  resources: [{name: nvidia.com/gpu, guaranteed: 0, burstable: 8}]
  reclaim: $reclaim
EOF

vllm_pod() { # vllm_pod NAMESPACE NAME: a one-GPU fake vLLM on the real node
  kubectl create -n "$1" -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $2}
spec:
  nodeSelector: {gpuqueue.io/real-node: "true"}
  dnsPolicy: Default
  containers:
    - name: vllm
      image: localhost/gpuqueue/fake-vllm:offline
      imagePullPolicy: Never
      # --dev-mode: VLLM_SERVER_DEV_MODE=1, without which vLLM offers no POST /pause.
      args: [--listen, "0.0.0.0:8000", --dev-mode, --pause-latency, "$pause_latency"]
      resources: {limits: {nvidia.com/gpu: 1}}
      readinessProbe: {httpGet: {path: /health, port: 8000}, periodSeconds: 1}
EOF
}
ready() { [[ $(kubectl get pod -n "$1" "$2" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]]; }

for i in $(seq 0 7); do vllm_pod batch "borrower-$i"; done
for i in $(seq 0 7); do until_true "borrower-$i Ready" ready batch "borrower-$i"; done
next=8
echo "round total_ms budget_ms outcome phases(end ms: plan intent reserve checkpoint evictAccepted victimsGone ownerBound) owner_running_after_record_ms victim"
for round in $(seq 1 "$rounds"); do
  vllm_pod online "owner-$round"
  until_true "owner-$round's handover record" bash -c \
    "kubectl get gq online -o json | jq -e '.status.lastHandovers[]? | select(.ownerPod == \"online/owner-$round\")'"
  recorded=$(date +%s%3N)
  until_true "owner-$round Running" bash -c \
    "[[ \$(kubectl get pod -n online owner-$round -o jsonpath='{.status.phase}') == Running ]]"
  record=$(kubectl get gq online -o json | jq -c "[.status.lastHandovers[] | select(.ownerPod == \"online/owner-$round\")] | last")
  # Seen by polling (kubectl every ~0.1-0.2 s): how long after the record the container ran.
  running_after=$(($(date +%s%3N) - recorded))
  jq -r --arg after "$running_after" --arg round "$round" '
    "\($round) \(.totalMillis) \(.budgetMillis) \(.outcome) \([.phases[].atMillis] | map(tostring) | join(" ")) \($after) \(.victims | join(","))"' <<<"$record"
  echo "$record" >>"$work/records.jsonl"
  kubectl delete pod -n online "owner-$round" --timeout=60s >/dev/null
  vllm_pod batch "borrower-$next"
  until_true "borrower-$next Ready" ready batch "borrower-$next"
  next=$((next + 1))
done
# Per handover: the checkpoint phase, the victim's termination (evictAccepted to victimsGone)
# and the control-plane share (the rest); nearest-rank p50 and the largest.
jq -rs '
  def stats: sort | "p50 \(.[(length / 2 | floor)]) max \(.[-1])";
  [.[] | ([.phases[] | {(.phase): .atMillis}] | add) as $p
    | {total: .totalMillis, checkpoint: ($p.checkpoint - $p.reserve),
       termination: ($p.victimsGone - $p.evictAccepted), over: (.totalMillis > .budgetMillis)}
    | .control = (.total - .checkpoint - .termination)] as $h
  | "handovers: \($h | length), over budget: \([$h[] | select(.over)] | length)",
    "whole ms:              \([$h[].total] | stats)",
    "checkpoint ms:         \([$h[].checkpoint] | stats)",
    "victim termination ms: \([$h[].termination] | stats)",
    "control-plane ms:      \([$h[].control] | stats)"' "$work/records.jsonl"
