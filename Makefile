# The Makefile is the entry point: `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
BIN := bin/provider
PKGS := ./...
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# A static, CGO-free binary (pure-Go libvirt and Proxmox clients): it runs
# on distroless/scratch. Tests still build with cgo for -race.
LDFLAGS := -s -w -X github.com/bigfleet-vm/provider/version.stamped=$(VERSION)
CONTAINER ?= $(shell command -v podman >/dev/null 2>&1 && echo podman || echo docker)
IMAGE ?= bigfleet-provider:$(VERSION)
BASE_IMAGE ?= gcr.io/distroless/static-debian12:nonroot
# make run keeps its state (desired document and simulated world) in
# RUN_DIR, so `provider plan` works offline on it and a restart finds its
# VMs; `rm -rf .run` starts afresh. --drift-repair-delay holds a repair
# back long enough to see it pending in `provider plan` (README demo);
# e2e/demo_test.go runs the demo with these flags.
RUN_DIR := .run
RUN_FLAGS ?= --use-fake-backend --seed-count 32 --addr 127.0.0.1:9000 --metrics-addr 127.0.0.1:9090 --state $(RUN_DIR)/state --fake-admin --drift-repair-delay 30s

# STATICCHECK is run with `go run` at a pinned version, so `make lint`
# needs nothing installed besides Go (and the module proxy once).
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
# The race detector needs cgo, i.e. a C compiler; with only Go installed
# (go env CGO_ENABLED says 0) `make test` runs without it and says so.
RACE := $(shell [ "$$($(GO) env CGO_ENABLED)" = 1 ] && command -v "$$($(GO) env CC | cut -d' ' -f1)" >/dev/null 2>&1 && echo -race)
FUZZTIME ?= 30s

.PHONY: help build run test bench bench-scale fuzz golden proto lint check integration soak ha ha-bench ha-etcd34 pve-sim clean image local-base deploy-test container-test

help: ## List the targets.
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## Build bin/provider (static, CGO-free, version-stamped).
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/provider

run: build ## Run the provider on the embedded libvirt-shaped simulator (state in .run/).
	@mkdir -p $(RUN_DIR)
	@echo "provider: gRPC on 127.0.0.1:9000, metrics on 127.0.0.1:9090 (simulator, $(RUN_FLAGS))"
	@echo "try:  go run github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4 -plaintext -d '{\"max_results\":3}' 127.0.0.1:9000 bigfleet.v1alpha1.CapacityProvider/List"
	@echo "plan: ./$(BIN) plan --server http://127.0.0.1:9090   (or offline: ./$(BIN) plan --use-fake-backend --seed-count 32 --state $(RUN_DIR)/state)"
	./$(BIN) $(RUN_FLAGS)

test: ## Unit, golden and black-box tests (with -race when a C compiler is there).
	$(GO) vet $(PKGS)
	@[ -n "$(RACE)" ] || echo "make test: cgo is off (no C compiler), so the tests run WITHOUT the race detector; install gcc to get it"
	$(GO) test $(RACE) -count=1 -timeout 15m $(PKGS)

bench: ## Benchmarks (fleet-size figures for the closing notes).
	$(GO) test -run '^$$' -bench . -benchmem -timeout 30m ./desired/ ./planner/ ./statefile/ ./service/ ./e2e/

fuzz: ## Every Fuzz* target in the module, FUZZTIME each (default 30s).
	FUZZTIME=$(FUZZTIME) GO=$(GO) bash scripts/fuzz.sh

golden: ## Rewrite the golden plan files after an intended planner change.
	$(GO) test ./golden/ -update

proto: ## Regenerate the committed gRPC code (byte-for-byte reproducible).
	bash scripts/proto.sh

lint: ## gofmt, go vet and staticcheck.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@out=$$(grep -nE '\|[[:space:]]*(head|grep[[:space:]]+-[[:alpha:]]*q)' $$(git ls-files '*.sh' .ci/run) || true); if [ -n "$$out" ]; then echo "a pipe into head or grep -q exits 141 under pipefail when the writer is not done (SIGPIPE); capture the output first:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) run $(STATICCHECK) $(PKGS)

integration: ## Real libvirtd and real qemu-ga suites (root; installs Debian packages).
	bash scripts/integration.sh

# SOAK_DURATION sets the churn (default 4m, CI-sized; hours work), and
# SOAK_WORKERS the parallel machines (default 4).
soak: ## Churn soak on a real libvirtd with chaos (root; SOAK_DURATION=4m, SOAK_WORKERS=4).
	bash scripts/soak.sh

# The HA suite runs replicas against embedded three-member etcd clusters
# and waits out real leases (minutes), so it is not in make test. -v: the
# measured takeover distributions are in the log.
ha: ## High-availability suite: fail-over under load, zombie leader, etcd faults, a real Prometheus (acceptance/ha).
	bash scripts/prometheus.sh
	$(GO) vet -tags ha ./acceptance/ha/
	CI=$${CI:-true} $(GO) test $(RACE) -tags ha -count=1 -timeout 20m -v ./acceptance/ha/

# The write path and etcd's own cost of the same txns run in one process,
# on one cluster. Takeover kills the leader once per iteration, so it gets
# a count of its own; each fleet size starts its own cluster and replicas.
ha-bench: ## HA benchmarks (etcd store): Create ack (split into hop, handler and txn) and 16-client throughput against bare guarded txns at 100,000 machines, also in one window of time (HACreateVsBare); takeover split into lease and provider at 1,000/10,000/100,000.
	$(GO) test -tags ha -run '^$$' -bench 'HACreateAck|HAGetHop|HAMutations16|HABareTxn|HACreateVsBare' -benchtime 2000x -timeout 60m ./acceptance/ha/
	$(GO) test -tags ha -run '^$$' -bench 'HATakeoverScale' -benchtime 5x -timeout 60m ./acceptance/ha/

# The same suite and the 100,000-machine takeover against Debian's etcd
# 3.4 (etcd-server) run as separate processes, not the embedded etcd.
ha-etcd34: ## HA suite, the 100,000-machine takeover and the write path against bare txns (paired, and 16 clients) on Debian's etcd-server 3.4 (/usr/bin/etcd, installed if missing) instead of the embedded etcd.
	bash scripts/etcd-server.sh
	bash scripts/prometheus.sh
	$(GO) vet -tags ha ./acceptance/ha/
	ETCDTEST_BINARY=/usr/bin/etcd $(GO) test -count=1 -timeout 10m ./internal/etcdtest/
	ETCDTEST_BINARY=/usr/bin/etcd CI=$${CI:-true} $(GO) test $(RACE) -tags ha -count=1 -timeout 20m -v ./acceptance/ha/
	ETCDTEST_BINARY=/usr/bin/etcd $(GO) test -tags ha -run '^$$' -bench 'HATakeoverScale/machines=100000' -benchtime 5x -timeout 30m ./acceptance/ha/
	ETCDTEST_BINARY=/usr/bin/etcd $(GO) test -tags ha -run '^$$' -bench 'HACreateVsBare|HAMutations16|HABareTxn/shape=/clients=16/from=apart/watched=no' -benchtime 4000x -timeout 30m ./acceptance/ha/

# The documented cap, at a million slots: minutes and several GiB each.
bench-scale: ## The cap: 100,000 and 1,000,000 slots (and 250,000 with 1 KiB labels), file journal and etcd: boot, RSS, full List, Create ack.
	BIGFLEET_BENCH_SCALE=1 $(GO) test -run '^$$' -bench 'BenchmarkScale' -benchtime 1x -timeout 60m ./e2e/
	BIGFLEET_BENCH_SCALE=1 $(GO) test -tags ha -run '^$$' -bench 'BenchmarkHAScale' -benchtime 1x -timeout 90m ./acceptance/ha/

check: lint test ## Everything CI runs by default (.ci/run runs it).

pve-sim: build ## Serve the in-project Proxmox API simulator for demos.
	./$(BIN) pve-sim

image: build ## Build the container image $(IMAGE) from bin/provider on $(BASE_IMAGE).
	$(CONTAINER) build -f deploy/Dockerfile --target prebuilt --build-arg BASE_IMAGE=$(BASE_IMAGE) -t $(IMAGE) .

local-base: ## Build localhost/bigfleet-base:nonroot, a distroless stand-in for offline machines (root).
	bash deploy/local-base/build.sh $(CONTAINER) localhost/bigfleet-base:nonroot

# promtool (Debian's prometheus package, scripts/prometheus.sh) runs the
# alert rules' unit tests.
deploy-test: ## Chart, dashboard, alert (promtool) and static-build tests (the deploy/ module).
	bash scripts/prometheus.sh
	cd deploy && $(GO) vet ./... && CI=$${CI:-true} $(GO) test -count=1 -timeout 15m ./...

container-test: ## Build and run the real image under podman (root; installs podman and runc).
	bash scripts/container-test.sh

clean: ## Remove build output.
	rm -rf bin
