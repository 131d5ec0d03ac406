# havip — entry points. `make help` lists them.
SHELL := /bin/bash
CARGO ?= cargo
SCHEDULES ?= 1000
SEED ?= 1
export HAVIP_CACHE ?= $(HOME)/.cache/havip

.PHONY: chart chart-check images dockerd kind-node-image kind-e2e kind-up kind-run kind-down
.PHONY: testbin-metallb
.PHONY: prereqs help build testbin crds lint test test-unit test-e2e simulate bench-failover bench-k8s bench-scale bench bench-report chaos e2e lab-up lab-down docs demo demo-bgp demo-control-plane demo-down clean

help: ## List the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

build: ## Build every binary (debug)
	$(CARGO) build --workspace --all-targets

testbin: ## Build (or reuse) the pinned kube-apiserver, etcd and kubectl, and promtool (the alert rules' tests)
	@bash hack/testbin.sh control-plane >/dev/null
	@bash hack/testbin.sh promtool >/dev/null

testbin-metallb: ## Build (or reuse) MetalLB v0.15.2 (controller, speaker, CRDs) for bench-failover's metallb-l2 rows (about 5 min cold)
	@bash hack/testbin.sh metallb >/dev/null

crds: ## Regenerate the CRD YAML in the chart from the Rust types
	$(CARGO) run -q -p havip-crds --bin crdgen

HELM = $(shell bash hack/testbin.sh helm 2>/dev/null)/helm

chart: ## helm lint, and re-render charts/rendered/havip-default.yaml
	$(HELM) lint charts/havip -n havip-system
	$(HELM) template havip charts/havip -n havip-system > charts/rendered/havip-default.yaml

chart-check: ## helm lint and a drift check of the rendered chart
	$(HELM) lint charts/havip -n havip-system
	$(HELM) template havip charts/havip -n havip-system | diff -u charts/rendered/havip-default.yaml - || { echo "the rendered chart changed: run make chart"; exit 1; }

lint: ## rustfmt, clippy (warnings are errors), cargo-deny, unused dependencies, import cycles, MSRV
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings
	@tools=$$(bash hack/cargo-tools.sh) && \
	  echo "cargo deny check licenses bans sources" && "$$tools/cargo-deny" --log-level error check licenses bans sources && \
	  { "$$tools/cargo-deny" --log-level error check advisories || echo "cargo deny: advisories not checked (the RustSec database cannot be fetched here); not failing"; } && \
	  echo "cargo machete" && "$$tools/cargo-machete"
	for d in wire/src crds/src endpoints/src sm/src node-agent/src operator/src kubectl-havip/src e2e/src; do python3 hack/import-cycles.py $$d || exit 1; done
	@tc=$$(sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml); rv=$$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml); \
	  case "$$tc" in "$$rv"|"$$rv".*) ;; *) echo "rust-version $$rv (Cargo.toml) is not the toolchain CI builds with ($$tc, rust-toolchain.toml)"; exit 1;; esac

test-unit: ## Unit, property and drift tests (no cluster, no root)
	$(CARGO) test --workspace --exclude havip-e2e

test-e2e: testbin ## Tests against a real kube-apiserver + etcd, and the netns agent scenarios (root)
	$(CARGO) build --workspace --bins
	$(CARGO) test -p havip-e2e

prereqs: ## Install what `make test` needs (Debian packages through apt-get, as root; says what and why)
	@bash hack/prereqs.sh test

test: prereqs lint testbin ## Everything CI runs (root runs the network-namespace suites too)
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace
	$(CARGO) run -q -p havip-crds --bin crdgen -- --check
	$(MAKE) --no-print-directory chart-check
	$(MAKE) --no-print-directory simulate SCHEDULES=20000 SEED=1
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory chaos DURATION=3m; else echo "chaos: SKIPPED: needs root"; fi

bench-failover: ## Failover gaps of havip vs keepalived, and MetalLB L2 once `make testbin-metallb` built it (root): JSON lines; RUNS=10
	$(CARGO) build --release -p havip-node-agent --bin havip-agent -p havip-e2e --bin bench-failover
	HAVIP_AGENT_BIN=$(CURDIR)/target/release/havip-agent ./target/release/bench-failover --runs $(or $(RUNS),10)

chaos: testbin ## A chaos run on the Kubernetes lab (root): DURATION=10m, SEED=n (fresh and printed when unset), FAULTS=k (a schedule prefix), OUT=file
	$(CARGO) build --workspace --bins
	./target/debug/chaos --duration $(or $(DURATION),10m) $(if $(filter command line environment,$(origin SEED)),--seed $(SEED)) $(if $(FAULTS),--faults $(FAULTS)) $(if $(OUT),--out $(OUT))

e2e: testbin ## End-to-end suite on the local control plane (root): operator, agents, plugin
	$(CARGO) build --workspace --bins
	$(CARGO) test -p havip-e2e --test e2e_pairs --test kube_agent --test chart_rbac -- --test-threads 2

bench-k8s: testbin ## API-server cost per pair and apply-to-serving time (root): JSON lines
	$(CARGO) build --workspace --bins
	./target/debug/bench-k8s

SCALE_NODES ?= 10000
SCALE_PAIRS ?= 5000
bench-scale: testbin ## havip in a big cluster (root; release builds): SCALE_NODES=10000 Nodes of ~20 KB, SCALE_PAIRS=5000 pairs (100 on the lab's real nodes), about 12 min; JSON lines
	$(CARGO) build --release -p havip-node-agent --bin havip-agent -p havip-operator --bin havip-operator -p havip-e2e --bin bench-scale
	HAVIP_AGENT_BIN=$(REL)/havip-agent HAVIP_OPERATOR_BIN=$(REL)/havip-operator \
	  $(REL)/bench-scale --nodes $(SCALE_NODES) --pairs $(SCALE_PAIRS)

# `make bench`: every benchmark once, each writing docs/bench/<name>-<date>[-N].jsonl (the
# first line records the command, the time and the machine), then docs/benchmarks.md.
# CPU heavy (about an hour on 2 cores: bench-scale at 10,000 Nodes and 5,000 pairs about 12 min,
# bench-failover's planned-drain and planned-200 about 10); check `uptime` first on a shared machine.
BENCH_DATE := $(shell date -u +%Y-%m-%d)
BENCH_RUNS = $(or $(RUNS),5)
BENCH_PAIRS ?= 1000
# The first free docs/bench/<name>-<date>[-N].jsonl (an earlier run of the day is kept).
bench_file = $(shell n=docs/bench/$(1)-$(BENCH_DATE); f=$$n.jsonl; i=2; while [ -e $$f ]; do f=$$n-$$i.jsonl; i=$$((i+1)); done; echo $$f)
REL = $(CURDIR)/target/release

bench: testbin ## Every benchmark (root; RUNS=5 per failover scenario, BENCH_PAIRS=1000), then docs/benchmarks.md
	$(CARGO) build --release -p havip-node-agent --bin havip-agent -p havip-operator --bin havip-operator -p havip-e2e --bin bench-failover --bin bench-k8s --bin bench-scale --bin bench-report --bin bench-operator
	@set -eo pipefail; f=$(call bench_file,failover); echo "bench: failover gaps and agent footprint → $$f"; \
	  cmd="target/release/bench-failover --runs $(BENCH_RUNS) --footprint-vips 1,10,100"; \
	  $(REL)/bench-report meta --name failover --command "$$cmd" > $$f; \
	  HAVIP_AGENT_BIN=$(REL)/havip-agent ./$$cmd >> $$f
	@set -eo pipefail; f=$(call bench_file,k8s); echo "bench: API-server requests → $$f"; \
	  cmd="target/release/bench-k8s --steady-seconds 60"; \
	  $(REL)/bench-report meta --name k8s --command "$$cmd" > $$f; \
	  ./$$cmd >> $$f
	@set -eo pipefail; f=$(call bench_file,operator); echo "bench: operator with $(BENCH_PAIRS) pairs → $$f"; \
	  cmd="target/release/bench-operator --pairs $(BENCH_PAIRS)"; \
	  $(REL)/bench-report meta --name operator --command "$$cmd" > $$f; \
	  BENCH_OPERATOR_BIN=$(REL)/havip-operator ./$$cmd >> $$f
	@set -eo pipefail; f=$(call bench_file,scale); echo "bench: $(SCALE_NODES) Nodes, $(SCALE_PAIRS) pairs → $$f"; \
	  cmd="target/release/bench-scale --nodes $(SCALE_NODES) --pairs $(SCALE_PAIRS)"; \
	  $(REL)/bench-report meta --name scale --command "$$cmd" > $$f; \
	  HAVIP_AGENT_BIN=$(REL)/havip-agent HAVIP_OPERATOR_BIN=$(REL)/havip-operator ./$$cmd >> $$f
	$(REL)/bench-report render --dir docs/bench --out docs/benchmarks.md

bench-report: ## Re-render docs/benchmarks.md from docs/bench/*.jsonl (no benchmark runs)
	$(CARGO) run -q --release -p havip-e2e --bin bench-report -- render --dir docs/bench --out docs/benchmarks.md

# The simulator builds like the images (static, explicit target, same RUSTFLAGS as
# hack/images.sh) so that `make test` compiles the release dependencies only once.
HOST_TRIPLE := $(shell rustc -vV | sed -n 's/^host: //p')
simulate: ## Deterministic simulation: make simulate SCHEDULES=N SEED=S
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) run -q --release --target $(HOST_TRIPLE) -p havip-sm --features cli --bin havip-sim -- --schedules $(SCHEDULES) --seed $(SEED)

lab-up: testbin ## Start a local lab (control plane) in the background
	$(CARGO) build -q -p havip-e2e --bin lab
	./target/debug/lab up

lab-down: ## Stop the local lab and remove everything it created
	$(CARGO) build -q -p havip-e2e --bin lab
	./target/debug/lab down

images: ## Build the operator, agent and e2e-tools images (static binaries on scratch; needs a Docker engine)
	bash hack/images.sh

dockerd: ## Start a Docker engine that leaves the test bridges alone; prints the DOCKER_HOST line
	@bash hack/dockerd.sh start

KIND = $(shell bash hack/testbin.sh kind 2>/dev/null)/kind
KUBECTL = $(shell bash hack/testbin.sh control-plane 2>/dev/null)/kubectl
KIND_NODE_IMAGE = $(shell bash hack/kind-node-image.sh image)
KIND_E2E = ./target/debug/kind-e2e --kind $(KIND) --helm $(HELM) --kubectl $(KUBECTL) --node-image $(KIND_NODE_IMAGE)
# The Docker engine of hack/dockerd.sh unless DOCKER_HOST names one.
WITH_DOCKER = if [ -z "$$DOCKER_HOST" ]; then eval "$$(bash hack/dockerd.sh start)"; export DOCKER_HOST; fi;

kind-node-image: ## Build (or reuse) the offline kind node image havip/kind-node:v1.37.2 (root, Docker; cold about 9 min after the test binaries, 70 with an empty Go build cache; cached after)
	@bash hack/prereqs.sh kind
	@$(WITH_DOCKER) bash hack/kind-node-image.sh

kind-up: ## Create the kind cluster of the e2e suite, load the images, install the chart (needs the node image)
	@bash hack/prereqs.sh kind
	$(CARGO) build -q -p havip-e2e --bin kind-e2e -p kubectl-havip
	@$(WITH_DOCKER) $(KIND_E2E) up

kind-run: ## Run the e2e scenarios on the kind cluster (JSON line per scenario); ONLY=name runs one
	$(CARGO) build -q -p havip-e2e --bin kind-e2e -p kubectl-havip
	@$(WITH_DOCKER) $(KIND_E2E) run $(if $(ONLY),--only $(ONLY))

kind-down: ## Delete the kind cluster of the e2e suite
	$(CARGO) build -q -p havip-e2e --bin kind-e2e
	@$(WITH_DOCKER) $(KIND_E2E) down

kind-e2e: ## The e2e suite on kind: images, node image, cluster, chart, every scenario, cleanup (hack/kind-e2e.sh)
	@bash hack/prereqs.sh kind
	bash hack/kind-e2e.sh $(if $(ONLY),--only $(ONLY))

docs: ## The README and docs/ as a browsable site (mdBook, built once from crates.io): target/book/index.html
	@bash hack/docs.sh

demo: ## A guided tour (root): a pair on two netns nodes, a cut, a planned failover; leaves the lab running
	@CARGO=$(CARGO) bash hack/demo.sh

demo-bgp: ## The routed tour (root): a router with FRR in front of two netns nodes, a VIP over BGP, a cut, a planned failover
	@CARGO=$(CARGO) bash hack/demo.sh --bgp

demo-control-plane: ## The control-plane VIP's tour (root): etcd + kube-apiserver on three netns nodes, havip voting; a killed API server, a cut node, kubectl through the VIP
	@$(CARGO) build -q --workspace --bins
	@bash hack/testbin.sh control-plane >/dev/null
	@./target/debug/lab demo-control-plane

demo-down: ## Remove the demo's lab: processes, namespaces, addresses, files
	@$(CARGO) build -q -p havip-e2e --bin lab
	@./target/debug/lab down

clean: ## Remove build output (keeps the test-binary cache)
	$(CARGO) clean
