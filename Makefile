# caddy-webhook-idempotency — everything a fresh machine needs goes through here.
SHELL := /bin/bash
GO    ?= go
BIN   := bin/caddy
export STRIPE_WEBHOOK_SECRET ?= whsec_demo_not_a_real_secret

.PHONY: run demo test test-short failover pgbouncer build fuzz soak bench bench-growth bench-sweep bench-floor bench-memory bench-micro vet lint xcaddy-check clean

## build: the custom Caddy binary (what xcaddy builds) into bin/caddy
build:
	$(GO) build -o $(BIN) ./xcaddy

## run: the gateway on the embedded default storage in front of the demo upstream
run: build
	@bash scripts/run-demo.sh

## demo: with `make run` going in another terminal, deliver one event five times
demo:
	$(GO) run ./examples/send -n 5
	@echo "--- what the legacy upstream did:"
	@curl -s http://127.0.0.1:9000/stats; echo

## test: every test, on the local PostgreSQL (started if stopped) and SQLite
test:
	@bash scripts/test.sh

## failover: PostgreSQL restart and failover under load, on temporary clusters (part of make test)
failover:
	@bash scripts/failover.sh

## pgbouncer: the gateway behind a real PgBouncer in transaction pooling (installed when missing; part of make test)
pgbouncer:
	@bash scripts/pgbouncer.sh

## test-short: the fast loop, no PostgreSQL, no in-process Caddy
test-short:
	$(GO) test -race -short ./...

## soak: 200,000+ deliveries through two gateways on one PostgreSQL, upstream failing 10% (see RELIABILITY.md)
soak:
	@DSN=$$(bash scripts/postgres.sh) && TEST_DATABASE_URL="$$DSN" $(GO) run ./internal/e2e/soak $(SOAKFLAGS)

## bench: what a delivery costs, side by side with plain Caddy and the store's limit (BENCHMARKS.md); flags in BENCHFLAGS
bench: build
	@DSN=$$(bash scripts/postgres.sh) && BENCH_DATABASE_URL="$$DSN" $(GO) run ./bench $(BENCHFLAGS)

## bench-growth: claim latency on an empty vs a 10M-row table, and during a retention sweep (needs ~6 GB of disk)
bench-growth:
	@DSN=$$(bash scripts/postgres.sh) && BENCH_DATABASE_URL="$$DSN" $(GO) run ./bench -mode growth $(BENCHFLAGS)

## bench-sweep: claim p99 during the retention sweep of 1M expired rows vs idle; rows of a route at 1,000 events/s over HTTP, retention 1m
bench-sweep:
	$(GO) build -tags benchretention -o bin/caddy-benchretention ./xcaddy
	@DSN=$$(bash scripts/postgres.sh) && BENCH_DATABASE_URL="$$DSN" $(GO) run ./bench -mode sweep -caddy bin/caddy-benchretention $(BENCHFLAGS)

## bench-floor: PostgreSQL CPU per new event of the gateway's claim and completion beside plain INSERT + UPDATE with cached plans (flags: -rounds, -duration)
bench-floor:
	@DSN=$$(bash scripts/postgres.sh) && BENCH_DATABASE_URL="$$DSN" $(GO) run ./bench -mode floor $(BENCHFLAGS)

## bench-memory: the gateway's peak RSS under 200 concurrent 1 MiB deliveries and 50 concurrent 25 MB GitHub deliveries (spilled to disk), and RSS over a soak of small ones
bench-memory: build
	@DSN=$$(bash scripts/postgres.sh) && BENCH_DATABASE_URL="$$DSN" $(GO) run ./bench -mode memory $(BENCHFLAGS)

## bench-micro: the Go micro-benchmarks (signature schemes, event ID, the cached duplicate path)
bench-micro:
	$(GO) test -run '^$$' -bench . -benchmem ./internal/signature ./internal/eventid ./caddymodule

## fuzz: each fuzz target for FUZZTIME (default 30s)
fuzz:
	@bash scripts/fuzz.sh $${FUZZTIME:-30s}

vet:
	gofmt -l . | (! grep .) && $(GO) vet ./...

## lint: golangci-lint with .golangci.yml (pinned, installed into bin/tools by scripts/tools.sh)
lint:
	@"$$(bash scripts/tools.sh golangci-lint)/golangci-lint" run ./...

## xcaddy-check: xcaddy (pinned, from the Go module proxy) builds Caddy with this checkout; the modules are listed
xcaddy-check:
	@bash scripts/xcaddy-check.sh

clean:
	rm -rf bin
