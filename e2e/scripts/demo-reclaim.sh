#!/usr/bin/env bash
# The second part of `make demo`: morning comes and tenant `online` wants its GPUs back.
#
# Runs against the demo's cluster and operator (e2e/scripts/demo.sh leaves both running, with
# `batch` borrowing 16 of online's idle GPUs). Each batch pod gets a fake vLLM on its pod IP
# (the queue checkpoints batch pods through vLLM's pause endpoint; this fake takes 1.2 s to
# pause). Then online scales up: the operator reclaims one GPU per new online pod, checkpoints
# and evicts the fewest batch borrowers, and binds online's pods. The script prints each
# handover's timeline (phases, in milliseconds from the moment the owner was found blocked)
# and the final `kubectl get gq`.
set -euo pipefail
cd "$(dirname "$0")/../.."

DIR=${E2E_DIR:-.e2e}
METRICS_PORT=${DEMO_METRICS_PORT:-18080}
VLLM_ADMIN=${DEMO_VLLM_ADMIN:-127.0.0.1:18001}
VLLM_PID="$DIR/fake-vllm.pid"
ONLINE_REPLICAS=${DEMO_ONLINE_REPLICAS:-12}

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
step() { printf '   %s\n' "$@"; }

until_true() { # <what> <command...>: waits up to a minute for the command to succeed
    local what=$1
    shift
    for _ in $(seq 1 600); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "demo: timed out waiting for $what" >&2
    exit 1
}

eval "$(make -s cluster-env)"
if ! kubectl get gq online batch >/dev/null 2>&1; then
    echo "demo-reclaim: run the first part of the demo first (e2e/scripts/demo.sh)" >&2
    exit 1
fi

say "Each batch pod serves vLLM on its pod IP (a fake vLLM here, whose pause takes 1.2 s)"
cargo build --quiet --locked -p gpuqueue-fake-vllm
if [ -f "$VLLM_PID" ]; then # this part run again: stop its fake vLLM, wait until the port is free
    pid=$(cat "$VLLM_PID")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$VLLM_PID"
fi
if (exec 3<>"/dev/tcp/${VLLM_ADMIN%:*}/${VLLM_ADMIN##*:}") 2>/dev/null; then
    echo "demo-reclaim: $VLLM_ADMIN is taken by another process (a fake vLLM this demo did not start?);" \
        "stop it, or choose another address with DEMO_VLLM_ADMIN" >&2
    exit 1
fi
mapfile -t ips < <(kubectl get pods -n batch --field-selector=status.phase=Running \
    -o jsonpath='{range .items[*]}{.status.podIP}{"\n"}{end}' | grep -v '^$')
nohup target/debug/fake-vllm --listen "${ips[0]}:8000" --admin "$VLLM_ADMIN" \
    --dev-mode --pause-latency 1200ms --busy 2 >"$DIR/fake-vllm.log" 2>&1 &
echo $! >"$VLLM_PID"
until_true "the fake vLLM" curl -fsS "http://$VLLM_ADMIN/_fake/servers"
for ip in "${ips[@]:1}"; do
    curl -fsS -X POST "http://$VLLM_ADMIN/_fake/servers" -H 'content-type: application/json' \
        -d "{\"listen\": \"$ip:8000\"}" >/dev/null
done
step "${#ips[@]} servers, one per running batch pod (log: $DIR/fake-vllm.log)"

say "Morning: online's traffic returns and it scales to $ONLINE_REPLICAS replicas"
step "4 of online's GPUs were never lent (lendingLimit 20): 4 more replicas start at once." \
     "The rest are within online's guarantee but borrowers hold the GPUs: each one is a reclaim."
kubectl scale deployment vllm -n online --replicas="$ONLINE_REPLICAS" >/dev/null
online_running() {
    [ "$(kubectl get pods -n online --field-selector=status.phase=Running -o name | wc -l)" -ge "$ONLINE_REPLICAS" ]
}
until_true "online's pods to run" online_running
reclaims=$((ONLINE_REPLICAS - 8))
handovers_recorded() {
    [ "$(kubectl get gq online -o jsonpath='{range .status.lastHandovers[?(@.role=="owner")]}{.id}{"\n"}{end}' | grep -c .)" -ge "$reclaims" ]
}
until_true "the handover records" handovers_recorded

say "The handovers, as online's status records them (ms from the moment the owner was found blocked)"
kubectl get gq online -o json >"$DIR/online.json"
python3 - "$DIR/online.json" <<'PY'
import json, sys

queue = json.load(open(sys.argv[1]))
for h in queue["status"].get("lastHandovers", []):
    if h["role"] != "owner":
        continue
    print(f"   {h['id']}  {h['ownerPod']} on {h['node']}: {h['outcome']} in {h['totalMillis']} ms"
          f" (budget {h['budgetMillis']} ms)")
    print("      " + "  ".join(f"{p['phase']} {p['atMillis']}" for p in h["phases"]))
    for c in h.get("checkpoints", []):
        note = f" ({c['message']})" if c.get("message") else ""
        print(f"      victim {c['pod']}: checkpoint {c['driver']} {c['result']} in {c['millis']} ms{note}")
PY
step "" "What the evicted batch pods and online's pods were told (events):"
# Read whole, then cut: `head` closing a pipe early would fail the script under pipefail.
first_lines() { local text; text=$("$@"); printf '%s\n' "$text" | sed -n '1,3p' | cut -c1-160; }
first_lines kubectl get events -A --field-selector reason=Checkpointed -o custom-columns='POD:.involvedObject.name,MESSAGE:.message'
first_lines kubectl get events -n online --field-selector reason=HandoverCompleted -o custom-columns='POD:.involvedObject.name,MESSAGE:.message'

say "Who has what now"
kubectl get gq
step "" "batch's replacements wait: it may not borrow again within its minBorrowDuration (30s):"
# A replacement's reason is written in the operator's pass after the replacement appears.
reason=
reason_written() {
    reason=$(kubectl get pods -n batch -o jsonpath='{range .items[?(@.spec.schedulingGates)]}{.metadata.annotations.gpuqueue\.io/waiting-reason}{"\n"}{end}' | grep '^BorrowCooldown' | sed -n 1p)
    [ -n "$reason" ]
}
until_true "a replacement's waiting reason" reason_written
printf '%s\n' "$reason" | fold -s -w 100 | sed 's/^/     /'
step "" "Handover metrics (http://127.0.0.1:$METRICS_PORT/metrics):"
curl -fsS "http://127.0.0.1:$METRICS_PORT/metrics" \
    | grep -E '^gpuqueue_(handover_seconds_(sum|count)|checkpoints_total|evictions_total|reclaims_per_minute)' \
    | sed 's/^/   /'
say "Done. The cluster, the operator and the fake vLLM are still running"
step "look around:  eval \"\$(make -s cluster-env)\"; kubectl get gq; kubectl get pods -A" \
     "stop them:    make demo-down"
