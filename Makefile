# gpuqueue: `make help` lists the targets. `make test` is what CI runs (.ci/run).
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

CARGO ?= cargo
# The real data (the Alibaba openb trace, the FGD paper's published results, Helios quotas) is
# not in the repository (research-use licence): $GPUQUEUE_DATA_DIR, else a shared/data folder
# beside the checkout or its parent, else where the team's machines and CI keep it. Core and
# simulator tests read it and fail loudly when it is missing.
export GPUQUEUE_DATA_DIR ?= $(abspath $(firstword $(wildcard ../shared/data ../../shared/data /work/shared/data)))
# Crates that must stay free of I/O: no async runtime, no HTTP, no Kubernetes client.
PURE_CRATES := gpuqueue-api gpuqueue-core
IO_CRATES := tokio hyper kube-client kube-runtime

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: fmt
fmt: ## Format all Rust code
	$(CARGO) fmt --all

.PHONY: fmt-check
fmt-check: ## Fail if any Rust code is not formatted
	$(CARGO) fmt --all -- --check

.PHONY: lint
lint: ## Clippy on every crate and target, warnings are errors
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

.PHONY: crds
crds: ## Regenerate crds/ from the Rust types in crates/api
	$(CARGO) run --quiet --locked -p gpuqueue-api --bin crdgen -- crds
	cp crds/*.yaml config/crd/  # kustomize reads nothing outside config/

# No crate's files import each other in a cycle; the operator's and the core's functions stay
# short enough to read as one step (scripts/check-layout.py says how both are measured).
LAYOUT_SOURCES := $(wildcard crates/*/src) e2e/src
SHORT_FN_SOURCES := crates/operator/src crates/core/src

.PHONY: verify
verify: ## Fail if crds/ is stale, a pure crate depends on I/O crates, files import in a cycle or a function grows long
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	  $(CARGO) run --quiet --locked -p gpuqueue-api --bin crdgen -- "$$tmp" && \
	  if ! diff -ru crds "$$tmp"; then echo "verify: crds/ is stale; run 'make crds'" >&2; exit 1; fi
	@for f in crds/*.yaml; do \
	  cmp -s "$$f" "config/crd/$$(basename "$$f")" || { echo "verify: config/crd/$$(basename "$$f") differs from $$f; run 'make crds'" >&2; exit 1; }; \
	done
	@for crate in $(PURE_CRATES); do \
	  found=$$($(CARGO) tree --locked -p $$crate -e normal --prefix none --format '{p}' | awk '{print $$1}' | sort -u | grep -xE '$(subst $() ,|,$(IO_CRATES))' || true); \
	  if [ -n "$$found" ]; then echo "verify: $$crate depends on I/O crates: $$found" >&2; exit 1; fi; \
	done
	@python3 scripts/check-layout.py cycles $(LAYOUT_SOURCES)
	@python3 scripts/check-layout.py fn-lines --max 80 $(SHORT_FN_SOURCES)
	@echo "verify: crds/ up to date; $(PURE_CRATES) free of $(IO_CRATES); no import cycle; short functions"

.PHONY: unit
unit: ## Unit, scenario and property tests of every crate (no cluster)
	$(CARGO) test --workspace --locked --exclude gpuqueue-e2e

# The control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, KWOK) is
# built from the Go module proxy by e2e/scripts/build-tools.sh and cached under
# ~/.cache/gpuqueue-e2e; the script prints the binary directory and is a no-op when cached.
E2E_TOOLS := e2e/scripts/build-tools.sh
# Debian packages end-to-end tests run for real, as PACKAGE:COMMAND; installed when COMMAND is missing.
E2E_DEBIAN_PACKAGES :=
E2E_DIR ?= .e2e
E2E_CLUSTER = $(CARGO) run --quiet --locked -p gpuqueue-e2e --bin gpuqueue-e2e-cluster --

.PHONY: e2e-tools
e2e-tools: ## Build the control-plane binaries from Go modules (minutes once, then cached)
	@$(E2E_TOOLS) >/dev/null

.PHONY: e2e-packages
e2e-packages: ## Install the Debian packages the end-to-end tests run (needs root when one is missing)
	@e2e/scripts/debian-packages.sh $(E2E_DEBIAN_PACKAGES)

.PHONY: e2e
e2e: e2e-packages ## End-to-end tests; each test starts and stops its own control plane, even on failure
	bin=$$($(E2E_TOOLS)) && GPUQUEUE_E2E_BIN="$$bin" $(CARGO) test --locked -p gpuqueue-e2e

.PHONY: cluster-up
cluster-up: ## Start a local cluster with KWOK GPU nodes (state in .e2e/; see cluster-env)
	@bin=$$($(E2E_TOOLS)) && GPUQUEUE_E2E_BIN="$$bin" $(E2E_CLUSTER) up --dir $(E2E_DIR)

.PHONY: cluster-down
cluster-down: ## Stop the local cluster's processes and remove .e2e/
	@$(E2E_CLUSTER) down --dir $(E2E_DIR)

.PHONY: cluster-env
cluster-env: ## Print KUBECONFIG/PATH exports for the local cluster: eval "$(make -s cluster-env)"
	@$(E2E_CLUSTER) env --dir $(E2E_DIR)

.PHONY: bench-core
bench-core: ## Benchmark the policy core (decisions at 1,000 nodes; scorers on the Alibaba trace); writes target/bench-core/
	$(CARGO) bench --locked -p gpuqueue-core --bench policy
	$(CARGO) bench --locked -p gpuqueue-core --bench trace_replay

SIM_DATA := $(GPUQUEUE_DATA_DIR)
SIM_RESULTS := crates/sim/results
SIM_TRACES := default cpu050 cpu100 cpu200 cpu250 gpushare20 gpushare40 gpushare60 gpushare100 \
  gpuspec10 gpuspec20 gpuspec25 gpuspec33 multigpu20 multigpu30 multigpu40
SIMULATE = $(CARGO) run --quiet --release --locked -p gpuqueue-cli --bin kubectl-gpuqueue -- simulate --data-dir $(SIM_DATA)

.PHONY: sim
sim: ## Quota study of one scenario: make sim SCENARIO=examples/sim/day-night.yaml (report in target/sim/)
	$(SIMULATE) --scenario $(or $(SCENARIO),examples/sim/quickstart.yaml) --out target/sim

.PHONY: bench-sim
bench-sim: ## Placement study on every openb trace and quota studies of examples/sim; writes crates/sim/results/
	@test -d "$(SIM_DATA)/alibaba-gpu-v2023" || { echo "bench-sim: no openb trace; set GPUQUEUE_DATA_DIR" >&2; exit 1; }
	rm -rf $(SIM_RESULTS)/placement $(SIM_RESULTS)/speed $(SIM_RESULTS)/quota
	$(SIMULATE) --no-progress --policy ours --out $(SIM_RESULTS)/speed \
	  --trace $(SIM_DATA)/alibaba-gpu-v2023/openb_node_list_gpu_node.csv $(SIM_DATA)/alibaba-gpu-v2023/openb_pod_list_default.csv
	$(SIMULATE) --no-progress --out $(SIM_RESULTS)/placement --trace $(SIM_DATA)/alibaba-gpu-v2023/openb_node_list_gpu_node.csv \
	  $(foreach t,$(SIM_TRACES),$(SIM_DATA)/alibaba-gpu-v2023/openb_pod_list_$(t).csv)
	$(SIMULATE) --no-progress --scenario examples/sim/day-night.yaml --seeds 42-46 --out $(SIM_RESULTS)/quota
	$(SIMULATE) --no-progress --scenario examples/sim/helios-venus.yaml --out $(SIM_RESULTS)/quota

.PHONY: bench-handover
bench-handover: ## Handover latency on nodes that behave like kubelets: 50 single reclaims with a 1.2 s vLLM checkpoint and 50 without, then bursts of 22 and 12 owner pods (5 rounds each; BENCH_* knobs in e2e/benches/handover.rs); writes e2e/results/handover.{json,md}
	bin=$$($(E2E_TOOLS)) && GPUQUEUE_E2E_BIN="$$bin" $(CARGO) bench --locked -p gpuqueue-e2e --bench handover

.PHONY: test
test: fmt-check lint verify unit e2e ## Everything CI runs: format, lint, verify, all tests, end to end

.PHONY: demo
demo: ## Local control plane, the operator and two tenants: watch one borrow the other's idle GPUs, then take them back
	@e2e/scripts/demo.sh
	@e2e/scripts/demo-reclaim.sh

.PHONY: demo-down
demo-down: ## Stop the demo's operator and its cluster
	@if [ -f $(E2E_DIR)/operator.pid ]; then kill "$$(cat $(E2E_DIR)/operator.pid)" 2>/dev/null || true; rm -f $(E2E_DIR)/operator.pid; fi
	@if [ -f $(E2E_DIR)/fake-vllm.pid ]; then kill "$$(cat $(E2E_DIR)/fake-vllm.pid)" 2>/dev/null || true; rm -f $(E2E_DIR)/fake-vllm.pid; fi
	@$(E2E_CLUSTER) down --dir $(E2E_DIR)

.PHONY: bench-peers
bench-peers: ## gpuqueue and Kueue side by side: reclaim (50), burst 2 -> 24, admission (1,000 pods, 100 nodes), quota honesty; builds Kueue once (--peers); writes e2e/results/peers.{json,md}
	bin=$$($(E2E_TOOLS) --peers | tail -n1) && GPUQUEUE_E2E_BIN="$$bin" $(CARGO) bench --locked -p gpuqueue-e2e --bench peers

.PHONY: bench-admission
bench-admission: ## Pods/s to Bound with gpuqueue vs kube-scheduler alone (100 nodes x 8 GPUs, 1,000 pods); writes e2e/results/admission.{json,md}
	bin=$$($(E2E_TOOLS)) && GPUQUEUE_E2E_BIN="$$bin" $(CARGO) bench --locked -p gpuqueue-e2e --bench admission
