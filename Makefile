# kubegrace: the two commands that matter are `make demo` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo
CACHE ?= /var/cache/kubegrace
NEWCOMER_ROUNDS ?= 1

.PHONY: deps h2spec version-matrix lifecycle-test plugin krew fuzz actionlint cargo-deny release-images-check dockerfile-check newcomer-test chart-upgrade-test skew-test chart-lint chart-test all build test test-unit test-cluster lint fmt fmt-check clippy crds crd-check demo kind-test kind-demo bench bench-operator bench-scale cluster-up cluster-down images help

all: build

help: ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

build: ## debug build of every crate
	$(CARGO) build --workspace --all-targets

# The README's test command, and all of CI (.ci/run): installs what it needs
# (hack/install-deps), builds Kubernetes in the background, then every tier.
test: ## every test: installs what it needs, then lint, unit + in-process, then the cluster suite
	MAKE="$(MAKE)" hack/test-all

deps: ## what the tests and the demo need on a fresh Debian machine (packages, promtool, test venv, rustfmt/clippy, cargo-deny); a no-op when present
	hack/install-deps

# The in-process tests write configs, sockets and upgrade state into
# scratch directories under $$TMPDIR (about thirty per run): a private one,
# removed afterwards whatever the outcome, so a run leaves nothing in /tmp.
test-unit: deps ## unit and in-process integration tests (loopback only, no cluster)
	@scratch=$$(mktemp -d "$${TMPDIR:-/tmp}/kubegrace-test.XXXXXX") && \
	trap 'rm -rf "$$scratch"' EXIT && \
	echo "$(CARGO) test --workspace --exclude kubegrace-e2e --all-features  (TMPDIR=$$scratch)" && \
	TMPDIR="$$scratch" $(CARGO) test --workspace --exclude kubegrace-e2e --all-features && \
	echo "$(CARGO) test -p kubegrace-e2e --lib --bins --test loadgen --test demo_app --test metrics_exposition" && \
	TMPDIR="$$scratch" $(CARGO) test -p kubegrace-e2e --lib --bins --test loadgen --test demo_app --test metrics_exposition && \
	echo "hack/h2spec" && TMPDIR="$$scratch" hack/h2spec

h2spec: ## the sidecar's HTTP/2 side against h2spec's 145 cases (part of test-unit; known failures in hack/h2spec.known)
	hack/h2spec

fuzz: ## the property tests long: fast-path parsers and drain configs (FUZZ_CASES per property, default 100000, about 1 min), GraceRoute specs (FUZZ_OPERATOR_CASES, default 20000, about 11 min)
	KUBEGRACE_FUZZ_CASES=$${FUZZ_CASES:-100000} $(CARGO) test -p kubegrace-sidecar --lib proxy::h1::fuzz -- --test-threads=2
	KUBEGRACE_FUZZ_CASES=$${FUZZ_CASES:-100000} $(CARGO) test -p kubegrace-sidecar --lib drain::fuzz -- --test-threads=2
	KUBEGRACE_FUZZ_CASES=$${FUZZ_OPERATOR_CASES:-20000} $(CARGO) test -p kubegrace-operator --lib rules::fuzz -- --test-threads=2

test-cluster: deps ## cluster tests on $$KUBECONFIG, or on the local single-node cluster (booted and torn down here)
	e2e/run-cluster-tests

lint: deps fmt-check clippy crd-check actionlint cargo-deny ## formatting, clippy -D warnings, CRD drift, GitHub workflows, dependencies (cargo-deny), dead Markdown links
	hack/check-links --self-test
	hack/check-links
	hack/check-file-sizes
	hack/check-duplicates

actionlint: ## the GitHub workflows (actionlint, built from the Go module proxy once)
	hack/actionlint

cargo-deny: ## the dependency graph against deny.toml: licenses, bans, sources, advisories where the RustSec DB can be fetched (or against a local clone: KG_ADVISORY_DB=DIR)
	hack/cargo-deny

fmt: ## format the code
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all -- --check

# --all-features: the bench's cluster-side code (bench-scale, bench-operator,
# bench-null-webhook) sits behind features no other crate turns on.
clippy:
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings

crds: ## regenerate crds/ from the Rust types (and the chart's copy)
	$(CARGO) run -q -p kubegrace-operator -- crd > crds/graceroutes.kubegrace.io.yaml.tmp
	mv crds/graceroutes.kubegrace.io.yaml.tmp crds/graceroutes.kubegrace.io.yaml
	charts/kubegrace/hack/check-crd-sync --fix

crd-check: ## fail when crds/ differs from what the Rust types print
	@if [ -f crds/graceroutes.kubegrace.io.yaml ]; then \
	  $(CARGO) run -q -p kubegrace-operator -- crd | diff -u crds/graceroutes.kubegrace.io.yaml - \
	  || { echo "crds/ is stale: run 'make crds' and commit" >&2; exit 1; }; \
	else echo "crd-check: no CRD yet"; fi
	charts/kubegrace/hack/check-crd-sync

chart-lint: ## Helm chart: lint, renders, schema refusals, CRD copy, README (+ server dry run if $$KUBECONFIG works)
	charts/kubegrace/hack/lint

chart-test: ## the chart against a throwaway kube-apiserver: RBAC, webhook selectors, caBundle across upgrades
	charts/kubegrace/hack/test-apiserver

chart-upgrade-test: ## helm upgrade from the previous chart version on $$KUBECONFIG's cluster: CRD schema upgraded, GraceRoute kept, 0 failed requests
	charts/kubegrace/hack/test-upgrade

skew-test: ## the version skew of docs/skew.md on $$KUBECONFIG's cluster: chart upgrade under load from the previous release, its own operator and sidecar built from that commit (once, cached), old sidecars on the new operator with new route fields, plugin against both operators, 0 failed requests
	KG_PREVIOUS_IMAGE_TAG=build KG_IMAGE_TAG=$${KG_IMAGE_TAG:-e2e} charts/kubegrace/hack/test-upgrade

version-matrix: ## the core cluster suite on the oldest and newest supported Kubernetes (each built once, booted, torn down): e2e/matrix/results/
	e2e/matrix/run

lifecycle-test: ## the pod lifecycle events of Kubernetes 1.36+ (e2e/tests/lifecycle.rs: in-place restart of every container, in-place resize) on a local 1.37.2 cluster (built once, booted, torn down): e2e/lifecycle/results/
	KG_MATRIX_VERSIONS=v1.37.2 KG_MATRIX_STEPS=lifecycle KG_MATRIX_RESULTS=$(CURDIR)/e2e/lifecycle/results \
	  KG_MATRIX_TITLE='Pod lifecycle events' KG_MATRIX_TARGET='make lifecycle-test' e2e/matrix/run

newcomer-test: ## the README's Install and Use blocks as written on $$KUBECONFIG's cluster (e2e images as the release ones), checked, Verify with the plugin from its release archive (as krew installs it), then Uninstall (NEWCOMER_ROUNDS=N: N fresh installs back to back)
	NEWCOMER_ROUNDS=$(NEWCOMER_ROUNDS) e2e/newcomer/run

cluster-up: ## boot the local single-node cluster (prints the kubeconfig)
	e2e/cluster/up

cluster-down: ## remove everything the local cluster created
	e2e/cluster/down

.PHONY: argo-up argo-down argo-test
argo-up: ## Argo Rollouts (v1.10.1, built from the Go module proxy once and cached) in the local cluster: CRDs and controller, waited for
	e2e/argo/up

argo-down: ## remove Argo Rollouts from the local cluster, CRDs too
	e2e/argo/down

argo-test: ## the Argo Rollouts tests alone (in `make test` too): a canary and a blue-green Rollout under load with and without kubegrace, and Argo's own smoke test; on $$KUBECONFIG's cluster or the local one (booted and torn down here)
	$(CARGO) build -p kubectl-kubegrace --bin kubectl-kubegrace
	KUBEGRACE_E2E_CLUSTER=1 e2e/cluster/with-cluster $(CARGO) test -p kubegrace-e2e --test argo_rollouts --test argo_rollouts_smoke -- --test-threads=1

images: ## build static images and import them into the cluster
	e2e/cluster/images

demo: deps ## roll a Deployment under load with and without kubegrace; print the table
	e2e/demo

# Nodes of the kind cluster: one control plane and KIND_NODES-1 workers (make kind-test KIND_NODES=3).
KIND_NODES ?= 1

kind-test: deps ## the kind path end to end: Docker (started here), kind, the offline node image, the e2e suite; then cleanup
	KIND_NODES=$(KIND_NODES) e2e/kind/test

kind-demo: deps ## make demo on the kind path (Docker started here and stopped afterwards)
	KIND_NODES=$(KIND_NODES) e2e/kind/test demo

plugin: ## kubectl-kubegrace (debug), ready to copy onto PATH
	$(CARGO) build -p kubectl-kubegrace --bin kubectl-kubegrace

KREW_ARCHES ?= amd64 arm64
KREW_OUT ?= $(or $(CARGO_TARGET_DIR),target)/krew
krew: ## static release archives of kubectl-kubegrace ($$KREW_ARCHES) and plugin/krew/kubegrace.yaml written from them
	rm -f $(KREW_OUT)/kubectl-kubegrace_*.tar.gz
	plugin/krew/package $(KREW_OUT) $(KREW_ARCHES)
	plugin/krew/manifest v$$($(CARGO) metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "kubectl-kubegrace"))') \
	  $(KREW_OUT)/kubectl-kubegrace_*.tar.gz > plugin/krew/kubegrace.yaml.tmp
	mv plugin/krew/kubegrace.yaml.tmp plugin/krew/kubegrace.yaml

bench: ## the sidecar against nginx, HAProxy and Caddy, side by side (under 10 min)
	bench/run
bench-operator: ## operator webhook latency and reconcile time on the local cluster (bench/results/operator.json)
	e2e/cluster/with-cluster cargo run -p kubegrace-bench --features operator --bin bench-operator
bench-scale: ## one operator, a whole cluster: kwok nodes, 200 routes and 2,000 injected pods on the local cluster (bench/results/scale.json; SCALE_* knobs in bench/scale)
	bench/scale
release-images-check: ## release images (sidecar, operator) for amd64+arm64 from a clean checkout, offline, checked (heavy: two release builds; not in `make test`)
	e2e/images/check-release
dockerfile-check: ## the Dockerfile: hadolint, and (with Buildah) an offline FROM-scratch build from prebuilt binaries, checked
	e2e/images/check-dockerfile
