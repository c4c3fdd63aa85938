# The README's commands. `make test` is what CI runs.
GO ?= go
PYTHON ?= python3
NODE ?= node

.PHONY: test vet build dev bench-failover bench-throughput fuzz test-clients test-python test-node

# Every test of the project, with the race detector (a few minutes on 2 cores),
# then the Python and Node.js clients against a real `ticketing dev`.
test: vet
	$(GO) test -race -count=1 -timeout 20m ./...
	$(MAKE) test-clients

# The Python and Node.js client suites (each starts its own `ticketing dev`
# on free ports, using the binary built once by `build`).
test-clients: test-python test-node

test-python: build
	cd clients/python && TICKETING_BIN=$(CURDIR)/bin/ticketing $(PYTHON) -m unittest discover

test-node: build
	cd clients/node && TICKETING_BIN=$(CURDIR)/bin/ticketing $(NODE) --test test/

vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

build:
	$(GO) build -o bin/ticketing ./cmd/ticketing

dev:
	$(GO) run ./cmd/ticketing dev

# Measurements (not part of `make test`).
bench-failover: build
	./bin/ticketing bench failover --kills 7

bench-throughput: build
	./bin/ticketing bench throughput --clients 64 --duration 10s

# Fuzz each target for FUZZTIME (default 30s).
FUZZTIME ?= 30s
fuzz:
	$(GO) test ./locksm -run '^$$' -fuzz FuzzDecodeBatch -fuzztime $(FUZZTIME)
	$(GO) test ./locksm -run '^$$' -fuzz FuzzReadSnapshot -fuzztime $(FUZZTIME)
	$(GO) test ./cluster/wire -run '^$$' -fuzz FuzzSplitDecode -fuzztime $(FUZZTIME)
	$(GO) test ./cluster/wire -run '^$$' -fuzz FuzzHandshake -fuzztime $(FUZZTIME)
	$(GO) test ./unixapi -run '^$$' -fuzz FuzzParseLine -fuzztime $(FUZZTIME)
