# image-refresh — every entry point an operator or a developer needs.
#   make demo    the main job on an embedded local cluster and registry
#   make test    every test (builds the cluster binaries once, ~8 min cold)
#   make bench   figures of `run` (docs/performance.md); bench-100k: 100,000 workloads
#   make soak    `run` under 20 minutes of faults (docs/reliability.md)

SHELL := /bin/bash
CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/image-refresh
RUN_DIR ?= $(CACHE)/run
GO ?= go
# Go 1.27.3, fetched by the go command itself as a module (about 10 s once):
# 1.26.8 carries standard-library vulnerabilities that govulncheck reports as
# reachable (net/http, crypto/tls, crypto/x509). `make GOTOOLCHAIN=local`
# uses the installed Go instead.
export GOTOOLCHAIN := go1.27.3
LOCALCLUSTER := bin/localcluster
FUZZTIME ?= 10s

.PHONY: all build test vet vulncheck fuzz demo cluster-bin argo-rollouts cosign cluster-up cluster-down cluster-node-down cluster-node-up cluster-node-cache clean

all: build

build:
	$(GO) build -o bin/image-refresh .

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }

# The cluster binaries (kube-apiserver, controller-manager, scheduler, etcd,
# kwok) are built once into $(CACHE)/cluster-<version>/ and reused.
cluster-bin:
	@hack/build-cluster.sh >/dev/null

# The real Argo Rollouts controller of the K2 tests, built from its released
# module into the cluster cache (about 10 minutes cold; a no-op once built).
argo-rollouts:
	@hack/build-argo-rollouts.sh >/dev/null

# The real cosign CLI of the V1 and V5 tests (image-refresh and cosign
# agree), built from its released module into the cluster cache (about 8
# minutes cold on 2 cores; a no-op once built).
cosign:
	@hack/build-cosign.sh >/dev/null

# The main job, narrated, on a local cluster and registry of its own (about
# three minutes once the cluster binaries are built). Its steps 7, 8 and 9 run on a real
# node (root, hack/install-real-node.sh); REAL_NODES=0 leaves it out. KEEP=1
# leaves the cluster running in $(RUN_DIR); `make cluster-down` stops it
# (bin/localcluster then runs the real node's forwarder).
demo: $(if $(filter-out 0,$(KEEP)),$(LOCALCLUSTER))
	@if [[ "$(or $(REAL_NODES),1)" != 0 ]]; then hack/install-real-node.sh; fi
	@bindir=$$(hack/build-cluster.sh) && KEEP="$(KEEP)" $(GO) run ./hack/demo -bin-dir "$$bindir" -run-dir "$(RUN_DIR)" \
		-real-node=$(if $(filter 0,$(or $(REAL_NODES),1)),false,true) -localcluster "$(abspath $(LOCALCLUSTER))"

# The CNCF Distribution registry of the second-registry tests (Debian package
# docker-registry, no system service left running); a no-op once installed.
.PHONY: distribution
distribution:
	@hack/install-distribution.sh

# The Debian packages the real node runs (containerd, runc, CNI plugins,
# iptables); a no-op once installed.
.PHONY: real-node-deps
real-node-deps:
	@hack/install-real-node.sh

# The end-to-end areas (test/e2e/<area>: each test binary starts a local
# cluster of its own and mostly waits on it) are most of `make test`: they
# run as one go test, three test binaries at once, longest first, next to
# one go test of every other package (the second list is go list ./...
# less the first, so every test runs exactly once, a new package included),
# which runs the short fuzz runs when it is done, while the areas still run
# (on one fuzz worker each, so that the areas keep the other core);
# govulncheck, single-threaded, runs beside both and prints when done.
# The suite is bound by CPU on 2 cores: more test binaries at once made it
# slower (docs/performance.md, "The test suite").
E2E_AREAS := ./test/e2e/admission ./test/e2e/tick ./test/e2e/policy ./test/e2e/run ./test/e2e/discovery
test: cluster-bin argo-rollouts cosign real-node-deps vet distribution promtool
	@areas=$$($(GO) list $(E2E_AREAS)) && pids=() && \
	{ { out=$$($(MAKE) -s vulncheck 2>&1); rc=$$?; printf '%s\n' "$$out"; exit $$rc; } & pids+=($$!); } && \
	{ { $(GO) test -race -count=1 -timeout 25m $$($(GO) list ./... | grep -vxF "$$areas") && $(MAKE) -s fuzz FUZZPARALLEL=1; } & pids+=($$!); } && \
	{ $(GO) test -race -count=1 -timeout 25m -p 3 $(E2E_AREAS) & pids+=($$!); } && \
	rc=0 && for p in "$${pids[@]}"; do wait "$$p" || rc=1; done; exit $$rc

# govulncheck on ./... against a vulnerability database built locally from the
# golang.org/x/vulndb module (no online database); fails on any reachable one.
vulncheck:
	@GO="$(GO)" hack/vulncheck.sh

# promtool for the chart's alert-rule tests (test/e2e/chart TestAlerts_*),
# built once from the prometheus Go module and cached; the tests call the
# same script, so this only moves the first build out of go test's timeout.
.PHONY: promtool
promtool:
	@GO="$(GO)" hack/promtool.sh >/dev/null

# A short run of every fuzz target; the seed corpora live in testdata/fuzz.
fuzz:
	@GO="$(GO)" FUZZTIME="$(FUZZTIME)" FUZZPARALLEL="$(FUZZPARALLEL)" hack/fuzz.sh

$(LOCALCLUSTER): $(shell find hack/localcluster test/support/localcluster test/support/testregistry test/support/content -name '*.go' -o -name '*.yaml' -o -name '*.txt' 2>/dev/null)
	@$(GO) build -o $@ ./hack/localcluster

# Prints exactly two lines: eval "$(make -s cluster-up)". REAL_NODES=1 adds
# a node run by a real kubelet and containerd (docs/local-cluster.md); unset,
# cluster-up starts none (make demo starts one).
cluster-up: $(LOCALCLUSTER)
	@if [[ "$(or $(REAL_NODES),0)" != 0 ]]; then hack/install-real-node.sh; fi
	@bindir=$$(hack/build-cluster.sh) && REAL_NODES="$(or $(REAL_NODES),0)" $(LOCALCLUSTER) up "$$bindir" "$(RUN_DIR)"

cluster-down: $(LOCALCLUSTER)
	@$(LOCALCLUSTER) down "$(RUN_DIR)"

cluster-node-down: $(LOCALCLUSTER)
	@test -n "$(NODE)" || { echo "usage: make cluster-node-down NODE=node-3"; exit 2; }
	@$(LOCALCLUSTER) node-down "$(RUN_DIR)" "$(NODE)"

cluster-node-up: $(LOCALCLUSTER)
	@test -n "$(NODE)" || { echo "usage: make cluster-node-up NODE=node-3"; exit 2; }
	@$(LOCALCLUSTER) node-up "$(RUN_DIR)" "$(NODE)"

# Makes NODE's image cache say DIGEST for IMAGE (a stale :tag, as in the
# seed's incident); new pods on NODE report it as their imageID. Without
# IMAGE and DIGEST it prints NODE's cache.
cluster-node-cache: $(LOCALCLUSTER)
	@test -n "$(NODE)" || { echo "usage: make cluster-node-cache NODE=node-2 IMAGE=repo:tag DIGEST=sha256:..."; exit 2; }
	@$(LOCALCLUSTER) node-cache "$(RUN_DIR)" "$(NODE)" $(if $(IMAGE),"$(IMAGE)" "$(DIGEST)")

# Figures of `run` on a local cluster and registry of its own: revert → re-pin
# latency, registry and API requests, passes over 1,000 workloads. About 17
# minutes on 2 cores, 12 of them rolling out the 1,000 Deployments;
# BENCH_WORKLOADS=300 scales that down (roughly 9 minutes in all, estimated). See
# docs/performance.md.
.PHONY: bench
bench:
	@bindir=$$(hack/build-cluster.sh) && $(GO) run ./hack/bench -bin-dir "$$bindir"

# The scale phase alone at 100,000 zero-replica Deployments in 1,000 groups
# (issue 38; docs/performance.md, "100,000 workloads"). -large-cluster
# gives the bench's cluster a larger etcd quota and apiserver in-flight
# limits and turns kube-controller-manager's deployment controller off: the
# bench writes each zero-replica Deployment's status itself (about 100
# statuses/s here against about 28 Deployments/s from the
# controller-manager's deployment controller: an hour for 100,000).
# `make bench` runs the same phase at its default 10,000 on the default
# cluster.
.PHONY: bench-100k
bench-100k:
	@bindir=$$(hack/build-cluster.sh) && $(GO) run ./hack/bench -bin-dir "$$bindir" -phases scale -workloads 100000 -resync-runs 2 -create-workers 64 -large-cluster

# The soak (issue 14): `run` over SOAK_WORKLOADS Deployments for SOAK_FOR
# under a seeded random mix of reverts, digest pushes, registry 5xx/429
# bursts and one kube-apiserver restart; then every target must be on its
# latest digest with every record matching, rollouts and ReplicaSets
# within what the events caused, heap and goroutines flat; exit 1 if not.
# About 25 minutes on 2 shared cores. Not part of `make test`. See
# docs/reliability.md. SOAK_FLAGS=-keep-run-dir keeps the run directory
# (cluster logs, controller.log).
SOAK_FOR ?= 20m
SOAK_WORKLOADS ?= 500
SOAK_SEED ?= 1
SOAK_FLAGS ?=
.PHONY: soak
soak:
	@bindir=$$(hack/build-cluster.sh) && $(GO) run ./hack/bench -bin-dir "$$bindir" -phases soak -soak-for $(SOAK_FOR) -workloads $(SOAK_WORKLOADS) -seed $(SOAK_SEED) $(SOAK_FLAGS)

clean:
	rm -rf bin

# The image-refresh OCI image, built with ko (no Docker engine) and pushed to
# $(REGISTRY)/image-refresh:dev; prints the reference with its digest. Needs
# REGISTRY: eval "$(make -s cluster-up)". VERSION, TAG, KO_DEFAULTBASEIMAGE:
# see hack/image/build.sh and docs/image.md.
.PHONY: image
image:
	@GO="$(GO)" TOOLS_DIR="$(CACHE)/tools" hack/image/build.sh
