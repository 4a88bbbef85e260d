#!/usr/bin/env bash
# `make demo`: a local control plane with 32 KWOK GPUs, the gpuqueue operator, and the two
# tenants of examples/two-tenants.yaml. Tenant `batch` borrows tenant `online`'s idle GPUs up to
# its ceiling, and every pod that waits says why. Everything runs on this machine, no Docker.
#
# The cluster and the operator keep running afterwards so you can look around
# (eval "$(make -s cluster-env)"; kubectl get gq); `make demo-down` stops both.
set -euo pipefail
# Pipelines here read their input to the end (sed -n, not head): under pipefail, a writer
# killed by SIGPIPE would end the demo with status 141.
cd "$(dirname "$0")/../.."

DIR=${E2E_DIR:-.e2e}
METRICS_PORT=${DEMO_METRICS_PORT:-18080}
WEBHOOK_PORT=${DEMO_WEBHOOK_PORT:-19443}
OPERATOR_PID="$DIR/operator.pid"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
step() { printf '   %s\n' "$@"; }

# `until_true <what> <command...>`: waits up to a minute for the command to succeed.
until_true() {
    local what=$1
    shift
    for _ in $(seq 1 600); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "demo: timed out waiting for $what" >&2
    exit 1
}

# `port_is_free <port>`: nothing listens on 127.0.0.1:<port>.
port_is_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

queue_is() { # queue allocated borrowed lent pending
    [ "$(kubectl get gq "$1" -o jsonpath='{.status.summary.allocated}/{.status.summary.borrowed}/{.status.summary.lent}/{.status.summary.pending}')" = "$2/$3/$4/$5" ]
}

say "Starting a local control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, KWOK)"
step "The first run builds Kubernetes v1.36 from the Go module proxy (about 10 minutes on 2 cores)."
# What an earlier demo left running: its fake vLLM, its operator, its cluster.
E2E_DIR=$DIR e2e/scripts/demo-down.sh
for port in "$METRICS_PORT" "$WEBHOOK_PORT"; do
    if ! port_is_free "$port"; then
        echo "demo: 127.0.0.1:$port is taken by another process (an operator not started by this demo?);" \
            "stop it, or choose other ports with DEMO_METRICS_PORT and DEMO_WEBHOOK_PORT" >&2
        exit 1
    fi
done
make -s cluster-up
eval "$(make -s cluster-env)"
kubectl get nodes -o custom-columns='NAME:.metadata.name,GPU:.metadata.labels.nvidia\.com/gpu\.product,WHOLE GPUS:.status.allocatable.nvidia\.com/gpu,MIG 1g.10gb:.status.allocatable.nvidia\.com/mig-1g\.10gb,MIG 3g.40gb:.status.allocatable.nvidia\.com/mig-3g\.40gb' | sed 's/^/   /'

say "Starting the operator (make cluster-up built it, and kubectl-gpuqueue)"
kubectl apply --server-side -f crds/ >/dev/null
kubectl apply --server-side -f config/namespace.yaml >/dev/null
# What config/ ships but the Deployment and its Services (the operator runs on this machine):
# the RBAC, the admission policies, and the webhook configuration, calling the operator here
# instead of a Service.
kubectl apply --server-side -k config/rbac >/dev/null
kubectl apply --server-side -k config/policy >/dev/null
kubectl apply --server-side -k config/webhook >/dev/null
kubectl patch mutatingwebhookconfiguration gpuqueue-operator --type=json -p \
    "[{\"op\": \"replace\", \"path\": \"/webhooks/0/clientConfig\", \"value\": {\"url\": \"https://127.0.0.1:$WEBHOOK_PORT/mutate-pods\"}}]" >/dev/null
# The operator runs as its ServiceAccount, so with exactly the RBAC of config/rbac/ and as the
# one identity the policies exempt.
OPERATOR_KUBECONFIG="$DIR/operator.kubeconfig"
kubectl config view --raw --minify >"$OPERATOR_KUBECONFIG"
kubectl --kubeconfig="$OPERATOR_KUBECONFIG" config set-credentials gpuqueue-operator \
    --token="$(kubectl -n gpuqueue-system create token gpuqueue-operator --duration=24h)" >/dev/null
kubectl --kubeconfig="$OPERATOR_KUBECONFIG" config set-context --current --user=gpuqueue-operator >/dev/null
nohup target/debug/gpuqueue-operator --kubeconfig="$OPERATOR_KUBECONFIG" --namespace=gpuqueue-system \
    --metrics-addr="127.0.0.1:$METRICS_PORT" --webhook-addr="127.0.0.1:$WEBHOOK_PORT" \
    --webhook-extra-san=127.0.0.1 --lease-identity=demo \
    >"$DIR/operator.log" 2>&1 &
echo $! >"$OPERATOR_PID"
until_true "the operator to be ready" curl -fsS "http://127.0.0.1:$METRICS_PORT/readyz"
step "ready: stores synced, webhook serving over TLS with its own CA (log: $DIR/operator.log)"

say "Two tenants share 32 GPUs (examples/two-tenants.yaml)"
step "online: guaranteed 24 GPUs, lends at most 20 of them (4 stay warm for traffic spikes)" \
     "batch:  guaranteed 8 GPUs, may borrow 16 more from idle capacity (ceiling 24)"
kubectl create namespace online --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl create namespace batch --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl apply --server-side -f examples/two-tenants.yaml >/dev/null
until_true "queue status" queue_is online 0 0 0 0
kubectl get gq

deployment() { # namespace replicas: a plain vLLM Deployment, nothing gpuqueue-specific in it
    kubectl apply -n "$1" -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: vllm}
spec:
  replicas: $2
  selector: {matchLabels: {app: vllm}}
  template:
    metadata: {labels: {app: vllm}}
    spec:
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.11.0
          resources: {limits: {nvidia.com/gpu: 1}}
EOF
}

say "Night: online serves light traffic with 4 replicas; 20 of its guaranteed GPUs sit idle"
deployment online 4
until_true "online's pods" queue_is online 4 0 0 0
kubectl get gq

say "batch scales its offline inference to 26 replicas"
step "8 run on batch's own guarantee, 16 borrow online's idle GPUs, 2 wait above the ceiling of 24."
deployment batch 26
until_true "batch to borrow" queue_is batch 24 16 0 2
kubectl get gq
# The operator writes the reason in the pass after it counts the pod, and the event after that.
waiting=
reason_written() {
    waiting=$(kubectl get pods -n batch -o jsonpath='{range .items[?(@.spec.schedulingGates)]}{.metadata.name}{" "}{.metadata.annotations.gpuqueue\.io/waiting-reason}{"\n"}{end}' | awk 'NF > 1 {print $1}' | sed -n 1p)
    [ -n "$waiting" ]
}
until_true "a waiting pod's reason" reason_written
event_published() { [ -n "$(kubectl get events -n batch --field-selector "involvedObject.name=$waiting" -o name)" ]; }
until_true "the waiting pod's event" event_published
step "" "A pod that waits says why (annotation gpuqueue.io/waiting-reason, and an event):"
kubectl get pod -n batch "$waiting" -o jsonpath='{.metadata.annotations.gpuqueue\.io/waiting-reason}{"\n"}' | fold -s -w 100 | sed 's/^/     /'
kubectl get events -n batch --field-selector "involvedObject.name=$waiting" \
    -o custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message | sed 's/^/     /'
step "" "Where the pods went (the operator pinned each one; kube-scheduler bound it):"
kubectl get pods -n batch --field-selector=status.phase=Running --sort-by=.spec.nodeName \
    -o custom-columns=NAME:.metadata.name,STATUS:.status.phase,NODE:.spec.nodeName | sed -n 1,6p | sed 's/^/     /'
step "     ..."

say "The GPU pools at a glance: kubectl gpuqueue top (allocated, free, fragmented, who holds them)"
kubectl gpuqueue top | sed 's/^/   /'

say "Every queue's numbers are also Prometheus metrics (http://127.0.0.1:$METRICS_PORT/metrics)"
curl -fsS "http://127.0.0.1:$METRICS_PORT/metrics" | grep -E '^gpuqueue_queue_(allocated|borrowed|lent)_gpus' | sed 's/^/   /'

say "The cluster and the operator keep running (make demo goes on with the reclaim; make demo-down stops them)"
