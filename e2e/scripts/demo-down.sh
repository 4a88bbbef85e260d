#!/usr/bin/env bash
# `make demo-down`, and the first step of `make demo`: stops what an earlier demo left running
# (its fake vLLM and its operator, each only if its recorded pid still runs that program, and
# waits until it has exited so its ports are free), then the demo's cluster.
set -euo pipefail
cd "$(dirname "$0")/../.."

DIR=${E2E_DIR:-.e2e}

stop() { # <pid file> <program>: SIGTERM, then SIGKILL after 10 s
    local file=$1 program=$2 pid
    [ -f "$file" ] || return 0
    pid=$(cat "$file")
    # A pid file can outlive its process, and the pid be reused: check what it runs.
    if [[ "$pid" =~ ^[0-9]+$ ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "^$program "; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
        echo "demo-down: stopped $program (pid $pid)"
    fi
    rm -f "$file"
}

stop "$DIR/fake-vllm.pid" target/debug/fake-vllm
stop "$DIR/operator.pid" target/debug/gpuqueue-operator
make -s cluster-down
