# The README's commands. `make test` is what CI runs.
GO ?= go
PYTHON ?= python3
NODE ?= node

.PHONY: test prepare test-docs vet build lab dev console-screenshot soak-leaders bench-failover bench-throughput bench-blocks bench-extend bench-compare test-lab fuzz test-clients test-python test-node test-verify verify-long \
	test-go test-norace test-postgres test-fence-node test-fence-python-pg deb

# Every test of the project, with the race detector (a few minutes on 2 cores),
# then the Python and Node.js clients against a real `ticketing dev`. A
# throwaway PostgreSQL server (.ci/postgres.sh; Debian's postgresql package)
# runs around them, so the fencing helpers and the ticket-sale example are
# tested on PostgreSQL as well as SQLite (TICKETING_TEST_PG_DSN). `prepare`
# comes first: it checks the toolchains and installs the packages of
# .ci/packages (as root on Debian) or says which are missing, and stops.
test: prepare vet test-norace test-verify test-lab
	./.ci/postgres.sh $(MAKE) test-go test-clients test-fence-node test-fence-python-pg

# The Go test runs go through .ci/skipcheck, which prints go test's usual
# summary (an ok line per package; a failed test's whole output, a
# build's errors), then every skipped test with its skip message, and
# fails the run on a skip that .ci/allowed-skips does not name with its
# reason: a test must not skip on the symptom it tests.
SKIPCHECK = $(GO) run ./.ci/skipcheck

# Every Go test of the module with the race detector (and skipcheck's own).
test-go:
	$(SKIPCHECK) -- $(GO) test -json -race -count=1 -timeout 20m ./... ./.ci/skipcheck

# What the race detector hides, without it: the allocation counts (it
# allocates on its own, so locksm's zero-allocation tests skip under it)
# and the bytes each waiting ACQUIRE costs the sidecar and the leader (it
# inflates every allocation; bounds on bytes, not on time).
test-norace:
	$(SKIPCHECK) -- $(GO) test -json -count=1 -timeout 10m -run 'Allocations$$|MemoryPerWaiter$$' ./locksm ./cluster/leader ./unixapi ./cluster

# The machine's prerequisites for `make test` (.ci/prepare.sh, .ci/packages).
prepare:
	GO=$(GO) NODE=$(NODE) ./.ci/prepare.sh

# The documentation's checked examples (against a real `ticketing dev` and
# real node processes) and its links; part of test-go (docs/verification.md,
# "Checked examples").
test-docs:
	$(GO) test -count=1 -run '^TestDoc' -v ./cmd/ticketing

# The lab (benchmarks, verification, the comparison with etcd, ZooKeeper
# and Redis, fault injection) is its own module, cmd/ticketlab/go.mod, so
# porcupine and the peers' clients stay out of ours. Its self-tests drive
# the freshly built bin/ticketing (and bin/ticketlab for its fault-injecting
# nodes and sidecars); the short verification is test-verify.
LAB_ENV = TICKETING_BIN=$(CURDIR)/bin/ticketing TICKETLAB_BIN=$(CURDIR)/bin/ticketlab
test-lab: build lab
	$(LAB_ENV) $(SKIPCHECK) -C cmd/ticketlab -- $(GO) test -json -race -count=1 -timeout 20m -skip '^TestVerifyShort$$' ./...

# docs/operations.md's console screenshot, written by the console's browser
# test (cmd/ticketlab/internal/browser; chromium, headless) against a real
# `ticketing dev`.
console-screenshot: build
	cd cmd/ticketlab && $(LAB_ENV) TICKETING_CONSOLE_SCREENSHOT=$(CURDIR)/docs/images/console.png $(GO) test -count=1 -run '^TestConsoleInARealBrowser$$' ./internal/browser

# The Python and Node.js client suites, side by side (each starts its own
# `ticketing dev` on free ports, using the binary built once by `build`;
# both mostly wait out leases, so running them together saves half a
# minute; each suite's output is printed whole when it ends).
test-clients: build
	$(MAKE) -j2 --output-sync=target test-python test-node

test-python: build
	cd clients/python && TICKETING_BIN=$(CURDIR)/bin/ticketing $(PYTHON) -m unittest discover

test-node: build
	cd clients/node && TICKETING_BIN=$(CURDIR)/bin/ticketing $(NODE) --test test/

# The short form of the Jepsen-style verification suite (real node, sidecar
# and worker processes under a seeded nemesis; about 4 to 4.5 minutes; README,
# "Verification"), from the lab, on the freshly built bin/ticketing. Without
# -race: the harness is timing-sensitive and the race detector would only
# slow it; under -race the test skips itself. VERIFY_NODE_ARGS adds flags to
# every node: `make test-verify VERIFY_NODE_ARGS="--log-store bolt"` (the
# default is wal for the new data dirs the harness creates).
VERIFY_NODE_ARGS ?=
test-verify: build lab
	cd cmd/ticketlab && $(LAB_ENV) TICKETING_VERIFY_NODE_ARGS="$(VERIFY_NODE_ARGS)" $(GO) test -count=1 -timeout 10m -run '^TestVerifyShort$$' -v .

# Several leader cores over one log (cluster/leader
# TestMultiLeaderSessions; docs/verification.md): 100,000 seeds in each
# of its two modes, about two minutes (106 s here). `make test` runs 1,500.
soak-leaders:
	LEADER_MULTI_SEEDS=100000 $(GO) test -count=1 -timeout 60m -run '^TestMultiLeaderSessions$$' ./cluster/leader

# The long form (not part of `make test`): 30 minutes of faults on 5 nodes.
verify-long: build lab
	./bin/ticketlab verify --binary bin/ticketing --duration 30m --nodes 5

# Only what uses PostgreSQL: the fence helpers (Go, Node.js, Python when the
# system Python has psycopg) and the ticket-sale and waiting-room examples, on a
# throwaway server.
test-postgres: build
	./.ci/postgres.sh sh -c 'TICKETING_BIN=$(CURDIR)/bin/ticketing $(GO) test -count=1 ./clients/go/fence ./clients/examples/ticketsale ./clients/examples/waitingroom && $(MAKE) test-fence-node test-fence-python-pg'

# The Node.js fence helpers against PostgreSQL through `pg`, a dev dependency
# of the test package clients/node/fence-test only (the client has none).
test-fence-node:
	cd clients/node/fence-test && npm ci --no-audit --no-fund --loglevel=error && $(NODE) --test

# Python's fence tests on PostgreSQL need psycopg; without PyPI it comes from
# Debian (python3-psycopg), for the system Python only. (`make test-python`
# runs the SQLite half with $(PYTHON).)
SYSTEM_PYTHON ?= /usr/bin/python3
test-fence-python-pg:
	@if [ -n "$$CI" ] && [ -z "$$TICKETING_TEST_PG_DSN" ]; then \
	  echo "test-fence-python-pg: TICKETING_TEST_PG_DSN is not set, and CI must run these tests on PostgreSQL" \
	  "(make test runs them under .ci/postgres.sh)"; exit 1; \
	elif $(SYSTEM_PYTHON) -c 'import psycopg' 2>/dev/null; then \
	  cd clients/python && $(SYSTEM_PYTHON) -m unittest -v tests.test_fence; \
	elif [ -n "$$CI" ]; then echo "test-fence-python-pg: $(SYSTEM_PYTHON) cannot import psycopg, and CI must run" \
	  "these tests (.ci/packages installs python3-psycopg)"; exit 1; \
	else echo "test-fence-python-pg: $(SYSTEM_PYTHON) cannot import psycopg (apt-get install python3-psycopg);" \
	  "the fence SQL is tested on PostgreSQL by the Go and Node.js suites"; fi

# gofmt, go vet, staticcheck and errcheck on both modules (the root one and
# the lab's). The two checkers run at pinned versions through `go run
# pkg@version`, fetched from the Go module proxy on first use and cached
# after: they stay out of go.mod, so none of their dependencies enters the
# binary's module graph. staticcheck runs its default checks, none
# excluded; errcheck's exclusions are in errcheck-excludes.txt, each with
# its reason.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
ERRCHECK ?= github.com/kisielk/errcheck@v1.30.0
vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	cd cmd/ticketlab && $(GO) vet ./...
	$(GO) vet ./.ci/skipcheck
	$(GO) run $(STATICCHECK) ./...
	cd cmd/ticketlab && $(GO) run $(STATICCHECK) ./...
	$(GO) run $(ERRCHECK) -exclude $(CURDIR)/errcheck-excludes.txt ./...
	cd cmd/ticketlab && $(GO) run $(ERRCHECK) -exclude $(CURDIR)/errcheck-excludes.txt ./...

build:
	$(GO) build -o bin/ticketing ./cmd/ticketing

# The lab's command (cmd/ticketlab, its own module): bin/ticketlab.
lab:
	cd cmd/ticketlab && $(GO) build -o $(CURDIR)/bin/ticketlab .

# The Debian package (binary, systemd units, example configuration):
# dist/ticketing_<version>_<arch>.deb; packaging/README.md.
deb:
	GO=$(GO) ./packaging/build-deb.sh dist

dev:
	$(GO) run ./cmd/ticketing dev

# Measurements (not part of `make test`), by the lab on bin/ticketing;
# `bin/ticketlab bench -h` lists every benchmark.
bench-failover: build lab
	./bin/ticketlab bench failover --binary bin/ticketing --kills 7

bench-throughput: build lab
	./bin/ticketlab bench throughput --binary bin/ticketing --clients 64 --duration 10s

# Seat blocks (issue 18): a 4-key AcquireBlock against 4 single-key
# acquires in order and against one seat, Zipf over 10,000 seats, 64
# sellers; writes cmd/ticketlab/results/blocks/{results.md,results.json}.
bench-blocks: build lab
	cd cmd/ticketlab && $(CURDIR)/bin/ticketlab bench blocks --binary $(CURDIR)/bin/ticketing --sellers 64 --seats 10000 --duration 20s --rounds 4 --out results/blocks

# EXTEND and the lost signal (issue 19): the cost of an EXTEND beside
# RELEASE+ACQUIRE of the same key (1 and 64 clients through a ticketing
# sidecar process), and the latency from an expiry's commit (timestamped on
# the leader by the lab node's --frame-trace) to `! LOST` at the client;
# writes cmd/ticketlab/results/extend/results.md.
bench-extend: build lab
	cd cmd/ticketlab && $(CURDIR)/bin/ticketlab bench extend --binary $(CURDIR)/bin/ticketing --clients 1,64 --rounds 3 --window 5s --pairs 20 --lost-for 30s --out results/extend

# Ticketing against etcd, ZooKeeper and Redis in one run (`ticketlab
# compare`; installs the Debian packages if missing, starts the peers on
# loopback, stops them afterwards). Writes
# cmd/ticketlab/results/{results.md,plot.svg}.
bench-compare: build lab
	cd cmd/ticketlab && ./peers.sh install && $(CURDIR)/bin/ticketlab compare --binary $(CURDIR)/bin/ticketing --start-peers --peers-dir /tmp/ticketbench-peers --duration 5s --out results

# Fuzz each target for FUZZTIME (default 30s).
FUZZTIME ?= 30s
fuzz:
	$(GO) test ./locksm -run '^$$' -fuzz FuzzDecodeBatch -fuzztime $(FUZZTIME)
	$(GO) test ./locksm -run '^$$' -fuzz FuzzReadSnapshot -fuzztime $(FUZZTIME)
	$(GO) test ./cluster/wire -run '^$$' -fuzz FuzzSplitDecode -fuzztime $(FUZZTIME)
	$(GO) test ./cluster/wire -run '^$$' -fuzz '^FuzzHandshake$$' -fuzztime $(FUZZTIME)
	$(GO) test ./cluster/wire -run '^$$' -fuzz '^FuzzClientHandshake$$' -fuzztime $(FUZZTIME)
	$(GO) test ./cluster/wire -run '^$$' -fuzz '^FuzzReader$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s
	$(GO) test ./unixapi -run '^$$' -fuzz FuzzParseLine -fuzztime $(FUZZTIME)
	$(GO) test ./unixapi -run '^$$' -fuzz FuzzParseEvent -fuzztime $(FUZZTIME)
	$(GO) test ./clients/go -run '^$$' -fuzz FuzzReadLoop -fuzztime $(FUZZTIME)
