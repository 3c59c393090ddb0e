# Chatfleet: `make help` is the map.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV    ?= .venv
PY      := $(VENV)/bin/python
PYTEST  := $(VENV)/bin/pytest
# The workspace's pyproject.toml (tools, the dev group) and each package's own (its pinned dependencies)
PYPROJECTS := pyproject.toml contract/pyproject.toml operator/pyproject.toml picker/pyproject.toml runtime/pyproject.toml hack/pyproject.toml
STAMP   := $(VENV)/.installed-$(shell cat $(PYPROJECTS) 2>/dev/null | sha1sum | cut -c1-12)
PLATFORM := $(PY) -m chatfleet_platform.cli
NODES   ?= 4
REAL_NODES ?= 1
GATEWAY ?= 0
# two lanes side by side, each with its own clusters: the layers cheapest first in one, and in the other the
# real-pod layer, the longest (it mostly waits on real pods), from the start, so that its cluster, real node
# and image import come up while the cheap layers run; the cheap lane runs at a lower CPU priority (nice 10),
# so the real pods' starts on the critical path are not slowed by it. A failing layer stops both lanes.
# hack/test-layers.sh says how stages and lanes run and stop.
TEST_STAGES := "tests/unit tests/admission tests/chart tests/integration tests/e2e | tests/realnode"
export PYTHONUNBUFFERED := 1

##@ Start here

.PHONY: demo
demo: setup ## The main job on the local platform: GPU nodes, the fleet, a chat, a bad canary rolled back
	@$(PY) -m chatfleet_platform.demo.demo

.PHONY: test
test: setup lint contracts ## Everything: install, lint, layering contracts, then the test layers (cheapest first, the real-pod layer beside them; stops at the first that fails)
	@bash hack/test-layers.sh $(PYTEST) $(TEST_STAGES)

.PHONY: check
check: venv lint contracts ## The fast inner loop (minutes): lint, layering contracts, unit tests; no platform
	$(PYTEST) -q -n 2 tests/unit

.PHONY: help
help: ## This list
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m\n"} \
	  /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } \
	  /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Setup (each target installs what it needs; `make test` and `make demo` call them)

.PHONY: setup
setup: system-deps ## Python packages, Debian packages, platform binaries, chart tools, test servers, images
	@# The Go builds keep both cores busy; the venv, the images and the test servers mostly wait on the
	@# network, the disk and pip, so they run beside them (each prints its own [build]/[images] lines): the
	@# venv first, then the images (they need it) and the test servers (their torch from pip's cache).
	@$(MAKE) --no-print-directory -j3 platform-build test-servers images
	@$(MAKE) --no-print-directory chart-tools

.PHONY: venv
venv: $(STAMP) ## Virtual environment: the four packages and the platform (editable), the dev tools (pinned)

$(STAMP): $(PYPROJECTS)
	@command -v python3 >/dev/null || { echo "error: python3 (>= 3.11) is missing"; exit 1; }
	@# a fresh clone takes the venv kept for these very pins, pointed at this clone (hack/venv-cache.sh);
	@# else pip installs them (into the venv there is, or a new one)
	@if test -x $(PY) || ! bash hack/venv-cache.sh restore $(VENV) $(PYPROJECTS); then \
	  set -e; test -x $(PY) || python3 -m venv $(VENV); \
	  echo "$(PY) -m pip install -q -U pip setuptools wheel"; \
	  $(PY) -m pip install -q -U pip setuptools wheel || { echo "error: cannot reach the Python package registry to install pip/setuptools"; exit 1; }; \
	  $(PY) -m pip uninstall -q -y chatfleet 2>/dev/null || true; \
	  echo "$(PY) -m pip install -q --group dev -e ./contract -e ./operator -e ./picker -e ./runtime -e ./hack"; \
	  $(PY) -m pip install -q --group dev -e ./contract -e ./operator -e ./picker -e ./runtime -e ./hack || { echo "error: pip could not install the pinned packages of the pyproject.toml files (is the Python package registry reachable?)"; exit 1; }; \
	fi
	@rm -f $(VENV)/.installed-* && touch $@
	@bash hack/venv-cache.sh save $(VENV) $(PYPROJECTS)

.PHONY: system-deps
system-deps: ## Debian packages: prometheus, redis-server; containerd, runc, CNI, iptables, socat for real nodes; buildah, debootstrap for images
	@bash hack/install-system-deps.sh

.PHONY: platform-build
platform-build: ## Build etcd, Kubernetes, kwok, helm, Prometheus, KEDA and Traefik from the Go module proxy (cached by version)
	@bash hack/build-platform.sh

.PHONY: test-servers
test-servers: | venv ## The OCI registry (Go module proxy) and moto's S3 server (own venv) the model-URI tests start; guidellm (own venv), the stock benchmark client
	@bash hack/build-test-servers.sh

.PHONY: chart-tools
chart-tools: venv platform-build ## checkov in its own venv (in the binary cache, by version), the Prometheus Operator CRDs, actionlint, krew (cached by version)
	@bash hack/chart-checkov.sh --install-only
	@bash hack/chart-monitoring-crds.sh >/dev/null
	@bash hack/build-platform.sh actionlint krew

##@ Local platform

.PHONY: cluster-up
cluster-up: setup ## Start the local Kubernetes: NODES (4) simulated GPU nodes, REAL_NODES (1) real ones, GATEWAY=1 Traefik; prints `export KUBECONFIG=...`
	@$(PLATFORM) up --nodes $(NODES) --real-nodes $(REAL_NODES) $(if $(filter 1,$(GATEWAY)),--gateway)

.PHONY: cluster-down
cluster-down: ## Stop exactly what cluster-up started, undo its host changes (bridges, iptables, cgroups), remove its folder
	@$(PLATFORM) down

.PHONY: cluster-status
cluster-status: ## Show the local platform's processes, ports and nodes
	@$(PLATFORM) status

IMAGES ?= base pause operator runtime

.PHONY: images
images: venv ## Build the operator and runtime images (and containerd's pause) with buildah, no registry; cached
	@$(PY) -m chatfleet_platform.cluster.images build $(IMAGES)

.PHONY: load-images
load-images: ## Import the built images into the containerd at ADDRESS (its socket), pause first
	@test -n "$(ADDRESS)" || { echo "usage: make load-images ADDRESS=/path/to/containerd.sock"; exit 1; }
	@$(PY) -m chatfleet_platform.cluster.images load --address $(ADDRESS)

##@ Development

.PHONY: lint
lint: venv ## ruff
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

.PHONY: fmt
fmt: venv ## Format and fix with ruff
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

.PHONY: contracts
contracts: venv ## import-linter: the layering (one API module, pure builders and planners)
	$(VENV)/bin/lint-imports

.PHONY: unit
unit: venv ## Unit tests only (no platform)
	$(PYTEST) tests/unit

.PHONY: test-realnode
test-realnode: setup ## Tests on real pods: the examples, releases on real traffic, the operator image in a pod
	$(PYTEST) tests/realnode

.PHONY: test-e2e
test-e2e: setup ## Release scenarios end to end (canary, blue-green, rollback, GPUs) on the local platform
	$(PYTEST) tests/e2e

.PHONY: run
# Host directories a ChatbotService may mount when the operator runs from this checkout (the examples' and
# the local platform's); a cluster's admin sets operator.allowedHostPaths (docs/security.md).
ALLOWED_HOST_PATHS ?= /models /var/lib/models

run: venv ## Run the operator in the foreground against the current KUBECONFIG (ALLOWED_HOST_PATHS: hostPath prefixes)
	$(PY) -m chatfleet_operator.cli run $(foreach p,$(ALLOWED_HOST_PATHS),--allowed-host-path=$(p))

.PHONY: serve
serve: venv system-deps ## Run the runtime locally (Triton + chat API + Redis) on a tiny model; prints CHAT_API=...
	$(PY) -m chatfleet_platform.localruntime.serve

##@ Helm chart

HELM = $(shell $(PY) -c 'from chatfleet_platform.common.config import binaries; print(binaries().helm)' 2>/dev/null)

.PHONY: chart-readme
chart-readme: venv ## Regenerate the chart's README (its values table) from Chart.yaml, values.schema.json and values.yaml
	$(PY) hack/chart_readme.py

.PHONY: chart-lint
chart-lint: venv platform-build ## helm lint --strict and helm template
	$(HELM) lint --strict charts/chatfleet-operator
	$(HELM) template cf charts/chatfleet-operator >/dev/null

.PHONY: chart-test
chart-test: setup ## All chart tests (render, schema, promtool, Lua, checkov, install/upgrade/uninstall, RBAC proof)
	$(PYTEST) tests/chart

.PHONY: chart-checkov
chart-checkov: chart-tools ## Policy scan of the rendered chart (skips justified in docs/chart.md)
	bash hack/chart-checkov.sh

.PHONY: chart-sync-crds
chart-sync-crds: ## Copy crds/ into the chart after editing the CRD (a test fails on drift)
	bash hack/sync-chart-crds.sh

.PHONY: chart-package
chart-package: venv platform-build ## helm package into dist/
	$(HELM) package charts/chatfleet-operator -d dist

.PHONY: release-dry-run
release-dry-run: ## The release pipeline's script, nothing pushed: tag vs versions, lint, package, render into dist/release; prints the push and sign commands (TAG=vX.Y.Z)
	@bash hack/build-platform.sh helm
	@bash hack/release.sh --dry-run $(if $(TAG),--tag $(TAG))

##@ Benchmarks (apart from tests; each prints a table and writes bench-results/*.json)

.PHONY: bench
bench: bench-platform bench-operator bench-runtime bench-rollout bench-autoscale bench-autoscale-ramp bench-release-traffic bench-quality bench-answer-cache bench-routing bench-chaos ## All benchmarks

.PHONY: bench-platform
bench-platform: setup ## Platform: cold build, warm start-to-ready, memory at rest, 1,000 GPU pods on 250 nodes
	$(PY) bench/platform_bench.py

.PHONY: bench-operator
bench-operator: setup ## Operator: 200 and 1,000 ChatbotServices to Ready beside the no-operator floors (bare Deployments; the operator's own objects, no operator; those and the ChatbotServices with their status written once, no operator), API writes, machine CPU, where the time goes; the floors and the operator in three rounds on new clusters, each round's ratios and their median
	$(PY) bench/operator_bench.py --rounds 3 --custom-resource-floor

.PHONY: bench-runtime
bench-runtime: setup ## Runtime vs llama-server (built on first use), transformers continuous batching and static generate() on the Qwen2-0.5B-shaped model: tokens/s, TTFT, ITL, RSS at 1/8/32, sampled and greedy (30 to 37 min measured on 2 shared cores; first llama-server build up to 30 min more)
	@bash hack/build-llama-server.sh
	$(PY) bench/runtime_bench.py $(BENCH_ARGS)

.PHONY: bench-gpu
bench-gpu: setup ## GPU sheet (needs an NVIDIA GPU): the engine on Qwen2-0.5B- and 7B-shaped models at 1/32/128/256+ conversations, fp16/bf16/int8/fp32/auto: tokens/s, TTFT, ITL, memory vs KV budget, HBM share (~7 min)
	$(PY) bench/gpu_sheet.py $(BENCH_ARGS)

.PHONY: bench-runtime-soak
bench-runtime-soak: setup ## Runtime soak: 24 overlapping streamed and non-streamed chats for SOAK_SECONDS (600): RSS and tokens/s, last vs first quarter (12 min measured)
	$(PY) bench/runtime_bench.py --soak $(or $(SOAK_SECONDS),600)

.PHONY: bench-answer-cache
bench-answer-cache: setup ## Answer cache: the same customer-service dialogues with spec.runtime.answerCache off and on (real tritonserver, shaped model): generations, tokens, latency, hits (~10 min)
	$(PY) bench/answer_cache_bench.py $(BENCH_ARGS)

.PHONY: bench-chaos
bench-chaos: setup ## Faults, in two parts: 10 replica SIGKILLs, 2 frozen replicas (lost nodes), 2 Redis restarts under 32 streamed dialogues, the stream relay's resume beside the same run without it (processes on 127.0.0.1; ~12 min); then bench-chaos-upgrades
	$(PY) bench/chaos_bench.py $(BENCH_ARGS)
	$(PY) bench/upgrade_bench.py

.PHONY: bench-chaos-pods
bench-chaos-pods: setup ## Faults on real pods under 32 streamed users, on two real GPU nodes: 10 chat-api SIGKILLs, 2 GPU nodes lost and 2 Redis restarts a row, the ChatbotService's stream relay beside the fleet's Service (~20 min)
	$(PY) bench/chaos_pods_bench.py

.PHONY: bench-chaos-upgrades
bench-chaos-upgrades: setup ## Operator upgrades on real pods: the chart's operator pod upgraded by helm between builds of three versions of the operator's code (two good, one bad) under 32 streamed users on 3 fleets, the upgrade wave beside no wave: fleets rolling at once, fleets a bad build reaches, what users saw (~15 min)
	$(PY) bench/upgrade_bench.py

.PHONY: bench-routing
bench-routing: setup ## InferencePool routing: Chatfleet's endpoint picker vs plain Services and session hashing behind real Envoy, the operator's pods on the real node: prefix affinity, TTFT, revision switches and canary shares through its release (~18 min)
	$(PY) bench/routing_bench.py $(BENCH_ARGS)

.PHONY: bench-rollout
bench-rollout: setup ## Chatfleet vs the real Argo Rollouts v1.10.2 (built on first use): bad canary (errors, latency, never Ready) to rollback, 5-step promotion, false rollbacks (~15 min)
	@bash hack/build-platform.sh argo-rollouts
	$(PY) bench/rollout_bench.py

.PHONY: bench-autoscale
bench-autoscale: setup ## Autoscaling: a compressed day + 5x surge; static, reactive, forecast+warm pool, +SLO, +declared surge, oracle (~22 min)
	$(PY) bench/autoscale_bench.py $(BENCH_ARGS)

.PHONY: bench-autoscale-ramp
bench-autoscale-ramp: setup ## Autoscaling, the fair run: nothing compressed, an hour of the morning ramp + a 5x surge, the same six rows (~75 min)
	$(PY) bench/autoscale_bench.py --ramp $(BENCH_ARGS)

.PHONY: bench-release-traffic
bench-release-traffic: setup ## Releases on real pods: streams cut, non-2xx, lost histories (plain Deployment without the drain, Service, Traefik); sticky vs unpinned dialogues (ROWS= picks rows)
	$(PY) bench/release_traffic_bench.py

.PHONY: bench-quality
bench-quality: setup ## Answer-quality gate on real pods: false rollbacks over 10 resource-only releases; a broken template's time to detection, gate on vs HTTP metrics only
	$(PY) bench/quality_bench.py
